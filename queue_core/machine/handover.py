"""Local state transfer (issue 18): a group moving from one worker to another takes its local state along.

Workers keep local state per group (running aggregates, counts). When a group (or a set of them) moves
away from a worker, `hand_over` marks it: it is held (delivered to nobody) until the donor's state for it
has arrived (`put_state`), or until the queue's `handover_timeout` passes, when its `handover_policy`
decides: `proceed` (delivered without the state; an event says so) or `wait` (held until an operator
releases it; an event). A group in flight moves only once its current claim ends (the patent: a control
operation waits until the batch is done), and only then does the timeout start. The state that arrived is
kept (durably, `HandoverSaved`) and handed to the first worker that claims the group afterwards, inline in
its poll (`take_states`), and dropped once a message of the group claimed with it is deleted (acked or
reported succeeded); a claim that lapses first leaves it for the next claimer.

The donor learns what to export from its own polls (`export_requests`), so no channel beyond the one it
already uses is needed. Records live on the queue (`QueueState.handovers`, by group name) and in the
store's `handovers` table; the receive path asks `held()` (one dict lookup, nothing when no handover is
pending) before it gives a group out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .attributes import HANDOVER_POLICIES as POLICIES
from .attributes import HandoverPolicy as HandoverPolicy
from .effects import Effect, GroupEvent, HandoverSaved
from .errors import InvalidArgument, LimitExceeded, TooLarge
from .heap import LazyHeap
from .queue import QueueState, tiebreak
from .records import HELD_PHASES, Delivery, GroupState, Handover, Message
from .text import check_name


class CoreState(Protocol):
    """What the handover rules use of machine.state.CoreState (a protocol: state.py imports this module)."""

    queues: dict[str, QueueState]
    effects: list[Effect]
    now: float
    handover_deadlines: LazyHeap[tuple[float, int, QueueState, Handover]]

    def queue(self, name: str) -> QueueState: ...


MAX_GROUP_STATE = 1024 * 1024  # bytes of one group's state (compact JSON)
MAX_QUEUE_STATE = 64 * 1024 * 1024  # bytes of transferred state one queue keeps at once
MAX_HANDOVERS = 10_000  # groups in handover per queue at once
MAX_GROUPS_PER_CALL = 1000  # groups named in one hand_over / put_state / release
EXPORT_BATCH = 256  # groups one poll answer asks its donor to export, at most (the header is bounded too)


# ---------------------------------------------------------------------------------- the receive path
def held(queue: QueueState, group: GroupState) -> bool:
    """Whether the receive path must not give `group` out now: it is moving and its state has not arrived
    (nor has the policy let it go). The caller drops the group's ready entry; it is pushed again when the
    handover ends (`_release`)."""
    if not queue.handovers:
        return False
    record = queue.handovers.get(group.name)
    return record is not None and record.phase in HELD_PHASES


# --------------------------------------------------------------------------------- hooks of CoreState
def claim_ended(state: CoreState, queue: QueueState, group: GroupState) -> None:
    """A claim on `group` ended: a handover that waited for it asks the donor now; its timeout runs."""
    record = queue.handovers.get(group.name)
    if record is not None and record.phase == "draining":
        _await(state, queue, record, state.now)


def deleted(state: CoreState, queue: QueueState, messages: Iterable[Message]) -> None:
    """Messages left the queue: one claimed with the transferred state (its token at or above the one the
    state was handed to) means a worker went on from it, so the state is dropped."""
    for message in messages:
        record = queue.handovers.get(message.group.name)
        if (
            record is not None
            and record.phase == "arrived"
            and record.given
            and message.token >= record.given
        ):
            _forget(state, queue, record)


def restored(
    state: CoreState, queue: QueueState, rows: Iterable[tuple[str, dict[str, Any]]], now: float
) -> None:
    """Records from the store after a restart: deadlines re-armed, a draining group whose claim did not
    survive starts awaiting now."""
    for group_name, data in rows:
        record = Handover.from_dict(group_name, data)
        queue.handovers[group_name] = record
        if record.phase == "awaiting":
            state.handover_deadlines.push((record.deadline, next(tiebreak), queue, record))
        elif record.phase == "draining":
            group = queue.groups.get(group_name)
            if group is None or not group.claimed:
                _await(state, queue, record, now)


def new_deadline_heap(state: CoreState) -> LazyHeap[tuple[float, int, QueueState, Handover]]:
    """The heap of handover deadlines; an entry is stale once its record moved on or its queue is gone."""

    def live(entry: tuple[float, int, QueueState, Handover]) -> bool:
        deadline, _, queue, record = entry
        return (
            record.phase == "awaiting"
            and record.deadline == deadline
            and queue.handovers.get(record.group) is record
            and state.queues.get(queue.name) is queue
        )

    return LazyHeap(live)


# ------------------------------------------------------------------------------------ the operations
def check_states(states: Any) -> dict[str, int]:
    """An upload's shape and per-group bounds, checked before any of it is applied (a cluster checks the
    whole upload before it splits it over partitions); each group's state size."""
    if not isinstance(states, dict):
        raise InvalidArgument('the body must be a JSON object: {"<group>": {<state>}, ...}')
    if len(states) > MAX_GROUPS_PER_CALL:
        raise InvalidArgument(f"at most {MAX_GROUPS_PER_CALL} groups per upload", field="groups")
    sizes: dict[str, int] = {}
    for name, value in states.items():
        check_name(name, "group")
        if not isinstance(value, dict):
            raise InvalidArgument(f"the state of group {name!r} must be a JSON object", field=name)
        sizes[name] = size = state_size(value, name)
        if size > MAX_GROUP_STATE:
            raise TooLarge(
                f"the state of group {name!r} is {size} bytes, over {MAX_GROUP_STATE}",
                field=name,
                size=size,
                limit=MAX_GROUP_STATE,
            )
    return sizes


