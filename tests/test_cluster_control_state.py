"""One control state for a whole cluster (issue 27): fences kept in the cluster's control bucket
(cluster.control_state, cluster.control_fences), so a fence set through any edge, or written into the
bucket by failure management, is listed at every edge and emitted on every edge's control stream.

Two layers, both over real JetStream: two edges' ControlHubs in this process over one NATS server (every
race: compare-and-set, echoes, expiry at both edges, the decider's direct writes, a legacy fences.json),
then two `strictq serve --cluster` edges over a `strictq cluster up` cluster, through their HTTP APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from cluster_support import Cluster, nats_client, run, running_nats, start_cluster
from control_stream_support import admin_call, open_stream
from control_support import proxy_control
from kit.process import ChildProcess, launch, strictq
from kit.until import until
from proxy_support import ProxyProcess, WorkerClient, running_proxy

from cluster.connect import credentials_path
from cluster.control_fences import ClusterFenceRegistry
from cluster.control_state import (
    control_bucket,
    create_control_bucket,
    decode_fence,
    encode_fence,
    fence_key,
    fence_worker,
)
from cluster.floors import ClusterFloors
from cluster.layout import ClusterLayout, LayoutError
from cluster.nats_servers import NatsCluster
from fencing.context import PROXY_ACTION_HEADER
from gateway.rate_limits import TenantLimit, TenantRateLimiter
from queue_core.control import ControlHub, Subscription
from queue_core.fences import FILE_VERSION, Fence, NotFenced
from strictq.cluster_limits import ClusterLimits

WITHIN = 10.0  # bound of every wait (the watch delivers in milliseconds); never a timing assertion


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with running_nats(tmp_path_factory.mktemp("control-nats"), 1) as cluster:
        yield cluster


class EdgeHub:
    """One edge's control side as `strictq serve --cluster` builds it: registry, floors, hub, a stream."""

    def __init__(self, hub: ControlHub, registry: ClusterFenceRegistry) -> None:
        self.hub = hub
        self.registry = registry
        self.stream: Subscription = hub.subscribe()
        assert b"event: synced" in self.stream.catch_up  # a snapshot, then live events only

    async def event(self) -> tuple[str, dict[str, Any]]:
        """The next event of the stream (bounded); keepalives skipped."""
        async with asyncio.timeout(WITHIN):
            while True:
                frame = await self.stream.next(WITHIN)
                if frame is not None:
                    return parse(frame)

    def quiet(self) -> bool:
        """No event waiting on the stream (what a double event would leave)."""
        return self.stream._queue.empty()


def parse(frame: bytes) -> tuple[str, dict[str, Any]]:
    fields = dict(line.split(": ", 1) for line in frame.decode().strip().splitlines())
    return fields["event"], orjson.loads(fields["data"])


@contextlib.asynccontextmanager
async def edge_hub(nats: NatsCluster, layout: ClusterLayout, data_dir: Path) -> AsyncIterator[EdgeHub]:
    async with nats_client(nats, "edge") as nc:
        registry = ClusterFenceRegistry(nc.jetstream(), layout, data_dir / "fences.json")
        await registry.start()
        floors = ClusterFloors(nc, layout)
        await floors.start()
        hub = ControlHub(floors, registry)
        await hub.start()
        try:
            yield EdgeHub(hub, registry)
        finally:
            await hub.close()
            await floors.close()
            await registry.close()


async def new_cluster(nats: NatsCluster) -> ClusterLayout:
    """A fresh cluster id over the shared servers (a bucket of its own: tests do not see one another's
    state), with its control bucket made as its queue servers would."""
    layout = ClusterLayout(secrets.token_hex(4), 1, 1)
    async with nats_client(nats, "node") as nc:
        await create_control_bucket(nc.jetstream(), layout)
    return layout


