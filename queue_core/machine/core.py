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
from .attributes import ROUTING_FIELDS, SCHEDULING_FIELDS, QueueAttributes, RetryPolicy
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
from .errors import LimitExceeded, QueueError
from .estimates import estimate as estimate_of
from .gauges import QueueGauges, queue_gauges
from .groups import DEFAULT_PARTITIONS
from .handover import MAX_GROUPS_PER_CALL, HandoverPolicy, Handovers
from .handover import restored as restore_handovers
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
        self._handovers = Handovers(self.state)

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
        if any(name in changes for name in (*SCHEDULING_FIELDS, *ROUTING_FIELDS)):
            queue.reschedule()
        if "routing" in changes:
            self._hand_over_moved(queue, now)
        return queue.attributes

    def _hand_over_moved(self, queue: QueueState, now: float) -> None:
        """Groups the new routing takes away from the worker that last claimed them go with their local
        state, when that worker keeps state (it declared `state`), drained groups too (their state lives
        on in the worker: `state_holders`): a handover each (machine.handover).
        Groups over the handover limits move without their state (the limit's error is not the routing
        change's: the change stands)."""
        router = queue.router
        if router is None or not queue.state_holders:
            return
        table, versions = router.table, queue.worker_versions
        moving: dict[str, list[str]] = {}
        for name, donor in list(queue.state_holders.items()):
            if donor in queue.state_workers and table.route_of(name) not in table.routes_for(
                donor, versions.get(donor, "")
            ):
                moving.setdefault(donor, []).append(name)
                del queue.state_holders[name]  # its state is on its way; the next claimer holds it
        for donor, names in moving.items():
            for start in range(0, len(names), MAX_GROUPS_PER_CALL):
                try:
                    self._handovers.hand_over(
                        queue.name, names[start : start + MAX_GROUPS_PER_CALL], donor, now
                    )
                except LimitExceeded:
                    return

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

    def saw_version(
        self, queue_name: str, worker: str, version: str, keeps_state: bool | None = None
    ) -> None:
        """The version `worker` polls `queue_name` as, before any gate holds the poll (a routed queue's
        figures per version count its fenced workers too)."""
        self.state.queue(queue_name).saw_version(worker, version, keeps_state)

    def receive(
        self,
        queue_name: str,
        limit: int,
        ttl: float | None,
        worker: str,
        now: float,
        version: str = "",
        max_bytes: int = 0,
    ) -> list[Delivery]:
        """SQS FIFO delivery: oldest available group first, as many of its messages as fit, repeat.
        `version`: the software version the worker polls as (group routing's canary share); `max_bytes`:
        the largest message it takes (0: any), bigger ones go to a worker that can take them."""
        self.handle_timer(now)
        return self._claims.receive(queue_name, limit, ttl, worker, now, version, max_bytes)

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
    def start_move(self, source: str, destination: str, now: float, move_id: str | None = None) -> MoveStatus:
        return self._moves.start(source, destination, now, move_id)

    def move_status(self, move_id: str) -> MoveStatus:
        return self._moves.status(move_id)

    def cancel_move(self, move_id: str, now: float) -> MoveStatus:
        return self._moves.cancel(move_id, now)

    # ------------------------------------------------------------------------------ handovers
    def hand_over(
        self,
        queue_name: str,
        groups: Sequence[str] | None,
        from_worker: str,
        now: float,
        policy: HandoverPolicy | None = None,
    ) -> tuple[list[str], list[str]]:
        """Move `groups` of `queue_name` away from `from_worker`, with their local state (issue 18;
        machine.handover, docs/state-transfer.md). The one entry point for whatever decides a move
        (an operator's `strictq handover`, group routing's pins and rollouts, a fleet drain or fence).

        `groups`: group names (a name with no messages now is fine: its future messages are held), or
        None for every group whose newest claim went to `from_worker`. `policy`: what to do when the
        donor does not send the state within the queue's `handover_timeout`, `proceed` (deliver without
        it) or `wait` (hold until `release_handover`); None: the queue's `handover_policy`.

        From this call on, the groups are delivered to nobody (a claim still out, whoever holds it, runs
        to its end first: the timeout starts when it ends) until the donor's state arrives through
        `put_state` (the donor learns which groups to export from `export_requests` on its polls), or the
        policy lets them go. The state then goes, inline, to the first claimer (`take_states`), whichever
        worker that is; the caller routes the groups elsewhere if the donor must not get them back.
        Returns (marked, already moving): a group already in a handover keeps it. Durable once the
        call's effects are; events (`GroupEvent`) tell each step. Raises QueueNotFound, InvalidArgument
        (a bad name or policy), LimitExceeded (too many groups in handover in this queue)."""
        self.handle_timer(now)
        return self._handovers.hand_over(queue_name, groups, from_worker, now, policy)

    def export_requests(self, queue_name: str, worker: str) -> list[str]:
        """Groups whose state `worker` should export now (bounded; it donates them and their claims ended)."""
        return self._handovers.export_requests(queue_name, worker)

    def put_state(self, queue_name: str, worker: str, states: dict[str, Any], now: float) -> dict[str, str]:
        """The donor's local state per group: status `ok` or `not_requested` per group (see Handovers)."""
        self.handle_timer(now)
        return self._handovers.put_state(queue_name, worker, states, now)

    def take_states(self, queue_name: str, deliveries: Sequence[Delivery]) -> dict[str, Any]:
        """The transferred state of the delivered groups, by group, handed to these claims (call it right
        after `receive`, for a poller that takes state)."""
        return self._handovers.take_states(queue_name, deliveries)

    def release_handover(self, queue_name: str, groups: Sequence[str], now: float) -> list[str]:
        self.handle_timer(now)
        return self._handovers.release(queue_name, groups, now)

    def handovers(self, queue_name: str, now: float) -> list[dict[str, Any]]:
        self.handle_timer(now)
        return self._handovers.pending(queue_name)

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

    def still_claimed(
        self, queue_name: str, deliveries: Sequence[Delivery], claimed_at: float, now: float
    ) -> list[bool]:
        """For each delivery of a receive made at `claimed_at`, whether its claim still holds at `now`: the
        message is there, claimed under the delivery's token, and not yet due to expire. A receive whose
        commit waited past the claim's visibility timeout (a stream leader's election in a cluster) must
        not hand out a claim that has run out: the message may already be another receive's again (or the
        same receive's next pass's: one answer would hold it twice). A claim given no time (ttl 0, SQS
        `VisibilityTimeout=0`) was released at once by design (or dead-lettered, at `max_receive_count`)
        and is handed out as always."""
        queue = self.state.queues.get(queue_name)
        found: list[bool] = []
        for delivery in deliveries:
            if delivery.claim_expires <= claimed_at:
                found.append(True)  # ttl 0: released (or dead-lettered) at once, handed out as always
                continue
            message = queue.by_id.get(delivery.message_id) if queue is not None else None
            holds = message is not None and message.token == delivery.token and message.claim_expires > now
            found.append(holds)  # not: deleted, claimed again since, or run out
        return found

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
        self.state.now = now
        self._claims.expire_due(now)
        self.state.end_delays(now)
        self._retries.end_reservations(now)
        self.state.expire_retention(now)
        if self.state.moves:
            self._moves.step(now)
        self._handovers.expire_due(now)

    # ---------------------------------------------------------------------------------- restore
    def restore(self, snapshot: Snapshot, now: float) -> None:
        """Rebuild from the store after a restart; claims keep their expiry, tokens stay monotonic."""
        restore_into(self.state, snapshot, now)
        self.state.now = now
        by_qid = {queue.qid: queue for queue in self.state.queues.values()}
        rows: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for qid, group, record in snapshot.handovers:
            rows.setdefault(qid, []).append((group, record))
        for qid, records in rows.items():
            if qid in by_qid:
                restore_handovers(self.state, by_qid[qid], records, now)
