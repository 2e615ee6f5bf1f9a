"""The asyncio shell around the state machine: clock, timers, durability, bodies and long polling.

Every API face (the internal HTTP API now, the gateway in-process later) calls this class; it is the
only place that feeds `now` into the core and the only place that waits for the disk.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson

from .backend import DedupReach
from .durability import NO_BODIES, Bodies, CommitLog, DurableLog, LogFactory
from .figures import HELD_STATES, MAX_PARKED, Figures, HeldWorker, QueueFigures
from .long_polls import LongPolls, MayTake, Waiter
from .machine import (
    AckOutcome,
    AlreadyExists,
    Delivery,
    GroupPolicy,
    InvalidArgument,
    MoveStatus,
    PeekItem,
    QueueAttributes,
    QueueCore,
    QueueError,
    QueueMetrics,
    QueueNotFound,
    Redriven,
    SendRequest,
    SendResult,
)
from .machine.capabilities import PLAIN, Capabilities
from .machine.core import RenewMode
from .machine.effects import (
    AttemptRecorded,
    Effect,
    FloorRaised,
    GroupEvent,
    MessageInserted,
    MessagesDeleted,
    MessagesExpired,
)
from .machine.gauges import TOP_GROUPS, QueueGauges
from .machine.groups import DEFAULT_PARTITIONS
from .machine.handover import HandoverPolicy
from .machine.health import Probe
from .machine.inputs import AttemptResult, ControlRows
from .machine.queue import QueueState
from .machine.records import Received as Received  # re-exported: the faces import it from here
from .machine.routing import VersionFigures, version_figures
from .machine.supervisor import GateReported, HealthEffect, ProbeDelivered, Supervisor, SupervisorEffect
from .store import SqliteStore, StoredBody, read_attempt_log

log = logging.getLogger("strictq.queue")
T = TypeVar("T")
BODY_CACHE_BYTES = 32 * 1024 * 1024
MAX_WAIT = 20.0
FREEZE_AFTER_RESTORE = 10_000  # queued messages from which a restore freezes what it built


# What failure management's shell hears: counted attempts and retry-workflow group events of the core,
# and the supervisor's decisions (queue_core.machine.supervisor), in the order of the step that made them.
FailureEffect = AttemptRecorded | GroupEvent | SupervisorEffect
DEFAULT_PROBE_PAYLOAD: dict[str, Any] = {"probe": True}


class BodyCache:
    """Bodies of recent sends, so most receives never read the store; bounded in bytes.

    Entries not yet committed are never evicted: the reader connection could not see them yet. An
    OrderedDict, because evicting from the front of a plain dict rescans the holes earlier deletions left
    (quadratic; it took 63% of the loop under a deep backlog).
    """

    def __init__(self, max_bytes: int = BODY_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[int, StoredBody] = OrderedDict()
        self._committed_key = 0

    def put(self, key: int, value: StoredBody) -> None:
        self._entries[key] = value
        self.bytes += len(value[0]) + len(value[2])
        if self.bytes > self.max_bytes:
            self._evict()

    def drop(self, keys: Iterable[int]) -> None:
        entries = self._entries
        for key in keys:
            value = entries.pop(key, None)
            if value is not None:
                self.bytes -= len(value[0]) + len(value[2])

    def committed(self, key: int) -> None:
        self._committed_key = max(self._committed_key, key)
        if self.bytes > self.max_bytes:
            self._evict()

    def get(self, key: int) -> StoredBody | None:
        return self._entries.get(key)

    def _evict(self) -> None:
        entries = self._entries
        while self.bytes > self.max_bytes and entries:
            key = next(iter(entries))
            if key > self._committed_key:
                return
            value = entries.pop(key)
            self.bytes -= len(value[0]) + len(value[2])


class QueueService:
    def __init__(
        self,
        data_dir: str | Path,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        clock: Callable[[], float] = time.time,
        body_cache_bytes: int = BODY_CACHE_BYTES,
        epoch: int = 0,
        log_factory: LogFactory = DurableLog,
        key_space: tuple[int, int] = (0, 1),
    ) -> None:
        self.data_dir = Path(data_dir)
        # A cluster partition's owner (cluster.partition): the epoch it announced on the partition's stream
        # (tokens keep rising across owners), and a log that replicates each commit before it lands here.
        self._min_epoch = epoch
        self._log_factory = log_factory
        self._key_space = key_space  # (partition, partitions): ids unique across a cluster (CoreState)
        self.partitions = partitions
        self.dedup_reach: DedupReach = "queue"  # one core holds every group (queue_core.backend)
        self.clock = clock
        # The one supervisor over the core (and, once failure management starts, its health monitor):
        # polls, results and timers go through it. Workers take part in failure management only when they
        # declare it (QueueCore.opt_in).
        self.supervisor = Supervisor(QueueCore(partitions=partitions, opt_in=True))
        self.saved_control = ControlRows()  # fences, suspensions and blacklists the store kept
        self.cache = BodyCache(body_cache_bytes)
        self.ready = False
        self.restore_seconds = 0.0
        self.floor_listeners: list[Callable[[FloorRaised], None]] = []
        # Failure management's shell (queue_core.failures) hears the attempts, group events and the
        # supervisor's decisions of every step; it may run no core operation from there.
        self.failure_listeners: list[Callable[[FailureEffect], None]] = []
        self._store = SqliteStore(self.data_dir / "queue.sqlite3", clock)
        self._log: CommitLog | None = None
        self._private_futures = False  # the log's futures are each its caller's alone (DurableLog)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._long_polls = LongPolls()

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        collecting = gc.isenabled()
        gc.disable()  # a restore allocates millions of objects and frees none: ~20% faster without GC
        try:
            epoch, snapshot = self._store.open(now, self._min_epoch)
            core = QueueCore(epoch=epoch, partitions=self.partitions, opt_in=True, key_space=self._key_space)
            core.restore(snapshot, now)
            self.supervisor = Supervisor(core, self.supervisor.monitor, self.supervisor.gate)
            self.saved_control = self._store.control
            if sum(len(queue.by_id) for queue in core.queues.values()) >= FREEZE_AFTER_RESTORE:
                # The restored messages live until acked and are freed by reference counting; left to the
                # collector, its first young collections and every full one walk them all (a 1M backlog:
                # seconds of pauses under load). Frozen, the collector never visits them again.
                gc.freeze()
        finally:
            if collecting:
                gc.enable()
        self._log = self._log_factory(self._store, asyncio.get_running_loop(), self.cache.committed)
        self._private_futures = getattr(self._log, "private_futures", False)
        self.restore_seconds = time.perf_counter() - started
        self.ready = True
        self._reschedule()
        log.info(
            "store open: epoch %d, %d queues, restored in %.2fs",
            epoch,
            len(self.core.queues),
            self.restore_seconds,
        )

    def stop_waiting(self) -> None:
        """Start shutting down: not ready any more, and every long poll returns what it has."""
        self.ready = False
        self._long_polls.wake_all()

    async def close(self) -> None:
        self.stop_waiting()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._log is not None:
            await asyncio.to_thread(self._log.close)
        self._store.close()

    @property
    def healthy(self) -> bool:
        return self.ready and self._log is not None and self._log.failed is None

    @property
    def core(self) -> QueueCore:
        return self.supervisor.core

    @property
    def epoch(self) -> int:
        return self.core.epoch

    def floors(self) -> Iterator[tuple[str, str, int]]:
        """(queue, group, floor) of every group with a floor above zero (the control stream's snapshot)."""
        for queue in self.core.queues.values():
            for group in queue.groups.values():
                if group.floor > 0:
                    yield queue.name, group.name, group.floor

    # ---------------------------------------------------------------------------------- plumbing
    def _apply(
        self, operation: Callable[..., T], *args: Any, **kwargs: Any
    ) -> tuple[T, asyncio.Future[Bodies]]:
        """Run one core or supervisor operation at `now`, hand its effects to the store, re-arm the timer."""
        now = self.clock()
        result = operation(*args, now=now, **kwargs)
        return result, self._submit(self.supervisor.drain_effects(now))

    def supervise(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Failure management's inputs (operators, alerts): run it at `now`; its durable effects commit
        in order with everything else (`settled()` waits for them)."""
        result, _ = self._apply(operation, *args, **kwargs)
        return result

    def _read(self, operation: Callable[..., T], *args: Any) -> T:
        """A read of the core at `now` (metrics, peek): it advances the core's time like any call (claims
        expire, retention drops messages on the way), so its effects are drained, heard and submitted in
        order like any call's; the read itself waits for no commit (a failed store is the next write's
        error, as before)."""
        result, future = self._apply(operation, *args)
        future.add_done_callback(_retrieved)
        return result

    async def settled(self) -> None:
        """Everything submitted so far is durable."""
        await self._durable(self._submit([]))

    def persist(self, effects: Sequence[Effect]) -> asyncio.Future[Bodies]:
        """Durable effects decided outside the core (the control hub's fences), in commit order."""
        return self._submit(list(effects))

    def _submit(
        self, effects: Sequence[Effect | SupervisorEffect], fetch: Sequence[int] = ()
    ) -> asyncio.Future[Bodies]:
        assert self._log is not None, "service not started"
        durable: list[Effect] = []
        for effect in effects:
            if isinstance(effect, HealthEffect | ProbeDelivered | GateReported):
                for failure_listener in self.failure_listeners:
                    failure_listener(effect)
                continue
            durable.append(effect)
            if isinstance(effect, MessageInserted):
                self.cache.put(
                    effect.key, (effect.body, effect.content_type, effect.extra, effect.request_id)
                )
            elif isinstance(effect, MessagesDeleted):
                self.cache.drop(effect.keys)
            elif isinstance(effect, FloorRaised):
                for listener in self.floor_listeners:
                    listener(effect)
            elif isinstance(effect, AttemptRecorded | GroupEvent):
                for failure_listener in self.failure_listeners:
                    failure_listener(effect)
            elif isinstance(effect, MessagesExpired):  # names and a count only: never a body
                where = f"moved to {effect.dead_letter_queue}" if effect.dead_letter_queue else "dropped"
                log.info(
                    "queue %s: %d message(s) past its TTL or retention %s", effect.queue, effect.count, where
                )
        future = self._log.submit(durable, fetch)
        self._reschedule()
        return future

    async def _durable(self, future: asyncio.Future[Bodies]) -> Bodies:
        if self._private_futures:  # DurableLog: the future is this caller's alone
            return await future
        return await asyncio.shield(future)  # a client hanging up must not cancel the commit others share

    def _reschedule(self) -> None:
        deadline = self.supervisor.next_deadline()
        if deadline is None or (self._timer is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, deadline - self.clock()), self._on_timer)
        self._timer_at = deadline

    def _on_timer(self) -> None:
        self._timer = None
        if self._log is None:
            return
        now = self.clock()
        self.supervisor.handle_timer(now)
        self._submit(self.supervisor.drain_effects(now))
        self._long_polls.wake_all()

    def has_waiters(self, queue: str) -> bool:
        """Whether a long poll is waiting on `queue` now (tests use it instead of sleeping)."""
        return queue in self._long_polls

    def _notify(self, queue: str) -> None:
        """Every long poll of `queue` looks again: what changed may let any of them find something."""
        self._long_polls.wake_all(queue)

    def _notify_one(self, queue: str) -> None:
        """A send or an ack: one waiting receive that may take something looks, and passes it on
        (long_polls.py: a herd of woken receives polled for nothing)."""
        state = self.core.queues.get(queue)
        if state is None or state.handovers:
            # Deleted: every receive looks, and answers QueueNotFound. A handover: an ack may have ended a
            # donor's claim, and its long poll must answer at once with the export request (handover.py),
            # which `has_ready` does not see; handovers are rare, so everyone looks.
            self._long_polls.wake_all(queue)
            return
        self._long_polls.wake_one(queue, _may_take(state))

    def _may_take(self, queue: str) -> MayTake:
        state = self.core.queues.get(queue)
        return (lambda _: True) if state is None else _may_take(state)

    def wake(self, queue: str | None = None) -> None:
        """Let long polls of `queue` (None: of every queue) look again: failure management changed who
        may receive, or has a probe for one of them."""
        self._long_polls.wake_all(queue)

    # ------------------------------------------------------------------------------------ queues
    async def create_queue(self, name: str, attributes: dict[str, Any] | None = None) -> QueueAttributes:
        existed = name in self.core.queues
        state, future = self._apply(self.core.create_queue, name, attributes=attributes)
        if existed and attributes:
            # Re-creating with different attributes is a conflict, as in SQS; same ones are a no-op.
            wanted = QueueAttributes.from_dict(attributes)
            if wanted != state.attributes:
                raise AlreadyExists(f"queue {name!r} exists with different attributes", queue=name)
        await self._durable(future)
        return state.attributes

    async def set_attributes(self, name: str, changes: dict[str, Any]) -> QueueAttributes:
        attributes, future = self._apply(self.core.set_attributes, name, changes)
        self._notify(name)  # new routing or scheduling may give a waiting long poll something now
        await self._durable(future)
        return attributes

    async def delete_queue(self, name: str) -> None:
        _, future = self._apply(self.core.delete_queue, name)
        self._notify(name)
        await self._durable(future)

    async def list_queues(self, prefix: str = "") -> list[str]:
        return self.core.list_queues(prefix)

    async def attributes(self, name: str) -> QueueAttributes:
        return self.core.queue(name).attributes

    async def created_at(self, name: str) -> float:
        return self.core.queue(name).created_at

    async def metrics(self, name: str) -> QueueMetrics:
        return self._read(self.core.metrics, name)

    async def group_metrics(self, name: str, group: str) -> dict[str, Any]:
        return self._read(self.core.group_metrics, name, group)

    def gauges(self, top: int = TOP_GROUPS) -> list[QueueGauges]:
        """Every queue's gauges for a scrape (machine.gauges); synchronous, as a Prometheus collector is."""
        return self._read(self.core.gauges, top)

    async def figures(self, top: int = TOP_GROUPS) -> Figures:
        """The port's read for the dashboard and /metrics (queue_core.figures): every queue's gauges, its
        parked groups and suspension, the workers failure management holds back."""
        if not self.ready:
            return Figures(self.clock(), (), ready=False)
        supervisor = self.supervisor
        monitor = supervisor.monitor if supervisor.monitor is not None else supervisor.gate
        queues = []
        for gauges in self.gauges(top):
            parked = sorted(self.core.parked_groups(gauges.name))
            suspended = monitor is not None and monitor.suspended(gauges.name)
            queues.append(QueueFigures(gauges, tuple(parked[:MAX_PARKED]), len(parked), suspended))
        held: list[HeldWorker] = []
        if monitor is not None:
            for worker in sorted(monitor.workers):
                state = monitor.worker_state(worker)
                if state in HELD_STATES:
                    held.append(HeldWorker(worker, str(state)))
        return Figures(self.clock(), tuple(sorted(queues, key=lambda q: q.name)), tuple(held))

    # -------------------------------------------------------------------------------- messages
    async def send(
        self, queue: str, requests: Sequence[SendRequest], *, create: bool = False
    ) -> list[SendResult | QueueError]:
        results, future = self._apply(self.core.send, queue, requests, create=create)
        self._notify_one(queue)
        await self._durable(future)
        return results

    async def receive(
        self,
        queue: str,
        limit: int = 10,
        ttl: float | None = None,
        worker: str = "",
        wait: float = 0.0,
        probes: bool = True,
        capabilities: Capabilities = PLAIN,
    ) -> list[Received]:
        """Claim up to `limit` messages; with `wait`, long-poll until some arrive or the wait ends.
        `capabilities`: what the poller declared (machine.capabilities: without `results` it gets plain
        queue semantics); `probes`: whether the face can hand out failure management's probes at all
        (the SQS face cannot)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + min(max(wait, 0.0), MAX_WAIT)
        supervisor = self.supervisor
        turn: int | None = None  # tries to pass on when a send or an ack woke this receive (long_polls.py)
        while True:
            now = self.clock()
            try:
                polled = supervisor.poll(queue, limit, ttl, worker, capabilities, now, probes=probes)
            except BaseException:
                if turn:
                    self._long_polls.pass_on(queue, turn, False, self._may_take(queue))
                raise
            if turn:
                self._long_polls.pass_on(queue, turn, bool(polled.deliveries), self._may_take(queue))
            deliveries = polled.deliveries
            if polled.probe is not None:
                self._submit(supervisor.drain_effects(now))  # announces it before the worker can call
                return [self._probe_item(polled.probe)]
            remaining = give_up - loop.time()
            # A donor's poll answers at once when it has state to export (handover.py): it is waiting for it.
            exporting = capabilities.state and bool(supervisor.core.export_requests(queue, worker))
            if deliveries or remaining <= 0 or not self.ready or exporting:
                if not deliveries:
                    supervisor.core.count_empty_receive(queue)
                break
            self._submit(supervisor.drain_effects(now))  # a declaration, the gate's bookkeeping
            turn = await self._long_polls.wait(queue, worker, capabilities.version, remaining)
        # A poller taking state gets each moved group's transferred state with the group (handover.py).
        states = supervisor.core.take_states(queue, deliveries) if capabilities.state and deliveries else {}
        # Bodies the cache lacks are read by the writer thread right after the claim commits.
        missing = [d.key for d in deliveries if self.cache.get(d.key) is None]
        fetched = await self._durable(self._submit(supervisor.drain_effects(self.clock()), missing))
        deliveries = self._still_claimed(queue, deliveries, now)
        received = self._with_bodies(deliveries, fetched)
        for item in received:
            if item.delivery.group in states:
                item.state = states.pop(item.delivery.group)
        if received and (capabilities.results or capabilities.estimates):
            self._estimate(queue, received, capabilities)
        return received

    def _still_claimed(self, queue: str, deliveries: list[Delivery], claimed_at: float) -> list[Delivery]:
        """The deliveries whose claims still hold now that they are durable (QueueCore.still_claimed): in a
        cluster the commit waits for the stream's quorum, which an election can hold past the visibility
        timeout; a claim that ran out meanwhile is left out of the answer (its message is visible again,
        as the core says), never handed out with a receipt that no longer holds."""
        if not deliveries:
            return deliveries
        try:
            holds = self.core.still_claimed(queue, deliveries, claimed_at, self.clock())
        except QueueNotFound:  # deleted while the claim committed
            return deliveries
        if all(holds):
            return deliveries
        ran_out = holds.count(False)
        log.info("receive on %s: %d claims ran out while they committed; not handed out", queue, ran_out)
        return [d for d, held in zip(deliveries, holds, strict=True) if held]

    def _estimate(self, queue: str, received: list[Received], capabilities: Capabilities) -> None:
        """Pipelining (machine.estimates): remember the sizes of what goes to a worker that reports its
        attempts (the core learns from them), and give each item its estimate when the poller asked."""
        delivered = [(r.delivery.message_id, len(r.body), r.extra) for r in received]
        try:
            estimates = self.core.estimates_for(
                queue, delivered, self.clock(), record=capabilities.results, want=capabilities.estimates
            )
        except QueueNotFound:  # deleted while the claim committed
            return
        for item, estimate in zip(received, estimates, strict=False):  # none unless asked for
            item.estimate = estimate if estimate.known else None

    async def wait_ready(self, queue: str, wait: float, worker: str = "") -> bool:
        """Whether `queue` may have something for `worker` to receive, waiting up to `wait` seconds
        (MAX_WAIT at most) for it: a cluster gateway's long poll over many partitions waits on each at
        once. It claims nothing, so the gateway may drop the answers of the partitions it does not poll.
        True may be spurious (any change of the queue wakes it): the caller polls to find out."""
        if self.core.queue(queue).has_ready(worker):  # QueueNotFound, as receive answers
            return True
        if not self.ready:
            return False
        return await self._long_polls.watch(queue, min(max(wait, 0.0), MAX_WAIT))

    def _probe_item(self, probe: Probe) -> Received:
        """A probe as a poll item: its own group (it never holds up, nor waits behind, a real one), token 1
        (no claim behind it), the queue's `probe_payload` as body."""
        state = self.core.queues.get(probe.queue)
        payload = None if state is None else state.attributes.probe_payload
        body = orjson.dumps(DEFAULT_PROBE_PAYLOAD if payload is None else payload)
        delivered = probe.delivered or self.clock()
        delivery = Delivery(
            key=-1,
            message_id=probe.id,
            group=probe.id,
            seq=0,
            token=1,
            receipt=probe.id,
            receive_count=1,
            sent_at=probe.created,
            first_receive_at=delivered,
            claim_expires=probe.deadline or delivered,
        )
        return Received(delivery, body, "application/json", b"", probe=True)

    def _with_bodies(self, deliveries: Sequence[Delivery], fetched: Bodies) -> list[Received]:
        out: list[Received] = []
        for delivery in deliveries:
            value = self.cache.get(delivery.key) or fetched.get(delivery.key)
            if value is not None:  # None: deleted meanwhile (e.g. a purge while the claim committed)
                out.append(Received(delivery, value[0], value[1], value[2], request_id=value[3]))
        return out

    async def ack(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        """`holder`: the caller's worker identity, so that it ends only claims it holds (QueueCore.ack);
        None for operators and callers that proved the claim otherwise."""
        outcomes, future = self._apply(self.core.ack, queue, items, holder=holder)
        self._notify_one(queue)
        await self._durable(future)
        return outcomes

    async def renew(
        self,
        queue: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]:
        if mode not in ("extend", "set"):
            raise InvalidArgument("mode must be 'extend' or 'set'", field="mode")
        outcomes, future = self._apply(self.core.renew, queue, items, ttl, mode=mode, holder=holder)
        self._notify(queue)
        await self._durable(future)
        return outcomes

    async def release(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        outcomes, future = self._apply(self.core.release, queue, items, holder=holder)
        self._notify(queue)
        await self._durable(future)
        return outcomes

    async def unclaim_all(self, queue: str) -> int:
        count, future = self._apply(self.core.unclaim_all, queue)
        self._notify(queue)
        await self._durable(future)
        return count

    async def release_worker(self, worker: str) -> int:
        """Hand back every claim `worker` holds, in every queue (failure management fenced it), and its
        same-worker retries, so its groups go to other workers in order; returns how many messages were
        released."""
        freed, future = self._apply(self.core.forget_reservations, worker)
        if freed:
            self.wake()
            await self._durable(future)
        released = 0
        for state in list(self.core.queues.values()):
            items: list[tuple[str, int | None]] = [
                (message.id, group.floor)
                for group in state.groups.values()
                if group.claimed and group.claim_worker == worker
                for message in group.claimed
            ]
            if items:
                outcomes, future = self._apply(self.core.release, state.name, items)
                released += sum(outcome.status == "ok" for outcome in outcomes)
                self._notify(state.name)
                await self._durable(future)
        return released

    async def purge(self, queue: str) -> int:
        count, future = self._apply(self.core.purge, queue)
        await self._durable(future)
        return count

    async def peek(self, queue: str, limit: int = 10) -> list[tuple[PeekItem, bytes, str, bytes]]:
        items = self._read(self.core.peek, queue, limit)
        missing = [i.key for i in items if self.cache.get(i.key) is None]
        fetched = await self._durable(self._submit([], missing)) if missing else NO_BODIES
        out = []
        for item in items:
            value = self.cache.get(item.key) or fetched.get(item.key)
            if value is not None:
                out.append((item, value[0], value[1], value[2]))
        return out

    async def start_move(self, source: str, destination: str, move_id: str | None = None) -> MoveStatus:
        """`move_id`: a cluster's one id for the move over every partition (machine.moves)."""
        move, future = self._apply(self.core.start_move, source, destination, move_id=move_id)
        await self._durable(future)
        return move

    async def move_status(self, move_id: str) -> MoveStatus:
        return self.core.move_status(move_id)

    async def cancel_move(self, move_id: str) -> MoveStatus:
        return self.core.cancel_move(move_id, self.clock())

    # ------------------------------------------------------------- state transfer (machine.handover)
    async def hand_over(
        self, queue: str, groups: Sequence[str] | None, from_worker: str, policy: HandoverPolicy | None = None
    ) -> tuple[list[str], list[str]]:
        """QueueCore.hand_over at `now`, answered once durable; long polls look again (the donor may be
        waiting in one and has groups to export now)."""
        marked, future = self._apply(self.core.hand_over, queue, groups, from_worker, policy=policy)
        self._notify(queue)
        await self._durable(future)
        return marked

    def export_requests(self, queue: str, worker: str) -> list[str]:
        """Groups whose local state `worker` should upload now (read when answering its poll)."""
        return self.core.export_requests(queue, worker)

    async def put_state(self, queue: str, worker: str, states: dict[str, Any]) -> dict[str, str]:
        """The donor's state per group; answered once durable (its groups are deliverable again)."""
        outcomes, future = self._apply(self.core.put_state, queue, worker, states)
        self._notify(queue)
        await self._durable(future)
        return outcomes

    async def release_handover(self, queue: str, groups: Sequence[str]) -> list[str]:
        released, future = self._apply(self.core.release_handover, queue, groups)
        self._notify(queue)
        await self._durable(future)
        return released

    async def handovers(self, queue: str) -> list[dict[str, Any]]:
        return self._read(self.core.handovers, queue)

    # ------------------------------------------------------------ group routing (machine.routing)
    async def version_figures(self, queue: str, recent: float) -> VersionFigures:
        """What a rollout's gate compares: the workers' versions, those that polled in the last `recent`
        seconds, the attempts per version since the routing last changed (QueueNotFound for none)."""
        state = self.core.queue(queue)
        router = state.router
        attempts = router.attempts if router is not None else {}
        return version_figures(state.worker_versions, state.pollers, attempts, self.clock() - recent)

    # ---------------------------------------------------------- attempt results and the retry workflow
    async def report(
        self, queue: str, worker: str, results: Sequence[AttemptResult], holder: str | None = None
    ) -> list[AckOutcome]:
        """Workers' attempt results (docs/failure-management.md §1): per-item outcomes once durable.
        The supervisor routes results for outstanding probes to failure management, the rest to the core
        (and a fence they lead to frees the worker's reservations and claims in the same step).
        `holder`: as for `ack` (the core refuses results for claims that went to another worker)."""
        outcomes, future = self._apply(self.supervisor.report, queue, worker, results, holder=holder)
        self._notify(queue)
        await self._durable(future)
        return outcomes

    async def release_group(self, queue: str, group: str) -> int:
        released, future = self._apply(self.core.release_group, queue, group)
        self._notify(queue)
        await self._durable(future)
        return released

    async def redrive_group(self, queue: str, group: str) -> Redriven:
        (restored, released), future = self._apply(self.core.redrive, queue, group)
        self._notify(queue)
        await self._durable(future)
        return Redriven(restored, released)

    async def parked_groups(self, queue: str) -> list[str]:
        return self.core.parked_groups(queue)

    async def group_policy(self, queue: str, group: str) -> GroupPolicy:
        return GroupPolicy(*self.core.group_policy(queue, group))

    async def set_group_policy(self, queue: str, group: str, override: dict[str, Any] | None) -> GroupPolicy:
        """Replace the group's override (None or {}: remove it); answered once durable."""
        _, future = self._apply(self.core.set_group_policy, queue, group, override)
        await self._durable(future)
        return GroupPolicy(*self.core.group_policy(queue, group))

    async def group_log(self, queue: str, group: str, limit: int = 50) -> list[dict[str, Any]]:
        """The group's stored log data, newest first (read off the event loop, committed rows only)."""
        qid = self.core.queue(queue).qid
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArgument("limit must be an integer from 1 to 1000", field="limit")
        await self._durable(self._submit([]))  # what was reported before this call is committed
        return await asyncio.to_thread(read_attempt_log, self._store.path, qid, group, limit)


def _may_take(state: QueueState) -> MayTake:
    """Whether a waiting receive may find something in `state` now (True may be spurious)."""

    def may_take(waiter: Waiter) -> bool:
        return state.has_ready(waiter.worker, waiter.version)

    return may_take


def _retrieved(future: asyncio.Future[Bodies]) -> None:
    """Mark a commit nobody awaits as looked at (its failure is reported to the next write)."""
    if not future.cancelled():
        future.exception()