@contextlib.asynccontextmanager
async def two_edges(nats: NatsCluster, base: Path) -> AsyncIterator[tuple[EdgeHub, EdgeHub, ClusterLayout]]:
    """Two edges over a new cluster."""
    layout = await new_cluster(nats)
    (base / "e1").mkdir(mode=0o700)
    (base / "e2").mkdir(mode=0o700)
    async with edge_hub(nats, layout, base / "e1") as one, edge_hub(nats, layout, base / "e2") as two:
        yield one, two, layout


def workers(edge: EdgeHub) -> dict[str, str]:
    return {fence.worker: fence.mode for fence in edge.hub.fences()}


# ------------------------------------------------------------------------------------- the contract
def test_the_key_and_value_contract() -> None:
    """What the failure-management decider writes: `fence.<urlsafe base64, no padding>`, Fence JSON."""
    assert fence_key("worker-1") == "fence.d29ya2VyLTE"
    assert fence_worker(fence_key("w/ü 1")) == "w/ü 1"
    assert fence_worker("limits") is None
    fence = Fence("worker-1", "mimic", "flaky", 10.0, 70.0)
    assert orjson.loads(encode_fence(fence)) == fence.to_dict()
    assert decode_fence(encode_fence(fence)) == fence
    assert ClusterLayout("ab12cd34", 3, 3).control_bucket == "strictq_control_ab12cd34"


# ------------------------------------------------------------------------------------- two edges
async def test_a_fence_through_one_edge_is_in_force_at_the_other(nats: NatsCluster, tmp_path: Path) -> None:
    async with two_edges(nats, tmp_path) as (one, two, _):
        fence = await two.hub.fence("worker-1", "block", "double charges", ttl=600)
        assert await two.event() == ("fence", fence.to_dict())  # once: its echo from the watch is silent
        assert await one.event() == ("fence", fence.to_dict())
        assert one.hub.fences() == [fence]

        await one.hub.unfence("worker-1", "operator")
        assert await one.event() == ("unfence", {"worker": "worker-1", "reason": "operator"})
        assert await two.event() == ("unfence", {"worker": "worker-1", "reason": "lifted"})
        assert two.hub.fences() == []
        with pytest.raises(NotFenced):
            await two.hub.unfence("worker-1")
        assert one.quiet() and two.quiet()


async def test_concurrent_fences_through_both_edges_all_survive(nats: NatsCluster, tmp_path: Path) -> None:
    async with two_edges(nats, tmp_path) as (one, two, _):
        await asyncio.gather(
            one.hub.fence("worker-a", "block", "a"),
            two.hub.fence("worker-b", "mimic", "b"),
        )
        wanted = {"worker-a": "block", "worker-b": "mimic"}
        await until(lambda: workers(one) == wanted and workers(two) == wanted, WITHIN, what="both fences")
        # The same worker through both at once: compare-and-set makes one win everywhere, none lost halfway.
        await asyncio.gather(
            one.hub.fence("worker-c", "block", "from one"),
            two.hub.fence("worker-c", "mimic", "from two"),
        )
        await until(lambda: one.registry.get("worker-c") == two.registry.get("worker-c"), WITHIN)
        async with nats_client(nats) as nc:
            bucket = await control_bucket(nc.jetstream(), one.registry._layout)
            stored = decode_fence((await bucket.get(fence_key("worker-c"))).value or b"")
        assert one.registry.get("worker-c") == stored


async def test_an_expired_fence_is_lifted_once_at_each_edge(nats: NatsCluster, tmp_path: Path) -> None:
    async with two_edges(nats, tmp_path) as (one, two, _):
        await one.hub.fence("worker-1", "block", "for a moment", ttl=0.3)
        assert (await one.event())[0] == "fence"
        assert (await two.event())[0] == "fence"
        for edge in (one, two):
            assert await edge.event() == ("unfence", {"worker": "worker-1", "reason": "expired"})
        assert one.hub.fences() == [] and two.hub.fences() == []
        await one.hub.fence("worker-2", "block", "after")  # the next event is this one: no second unfence
        for edge in (one, two):
            assert (await edge.event())[1]["worker"] == "worker-2"


