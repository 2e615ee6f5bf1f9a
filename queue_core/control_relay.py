"""The control stream and fences of a gateway in front of a queue server (`strictq serve --queue-server`).

The fences, probes and floors live with the core, in the queue server (its ControlHub, failure management).
`RelayHub` is the gateway's face of them: a `ControlHub` whose state is a mirror of the queue server's whole
control stream (its internal `GET /v1/admin/control`, read through queue_core.remote), re-published under
the queue server's own event ids. So the gateway's `/admin/v1/control` and fence routes are the same
handlers as in one process (queue_core.admin_http: the caller's key and scope checked against the gateway's
key file), egress proxies follow the gateway, and a `Last-Event-ID` resumes against either process.

A fence set through the gateway is written by the queue server (durable there first), then answered once
the mirror holds it: a list right after a change shows it, as in one process. While the queue server's
stream is out of reach, new streams are refused (503 `unavailable`) and open ones are ended, so a proxy
goes unsynced (fails closed) instead of trusting a stale copy; the relay reconnects by itself and resumes
after the last event it had.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from .control import ControlHub, Subscription
from .fences import Fence, FenceMode, FenceRegistry, validate_fence
from .machine import Unavailable
from .machine.effects import FloorRaised
from .machine.text import INTEGER_RE
from .remote import RemoteQueueService
from .scope import Scope

log = logging.getLogger("strictq.control")
RETRY = 0.5  # seconds between attempts to reach the queue server's stream
CATCH_UP = 5.0  # seconds a fence change waits for its event before answering anyway
IDLE = 45.0  # seconds without a byte (the queue server's keepalive is 15 s) before the stream counts as dead


class _MirrorFloors:
    """The floors the queue server's stream reported (a FloorSource for the hub's snapshots)."""

    def __init__(self) -> None:
        self.clock: Callable[[], float] = time.time
        self.floor_listeners: list[Callable[[FloorRaised], None]] = []
        self.instance = 0
        self.table: dict[tuple[str, str], int] = {}

    @property
    def epoch(self) -> int:
        return self.instance

    def floors(self) -> Iterator[tuple[str, str, int]]:
        for (queue, group), floor in self.table.items():
            yield queue, group, floor

    def raise_to(self, entries: Any) -> None:
        for queue, group, token in entries:
            if token > self.table.get((queue, group), 0):
                self.table[(queue, group)] = token


class _MirrorFences(FenceRegistry):
    """The fences as the queue server's stream reported them: memory only (the queue server keeps them)."""

    def __init__(self) -> None:
        super().__init__("/nonexistent/relayed-fences")

    def load(self) -> None:
        """Nothing to read: the first snapshot fills it."""

    def replace(self, fences: list[Fence]) -> None:
        self._fences = {fence.worker: fence for fence in fences}

    def set(self, fence: Fence) -> None:
        self._fences = {**self._fences, fence.worker: fence}

    def drop(self, worker: str) -> None:
        self._fences = {w: f for w, f in self._fences.items() if w != worker}


