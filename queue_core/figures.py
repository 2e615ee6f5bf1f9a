"""What the operator's dashboard and `/metrics` read of the queues, as one typed answer of the backend port
(`QueueBackend.figures`), so they never reach into a concrete core: the same call in process
(`QueueService`), in front of a queue server (`RemoteQueueService`, `GET /v1/figures` of the internal API)
and in front of a cluster (`ClusterBackend`: every partition's figures, merged, and kept per partition with
the owner node that answered).

Every queue's gauges (machine.gauges: depth, in flight, delayed, ages, counters, its largest groups), its
parked groups, whether failure management suspends it, and the workers failure management holds back. A
dead-letter queue is a queue: its depth is its own row.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .machine.gauges import TOP_GROUPS, GroupBacklog, QueueGauges

MAX_PARKED = 50  # parked group names carried per queue (the count is always exact)
HELD_STATES = ("fenced", "probing", "blacklisted")  # failure-management states that hold a worker back


@dataclass(frozen=True, slots=True)
class QueueFigures:
    gauges: QueueGauges
    parked: tuple[str, ...] = ()  # the first MAX_PARKED parked groups, sorted
    parked_count: int = 0
    suspended: bool = False  # by failure management or an operator, where failure management runs

    @property
    def name(self) -> str:
        return self.gauges.name


@dataclass(frozen=True, slots=True)
class HeldWorker:
    worker: str
    state: str  # one of HELD_STATES


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """One cluster partition's own figures, as its owner answered them."""

    partition: int
    node: str  # the owner that answered ("" when not known)
    queues: tuple[QueueFigures, ...]


@dataclass(frozen=True, slots=True)
class Figures:
    at: float  # the core's clock (wall time) when read: the dashboard's charts are stamped with it
    queues: tuple[QueueFigures, ...]  # over every partition that answered, sorted by name
    held: tuple[HeldWorker, ...] = ()
    ready: bool = True  # False: the store is not open (yet, or any more): nothing true to say
    partitions: tuple[PartitionFigures, ...] = ()  # a cluster's, by partition; () in one process
    missing: tuple[int, ...] = ()  # cluster partitions that did not answer (figures without them)


# ----------------------------------------------------------------------------------------------- merging
def merge_gauges(parts: Sequence[QueueGauges], top: int = TOP_GROUPS) -> QueueGauges:
    """One queue's gauges over its partitions: counts summed, ages the oldest, its largest groups of all
    (a group lives in one partition)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    groups = [g for p in parts for g in p.top_groups]
    return QueueGauges(
        name=first.name,
        visible=sum(p.visible for p in parts),
        in_flight=sum(p.in_flight for p in parts),
        delayed=sum(p.delayed for p in parts),
        groups=sum(p.groups for p in parts),
        oldest_age=max(p.oldest_age for p in parts),
        oldest_unattempted_age=max(p.oldest_unattempted_age for p in parts),
        first_attempt_wait=max(p.first_attempt_wait for p in parts),
        sent=sum(p.sent for p in parts),
        received=sum(p.received for p in parts),
        deleted=sum(p.deleted for p in parts),
        dead_lettered=sum(p.dead_lettered for p in parts),
        empty_receives=sum(p.empty_receives for p in parts),
        expired=sum(p.expired for p in parts),
        sidelined=sum(p.sidelined for p in parts),
        top_groups=tuple(heapq.nlargest(top, groups, key=lambda g: (g.messages, g.oldest_age))),
    )


def merge_queues(parts: Iterable[Iterable[QueueFigures]], top: int = TOP_GROUPS) -> tuple[QueueFigures, ...]:
    """Every queue's figures over the partitions (a queue missing in one partition is merged from the
    others)."""
    by_name: dict[str, list[QueueFigures]] = {}
    for figures in parts:
        for queue in figures:
            by_name.setdefault(queue.name, []).append(queue)
    merged = []
    for name in sorted(by_name):
        found = by_name[name]
        parked = sorted({g for q in found for g in q.parked})
        merged.append(
            QueueFigures(
                merge_gauges([q.gauges for q in found], top),
                tuple(parked[:MAX_PARKED]),
                sum(q.parked_count for q in found),
                any(q.suspended for q in found),
            )
        )
    return tuple(merged)


def merge_held(parts: Iterable[Iterable[HeldWorker]]) -> tuple[HeldWorker, ...]:
    """Held workers of several partitions: one row each (the first state seen, by worker)."""
    seen: dict[str, HeldWorker] = {}
    for held in parts:
        for worker in held:
            seen.setdefault(worker.worker, worker)
    return tuple(seen[w] for w in sorted(seen))


# ---------------------------------------------------------------------------------------------- the wire
def encode(figures: Figures) -> dict[str, Any]:
    """`GET /v1/figures`'s JSON (partitions and missing are the cluster gateway's, never on the wire)."""
    return {
        "at": figures.at,
        "ready": figures.ready,
        "queues": [_encode_queue(q) for q in figures.queues],
        "held": [{"worker": h.worker, "state": h.state} for h in figures.held],
    }


def _encode_queue(queue: QueueFigures) -> dict[str, Any]:
    g = queue.gauges
    return {
        "name": g.name,
        "visible": g.visible,
        "in_flight": g.in_flight,
        "delayed": g.delayed,
        "groups": g.groups,
        "oldest_age": g.oldest_age,
        "oldest_unattempted_age": g.oldest_unattempted_age,
        "first_attempt_wait": g.first_attempt_wait,
        "sent": g.sent,
        "received": g.received,
        "deleted": g.deleted,
        "dead_lettered": g.dead_lettered,
        "empty_receives": g.empty_receives,
        "expired": g.expired,
        "sidelined": g.sidelined,
        "top_groups": [[t.name, t.messages, t.oldest_age] for t in g.top_groups],
        "parked": list(queue.parked),
        "parked_count": queue.parked_count,
        "suspended": queue.suspended,
    }


def decode(data: Mapping[str, Any]) -> Figures:
    """The inverse of `encode`; ValueError (or KeyError, TypeError) for a body that is not one."""
    queues = []
    for q in data["queues"]:
        gauges = QueueGauges(
            name=str(q["name"]),
            visible=int(q["visible"]),
            in_flight=int(q["in_flight"]),
            delayed=int(q["delayed"]),
            groups=int(q["groups"]),
            oldest_age=float(q["oldest_age"]),
            oldest_unattempted_age=float(q["oldest_unattempted_age"]),
            first_attempt_wait=float(q["first_attempt_wait"]),
            sent=int(q["sent"]),
            received=int(q["received"]),
            deleted=int(q["deleted"]),
            dead_lettered=int(q["dead_lettered"]),
            empty_receives=int(q["empty_receives"]),
            expired=int(q["expired"]),
            sidelined=int(q["sidelined"]),
            top_groups=tuple(GroupBacklog(str(n), int(m), float(a)) for n, m, a in q["top_groups"]),
        )
        parked = tuple(str(g) for g in q["parked"])
        queues.append(QueueFigures(gauges, parked, int(q["parked_count"]), bool(q["suspended"])))
    held = tuple(HeldWorker(str(h["worker"]), str(h["state"])) for h in data["held"])
    return Figures(float(data["at"]), tuple(queues), held, bool(data["ready"]))
