"""One look at a running cluster: its layout, who owns each partition, how far each standby lags, which
nodes are alive; with `geo`, also its geography: the edges' reports (where each partition's sends come
from, the latency to each node) and the placement policy. `strictq cluster status` prints it, `cluster
move` and `cluster plan --apply` wait on it, `cluster up` waits until it is settled before it says
`cluster ready`.

Why a reading of its own rather than the nodes' KvMirror: a command reads once and exits, so liveness is
judged from the time JetStream stamped each heartbeat (a node puts its record every 0.5 s; older than
cluster.layout.NODE_TTL is stale), not from when this process heard of it.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from cluster.layout import NODE_TTL, ClusterLayout, LayoutError
from cluster.master import assignment_key, move_key
from cluster.nats_servers import NATS_DIR, PORTS_FILE
from cluster.ownership import Assignment, NodeInfo, RecordError, rebalance
from cluster.placement import MoveRecord, PlacementPolicy, PolicyError
from cluster.placement_store import read_placement
from cluster.traffic import EdgeReport


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    pid: int
    url: str
    incarnation: str
    age: float  # seconds since its last heartbeat, by JetStream's clock
    serving: tuple[int, ...]
    applied: dict[int, int]
    region: str = ""
    zone: str = ""
    draining: tuple[int, ...] = ()

    @property
    def alive(self) -> bool:
        return self.age <= NODE_TTL

    @property
    def state(self) -> str:
        return "alive" if self.alive else "stale"


@dataclass(frozen=True, slots=True)
class Standby:
    node: str
    applied: int
    lag: int | None  # the stream's last sequence - applied; None when the stream could not be read


@dataclass(frozen=True, slots=True)
class PartitionView:
    partition: int
    owner: str | None
    epoch: int | None
    serving: bool  # the owner is alive, in the assigned incarnation, and says it serves the partition
    last_seq: int | None
    standbys: tuple[Standby, ...]
    moving_to: str | None  # a pending move request (`strictq cluster move`, or the master's rebalancing)
    region: str = ""  # the owner's (its --region); "" unknown


@dataclass(frozen=True, slots=True)
class Traffic:
    """Where a partition's sends come from, summed over the edges' reports (rates over their windows)."""

    rates: dict[str, float]  # msg/s by client region; unknown regions left out (in `unknown`)
    unknown: float  # msg/s from clients whose region no edge could tell

    @property
    def total(self) -> float:
        return sum(self.rates.values()) + self.unknown

    @property
    def top(self) -> tuple[str, float] | None:
        """(the region sending most, its share of all sends), None without known-region sends."""
        if not self.rates or self.total <= 0:
            return None
        region = max(sorted(self.rates), key=lambda r: self.rates[r])
        return region, self.rates[region] / self.total

    def to_json(self) -> dict[str, Any]:
        top = self.top
        return {
            "rate": round(self.total, 3),
            "regions": {r: round(v, 3) for r, v in sorted(self.rates.items())},
            "unknown": round(self.unknown, 3),
            "top_region": top[0] if top else None,
            "top_share": round(top[1], 3) if top else None,
        }


@dataclass(frozen=True, slots=True)
class EdgeView:
    """One edge (gateway) as its last report in the edges bucket says."""

    report: EdgeReport
    age: float  # seconds since JetStream stored the report

    @property
    def name(self) -> str:
        return self.report.edge

    @property
    def sends_per_s(self) -> float:
        return sum(sum(p.rates.values()) for p in self.report.partitions.values())

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "edge": r.edge,
            "region": r.region or None,
            "zone": r.zone or None,
            "url": r.url,
            "age": round(self.age, 3),
            "window": r.window,
            "sends_per_s": round(self.sends_per_s, 3),
            "nodes": {
                name: {"region": n.region or None, "rtt_ms": n.rtt_ms} for name, n in sorted(r.nodes.items())
            },
            "partitions": {
                str(p): {
                    "rates": {region: round(v, 3) for region, v in sorted(t.rates.items())},
                    "sends": t.sends,
                    "p50_ms": t.p50_ms,
                    "p99_ms": t.p99_ms,
                    "owner": t.owner or None,
                }
                for p, t in sorted(r.partitions.items())
            },
        }


@dataclass(frozen=True)
class Geography:
    """The edges' reports and the placement policy and history (read only with `read_view(geo=True)`)."""

    edges: list[EdgeView]
    policy: PlacementPolicy | None  # None: unreadable, `problem` says why
    history: tuple[MoveRecord, ...]
    problem: str = ""

    @property
    def reports(self) -> list[EdgeReport]:
        return [e.report for e in self.edges]

    def traffic(self, partition: int) -> Traffic | None:
        rates: dict[str, float] = {}
        unknown = 0.0
        seen = False
        for edge in self.edges:
            found = edge.report.partitions.get(partition)
            if found is None:
                continue
            seen = True
            for region, rate in found.rates.items():
                if region:
                    rates[region] = rates.get(region, 0.0) + rate
                else:
                    unknown += rate
        return Traffic(rates, unknown) if seen else None


