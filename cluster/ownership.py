"""Who owns which partition: the records in the KV buckets and the master's decisions, sans I/O.

`plan` is the master's whole judgement as a pure function of what it read (assignments, live nodes) and
`now`, so it is tested with plain values (tests/test_cluster_ownership.py); cluster.master carries it out
with compare-and-set on each assignment's revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

# An owner gets this long to open a partition after its assignment before the master gives the partition
# to someone else (a promotion applies the last frames, writes the marker, restores the store).
PROMOTION_GRACE = 10.0


class RecordError(ValueError):
    """A KV record this version cannot read."""


@dataclass(frozen=True, slots=True)
class Assignment:
    partition: int
    node: str
    incarnation: str
    epoch: int
    assigned_at: float
    reason: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "partition": self.partition,
                "node": self.node,
                "incarnation": self.incarnation,
                "epoch": self.epoch,
                "assigned_at": self.assigned_at,
                "reason": self.reason,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> Assignment:
        try:
            data = orjson.loads(raw)
            return cls(
                int(data["partition"]),
                str(data["node"]),
                str(data["incarnation"]),
                int(data["epoch"]),
                float(data["assigned_at"]),
                str(data.get("reason", "")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"unreadable assignment: {exc}") from None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node's heartbeat: who it is, where its internal API is, how far it has applied each partition."""

    node: str
    incarnation: str
    url: str
    pid: int
    applied: dict[int, int] = field(default_factory=dict)  # partition -> stream position applied
    serving: frozenset[int] = frozenset()
    draining: frozenset[int] = frozenset()  # partitions it is handing over (cluster move)
    started_at: float = 0.0
    region: str = ""  # where it runs (--region, --zone): issue 16's placement reads them; "" unknown
    zone: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "node": self.node,
                "incarnation": self.incarnation,
                "url": self.url,
                "pid": self.pid,
                "applied": {str(p): s for p, s in self.applied.items()},
                "serving": sorted(self.serving),
                "draining": sorted(self.draining),
                "started_at": self.started_at,
                "region": self.region,
                "zone": self.zone,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> NodeInfo:
        try:
            data: dict[str, Any] = orjson.loads(raw)
            return cls(
                str(data["node"]),
                str(data["incarnation"]),
                str(data["url"]),
                int(data["pid"]),
                {int(p): int(s) for p, s in data.get("applied", {}).items()},
                frozenset(int(p) for p in data.get("serving", ())),
                frozenset(int(p) for p in data.get("draining", ())),
                float(data.get("started_at", 0.0)),
                str(data.get("region", "")),
                str(data.get("zone", "")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"unreadable node record: {exc}") from None


def owner_is_live(assignment: Assignment, nodes: dict[str, NodeInfo], now: float) -> bool:
    """The assigned node is alive in the same incarnation, and serves the partition (or is still within its
    grace to open it)."""
    info = nodes.get(assignment.node)
    if info is None or info.incarnation != assignment.incarnation:
        return False
    return assignment.partition in info.serving or now - assignment.assigned_at < PROMOTION_GRACE


def plan(
    partitions: int,
    assignments: dict[int, Assignment],
    nodes: dict[str, NodeInfo],
    now: float,
    moves: dict[int, str] | None = None,
) -> list[Assignment]:
    """The assignments to write: a partition with no live owner goes to the live node with the most of its
    stream applied (then the one owning fewest partitions, then by name), with the next epoch; `moves`
    (partition -> node, from `strictq cluster move`) go to the named node once it has caught up."""
    if not nodes:
        return []
    owned: dict[str, int] = {name: 0 for name in nodes}
    for assignment in assignments.values():
        if owner_is_live(assignment, nodes, now):
            owned[assignment.node] += 1
    changes: list[Assignment] = []
    for partition in range(partitions):
        current = assignments.get(partition)
        epoch = current.epoch + 1 if current is not None else 1
        target = (moves or {}).get(partition)
        if target is not None and current is not None and target != current.node and target in nodes:
            info = nodes[target]
            owner = nodes.get(current.node)
            if owner is not None and owner.incarnation != current.incarnation:
                owner = None  # restarted: it serves nothing of the old assignment, do not wait for it
            caught_up = owner is None or info.applied.get(partition, 0) >= owner.applied.get(partition, 0)
            handed_over = owner is None or partition not in owner.serving
            if caught_up and handed_over:
                changes.append(Assignment(partition, target, info.incarnation, epoch, now, "moved"))
            continue
        if current is not None and owner_is_live(current, nodes, now):
            continue
        best = max(
            nodes.values(),
            key=lambda info: (info.applied.get(partition, 0), -owned[info.node], _reverse(info.node)),
        )
        owned[best.node] += 1
        reason = "first owner" if current is None else f"{current.node} is gone or not serving"
        changes.append(Assignment(partition, best.node, best.incarnation, epoch, now, reason))
    return changes


def _reverse(name: str) -> tuple[int, ...]:
    """Sorts names descending under max(), so ties go to the first name."""
    return tuple(-ord(c) for c in name)


def rebalance(
    partitions: int, assignments: dict[int, Assignment], nodes: dict[str, NodeInfo], moves: dict[int, str]
) -> dict[int, str]:
    """One planned move (partition -> node) that evens out ownership, when every partition is served and no
    move is under way: a node that joined, or came back, takes partitions from the busiest one."""
    if moves or len(nodes) < 2:
        return {}
    owned: dict[str, list[int]] = {name: [] for name in nodes}
    for partition in range(partitions):
        assignment = assignments.get(partition)
        if assignment is None:
            return {}
        info = nodes.get(assignment.node)
        if info is None or info.incarnation != assignment.incarnation or partition not in info.serving:
            return {}
        owned[assignment.node].append(partition)
    busiest = max(owned, key=lambda name: (len(owned[name]), name))
    idlest = min(owned, key=lambda name: (len(owned[name]), name))
    if len(owned[busiest]) - len(owned[idlest]) <= 1:
        return {}
    target = nodes[idlest]
    partition = max(owned[busiest], key=lambda p: (target.applied.get(p, 0), -p))
    return {partition: idlest}