class Handovers:
    """hand_over, put_state, export_requests, take_states, release and the timeout."""

    def __init__(self, state: CoreState) -> None:
        self.state = state

    def hand_over(
        self,
        queue_name: str,
        groups: Sequence[str] | None,
        from_worker: str,
        now: float,
        policy: HandoverPolicy | None = None,
    ) -> tuple[list[str], list[str]]:
        """Mark `groups` (None: every group whose newest claim went to `from_worker`) as moving away from
        `from_worker`; returns (marked, already moving). See QueueCore.hand_over for the contract."""
        state = self.state
        queue = state.queue(queue_name)
        check_name(from_worker, "from")
        if policy is not None and policy not in POLICIES:
            raise InvalidArgument(f"policy must be one of {', '.join(POLICIES)}", field="policy")
        chosen: HandoverPolicy = policy or queue.attributes.handover_policy
        if groups is None:
            names = [g.name for g in queue.groups.values() if g.claim_worker == from_worker]
        else:
            if len(groups) > MAX_GROUPS_PER_CALL:
                raise InvalidArgument(f"at most {MAX_GROUPS_PER_CALL} groups per call", field="groups")
            for index, name in enumerate(groups):
                check_name(name, "groups", index=index)
            names = list(dict.fromkeys(groups))
        marked: list[str] = []
        already: list[str] = []
        for name in names:
            if name in queue.handovers:
                already.append(name)
                continue
            if len(queue.handovers) >= MAX_HANDOVERS:
                raise LimitExceeded(
                    f"queue {queue_name!r} has {MAX_HANDOVERS} groups in handover already", field="groups"
                )
            record = Handover(name, from_worker, now, chosen, "draining")
            queue.handovers[name] = record
            group = queue.groups.get(name)
            if group is not None and group.claimed:
                _save(state, queue, record)
            else:
                _await(state, queue, record, now)
            marked.append(name)
            state.effects.append(
                GroupEvent(
                    queue.name, name, "handover", f"moving away from {from_worker} ({chosen})", "", now
                )
            )
        return marked, already

    def export_requests(self, queue_name: str, worker: str, limit: int = EXPORT_BATCH) -> list[str]:
        """The groups whose state `worker` should export now (it is their donor, their claims are over)."""
        queue = self.state.queues.get(queue_name)
        if queue is None or not queue.handovers or not worker:
            return []
        out: list[str] = []
        for record in queue.handovers.values():
            if record.donor == worker and record.phase in ("awaiting", "waiting"):
                out.append(record.group)
                if len(out) >= limit:
                    break
        return out

    def put_state(self, queue_name: str, worker: str, states: dict[str, Any], now: float) -> dict[str, str]:
        """The donor's state per group: `ok` (kept; the group is deliverable again), `not_requested` (no
        handover of it from this worker is waiting for its state). Bad shapes and sizes raise."""
        state = self.state
        queue = state.queue(queue_name)
        sizes = check_states(states)
        accepted = [
            name
            for name in states
            if (record := queue.handovers.get(name)) is not None
            and record.donor == worker
            and record.phase in ("awaiting", "waiting")
        ]
        kept = sum(r.size for r in queue.handovers.values())
        incoming = sum(sizes[name] for name in accepted)
        if kept + incoming > MAX_QUEUE_STATE:
            raise TooLarge(
                f"queue {queue_name!r} would keep {kept + incoming} bytes of transferred state, over"
                f" {MAX_QUEUE_STATE}: upload fewer groups at once",
                size=kept + incoming,
                limit=MAX_QUEUE_STATE,
            )
        out = {name: "not_requested" for name in states}
        for name in accepted:
            record = queue.handovers[name]
            record.phase, record.state, record.size, record.deadline = (
                "arrived",
                states[name],
                sizes[name],
                0.0,
            )
            _save(state, queue, record)
            _release(queue, record)
            state.effects.append(
                GroupEvent(queue.name, name, "handover-state", f"{sizes[name]} bytes from {worker}", "", now)
            )
            out[name] = "ok"
        return out

    def take_states(self, queue_name: str, deliveries: Sequence[Delivery]) -> dict[str, Any]:
        """The transferred state of each delivered group that has one, by group: handed to this claim."""
        queue = self.state.queues.get(queue_name)
        if queue is None or not queue.handovers:
            return {}
        out: dict[str, Any] = {}
        for delivery in deliveries:
            record = queue.handovers.get(delivery.group)
            if record is None or record.phase != "arrived" or delivery.group in out:
                continue
            out[delivery.group] = record.state
            if record.given != delivery.token:
                record.given = delivery.token
                _save(self.state, queue, record)
        return out

    def release(self, queue_name: str, groups: Sequence[str], now: float) -> list[str]:
        """An operator lets held groups go on without their state (policy `wait`, or any held group)."""
        state = self.state
        queue = state.queue(queue_name)
        if len(groups) > MAX_GROUPS_PER_CALL:
            raise InvalidArgument(f"at most {MAX_GROUPS_PER_CALL} groups per call", field="groups")
        released: list[str] = []
        for name in groups:
            record = queue.handovers.get(name)
            if record is None or record.phase not in HELD_PHASES:
                continue
            _forget(state, queue, record)
            released.append(name)
            state.effects.append(
                GroupEvent(
                    queue.name, name, "handover-release", "released by an operator, without state", "", now
                )
            )
        return released

    def pending(self, queue_name: str) -> list[dict[str, Any]]:
        return [record.view() for record in self.state.queue(queue_name).handovers.values()]

    def expire_due(self, now: float) -> None:
        """Handovers whose donor did not send the state in time: the policy decides."""
        heap = self.state.handover_deadlines
        while (due := heap.peek()) is not None and due[0] <= now:
            heap.pop()
            _, _, queue, record = due
            if record.policy == "wait":
                record.phase = "waiting"
                _save(self.state, queue, record)
                reason = f"no state from {record.donor} in time: held until an operator releases it"
                event = "handover-wait"
            else:
                _forget(self.state, queue, record)
                reason = f"no state from {record.donor} in time: delivered without it"
                event = "handover-timeout"
            self.state.effects.append(GroupEvent(queue.name, record.group, event, reason, "", now))


# ------------------------------------------------------------------------------------------- helpers
def state_size(value: Any, name: str) -> int:
    """Bytes of compact JSON; InvalidArgument naming the group for what JSON cannot hold."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return len(text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        raise InvalidArgument(f"the state of group {name!r} is not storable JSON", field=name) from None


def _await(state: CoreState, queue: QueueState, record: Handover, now: float) -> None:
    record.phase = "awaiting"
    record.deadline = now + queue.attributes.handover_timeout
    state.handover_deadlines.push((record.deadline, next(tiebreak), queue, record))
    _save(state, queue, record)


def _save(state: CoreState, queue: QueueState, record: Handover) -> None:
    state.effects.append(HandoverSaved(queue.qid, record.group, record.to_dict()))


def _forget(state: CoreState, queue: QueueState, record: Handover) -> None:
    del queue.handovers[record.group]
    state.effects.append(HandoverSaved(queue.qid, record.group, None))
    _release(queue, record)


def _release(queue: QueueState, record: Handover) -> None:
    """The group may be delivered again: back into the ready heap when idle."""
    group = queue.groups.get(record.group)
    if group is not None and not group.claimed:
        queue.push_ready(group)
