"""What an edge (a cluster gateway) sees of its traffic: where each partition's sends come from, how long
its calls to the owners take, and how far each node is; published to the edges bucket for placement.

`TrafficMeter` counts in one-second buckets over a sliding window (memory bounded by the window, the
partitions and a cap on distinct client regions; latency samples in fixed rings), on a monotonic clock;
only a report's `at` is wall time, for whoever reads it elsewhere. `EdgePublisher` probes every live
node's `/readyz` (the round trip this edge has to it) and puts the meter's report under the edge's name
in `layout.edges_bucket` each `every` seconds (the bucket's TTL drops an edge that stopped). `demand` and
`latency` turn the reports into what the planner (cluster.placement) weighs: pure functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from queue_core.operations import READYZ

from .layout import ClusterLayout
from .ownership import NodeInfo, RecordError


class NodeDirectory(Protocol):
    """The live nodes an edge probes (cluster.kv_owners.KvOwnerMap), named by what is used so this module
    does not import kv_owners (which imports master, which imports the placer, which reads reports here)."""

    def nodes(self) -> dict[str, NodeInfo]: ...


log = logging.getLogger("strictq.cluster.traffic")

LATENCY_SAMPLES = 512  # per partition: the ring p50/p99 are taken over (within the window)
RTT_SAMPLES = 10  # per node: the RTT reported is the median of the last probes
MAX_REGIONS = 64  # distinct client regions counted per partition; more are counted as unknown ("")
PROBE_TIMEOUT = 2.0  # a node that does not answer /readyz in this long gets no RTT sample this tick
LOG_EVERY = 60.0  # a failing probe or put is logged at most this often


@dataclass(frozen=True, slots=True)
class EdgeIdentity:
    """Who an edge is: its KV key (`name`), where it runs, and the URL clients reach it at."""

    name: str
    region: str = ""
    zone: str = ""
    url: str = ""


@dataclass(frozen=True, slots=True)
class PartitionTraffic:
    rates: dict[str, float]  # messages per second sent to the partition over the window, by client region
    sends: int  # messages sent to the partition through this edge since it started
    p50_ms: float | None  # edge -> owner send call latency over the window (None: no samples)
    p99_ms: float | None
    owner: str  # the node that took the last send ("" unknown)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rates": self.rates,
            "sends": self.sends,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "owner": self.owner,
        }

    @classmethod
    def from_dict(cls, data: Any) -> PartitionTraffic:
        return cls(
            {str(r): _number(v) for r, v in data["rates"].items()},
            int(data["sends"]),
            _optional(data.get("p50_ms")),
            _optional(data.get("p99_ms")),
            str(data.get("owner", "")),
        )


@dataclass(frozen=True, slots=True)
class NodeLatency:
    region: str  # the node's region ("" unknown)
    rtt_ms: float  # median round trip of this edge's last probes of the node


@dataclass(frozen=True, slots=True)
class EdgeReport:
    edge: str
    region: str
    zone: str
    url: str
    at: float  # wall time of the report
    window: float  # seconds the rates and latencies are over
    partitions: dict[int, PartitionTraffic] = field(default_factory=dict)
    nodes: dict[str, NodeLatency] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "edge": self.edge,
                "region": self.region,
                "zone": self.zone,
                "url": self.url,
                "at": self.at,
                "window": self.window,
                "partitions": {str(p): t.to_dict() for p, t in sorted(self.partitions.items())},
                "nodes": {
                    name: {"region": node.region, "rtt_ms": node.rtt_ms}
                    for name, node in sorted(self.nodes.items())
                },
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> EdgeReport:
        try:
            data = orjson.loads(raw)
            return cls(
                str(data["edge"]),
                str(data.get("region", "")),
                str(data.get("zone", "")),
                str(data.get("url", "")),
                _number(data["at"]),
                _number(data["window"]),
                {int(p): PartitionTraffic.from_dict(t) for p, t in data.get("partitions", {}).items()},
                {
                    str(name): NodeLatency(str(node.get("region", "")), _number(node["rtt_ms"]))
                    for name, node in data.get("nodes", {}).items()
                },
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"unreadable edge report: {exc!r}") from None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _optional(value: Any) -> float | None:
    return None if value is None else _number(value)


class TrafficMeter:
    """Sends and round trips one edge saw, over the last `window` seconds (`clock`: monotonic seconds)."""

    def __init__(
        self, edge: EdgeIdentity, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not window > 0:
            raise ValueError("a traffic window is a positive number of seconds")
        self.edge = edge
        self.window = float(window)
        self._clock = clock
        self._started = clock()
        # (second, {(partition, client region): messages}), oldest first; at most window + 1 of them
        self._buckets: deque[tuple[int, dict[tuple[int, str], int]]] = deque()
        self._sends: dict[int, int] = {}
        self._owners: dict[int, str] = {}
        self._latency: dict[int, deque[tuple[float, float]]] = {}  # partition -> (when, seconds)
        self._rtt: dict[str, tuple[str, float, deque[float]]] = {}  # node -> (region, last probe, rtts)
        self._regions: dict[int, set[str]] = {}  # partition -> client regions it has counted

    def record_send(
        self, partition: int, region: str, messages: int, seconds: float | None, owner: str = ""
    ) -> None:
        """One send call to `partition`'s owner carrying `messages` messages from clients in `region` ("":
        unknown or only claimed), which took `seconds` (None: it failed: counted as demand, no latency
        sample). `owner`: the node that took it, when known."""
        now = self._clock()
        self._expire(now)
        second = math.floor(now)
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append((second, {}))
        seen = self._regions.setdefault(partition, set())
        if region not in seen:
            if len(seen) >= MAX_REGIONS:
                region = ""
            seen.add(region)
        counts = self._buckets[-1][1]
        counts[(partition, region)] = counts.get((partition, region), 0) + messages
        self._sends[partition] = self._sends.get(partition, 0) + messages
        if owner:
            self._owners[partition] = owner
        if seconds is not None:
            ring = self._latency.get(partition)
            if ring is None:
                ring = self._latency[partition] = deque(maxlen=LATENCY_SAMPLES)
            ring.append((now, seconds))

    def record_rtt(self, node: str, node_region: str, seconds: float) -> None:
        """One probe's round trip to `node`."""
        entry = self._rtt.get(node)
        ring = entry[2] if entry is not None else deque(maxlen=RTT_SAMPLES)
        ring.append(seconds)
        self._rtt[node] = (node_region, self._clock(), ring)

    def forget_node(self, node: str) -> None:
        self._rtt.pop(node, None)

    def _expire(self, now: float) -> None:
        oldest = math.floor(now) - self.window
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()

    def rates(self) -> dict[int, dict[str, float]]:
        """Messages per second by partition and client region over the window (or over the time since
        the meter started, when that is shorter: a new edge is not diluted by seconds it did not see)."""
        now = self._clock()
        self._expire(now)
        span = max(1.0, min(self.window, now - self._started))
        totals: dict[int, dict[str, float]] = {}
        for _, counts in self._buckets:
            for (partition, region), messages in counts.items():
                by_region = totals.setdefault(partition, {})
                by_region[region] = by_region.get(region, 0.0) + messages
        return {p: {r: n / span for r, n in by.items()} for p, by in totals.items()}

    def report(self, at: float) -> EdgeReport:
        """The edge's report now; `at` is the wall time it is stamped with."""
        now = self._clock()
        rates = self.rates()
        partitions: dict[int, PartitionTraffic] = {}
        for partition in sorted({*rates, *self._sends}):
            samples = sorted(s for when, s in self._latency.get(partition, ()) if now - when <= self.window)
            partitions[partition] = PartitionTraffic(
                rates.get(partition, {}),
                self._sends.get(partition, 0),
                _quantile_ms(samples, 0.50),
                _quantile_ms(samples, 0.99),
                self._owners.get(partition, ""),
            )
        nodes: dict[str, NodeLatency] = {}
        for node, (region, last, ring) in list(self._rtt.items()):
            if now - last > max(self.window, 10.0):
                del self._rtt[node]  # gone from the cluster: forgotten, not reported forever
                continue
            nodes[node] = NodeLatency(region, round(statistics.median(ring) * 1000.0, 3))
        edge = self.edge
        return EdgeReport(edge.name, edge.region, edge.zone, edge.url, at, self.window, partitions, nodes)


