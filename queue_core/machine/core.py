"""The strict queue as a pure state machine: operations and an explicit `now` in, results and effects out.

No clocks, sockets or sleeping in here (enforced by ruff's banned-api rule for this package). The shell
calls `handle_timer(now)` at `next_deadline()` and drains `effects` after every call, in order.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

from . import inspection
from .attributes import QueueAttributes, RetryPolicy, validate_queue_name
from .effects import (
    AttemptLogged,
    AttemptRecorded,
    AvailabilityChanged,
    ClaimRow,
    ClaimsChanged,
    DedupSaved,
    Effect,
    FloorRaised,
    GroupEvent,
    GroupPolicySaved,
    HistorySaved,
    MessageInserted,
    MessagesClaimed,
    MessagesDeleted,
    MessagesMoved,
    ParticipationChanged,
    QueueDropped,
    QueuePurged,
    QueueSaved,
    ReceiveCountsRestored,
    TokensRaised,
)
from .errors import (
    AlreadyExists,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    NotInFlight,
    QueueError,
    QueueNotFound,
    StaleClaim,
    TooLarge,
)
from .groups import DEFAULT_PARTITIONS, auto_group, partition_of, validate_group, validate_message_id
from .heap import LazyHeap
from .inputs import OUTCOMES, AttemptResult, SendRequest, Snapshot
from .queue import QueueState, tiebreak
from .records import (
    KEY_SHIFT,
    AckOutcome,
    AttemptHistory,
    Delivery,
    GroupState,
    Message,
    MoveStatus,
    PeekItem,
    QueueMetrics,
    ReportOutcome,
    SendResult,
    format_receipt,
    message_id_for,
)
from .restore import restore_into
from .text import check_json, check_name, check_text

TOKEN_SHIFT = 32  # token = epoch << 32 | counter; the epoch is bumped durably at every start
MAX_RECEIVE_LIMIT = 1000
MAX_CLAIM_TTL = 12 * 3600.0
MOVE_CHUNK = 2000  # messages moved per timer call, so a big move never stalls the shell
RenewMode = Literal["extend", "set"]
MAX_REASON = 2048  # characters of a result's reason (the API faces also bound the bytes)
MAX_SIGNATURE = 512
POLLER_WINDOW = 60.0  # a worker that received within this many seconds counts as present
MAX_EXCLUDED_SKIPS = 64  # groups one receive sets aside because they exclude its worker, at most
MAX_GROUP_POLICIES = 10_000  # per-group retry policy overrides per queue
EXPIRED_REASON = "claim expired"


class QueueCore:
    def __init__(self, epoch: int = 1, partitions: int = DEFAULT_PARTITIONS, *, opt_in: bool = False) -> None:
        if epoch < 1:
            raise ValueError("epoch must be >= 1")
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
        self._next_qid = 1
        self._token_counter = 0
        self._last_key = 0
        self._round_robin = 0
        # (expires, tiebreak, group, token): claims to expire; stale entries are skipped.
        self._claims: LazyHeap[tuple[float, int, GroupState, int]] = LazyHeap(_claim_live)
        # (available_at, tiebreak, message): delayed messages.
        self._delays: LazyHeap[tuple[float, int, Message]] = LazyHeap(_delay_live)
        # (deadline, tiebreak, group): retention of each group's head.
        self._retention: LazyHeap[tuple[float, int, GroupState]] = LazyHeap(self._retention_live)
        # (reserve_until, tiebreak, message): same-worker retries that anyone may take after that.
        self._reservations: LazyHeap[tuple[float, int, Message]] = LazyHeap(_reservation_live)
        self.moves: dict[str, MoveStatus] = {}
        self._move_counter = 0

    # ----------------------------------------------------------------------------------------- effects
    def drain_effects(self) -> list[Effect]:
        effects, self.effects = self.effects, []
        return effects

    # ------------------------------------------------------------------------------------ participation
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

    # ------------------------------------------------------------------------------------------ queues
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
        queue = QueueState(self._next_qid, name, attrs, now)
        self._next_qid += 1
        self.queues[name] = queue
        self.effects.append(QueueSaved(queue.qid, name, attrs.to_dict(), now))
        return queue

    def set_attributes(self, name: str, changes: dict[str, Any], now: float) -> QueueAttributes:
        queue = self.queue(name)
        queue.attributes = queue.attributes.updated(changes)
        self.effects.append(QueueSaved(queue.qid, name, queue.attributes.to_dict(), queue.created_at))
        if "retention" in changes:
            for group in queue.groups.values():
                self._push_retention(group)
        return queue.attributes

    def delete_queue(self, name: str, now: float) -> None:
        queue = self.queue(name)
        del self.queues[name]
        self._discard_all(queue)
        self.effects.append(QueueDropped(queue.qid))

    def queue(self, name: str) -> QueueState:
        queue = self.queues.get(name)
        if queue is None:
            raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
        return queue

    def list_queues(self, prefix: str = "") -> list[str]:
        return sorted(name for name in self.queues if name.startswith(prefix))

    # -------------------------------------------------------------------------------------------- send
    def send(
        self, queue_name: str, requests: Sequence[SendRequest], now: float, *, create: bool = False
    ) -> list[SendResult | QueueError]:
        """Accept a batch; each entry succeeds or fails on its own (bad entries never sink good ones)."""
        self.handle_timer(now)
        if create and queue_name not in self.queues:
            self.create_queue(queue_name, now)
        queue = self.queue(queue_name)
        queue.expire_dedup(now)
        results: list[SendResult | QueueError] = []
        for request in requests:
            try:
                results.append(self._send_one(queue, request, now))
            except QueueError as exc:
                results.append(exc)
        return results

    def _send_one(self, queue: QueueState, request: SendRequest, now: float) -> SendResult:
        attrs = queue.attributes
        body = request.body
        if len(body) > attrs.max_message_size:
            raise TooLarge(
                f"message of {len(body)} bytes exceeds the queue's limit of {attrs.max_message_size}",
                size=len(body),
                limit=attrs.max_message_size,
            )
        group_name = request.group
        if group_name is not None and group_name not in queue.groups:  # known groups were validated
            validate_group(group_name)
        delay = attrs.delay if request.delay is None else float(request.delay)
        if not 0 <= delay <= 900:
            raise InvalidArgument("delay must be between 0 and 900 seconds", field="delay")
        if not isinstance(request.content_type, str):
            raise InvalidArgument("content_type must be a string", field="content_type")
        check_name(request.content_type, "content_type")  # a text column, and a header on the way out
        if request.message_id is not None:
            validate_message_id(request.message_id)
            existing = queue.by_id.get(request.message_id)
            if existing is not None:  # idempotent by caller-supplied id (replay, redrive)
                return self._result(existing, duplicate=True)
        dedup_key = self._dedup_key(queue, group_name, request)
        if dedup_key is not None:
            seen = queue.dedup.get(dedup_key)
            if seen is not None and seen[3] > now:
                return SendResult(seen[0], seen[2], seen[1], partition_of(seen[2], self.partitions), True)

        key = self._new_key(now)
        message_id = request.message_id or message_id_for(key)
        if group_name is None:
            self._round_robin = (self._round_robin + 1) % self.partitions
            group_name = auto_group(self._round_robin, message_id)
        group, created = queue.group(group_name, self.partitions)
        available_at = now + delay if delay > 0 else 0.0
        message = Message(key, message_id, group, available_at)
        queue.insert(message)
        queue.sent += 1
        if created:
            self._push_retention(group)
        if available_at:
            self._delays.push((available_at, next(tiebreak), message))
        elif len(group.messages) == 1:
            queue.push_ready(group)
        digest = None
        if attrs.kind == "dedup":
            digest = hashlib.blake2b(body, digest_size=16).digest()
            queue.index_content(message, digest)
        self.effects.append(
            MessageInserted(
                queue.qid,
                key,
                message_id,
                group_name,
                body,
                request.content_type,
                request.extra,
                available_at,
                digest,
            )
        )
        if dedup_key is not None and attrs.dedup_window > 0:
            expires = now + attrs.dedup_window
            queue.dedup[dedup_key] = (message_id, key, group_name, expires)
            queue.dedup_order.append((expires, dedup_key))
            self.effects.append(DedupSaved(queue.qid, dedup_key, message_id, key, group_name, expires))
        return self._result(message)

    def _dedup_key(self, queue: QueueState, group: str | None, request: SendRequest) -> str | None:
        dedup_id = request.dedup_id
        if dedup_id is None and queue.attributes.content_based_dedup:
            dedup_id = hashlib.sha256(request.body).hexdigest()
        if dedup_id is None:
            return None
        if not isinstance(dedup_id, str) or not 0 < len(dedup_id) <= 128:
            raise InvalidArgument("dedup_id must be 1-128 characters", field="dedup_id")
        check_name(dedup_id, "dedup_id")
        if queue.attributes.dedup_scope == "group" and group is not None:
            return f"{group}\x00{dedup_id}"
        return dedup_id

    def _result(self, message: Message, duplicate: bool = False) -> SendResult:
        group = message.group
        return SendResult(message.id, group.name, message.seq, group.partition, duplicate)

    def _new_key(self, now: float) -> int:
        key = max(self._last_key + 1, int(now * 1000) << KEY_SHIFT)
        self._last_key = key
        return key

    def _new_token(self) -> int:
        self._token_counter += 1
        if self._token_counter >= 1 << TOKEN_SHIFT:
            raise QueueError("fencing-token counter exhausted for this epoch; restart the server")
        return (self.epoch << TOKEN_SHIFT) | self._token_counter

    # ----------------------------------------------------------------------------------------- receive
    def receive(
        self, queue_name: str, limit: int, ttl: float | None, worker: str, now: float
    ) -> list[Delivery]:
        """SQS FIFO delivery: oldest available group first, as many of its messages as fit, repeat."""
        self.handle_timer(now)
        queue = self.queue(queue_name)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECEIVE_LIMIT:
            raise InvalidArgument(f"limit must be an integer from 1 to {MAX_RECEIVE_LIMIT}", field="limit")
        check_name(worker, "worker")  # stored as the claim's worker: the store must be able to write it
        ttl = queue.attributes.visibility_timeout if ttl is None else float(ttl)
        if not 0 <= ttl <= MAX_CLAIM_TTL:
            raise InvalidArgument(f"ttl must be between 0 and {MAX_CLAIM_TTL:.0f} seconds", field="ttl")
        deliveries: list[Delivery] = []
        claims: list[ClaimRow] = []
        expires = now + ttl
        collapse = queue.attributes.kind == "dedup"
        seen_digests: set[bytes] = set()
        doomed: dict[int, Message] = {}
        self._saw_poller(queue, worker, now)
        mine = queue.reserved.get(worker) if queue.reserved else None
        skipped: list[GroupState] = []
        zero: list[GroupState] = []  # claimed with ttl 0 (SQS VisibilityTimeout=0): visible again at once
        while len(deliveries) < limit:
            group = self._next_group(queue, worker, mine, skipped, now)
            if group is None:
                break
            token = self._new_token()
            group.floor = token
            group.claim_worker = worker
            superseded: list[int] = []
            claiming = True
            for message in group.messages:
                if claiming and (
                    len(deliveries) >= limit
                    or message.available_at
                    or (message.history is not None and message.history.parked)
                ):
                    claiming = False
                if not claiming:
                    # Messages delivered under an older claim but not part of this one get the new token
                    # too, so that the old claim stays stale after a restart (floors derive from rows).
                    if not message.token:
                        break  # delivered messages form a prefix of the group
                    message.token = token
                    superseded.append(message.key)
                    continue
                if collapse:
                    digest = queue.content_of.get(message.key)
                    if digest is not None:
                        if digest in seen_digests:
                            doomed[message.key] = message
                            continue
                        seen_digests.add(digest)
                message.token = token
                message.claim_expires = expires
                message.receive_count += 1
                if not message.first_receive_at:
                    message.first_receive_at = now
                    queue.age_of_first_attempt = now - message.sent_at
                group.claimed.append(message)
                deliveries.append(self._delivery(message))
                claims.append(
                    ClaimRow(message.key, token, expires, message.receive_count, message.first_receive_at)
                )
            queue.in_flight += len(group.claimed)
            if ttl:
                self._claims.push((expires, next(tiebreak), group, token))
            else:
                zero.append(group)
            self.effects.append(FloorRaised(queue.name, group.name, token))
            if superseded:
                self.effects.append(TokensRaised(tuple(superseded), token))
        for group in skipped:  # excluded for this worker only: back for everyone else
            queue.push_ready(group)
        if mine is not None and mine.peek() is None:
            del queue.reserved[worker]
        if claims:
            queue.received += len(claims)
            self.effects.append(MessagesClaimed(tuple(claims), worker))
        if collapse:
            # EmoDB DedupQueueService: identical messages waiting at poll time collapse into the one polled.
            for digest in seen_digests:
                for message in queue.content_index.get(digest, ()):
                    if not message.claim_expires:
                        doomed[message.key] = message
            if doomed:
                self._delete(queue, list(doomed.values()))
        for group in zero:
            # Released right away, not expired: a claim given no time is no attempt that failed (the
            # receive count still rises, so max_receive_count applies as in SQS).
            for message in list(group.claimed):
                self._unclaim(queue, message)
        return deliveries

    def _next_group(
        self,
        queue: QueueState,
        worker: str,
        mine: LazyHeap[tuple[int, int, GroupState]] | None,
        skipped: list[GroupState],
        now: float,
    ) -> GroupState | None:
        """The oldest available group this worker may take: its own reserved retries compete with the
        shared heap by head key; a group whose failing head excludes the worker is set aside while other
        workers are polling. Without retries in play this is one heap pop, as before."""
        ready = queue.ready
        while True:
            if mine is not None:
                top = ready.peek()
                own = mine.peek()
                if own is not None and (top is None or own[0] < top[0]):
                    mine.pop()
                    group = own[2]
                    history = group.messages[0].history
                    if history is not None:
                        history.reserved_for = ""  # the retry is taken
                    return group
            top = ready.pop()
            if top is None:
                return None
            group = top[2]
            history = group.messages[0].history
            if (
                history is not None
                and history.exclude
                and worker in history.failed_workers
                and self._others_polling(queue, history, now)
            ):
                skipped.append(group)
                if len(skipped) >= MAX_EXCLUDED_SKIPS:
                    return None
                continue
            return group

    @staticmethod
    def _saw_poller(queue: QueueState, worker: str, now: float) -> None:
        pollers = queue.pollers
        pollers[worker] = now
        if len(pollers) > 1024 and len(pollers) > 2 * queue.pollers_pruned_at:
            horizon = now - POLLER_WINDOW
            for name in [w for w, at in pollers.items() if at < horizon]:
                del pollers[name]
            queue.pollers_pruned_at = len(pollers)

    @staticmethod
    def _others_polling(queue: QueueState, history: AttemptHistory, now: float) -> bool:
        horizon = now - POLLER_WINDOW
        failed = history.failed_workers
        return any(at >= horizon and w not in failed for w, at in queue.pollers.items())

    def _delivery(self, message: Message) -> Delivery:
        history = message.history
        return Delivery(
            message.key,
            message.id,
            message.group.name,
            message.seq,
            message.token,
            format_receipt(message.token, message.id),
            message.receive_count,
            message.sent_at,
            message.first_receive_at,
            message.claim_expires,
            message.origin,
            history.view() if history is not None and history.attempts else None,
        )

    # ------------------------------------------------------------------------------- ack, renew, release
    def ack(
        self,
        queue_name: str,
        items: Sequence[tuple[str, int | None]],
        now: float,
        holder: str | None = None,
    ) -> list[AckOutcome]:
        """Delete messages. With a token, only the newest claim's holder may delete (fencing); with a
        `holder` (a worker's identity), only messages whose newest claim went to that worker (see
        `_refusal`). Neither: an operator's delete by id (EmoDB's ack), whatever the claims."""
        self.handle_timer(now)
        queue = self.queue(queue_name)
        outcomes: list[AckOutcome] = []
        doomed: list[Message] = []
        doomed_ids: set[str] = set()
        for message_id, token in items:
            message = queue.by_id.get(message_id)
            if message is None or message_id in doomed_ids:
                outcomes.append(AckOutcome(message_id, "gone", "no such message (already deleted?)"))
                continue
            refusal = self._refusal(message, token, holder)
            if refusal is not None:
                outcomes.append(refusal)
                continue
            doomed.append(message)
            doomed_ids.add(message_id)
            outcomes.append(AckOutcome(message_id, "ok"))
        if doomed:
            self._delete(queue, doomed)
        return outcomes

    def _stale(self, message: Message, token: int | None) -> AckOutcome | None:
        if token is None or (token == message.token and token == message.group.floor):
            return None
        error = StaleClaim(
            "claim superseded: the group was claimed again with a newer fencing token",
            token=token,
            floor=message.group.floor,
        )
        return AckOutcome(message.id, error.code, error.message)

    def _refusal(self, message: Message, token: int | None, holder: str | None) -> AckOutcome | None:
        """Why the caller may not end or extend `message`'s claim, or None when it may.

        Ending a claim needs proof of holding it. A token must name the newest claim (fencing); tokens
        count up, so a token alone proves nothing to a worker that can guess one. A `holder` is the
        caller's worker identity (the credential the face authenticated): the newest claim on the
        message must have gone to that worker, whether or not it is still live (a late ack of an expired
        claim nobody took since still works, as in EmoDB), and a message never delivered is nobody's.
        `holder` None: the caller is an operator, or proved the claim otherwise (an authenticated SQS
        receipt handle, the core's own release of a fenced worker)."""
        stale = self._stale(message, token)
        if stale is not None or holder is None:
            return stale
        group = message.group
        if message.token and message.token == group.floor and group.claim_worker == holder:
            return None
        error = StaleClaim(
            "not held by the caller: the newest claim on this message went to another worker, or it"
            " was never delivered",
            holder=holder,
        )
        return AckOutcome(message.id, error.code, error.message)

    def renew(
        self,
        queue_name: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        now: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]:
        """EmoDB renew (`extend`: never shortens, recreates an expired claim nobody superseded) or SQS
        ChangeMessageVisibility (`set`: from now, may shorten, only while in flight). ttl 0 releases.
        `holder`: as for `ack`, only the worker the newest claim went to may renew or release it."""
        self.handle_timer(now)
        queue = self.queue(queue_name)
        ttl = float(ttl)
        if not 0 <= ttl <= MAX_CLAIM_TTL:
            raise InvalidArgument(f"ttl must be between 0 and {MAX_CLAIM_TTL:.0f} seconds", field="ttl")
        changes: list[tuple[int, float]] = []
        released: list[Message] = []
        answered: dict[tuple[str, int | None], AckOutcome] = {}
        outcomes: list[AckOutcome] = []
        for message_id, token in items:
            outcome = answered.get((message_id, token))  # the same item twice in one request: same answer
            if outcome is None:
                outcome = self._renew_one(queue, message_id, token, holder, ttl, now, mode, changes, released)
                answered[message_id, token] = outcome
            outcomes.append(outcome)
        for message in released:
            changes.append((message.key, now))
            self._unclaim(queue, message)
        if changes:
            self.effects.append(ClaimsChanged(tuple(changes)))
        return outcomes

    def _renew_one(
        self,
        queue: QueueState,
        message_id: str,
        token: int | None,
        holder: str | None,
        ttl: float,
        now: float,
        mode: RenewMode,
        changes: list[tuple[int, float]],
        released: list[Message],
    ) -> AckOutcome:
        message = queue.by_id.get(message_id)
        if message is None:
            return AckOutcome(message_id, "gone", "no such message (already deleted?)")
        refusal = self._refusal(message, token, holder)
        if refusal is not None:
            return refusal
        group = message.group
        if not message.claim_expires:
            if ttl == 0:
                return AckOutcome(message_id, "ok")
            # Only an expired claim nobody superseded comes back; a message waiting out a retry's backoff
            # ended its attempt (a reported failure): renewing it would claim and delay it at once.
            if mode == "set" or not message.token or message.token != group.floor or message.available_at:
                error = NotInFlight("message is not in flight", message_id=message_id)
                return AckOutcome(message_id, error.code, error.message)
            message.claim_expires = now + ttl  # recreate the expired claim nobody superseded, same token
            group.claimed.append(message)
            queue.in_flight += 1
        elif ttl == 0:
            if all(m is not message for m in released):
                released.append(message)
            return AckOutcome(message_id, "ok")
        elif mode == "extend":
            message.claim_expires = max(message.claim_expires, now + ttl)
        else:
            message.claim_expires = now + ttl
        self._claims.push((message.claim_expires, next(tiebreak), group, group.floor))
        changes.append((message.key, message.claim_expires))
        return AckOutcome(message_id, "ok")

    def release(
        self,
        queue_name: str,
        items: Sequence[tuple[str, int | None]],
        now: float,
        holder: str | None = None,
    ) -> list[AckOutcome]:
        return self.renew(queue_name, items, 0.0, now, mode="set", holder=holder)

    def unclaim_all(self, queue_name: str, now: float) -> int:
        self.handle_timer(now)
        queue = self.queue(queue_name)
        claimed = [m for g in list(queue.groups.values()) for m in g.claimed]
        for message in claimed:
            self._unclaim(queue, message)
        if claimed:
            self.effects.append(ClaimsChanged(tuple((m.key, now) for m in claimed)))
        return len(claimed)

    def _unclaim(self, queue: QueueState, message: Message) -> None:
        """End a message's claim (expiry or release); dead-letter it at max receive count."""
        group = message.group
        message.claim_expires = 0.0
        group.claimed.remove(message)
        queue.in_flight -= 1
        attrs = queue.attributes
        dlq = self.queues.get(attrs.dead_letter_queue) if attrs.dead_letter_queue else None
        if attrs.max_receive_count and message.receive_count >= attrs.max_receive_count and dlq is not None:
            self._move(queue, dlq, [message], origin=queue.name)
            queue.dead_lettered += 1
        if not group.claimed:
            self._claim_ended(queue, group)

    def _claim_ended(self, queue: QueueState, group: GroupState) -> None:
        queue.push_ready(group)
        for move in self.moves.values():
            if move.state == "running" and move.source == queue.name:
                move.pending_groups.append(group.name)

    def _delete(self, queue: QueueState, messages: list[Message]) -> None:
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
        for group in ended:
            self._claim_ended(queue, group)
        self.effects.append(MessagesDeleted(tuple(m.key for m in messages)))

    # ------------------------------------------------------------------------ attempt results, retries
    def report(
        self,
        queue_name: str,
        worker: str,
        results: Sequence[AttemptResult],
        now: float,
        holder: str | None = None,
    ) -> list[AckOutcome]:
        """Apply workers' attempt results (docs/failure-management.md §1): `succeeded` deletes (fenced
        like an ack), `failed`/`partial` count an attempt and hand the message to the retry policy,
        `not_attempted` puts it back untouched. Per group, results are taken in sequence order, and a
        success after a non-success of the same group refuses that group's whole batch (`out_of_order`).
        Every result carries its claim's token (the whole request is refused otherwise); `holder`: as for
        `ack`, results only for claims that went to that worker."""
        self.handle_timer(now)
        queue = self.queue(queue_name)
        if len(results) > MAX_RECEIVE_LIMIT:
            raise InvalidArgument(f"at most {MAX_RECEIVE_LIMIT} results per request", field="results")
        check_name(worker, "worker")  # logged with each attempt: the store must be able to write it
        seen: set[str] = set()
        for result in results:
            _check_result(result)
            if result.message_id in seen:
                raise InvalidArgument(
                    f"message {result.message_id!r} is reported twice", field="results", id=result.message_id
                )
            seen.add(result.message_id)
        outcomes: list[AckOutcome] = [AckOutcome(r.message_id, "") for r in results]
        batches: dict[GroupState, list[tuple[int, Message, AttemptResult]]] = {}
        for index, result in enumerate(results):
            message = queue.by_id.get(result.message_id)
            if message is None:
                outcomes[index] = ReportOutcome(
                    result.message_id, "gone", "no such message (already deleted?)"
                )
                continue
            group_name, attempt = message.group.name, message.receive_count
            stale = self._refusal(message, result.token, holder)
            if stale is not None:
                outcomes[index] = ReportOutcome(message.id, stale.status, stale.message, group_name, attempt)
            elif result.outcome != "succeeded" and not message.claim_expires:
                error = NotInFlight(
                    "message is not in flight: its claim ended (an expired claim already counted as a"
                    " failed attempt)",
                    message_id=message.id,
                )
                outcomes[index] = ReportOutcome(message.id, error.code, error.message, group_name, attempt)
            else:
                batches.setdefault(message.group, []).append((index, message, result))
        for group, items in batches.items():
            items.sort(key=lambda item: item[1].key)
            refusal = _order_refusal(group, items)
            if refusal is not None:
                for index, message, _ in items:
                    outcomes[index] = ReportOutcome(
                        message.id, "out_of_order", refusal, group.name, message.receive_count
                    )
                continue
            self._apply_results(queue, worker, group, items, outcomes, now)
        return outcomes

    def _apply_results(
        self,
        queue: QueueState,
        worker: str,
        group: GroupState,
        items: list[tuple[int, Message, AttemptResult]],
        outcomes: list[AckOutcome],
        now: float,
    ) -> None:
        """One group's results, in sequence order (successes first: the order rule put them first)."""
        succeeded = [(i, m, r) for i, m, r in items if r.outcome == "succeeded"]
        for index, message, result in succeeded:
            self._record(queue, message, worker, result, now)
            outcomes[index] = ReportOutcome(message.id, "ok", "", group.name, message.receive_count)
        if succeeded:
            self._delete(queue, [m for _, m, _ in succeeded])
        first_failure: Message | None = None
        ended: list[tuple[int, float]] = []
        for index, message, result in items:
            if result.outcome == "succeeded":
                continue
            attempt = message.receive_count
            if queue.by_id.get(message.id) is not message:  # dead-lettered with its group just now
                outcomes[index] = ReportOutcome(
                    message.id, "gone", "dead-lettered with its group", group.name, attempt
                )
                continue
            if not message.claim_expires:  # released as not attempted after an earlier failure here
                outcomes[index] = ReportOutcome(message.id, "ok", "", group.name, attempt)
                continue
            if result.outcome == "not_attempted":
                self._not_attempted(queue, message, now)
            else:
                self._end_claim(queue, message)
                ended.append((message.key, now))
                self._failed(queue, message, worker, result, now)
                if first_failure is None:
                    first_failure = message
            outcomes[index] = ReportOutcome(message.id, "ok", "", group.name, attempt)
        if ended:
            self.effects.append(ClaimsChanged(tuple(ended)))
        if first_failure is not None:
            # The claim ends: its messages after the failed one cannot be processed in order now.
            for message in [m for m in group.claimed if m.key > first_failure.key]:
                self._not_attempted(queue, message, now)
        if (ended or first_failure is not None or len(succeeded) < len(items)) and not group.claimed:
            self._claim_ended(queue, group)

    def _end_claim(self, queue: QueueState, message: Message) -> None:
        message.claim_expires = 0.0
        message.group.claimed.remove(message)
        queue.in_flight -= 1

    def _not_attempted(self, queue: QueueState, message: Message, now: float) -> None:
        """Back untouched at its place: no attempt counted, the receive count as before the delivery."""
        self._end_claim(queue, message)
        message.receive_count = max(0, message.receive_count - 1)
        if not message.receive_count:
            message.first_receive_at = 0.0
        self.effects.append(
            ReceiveCountsRestored(((message.key, now, message.receive_count, message.first_receive_at),))
        )

    def _expire(self, queue: QueueState, group: GroupState, expired: list[Message], now: float) -> None:
        """A claim ran out (the worker died or timed out): a failed attempt for every message it held,
        the claiming worker's. No backoff and no same-worker retry: the visibility timeout was the wait,
        and a worker that let it run out is the last one to offer the retry to.

        A worker that does not take part (`participates`: it never declared `results`, e.g. boto3) gets
        SQS semantics instead: an ordinary redelivery, visible to everyone at once, no attempt counted
        (the receive count stays up, so `max_receive_count` still dead-letters, as in SQS)."""
        worker = group.claim_worker
        if not self.participates(worker):
            for message in expired:
                self._unclaim(queue, message)
            return
        for message in expired:
            self._end_claim(queue, message)
        for message in expired:
            if queue.by_id.get(message.id) is message:  # dead_letter_group may have moved it already
                result = AttemptResult(message.id, message.token, "expired", EXPIRED_REASON)
                self._failed(queue, message, worker, result, now, expired=True)
        if not group.claimed:
            self._claim_ended(queue, group)

    def _record(
        self, queue: QueueState, message: Message, worker: str, result: AttemptResult, now: float
    ) -> None:
        """AttemptRecorded for the health monitor and the store's bounded per-group log data."""
        group = message.group.name
        attempt = message.receive_count
        self.effects.append(
            AttemptRecorded(
                queue.name,
                group,
                message.id,
                worker,
                attempt,
                result.outcome,
                result.reason,
                result.signature,
                now,
            )
        )
        attrs = queue.attributes
        if attrs.log_retention_attempts:
            self.effects.append(
                AttemptLogged(
                    queue.qid,
                    group,
                    message.id,
                    worker,
                    attempt,
                    result.outcome,
                    result.reason,
                    result.signature,
                    list(result.steps) or None,
                    result.partial,
                    result.fields,
                    result.duration_ms,
                    message.token if result.token is None else result.token,
                    now,
                    attrs.log_retention_attempts,
                    now + attrs.retention,
                )
            )

    def _failed(
        self,
        queue: QueueState,
        message: Message,
        worker: str,
        result: AttemptResult,
        now: float,
        *,
        expired: bool = False,
    ) -> None:
        """Count a failed attempt (its claim has ended) and apply the retry policy: give up per
        `on_exhausted`, dead-letter at `max_receive_count`, or wait the backoff, reserved for the worker
        that failed during its same-worker retries. The message stays at the head of its group."""
        history = message.history
        if history is None:
            history = message.history = AttemptHistory()
        history.record(result.outcome, result.reason, worker, result.steps, result.partial)
        self._record(queue, message, worker, result, now)
        policy = self._policy(queue, message.group.name)
        history.exclude = history.failures > policy.retry_same_worker
        history.reserved_for = ""
        if policy.max_attempts and history.failures >= policy.max_attempts:
            self._exhausted(queue, message, policy, now)
            return
        attrs = queue.attributes
        dlq = self.queues.get(attrs.dead_letter_queue) if attrs.dead_letter_queue else None
        if attrs.max_receive_count and message.receive_count >= attrs.max_receive_count and dlq is not None:
            self._move(queue, dlq, [message], origin=queue.name)  # saves the history with it
            queue.dead_lettered += 1
            return
        if not expired:
            delay = policy.backoff(history.failures)
            if delay > 0:
                message.available_at = now + delay
                queue.delayed += 1
                self._delays.push((message.available_at, next(tiebreak), message))
                self.effects.append(AvailabilityChanged(((message.key, message.available_at),)))
            # Same-worker retries are reserved only among participants (a plain client's report is
            # still a failed attempt for the retry budget, but nothing waits for it).
            if not history.exclude and self.participates(worker):
                history.reserved_for = worker
                history.reserve_until = (message.available_at or now) + attrs.visibility_timeout
                self._reservations.push((history.reserve_until, next(tiebreak), message))
        self._save_history(queue, message)

    def _exhausted(self, queue: QueueState, message: Message, policy: RetryPolicy, now: float) -> None:
        history = message.history
        assert history is not None
        group = message.group
        attrs = queue.attributes
        dlq = self.queues.get(attrs.dead_letter_queue) if attrs.dead_letter_queue else None
        action = policy.on_exhausted
        reason = (
            f"{history.failures} failed attempts (max_attempts {policy.max_attempts}): {history.last_reason}"
        )
        if action != "park" and (dlq is None or dlq is queue):
            action = "park"  # never drop a message: without a dead-letter queue the group holds it
            reason += "; no dead-letter queue, so parked"
        if action == "park":
            history.parked = True
            queue.parked.add(group.name)
            self._save_history(queue, message)
            self.effects.append(GroupEvent(queue.name, group.name, "park", reason, message.id, now))
            return
        assert dlq is not None
        doomed = [message] if action == "dead_letter_message" else list(group.messages)
        self._move(queue, dlq, doomed, origin=queue.name)
        queue.dead_lettered += len(doomed)
        what = "message" if action == "dead_letter_message" else f"group ({len(doomed)} messages)"
        self.effects.append(
            GroupEvent(
                queue.name, group.name, "dead_letter", f"{what} to {dlq.name}: {reason}", message.id, now
            )
        )

    def _save_history(self, queue: QueueState, message: Message) -> None:
        history = message.history
        state = None if history is None else history.to_state()
        self.effects.append(HistorySaved(((message.key, queue.qid, message.id, state),)))

    def _policy(self, queue: QueueState, group: str) -> RetryPolicy:
        policy = queue.attributes.retry_policy()
        override = queue.policies.get(group)
        return policy.with_override(override) if override else policy

    def release_group(self, queue_name: str, group_name: str, now: float) -> int:
        """Let a parked group go on (operator or rule): its messages get a fresh retry budget, nobody is
        excluded and no backoff waited for any more; the log data stays. Returns how many parked messages
        were released."""
        self.handle_timer(now)
        queue = self.queue(queue_name)
        group = queue.groups.get(group_name)
        if group is None:
            queue.parked.discard(group_name)
            raise NotFound(f"queue {queue_name!r} has no group {group_name!r}", group=group_name)
        released = 0
        waited: list[tuple[int, float]] = []
        for message in group.messages:
            history = message.history
            if history is None:
                if not message.token:
                    break  # past every message ever delivered: nothing further has history
                continue
            released += history.parked
            history.reset_budget()
            self._save_history(queue, message)
            if message.available_at:  # a retry's backoff: the operator says go now
                message.available_at = 0.0
                queue.delayed -= 1
                waited.append((message.key, 0.0))
        if waited:
            self.effects.append(AvailabilityChanged(tuple(waited)))
        queue.parked.discard(group_name)
        if released:
            self.effects.append(
                GroupEvent(queue.name, group_name, "release", "released", group.messages[0].id, now)
            )
        if not group.claimed:
            queue.push_ready(group)
        return released

    def redrive(self, queue_name: str, group_name: str, now: float) -> tuple[int, int]:
        """Put a group's dead-lettered messages (those that came from this queue) back at the head of the
        group, in order, and release it if parked. Returns (restored from the DLQ, parked released)."""
        self.handle_timer(now)
        queue = self.queue(queue_name)
        attrs = queue.attributes
        dlq = self.queues.get(attrs.dead_letter_queue) if attrs.dead_letter_queue else None
        restored = 0
        source = ""
        if dlq is not None and dlq is not queue:
            held = dlq.groups.get(group_name)
            if held is not None:
                back = [m for m in held.messages if m.origin == queue.name and not m.claim_expires]
                self._move(dlq, queue, back[::-1], origin=None)  # newest first: each goes to the head
                restored = sum(1 for m in back if queue.by_id.get(m.id) is m)
                source = dlq.name
        group = queue.groups.get(group_name)
        if group is None:
            raise NotFound(
                f"queue {queue_name!r} has no group {group_name!r}, parked or dead-lettered", group=group_name
            )
        released = self.release_group(queue_name, group_name, now)
        if restored:
            reason = f"{restored} message(s) back from {source}"
            self.effects.append(
                GroupEvent(queue.name, group_name, "redrive", reason, group.messages[0].id, now)
            )
        return restored, released

    def parked_groups(self, queue_name: str) -> list[str]:
        """Groups held by a parked message now (the set is cleaned as it is read)."""
        queue = self.queue(queue_name)
        out: list[str] = []
        for name in list(queue.parked):
            group = queue.groups.get(name)
            if group is not None and _parked_message(group) is not None:
                out.append(name)
            else:
                queue.parked.discard(name)
        return sorted(out)

    def set_group_policy(
        self, queue_name: str, group_name: str, override: dict[str, Any] | None, now: float
    ) -> RetryPolicy:
        """Replace a group's retry policy override (None or {}: remove it); returns the effective policy."""
        queue = self.queue(queue_name)
        if group_name not in queue.groups:
            validate_group(group_name)
        base = queue.attributes.retry_policy()
        if not override:
            if queue.policies.pop(group_name, None) is not None:
                self.effects.append(GroupPolicySaved(queue.qid, group_name, None))
            return base
        if not isinstance(override, dict):
            raise InvalidArgument("a retry policy override must be an object", field="policy")
        effective = base.with_override(override)
        if group_name not in queue.policies and len(queue.policies) >= MAX_GROUP_POLICIES:
            raise LimitExceeded(f"at most {MAX_GROUP_POLICIES} group policy overrides per queue")
        stored = {name: getattr(effective, name) for name in override}
        queue.policies[group_name] = stored
        self.effects.append(GroupPolicySaved(queue.qid, group_name, stored))
        return effective

    def group_policy(self, queue_name: str, group_name: str) -> tuple[RetryPolicy, dict[str, Any]]:
        """The group's effective retry policy and its override ({} when it follows the queue)."""
        queue = self.queue(queue_name)
        override = queue.policies.get(group_name) or {}
        return self._policy(queue, group_name), dict(override)

    def forget_reservations(self, worker: str, now: float) -> int:
        """The worker is gone (fenced, say): its same-worker retries go to everyone now, not after the
        reservation timeout. Returns how many groups were freed."""
        freed = 0
        for queue in self.queues.values():
            heap = queue.reserved.pop(worker, None)
            if heap is None:
                continue
            for _, _, group in heap.live_entries():
                history = group.messages[0].history
                if history is not None:
                    history.reserved_for = ""
                queue.push_ready(group)
                freed += 1
        # Retries still in their backoff are not in a reserved heap yet (they enter it when the backoff
        # ends): unreserve them too, or they would wait for this worker once it ends.
        for _, _, message in self._reservations.live_entries():
            history = message.history
            if history is not None and history.reserved_for == worker:
                history.reserved_for = ""
                freed += 1
        return freed

    # ------------------------------------------------------------------------------------------- moves
    def _move(
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
                self._push_retention(group)
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

    def start_move(self, source: str, destination: str, now: float) -> MoveStatus:
        """EmoDB `_move`: asynchronously move every message present now, group by group, in order."""
        src = self.queue(source)
        if source == destination:
            raise InvalidArgument("cannot move a queue onto itself", field="to")
        if destination not in self.queues:
            self.create_queue(destination, now)
        self._move_counter += 1
        move = MoveStatus(
            id=f"mv-{self.epoch:x}-{self._move_counter}",
            source=source,
            destination=destination,
            remaining=len(src.by_id),
            started_at=now,
            limit_key=self._last_key,
            pending_groups=list(src.groups),
        )
        if not move.pending_groups:  # nothing to move: done at once (the timer only steps pending work)
            move.state, move.finished_at = "done", now
        self.moves[move.id] = move
        return move

    def move_status(self, move_id: str) -> MoveStatus:
        move = self.moves.get(move_id)
        if move is None:
            raise NotFound(
                f"no move {move_id!r}: unknown, or started before the last restart (moves do not survive"
                " one; start it again, messages already moved stay moved)",
                reference=move_id,
            )
        return move

    def cancel_move(self, move_id: str, now: float) -> MoveStatus:
        """Stop a running move (SQS CancelMessageMoveTask): messages already moved stay moved."""
        move = self.move_status(move_id)
        if move.state != "running":
            raise NotInFlight(f"move {move_id!r} is {move.state}, not running", reference=move_id)
        move.state, move.finished_at = "cancelled", now
        move.pending_groups.clear()
        return move

    def _step_moves(self, now: float) -> None:
        for move in self.moves.values():
            if move.state != "running" or not move.pending_groups:
                continue
            src = self.queues.get(move.source)
            dst = self.queues.get(move.destination)
            if src is None or dst is None:
                move.state, move.error, move.finished_at = "failed", "queue deleted during the move", now
                continue
            budget = MOVE_CHUNK
            while move.pending_groups and budget > 0:
                name = move.pending_groups.pop()
                group = src.groups.get(name)
                if group is None:
                    continue
                if group.claimed:  # in flight: moved when its claim ends (_claim_ended re-adds it)
                    continue
                batch = _prefix(group.messages, move.limit_key + 1)
                self._move(src, dst, batch, origin=None)
                move.moved += len(batch)
                move.remaining = max(0, move.remaining - len(batch))
                budget -= max(1, len(batch))
            if not move.pending_groups:
                left = sum(1 for m in src.by_id.values() if m.key <= move.limit_key)
                move.remaining = left
                if left == 0:
                    move.state, move.finished_at = "done", now

    # ----------------------------------------------------------------------------------- inspection
    def peek(self, queue_name: str, limit: int, now: float) -> list[PeekItem]:
        """Messages in receipt order within groups, ignoring claims (EmoDB peek: a debugging view)."""
        self.handle_timer(now)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECEIVE_LIMIT:
            raise InvalidArgument(f"limit must be an integer from 1 to {MAX_RECEIVE_LIMIT}", field="limit")
        return inspection.peek(self.queue(queue_name), limit)

    def metrics(self, queue_name: str, now: float) -> QueueMetrics:
        self.handle_timer(now)
        return inspection.queue_metrics(self.queue(queue_name), now)

    def group_metrics(self, queue_name: str, group_name: str, now: float) -> dict[str, Any]:
        self.handle_timer(now)
        return inspection.group_metrics(self.queue(queue_name), group_name, self.partitions, now)

    def floor(self, queue_name: str, group_name: str) -> int:
        group = self.queue(queue_name).groups.get(group_name)
        return 0 if group is None else group.floor

    def purge(self, queue_name: str, now: float) -> int:
        self.handle_timer(now)
        queue = self.queue(queue_name)
        count = len(queue.by_id)
        self._discard_all(queue)
        queue.deleted += count
        self.effects.append(QueuePurged(queue.qid))
        return count

    @staticmethod
    def _discard_all(queue: QueueState) -> None:
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
        queue.content_index.clear()
        queue.content_of.clear()
        queue.reserved.clear()
        queue.parked.clear()
        queue.in_flight = queue.delayed = 0

    # ------------------------------------------------------------------------------------------- time
    def next_deadline(self) -> float | None:
        """When the shell must call `handle_timer` next (None: nothing scheduled)."""
        if any(m.state == "running" and m.pending_groups for m in self.moves.values()):
            return 0.0
        tops = (heap.peek() for heap in (self._claims, self._delays, self._retention, self._reservations))
        candidates = [top[0] for top in tops if top is not None]
        return min(candidates) if candidates else None

    def handle_timer(self, now: float) -> None:
        """Expire claims, end delays, drop messages past retention and advance moves, up to `now`."""
        claims = self._claims
        while (due := claims.peek()) is not None and due[0] <= now:
            claims.pop()
            _, _, group, token = due
            queue: QueueState = group.queue
            expired = [m for m in group.claimed if m.claim_expires <= now]
            if expired:
                self._expire(queue, group, expired, now)
            if group.claimed and group.floor == token:  # messages renewed to different expiries remain
                later = min(m.claim_expires for m in group.claimed)
                claims.push((later, next(tiebreak), group, token))
        delays = self._delays
        while (ends := delays.peek()) is not None and ends[0] <= now:
            delays.pop()
            message = ends[2]
            message.available_at = 0.0
            group = message.group
            group.queue.delayed -= 1
            group.queue.push_ready(group)
        reservations = self._reservations
        while (over := reservations.peek()) is not None and over[0] <= now:
            reservations.pop()
            message = over[2]
            if message.history is not None:
                message.history.reserved_for = ""
            message.group.queue.push_ready(message.group)  # now anyone's (a no-op if it moved on)
        retention = self._retention
        while (old := retention.peek()) is not None and old[0] <= now:
            retention.pop()
            group = old[2]
            queue = group.queue
            limit = now - queue.attributes.retention
            expired = _prefix(group.messages, (int(limit * 1000) + 1) << KEY_SHIFT)
            if expired:
                self._delete(queue, expired)
            if group.messages:
                self._push_retention(group)
        if self.moves:
            self._step_moves(now)

    def _retention_live(self, entry: tuple[float, int, GroupState]) -> bool:
        group = entry[2]
        queue: QueueState = group.queue
        return (
            bool(group.messages)
            and queue.groups.get(group.name) is group
            and self.queues.get(queue.name) is queue
        )

    def _push_retention(self, group: GroupState) -> None:
        if group.messages:
            deadline = group.messages[0].sent_at + group.queue.attributes.retention
            self._retention.push((deadline, next(tiebreak), group))

    # ---------------------------------------------------------------------------------------- restore
    def restore(self, snapshot: Snapshot, now: float) -> None:
        """Rebuild from the store after a restart; claims keep their expiry, tokens stay monotonic."""
        restore_into(self, snapshot, now)


def _prefix(messages: deque[Message], below_key: int) -> list[Message]:
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


def _order_refusal(group: GroupState, items: list[tuple[int, Message, AttemptResult]]) -> str | None:
    """Why a group's results (in sequence order) may not be applied, or None. A success may follow no
    non-success in the batch, nor pass an earlier message of the group that waits outside any claim."""
    blocker: tuple[Message, str] | None = None
    for _, message, result in items:
        if result.outcome != "succeeded":
            blocker = blocker or (message, result.outcome)
        elif blocker is not None:
            return (
                f"{message.id} is reported succeeded after {blocker[0].id} of its group was reported"
                f" {blocker[1]}: none of this group's results were applied"
            )
    succeeded = {m.id for _, m, r in items if r.outcome == "succeeded"}
    if not succeeded:
        return None
    last = max(m.key for _, m, r in items if r.outcome == "succeeded")
    for message in group.messages:  # the delivered prefix, at most
        if message.key >= last:
            break
        if message.id not in succeeded and not message.claim_expires:
            return (
                f"{message.id}, earlier in the group, is waiting to be processed: a success for a later"
                " message would break the group's order; none of this group's results were applied"
            )
    return None


def _parked_message(group: GroupState) -> Message | None:
    for message in group.messages:
        history = message.history
        if history is None:
            if not message.token:
                return None
            continue
        if history.parked:
            return message
    return None


def _reservation_live(entry: tuple[float, int, Message]) -> bool:
    history = entry[2].history
    return history is not None and bool(history.reserved_for) and history.reserve_until == entry[0]


def _check_result(result: AttemptResult) -> None:
    """Input the faces should have refused already; the core refuses it too (the whole request)."""
    if not isinstance(result.message_id, str) or not result.message_id:
        raise InvalidArgument("each result needs the message id", field="id")
    check_name(result.message_id, "id")  # before it is echoed in any error's details
    if result.outcome not in OUTCOMES:
        raise InvalidArgument(
            f"outcome must be one of {', '.join(OUTCOMES)}, got {str(result.outcome)[:40]!r}",
            field="outcome",
            id=result.message_id,
        )
    token = result.token
    if token is None:  # a result ends a claim: the token is the least proof of holding it
        raise InvalidArgument(
            "each result needs its claim's token (the `token` the delivery carried)",
            field="token",
            id=result.message_id,
        )
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise InvalidArgument("token must be a non-negative integer", field="token", id=result.message_id)
    for name, limit in (("reason", MAX_REASON), ("signature", MAX_SIGNATURE)):
        value = getattr(result, name)
        if not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string", field=name, id=result.message_id)
        if len(value) > limit:
            raise TooLarge(f"{name} is over {limit} characters", field=name, id=result.message_id)
    # Stored as text (the attempt log, the message's history): the store must be able to write them. A
    # reason may span lines; a signature is a key (the health monitor's, the alerts') and may not.
    check_text(result.reason, "reason", id=result.message_id)
    check_name(result.signature, "signature", id=result.message_id)
    if not isinstance(result.steps, list | tuple):
        raise InvalidArgument("steps must be a list", field="steps", id=result.message_id)
    for name in ("steps", "partial", "fields"):
        check_json(getattr(result, name), name, id=result.message_id)