class RelayHub(ControlHub):
    """The queue server's control state, relayed (module docstring)."""

    def __init__(
        self,
        remote: RemoteQueueService,
        *,
        keepalive: float = 15.0,
        retry: float = RETRY,
        catch_up: float = CATCH_UP,
        idle: float = IDLE,
    ) -> None:
        self._floors = _MirrorFloors()
        self._mirror = _MirrorFences()
        super().__init__(self._floors, self._mirror, keepalive=keepalive)
        self.remote = remote
        self._retry = retry
        self._catch_up = catch_up
        self._idle = idle
        self._synced = False
        self._lost_once = False  # a resumption is worth a line, the first connection not
        self._last_id: str | None = None
        self._applied = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self, first_sync: float = 1.0) -> None:
        """Follow the queue server's stream; a reachable one is waited for (`first_sync` seconds at most), so
        the gateway's first streams rarely meet a 503 while the relay connects."""
        self._loop = asyncio.get_running_loop()
        self._applied = asyncio.Event()
        self._follower = asyncio.create_task(self._follow(), name="strictq-control-relay")
        if self.remote.healthy:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + first_sync
            while not self._synced and (remaining := deadline - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._applied.wait(), remaining)

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
            self._follower = None
        await super().close()

    @property
    def synced(self) -> bool:
        """Whether the mirror is the queue server's current state (its stream is connected and synced)."""
        return self._synced

    async def _follow(self) -> None:
        reported = False
        while True:
            try:
                async for event_id, event, data in self.remote.control_events(self._last_id, idle=self._idle):
                    try:
                        self._apply(event_id, event, data)
                    except (ValueError, KeyError, TypeError) as exc:  # a queue server's bug: skip, go on
                        log.warning("control relay: ignoring an unreadable %r event: %s", event[:40], exc)
                    reported = False
                why = "it ended the stream"
            except Unavailable as exc:
                why = exc.message
            except Exception:
                log.exception("control relay: unexpected failure reading the queue server's stream")
                why = "unexpected failure"
            if self._synced or not reported:  # one line per outage, not one per retry
                log.warning("control relay: the queue server's control stream is lost (%s); retrying", why)
                reported = True
            self._lost()
            await asyncio.sleep(self._retry)

    def _lost(self) -> None:
        """Out of touch: open streams end (their proxies go unsynced and reconnect), new ones wait."""
        self._synced = False
        self._lost_once = True
        for subscription in list(self._subscribers):
            subscription._end("upstream", abort=False)
        self._wake()

    def _wake(self) -> None:
        self._applied.set()
        self._applied = asyncio.Event()

    # --------------------------------------------------------------------------------------- mirror
    def _apply(self, event_id: str, event: str, raw: bytes) -> None:
        instance_text, _, n_text = event_id.rpartition("-")
        if not (INTEGER_RE.fullmatch(instance_text) and INTEGER_RE.fullmatch(n_text)):
            log.warning("control relay: ignoring an event with id %r", event_id[:40])
            return
        instance, n = int(instance_text), int(n_text)
        data: Any = orjson.loads(raw) if raw else {}
        if event == "snapshot":  # the queue server's whole state: what came before is no longer replayable
            self.instance = self._floors.instance = instance
            self._n = n
            self._ring.clear()
            self._ring_bytes = 0
            self._mirror.replace([Fence.from_dict(item) for item in data.get("fences", [])])
            self._floors.table = {}
            self._floors.raise_to(data.get("floors", []))
            self._probes = {p["message_id"]: p for p in data.get("probes", [])}
        elif event == "synced":
            if self._lost_once:
                log.info("control relay: following the queue server's control stream again")
            self._synced = True
        else:
            if event == "fence":
                self._mirror.set(Fence.from_dict(data))
            elif event == "unfence":
                self._mirror.drop(str(data.get("worker")))
            elif event == "floor":
                self._floors.raise_to(data.get("floors", []))
            elif event == "probe":
                self._probes[str(data.get("message_id"))] = data
            elif event == "probe_end":
                self._probes.pop(str(data.get("message_id")), None)
            self._n = n - 1
            self._emit(event, data)  # numbered n: the queue server's id
        self._last_id = event_id
        self._wake()

    async def _until(self, done: Callable[[], bool]) -> None:
        """Wait (at most `catch_up` seconds) until the mirror satisfies `done`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._catch_up
        while not done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                log.warning("control relay: a fence change is not on the queue server's stream yet")
                return
            try:
                await asyncio.wait_for(self._applied.wait(), remaining)
            except TimeoutError:
                pass

    # --------------------------------------------------------------------------------------- fences
    async def fence(self, worker: str, mode: FenceMode, reason: str, ttl: float | None = None) -> Fence:
        validate_fence(worker, mode, reason, ttl)  # the same check, before the round trip
        fence = await self.remote.put_fence(worker, mode, reason, ttl)
        await self._until(lambda: self._mirror.get(worker) == fence)
        return fence

    async def unfence(self, worker: str, reason: str = "operator") -> Fence:
        fence = await self.remote.delete_fence(worker, reason)
        await self._until(lambda: self._mirror.get(worker) != fence)
        return fence

    def _arm_expiry(self) -> None:
        """Expiries are the queue server's: its `unfence` events come through the stream."""

    def probe(self, worker: str, message_id: str, mode: str) -> None:
        raise RuntimeError("probes are sent by the queue server's failure management, not through a relay")

    # --------------------------------------------------------------------------------------- stream
    def subscribe(self, last_event_id: str | None = None, scope: Scope | None = None) -> Subscription:
        if not self._synced and not self._streams_closed:
            raise Unavailable(
                f"the queue server's control stream ({self.remote.url}) is not reachable now; reconnect"
            )
        return super().subscribe(last_event_id, scope)