async def test_fences_written_into_the_bucket_directly_are_emitted(nats: NatsCluster, tmp_path: Path) -> None:
    """The failure-management decider writes the bucket itself, per the contract."""
    async with two_edges(nats, tmp_path) as (one, two, layout), nats_client(nats, "decider") as nc:
        bucket = await control_bucket(nc.jetstream(), layout)
        fence = Fence("worker-9", "mimic", "unhealthy", 1.0e9)
        await bucket.create(fence_key("worker-9"), encode_fence(fence))
        for edge in (one, two):
            assert await edge.event() == ("fence", fence.to_dict())
        await bucket.put(fence_key("worker-9"), b"not json")  # an unreadable value changes nothing
        await bucket.delete(fence_key("worker-9"))
        for edge in (one, two):
            assert await edge.event() == ("unfence", {"worker": "worker-9", "reason": "lifted"})
            assert edge.hub.fences() == []


async def test_a_legacy_fences_file_is_migrated_into_the_bucket(nats: NatsCluster, tmp_path: Path) -> None:
    layout = await new_cluster(nats)
    old = Fence("worker-1", "block", "from before", 5.0)
    legacy = tmp_path / "fences.json"
    legacy.write_bytes(orjson.dumps({"version": FILE_VERSION, "fences": [old.to_dict()]}))
    async with edge_hub(nats, layout, tmp_path) as edge:
        assert edge.hub.fences() == [old]
    assert not legacy.exists() and (tmp_path / "fences.json.migrated").exists()
    other = tmp_path / "other"
    other.mkdir()
    async with edge_hub(nats, layout, other) as edge:  # another edge of the cluster sees it too
        assert edge.hub.fences() == [old]


# ------------------------------------------------------------------------------------- limits
@contextlib.asynccontextmanager
async def edge_limits(
    nats: NatsCluster, layout: ClusterLayout, data_dir: Path
) -> AsyncIterator[TenantRateLimiter]:
    """One edge's limiter as `strictq serve --cluster` builds it: its limits.json read, then the cluster's."""
    limiter = TenantRateLimiter.load(data_dir / "limits.json", None)
    async with nats_client(nats, "edge") as nc:
        store = ClusterLimits(nc.jetstream(), layout, limiter, data_dir / "limits.json")
        await store.start()
        try:
            yield limiter
        finally:
            await store.close()


async def test_limits_set_at_one_edge_apply_at_the_other(nats: NatsCluster, tmp_path: Path) -> None:
    layout = await new_cluster(nats)
    one_dir, two_dir = tmp_path / "e1", tmp_path / "e2"
    one_dir.mkdir()
    two_dir.mkdir()
    legacy = TenantRateLimiter.load(one_dir / "limits.json", None)
    legacy.set("old", TenantLimit(3, 3))  # an earlier version's file at edge 1: migrated
    async with (
        edge_limits(nats, layout, one_dir) as one,
        edge_limits(nats, layout, two_dir) as two,
    ):
        assert one.overrides == two.overrides == {"old": TenantLimit(3, 3)}
        assert not (one_dir / "limits.json").exists() and (one_dir / "limits.json.migrated").exists()
        # Two tenants' limits through the two edges at once: compare-and-set keeps both.
        await asyncio.gather(one.update("t1", TenantLimit(5, 10)), two.update("t2", None))
        wanted = {"old": TenantLimit(3, 3), "t1": TenantLimit(5, 10), "t2": None}
        await until(lambda: one.overrides == wanted and two.overrides == wanted, WITHIN, what="both limits")
        assert two.limit_of("t1") == TenantLimit(5, 10)
        assert await two.reset("old") and not await two.reset("old")
        await until(lambda: "old" not in one.overrides, WITHIN, what="the limit lifted at edge 1")
        assert not (two_dir / "limits.json").exists()  # the bucket, not a file, holds an edge's limits


