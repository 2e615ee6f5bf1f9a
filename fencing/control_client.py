"""Proxy side of the control stream (wire protocol: docs/control-stream.md).

`ControlState` is what the guards read on every call, so its lookups are plain dict gets. `ControlClient`
keeps it current from `GET /admin/v1/control`: snapshot or replayed events, then `synced`, then
incremental events. The proxy never decides a fence itself; the moment the stream drops it counts as
unsynchronised (tagged calls fail closed with 503) until a new connection has processed `synced`.

SSE is parsed by hand: no SSE client library is among our pinned dependencies, and the protocol subset
we consume (`id`, `event`, `data`, comments, blank-line dispatch) is a few lines over aiohttp's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from protocol.headers import API_KEY as API_KEY_HEADER

logger = logging.getLogger(__name__)

MODES = ("block", "mimic")
PROBE_MODES = ("mimic", "pass")
DEFAULT_MAX_FLOORS = 1_000_000
MAX_LINE_BYTES = 256 * 1024 * 1024  # a snapshot of a million floors is ~70 MB on one data line


@dataclass(frozen=True, slots=True)
class FenceInfo:
    """One fence as the core published it (the `FENCE` object of the protocol)."""

    worker: str
    mode: str  # "block" | "mimic"
    reason: str
    since: float
    expires: float | None

    @classmethod
    def from_wire(cls, data: Any) -> FenceInfo:
        if not isinstance(data, dict):
            raise ValueError(f"fence is not an object: {data!r}")
        worker, mode = data.get("worker"), data.get("mode")
        if not isinstance(worker, str) or not worker:
            raise ValueError(f"fence without a worker: {data!r}")
        if mode not in MODES:
            raise ValueError(f"fence of {worker} has unknown mode {mode!r}")
        expires = data.get("expires")
        return cls(
            worker=worker,
            mode=mode,
            reason=str(data.get("reason") or ""),
            since=float(data.get("since") or 0.0),
            expires=None if expires is None else float(expires),
        )


# listener(kind, worker, fence): kind is "fence" (fence is the new one) or "unfence" (fence is None).
FenceListener = Callable[[str, str, FenceInfo | None], None]


class ControlState:
    """Fences and token floors as last published by the core, plus whether they are current.

    Floors are bounded: past `max_floors` groups the least recently raised one is forgotten (its floor
    reads 0 again, so it can only let a stale call through, never refuse a valid one; the core refuses
    the stale worker's ack/renew anyway). A snapshot re-teaches every floor the core still holds.
    """

    def __init__(self, *, max_floors: int = DEFAULT_MAX_FLOORS) -> None:
        self.fences: dict[str, FenceInfo] = {}
        # Probes of failure management: message id -> (worker, "mimic" | "pass"); a fenced worker's calls
        # tagged with one are mimicked or passed instead of fenced (docs/control-stream.md).
        self.probes: dict[str, tuple[str, str]] = {}
        self.floors: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.max_floors = max_floors
        self.synced = False
        self.instance: int | None = None
        self.last_event_id: str | None = None
        self._listeners: list[FenceListener] = []
        self._sync_waiters: list[asyncio.Future[None]] = []

    # -- hot path --------------------------------------------------------------------------------------
    def fence_of(self, worker: str | None) -> FenceInfo | None:
        return self.fences.get(worker) if worker is not None else None

    def floor(self, queue: str, group: str) -> int:
        return self.floors.get((queue, group), 0)

    def probe_mode(self, worker: str, message_id: str | None) -> str | None:
        """`mimic` or `pass` while `message_id` is an active probe of `worker`; else None."""
        probe = self.probes.get(message_id) if message_id is not None else None
        return probe[1] if probe is not None and probe[0] == worker else None

    # -- listeners ---------------------------------------------------------------------------------------
    def add_listener(self, listener: FenceListener) -> None:
        """Called on every fence change (also those a snapshot implies), on the event loop."""
        self._listeners.append(listener)

    def remove_listener(self, listener: FenceListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def _notify(self, kind: str, worker: str, fence: FenceInfo | None) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, worker, fence)
            except Exception:  # a listener's bug must not stop the stream
                logger.exception("control listener failed on %s %s", kind, worker)

    # -- applying the stream ------------------------------------------------------------------------------
    def set_fence(self, fence: FenceInfo) -> None:
        self.fences[fence.worker] = fence
        self._notify("fence", fence.worker, fence)

    def remove_fence(self, worker: str) -> None:
        if self.fences.pop(worker, None) is not None:
            self._notify("unfence", worker, None)

    def replace_fences(self, fences: Iterable[FenceInfo]) -> None:
        """A snapshot's fence set replaces ours; listeners hear only what actually changed."""
        new = {f.worker: f for f in fences}
        for worker in [w for w in self.fences if w not in new]:
            self.remove_fence(worker)
        for worker, fence in new.items():
            if self.fences.get(worker) != fence:
                self.set_fence(fence)

    def set_probe(self, data: Any) -> None:
        worker, message_id, mode = _probe_fields(data)
        self.probes[message_id] = (worker, mode)

    def end_probe(self, data: Any) -> None:
        _, message_id, _ = _probe_fields(data)
        self.probes.pop(message_id, None)

    def replace_probes(self, entries: Any) -> None:
        """A snapshot's probes replace ours (a snapshot without the key: none are active)."""
        if not isinstance(entries, list):
            raise ValueError(f"probes is not a list: {entries!r}")
        self.probes = {}
        for entry in entries:
            self.set_probe(entry)

    def raise_floor(self, queue: str, group: str, token: int) -> None:
        """Merge with max: tokens only rise, so an older (or replayed) value never lowers a floor."""
        key = (queue, group)
        floors = self.floors
        current = floors.get(key)
        if current is not None:
            if token <= current:
                return
            floors[key] = token
            floors.move_to_end(key)
            return
        floors[key] = token
        if len(floors) > self.max_floors:
            floors.popitem(last=False)

    def raise_floors(self, entries: Any) -> None:
        if not isinstance(entries, list):
            raise ValueError(f"floors is not a list: {entries!r}")
        for entry in entries:
            if not isinstance(entry, list | tuple) or len(entry) != 3:
                raise ValueError(f"floor entry is not [queue, group, token]: {entry!r}")
            queue, group, token = entry
            if not isinstance(queue, str) or not isinstance(group, str) or not isinstance(token, int):
                raise ValueError(f"floor entry has wrong types: {entry!r}")
            self.raise_floor(queue, group, token)

    def mark_synced(self) -> None:
        self.synced = True
        waiters, self._sync_waiters = self._sync_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def mark_unsynced(self) -> None:
        self.synced = False

    async def wait_synced(self) -> None:
        """Return once the state is synchronised (at once if it is)."""
        if self.synced:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append(waiter)
        await waiter


def _probe_fields(data: Any) -> tuple[str, str, str]:
    if not isinstance(data, dict):
        raise ValueError(f"probe is not an object: {data!r}")
    worker, message_id, mode = data.get("worker"), data.get("message_id"), data.get("mode", "mimic")
    if not isinstance(worker, str) or not isinstance(message_id, str) or not message_id:
        raise ValueError(f"probe without a worker or message id: {data!r}")
    if mode not in PROBE_MODES:
        raise ValueError(f"probe of {worker} has unknown mode {mode!r}")
    return worker, message_id, mode


class ControlStreamError(Exception):
    """The server sent something this client cannot apply; the connection is dropped and resumed."""


class ControlClient:
    """Consumes the control stream into a `ControlState`, reconnecting with backoff until stopped."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        ca_file: str | None = None,
        state: ControlState | None = None,
        reconnect_min: float = 0.1,
        reconnect_max: float = 5.0,
        idle_timeout: float = 60.0,
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.ca_file = ca_file
        self.state = state if state is not None else ControlState()
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        # Nothing at all (not even a keepalive comment, 15 s by default) for this long: the peer is gone.
        self.idle_timeout = idle_timeout
        # Counters, for /readyz, logs and tests.
        self.connects = 0
        self.snapshots = 0
        self.events = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="strictq control stream")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Connect, consume, and on any failure reconnect after a growing, jittered pause."""
        ssl_context: ssl.SSLContext | bool = True
        if self.ca_file:
            ssl_context = ssl.create_default_context(cafile=self.ca_file)
        connector = aiohttp.TCPConnector(ssl=ssl_context, limit=1)
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10)
        delay = self.reconnect_min
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self._session = session
            try:
                while True:
                    try:
                        if await self._consume(session):
                            delay = self.reconnect_min  # it synced: the next outage starts from scratch
                    except asyncio.CancelledError:
                        raise
                    except (aiohttp.ClientError, OSError, TimeoutError, ControlStreamError) as exc:
                        self.last_error = f"{type(exc).__name__}: {exc}"
                        logger.warning("control stream %s: %s", self.url, self.last_error)
                    finally:
                        self.state.mark_unsynced()  # fail closed the moment the stream is gone
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                    delay = min(self.reconnect_max, delay * 2)
            finally:
                self._session = None

    # -- one connection --------------------------------------------------------------------------------
    async def _consume(self, session: aiohttp.ClientSession) -> bool:
        """One connection's life; True when it reached `synced` before it ended."""
        headers = {API_KEY_HEADER: self.api_key, "Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.state.last_event_id:
            headers["Last-Event-ID"] = self.state.last_event_id
        reached_sync = False
        async with session.get(self.url, headers=headers) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                raise ControlStreamError(f"HTTP {resp.status}: {text}")
            ctype = resp.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise ControlStreamError(f"not an event stream: {ctype!r}")
            self.connects += 1
            event_id: str | None = None
            event_type = ""
            data: list[bytes] = []
            async for raw in self._lines(resp):
                if not raw:  # blank line: dispatch
                    if data or event_type:
                        payload = b"\n".join(data)
                        if self._dispatch(event_type or "message", event_id, payload):
                            reached_sync = True
                    event_id, event_type, data = None, "", []
                    continue
                if raw[:1] == b":":
                    continue  # comment (keepalive)
                name, sep, value = raw.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    event_type = value.decode()
                elif name == b"id":
                    event_id = value.decode()
                # "retry" and unknown fields are ignored: our own backoff governs reconnects
        self.last_error = "stream ended by the server"
        logger.warning("control stream %s ended by the server", self.url)
        return reached_sync

    async def _lines(self, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Lines of the body without their terminator (\\n or \\r\\n), with an idle deadline per read."""
        buffer = b""
        while True:
            async with asyncio.timeout(self.idle_timeout):
                chunk = await resp.content.readany()
            if not chunk:
                return
            buffer += chunk
            if b"\n" not in chunk:
                if len(buffer) > MAX_LINE_BYTES:
                    raise ControlStreamError("line too long")
                continue
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                yield line[:-1] if line[-1:] == b"\r" else line

    def _dispatch(self, event: str, event_id: str | None, payload: bytes) -> bool:
        """Apply one event; True for `synced`."""
        state = self.state
        try:
            data = orjson.loads(payload) if payload else {}
            if event == "snapshot":
                state.instance = data.get("instance", state.instance)
                state.replace_fences(FenceInfo.from_wire(f) for f in data.get("fences", []))
                state.raise_floors(data.get("floors", []))
                state.replace_probes(data.get("probes", []))
                self.snapshots += 1
            elif event == "fence":
                state.set_fence(FenceInfo.from_wire(data))
            elif event == "unfence":
                worker = data.get("worker")
                if not isinstance(worker, str):
                    raise ValueError(f"unfence without a worker: {data!r}")
                state.remove_fence(worker)
            elif event == "floor":
                state.raise_floors(data.get("floors", []))
            elif event == "probe":
                state.set_probe(data)
            elif event == "probe_end":
                state.end_probe(data)
            elif event == "synced":
                if isinstance(data, dict) and "instance" in data:
                    state.instance = data["instance"]
                if event_id is not None:
                    state.last_event_id = event_id
                state.mark_synced()
                logger.info("control stream synchronised at %s", state.last_event_id)
                return True
            else:
                logger.debug("control stream: ignoring unknown event %r", event)
                return False
        except (ValueError, TypeError, AttributeError) as exc:
            raise ControlStreamError(f"bad {event} event {event_id}: {exc}") from exc
        self.events += 1
        if event_id is not None:
            state.last_event_id = event_id
        return False
