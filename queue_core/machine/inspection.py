"""Read-only views of a queue: peek, queue metrics and group metrics (the backlog article's gauges)."""

from __future__ import annotations

from typing import Any

from .groups import partition_of
from .queue import QueueState
from .records import KEY_SHIFT, Message, PeekItem, QueueMetrics


def peek(queue: QueueState, limit: int) -> list[PeekItem]:
    """Up to `limit` messages, whole groups first, in receipt order; O(limit), not O(backlog)."""
    items: list[Message] = []
    for group in queue.groups.values():
        for message in group.messages:
            items.append(message)
            if len(items) >= limit:
                break
        if len(items) >= limit:
            break
    items.sort(key=lambda m: m.key)
    return [
        PeekItem(m.key, m.id, m.group.name, m.seq, m.sent_at, m.receive_count, bool(m.claim_expires))
        for m in items
    ]


def queue_metrics(queue: QueueState, now: float) -> QueueMetrics:
    oldest = queue.oldest_sent_key()
    total = len(queue.by_id)
    return QueueMetrics(
        name=queue.name,
        visible=total - queue.in_flight - queue.delayed,
        in_flight=queue.in_flight,
        delayed=queue.delayed,
        total=total,
        groups=len(queue.groups),
        oldest_age=0.0 if oldest is None else max(0.0, now - (oldest >> KEY_SHIFT) / 1000.0),
        age_of_first_attempt=queue.age_of_first_attempt,
        sent=queue.sent,
        received=queue.received,
        deleted=queue.deleted,
        dead_lettered=queue.dead_lettered,
        expired=queue.expired,
        sidelined=queue.sidelined,
    )


def group_metrics(queue: QueueState, group_name: str, partitions: int, now: float) -> dict[str, Any]:
    group = queue.groups.get(group_name)
    if group is None:
        return {
            "group": group_name,
            "visible": 0,
            "in_flight": 0,
            "delayed": 0,
            "oldest_age": 0.0,
            "floor": 0,
            "partition": partition_of(group_name, partitions),
            "worker": "",
        }
    delayed = sum(1 for m in group.messages if m.available_at)
    return {
        "group": group_name,
        "visible": len(group.messages) - len(group.claimed) - delayed,
        "in_flight": len(group.claimed),
        "delayed": delayed,
        "oldest_age": max(0.0, now - group.messages[0].sent_at) if group.messages else 0.0,
        "floor": group.floor,
        "partition": group.partition,
        "worker": group.claim_worker if group.claimed else "",
    }
