"""The control stream's server side: what the egress proxies must know, published by the core's process.

One `ControlHub` per process holding the core (docs/control-stream.md is the wire contract). It turns
floor raises of the core and fence changes of the `FenceRegistry` into numbered events, keeps the last
`buffer` of them (and at most `buffer_bytes`: under load one floor event can list hundreds of groups)
so a reconnecting proxy resumes with `Last-Event-ID` instead of a full snapshot, and fans them out to
subscribers.

Nothing here may slow the core down: the floor listener runs inside every claim, so it only updates a
dict (raises are coalesced into at most one `floor` event per `floor_interval`), and a subscriber that
falls `subscriber_limit` frames behind is cut off (it resumes or gets a snapshot) instead of buffering
without bound or making anyone wait.

A subscriber with a `Scope` (an admin or proxy key: one tenant) gets only its tenant's part of each event:
fences and probes of its tenant's workers, floors of its tenant's queues, under the same event ids (an
event with nothing for it is skipped; a floor event is cut down to its entries). Each part is rendered
once per distinct scope, however many subscribers share it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Coroutine, Hashable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from .fences import (
    MAX_REASON,
    Fence,
    FenceMode,
    FenceRegistry,
    InvalidFence,
    StoreFenceRegistry,
    validate_fence,
)
from .machine.effects import FloorRaised
from .machine.text import INTEGER_RE
from .scope import Scope
from .service import QueueService

log = logging.getLogger("strictq.control")
T = TypeVar("T")
KEEPALIVE_FRAME = b": keepalive\n\n"
SHUTDOWN_GRACE = 0.5  # seconds streams get to end cleanly on shutdown before their sockets are aborted
EXPIRY_RETRY = 1.0  # seconds before retrying to lift an expired fence whose file write failed


class StreamClosed(Exception):
    """The hub ended a subscription: the process is shutting down, or the subscriber fell behind."""


class Subscription:
    """One connected stream: its catch-up frames, then live frames from a bounded queue.

    The queue is bounded by hand (not asyncio.Queue's maxsize) so that the end marker always fits.
    """

    def __init__(
        self, hub: ControlHub, catch_up: bytes, resumed: bool, limit: int, scope: Scope | None = None
    ) -> None:
        self.catch_up = catch_up  # replayed events or one snapshot, then `synced`
        self.resumed = resumed  # True: Last-Event-ID replay; False: snapshot
        self.scope = scope  # what it may see; None: everything (an operator, or inside the process)
        self.ended: str | None = None  # why the hub ended it ("shutdown" | "behind"), None while live
        # Set by the HTTP handler: aborts the connection, so a write stuck on a client that stopped
        # reading is interrupted too.
        self.abort: Callable[[], None] | None = None
        self._hub = hub
        self._limit = limit
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.finished = asyncio.Event()

    async def next(self, idle: float) -> bytes | None:
        """The next frame; None when nothing came within `idle` seconds (time for a keepalive)."""
        if self.ended is not None and self._queue.empty():
            raise StreamClosed(self.ended)
        try:
            frame = await asyncio.wait_for(self._queue.get(), idle)
        except TimeoutError:
            return None
        if frame is None:
            raise StreamClosed(self.ended or "closed")
        return frame

    def close(self) -> None:
        """The handler is done with it (client gone, or it ended): stop feeding it."""
        self._hub._subscribers.discard(self)
        self.finished.set()

    def _offer(self, frame: bytes) -> None:
        if self.ended is not None:
            return
        if self._queue.qsize() >= self._limit:
            log.warning("control stream subscriber fell %d events behind: disconnecting it", self._limit)
            self._end("behind", abort=True)
            return
        self._queue.put_nowait(frame)

    def _end(self, reason: str, *, abort: bool) -> None:
        if self.ended is None:
            self.ended = reason
            # Drop what is queued: the client resumes from the ring (or a snapshot) anyway.
            while not self._queue.empty():
                self._queue.get_nowait()
            self._queue.put_nowait(None)
        if abort and self.abort is not None:
            self.abort()


class FloorSource(Protocol):
    """Where a hub's floors come from: the core in this process (`QueueService`), or a cluster's queue
    servers as a gateway hears them (cluster.floors)."""

    clock: Callable[[], float]
    floor_listeners: list[Callable[[FloorRaised], None]]

    @property
    def epoch(self) -> int:
        """The hub's instance: a new one tells reconnecting proxies to take a snapshot."""
        ...

    def floors(self) -> Iterator[tuple[str, str, int]]:
        """(queue, group, floor) of every group with a floor above zero."""
        ...


class ControlHub:
    """Fences, floors and the event stream of one core process (or of a cluster's gateway).

    Python API (used by the admin HTTP routes, and by failure management inside the core process):
    `await hub.fence(worker, mode, reason, ttl)`, `await hub.unfence(worker, reason)`, `hub.fences()`,
    `hub.probe(worker, message_id, mode)`, `hub.probe_end(message_id)`, `hub.subscribe(last_event_id)`;
    `event_listeners` hear every fence, unfence, probe and probe_end event as it is emitted. A change the
    registry hears of from elsewhere (`FenceRegistry.listeners`: a cluster's other edges) is emitted like
    one made here. Start it
    after the service (`await hub.start()`), end the streams on shutdown (`await
    hub.shutdown_streams()`), then `await hub.close()`.
    """

    def __init__(
        self,
        service: FloorSource,
        registry: FenceRegistry | None = None,
        *,
        floor_interval: float = 0.05,
        keepalive: float = 15.0,
        buffer: int = 10_000,
        buffer_bytes: int = 64 * 1024 * 1024,
        subscriber_limit: int = 1_000,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if floor_interval < 0 or keepalive <= 0 or min(buffer, buffer_bytes, subscriber_limit) < 1:
            raise ValueError("need floor_interval >= 0, keepalive > 0 and positive buffer bounds")
        self.service = service
        # Fences live in the core's store (a legacy fences.json beside it is migrated at start).
        if registry is None:
            assert isinstance(service, QueueService), "a hub without a core needs its fence registry"
            registry = store_registry(service)
        self.registry = registry
        self.floor_interval = floor_interval
        self.keepalive = keepalive
        self.subscriber_limit = subscriber_limit
        self.instance = 0  # the core's epoch, read at start
        self._clock = clock or service.clock
        self._n = 0
        self._ring: deque[tuple[int, str, bytes]] = deque()  # (n, event name, frame)
        self._ring_bytes = 0
        self._buffer = buffer
        self._buffer_bytes = buffer_bytes
        self._subscribers: set[Subscription] = set()
        self._pending_floors: dict[tuple[str, str], int] = {}
        self._probes: dict[str, dict[str, str]] = {}  # message id -> the active probe's event data
        self.event_listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_flush = -math.inf
        self._expiry_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams_closed = False
        self._closed = False

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load the fences, take the core's epoch as instance, listen to floor raises, lift due fences."""
        self._loop = asyncio.get_running_loop()
        self.registry.load()
        if isinstance(self.registry, StoreFenceRegistry):
            await self.registry.migrate()
        self.instance = self.service.epoch
        self.service.floor_listeners.append(self._on_floor)
        self.registry.listeners.append(self._on_registry_change)
        await self._expire_due()  # fences that expired while the process was down
        log.info("control stream: instance %d, %d fences", self.instance, len(self.registry.fences))

    async def shutdown_streams(self, grace: float = SHUTDOWN_GRACE) -> None:
        """End every open stream now (and refuse new ones), so an SSE response never holds up shutdown."""
        self._streams_closed = True
        for subscription in list(self._subscribers):
            subscription._end("shutdown", abort=False)
        if self._subscribers:
            waiting = [asyncio.ensure_future(s.finished.wait()) for s in self._subscribers]
            _, pending = await asyncio.wait(waiting, timeout=grace)
            for future in pending:
                future.cancel()
        for subscription in list(self._subscribers):  # a client that stopped reading: cut it off
            subscription._end("shutdown", abort=True)

    async def close(self) -> None:
        if self._closed:
            return
        await self.shutdown_streams()
        self._closed = True
        if self._on_floor in self.service.floor_listeners:
            self.service.floor_listeners.remove(self._on_floor)
        if self._on_registry_change in self.registry.listeners:
            self.registry.listeners.remove(self._on_registry_change)
        for handle in (self._flush_handle, self._expiry_handle):
            if handle is not None:
                handle.cancel()
        self._flush_handle = self._expiry_handle = None
        if self._tasks:  # fence changes in flight finish their write: they may already be on disk
            await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def last_event_id(self) -> str:
        return f"{self.instance}-{self._n}"

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    # --------------------------------------------------------------------------------------- fences
    def fences(self) -> list[Fence]:
        return self.registry.sorted()

    async def fence(self, worker: str, mode: FenceMode, reason: str, ttl: float | None = None) -> Fence:
        """Fence (or re-fence) a worker: durable first, then the `fence` event; `ttl` seconds or None."""
        validate_fence(worker, mode, reason, ttl)
        return await self._shielded(self._fence(worker, mode, reason, ttl))

    async def unfence(self, worker: str, reason: str = "operator") -> Fence:
        """Lift a worker's fence (NotFenced if none): durable first, then the `unfence` event."""
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            raise InvalidFence(f"reason must be 1-{MAX_REASON} characters", "bad_reason")
        return await self._shielded(self._unfence(worker, reason))

    async def _fence(self, worker: str, mode: FenceMode, reason: str, ttl: float | None) -> Fence:
        async with self.registry.lock:
            now = self._clock()
            fence = Fence(worker, mode, reason, now, None if ttl is None else now + ttl)
            await self.registry.put(fence)
            self._emit("fence", fence.to_dict())
        self._arm_expiry()
        return fence

    async def _unfence(self, worker: str, reason: str) -> Fence:
        async with self.registry.lock:
            fence = await self.registry.remove(worker)
            self._emit("unfence", {"worker": worker, "reason": reason})
        self._arm_expiry()
        return fence

    async def _shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """A caller that goes away (client hung up) must not leave the file and the events disagreeing."""
        if self._loop is None or self._closed:
            work.close()
            raise RuntimeError("control hub is not running")
        return await asyncio.shield(self._spawn(work))

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _arm_expiry(self) -> None:
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        at = self.registry.next_expiry()
        if at is None or self._closed or self._loop is None:
            return
        self._expiry_handle = self._loop.call_later(max(0.0, at - self._clock()), self._on_expiry_timer)

    def _on_registry_change(self, worker: str, before: Fence | None, now: Fence | None) -> None:
        """A fence set or lifted elsewhere (another edge of a cluster, its failure management): the same
        events as a change made here, so proxies following this stream see it too."""
        if self._closed:
            return
        if now is not None:
            self._emit("fence", now.to_dict())
        elif before is not None:
            expired = before.expires is not None and before.expires <= self._clock()
            self._emit("unfence", {"worker": worker, "reason": "expired" if expired else "lifted"})
        self._arm_expiry()

    def _on_expiry_timer(self) -> None:
        self._expiry_handle = None
        self._spawn(self._expire_due())

    async def _expire_due(self) -> None:
        try:
            async with self.registry.lock:
                now = self._clock()
                for fence in list(self.registry.fences.values()):
                    if fence.expires is not None and fence.expires <= now:
                        await self.registry.remove(fence.worker)
                        self._emit("unfence", {"worker": fence.worker, "reason": "expired"})
        except OSError:
            log.exception("cannot lift expired fences; retrying in %.0f s", EXPIRY_RETRY)
            if self._loop is not None and not self._closed:
                self._expiry_handle = self._loop.call_later(EXPIRY_RETRY, self._on_expiry_timer)
            return
        self._arm_expiry()

    # --------------------------------------------------------------------------------------- probes
    def probe(self, worker: str, message_id: str, mode: str) -> None:
        """A probe (dummy message) for `worker` is out: the proxy serves its calls tagged with
        `message_id` by mimicry (`mimic`) or lets them through (`pass`) even while the worker is fenced.
        Not durable: a probe outlives neither the process nor the monitor that sent it."""
        if mode not in ("mimic", "pass"):
            raise ValueError(f"probe mode must be mimic or pass, not {mode!r}")
        data = {"worker": worker, "message_id": message_id, "mode": mode}
        self._probes[message_id] = data
        self._emit("probe", data)

    def probe_end(self, message_id: str) -> None:
        """The probe is over (result, timeout, or no longer needed); unknown ids are ignored."""
        data = self._probes.pop(message_id, None)
        if data is not None:
            self._emit("probe_end", data)

    def probes(self) -> list[dict[str, str]]:
        return list(self._probes.values())

    # --------------------------------------------------------------------------------------- floors
    def _on_floor(self, effect: FloorRaised) -> None:
        """Called by the service inside every claim: remember the highest token, flush later."""
        key = (effect.queue, effect.group)
        if effect.token > self._pending_floors.get(key, 0):
            self._pending_floors[key] = effect.token
        if self._flush_handle is None and self._loop is not None and not self._closed:
            delay = self._last_flush + self.floor_interval - self._loop.time()
            self._flush_handle = self._loop.call_later(max(0.0, delay), self._flush_floors)

    def _flush_floors(self) -> None:
        self._flush_handle = None
        assert self._loop is not None
        self._last_flush = self._loop.time()
        pending, self._pending_floors = self._pending_floors, {}
        if pending:
            self._emit("floor", {"floors": [[q, g, token] for (q, g), token in pending.items()]})

    def current_floors(self, scope: Scope | None = None) -> list[list[Any]]:
        """Every group the core holds with a floor above zero, as `[queue, group, token]` (of the
        queues `scope` sees: its tenant's, whatever its prefixes)."""
        return [
            [queue, group, floor]
            for queue, group, floor in self.service.floors()
            if scope is None or scope.sees_queue(queue, prefixes=False)
        ]

    # --------------------------------------------------------------------------------------- stream
    def _emit(self, event: str, data: dict[str, Any]) -> None:
        self._n += 1
        event_id = f"{self.instance}-{self._n}"
        frame = _frame(event_id, event, orjson.dumps(data))
        ring = self._ring
        ring.append((self._n, event, frame))
        self._ring_bytes += len(frame)
        while len(ring) > 1 and (len(ring) > self._buffer or self._ring_bytes > self._buffer_bytes):
            self._ring_bytes -= len(ring.popleft()[2])
        parts: dict[Hashable, bytes | None] = {}  # one rendering per distinct scope
        for subscription in list(self._subscribers):
            scope = subscription.scope
            if scope is None:
                subscription._offer(frame)
                continue
            key = scope.stream_key
            if key not in parts:
                parts[key] = _scoped_frame(event_id, event, data, frame, scope)
            part = parts[key]
            if part is not None:
                subscription._offer(part)
        if event != "floor":
            for listener in list(self.event_listeners):
                try:
                    listener(event, data)
                except Exception:  # a listener's bug must not break the stream
                    log.exception("control event listener failed on %s", event)

    def snapshot(self, scope: Scope | None = None) -> dict[str, Any]:
        """Fences, floors and active probes (those `scope` sees; None: all)."""
        fences = self.registry.sorted()
        probes = self.probes()
        if scope is not None:
            fences = [fence for fence in fences if scope.sees_worker(fence.worker)]
            probes = [probe for probe in probes if scope.sees_worker(probe["worker"])]
        data: dict[str, Any] = {
            "instance": self.instance,
            "fences": [fence.to_dict() for fence in fences],
            "floors": self.current_floors(scope),
        }
        if probes:  # only while some are active: a snapshot without the key has none
            data["probes"] = probes
        return data

    def subscribe(self, last_event_id: str | None = None, scope: Scope | None = None) -> Subscription:
        """A new stream: replay after `last_event_id` when the ring still has it all, else a snapshot;
        with a `scope`, only what it sees (event ids stay the server's, so resuming works the same).

        Synchronous on purpose: catch-up and registration happen with no await in between, so no event
        can fall into the gap.
        """
        if self._streams_closed or self._loop is None:
            raise StreamClosed("shutdown")
        last = self.last_event_id
        replay = self._replay_after(last_event_id, scope)
        if replay is None:
            frames = [_frame(last, "snapshot", orjson.dumps(self.snapshot(scope)))]
        else:
            frames = replay
        frames.append(_frame(last, "synced", orjson.dumps({"instance": self.instance})))
        subscription = Subscription(self, b"".join(frames), replay is not None, self.subscriber_limit, scope)
        self._subscribers.add(subscription)
        return subscription

    def _replay_after(self, last_event_id: str | None, scope: Scope | None = None) -> list[bytes] | None:
        if not last_event_id:
            return None
        instance, _, n_text = last_event_id.rpartition("-")
        # Plain ASCII digits only (int() also takes '٣', '1_0' and ' 5'); anything else gets a snapshot.
        if not (INTEGER_RE.fullmatch(instance) and INTEGER_RE.fullmatch(n_text)):
            return None
        same_instance = int(instance) == self.instance
        n = int(n_text)
        if not same_instance or n < 0 or n > self._n:
            return None
        if n == self._n:
            return []
        if not self._ring or self._ring[0][0] > n + 1:
            return None  # some of what followed is gone from the ring
        start = n + 1 - self._ring[0][0]
        entries = itertools.islice(self._ring, start, None)
        if scope is None:
            return [frame for _, _, frame in entries]
        replay = []
        for number, event, frame in entries:
            part = _scoped_frame(f"{self.instance}-{number}", event, _frame_data(frame), frame, scope)
            if part is not None:
                replay.append(part)
        return replay


def store_registry(service: QueueService, legacy: Path | None = None) -> StoreFenceRegistry:
    """Fences in `service`'s store, through its group commit; `legacy` (default: fences.json in the
    service's data dir) is migrated at start, and suspended.json beside it by failure management."""

    async def persist(effects: Any) -> None:
        await asyncio.shield(service.persist(effects))

    path = legacy if legacy is not None else service.data_dir / "fences.json"
    return StoreFenceRegistry(path, persist, lambda: service.saved_control)


def _scoped_frame(
    event_id: str, event: str, data: dict[str, Any], frame: bytes, scope: Scope
) -> bytes | None:
    """The frame as `scope` sees it: the same frame, a cut-down floor event, or None (nothing of its own).
    Unknown events are withheld: a scope sees only what is known to be its own."""
    if event == "floor":
        floors = [entry for entry in data["floors"] if scope.sees_queue(entry[0], prefixes=False)]
        if not floors:
            return None
        if len(floors) == len(data["floors"]):
            return frame
        return _frame(event_id, event, orjson.dumps({"floors": floors}))
    worker = data.get("worker")
    if event in ("fence", "unfence", "probe", "probe_end") and isinstance(worker, str):
        return frame if scope.sees_worker(worker) else None
    return None


def _frame_data(frame: bytes) -> dict[str, Any]:
    """The JSON of a frame this module wrote (one `data:` line, then the blank line)."""
    start = frame.index(b"\ndata: ") + len(b"\ndata: ")
    data: dict[str, Any] = orjson.loads(frame[start:-2])
    return data


def _frame(event_id: str, event: str, data: bytes) -> bytes:
    """One SSE event; orjson never emits newlines, so the JSON is always a single `data:` line."""
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (event_id.encode(), event.encode(), data)
