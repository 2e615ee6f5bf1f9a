"""Group routing: which workers may take which groups (docs/rollouts.md), sans-I/O.

The patent assigns queue clients values, or ranges of values, of the strict order parameter. A queue's
`routing` attribute says so in two ways, both off by default (then every worker may take every group):

- **pins** (strict client preference, or a sensitive tenant's isolation): the groups a pin matches (a name
  prefix such as `acme:`, and/or a range `[lo, hi)` of `group_hash(group) % BUCKETS`) go only to the pin's
  workers. An `exclusive` pin's workers take nothing else. The first pin that matches a group wins.
- **canary** (a rollout's share, `strictq rollout`): the groups `in_share(group, percent)` go only to
  workers polling as `version`, and those workers take nothing else; every other group goes to the rest
  of the fleet. The share is a stable hash of the group, so raising the percentage only adds groups and a
  group stays on one side while the percentage holds.

A queue with routing keeps one ready heap per route (`Router`): a receive looks only at the routes its
worker may take, oldest head first across them, so a worker pinned to 1 % of the groups never scans the
other 99 % (the skip-and-push-back used for retry exclusions would not scale to that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument
from .groups import group_hash
from .heap import LazyHeap
from .records import GroupState

BUCKETS = 10_000  # the share's and ranges' resolution: 0.01 % of the group space
MAX_PINS = 64
MAX_PIN_WORKERS = 256
MAX_NAME = 128
MAX_VERSIONS = 64
MAX_BASELINE = 16
CANARY = "canary"
DEFAULT = ""  # the route of groups no pin or canary claims
ReadyEntry = tuple[int, int, GroupState]


def bucket_of(group: str) -> int:
    return group_hash(group) % BUCKETS


def in_share(group: str, percent: float) -> bool:
    """Whether `group` is in the first `percent` % of the group space (stable, monotonic in percent)."""
    if percent <= 0:
        return False
    return bucket_of(group) < percent * BUCKETS / 100.0


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    workers: frozenset[str]
    prefix: str = ""
    buckets: tuple[int, int] | None = None  # [lo, hi) of bucket_of(group)
    exclusive: bool = False

    def matches(self, group: str) -> bool:
        if self.prefix and not group.startswith(self.prefix):
            return False
        if self.buckets is not None:
            lo, hi = self.buckets
            return lo <= bucket_of(group) < hi
        return True


@dataclass(frozen=True, slots=True)
class Canary:
    version: str
    percent: float
    # The versions the rest of the groups go to ("" for workers that name none); empty: any other version.
    # A rollout names the versions running when it started, so a third version started meanwhile (the
    # next canary, say) takes nothing until its own rollout gives it a share.
    baseline: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutingTable:
    pins: tuple[Pin, ...] = ()
    canary: Canary | None = None

    def route_of(self, group: str) -> str:
        for pin in self.pins:
            if pin.matches(group):
                return "pin:" + pin.name
        canary = self.canary
        if canary is not None and in_share(group, canary.percent):
            return CANARY
        return DEFAULT

    def routes_for(self, worker: str, version: str) -> tuple[str, ...]:
        """The routes `worker` (polling as `version`) may take, in no particular order."""
        routes = ["pin:" + pin.name for pin in self.pins if worker in pin.workers]
        if any(pin.exclusive and worker in pin.workers for pin in self.pins):
            return tuple(routes)
        canary = self.canary
        if canary is not None and version == canary.version:
            routes.append(CANARY)
        elif canary is None or not canary.baseline or version in canary.baseline:
            routes.append(DEFAULT)
        return tuple(routes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.pins:
            out["pins"] = [
                {
                    "name": pin.name,
                    "workers": sorted(pin.workers),
                    **({"prefix": pin.prefix} if pin.prefix else {}),
                    **({"buckets": list(pin.buckets)} if pin.buckets is not None else {}),
                    **({"exclusive": True} if pin.exclusive else {}),
                }
                for pin in self.pins
            ]
        if self.canary is not None:
            out["canary"] = {"version": self.canary.version, "percent": self.canary.percent}
            if self.canary.baseline:
                out["canary"]["baseline"] = list(self.canary.baseline)
        return out


NO_ROUTING = RoutingTable()


def parse_routing(value: Any) -> RoutingTable:
    """The `routing` attribute (None or {}: no routing), validated; errors name the field at fault."""
    if value is None:
        return NO_ROUTING
    if not isinstance(value, dict):
        raise InvalidArgument("routing must be an object with 'pins' and/or 'canary'", field="routing")
    unknown = sorted(set(value) - {"pins", "canary"})
    if unknown:
        raise InvalidArgument(f"routing: unknown key(s) {', '.join(unknown)}", field="routing")
    pins = _pins(value.get("pins", []))
    canary = _canary(value.get("canary"))
    return RoutingTable(pins, canary)


def _pins(value: Any) -> tuple[Pin, ...]:
    if not isinstance(value, list):
        raise InvalidArgument("routing.pins must be a list", field="routing.pins")
    if len(value) > MAX_PINS:
        raise InvalidArgument(f"routing.pins: at most {MAX_PINS} pins", field="routing.pins")
    pins: list[Pin] = []
    for index, item in enumerate(value):
        where = f"routing.pins[{index}]"
        if not isinstance(item, dict):
            raise InvalidArgument(f"{where} must be an object", field=where)
        unknown = sorted(set(item) - {"name", "workers", "prefix", "buckets", "exclusive"})
        if unknown:
            raise InvalidArgument(f"{where}: unknown key(s) {', '.join(unknown)}", field=where)
        name = _name(item.get("name"), f"{where}.name")
        if any(pin.name == name for pin in pins):
            raise InvalidArgument(f"{where}.name {name!r} is used twice", field=f"{where}.name")
        workers = item.get("workers")
        if (
            not isinstance(workers, list)
            or not workers
            or len(workers) > MAX_PIN_WORKERS
            or not all(isinstance(w, str) and 0 < len(w) <= MAX_NAME for w in workers)
        ):
            raise InvalidArgument(
                f"{where}.workers must list 1 to {MAX_PIN_WORKERS} worker ids", field=f"{where}.workers"
            )
        prefix = item.get("prefix", "")
        if not isinstance(prefix, str) or len(prefix) > MAX_NAME:
            raise InvalidArgument(
                f"{where}.prefix must be a string of at most {MAX_NAME}", field=f"{where}.prefix"
            )
        buckets = _buckets(item.get("buckets"), f"{where}.buckets")
        if not prefix and buckets is None:
            raise InvalidArgument(f"{where} must name a prefix or a bucket range", field=where)
        exclusive = item.get("exclusive", False)
        if not isinstance(exclusive, bool):
            raise InvalidArgument(f"{where}.exclusive must be true or false", field=f"{where}.exclusive")
        pins.append(Pin(name, frozenset(workers), prefix, buckets, exclusive))
    return tuple(pins)


def _buckets(value: Any, where: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not 0 <= value[0] < value[1] <= BUCKETS
    ):
        raise InvalidArgument(f"{where} must be [lo, hi] with 0 <= lo < hi <= {BUCKETS}", field=where)
    return (value[0], value[1])


def _canary(value: Any) -> Canary | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"version", "percent", "baseline"}:
        raise InvalidArgument("routing.canary must be {version, percent, baseline?}", field="routing.canary")
    version = _name(value.get("version"), "routing.canary.version")
    baseline = value.get("baseline", [])
    if (
        not isinstance(baseline, list)
        or len(baseline) > MAX_BASELINE
        or not all(isinstance(v, str) and len(v) <= MAX_NAME for v in baseline)
        or version in baseline
    ):
        raise InvalidArgument(
            f"routing.canary.baseline must list up to {MAX_BASELINE} other versions ('' for unnamed)",
            field="routing.canary.baseline",
        )
    percent = value.get("percent")
    if not isinstance(percent, int | float) or isinstance(percent, bool) or not 0 <= percent <= 100:
        raise InvalidArgument(
            "routing.canary.percent must be a number from 0 to 100", field="routing.canary.percent"
        )
    return Canary(version, float(percent), tuple(dict.fromkeys(baseline)))


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME or not value.isprintable():
        raise InvalidArgument(f"{where} must be 1 to {MAX_NAME} printable characters", field=where)
    return value


def figures_of(
    known: dict[str, str], recent: dict[str, str], attempts: dict[str, list[int]]
) -> dict[str, dict[str, int]]:
    """Per version any worker is known to run: attempts that succeeded and failed (since the routing last
    changed), and the workers seen polling as it lately (`recent`)."""
    workers: dict[str, int] = {}
    for version in recent.values():
        workers[version] = workers.get(version, 0) + 1
    return {
        version: {
            "succeeded": attempts.get(version, [0, 0])[0],
            "failed": attempts.get(version, [0, 0])[1],
            "workers": workers.get(version, 0),
        }
        for version in sorted(set(attempts) | set(known.values()))
    }


@dataclass(frozen=True, slots=True)
class VersionFigures:
    """What a rollout's gate compares, as one core knows it (read through the port; a cluster sums its
    partitions'): every worker's last polled version, those polled within the caller's horizon, and the
    attempt tallies per version ([succeeded, failed]) since the routing last changed."""

    known: dict[str, str]
    recent: dict[str, str]
    attempts: dict[str, list[int]]

    def to_json(self) -> dict[str, Any]:
        return {"known": self.known, "recent": self.recent, "attempts": self.attempts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VersionFigures:
        return cls(
            {str(w): str(v) for w, v in data["known"].items()},
            {str(w): str(v) for w, v in data["recent"].items()},
            {str(v): [int(t[0]), int(t[1])] for v, t in data["attempts"].items()},
        )

    @classmethod
    def merged(cls, parts: Sequence[VersionFigures]) -> VersionFigures:
        """Partitions' figures as one queue's: workers seen anywhere, tallies summed."""
        known: dict[str, str] = {}
        recent: dict[str, str] = {}
        attempts: dict[str, list[int]] = {}
        for part in parts:
            known.update(part.known)
            recent.update(part.recent)
            for version, (succeeded, failed) in part.attempts.items():
                tally = attempts.setdefault(version, [0, 0])
                tally[0] += succeeded
                tally[1] += failed
        return cls(known, recent, attempts)


def version_figures(
    versions: dict[str, str], pollers: dict[str, float], attempts: dict[str, list[int]], since: float
) -> VersionFigures:
    """A queue's figures: `pollers` (worker -> last receive) seen at `since` or later count as recent."""
    recent = {w: v for w, v in versions.items() if pollers.get(w, since - 1) >= since}
    return VersionFigures(dict(versions), recent, {v: list(t) for v, t in attempts.items()})