@dataclass(frozen=True)
class ClusterView:
    layout: ClusterLayout
    nats: tuple[str, ...]
    partitions: list[PartitionView]
    nodes: list[NodeView]
    assignments: dict[int, Assignment] = field(default_factory=dict)
    geo: Geography | None = None

    def node(self, name: str) -> NodeView | None:
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def alive(self) -> list[NodeView]:
        return [n for n in self.nodes if n.alive]

    def settled(self) -> bool:
        """Every partition served by its owner, no move pending, and no rebalancing left to do (what the
        master would move next, cluster.ownership.rebalance): the shape `cluster up` waits for."""
        if not all(p.serving and p.moving_to is None for p in self.partitions):
            return False
        live = {n.name: _info(n) for n in self.alive}
        return not rebalance(self.layout.partitions, self.assignments, live, {})

    def live_infos(self) -> dict[str, NodeInfo]:
        """The live nodes' records, as the master's decisions take them."""
        return {n.name: _info(n) for n in self.alive}

    def to_json(self) -> dict[str, Any]:
        """The shape of `strictq cluster status --json` (documented in docs/cluster.md)."""
        geo = self.geo
        traffic = {p.partition: geo.traffic(p.partition) for p in self.partitions} if geo else {}
        return {
            "cluster": {
                "id": self.layout.id,
                "partitions": self.layout.partitions,
                "replicas": self.layout.replicas,
                "nats": list(self.nats),
            },
            "partitions": [
                {
                    "partition": p.partition,
                    "owner": p.owner,
                    "epoch": p.epoch,
                    "serving": p.serving,
                    "last_seq": p.last_seq,
                    "moving_to": p.moving_to,
                    "standbys": [{"node": s.node, "applied": s.applied, "lag": s.lag} for s in p.standbys],
                    "region": p.region or None,
                    "traffic": (t.to_json() if (t := traffic.get(p.partition)) is not None else None),
                }
                for p in self.partitions
            ],
            "nodes": [
                {
                    "node": n.name,
                    "pid": n.pid,
                    "url": n.url,
                    "state": n.state,
                    "age": round(n.age, 3),
                    "serving": list(n.serving),
                    "region": n.region or None,
                    "zone": n.zone or None,
                    "applied": {str(k): v for k, v in sorted(n.applied.items())},
                }
                for n in self.nodes
            ],
            "edges": [e.to_json() for e in geo.edges] if geo else [],
            "placement": geo.policy.to_dict() if geo and geo.policy else None,
        }


def _info(node: NodeView) -> NodeInfo:
    return NodeInfo(
        node.name,
        node.incarnation,
        node.url,
        node.pid,
        node.applied,
        frozenset(node.serving),
        frozenset(node.draining),
        region=node.region,
        zone=node.zone,
    )


@dataclass(frozen=True, slots=True)
class BucketEntry:
    value: bytes
    revision: int
    created: datetime.datetime  # when JetStream stored it


async def read_bucket(js: JetStreamContext, name: str) -> dict[str, BucketEntry]:
    """The current entries of a KV bucket (deleted keys left out), with JetStream's time stamps; an empty
    dict for a bucket that does not exist.

    Read from the bucket's stream (its subjects, then the last message of each), not with a KV watch:
    nats-py's watch may signal "no more values" before the values it already received (it compares the
    consumer's pending count with what its callback has handled), so a one-shot read could come back
    empty."""
    stream = f"KV_{name}"
    prefix = f"$KV.{name}."
    try:
        info = await js.stream_info(stream, subjects_filter=f"{prefix}>")
    except NotFoundError:
        return {}
    entries: dict[str, BucketEntry] = {}
    for subject in sorted(info.state.subjects or {}):
        try:
            msg = await js.get_last_msg(stream, subject)
        except NotFoundError:  # expired or deleted since the listing
            continue
        operation = (msg.headers or {}).get("KV-Operation")
        if operation in ("DEL", "PURGE") or msg.data is None:
            continue
        created = msg.time if msg.time is not None else datetime.datetime.now(datetime.UTC)
        entries[subject[len(prefix) :]] = BucketEntry(msg.data, msg.seq or 0, created)
    return entries


