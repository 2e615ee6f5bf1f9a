"""The worker fleet through two edges of one cluster (docs/fleet.md, "In a cluster"): one `strictq cluster
up` (3 JetStream servers, 3 queue servers, R3, its gateway = edge 1) and a second `strictq serve --cluster`
(edge 2) on the same key file, both real processes over TLS; real SDK workers, the CLI and aiohttp.

The registry is the cluster's (the fleet bucket), not an edge's: a heartbeat through edge 1 is listed at
edge 2 (route and `strictq fleet`), a drain sent through edge 2 reaches an SDK worker heartbeating through
edge 1 and its acknowledgement is seen at both, a rebalancing policy set at one edge acts at the other,
and heartbeats of one worker arriving at both edges at once are all counted (compare-and-set per worker).

Every test uses workers and queues of its own, so their order does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cluster_support import Cluster, start_cluster
from kit.process import ROOT, ChildProcess, launch, strictq
from kit.until import until

from access.keys import Credential, write_keys
from strictq.sdk import ClientConfig, Message, Worker

pytestmark = [pytest.mark.xdist_group("cluster"), pytest.mark.timeout(300)]

TENANT = "dev"
CREDENTIALS = [
    Credential("admin", "fleet-admin-secret-0123456789", "admin", TENANT),
    Credential("producer", "fleet-producer-secret-0123456789", "producer", TENANT),
    *(Credential(f"fw-{i}", f"fleet-w{i}-secret-0123456789", "worker", TENANT) for i in range(1, 7)),
    Credential("proxy", "fleet-proxy-secret-0123456789", "proxy", TENANT),
    Credential("other-admin", "fleet-other-admin-secret-0123456789", "admin", "other"),
]
SECRET = {c.id: c.secret for c in CREDENTIALS}
BEAT = 0.2  # the SDK workers' heartbeat interval
WAIT = 20.0
CLIENT_ENV = "strictq: client env "


@dataclass(frozen=True)
class EdgeAt:
    """One edge of the cluster as its clients see it."""

    url: str
    ca: str

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)


@dataclass(frozen=True)
class TwoEdges:
    one: EdgeAt
    two: EdgeAt


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoEdges]:
    base = tmp_path_factory.mktemp("fleet-cluster")
    data_dir = base / "c"
    # The key file both edges (and the nodes) read, written before `cluster up`.
    os.makedirs(data_dir / "gateway", mode=0o700)
    os.chmod(data_dir, 0o700)
    keys = data_dir / "gateway" / "keys.toml"
    write_keys(keys, CREDENTIALS)
    cluster = start_cluster(data_dir)
    second: ChildProcess | None = None
    try:
        second = start_second_edge(cluster, base / "edge2", keys)
        yield TwoEdges(
            EdgeAt(cluster.url, cluster.ca),
            EdgeAt(second.value("strictq: listening on ") or "", second.value("strictq: ca ") or ""),
        )
    finally:
        if second is not None:
            second.stop()
        cluster.process.stop()


def start_second_edge(cluster: Cluster, data_dir: Path, keys: Path) -> ChildProcess:
    """`strictq serve --cluster` beside the cluster's own gateway, as docs/cluster.md shows."""
    argv = strictq(
        "serve", "--cluster", ",".join(cluster.values("strictq: nats ")),
        "--nats-credentials", str(cluster.data_dir / "nats" / "gateway.credentials"),
        "--host", "127.0.0.1", "--port", "0", "--no-proxy", "--data-dir", str(data_dir), "--keys", str(keys),
        "--internal-secret", str(cluster.data_dir / "internal.secret"),
    )  # fmt: skip
    return launch(argv, data_dir.parent / "edge2.serve.log", wait_for=(CLIENT_ENV,))


async def call(edge: EdgeAt, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=edge.context()), timeout=aiohttp.ClientTimeout(total=60)
        ) as session,
        session.request(method, edge.url + path, json=body, headers={"X-BV-API-Key": SECRET[key]}) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def beat(edge: EdgeAt, worker: str, **body: Any) -> dict[str, Any]:
    """One heartbeat of `worker` through `edge`; its answer."""
    status, answer = await call(edge, "POST", "/fleet/v1/heartbeat", worker, {"interval": 5.0, **body})
    assert status == 200, answer
    return dict(answer)


