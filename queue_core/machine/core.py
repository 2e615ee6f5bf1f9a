"""The strict queue as a pure state machine: operations and an explicit `now` in, results and effects out.

No clocks, sockets or sleeping in here (enforced by ruff's banned-api rule for this package). The shell
calls `handle_timer(now)` at `next_deadline()` and drains `effects` after every call, in order.

`QueueCore` is a facade: each call that may see time pass advances it once (`handle_timer`), then
delegates to one part, all built on the shared state and primitives of state.py: sends (sends.py),
claims (claims.py: receive, ack, renew, release, expiry, the holder rule), retries (retries.py: results,
backoff, reservations, park, dead-letter, redrive) and moves (moves.py). Read-only views
(inspection.py) advance time too, so the shell drains and persists their effects like any other call's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protocol.estimates import Estimate

from . import inspection
from .attributes import SCHEDULING_FIELDS, QueueAttributes, RetryPolicy
from .claims import (
    MAX_CLAIM_TTL,
    MAX_EXCLUDED_SKIPS,
    MAX_RECEIVE_LIMIT,
    POLLER_WINDOW,
    Claims,
    RenewMode,
    check_limit,
)
from .effects import Effect, QueueDropped, QueuePurged, QueueSaved
from .errors import QueueError
from .estimates import estimate as estimate_of
from .gauges import QueueGauges, queue_gauges
from .groups import DEFAULT_PARTITIONS
from .inputs import AttemptResult, SendRequest, Snapshot
from .moves import MOVE_CHUNK, Moves
from .queue import QueueState
from .records import AckOutcome, Delivery, MoveStatus, PeekItem, QueueMetrics, SendResult
from .restore import restore_into
from .retries import EXPIRED_REASON, MAX_GROUP_POLICIES, MAX_REASON, MAX_SIGNATURE, Retries
from .sends import Sends
from .state import TOKEN_SHIFT, CoreState

__all__ = [
    "EXPIRED_REASON",
    "MAX_CLAIM_TTL",
    "MAX_EXCLUDED_SKIPS",
    "MAX_GROUP_POLICIES",
    "MAX_REASON",
    "MAX_RECEIVE_LIMIT",
    "MAX_SIGNATURE",
    "MOVE_CHUNK",
    "POLLER_WINDOW",
    "TOKEN_SHIFT",
    "QueueCore",
    "RenewMode",
]


class QueueCore:
    """The core's one interface for the shell (queue_core.service, the supervisor, tests)."""

    def __init__(
        self,
        epoch: int = 1,
        partitions: int = DEFAULT_PARTITIONS,
        *,
        opt_in: bool = False,
        key_space: tuple[int, int] = (0, 1),
    ) -> None:
        self.state = CoreState(epoch, partitions, opt_in=opt_in, key_space=key_space)
        self._sends = Sends(self.state)
        self._retries = Retries(self.state)
        self._claims = Claims(self.state, self._retries.lapsed)
        self._moves = Moves(self.state)

    # ------------------------------------------------------------------------------- shared state
    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def partitions(self) -> int:
        return self.state.partitions

    @property
    def opt_in(self) -> bool:
        return self.state.opt_in

    @property
    def participants(self) -> set[str]:
        return self.state.participants

    @property
    def queues(self) -> dict[str, QueueState]:
        return self.state.queues

    @property
    def moves(self) -> dict[str, MoveStatus]:
        return self.state.moves

    @property
    def effects(self) -> list[Effect]:
        return self.state.effects

    def drain_effects(self) -> list[Effect]:
        return self.state.drain_effects()

    # ------------------------------------------------------------------------------ participation
    def participates(self, worker: str) -> bool:
        """Whether `worker` takes part in failure management now (always, without `opt_in`)."""
        return self.state.participates(worker)

    def declare(self, worker: str, results: bool, now: float) -> bool:
        return self.state.declare(worker, results, now)

    # ------------------------------------------------------------------------------------ queues
    def create_queue(
        self, name: str, now: float, attributes: dict[str, Any] | None = None, *, exist_ok: bool = True
    ) -> QueueState:
        return self.state.create_queue(name, now, attributes, exist_ok=exist_ok)

    def set_attributes(self, name: str, changes: dict[str, Any], now: float) -> QueueAttributes:
        state = self.state
        queue = state.queue(name)
        queue.attributes = queue.attributes.updated(changes)
        state.effects.append(QueueSaved(queue.qid, name, queue.attributes.to_dict(), queue.created_at))
        if "retention" in changes:
            for group in queue.groups.values():
                state.push_retention(group)
        if any(name in changes for name in SCHEDULING_FIELDS):
            queue.reschedule()
        return queue.attributes

    def delete_queue(self, name: str, now: float) -> None:
        state = self.state
        queue = state.queue(name)
        del state.queues[name]
        state.discard_all(queue)
        state.effects.append(QueueDropped(queue.qid))

    def queue(self, name: str) -> QueueState:
        return self.state.queue(name)

    def list_queues(self, prefix: str = "") -> list[str]:
        return sorted(name for name in self.state.queues if name.startswith(prefix))

    def purge(self, queue_name: str, now: float) -> int:
        self.handle_timer(now)
        state = self.state
        queue = state.queue(queue_name)
        count = len(queue.by_id)
        state.discard_all(queue)
        queue.deleted += count
        state.effects.append(QueuePurged(queue.qid))
        return count

    # ---------------------------------------------------------------------------- sends, claims
    def send(
        self, queue_name: str, requests: Sequence[SendRequest], now: float, *, create: bool = False
    ) -> list[SendResult | QueueError]:
        """Accept a batch; each entry succeeds or fails on its own (bad entries never sink good ones)."""
        self.handle_timer(now)
        return self._sends.send(queue_name, requests, now, create=create)

    def receive(
        self, queue_name: str, limit: int, ttl: float | None, worker: str, now: float
    ) -> list[Delivery]:
        """SQS FIFO delivery: oldest available group first, as many of its messages as fit, repeat."""
        self.handle_timer(now)
        return self._claims.receive(queue_name, limit, ttl, worker, now)

    def ack(
        self, queue_name: str, items: Sequence[tuple[str, int | None]], now: float, holder: str | None = None
    ) -> list[AckOutcome]:
        """Delete messages; only the newest claim's holder may (claims.refusal), unless an operator."""
        self.handle_timer(now)
        return self._claims.ack(queue_name, items, holder)

    def renew(
        self,
        queue_name: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        now: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]:
        """EmoDB renew (`extend`) or SQS ChangeMessageVisibility (`set`); ttl 0 releases."""
        self.handle_timer(now)
        return self._claims.renew(queue_name, items, ttl, now, mode, holder)

    def release(
        self, queue_name: str, items: Sequence[tuple[str, int | None]], now: float, holder: str | None = None
    ) -> list[AckOutcome]:
        return self.renew(queue_name, items, 0.0, now, mode="set", holder=holder)

    def unclaim_all(self, queue_name: str, now: float) -> int:
        self.handle_timer(now)
        return self._claims.unclaim_all(queue_name, now)

    def floor(self, queue_name: str, group_name: str) -> int:
        group = self.state.queue(queue_name).groups.get(group_name)
        return 0 if group is None else group.floor

    # ---------------------------------------------------------------------------------- retries
    def report(
        self,
        queue_name: str,
        worker: str,
        results: Sequence[AttemptResult],
        now: float,
        holder: str | None = None,
    ) -> list[AckOutcome]:
        """Workers' attempt results (docs/failure-management.md §1), applied per group in order."""
        self.handle_timer(now)
        outcomes = self._retries.report(queue_name, worker, results, now, holder)
        queue = self.state.queues.get(queue_name)
        if queue is not None:  # pipelining's learned estimates (estimates.py)
            queue.estimates.observe(results, [outcome.status for outcome in outcomes])
        return outcomes

    def estimates_for(
        self,
        queue_name: str,
        delivered: Sequence[tuple[str, int, bytes]],
        now: float,
        *,
        record: bool = True,
        want: bool = True,
    ) -> list[Estimate]:
        """Each delivered message's estimate (estimates.py), from (message id, body size, extra bytes);
        `record`: remember the sizes, to learn from the attempts' results (the poller reports them);
        `want`: the poller asked for the estimates (else nothing is computed: an empty list)."""
        queue = self.state.queue(queue_name)
        learned = queue.estimates
        if record:
            for message_id, size, _ in delivered:
                learned.delivered(message_id, size)
        if not want:
            return []
        attributes = queue.attributes
        configured = Estimate(
            attributes.processing_estimate or None, attributes.preprocessing_estimate or None
        )
        return [estimate_of(learned, configured, size, extra) for _, size, extra in delivered]

    def release_group(self, queue_name: str, group_name: str, now: float) -> int:
        self.handle_timer(now)
        return self._retries.release_group(queue_name, group_name, now)

    def redrive(self, queue_name: str, group_name: str, now: float) -> tuple[int, int]:
        self.handle_timer(now)
        return self._retries.redrive(queue_name, group_name, now)

    def parked_groups(self, queue_name: str) -> list[str]:
        return self._retries.parked_groups(queue_name)

    def set_group_policy(
        self, queue_name: str, group_name: str, override: dict[str, Any] | None, now: float
    ) -> RetryPolicy:
        return self._retries.set_group_policy(queue_name, group_name, override)

    def group_policy(self, queue_name: str, group_name: str) -> tuple[RetryPolicy, dict[str, Any]]:
        return self._retries.group_policy(queue_name, group_name)

    def forget_reservations(self, worker: str, now: float) -> int:
        return self._retries.forget_reservations(worker)

    # ------------------------------------------------------------------------------------ moves
    def start_move(self, source: str, destination: str, now: float) -> MoveStatus:
        return self._moves.start(source, destination, now)

    def move_status(self, move_id: str) -> MoveStatus:
        return self._moves.status(move_id)

    def cancel_move(self, move_id: str, now: float) -> MoveStatus:
        return self._moves.cancel(move_id, now)

    # ------------------------------------------------------------------------------- inspection
    def peek(self, queue_name: str, limit: int, now: float) -> list[PeekItem]:
        """Messages in receipt order within groups, ignoring claims (EmoDB peek: a debugging view)."""
        self.handle_timer(now)
        check_limit(limit)
        return inspection.peek(self.state.queue(queue_name), limit)

    def metrics(self, queue_name: str, now: float) -> QueueMetrics:
        self.handle_timer(now)
        return inspection.queue_metrics(self.state.queue(queue_name), now)

    def group_metrics(self, queue_name: str, group_name: str, now: float) -> dict[str, Any]:
        self.handle_timer(now)
        return inspection.group_metrics(self.state.queue(queue_name), group_name, self.state.partitions, now)

    def gauges(self, top: int, now: float) -> list[QueueGauges]:
        """Every queue's scrape-time gauges (machine.gauges), at `now`."""
        self.handle_timer(now)
        return [queue_gauges(queue, now, top) for queue in self.state.queues.values()]

    def count_empty_receive(self, queue_name: str) -> None:
        """A receive that returned nothing (the shell knows when a long poll's wait is over); no effect:
        like the other counters, it starts again at 0 with the process."""
        queue = self.state.queues.get(queue_name)
        if queue is not None:
            queue.empty_receives += 1

    # ------------------------------------------------------------------------------------- time
    def next_deadline(self) -> float | None:
        """When the shell must call `handle_timer` next (None: nothing scheduled)."""
        return self.state.next_deadline()

    def handle_timer(self, now: float) -> None:
        """Expire claims, end delays and reservations, drop messages past retention and advance moves,
        up to `now`. Idempotent for the same `now`."""
        self._claims.expire_due(now)
        self.state.end_delays(now)
        self._retries.end_reservations(now)
        self.state.expire_retention(now)
        if self.state.moves:
            self._moves.step(now)

    # ---------------------------------------------------------------------------------- restore
    def restore(self, snapshot: Snapshot, now: float) -> None:
        """Rebuild from the store after a restart; claims keep their expiry, tokens stay monotonic."""
        restore_into(self.state, snapshot, now)