# ------------------------------------------------------------------------ two `strictq serve --cluster`
class Edges:
    """`strictq cluster up` (its gateway: edge 1) and a second `strictq serve --cluster` edge over it."""

    def __init__(self, cluster: Cluster, second: ChildProcess, serve_args: list[str]) -> None:
        self.cluster = cluster
        self.second = second
        self.serve_args = serve_args  # `serve --cluster ... --keys ...`: another edge but for its data dir
        self.admin = cluster.credential("admin").secret

    def url(self, edge: int) -> str:
        return self.cluster.url if edge == 1 else self.second.value("strictq: listening on ") or ""

    def ca(self, edge: int) -> Path:
        return Path(self.cluster.ca if edge == 1 else self.second.value("strictq: ca ") or "")

    async def call(self, edge: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await admin_call(self.url(edge), method, path, self.admin, body, ca_file=self.ca(edge))

    async def fenced(self, edge: int) -> list[str]:
        status, body = await self.call(edge, "GET", "/admin/v1/fences")
        assert status == 200, body
        return [fence["worker"] for fence in body["fences"]]


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edges]:
    base = tmp_path_factory.mktemp("control-edges")
    cluster = start_cluster(base / "c")
    try:
        urls = run("cluster", "urls", "--data-dir", str(base / "c")).stdout.strip()
        # The edges' restricted NATS login where `cluster up` made one (NATS users per role), else its one.
        login = base / "c" / "nats" / "gateway.credentials"
        login = login if login.exists() else credentials_path(base / "c")
        serve_args = [
            "serve", "--cluster", urls, "--nats-credentials", str(login),
            "--keys", str(base / "c" / "gateway" / "keys.toml"), "--host", "127.0.0.1", "--port", "0",
            "--no-proxy", "--internal-secret", str(base / "c" / "internal.secret"),
        ]  # fmt: skip
        argv = strictq(*serve_args, "--data-dir", str(base / "edge2"))
        second: ChildProcess = launch(argv, base / "edge2.log", wait_for=("strictq: client env ",))
        try:
            yield Edges(cluster, second, serve_args)
        finally:
            second.stop()
    finally:
        cluster.process.stop()


async def test_a_fence_through_edge_2_is_listed_and_streamed_at_edge_1(edges: Edges) -> None:
    async with open_stream(edges.url(1), edges.admin, ca_file=edges.ca(1)) as stream:
        await stream.catch_up()
        body = {"mode": "block", "reason": "through edge 2"}
        status, fence = await edges.call(2, "PUT", "/admin/v1/fences/worker-1", body)
        assert status == 200, fence
        event = await stream.until("fence")
        assert event.data == fence
        assert await edges.fenced(1) == ["worker-1"]

        assert await edges.call(1, "DELETE", "/admin/v1/fences/worker-1") == (
            200,
            {"worker": "worker-1", "unfenced": True},
        )
        assert (await stream.until("unfence")).data["worker"] == "worker-1"
    await until(_none_fenced(edges, 2), WITHIN, what="the fence lifted at edge 2")


def _none_fenced(edges: Edges, edge: int) -> Any:
    async def check() -> bool:
        return await edges.fenced(edge) == []

    return check


async def test_concurrent_fences_through_both_edges_are_both_kept(edges: Edges) -> None:
    body = {"mode": "mimic", "reason": "both"}
    answers = await asyncio.gather(
        edges.call(1, "PUT", "/admin/v1/fences/worker-2", body),
        edges.call(2, "PUT", "/admin/v1/fences/worker-3", body),
    )
    assert [status for status, _ in answers] == [200, 200], answers

    async def both_everywhere() -> bool:
        return [await edges.fenced(edge) for edge in (1, 2)] == [["worker-2", "worker-3"]] * 2

    await until(both_everywhere, WITHIN, what="both fences at both edges")
    for worker in ("worker-2", "worker-3"):
        assert (await edges.call(2, "DELETE", f"/admin/v1/fences/{worker}"))[0] == 200


