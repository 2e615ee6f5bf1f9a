"""Sends: a batch of messages into a queue, each accepted or refused on its own, with dedup.

Built on `CoreState`'s primitives (keys, retention, the delay heap).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from .effects import DedupSaved, MessageInserted
from .errors import InvalidArgument, QueueError, TooLarge
from .groups import auto_group, partition_of, validate_group, validate_message_id
from .inputs import SendRequest
from .queue import QueueState, tiebreak
from .records import Message, SendResult, message_id_for
from .state import CoreState
from .text import check_name


class Sends:
    def __init__(self, state: CoreState) -> None:
        self.state = state

    def send(
        self, queue_name: str, requests: Sequence[SendRequest], now: float, *, create: bool = False
    ) -> list[SendResult | QueueError]:
        """Accept a batch; each entry succeeds or fails on its own (bad entries never sink good ones)."""
        state = self.state
        if create and queue_name not in state.queues:
            state.create_queue(queue_name, now)
        queue = state.queue(queue_name)
        queue.expire_dedup(now)
        results: list[SendResult | QueueError] = []
        for request in requests:
            try:
                results.append(self._send_one(queue, request, now))
            except QueueError as exc:
                results.append(exc)
        return results

    def _send_one(self, queue: QueueState, request: SendRequest, now: float) -> SendResult:
        state = self.state
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
                return _result(existing, duplicate=True)
        dedup_key = _dedup_key(queue, group_name, request)
        if dedup_key is not None:
            seen = queue.dedup.get(dedup_key)
            if seen is not None and seen[3] > now:
                return SendResult(seen[0], seen[2], seen[1], partition_of(seen[2], state.partitions), True)

        key = state.new_key(now)
        message_id = request.message_id or message_id_for(key)
        if group_name is None:
            state.round_robin = (state.round_robin + 1) % state.partitions
            group_name = auto_group(state.round_robin, message_id)
        group, created = queue.group(group_name, state.partitions)
        available_at = now + delay if delay > 0 else 0.0
        message = Message(key, message_id, group, available_at, len(body))
        queue.insert(message)
        queue.sent += 1
        scheduler = queue.scheduler
        if scheduler is not None and scheduler.sent(group, now) and not available_at:
            queue.push_ready(group)  # sidelined now: its ready entry belongs in the spillover lane
        if created:
            state.push_retention(group)
        if available_at:
            state.delays.push((available_at, next(tiebreak), message))
        elif len(group.messages) == 1:
            queue.push_ready(group)
        digest = None
        if attrs.kind == "dedup":
            digest = hashlib.blake2b(body, digest_size=16).digest()
            queue.index_content(message, digest)
        state.effects.append(
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
                request.request_id,
            )
        )
        if dedup_key is not None and attrs.dedup_window > 0:
            expires = now + attrs.dedup_window
            queue.dedup[dedup_key] = (message_id, key, group_name, expires)
            queue.dedup_order.append((expires, dedup_key))
            state.effects.append(DedupSaved(queue.qid, dedup_key, message_id, key, group_name, expires))
        return _result(message)


def _dedup_key(queue: QueueState, group: str | None, request: SendRequest) -> str | None:
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


def _result(message: Message, duplicate: bool = False) -> SendResult:
    group = message.group
    return SendResult(message.id, group.name, message.seq, group.partition, duplicate)
