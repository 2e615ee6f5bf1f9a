"""An edge's traffic measurement and region-aware routing (cluster/traffic.py, cluster/backend.py).

The meter on a fake clock (rates over the sliding window, buckets expiring, latency quantiles, bounded
memory), the report's JSON and its refusals, the planner's aggregates; then the cluster backend over three
real queue servers (a StaticOwnerMap naming each one's node and region): sends recorded by partition and
trusted client region, `reach` rewriting (through a real delaying relay), a worker offered its region's
partitions first; and the publisher putting a report into a real JetStream edges bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextvars import Token
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
from cluster_support import nats1, nats_client
from conftest import ServerProcess, running_servers, start_server
from kit.clock import FakeClock
from kit.secret import internal_secret
from kit.until import until
from nats.js.errors import KeyNotFoundError

from cluster.backend import ClusterBackend
from cluster.geo import CLIENT_REGION, ClientRegion, Source
from cluster.kv_owners import KvOwnerMap
from cluster.layout import ensure_layout, ensure_streams
from cluster.nats_servers import NatsCluster
from cluster.owners import StaticOwnerMap
from cluster.ownership import NodeInfo, RecordError
from cluster.traffic import (
    LATENCY_SAMPLES,
    MAX_REGIONS,
    EdgeIdentity,
    EdgePublisher,
    EdgeReport,
    NodeLatency,
    PartitionTraffic,
    TrafficMeter,
    demand,
    latency,
)
from cluster.wan import DelayRelay
from queue_core.machine import SendRequest, SendResult
from queue_core.machine.groups import partition_of

__all__ = ["nats1"]  # the fixture, imported for pytest

P = 3
NODES = ["n0", "n1", "n2"]
REGIONS = ["eu", "us", "ap"]
EDGE = EdgeIdentity("edge-us-1", "us", "us-1", "http://127.0.0.1:9")
names = itertools.count()


# ---------------------------------------------------------------------------------------- the meter
def test_rates_are_messages_per_second_over_the_window_by_partition_and_region() -> None:
    clock = FakeClock()
    meter = TrafficMeter(EDGE, window=10.0, clock=clock)
    clock.advance(10.0)  # a full window since the start: rates are over the whole window
    meter.record_send(0, "us", 30, 0.004, owner="n0")
    clock.advance(1.0)
    meter.record_send(0, "us", 10, 0.006, owner="n0")
    meter.record_send(0, "eu", 5, 0.010)
    meter.record_send(1, "", 20, None)  # a failed call: demand, but no latency sample
    assert meter.rates() == {0: {"us": 4.0, "eu": 0.5}, 1: {"": 2.0}}
    report = meter.report(at=1234.5)
    assert (report.edge, report.region, report.zone, report.at, report.window) == (
        "edge-us-1",
        "us",
        "us-1",
        1234.5,
        10.0,
    )
    assert report.partitions[0] == PartitionTraffic({"us": 4.0, "eu": 0.5}, 45, 6.0, 10.0, "n0")
    assert report.partitions[1] == PartitionTraffic({"": 2.0}, 20, None, None, "")


def test_a_young_meter_divides_by_the_seconds_it_has_seen() -> None:
    clock = FakeClock()
    meter = TrafficMeter(EDGE, window=60.0, clock=clock)
    clock.advance(4.0)
    meter.record_send(2, "ap", 8, 0.001)
    assert meter.rates() == {2: {"ap": 2.0}}


def test_buckets_expire_with_the_window_but_send_counts_stay() -> None:
    clock = FakeClock()
    meter = TrafficMeter(EDGE, window=5.0, clock=clock)
    clock.advance(5.0)
    meter.record_send(0, "eu", 10, 0.002)
    clock.advance(3.0)
    meter.record_send(0, "eu", 5, 0.003)
    assert meter.rates() == {0: {"eu": 3.0}}
    clock.advance(3.0)  # the first bucket is out of the window, the second is in
    assert meter.rates() == {0: {"eu": 1.0}}
    assert meter.report(0.0).partitions[0].p50_ms == 3.0
    clock.advance(10.0)
    report = meter.report(0.0)
    assert meter.rates() == {}
    assert report.partitions[0] == PartitionTraffic({}, 15, None, None, "")


def test_latency_quantiles_are_p50_and_p99_of_the_windows_samples() -> None:
    clock = FakeClock()
    meter = TrafficMeter(EDGE, window=60.0, clock=clock)
    for ms in range(100, 0, -1):  # 100 samples, 1..100 ms, in no particular order
        meter.record_send(1, "us", 1, ms / 1000.0)
    traffic = meter.report(0.0).partitions[1]
    assert (traffic.p50_ms, traffic.p99_ms, traffic.sends) == (50.0, 99.0, 100)


def test_memory_stays_bounded_however_long_and_wide_the_traffic() -> None:
    clock = FakeClock()
    meter = TrafficMeter(EDGE, window=5.0, clock=clock)
    for second in range(2000):
        clock.advance(1.0)
        meter.record_send(second % P, f"r{second}", 1, 0.001)
    assert len(meter._buckets) <= 6
    assert all(len(ring) <= LATENCY_SAMPLES for ring in meter._latency.values())
    assert all(len(regions) <= MAX_REGIONS + 1 for regions in meter._regions.values())
    rates = meter.rates()
    assert set(rates) == set(range(P))
    assert all(set(by_region) == {""} for by_region in rates.values())  # past the cap: counted as unknown


def test_node_rtt_is_the_median_of_the_last_probes_and_a_silent_node_is_forgotten() -> None:
    clock = FakeClock()
    meter = TrafficMeter(EDGE, window=5.0, clock=clock)
    for ms in [500.0] * 20 + [1.0, 2.0, 3.0, 40.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]:
        meter.record_rtt("n1", "eu", ms / 1000.0)
    meter.record_rtt("n2", "ap", 0.2)
    assert meter.report(0.0).nodes == {"n1": NodeLatency("eu", 6.5), "n2": NodeLatency("ap", 200.0)}
    clock.advance(8.0)
    meter.record_rtt("n2", "ap", 0.1)
    clock.advance(8.0)
    assert meter.report(0.0).nodes == {"n2": NodeLatency("ap", 150.0)}


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TrafficMeter(EDGE, window=0.0)


# ---------------------------------------------------------------------------------------- the report
def sample_report(edge: str = "edge-eu", region: str = "eu") -> EdgeReport:
    return EdgeReport(
        edge,
        region,
        f"{region}-1",
        "https://edge.example:8443",
        1_700_000_000.25,
        60.0,
        {
            0: PartitionTraffic({"eu": 1.5, "": 0.25}, 99, 3.5, None, "n0"),
            2: PartitionTraffic({}, 0, None, None, ""),
        },
        {"n0": NodeLatency("eu", 0.8), "n1": NodeLatency("us", 81.25)},
    )


def test_a_report_round_trips_through_json() -> None:
    report = sample_report()
    assert EdgeReport.from_json(report.to_json()) == report
    assert orjson.loads(report.to_json())["partitions"]["0"]["rates"] == {"eu": 1.5, "": 0.25}


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"region": "eu"}',
        orjson.dumps({**orjson.loads(sample_report().to_json()), "at": "yesterday"}),
        orjson.dumps({**orjson.loads(sample_report().to_json()), "partitions": {"x": {}}}),
        orjson.dumps(
            {**orjson.loads(sample_report().to_json()), "partitions": {"0": {"rates": {"eu": "1"}}}}
        ),
        orjson.dumps({**orjson.loads(sample_report().to_json()), "nodes": {"n0": {"region": "eu"}}}),
        orjson.dumps({**orjson.loads(sample_report().to_json()), "window": True}),
    ],
)
def test_an_unreadable_report_is_a_record_error(raw: bytes) -> None:
    with pytest.raises(RecordError, match="unreadable edge report"):
        EdgeReport.from_json(raw)


# ---------------------------------------------------------------------------------------- aggregates
def test_demand_sums_the_edges_rates_and_drops_unknown_regions() -> None:
    eu = sample_report("edge-eu", "eu")
    us = EdgeReport(
        "edge-us",
        "us",
        "",
        "",
        0.0,
        60.0,
        {
            0: PartitionTraffic({"us": 2.0, "eu": 0.5}, 1, None, None, ""),
            1: PartitionTraffic({"": 3.0}, 1, None, None, ""),
        },
        {},
    )
    assert demand([eu, us]) == {0: {"eu": 2.0, "us": 2.0}}
    assert demand([]) == {}


def test_latency_is_the_median_per_client_region_and_node_region() -> None:
    def edge(name: str, region: str, nodes: dict[str, NodeLatency]) -> EdgeReport:
        return EdgeReport(name, region, "", "", 0.0, 60.0, {}, nodes)

    reports = [
        edge(
            "eu-1",
            "eu",
            {"a": NodeLatency("eu", 1.0), "b": NodeLatency("us", 80.0), "x": NodeLatency("", 5.0)},
        ),
        edge("eu-2", "eu", {"a": NodeLatency("eu", 3.0), "b": NodeLatency("us", 90.0)}),
        edge("eu-3", "eu", {"b": NodeLatency("us", 100.0), "c": NodeLatency("us", 84.0)}),
        edge("us-1", "us", {"a": NodeLatency("eu", 82.0), "b": NodeLatency("us", 0.5)}),
        edge("nowhere", "", {"a": NodeLatency("eu", 7.0)}),
    ]
    assert latency(reports) == {
        ("eu", "eu"): 2.0,
        ("eu", "us"): 87.0,
        ("us", "eu"): 82.0,
        ("us", "us"): 0.5,
    }


# ---------------------------------------------------------------------------------------- the backend
@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with running_servers(tmp_path_factory.mktemp("traffic"), P) as started:
        yield started


@contextlib.asynccontextmanager
async def cluster(
    servers: list[ServerProcess], meter: TrafficMeter | None = None, reach: dict[str, str] | None = None
) -> AsyncIterator[ClusterBackend]:
    owners = StaticOwnerMap([s.url for s in servers], nodes=NODES, regions=REGIONS)
    backend = ClusterBackend(
        owners, retry_budget=0.5, probe_interval=0.1, meter=meter, reach=reach, secret=internal_secret()
    )
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@contextlib.contextmanager
def calling_from(region: str, source: Source) -> Iterator[None]:
    token: Token[ClientRegion | None] = CLIENT_REGION.set(ClientRegion(region, source))
    try:
        yield
    finally:
        CLIENT_REGION.reset(token)


def queue_name() -> str:
    return f"tq{next(names)}-{time.time_ns() % 10**9}"


def group_in(partition: int, tag: str) -> str:
    return next(g for i in itertools.count() if partition_of(g := f"{tag}{i}", P) == partition)


async def test_sends_are_recorded_per_partition_under_the_trusted_client_region(
    servers: list[ServerProcess],
) -> None:
    queue = queue_name()
    meter = TrafficMeter(EDGE, window=60.0)
    async with cluster(servers, meter) as backend:
        await backend.create_queue(queue)
        assert meter.report(0.0).partitions == {}  # creating a queue is no send
        with calling_from("us", "edge"):
            results = await backend.send(
                queue, [SendRequest(b"a", group=group_in(0, "g")), SendRequest(b"b", group=group_in(0, "g"))]
            )
            results += await backend.send(queue, [SendRequest(b"c", group=group_in(1, "h"))])
        with calling_from("eu", "claimed"):  # a client's own claim: not trusted, counted as unknown
            results += await backend.send(queue, [SendRequest(b"d", group=group_in(1, "h"))])
        results += await backend.send(queue, [SendRequest(b"e", group=group_in(2, "k"))])  # no region
        assert all(isinstance(r, SendResult) for r in results), results
    report = meter.report(time.time())
    assert {p: t.sends for p, t in report.partitions.items()} == {0: 2, 1: 2, 2: 1}
    assert {p: set(t.rates) for p, t in report.partitions.items()} == {0: {"us"}, 1: {"us", ""}, 2: {""}}
    assert {p: t.owner for p, t in report.partitions.items()} == {0: "n0", 1: "n1", 2: "n2"}
    assert all(t.p50_ms is not None and t.p50_ms > 0 for t in report.partitions.values())
    assert demand([report]) == {
        0: {"us": report.partitions[0].rates["us"]},
        1: {"us": report.partitions[1].rates["us"]},
    }


async def test_reach_sends_every_call_and_probe_for_a_node_through_its_url(
    servers: list[ServerProcess],
) -> None:
    queue = queue_name()
    target = urlsplit(servers[1].url)
    assert target.hostname is not None and target.port is not None
    async with DelayRelay(target.hostname, target.port, 0.005) as relay:
        via = f"http://127.0.0.1:{relay.port}"
        async with cluster(servers, reach={"n1": via}) as backend:
            assert backend._owner_url(1) == via and backend._owner_url(0) == servers[0].url
            await until(lambda: backend.healthy, what="every owner ready (n1 probed through the relay)")
            probed = relay.stats.bytes_up
            await backend.create_queue(queue)
            results = await backend.send(queue, [SendRequest(b"far", group=group_in(1, "far"))])
            assert isinstance(results[0], SendResult)
            assert relay.stats.bytes_up > probed and relay.stats.bytes_down > 0
            got = await backend.receive(queue, limit=10, worker="w")
            assert [r.body for r in got] == [b"far"]
        assert relay.stats.connections >= 1 and relay.stats.refused == 0


async def test_a_worker_is_offered_the_partitions_owned_in_its_region_first(
    servers: list[ServerProcess],
) -> None:
    queue = queue_name()
    near, far = group_in(2, "near"), group_in(0, "far")  # p2 is owned in "ap", p0 in "eu"
    async with cluster(servers) as backend:
        await backend.create_queue(queue)
        await backend.send(queue, [SendRequest(b"far", group=far)])
        await backend.send(queue, [SendRequest(b"near", group=near)])
        sources: list[Source] = ["claimed", "edge", "header", "claimed"]
        for source in sources:  # the rotation moves on every pass
            with calling_from("ap", source):
                got = await backend.receive(queue, limit=1, worker="w-ap", ttl=30.0)
            assert [r.delivery.group for r in got] == [near], (source, got)
            item = got[0].delivery
            outcomes = await backend.release(queue, [(item.message_id, item.token)])
            assert [o.status for o in outcomes] == ["ok"], outcomes
        with calling_from("eu", "edge"):
            got = await backend.receive(queue, limit=1, worker="w-eu", ttl=30.0)
        assert [r.delivery.group for r in got] == [far]
        got += await backend.receive(queue, limit=10, worker="w-any", ttl=30.0)  # no region: everything
        assert sorted(r.body for r in got) == [b"far", b"near"]


# ---------------------------------------------------------------------------------------- publishing
async def test_the_publisher_puts_a_readable_report_into_the_edges_bucket(
    nats1: NatsCluster, tmp_path: Path
) -> None:
    node = start_server(tmp_path / "node")
    try:
        target = urlsplit(node.url)
        assert target.hostname is not None and target.port is not None
        async with (
            nats_client(nats1) as nc,
            DelayRelay(target.hostname, target.port, 0.002) as relay,
        ):
            js = nc.jetstream()
            layout = await ensure_layout(js, 1, 1)
            await ensure_streams(js, layout)
            await js.delete_key_value(layout.edges_bucket)  # an edge may start before any node made it
            nodes = await js.key_value(layout.nodes_bucket)
            record = NodeInfo("n1", "inc-1", "http://127.0.0.1:9", 1, region="eu", zone="eu-1")

            async def heartbeat() -> None:
                while True:
                    await nodes.put("n1", record.to_json())
                    await asyncio.sleep(0.3)

            beating = asyncio.create_task(heartbeat())
            owners = KvOwnerMap(js, layout)
            await owners.start()
            meter = TrafficMeter(EDGE, window=60.0)
            meter.record_send(0, "us", 3, 0.004, owner="n1")
            # the announced URL refuses connections: only `reach` gets to the node
            publisher = EdgePublisher(
                js, layout, meter, owners, None, {"n1": f"http://127.0.0.1:{relay.port}"}, every=0.1
            )
            await publisher.start()
            try:
                await until(lambda: "n1" in owners.nodes(), what="the node's heartbeat")
                await asyncio.sleep(0.3)  # a few ticks without the bucket: no error comes out
                assert publisher.published == 0
                await ensure_streams(js, layout)
                edges = await js.key_value(layout.edges_bucket)

                async def published() -> EdgeReport | None:
                    try:
                        entry = await edges.get(EDGE.name)
                    except KeyNotFoundError:
                        return None
                    report = EdgeReport.from_json(entry.value or b"")
                    return report if "n1" in report.nodes else None

                report = await until(published, what="a report with the node's RTT")
                assert (report.edge, report.region, report.zone) == (EDGE.name, "us", "us-1")
                assert report.nodes["n1"].region == "eu" and report.nodes["n1"].rtt_ms > 0
                assert set(report.partitions[0].rates) == {"us"} and report.partitions[0].owner == "n1"
                assert abs(report.at - time.time()) < 60
                assert relay.stats.connections >= 1
                assert latency([report]) == {("us", "eu"): report.nodes["n1"].rtt_ms}
            finally:
                await publisher.close()
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
                await owners.close()
            with pytest.raises(KeyNotFoundError):
                await edges.get(EDGE.name)  # deleted on close, not left for the TTL
    finally:
        node.stop()
