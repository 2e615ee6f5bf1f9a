"""The retry workflow (docs/failure-management.md §1-2): attempt results, backoff, same-worker
reservations, park, dead-letter, redrive and the release of parked groups.

Built on `CoreState`'s primitives and the holder rule of claims.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .attributes import RetryPolicy
from .claims import MAX_RECEIVE_LIMIT, refusal
from .effects import (
    AttemptLogged,
    AttemptRecorded,
    AvailabilityChanged,
    ClaimsChanged,
    GroupEvent,
    GroupPolicySaved,
    ReceiveCountsRestored,
)
from .errors import InvalidArgument, LimitExceeded, NotFound, NotInFlight, TooLarge
from .groups import validate_group
from .inputs import OUTCOMES, AttemptResult
from .queue import QueueState, tiebreak
from .records import AckOutcome, AttemptHistory, GroupState, Message, ReportOutcome
from .state import CoreState
from .text import check_json, check_name, check_text

MAX_REASON = 2048  # characters of a result's reason (the API faces also bound the bytes)
MAX_SIGNATURE = 512
MAX_GROUP_POLICIES = 10_000  # per-group retry policy overrides per queue
EXPIRED_REASON = "claim expired"


class Retries:
    """Attempt results and what follows a failed attempt, per the queue's (or group's) retry policy."""

    def __init__(self, state: CoreState) -> None:
        self.state = state

    # ------------------------------------------------------------------------------------ results
    def report(
        self,
        queue_name: str,
        worker: str,
        results: Sequence[AttemptResult],
        now: float,
        holder: str | None,
    ) -> list[AckOutcome]:
        """Apply workers' attempt results (docs/failure-management.md §1): `succeeded` deletes (fenced
        like an ack), `failed`/`partial` count an attempt and hand the message to the retry policy,
        `not_attempted` puts it back untouched. Per group, results are taken in sequence order, and a
        success after a non-success of the same group refuses that group's whole batch (`out_of_order`).
        Every result carries its claim's token (the whole request is refused otherwise); `holder`: as for
        `ack`, results only for claims that went to that worker."""
        queue = self.state.queue(queue_name)
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
            refused = refusal(message, result.token, holder)
            if refused is not None:
                outcomes[index] = ReportOutcome(
                    message.id, refused.status, refused.message, group_name, attempt
                )
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
            order = _order_refusal(group, items)
            if order is not None:
                for index, message, _ in items:
                    outcomes[index] = ReportOutcome(
                        message.id, "out_of_order", order, group.name, message.receive_count
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
        state = self.state
        if queue.router is not None:  # a rollout's gate compares the versions' failure rates
            queue.router.count(worker, [result.outcome for _, _, result in items])
        succeeded = [(i, m, r) for i, m, r in items if r.outcome == "succeeded"]
        for index, message, result in succeeded:
            self._record(queue, message, worker, result, now)
            outcomes[index] = ReportOutcome(message.id, "ok", "", group.name, message.receive_count)
        if succeeded:
            state.delete(queue, [m for _, m, _ in succeeded])
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
                state.end_claim(queue, message)
                ended.append((message.key, now))
                self._failed(queue, message, worker, result, now)
                if first_failure is None:
                    first_failure = message
            outcomes[index] = ReportOutcome(message.id, "ok", "", group.name, attempt)
        if ended:
            state.effects.append(ClaimsChanged(tuple(ended)))
        if first_failure is not None:
            # The claim ends: its messages after the failed one cannot be processed in order now.
            for message in [m for m in group.claimed if m.key > first_failure.key]:
                self._not_attempted(queue, message, now)
        if (ended or first_failure is not None or len(succeeded) < len(items)) and not group.claimed:
            state.claim_ended(queue, group)

    def _not_attempted(self, queue: QueueState, message: Message, now: float) -> None:
        """Back untouched at its place: no attempt counted, the receive count as before the delivery."""
        self.state.end_claim(queue, message)
        message.receive_count = max(0, message.receive_count - 1)
        if not message.receive_count:
            message.first_receive_at = 0.0
        self.state.effects.append(
            ReceiveCountsRestored(((message.key, now, message.receive_count, message.first_receive_at),))
        )

    def lapsed(self, queue: QueueState, message: Message, worker: str, now: float) -> None:
        """A participant's claim on `message` ran out (claims.py ended it): a failed attempt, no backoff."""
        result = AttemptResult(message.id, message.token, "expired", EXPIRED_REASON)
        self._failed(queue, message, worker, result, now, expired=True)

    def _record(
        self, queue: QueueState, message: Message, worker: str, result: AttemptResult, now: float
    ) -> None:
        """AttemptRecorded for the health monitor and the store's bounded per-group log data."""
        group = message.group.name
        attempt = message.receive_count
        effects = self.state.effects
        effects.append(
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
            effects.append(
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
        state = self.state
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
        dlq = state.dead_letter_queue(queue)
        if attrs.max_receive_count and message.receive_count >= attrs.max_receive_count and dlq is not None:
            state.transfer(queue, dlq, [message], origin=queue.name)  # saves the history with it
            queue.dead_lettered += 1
            return
        if not expired:
            delay = policy.backoff(history.failures)
            if delay > 0:
                message.available_at = now + delay
                queue.delayed += 1
                state.delays.push((message.available_at, next(tiebreak), message))
                state.effects.append(AvailabilityChanged(((message.key, message.available_at),)))
            # Same-worker retries are reserved only among participants (a plain client's report is
            # still a failed attempt for the retry budget, but nothing waits for it).
            if not history.exclude and state.participates(worker):
                history.reserved_for = worker
                history.reserve_until = (message.available_at or now) + attrs.visibility_timeout
                state.reservations.push((history.reserve_until, next(tiebreak), message))
        state.save_history(queue, message)

    def _exhausted(self, queue: QueueState, message: Message, policy: RetryPolicy, now: float) -> None:
        state = self.state
        history = message.history
        assert history is not None
        group = message.group
        dlq = state.dead_letter_queue(queue)
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
            state.save_history(queue, message)
            state.effects.append(GroupEvent(queue.name, group.name, "park", reason, message.id, now))
            return
        assert dlq is not None
        doomed = [message] if action == "dead_letter_message" else list(group.messages)
        state.transfer(queue, dlq, doomed, origin=queue.name)
        queue.dead_lettered += len(doomed)
        what = "message" if action == "dead_letter_message" else f"group ({len(doomed)} messages)"
        state.effects.append(
            GroupEvent(
                queue.name, group.name, "dead_letter", f"{what} to {dlq.name}: {reason}", message.id, now
            )
        )

    @staticmethod
    def _policy(queue: QueueState, group: str) -> RetryPolicy:
        policy = queue.attributes.retry_policy()
        override = queue.policies.get(group)
        return policy.with_override(override) if override else policy

    # ------------------------------------------------------------------------- parked, dead-lettered
    def release_group(self, queue_name: str, group_name: str, now: float) -> int:
        """Let a parked group go on (operator or rule): its messages get a fresh retry budget, nobody is
        excluded and no backoff waited for any more; the log data stays. Returns how many parked messages
        were released."""
        state = self.state
        queue = state.queue(queue_name)
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
            state.save_history(queue, message)
            if message.available_at:  # a retry's backoff: the operator says go now
                message.available_at = 0.0
                queue.delayed -= 1
                waited.append((message.key, 0.0))
        if waited:
            state.effects.append(AvailabilityChanged(tuple(waited)))
        queue.parked.discard(group_name)
        if released:
            state.effects.append(
                GroupEvent(queue.name, group_name, "release", "released", group.messages[0].id, now)
            )
        if not group.claimed:
            queue.push_ready(group)
        return released

    def redrive(self, queue_name: str, group_name: str, now: float) -> tuple[int, int]:
        """Put a group's dead-lettered messages (those that came from this queue) back at the head of the
        group, in order, and release it if parked. Returns (restored from the DLQ, parked released)."""
        state = self.state
        queue = state.queue(queue_name)
        dlq = state.dead_letter_queue(queue)
        restored = 0
        source = ""
        if dlq is not None and dlq is not queue:
            held = dlq.groups.get(group_name)
            if held is not None:
                back = [m for m in held.messages if m.origin == queue.name and not m.claim_expires]
                state.transfer(dlq, queue, back[::-1], origin=None)  # newest first: each goes to the head
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
            state.effects.append(
                GroupEvent(queue.name, group_name, "redrive", reason, group.messages[0].id, now)
            )
        return restored, released

    def parked_groups(self, queue_name: str) -> list[str]:
        """Groups held by a parked message now (the set is cleaned as it is read)."""
        queue = self.state.queue(queue_name)
        out: list[str] = []
        for name in list(queue.parked):
            group = queue.groups.get(name)
            if group is not None and _parked_message(group) is not None:
                out.append(name)
            else:
                queue.parked.discard(name)
        return sorted(out)

    # ---------------------------------------------------------------------------------- policies
    def set_group_policy(
        self, queue_name: str, group_name: str, override: dict[str, Any] | None
    ) -> RetryPolicy:
        """Replace a group's retry policy override (None or {}: remove it); returns the effective policy."""
        state = self.state
        queue = state.queue(queue_name)
        if group_name not in queue.groups:
            validate_group(group_name)
        base = queue.attributes.retry_policy()
        if not override:
            if queue.policies.pop(group_name, None) is not None:
                state.effects.append(GroupPolicySaved(queue.qid, group_name, None))
            return base
        if not isinstance(override, dict):
            raise InvalidArgument("a retry policy override must be an object", field="policy")
        effective = base.with_override(override)
        if group_name not in queue.policies and len(queue.policies) >= MAX_GROUP_POLICIES:
            raise LimitExceeded(f"at most {MAX_GROUP_POLICIES} group policy overrides per queue")
        stored = {name: getattr(effective, name) for name in override}
        queue.policies[group_name] = stored
        state.effects.append(GroupPolicySaved(queue.qid, group_name, stored))
        return effective

    def group_policy(self, queue_name: str, group_name: str) -> tuple[RetryPolicy, dict[str, Any]]:
        """The group's effective retry policy and its override ({} when it follows the queue)."""
        queue = self.state.queue(queue_name)
        override = queue.policies.get(group_name) or {}
        return self._policy(queue, group_name), dict(override)

    # ------------------------------------------------------------------------------ reservations
    def forget_reservations(self, worker: str) -> int:
        """The worker is gone (fenced, say): its same-worker retries go to everyone now, not after the
        reservation timeout. Returns how many groups were freed."""
        state = self.state
        freed = 0
        for queue in state.queues.values():
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
        for _, _, message in state.reservations.live_entries():
            history = message.history
            if history is not None and history.reserved_for == worker:
                history.reserved_for = ""
                freed += 1
        return freed

    def end_reservations(self, now: float) -> None:
        """Same-worker retries whose reservation ran out are anyone's now."""
        reservations = self.state.reservations
        while (over := reservations.peek()) is not None and over[0] <= now:
            reservations.pop()
            message = over[2]
            if message.history is not None:
                message.history.reserved_for = ""
            message.group.queue.push_ready(message.group)  # now anyone's (a no-op if it moved on)


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
