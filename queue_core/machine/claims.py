"""Claims: receive, ack, renew, release and expiry, and the holder rule that guards ending a claim.

Built on `CoreState`'s primitives; a lapse of a participant's claim is a failed attempt, handed to the
retry workflow through `failed_attempt` (retries.py), so this module does not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from .effects import ClaimRow, ClaimsChanged, FloorRaised, MessagesClaimed, TokensRaised
from .errors import InvalidArgument, NotInFlight, StaleClaim
from .handover import held
from .heap import LazyHeap
from .queue import QueueState, tiebreak
from .records import AckOutcome, AttemptHistory, Delivery, GroupState, Message, format_receipt
from .state import CoreState
from .text import check_name

MAX_RECEIVE_LIMIT = 1000
MAX_CLAIM_TTL = 12 * 3600.0
RenewMode = Literal["extend", "set"]
POLLER_WINDOW = 60.0  # a worker that received within this many seconds counts as present
MAX_EXCLUDED_SKIPS = 64  # groups one receive sets aside because they exclude its worker, at most

# (queue, message, worker, now): a claim of a participant ran out, a failed attempt (Retries.lapsed).
FailedAttempt = Callable[[QueueState, Message, str, float], None]


def check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RECEIVE_LIMIT:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_RECEIVE_LIMIT}", field="limit")


def check_ttl(ttl: float) -> None:
    if not 0 <= ttl <= MAX_CLAIM_TTL:
        raise InvalidArgument(f"ttl must be between 0 and {MAX_CLAIM_TTL:.0f} seconds", field="ttl")


# ------------------------------------------------------------------------------------- the holder rule
def stale(message: Message, token: int | None) -> AckOutcome | None:
    if token is None or (token == message.token and token == message.group.floor):
        return None
    error = StaleClaim(
        "claim superseded: the group was claimed again with a newer fencing token",
        token=token,
        floor=message.group.floor,
    )
    return AckOutcome(message.id, error.code, error.message)


def refusal(message: Message, token: int | None, holder: str | None) -> AckOutcome | None:
    """Why the caller may not end or extend `message`'s claim, or None when it may.

    Ending a claim needs proof of holding it. A token must name the newest claim (fencing); tokens
    count up, so a token alone proves nothing to a worker that can guess one. A `holder` is the
    caller's worker identity (the credential the face authenticated): the newest claim on the
    message must have gone to that worker, whether or not it is still live (a late ack of an expired
    claim nobody took since still works, as in EmoDB), and a message never delivered is nobody's.
    `holder` None: the caller is an operator, or proved the claim otherwise (an authenticated SQS
    receipt handle, the core's own release of a fenced worker)."""
    superseded = stale(message, token)
    if superseded is not None or holder is None:
        return superseded
    group = message.group
    if message.token and message.token == group.floor and group.claim_worker == holder:
        return None
    error = StaleClaim(
        "not held by the caller: the newest claim on this message went to another worker, or it"
        " was never delivered",
        holder=holder,
    )
    return AckOutcome(message.id, error.code, error.message)


class Claims:
    """Receive, ack, renew, release, unclaim-all and the expiry of claims."""

    def __init__(self, state: CoreState, failed_attempt: FailedAttempt) -> None:
        self.state = state
        self.failed_attempt = failed_attempt

    # ----------------------------------------------------------------------------------- receive
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
        """SQS FIFO delivery: oldest available group first, as many of its messages as fit, repeat."""
        state = self.state
        queue = state.queue(queue_name)
        check_limit(limit)
        check_name(worker, "worker")  # stored as the claim's worker: the store must be able to write it
        ttl = queue.attributes.visibility_timeout if ttl is None else float(ttl)
        check_ttl(ttl)
        deliveries: list[Delivery] = []
        claims: list[ClaimRow] = []
        expires = now + ttl
        collapse = queue.attributes.kind == "dedup"
        seen_digests: set[bytes] = set()
        doomed: dict[int, Message] = {}
        _saw_poller(queue, worker, now)
        queue.saw_version(worker, version)
        queue.saw_capacity(worker, max_bytes)
        mine = queue.reserved.get(worker) if queue.reserved else None
        skipped: list[GroupState] = []
        zero: list[GroupState] = []  # claimed with ttl 0 (SQS VisibilityTimeout=0): visible again at once
        per_group = queue.attributes.group_in_flight or limit
        while len(deliveries) < limit:
            group = _next_group(queue, worker, version, mine, skipped, now)
            if group is None:
                break
            token = state.new_token()
            group.floor = token
            group.claim_worker = worker
            superseded: list[int] = []
            claiming = True
            for message in group.messages:
                if claiming and (
                    len(deliveries) >= limit
                    or len(group.claimed) >= per_group
                    or (max_bytes and message.size > max_bytes and group.claimed)  # bigger: someone else
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
                deliveries.append(delivery_of(message))
                claims.append(
                    ClaimRow(message.key, token, expires, message.receive_count, message.first_receive_at)
                )
            queue.in_flight += len(group.claimed)
            queue.claim_started(group)
            if worker in queue.state_workers:
                queue.held_state(group.name, worker)
            if ttl:
                state.claims.push((expires, next(tiebreak), group, token))
            else:
                zero.append(group)
            state.effects.append(FloorRaised(queue.name, group.name, token))
            if superseded:
                state.effects.append(TokensRaised(tuple(superseded), token))
        for group in skipped:  # excluded for this worker only: back for everyone else
            queue.push_ready(group)
        if mine is not None and mine.peek() is None:
            del queue.reserved[worker]
        if claims:
            queue.received += len(claims)
            state.effects.append(MessagesClaimed(tuple(claims), worker))
        if collapse:
            # EmoDB DedupQueueService: identical messages waiting at poll time collapse into the one polled.
            for digest in seen_digests:
                for message in queue.content_index.get(digest, ()):
                    if not message.claim_expires:
                        doomed[message.key] = message
            if doomed:
                state.delete(queue, list(doomed.values()))
        for group in zero:
            # Released right away, not expired: a claim given no time is no attempt that failed (the
            # receive count still rises, so max_receive_count applies as in SQS).
            for message in list(group.claimed):
                state.unclaim(queue, message)
        return deliveries

    # --------------------------------------------------------------------------- ack, renew, release
    def ack(
        self, queue_name: str, items: Sequence[tuple[str, int | None]], holder: str | None
    ) -> list[AckOutcome]:
        """Delete messages. With a token, only the newest claim's holder may delete (fencing); with a
        `holder` (a worker's identity), only messages whose newest claim went to that worker (see
        `refusal`). Neither: an operator's delete by id (EmoDB's ack), whatever the claims."""
        queue = self.state.queue(queue_name)
        outcomes: list[AckOutcome] = []
        doomed: list[Message] = []
        doomed_ids: set[str] = set()
        for message_id, token in items:
            message = queue.by_id.get(message_id)
            if message is None or message_id in doomed_ids:
                outcomes.append(AckOutcome(message_id, "gone", "no such message (already deleted?)"))
                continue
            refused = refusal(message, token, holder)
            if refused is not None:
                outcomes.append(refused)
                continue
            doomed.append(message)
            doomed_ids.add(message_id)
            outcomes.append(AckOutcome(message_id, "ok"))
        if doomed:
            self.state.delete(queue, doomed)
        return outcomes

    def renew(
        self,
        queue_name: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        now: float,
        mode: RenewMode,
        holder: str | None,
    ) -> list[AckOutcome]:
        """EmoDB renew (`extend`: never shortens, recreates an expired claim nobody superseded) or SQS
        ChangeMessageVisibility (`set`: from now, may shorten, only while in flight). ttl 0 releases.
        `holder`: as for `ack`, only the worker the newest claim went to may renew or release it."""
        queue = self.state.queue(queue_name)
        ttl = float(ttl)
        check_ttl(ttl)
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
            self.state.unclaim(queue, message)
        if changes:
            self.state.effects.append(ClaimsChanged(tuple(changes)))
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
        refused = refusal(message, token, holder)
        if refused is not None:
            return refused
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
            queue.claim_started(group)
        elif ttl == 0:
            if all(m is not message for m in released):
                released.append(message)
            return AckOutcome(message_id, "ok")
        elif mode == "extend":
            message.claim_expires = max(message.claim_expires, now + ttl)
        else:
            message.claim_expires = now + ttl
        self.state.claims.push((message.claim_expires, next(tiebreak), group, group.floor))
        changes.append((message.key, message.claim_expires))
        return AckOutcome(message_id, "ok")

    def unclaim_all(self, queue_name: str, now: float) -> int:
        queue = self.state.queue(queue_name)
        claimed = [m for g in list(queue.groups.values()) for m in g.claimed]
        for message in claimed:
            self.state.unclaim(queue, message)
        if claimed:
            self.state.effects.append(ClaimsChanged(tuple((m.key, now) for m in claimed)))
        return len(claimed)

    # ------------------------------------------------------------------------------------ expiry
    def expire_due(self, now: float) -> None:
        """Expire every claim whose time is up by `now`, oldest first."""
        claims = self.state.claims
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

    def _expire(self, queue: QueueState, group: GroupState, expired: list[Message], now: float) -> None:
        """A claim ran out (the worker died or timed out): a failed attempt for every message it held,
        the claiming worker's. No backoff and no same-worker retry: the visibility timeout was the wait,
        and a worker that let it run out is the last one to offer the retry to.

        A worker that does not take part (`participates`: it never declared `results`, e.g. boto3) gets
        SQS semantics instead: an ordinary redelivery, visible to everyone at once, no attempt counted
        (the receive count stays up, so `max_receive_count` still dead-letters, as in SQS)."""
        state = self.state
        worker = group.claim_worker
        if not state.participates(worker):
            for message in expired:
                state.unclaim(queue, message)
            return
        for message in expired:
            state.end_claim(queue, message)
        for message in expired:
            if queue.by_id.get(message.id) is message:  # dead_letter_group may have moved it already
                self.failed_attempt(queue, message, worker, now)
        if not group.claimed:
            state.claim_ended(queue, group)


# ------------------------------------------------------------------------------------------- helpers
def delivery_of(message: Message) -> Delivery:
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


def _next_group(
    queue: QueueState,
    worker: str,
    version: str,
    mine: LazyHeap[tuple[int, int, GroupState]] | None,
    skipped: list[GroupState],
    now: float,
) -> GroupState | None:
    """The oldest available group this worker may take: its own reserved retries compete with the
    shared heap by head key; a group whose failing head excludes the worker is set aside while other
    workers are polling. Without retries in play this is one heap pop, as before. A queue with a
    scheduler (tenants, pools, sidelining) asks it instead; its own reserved retries come first there."""
    if queue.router is not None:
        router = queue.router
        return _next_from(queue, lambda: router.pop(worker, version), worker, mine, skipped, now)
    scheduler = queue.scheduler
    if scheduler is not None:
        return _next_from(queue, lambda: scheduler.pop(worker, now), worker, mine, skipped, now)
    ready = queue.ready
    while True:
        if mine is not None:
            top = ready.peek()
            own = mine.peek()
            if own is not None and (top is None or own[0] < top[0]):
                mine.pop()
                group = own[2]
                if held(queue, group):  # moving to another worker: pushed again when its state is here
                    continue
                history = group.messages[0].history
                if history is not None:
                    history.reserved_for = ""  # the retry is taken
                return group
        top = ready.pop()
        if top is None:
            return None
        group = top[2]
        if held(queue, group):
            continue
        if _excludes(queue, group, worker, now):
            skipped.append(group)
            if len(skipped) >= MAX_EXCLUDED_SKIPS:
                return None
            continue
        return group


def _next_from(
    queue: QueueState,
    pop: Callable[[], GroupState | None],
    worker: str,
    mine: LazyHeap[tuple[int, int, GroupState]] | None,
    skipped: list[GroupState],
    now: float,
) -> GroupState | None:
    while mine is not None:
        own = mine.pop()
        if own is None:
            break
        if not held(queue, own[2]):
            history = own[2].messages[0].history
            if history is not None:
                history.reserved_for = ""  # the retry is taken
            return own[2]
    while True:
        group = pop()
        if group is not None and held(queue, group):
            continue
        if group is None or not _excludes(queue, group, worker, now):
            return group
        skipped.append(group)
        if len(skipped) >= MAX_EXCLUDED_SKIPS:
            return None


def _excludes(queue: QueueState, group: GroupState, worker: str, now: float) -> bool:
    """The group's failing head excludes `worker` (same-worker retries used up) while others poll; or
    its head is bigger than the worker declared it takes while a worker that can take it polls (the
    patent's selection by message size: the group goes there for the big message, then on as usual)."""
    head = group.messages[0]
    capacity = queue.worker_capacity.get(worker) if queue.worker_capacity else None
    if capacity is not None and head.size > capacity and _bigger_polling(queue, head.size, now):
        return True
    history = head.history
    return (
        history is not None
        and history.exclude
        and worker in history.failed_workers
        and _others_polling(queue, group, history, now)
    )


def _bigger_polling(queue: QueueState, size: int, now: float) -> bool:
    """Whether a worker that takes messages of `size` bytes polled in the last POLLER_WINDOW."""
    horizon = now - POLLER_WINDOW
    capacity = queue.worker_capacity
    return any(at >= horizon and capacity.get(w, size) >= size for w, at in queue.pollers.items())


def _saw_poller(queue: QueueState, worker: str, now: float) -> None:
    pollers = queue.pollers
    pollers[worker] = now
    if len(pollers) > 1024 and len(pollers) > 2 * queue.pollers_pruned_at:
        horizon = now - POLLER_WINDOW
        for name in [w for w, at in pollers.items() if at < horizon]:
            del pollers[name]
        queue.pollers_pruned_at = len(pollers)


def _others_polling(queue: QueueState, group: GroupState, history: AttemptHistory, now: float) -> bool:
    """Whether a worker that has not failed the group's head polls now and may take the group (its
    route's workers only, with routing): else retrying elsewhere would hold the group forever."""
    horizon = now - POLLER_WINDOW
    failed = history.failed_workers
    router = queue.router
    return any(
        at >= horizon and w not in failed and (router is None or router.may_take(w, group))
        for w, at in queue.pollers.items()
    )