class Router:
    """The ready groups of a queue with routing: one lazy heap per route, oldest head first in each."""

    def __init__(
        self, table: RoutingTable, is_live: Callable[[ReadyEntry], bool], versions: dict[str, str]
    ) -> None:
        self.table = table
        self._is_live = is_live
        self.heaps: dict[str, LazyHeap[ReadyEntry]] = {}
        self._route_of: dict[str, str] = {}  # group name -> route (hashing once per group, not per push)
        self.versions = versions  # worker -> the version it last polled as (the queue's, kept by saw())
        # Attempt results per version since the routing was set (what a rollout's gate compares); bounded
        # by the versions in play (MAX_VERSIONS, the oldest tallies dropped past it).
        self.attempts: dict[str, list[int]] = {}

    def count(self, worker: str, outcomes: Iterable[str]) -> None:
        """Attempt results of `worker`, per the version it polls as: {version: [succeeded, failed]}."""
        version = self.versions.get(worker, "")
        tally = self.attempts.get(version)
        if tally is None:
            if len(self.attempts) >= MAX_VERSIONS:
                del self.attempts[next(iter(self.attempts))]
            tally = self.attempts[version] = [0, 0]
        for outcome in outcomes:
            if outcome == "succeeded":
                tally[0] += 1
            elif outcome in ("failed", "partial"):
                tally[1] += 1

    def may_take(self, worker: str, group: GroupState) -> bool:
        return self.route(group) in self.table.routes_for(worker, self.versions.get(worker, ""))

    def route(self, group: GroupState) -> str:
        route = self._route_of.get(group.name)
        if route is None:
            if len(self._route_of) > 4 * max(1024, len(group.queue.groups)):
                self._route_of.clear()  # names of groups long gone; recomputed on demand
            route = self._route_of[group.name] = self.table.route_of(group.name)
        return route

    def push(self, entry: ReadyEntry) -> None:
        route = self.route(entry[2])
        heap = self.heaps.get(route)
        if heap is None:
            heap = self.heaps[route] = LazyHeap(self._is_live)
        heap.push(entry)

    def pop(self, worker: str, version: str) -> GroupState | None:
        """The oldest ready group among the routes `worker` may take."""
        best: LazyHeap[ReadyEntry] | None = None
        best_key: tuple[int, int] | None = None
        for route in self.table.routes_for(worker, version):
            heap = self.heaps.get(route)
            top = heap.peek() if heap is not None else None
            if top is not None and (best_key is None or (top[0], top[1]) < best_key):
                best, best_key = heap, (top[0], top[1])
        if best is None:
            return None
        entry = best.pop()
        return None if entry is None else entry[2]

    def has_ready(self, worker: str, version: str | None) -> bool:
        """Whether a route `worker` may take has a ready group (any route when `version` is unknown)."""
        routes = self.heaps if version is None else self.table.routes_for(worker, version)
        return any(
            (heap := self.heaps.get(route)) is not None and heap.peek() is not None for route in routes
        )

    def clear(self) -> None:
        self.heaps.clear()
        self._route_of.clear()

    def entries(self) -> Iterable[ReadyEntry]:
        for heap in self.heaps.values():
            yield from heap.live_entries()
