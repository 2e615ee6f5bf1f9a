"""Where each partition's owner should be: the placement policy and the planner, sans I/O.

Issue 16: a partition's owner moves toward the region its producers send from (mode "traffic", from the
edges' measured rates and latencies: cluster.traffic) or follows a daily schedule ("schedule",
follow-the-sun). `propose` is the whole judgement as a pure function of what the master read and `now`
(wall-clock seconds), so it is tested with plain values and a state machine
(tests/test_cluster_placement.py); cluster.master writes its unblocked proposals as planned moves
(`move-p<N>`, carried out by cluster.ownership.plan, which keeps per-group order) and records them in the
placement bucket's history (cluster.placement_store), which the budget and the cooldown read back.

Nothing is assumed: a partition whose cost needs a latency no edge measured gets no proposal.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson

from .names import check_node_name
from .ownership import Assignment, NodeInfo, RecordError

Mode = Literal["off", "traffic", "schedule"]
MODES: tuple[Mode, ...] = ("off", "traffic", "schedule")
BUDGET_WINDOW = 3600.0  # max_moves_per_hour counts the moves of the last hour
HISTORY_KEEP_SECONDS = 48 * 3600.0  # the history key keeps two days of moves...
HISTORY_KEEP = 1000  # ...and at most this many


class PolicyError(ValueError):
    """A placement policy (or schedule) that cannot be used; the message names the field."""


# ------------------------------------------------------------------------------------------ schedule
@dataclass(frozen=True, slots=True)
class ScheduleStep:
    at_hour: float  # hour of the (possibly compressed) day, 0 <= at_hour < 24
    region: str

    def __str__(self) -> str:
        return f"{format_hour(self.at_hour)}={self.region}"


def format_hour(hour: float) -> str:
    minutes = round(hour * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def format_schedule(schedule: Sequence[ScheduleStep]) -> str:
    """The `parse_schedule` form: "00:00=ap,08:00=eu,16:00=us"."""
    return ",".join(str(step) for step in schedule)


_STEP = re.compile(r"(\d{1,2}):(\d{2})=(.*)")


def parse_schedule(text: str) -> tuple[ScheduleStep, ...]:
    """Steps from "00:00=ap,08:00=eu,16:00=us", sorted by hour; PolicyError naming the bad step."""
    steps: list[ScheduleStep] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        match = _STEP.fullmatch(part)
        if match is None:
            raise PolicyError(f"schedule step {part!r}: expected HH:MM=REGION (e.g. 08:00=eu)")
        hours, minutes, region = int(match[1]), int(match[2]), match[3].strip()
        if hours > 23 or minutes > 59:
            raise PolicyError(f"schedule step {part!r}: the time must be 00:00-23:59")
        if problem := check_node_name(region, "region"):
            raise PolicyError(f"schedule step {part!r}: {problem}")
        steps.append(ScheduleStep(hours + minutes / 60, region))
    return _checked_schedule(steps)


def _checked_schedule(steps: Iterable[ScheduleStep]) -> tuple[ScheduleStep, ...]:
    ordered = tuple(sorted(steps, key=lambda step: step.at_hour))
    if not ordered:
        raise PolicyError("schedule: no steps (expected e.g. 00:00=ap,08:00=eu,16:00=us)")
    for step in ordered:
        if not 0.0 <= step.at_hour < 24.0:
            raise PolicyError(f"schedule: hour {step.at_hour} is not within 0-24")
        if problem := check_node_name(step.region, "region"):
            raise PolicyError(f"schedule: {problem}")
    for before, after in itertools.pairwise(ordered):
        if format_hour(before.at_hour) == format_hour(after.at_hour):
            raise PolicyError(f"schedule: two steps at {format_hour(after.at_hour)}")
    return ordered


# ------------------------------------------------------------------------------------------- policy
@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """What placement does (kept in the placement bucket's `policy` key; `strictq cluster placement`).

    `day_seconds` compresses the schedule's day (a test or a demo runs a day in 24 s), starting at
    `day_origin` (wall-clock seconds). `min_share`/`min_saving_ms`/`min_rate` keep traffic mode from moving
    a partition for a trickle or a mixed audience; `hold` is how long the same target must be wanted
    before the move (hysteresis); `cooldown` how long a moved partition stays put; at most
    `max_moves_per_hour` moves in any hour."""

    mode: Mode = "off"
    schedule: tuple[ScheduleStep, ...] = ()
    day_seconds: float = 86400.0
    day_origin: float = 0.0
    min_share: float = 0.5
    min_saving_ms: float = 5.0
    min_rate: float = 0.2
    hold: float = 300.0
    cooldown: float = 900.0
    max_moves_per_hour: int = 12

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PolicyError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.schedule:
            object.__setattr__(self, "schedule", _checked_schedule(self.schedule))
        elif self.mode == "schedule":
            raise PolicyError("schedule: mode schedule needs steps (e.g. 00:00=ap,08:00=eu,16:00=us)")
        checks: tuple[tuple[str, float, float, float], ...] = (
            ("day_seconds", self.day_seconds, 1e-3, math.inf),
            ("day_origin", self.day_origin, -math.inf, math.inf),
            ("min_share", self.min_share, 0.0, 1.0),
            ("min_saving_ms", self.min_saving_ms, 0.0, math.inf),
            ("min_rate", self.min_rate, 0.0, math.inf),
            ("hold", self.hold, 0.0, math.inf),
            ("cooldown", self.cooldown, 0.0, math.inf),
            ("max_moves_per_hour", self.max_moves_per_hour, 0, 1_000_000),
        )
        for name, value, low, high in checks:
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise PolicyError(f"{name} must be a number, not {value!r}")
            if not low <= value <= high:
                bound = f"at least {low:g}" if high == math.inf else f"within {low:g}-{high:g}"
                raise PolicyError(f"{name} must be {bound}, not {value:g}")
        if not isinstance(self.max_moves_per_hour, int) or isinstance(self.max_moves_per_hour, bool):
            raise PolicyError(f"max_moves_per_hour must be a whole number, not {self.max_moves_per_hour!r}")

    def hour_of_day(self, now: float) -> float:
        return ((now - self.day_origin) % self.day_seconds) / self.day_seconds * 24.0

    def current_step(self, now: float) -> ScheduleStep | None:
        """The step in force at `now`: the last one at or before the hour of the day, the day's last one
        before the first (wrap-around); None without a schedule."""
        if not self.schedule:
            return None
        hour = self.hour_of_day(now)
        current = self.schedule[-1]
        for step in self.schedule:
            if step.at_hour <= hour:
                current = step
        return current

    def scheduled_region(self, now: float) -> str | None:
        """The region the schedule names at `now` (current_step's); None without a schedule."""
        step = self.current_step(now)
        return None if step is None else step.region

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "schedule": [{"at_hour": step.at_hour, "region": step.region} for step in self.schedule],
            "schedule_text": format_schedule(self.schedule),
            "day_seconds": self.day_seconds,
            "day_origin": self.day_origin,
            "min_share": self.min_share,
            "min_saving_ms": self.min_saving_ms,
            "min_rate": self.min_rate,
            "hold": self.hold,
            "cooldown": self.cooldown,
            "max_moves_per_hour": self.max_moves_per_hour,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: bytes) -> PlacementPolicy:
        """PolicyError naming the field on a bad record; missing fields take their defaults."""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise PolicyError(f"the placement policy is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PolicyError("the placement policy must be a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlacementPolicy:
        values: dict[str, Any] = {}
        if "mode" in data:
            values["mode"] = data["mode"]
        if "schedule" in data:
            steps = data["schedule"]
            if not isinstance(steps, list):
                raise PolicyError("schedule must be a list of {at_hour, region}")
            parsed: list[ScheduleStep] = []
            for step in steps:
                try:
                    parsed.append(
                        ScheduleStep(_number("schedule at_hour", step["at_hour"]), str(step["region"]))
                    )
                except (KeyError, TypeError):
                    raise PolicyError(f"schedule step {step!r}: expected {{at_hour, region}}") from None
            values["schedule"] = tuple(parsed)
        for name in (
            "day_seconds",
            "day_origin",
            "min_share",
            "min_saving_ms",
            "min_rate",
            "hold",
            "cooldown",
        ):
            if name in data:
                values[name] = _number(name, data[name])
        if "max_moves_per_hour" in data:
            value = data["max_moves_per_hour"]
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            values["max_moves_per_hour"] = value
        return cls(**values)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"{name} must be a number, not {value!r}")
    return float(value)


# -------------------------------------------------------------------------------------------- history
@dataclass(frozen=True, slots=True)
class MoveRecord:
    """A move placement (or an operator's `cluster plan --apply`) asked for: the budget and the cooldown
    count them."""

    at: float  # wall-clock seconds
    partition: int
    from_node: str
    to_node: str
    from_region: str
    to_region: str
    reason: str
    by: str  # "placement" | "plan"

    @classmethod
    def of(cls, proposal: Proposal, at: float, by: str) -> MoveRecord:
        return cls(
            at,
            proposal.partition,
            proposal.from_node,
            proposal.to_node,
            proposal.from_region,
            proposal.to_region,
            proposal.reason,
            by,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "partition": self.partition,
            "from_node": self.from_node,
            "to_node": self.to_node,
            "from_region": self.from_region,
            "to_region": self.to_region,
            "reason": self.reason,
            "by": self.by,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MoveRecord:
        try:
            return cls(
                float(data["at"]),
                int(data["partition"]),
                str(data["from_node"]),
                str(data["to_node"]),
                str(data.get("from_region", "")),
                str(data.get("to_region", "")),
                str(data.get("reason", "")),
                str(data.get("by", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"unreadable move record: {exc!r}") from None


def history_to_json(records: Iterable[MoveRecord]) -> bytes:
    return orjson.dumps([record.to_dict() for record in records])


def history_from_json(raw: bytes) -> tuple[MoveRecord, ...]:
    """RecordError on a value that is not a list of move records."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"the placement history is not JSON: {exc}") from None
    if not isinstance(data, list):
        raise RecordError("the placement history must be a JSON list")
    return tuple(MoveRecord.from_dict(cast(Mapping[str, Any], item)) for item in data)


def trim_history(records: Iterable[MoveRecord], now: float) -> tuple[MoveRecord, ...]:
    """The records worth keeping: the last HISTORY_KEEP_SECONDS, at most HISTORY_KEEP, oldest first."""
    kept = sorted((r for r in records if r.at >= now - HISTORY_KEEP_SECONDS), key=lambda r: r.at)
    return tuple(kept[-HISTORY_KEEP:])


# ------------------------------------------------------------------------------------------ proposals
@dataclass(frozen=True, slots=True)
class Proposal:
    partition: int
    from_node: str
    to_node: str  # "" when no node in to_region can take it (then `blocked` says so)
    from_region: str
    to_region: str
    reason: str  # why the partition should move
    saved_ms: float | None  # measured latency saved per send (share-weighted); None: not measured
    risk: str  # what the move costs and risks
    blocked: str = ""  # "": it is made now; else why not yet


@dataclass(frozen=True, slots=True)
class PlacementState:
    """What placement remembers between ticks: the region each partition has been leaning toward and
    since when (the master keeps it in memory; a new master starts over, which only delays), and the
    moves made (the placement bucket's history)."""

    leaning: dict[int, tuple[str, float]] = field(default_factory=dict)
    history: tuple[MoveRecord, ...] = ()


def propose(
    *,
    partitions: int,
    assignments: Mapping[int, Assignment],
    nodes: Mapping[str, NodeInfo],
    demand: Mapping[int, Mapping[str, float]],
    latency: Mapping[tuple[str, str], float],
    policy: PlacementPolicy,
    state: PlacementState,
    now: float,
    pending_moves: Mapping[int, str],
    mode: Mode | None = None,
) -> tuple[list[Proposal], PlacementState]:
    """The moves placement wants now, each with `blocked` "" (make it now) or why not yet, and the new
    state (leaning updated; history unchanged: the caller records what it made, MoveRecord.of).

    `nodes` are the live nodes; `demand` msg/s by client region per partition (cluster.traffic.demand);
    `latency` ms by (client region, node region) (cluster.traffic.latency); `pending_moves` partition ->
    target of the moves already asked for (anyone's); `mode` overrides the policy's (`cluster plan --by`).
    """
    mode = policy.mode if mode is None else mode
    leaning: dict[int, tuple[str, float]] = {}
    proposals: list[Proposal] = []
    if mode == "off":
        return proposals, PlacementState(leaning, state.history)
    recent = [record for record in state.history if record.at > now - BUDGET_WINDOW]
    made = len(recent)
    last_moved: dict[int, float] = {}
    for record in state.history:
        last_moved[record.partition] = max(record.at, last_moved.get(record.partition, -math.inf))
    owned: dict[str, int] = {name: 0 for name in nodes}
    for assignment in assignments.values():
        if assignment.node in owned:
            owned[assignment.node] += 1
    for partition in range(partitions):
        current = assignments.get(partition)
        if current is None or current.node not in nodes:
            continue  # no live owner: failover's business (cluster.ownership.plan), not placement's
        owner = nodes[current.node]
        rates = {region: rate for region, rate in demand.get(partition, {}).items() if region and rate > 0}
        wish = _wish(mode, policy, now, owner, rates, nodes, latency)
        if wish is None:
            continue
        region, reason, saved = wish
        since = state.leaning.get(partition, (region, now))
        since_at = since[1] if since[0] == region else now
        leaning[partition] = (region, since_at)
        target = _target(partition, region, current.node, nodes, owned)
        blocked = ""
        if partition in pending_moves:
            blocked = _pending(partition, pending_moves[partition], owner, nodes)
        elif target is None:
            in_region = [info for info in nodes.values() if info.region == region]
            blocked = (
                f"every node in {region} is handing partitions over"
                if in_region
                else f"no live node in {region}"
            )
        elif partition in last_moved and now - last_moved[partition] < policy.cooldown:
            blocked = f"cooldown {math.ceil(policy.cooldown - (now - last_moved[partition]))} s more"
        elif now - since_at < policy.hold:
            blocked = f"hold {math.ceil(policy.hold - (now - since_at))} s more"
        elif made >= policy.max_moves_per_hour:
            blocked = f"budget: {made} moves in the last hour"
        risk = "" if target is None else _risk(partition, owner, target, nodes)
        proposal = Proposal(
            partition,
            current.node,
            "" if target is None else target.node,
            owner.region,
            region,
            reason,
            saved,
            risk,
            blocked,
        )
        proposals.append(proposal)
        if not blocked and target is not None:
            made += 1
            owned[target.node] += 1
            owned[current.node] -= 1
            del leaning[partition]  # the next wish starts its hold afresh
    return proposals, PlacementState(leaning, state.history)


def _wish(
    mode: Mode,
    policy: PlacementPolicy,
    now: float,
    owner: NodeInfo,
    rates: Mapping[str, float],
    nodes: Mapping[str, NodeInfo],
    latency: Mapping[tuple[str, str], float],
) -> tuple[str, str, float | None] | None:
    """(target region, why, saved ms) when the partition should be elsewhere, else None."""
    total = sum(rates.values())
    shares = {region: rate / total for region, rate in rates.items()} if total > 0 else {}

    def measured(targets: list[str]) -> dict[str, float]:
        """The shares of the client regions whose latency to every target some edge measured: nothing is
        assumed of the others (a region without an edge), which only dilute the decision."""
        return {r: s for r, s in shares.items() if all((r, where) in latency for where in targets)}

    def cost(where: str, weights: Mapping[str, float]) -> float | None:
        """Share-weighted round trip to `where` over the measured client regions (renormalised)."""
        known = sum(weights.values())
        if not where or known <= 0:
            return None
        return sum(share * latency[(region, where)] for region, share in weights.items()) / known

    if mode == "schedule":
        step = policy.current_step(now)
        if step is None or step.region == owner.region:
            return None
        weights = measured([owner.region, step.region]) if owner.region else {}
        here, there = cost(owner.region, weights), cost(step.region, weights)
        saved = None if here is None or there is None else here - there
        return step.region, f"schedule: {step}", saved
    if total < policy.min_rate or not owner.region:
        return None
    regions = sorted({info.region for info in nodes.values() if info.region})
    weights = measured(regions)
    if sum(weights.values()) < policy.min_share:
        return None  # too little of the traffic comes from where latency was measured
    costs: dict[str, float] = {}
    for where in regions:
        value = cost(where, weights)
        if value is None:
            return None
        costs[where] = value
    # Ties keep the partition where it is, then go to the first name: the same input, the same answer.
    best = min(regions, key=lambda where: (costs[where], where != owner.region, where))
    if best == owner.region:
        return None
    top, share = max(shares.items(), key=lambda item: (item[1], item[0]))
    saved = costs[owner.region] - costs[best]
    if share < policy.min_share or saved < policy.min_saving_ms:
        return None
    unmeasured = 1.0 - sum(weights.values())
    why = (
        f"{share:.0%} of {total:.1f} msg/s from {top}; "
        f"{costs[owner.region]:.0f} ms -> {costs[best]:.0f} ms from the edges"
        + (
            f" ({unmeasured:.0%} of the sends from regions without measured latency)"
            if unmeasured > 0.005
            else ""
        )
    )
    return best, why, saved


def _target(
    partition: int, region: str, owner: str, nodes: Mapping[str, NodeInfo], owned: Mapping[str, int]
) -> NodeInfo | None:
    """The node in `region` to take it: live, not handing anything over, fewest partitions owned, then
    most of this partition applied, then by name."""
    fit = [
        info for info in nodes.values() if info.region == region and info.node != owner and not info.draining
    ]
    if not fit:
        return None
    return min(fit, key=lambda info: (owned.get(info.node, 0), -info.applied.get(partition, 0), info.node))


def _pending(partition: int, target: str, owner: NodeInfo, nodes: Mapping[str, NodeInfo]) -> str:
    info = nodes.get(target)
    if info is None or target == owner.node:
        return "a move is under way"
    behind = owner.applied.get(partition, 0) - info.applied.get(partition, 0)
    if behind > 0:
        return f"a move is under way: {target} catching up, {behind} frames behind"
    return f"a move is under way to {target}"


def _risk(partition: int, owner: NodeInfo, target: NodeInfo, nodes: Mapping[str, NodeInfo]) -> str:
    """The target's lag (the move waits for it to catch up, the owner drains first) and where a failover
    could go if the target died: the live nodes other than the target, by zone."""
    behind = max(0, owner.applied.get(partition, 0) - target.applied.get(partition, 0))
    others = [info for info in nodes.values() if info.node != target.node]
    zones = {info.zone for info in others if info.zone and info.zone != target.zone}
    if not others:
        spread = "no failover candidate"
    elif zones:
        spread = f"failover candidates in {len(zones)} other zone{'s' if len(zones) != 1 else ''}"
    elif any(info.zone for info in others):
        spread = f"failover candidates only in {target.zone or 'the same zone'}"
    else:
        spread = f"{len(others)} failover candidate{'s' if len(others) != 1 else ''}, zones unknown"
    return f"target {behind} frames behind; {spread}"
