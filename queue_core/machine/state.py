"""The state the parts of the core share, and the primitives they are built on.

`QueueCore` (core.py) is a facade over this one `CoreState`: sends (sends.py), claims (claims.py), retries
(retries.py) and moves (moves.py) all change it through the primitives here: ending a claim, deleting,
moving messages between queues, the timer heaps, keys and fencing tokens. Nothing here advances time on
its own; the facade does, once per call.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from . import handover
from .attributes import QueueAttributes, validate_queue_name
from .effects import (
    Effect,
    HistorySaved,
    MessagesDeleted,
    MessagesExpired,
    MessagesMoved,
    ParticipationChanged,
    QueueSaved,
)
from .errors import AlreadyExists, QueueError, QueueNotFound
from .groups import DEFAULT_PARTITIONS
from .heap import LazyHeap
from .queue import QueueState, tiebreak
from .records import KEY_SHIFT, GroupState, Message, MoveStatus
from .text import check_name

TOKEN_SHIFT = 32  # token = epoch << 32 | counter; the epoch is bumped durably at every start


class CoreState:
    """Queues, timer heaps, counters and the effects of the current step, shared by the core's parts."""

    def __init__(
        self,
        epoch: int = 1,
        partitions: int = DEFAULT_PARTITIONS,
        *,
        opt_in: bool = False,
        key_space: tuple[int, int] = (0, 1),
    ) -> None:
        if epoch < 1:
            raise ValueError("epoch must be >= 1")
        slot, stride = key_space
        if stride < 1 or not 0 <= slot < stride:
            raise ValueError("key_space must be (slot, stride) with 0 <= slot < stride")
        # A cluster partition's core takes only keys = slot (mod stride): message ids (made from keys) are
        # then unique across the cluster's partitions, so an id names one message wherever it is asked.
        self.key_slot, self.key_stride = slot, stride
        self.epoch = epoch
        self.partitions = partitions
        # Failure management is opt-in per worker (docs/failure-management.md, "Who takes part"): with
        # `opt_in`, only `participants` (workers whose latest poll declared `results`) have lapses counted
        # as failed attempts and same-worker retries reserved; everyone else gets plain queue semantics.
        # Without it (the bare core of the unit tests) every worker takes part, as before.
        self.opt_in = opt_in
        self.participants: set[str] = set()
        self.queues: dict[str, QueueState] = {}
        self.effects: list[Effect] = []
        self.next_qid = 1
        self.token_counter = 0
        self.last_key = 0
        self.round_robin = 0
        # (expires, tiebreak, group, token): claims to expire; stale entries are skipped.
        self.claims: LazyHeap[tuple[float, int, GroupState, int]] = LazyHeap(_claim_live)
        # (available_at, tiebreak, message): delayed messages.
        self.delays: LazyHeap[tuple[float, int, Message]] = LazyHeap(_delay_live)
        # (deadline, tiebreak, group): retention of each group's head.
        self.retention: LazyHeap[tuple[float, int, GroupState]] = LazyHeap(self._retention_live)
        # (reserve_until, tiebreak, message): same-worker retries that anyone may take after that.
        self.reservations: LazyHeap[tuple[float, int, Message]] = LazyHeap(_reservation_live)
        self.moves: dict[str, MoveStatus] = {}
        self.move_counter = 0
        # The `now` of the facade's latest call (QueueCore.handle_timer): hooks that run deep inside a step
        # (a claim ending starts a handover's timeout) read it instead of having it threaded through.
        self.now = 0.0
        # (deadline, tiebreak, queue, record): handovers whose donor has until then to send the state.
        self.handover_deadlines = handover.new_deadline_heap(self)

    # ----------------------------------------------------------------------------------- effects
    def drain_effects(self) -> list[Effect]:
        effects, self.effects = self.effects, []
        return effects

    # ------------------------------------------------------------------------------ participation
    def participates(self, worker: str) -> bool:
        """Whether `worker` takes part in failure management now (always, without `opt_in`)."""
        return not self.opt_in or (bool(worker) and worker in self.participants)

    def declare(self, worker: str, results: bool, now: float) -> bool:
        """A poll's declaration: `results` makes the worker a participant until a poll without it. Durable
        only when it changes (one row per participant), so a restart keeps the meaning of its claims.
        Returns whether it changed."""
        if not worker or (worker in self.participants) == results:
            return False
        check_name(worker, "worker")
        if results:
            self.participants.add(worker)
        else:
            self.participants.discard(worker)
        self.effects.append(ParticipationChanged(worker, results, now))
        return True

    # ------------------------------------------------------------------------------------ queues
    def queue(self, name: str) -> QueueState:
        queue = self.queues.get(name)
        if queue is None:
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        return queue

    def create_queue(
        self, name: str, now: float, attributes: dict[str, Any] | None = None, *, exist_ok: bool = True
    ) -> QueueState:
        validate_queue_name(name)
        attrs = QueueAttributes.from_dict(attributes or {})
        existing = self.queues.get(name)
        if existing is not None:
            if not exist_ok:
                raise AlreadyExists(f"queue {name!r} exists", queue=name)
            return existing
        queue = QueueState(self.next_qid, name, attrs, now)
        self.next_qid += 1
        self.queues[name] = queue
        self.effects.append(QueueSaved(queue.qid, name, attrs.to_dict(), now))
        return queue

    def dead_letter_queue(self, queue: QueueState) -> QueueState | None:
        name = queue.attributes.dead_letter_queue
        return self.queues.get(name) if name else None

    # ------------------------------------------------------------------------------ keys, tokens
    def new_key(self, now: float) -> int:
        key = max(self.last_key + 1, int(now * 1000) << KEY_SHIFT)
        key += (self.key_slot - key) % self.key_stride
        self.last_key = key
        return key

    def new_token(self) -> int:
        self.token_counter += 1
        if self.token_counter >= 1 << TOKEN_SHIFT:
            raise QueueError("fencing-token counter exhausted for this epoch; restart the server")
        return (self.epoch << TOKEN_SHIFT) | self.token_counter

    # ------------------------------------------------------------------------------------ claims
    def end_claim(self, queue: QueueState, message: Message) -> None:
        message.claim_expires = 0.0
        message.group.claimed.remove(message)
        queue.in_flight -= 1

    def unclaim(self, queue: QueueState, message: Message) -> None:
        """End a message's claim (expiry or release); dead-letter it at max receive count."""
        group = message.group
        self.end_claim(queue, message)
        attrs = queue.attributes
        dlq = self.dead_letter_queue(queue)
        if attrs.max_receive_count and message.receive_count >= attrs.max_receive_count and dlq is not None:
            self.transfer(queue, dlq, [message], origin=queue.name)
            queue.dead_lettered += 1
        if not group.claimed:
            self.claim_ended(queue, group)

    def claim_ended(self, queue: QueueState, group: GroupState) -> None:
        """The group's claim is over: it is ready again, and a running move of its queue takes it now."""
        if queue.scheduler is not None:
            queue.scheduler.claim_ended(group)
        queue.push_ready(group)
        if queue.handovers:
            handover.claim_ended(self, queue, group)
        for move in self.moves.values():
            if move.state == "running" and move.source == queue.name:
                move.pending_groups.append(group.name)

    # ---------------------------------------------------------------------------------- messages
    def delete(self, queue: QueueState, messages: list[Message]) -> None:
        ended: list[GroupState] = []
        dropped = tuple((m.key, queue.qid, m.id, None) for m in messages if m.history is not None)
        if dropped:
            self.effects.append(HistorySaved(dropped))
        for message in messages:
            if queue.remove(message):
                ended.append(message.group)
            elif not message.group.claimed and message.group.messages:
                queue.push_ready(message.group)  # head changed on an idle group (retention, dedup)
        queue.deleted += len(messages)
        if queue.handovers:
            handover.deleted(self, queue, messages)
        for group in ended:
            self.claim_ended(queue, group)
        self.effects.append(MessagesDeleted(tuple(m.key for m in messages)))

    def save_history(self, queue: QueueState, message: Message) -> None:
        history = message.history
        state = None if history is None else history.to_state()
        self.effects.append(HistorySaved(((message.key, queue.qid, message.id, state),)))

    def transfer(
        self, source: QueueState, target: QueueState, messages: list[Message], origin: str | None
    ) -> None:
        """Move idle messages to another queue, keeping group, sequence and id (DLQ, redrive, _move)."""
        moved: list[Message] = []
        redriven: list[Message] = []
        histories: list[tuple[int, int, str, dict[str, Any] | None]] = []
        for message in messages:
            if message.id in target.by_id:
                continue  # the target already holds this id (an earlier redrive): keep it where it is
            digest = source.content_of.get(message.key)
            source.remove(message)
            group, created = target.group(message.group.name, self.partitions)
            group.floor = max(group.floor, message.token)
            message.group = group
            if origin is not None:
                message.origin = origin
            elif message.origin is not None:
                # Out of a dead-letter queue: SQS treats redriven messages as new, so the receive count
                # starts again (else one more failure would send it straight back). Id and key stay, so
                # the group's order is restored.
                message.origin = None
                message.receive_count = 0
                message.first_receive_at = 0.0
                redriven.append(message)
                if message.history is not None:
                    message.history.reset_budget()  # a fresh retry budget; the log data stays
            history = message.history
            if history is not None:
                history.reserved_for = ""
                if history.parked:
                    target.parked.add(group.name)
                histories.append((message.key, target.qid, message.id, history.to_state()))
            target.insert(message)
            if digest is not None and target.attributes.kind == "dedup":
                target.index_content(message, digest)
            if created or group.messages[0] is message:
                self.push_retention(group)
            if not group.claimed:
                target.push_ready(group)
            moved.append(message)
        if moved:
            plain = tuple(m.key for m in moved if all(m is not r for r in redriven))
            if plain:
                self.effects.append(MessagesMoved(plain, target.qid, origin))
            if redriven:
                self.effects.append(
                    MessagesMoved(tuple(m.key for m in redriven), target.qid, None, redrive=True)
                )
        if histories:
            self.effects.append(HistorySaved(tuple(histories)))

    @staticmethod
    def discard_all(queue: QueueState) -> None:
        """Forget every message of a queue; heap entries that still point at them become stale."""
        for group in queue.groups.values():
            for message in group.messages:
                message.available_at = 0.0
                message.claim_expires = 0.0
            group.messages.clear()
            group.claimed.clear()
        queue.groups.clear()
        queue.by_id.clear()
        queue.ready.clear()
        if queue.scheduler is not None:
            queue.scheduler.clear()
        if queue.router is not None:
            queue.router.clear()
        queue.content_index.clear()
        queue.content_of.clear()
        queue.reserved.clear()
        queue.parked.clear()
        queue.in_flight = queue.delayed = 0

    # -------------------------------------------------------------------------------------- time
    def next_deadline(self) -> float | None:
        """When the shell must call `handle_timer` next (None: nothing scheduled)."""
        if any(m.state == "running" and m.pending_groups for m in self.moves.values()):
            return 0.0
        heaps = (self.claims, self.delays, self.retention, self.reservations, self.handover_deadlines)
        tops = (heap.peek() for heap in heaps)
        candidates = [top[0] for top in tops if top is not None]
        return min(candidates) if candidates else None

    def end_delays(self, now: float) -> None:
        """Delayed messages (a send's delay, a retry's backoff) whose wait is over are available again."""
        delays = self.delays
        while (ends := delays.peek()) is not None and ends[0] <= now:
            delays.pop()
            message = ends[2]
            message.available_at = 0.0
            group = message.group
            group.queue.delayed -= 1
            group.queue.push_ready(group)

    def expire_retention(self, now: float) -> None:
        """The messages past their queue's lifetime (TTL or retention) leave it, group head by group head,
        in order: dropped, or dead-lettered (on_expiry="dead_letter" with a TTL and a dead-letter queue)."""
        retention = self.retention
        while (old := retention.peek()) is not None and old[0] <= now:
            retention.pop()
            group = old[2]
            queue = group.queue
            attrs = queue.attributes
            limit = now - attrs.lifetime
            expired = prefix(group.messages, (int(limit * 1000) + 1) << KEY_SHIFT)
            if expired:
                queue.expired += len(expired)
                dlq = (
                    self.dead_letter_queue(queue)
                    if attrs.ttl > 0 and attrs.on_expiry == "dead_letter"
                    else None
                )
                if dlq is not None and dlq is not queue:
                    self.dead_letter_expired(queue, dlq, expired)
                else:
                    self.delete(queue, expired)
                self.effects.append(
                    MessagesExpired(queue.name, len(expired), None if dlq is None else dlq.name, now)
                )
            if group.messages and queue.groups.get(group.name) is group:
                self.push_retention(group)

    def dead_letter_expired(self, queue: QueueState, dlq: QueueState, messages: list[Message]) -> None:
        """Move expired messages to the dead-letter queue in order; a claim on one of them ends (its worker
        held it past the TTL: its ack finds the message gone)."""
        group = messages[0].group
        had_claim = bool(group.claimed)
        for message in messages:
            if message.claim_expires:
                self.end_claim(queue, message)
        self.transfer(queue, dlq, messages, origin=queue.name)
        queue.dead_lettered += len(messages)
        if had_claim and not group.claimed and queue.groups.get(group.name) is group:
            self.claim_ended(queue, group)

    def push_retention(self, group: GroupState) -> None:
        if group.messages:
            deadline = group.messages[0].sent_at + group.queue.attributes.lifetime
            self.retention.push((deadline, next(tiebreak), group))

    def _retention_live(self, entry: tuple[float, int, GroupState]) -> bool:
        group = entry[2]
        queue: QueueState = group.queue
        return (
            bool(group.messages)
            and queue.groups.get(group.name) is group
            and self.queues.get(queue.name) is queue
        )


def prefix(messages: deque[Message], below_key: int) -> list[Message]:
    """The leading messages with a key below `below_key` (a group is in key order)."""
    out: list[Message] = []
    for message in messages:
        if message.key >= below_key:
            break
        out.append(message)
    return out


def _claim_live(entry: tuple[float, int, GroupState, int]) -> bool:
    group = entry[2]
    return bool(group.claimed) and group.floor == entry[3]


def _delay_live(entry: tuple[float, int, Message]) -> bool:
    return entry[2].available_at == entry[0]


def _reservation_live(entry: tuple[float, int, Message]) -> bool:
    history = entry[2].history
    return history is not None and bool(history.reserved_for) and history.reserve_until == entry[0]