async def read_view(
    js: JetStreamContext, layout: ClusterLayout, nats: tuple[str, ...] = (), *, geo: bool = False
) -> ClusterView:
    """The cluster now (with `geo`, its geography too). Raises TimeoutError (or a NATS error) when
    JetStream does not answer in time."""
    owners = await read_bucket(js, layout.owners_bucket)
    heartbeats = await read_bucket(js, layout.nodes_bucket)
    now = datetime.datetime.now(datetime.UTC)
    nodes: list[NodeView] = []
    for key, entry in sorted(heartbeats.items()):
        try:
            info = NodeInfo.from_json(entry.value)
        except RecordError:
            continue
        age = max(0.0, (now - entry.created).total_seconds())
        nodes.append(
            NodeView(
                key,
                info.pid,
                info.url,
                info.incarnation,
                age,
                tuple(sorted(info.serving)),
                info.applied,
                info.region,
                info.zone,
                tuple(sorted(info.draining)),
            )
        )
    by_name = {n.name: n for n in nodes}
    assignments: dict[int, Assignment] = {}
    partitions: list[PartitionView] = []
    for partition in range(layout.partitions):
        assignment = _assignment(owners.get(assignment_key(partition)))
        if assignment is not None:
            assignments[partition] = assignment
        last_seq = await _last_seq(js, layout.stream(partition))
        owner = by_name.get(assignment.node) if assignment is not None else None
        serving = (
            assignment is not None
            and owner is not None
            and owner.alive
            and owner.incarnation == assignment.incarnation
            and partition in owner.serving
        )
        standbys = tuple(
            Standby(
                n.name, n.applied[partition], None if last_seq is None else last_seq - n.applied[partition]
            )
            for n in nodes
            if n.alive and partition in n.applied and (assignment is None or n.name != assignment.node)
        )
        partitions.append(
            PartitionView(
                partition,
                assignment.node if assignment is not None else None,
                assignment.epoch if assignment is not None else None,
                serving,
                last_seq,
                standbys,
                _move_target(owners.get(move_key(partition))),
                owner.region if owner is not None else "",
            )
        )
    geography = await read_geography(js, layout) if geo else None
    return ClusterView(layout, nats, partitions, nodes, assignments, geography)


async def read_geography(js: JetStreamContext, layout: ClusterLayout) -> Geography:
    """The edges' reports (an unreadable one left out: another version's) and the placement policy."""
    now = datetime.datetime.now(datetime.UTC)
    edges: list[EdgeView] = []
    for _key, entry in sorted((await read_bucket(js, layout.edges_bucket)).items()):
        try:
            report = EdgeReport.from_json(entry.value)
        except RecordError:
            continue
        edges.append(EdgeView(report, max(0.0, (now - entry.created).total_seconds())))
    try:
        policy, history = await read_placement(js, layout)
    except (PolicyError, LayoutError) as exc:  # the rest of the view is still worth showing
        return Geography(edges, None, (), str(exc))
    return Geography(edges, policy, history)


def _assignment(entry: BucketEntry | None) -> Assignment | None:
    if entry is None:
        return None
    try:
        return Assignment.from_json(entry.value)
    except RecordError:
        return None


def _move_target(entry: BucketEntry | None) -> str | None:
    if entry is None:
        return None
    try:
        node = json.loads(entry.value)["node"]
    except (ValueError, TypeError, KeyError):
        return None
    return node if isinstance(node, str) else None


async def _last_seq(js: JetStreamContext, stream: str) -> int | None:
    try:
        info = await js.stream_info(stream)
    except (NotFoundError, NatsTimeoutError, TimeoutError):
        return None
    return int(info.state.last_seq)


def recorded_nats_urls(data_dir: Path) -> list[str] | None:
    """The client URLs of the JetStream servers `strictq cluster up` started in `data_dir`, from the ports
    it recorded (cluster.nats_servers); None when there is no readable record. Read without starting or
    writing anything."""
    try:
        data = json.loads((data_dir / NATS_DIR / PORTS_FILE).read_bytes())
        host = str(data["host"])
        ports = [int(server["client"]) for server in data["servers"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    shown = f"[{host}]" if ":" in host else host
    return [f"nats://{shown}:{port}" for port in ports]