async def test_limits_set_through_edge_1_are_in_force_at_edge_2(edges: Edges) -> None:
    tenant = edges.cluster.credential("producer").tenant
    status, body = await edges.call(1, "PUT", f"/admin/v1/limits/{tenant}", {"rate": 7, "burst": 9})
    assert status == 200, body

    async def at_edge_2() -> Any:
        status, body = await edges.call(2, "GET", "/admin/v1/limits")
        assert status == 200, body
        return next((t["limit"] for t in body["tenants"] if t["tenant"] == tenant), None)

    assert await until(at_edge_2, WITHIN, what="the limit at edge 2") == {"rate": 7.0, "burst": 9.0}
    assert (await edges.call(2, "DELETE", f"/admin/v1/limits/{tenant}"))[0] == 200

    async def lifted_at_edge_1() -> bool:
        return await _limit_is_default(edges, 1, tenant)

    await until(lifted_at_edge_1, WITHIN, what="the limit lifted at edge 1")


async def _limit_is_default(edges: Edges, edge: int, tenant: str) -> bool:
    status, body = await edges.call(edge, "GET", "/admin/v1/limits")
    assert status == 200, body
    return any(t["tenant"] == tenant and t["source"] == "default" for t in body["tenants"])


async def test_a_proxy_following_edge_1_refuses_a_worker_fenced_through_edge_2(
    edges: Edges, tmp_path: Path
) -> None:
    worker = edges.cluster.credential("worker")
    keys = Path(edges.cluster.process.value("strictq: keys ") or "")
    control = ("--control", edges.url(1), "--control-ca", str(edges.ca(1)))
    with running_proxy(tmp_path / "proxy", *control, keys=keys) as proxy:
        await until(_proxy_synced(proxy), WITHIN, what="the proxy synchronised with edge 1")
        status, body = await edges.call(
            2, "PUT", f"/admin/v1/fences/{worker.id}", {"mode": "block", "reason": "fenced at edge 2"}
        )
        assert status == 200, body
        async with WorkerClient(proxy, worker.id, secret=worker.secret) as client:

            async def refused() -> bool:
                reply = await client.call("GET", "http://127.0.0.1:9/charge")  # no server: never reached
                return reply.status == 403 and reply.headers.get(PROXY_ACTION_HEADER) == "block"

            await until(refused, WITHIN, what="the proxy refusing the fenced worker")
        assert (await edges.call(2, "DELETE", f"/admin/v1/fences/{worker.id}"))[0] == 200


def _proxy_synced(proxy: ProxyProcess) -> Any:
    async def synced() -> bool:
        return bool((await proxy_control(proxy.admin_url))["synced"])

    return synced


def test_a_damaged_legacy_fences_file_stops_an_edge_in_one_line(edges: Edges, tmp_path: Path) -> None:
    data_dir = tmp_path / "edge"
    data_dir.mkdir(mode=0o700)
    (data_dir / "fences.json").write_text("{not json")
    result = run(*edges.serve_args, "--data-dir", str(data_dir))
    assert result.returncode == 2, result
    assert "fences.json" in result.stderr and "malformed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert (data_dir / "fences.json").exists()  # left as it was, for the operator to fix


async def test_an_edge_waits_for_the_queue_servers_bucket_then_says_who_makes_it(nats: NatsCluster) -> None:
    layout = ClusterLayout(secrets.token_hex(4), 1, 1)  # no queue server made its bucket
    async with nats_client(nats, "edge") as nc:
        with pytest.raises(LayoutError, match="its queue servers create it"):
            await control_bucket(nc.jetstream(), layout, within=0.5)