def _quantile_ms(ordered: list[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted samples, in milliseconds."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return round(ordered[rank - 1] * 1000.0, 3)


# -------------------------------------------------------------------------------- aggregation
def demand(reports: Iterable[EdgeReport]) -> dict[int, dict[str, float]]:
    """Messages per second by partition and client region, summed over the edges; unknown regions ("")
    are dropped (the planner places by measured demand only)."""
    total: dict[int, dict[str, float]] = {}
    for report in reports:
        for partition, traffic in report.partitions.items():
            for region, rate in traffic.rates.items():
                if region and rate > 0:
                    by_region = total.setdefault(partition, {})
                    by_region[region] = by_region.get(region, 0.0) + rate
    return total


def latency(reports: Iterable[EdgeReport]) -> dict[tuple[str, str], float]:
    """(client region, node region) -> the median round trip in ms from that region's edges to the nodes
    of that region (a client is taken to be where the edge it reached is). Edges or nodes without a
    region are left out."""
    samples: dict[tuple[str, str], list[float]] = {}
    for report in reports:
        if not report.region:
            continue
        for node in report.nodes.values():
            if node.region:
                samples.setdefault((report.region, node.region), []).append(node.rtt_ms)
    return {pair: float(statistics.median(rtts)) for pair, rtts in samples.items()}


# -------------------------------------------------------------------------------- publishing
class EdgePublisher:
    """Every `every` seconds: probe each live node (through `reach`), then put the meter's report in the
    edges bucket under the edge's name. Never raises; failures are logged at most once a minute.
    `session`: the HTTP session to probe with (the backend's); None makes its own (TLS with `ca_file`)."""

    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        meter: TrafficMeter,
        owners: NodeDirectory,
        session: aiohttp.ClientSession | None = None,
        reach: Mapping[str, str] | None = None,
        every: float = 1.0,
        *,
        ca_file: str | None = None,
    ) -> None:
        self._js = js
        self.layout = layout
        self.meter = meter
        self.owners = owners
        self._session = session
        self._own_session = session is None
        self._ca_file = ca_file
        self.reach: dict[str, str] = dict(reach or {})
        self.every = every
        self._bucket: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        self._warm: set[str] = set()
        self._logged: dict[str, float] = {}
        self.published = 0  # reports put (tests and status look)

    @property
    def key(self) -> str:
        return self.meter.edge.name

    async def start(self) -> None:
        if self._session is None:
            from queue_core.remote import client_session

            self._session = client_session(self._ca_file)
        self._task = asyncio.create_task(self._run(), name="strictq-edge-publisher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._bucket is not None:  # gone now rather than at the TTL (best effort)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._bucket.delete(self.key), 2.0)
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.tick()
            await asyncio.sleep(max(0.0, self.every - (loop.time() - started)))

    async def tick(self) -> None:
        """One round: probe the nodes, publish the report."""
        try:
            nodes = self.owners.nodes()
        except Exception as exc:  # a publisher never takes the edge down
            self._log("nodes", "cannot read the cluster's nodes: %r", exc)
            nodes = {}
        await asyncio.gather(*(self._probe(name, info.url, info.region) for name, info in nodes.items()))
        await self._publish()

    async def _probe(self, node: str, url: str, region: str) -> None:
        url = self.reach.get(node, url).rstrip("/")
        try:
            if url not in self._warm:  # the first request opens the connection (TCP, TLS): not one RTT
                await self._get(url)
                self._warm.add(url)
            self.meter.record_rtt(node, region, await self._get(url))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._warm.discard(url)
            self._log(f"probe {node}", "cannot probe node %s at %s: %r", node, url, exc)

    async def _get(self, url: str) -> float:
        assert self._session is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
        async with self._session.get(url + READYZ.path, timeout=timeout) as response:
            seconds = loop.time() - started  # any answer (503 too) is a round trip
            await response.read()
        return seconds

    async def _publish(self) -> None:
        try:
            if self._bucket is None:
                self._bucket = await self._js.key_value(self.layout.edges_bucket)
            await self._bucket.put(self.key, self.meter.report(time.time()).to_json())
            self.published += 1
        except BucketNotFoundError:  # the nodes create it (cluster.layout.ensure_streams): look again
            self._log("put", "no edges bucket %s yet: retrying", self.layout.edges_bucket, level=logging.INFO)
        except Exception as exc:  # JetStream electing, a connection closing: next tick
            self._log("put", "cannot publish the edge report: %r", exc)

    def _log(self, what: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        if now - self._logged.get(what, -math.inf) >= LOG_EVERY:
            self._logged[what] = now
            log.log(level, message, *args)