async def row_of(edge: EdgeAt, worker: str, key: str = "admin") -> dict[str, Any]:
    status, view = await call(edge, "GET", "/admin/v1/fleet", key)
    assert status == 200, view
    return next((w for w in view["workers"] if w["worker"] == worker), {})


async def control_header(edge: EdgeAt, worker: str) -> str | None:
    """The X-Strictq-Control header of an empty EmoDB poll by `worker` that declares `control`."""
    headers = {"X-BV-API-Key": SECRET[worker], "X-Strictq-Capabilities": "control"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=edge.context())) as session,
        session.get(f"{edge.url}/queue/1/fleet-prompt/poll?ttl=1&limit=1", headers=headers) as answer,
    ):
        assert answer.status == 200, await answer.text()
        return answer.headers.get("X-Strictq-Control")


def cli(edge: EdgeAt, *args: str) -> subprocess.CompletedProcess[str]:
    """`strictq ARGS` as an operator runs it against `edge`."""
    env = {
        **os.environ,
        "STRICTQ_URL": edge.url,
        "STRICTQ_CA_FILE": edge.ca,
        "STRICTQ_ADMIN_KEY": SECRET["admin"],
    }
    env.pop("STRICTQ_QUEUE_URL", None)
    return subprocess.run(
        strictq(*args),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


async def acli(edge: EdgeAt, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, edge, *args)


def idle_handler() -> Callable[[Message], Awaitable[None]]:
    async def handle(message: Message) -> None:
        return None

    return handle


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop(0.5)
        async with asyncio.timeout(WAIT):
            await task


# --------------------------------------------------------------------------------------------- tests
async def test_a_heartbeat_through_one_edge_is_listed_at_the_other(edges: TwoEdges) -> None:
    await beat(
        edges.one, "fw-1", queues=["fleet-listed"], version="2.1.0", load={"in_flight": 1, "concurrency": 4}
    )
    row = await row_of(edges.two, "fw-1")  # the next read at the other edge: no wait
    assert row["version"] == "2.1.0" and row["queues"] == ["fleet-listed"], row
    assert row["load"]["in_flight"] == 1 and row["state"] == "active" and not row["stale"]
    shown = await acli(edges.two, "fleet")
    assert shown.returncode == 0, shown.stderr
    assert "fw-1" in shown.stdout and "2.1.0" in shown.stdout and "fleet-listed" in shown.stdout
    # Scoped as in one process: another tenant's admin does not see the worker.
    assert await row_of(edges.two, "fw-1", key="other-admin") == {}


async def test_a_drain_sent_through_edge_2_reaches_a_worker_at_edge_1(edges: TwoEdges) -> None:
    one = edges.one
    config = ClientConfig(url=one.url, ca_file=one.ca, worker_id="fw-2", worker_secret=SECRET["fw-2"])
    worker = Worker("fleet-drain", idle_handler(), config=config, fleet_interval=BEAT, version="1.0")
    async with running(worker):
        await until(lambda: row_of(edges.two, "fw-2"), WAIT, what="w2 listed at edge 2")
        sent = await acli(edges.two, "control", "drain", "--worker", "fw-2")
        assert sent.returncode == 0, sent.stderr
        await until(
            lambda: worker.fleet is not None and worker.fleet.state == "drained", WAIT, what="w2 drained"
        )

        async def drained_at(edge: EdgeAt) -> bool:
            row = await row_of(edge, "fw-2")
            return row.get("state") == "drained" and row.get("desired") == "drained" and not row["pending"]

        await until(lambda: drained_at(edges.one), WAIT, what="drained, as edge 1 lists it")
        await until(lambda: drained_at(edges.two), WAIT, what="drained, as edge 2 lists it")


async def test_a_control_waits_for_its_worker_at_whichever_edge_it_beats(edges: TwoEdges) -> None:
    status, issued = await call(
        edges.two,
        "POST",
        "/admin/v1/fleet/control",
        "admin",
        {"kind": "config", "args": {"concurrency": 3}, "workers": ["fw-3"]},
    )
    assert status == 200, issued
    (control,) = issued["controls"]
    assert (await row_of(edges.one, "fw-3"))["state"] == "unknown"  # never beat: listed with its control
    # Prompt delivery at the other edge: a poll declaring `control` is told a control waits.
    assert await until(lambda: control_header(edges.one, "fw-3"), WAIT, what="X-Strictq-Control") == "pending"
    answer = await beat(edges.one, "fw-3", queues=["fleet-config"])
    assert [c["id"] for c in answer["controls"]] == [control["id"]]
    again = await beat(edges.two, "fw-3", queues=["fleet-config"])  # not acknowledged: delivered again
    assert [c["id"] for c in again["controls"]] == [control["id"]]
    ack = {"id": control["id"], "status": "applied", "detail": "concurrency=3"}
    await beat(edges.one, "fw-3", queues=["fleet-config"], acks=[ack])
    assert (await row_of(edges.two, "fw-3"))["pending"] == []
    assert (await beat(edges.two, "fw-3", queues=["fleet-config"], acks=[ack]))["controls"] == []


async def test_a_policy_set_at_one_edge_rebalances_at_the_other(edges: TwoEdges) -> None:
    queue = "fleet-wake"
    status, _ = await call(edges.one, "POST", f"/queue/1/{queue}/send", "producer", {"n": 1})
    assert status == 200
    done = await acli(edges.one, "fleet-policy", queue, "--min-active", "0", "--wake-backlog", "1")
    assert done.returncode == 0, done.stderr
    status, view = await call(edges.two, "GET", "/admin/v1/fleet", "admin")
    assert status == 200 and view["policies"][queue]["wake_backlog"] == 1, view

    async def woken() -> list[dict[str, Any]]:  # a sleeper beating at edge 2 while a message waits
        answer = await beat(edges.two, "fw-4", queues=[queue], state="sleeping")
        return [c for c in answer["controls"] if c["kind"] == "wake"]

    (wake,) = await until(woken, WAIT, interval=0.1, what="a wake control for the sleeper")
    row = await row_of(edges.one, "fw-4")
    assert [c["issued_by"] for c in row["pending"]] == ["rebalance"] and row["desired"] == "active"
    await beat(edges.one, "fw-4", queues=[queue], acks=[{"id": wake["id"], "status": "applied"}])
    # A control addressed by queue reaches its live workers, whichever edge they beat through.
    sent = await acli(edges.two, "control", "log_level", "--queue", queue, "--set", "level=DEBUG")
    assert sent.returncode == 0, sent.stderr
    pending = (await row_of(edges.one, "fw-4"))["pending"]
    assert [(c["kind"], c["args"], c["queue"]) for c in pending] == [("log_level", {"level": "DEBUG"}, queue)]
    missing = await acli(edges.one, "control", "sleep", "--queue", "fleet-nobody-here")
    assert missing.returncode == 1 and "fleet-nobody-here" in missing.stderr, missing
    await acli(edges.two, "fleet-policy", queue, "--off")
    status, view = await call(edges.one, "GET", "/admin/v1/fleet", "admin")
    assert queue not in view["policies"]


async def test_heartbeats_arriving_at_both_edges_at_once_are_all_kept(edges: TwoEdges) -> None:
    rounds = 15
    beats = [
        beat(edge, worker, queues=["fleet-busy"], load={"polls": n})
        for n in range(rounds)
        for edge in (edges.one, edges.two)
        for worker in ("fw-5", "fw-6")
    ]
    await asyncio.gather(*beats)
    for worker in ("fw-5", "fw-6"):
        assert (await row_of(edges.one, worker))["heartbeats"] == 2 * rounds
        assert (await row_of(edges.two, worker))["heartbeats"] == 2 * rounds
