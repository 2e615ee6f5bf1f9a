"""Scrape-time gauges of every queue (what /metrics exposes): read from the state as it is, never kept up to
date on the hot path, so sends and receives pay nothing for them and a scrape costs O(groups).

Pure like the rest of the machine: the shell passes `now`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .queue import QueueState

TOP_GROUPS = 5  # groups per queue reported by backlog: enough to find a hot group, few enough series
# How far into one group the search for its first never-attempted message goes. Attempted messages form a
# short prefix of a group (a claim takes from its head), so this bounds a pathological group only.
ATTEMPTED_PREFIX_SCAN = 64


@dataclass(frozen=True, slots=True)
class GroupBacklog:
    name: str
    messages: int
    oldest_age: float


@dataclass(frozen=True, slots=True)
class QueueGauges:
    name: str
    visible: int
    in_flight: int
    delayed: int
    groups: int
    oldest_age: float  # seconds since the oldest message was sent (0 when empty)
    # AgeOfFirstAttempt: seconds the oldest deliverable message nobody has attempted yet has waited
    oldest_unattempted_age: float
    first_attempt_wait: float  # how long the latest message to get its first attempt had waited for it
    sent: int
    received: int
    deleted: int
    dead_lettered: int
    empty_receives: int
    expired: int  # past TTL or retention
    sidelined: int  # groups moved to the spillover lane (scheduling.py)
    top_groups: tuple[GroupBacklog, ...]


def queue_gauges(queue: QueueState, now: float, top: int = TOP_GROUPS) -> QueueGauges:
    """One pass over the queue's groups."""
    oldest: float | None = None
    unattempted: float | None = None
    for group in queue.groups.values():
        messages = group.messages
        if not messages:
            continue
        head_sent = messages[0].sent_at
        if oldest is None or head_sent < oldest:
            oldest = head_sent
        for index, message in enumerate(messages):
            if index >= ATTEMPTED_PREFIX_SCAN:
                break
            if not message.first_receive_at:
                if not message.available_at and (unattempted is None or message.sent_at < unattempted):
                    unattempted = message.sent_at
                break
    backlogged = (g for g in queue.groups.values() if g.messages)
    busiest = heapq.nlargest(top, backlogged, key=lambda g: len(g.messages))
    total = len(queue.by_id)
    return QueueGauges(
        name=queue.name,
        visible=total - queue.in_flight - queue.delayed,
        in_flight=queue.in_flight,
        delayed=queue.delayed,
        groups=len(queue.groups),
        oldest_age=_age(oldest, now),
        oldest_unattempted_age=_age(unattempted, now),
        first_attempt_wait=queue.age_of_first_attempt,
        sent=queue.sent,
        received=queue.received,
        deleted=queue.deleted,
        dead_lettered=queue.dead_lettered,
        empty_receives=queue.empty_receives,
        expired=queue.expired,
        sidelined=queue.sidelined,
        top_groups=tuple(
            GroupBacklog(g.name, len(g.messages), _age(g.messages[0].sent_at, now)) for g in busiest
        ),
    )


def _age(sent_at: float | None, now: float) -> float:
    return 0.0 if sent_at is None else max(0.0, now - sent_at)
