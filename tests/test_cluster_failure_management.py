"""Failure management across a cluster's partitions (docs/failure-management.md §3.2): one real
`strictq cluster up` (3 JetStream servers, 3 queue servers, a gateway edge) with sub-second health flags,
driven as the SDK drives it (EmoDB polls declaring `results, probes`, results reported) through the edge.

- A worker failing every attempt is fenced within the threshold (its groups hash to several partitions),
  shown by `strictq status` at the edge, gets no message afterwards, its groups finish on a healthy worker
  in order with nothing lost, and a probe restores it.
- A backend outage seen by several workers suspends the queue (a large-scale event) and a passing probe
  resumes it by itself.
- SIGKILL of the node holding the decider while a worker fails: another node takes the lease, the fence
  still comes, once.
- An alert rule's record in the edge's wire log (`strictq errors`) suspends the queue through the decider;
  the fleet's events (a control applied through one edge) are in the cluster's events at every edge.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cluster_support import Cluster, alive, run, start_cluster
from kit.process import ChildProcess, launch, strictq
from kit.until import until

from access.keys import KeyRing
from cluster.decider import edge_decision
from wirelog.record import event_record
from wirelog.writer import WireLogWriter

CAPABILITIES = {"X-Strictq-Capabilities": "results, probes"}
FENCE_AFTER = 3
HEALTH_FLAGS = (
    "--fence-after", str(FENCE_AFTER), "--health-window", "60", "--probe-interval", "0.3",
    "--probe-backoff-max", "0.6", "--probe-timeout", "20", "--blacklist-after", "20",
)  # fmt: skip
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = start_cluster(tmp_path_factory.mktemp("health") / "c", *HEALTH_FLAGS)
    try:
        yield running
    finally:
        running.process.stop()


class Edge:
    """EmoDB calls through the cluster's edge, with the gateway's development credentials."""

    def __init__(self, url: str, session: aiohttp.ClientSession, keys: KeyRing) -> None:
        self.url = url
        self.session = session
        self.keys = keys

    async def call(self, method: str, path: str, key: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        credential = self.keys.by_id(key)
        assert credential is not None
        headers = {
            "X-BV-API-Key": credential.secret,
            "Content-Type": "application/json",
            **kw.pop("headers", {}),
        }
        data = None if body is None else json.dumps(body).encode()
        async with self.session.request(method, self.url + path, data=data, headers=headers, **kw) as r:
            return r.status, json.loads(await r.text())

    async def ok(self, method: str, path: str, key: str, body: Any = None, **kw: Any) -> Any:
        status, data = await self.call(method, path, key, body, **kw)
        assert status == 200, (method, path, status, data)
        return data

    async def send(self, queue: str, group: str, name: str) -> None:
        await self.ok("POST", f"/queue/1/{queue}/send", "producer", {"name": name}, params={"group": group})

    async def poll(self, queue: str, worker: str, limit: int = 1, wait: float = 0.5) -> list[Any]:
        params = {"limit": str(limit), "ttl": "30", "wait": str(wait)}
        return list(
            await self.ok("GET", f"/queue/1/{queue}/poll", worker, params=params, headers=CAPABILITIES)
        )

    async def report(self, queue: str, worker: str, item: dict[str, Any], outcome: str, **extra: str) -> str:
        result = {"id": item["id"], "token": item["token"], "outcome": outcome, **extra}
        answer = await self.ok("POST", f"/queue/1/{queue}/results", worker, {"results": [result]})
        return str(answer["results"][0]["status"])

    async def status(self) -> Any:
        return await self.ok("GET", "/admin/v1/status", "admin", params={"events": "1000"})

    async def worker_state(self, worker: str) -> str:
        for entry in (await self.status())["workers"]:
            if entry["worker"] == worker:
                return str(entry["state"])
        return "healthy"

    async def events(self, kind: str, worker: str | None = None) -> list[dict[str, Any]]:
        answer = await self.ok("GET", "/admin/v1/events", "admin")
        return [
            e
            for e in answer["events"]
            if e["event"] == kind and (worker is None or e.get("worker") == worker)
        ]

    async def probe(self, queue: str, worker: str, *, held: bool = True) -> dict[str, Any]:
        """Poll until `worker` is handed a probe. A held worker (fenced, or of a suspended queue) gets
        nothing else meanwhile; a healthy one's check probe waits at one partition, so its polls of the
        others may bring real messages first: handed back untouched (`not_attempted`)."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            items = await self.poll(queue, worker)
            assert not held or all(i.get("probe") for i in items), f"{worker} got real messages: {items}"
            for item in items:
                if item.get("probe"):
                    return dict(item)
                assert await self.report(queue, worker, item, "not_attempted") == "ok"
        raise AssertionError(f"no probe for {worker} within {TIMEOUT}s")


@pytest.fixture
async def edge(cluster: Cluster) -> AsyncIterator[Edge]:
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=cluster.ca))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield Edge(cluster.url, session, KeyRing.load(keys_of(cluster)))


def keys_of(cluster: Cluster) -> Path:
    return Path(cluster.process.value("strictq: keys ") or "")


async def fail_until_fenced(edge: Edge, queue: str, worker: str, signature: str) -> int:
    """`worker` fails every message it gets until the edge's status says it is fenced; its attempts."""
    attempts = 0
    deadline = time.monotonic() + TIMEOUT
    while await edge.worker_state(worker) not in ("fenced", "probing"):
        assert time.monotonic() < deadline, f"{worker} not fenced after {attempts} failed attempts"
        for item in await edge.poll(queue, worker, wait=0.2):
            if item.get("probe"):
                continue
            status = await edge.report(queue, worker, item, "failed", reason="bug", signature=signature)
            attempts += status == "ok"
    return attempts


async def drain_in_order(
    edge: Edge, queue: str, workers: tuple[str, ...], expected: dict[str, list[str]]
) -> None:
    """`workers` succeed everything until every group's names came, each group in order, none twice (a
    failed group's retry is offered first to the worker that failed it)."""
    done: dict[str, list[str]] = {g: [] for g in expected}
    deadline = time.monotonic() + TIMEOUT
    while done != expected:
        assert time.monotonic() < deadline, f"not every message came back: {done}"
        for worker in workers:
            for item in await edge.poll(queue, worker, limit=10, wait=0.3):
                assert not item.get("probe"), item
                done[item["group"]].append(item["payload"]["name"])
                assert await edge.report(queue, worker, item, "succeeded") == "ok"
    assert done == expected


async def test_a_failing_worker_is_fenced_across_partitions_and_a_probe_restores_it(
    edge: Edge, cluster: Cluster
) -> None:
    queue = "jobs"
    expected = {f"g{i}": [f"m{i}-{k}" for k in range(3)] for i in range(8)}  # groups on every partition
    for group, names in expected.items():
        for name in names:
            await edge.send(queue, group, name)
    attempts = await fail_until_fenced(edge, queue, "worker-1", "NullPointerException")
    assert FENCE_AFTER <= attempts <= FENCE_AFTER + 2, attempts  # within the threshold (reports in flight)
    (fence,) = await edge.events("fence", "worker-1")
    assert f"{FENCE_AFTER} failed attempts" in fence["reason"]
    code, out, err = await run_cli(cluster, "status")
    assert code == 0 and "worker-1" in out and "fenced" in out, (out, err)
    # Held at every partition: its groups finish on a healthy worker, in order, nothing lost.
    assert all(i.get("probe") for i in await edge.poll(queue, "worker-1", limit=10, wait=0.2))
    await drain_in_order(edge, queue, ("worker-2",), expected)
    # The probe comes to it; passing, it restores it.
    probe = await edge.probe(queue, "worker-1")
    assert await edge.report(queue, "worker-1", probe, "succeeded") == "ok"
    await until(lambda: edge.events("unfence", "worker-1"), within=TIMEOUT, what="the unfence")
    assert await edge.worker_state("worker-1") == "healthy"
    assert len(await edge.events("fence", "worker-1")) == 1


async def test_a_backend_outage_suspends_the_queue_until_a_probe_passes(edge: Edge) -> None:
    queue = "orders"
    down = "POST billing/charge 5xx"
    workers = ("worker-2", "worker-3")
    for worker in workers:
        await edge.poll(queue, worker, wait=0)  # they poll: the queue's recent workers
    for i in range(6):
        await edge.send(queue, f"o{i}", f"order-{i}")
    for worker in workers:
        (item,) = await edge.poll(queue, worker)
        assert await edge.report(queue, worker, item, "failed", reason="502", signature=down) == "ok"
    await until(lambda: edge.events("shared-failure"), within=TIMEOUT, what="the shared failure")
    for worker in workers:  # each is checked with a probe; both fail: a large-scale event
        probe = await edge.probe(queue, worker, held=False)
        assert await edge.report(queue, worker, probe, "failed", reason="502", signature=down) == "ok"

    async def suspended() -> bool:
        return any(q["queue"].endswith(queue) and q["suspended"] for q in (await edge.status())["queues"])

    await until(suspended, within=TIMEOUT, what="the suspension")
    assert not await edge.events("fence", "worker-2") and not await edge.events("fence", "worker-3")
    # The backend is back: the suspension's probe passes and the queue resumes by itself.
    probe = await edge.probe(queue, "worker-2")
    assert await edge.report(queue, "worker-2", probe, "succeeded") == "ok"
    await until(lambda: edge.events("resume"), within=TIMEOUT, what="the resume")
    (resume,) = await edge.events("resume")
    assert "passed" in resume["reason"], resume
    expected = {f"o{i}": [f"order-{i}"] for i in range(6)}
    await drain_in_order(edge, queue, workers, expected)


async def test_the_fence_comes_once_after_the_deciders_node_is_killed(edge: Edge, cluster: Cluster) -> None:
    queue = "failover"
    for i in range(8):
        await edge.send(queue, f"f{i}", f"f-{i}")
    holder = (await edge.status())["decider"]
    pid, _ = cluster.nodes[holder]
    # One failure counted by the holder, then it dies: the next holder replays the window.
    (item,) = await edge.poll(queue, "worker-3")
    assert await edge.report(queue, "worker-3", item, "failed", reason="bug", signature="KeyError") == "ok"
    os.kill(pid, signal.SIGKILL)
    await until(lambda: not alive(pid), what="the holder's death")
    # Decided at the threshold, by the next holder; in force within the threshold plus the failover (the
    # worker's failures while no node held the lease count once the next holder has replayed them).
    attempts = 1 + await fail_until_fenced(edge, queue, "worker-3", "KeyError")
    assert attempts >= FENCE_AFTER, attempts
    assert (await edge.status())["decider"] != holder
    (fence,) = await edge.events("fence", "worker-3")
    assert f"{FENCE_AFTER} failed attempts" in fence["reason"]


async def run_cli(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    """The CLI against the edge with the cluster's client env (as a user runs it after `cluster up`)."""
    env = dict(os.environ)
    for line in (cluster.data_dir / "gateway" / "client.env").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    env.pop("STRICTQ_QUEUE_URL", None)
    process = await asyncio.create_subprocess_exec(
        *strictq(*args), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    return process.returncode or 0, out.decode(), err.decode()


async def test_the_deciders_fence_is_at_the_edge_and_an_operators_unfence_restores(edge: Edge) -> None:
    """The edge's fence list (its proxies' control stream) shows the decider's fence (the bridge until the
    control bucket's registry); `strictq unfence` there restores the worker, as in one process."""
    queue = "ops"
    for i in range(6):
        await edge.send(queue, f"p{i}", f"p-{i}")
    await fail_until_fenced(edge, queue, "worker-2", "ZeroDivisionError")

    async def fenced_at_edge() -> bool:
        fences = (await edge.ok("GET", "/admin/v1/fences", "admin"))["fences"]
        return any(f["worker"] == "worker-2" and f["reason"].startswith("health: ") for f in fences)

    await until(fenced_at_edge, within=TIMEOUT, what="the fence at the edge")
    await edge.ok("DELETE", "/admin/v1/fences/worker-2", "admin")

    async def restored() -> bool:
        return await edge.worker_state("worker-2") == "healthy"

    await until(restored, within=TIMEOUT, what="the restore")
    (unfence,) = [e for e in await edge.events("unfence", "worker-2") if "operator" in e["reason"]]
    assert unfence["reason"] == "fence lifted (operator)"
    assert len(await edge.events("fence", "worker-2")) == 1


@pytest.fixture
def second_edge(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Another edge (`strictq serve --cluster`) over the same cluster, with the same key file: its URL and
    CA (its own)."""
    urls = run("cluster", "urls", "--data-dir", str(cluster.data_dir)).stdout.strip()
    data_dir = cluster.data_dir.parent / "edge2"
    argv = strictq(
        "serve", "--cluster", urls,
        "--nats-credentials", str(cluster.data_dir / "nats" / "gateway.credentials"),
        "--data-dir", str(data_dir), "--port", "0", "--no-proxy", "--keys", str(keys_of(cluster)),
        "--internal-secret", str(cluster.data_dir / "internal.secret"),
    )  # fmt: skip
    process: ChildProcess = launch(argv, data_dir.parent / "edge2.log", wait_for=("strictq: client env ",))
    try:
        yield process.value("strictq: listening on ") or "", process.value("strictq: ca ") or ""
    finally:
        process.stop()


async def test_two_edges_see_the_deciders_fence_and_the_groups_finish_through_the_other(
    edge: Edge, second_edge: tuple[str, str]
) -> None:
    """A worker failing through edge 1 is fenced at both edges (status and the fence list its proxies
    follow); its groups finish through edge 2 on a healthy worker, each in order, nothing lost."""
    url, ca = second_edge
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await fenced_at_both(edge, Edge(url, session, edge.keys))


async def fenced_at_both(edge: Edge, other: Edge) -> None:
    """worker-1 fails through `edge` until fenced; the fence shows at both; `other` drains its groups."""
    queue = "two"
    expected = {f"t{i}": [f"t{i}-{k}" for k in range(2)] for i in range(6)}
    for group, names in expected.items():
        for name in names:
            await edge.send(queue, group, name)
    await fail_until_fenced(edge, queue, "worker-1", "IndexError")

    async def fenced_at(at: Edge) -> bool:
        fences = (await at.ok("GET", "/admin/v1/fences", "admin"))["fences"]
        return any(f["worker"] == "worker-1" and f["reason"].startswith("health: ") for f in fences)

    for at in (edge, other):
        await until(functools.partial(fenced_at, at), within=TIMEOUT, what="the fence at both edges")
        assert await at.worker_state("worker-1") in ("fenced", "probing")
    assert all(i.get("probe") for i in await other.poll(queue, "worker-1", limit=10, wait=0.2))
    await drain_in_order(other, queue, ("worker-2",), expected)


async def test_an_alert_in_the_edges_wire_log_suspends_the_queue(edge: Edge, cluster: Cluster) -> None:
    """`strictq errors`' alert records in the edge's data dir reach the decider, as one process's failure
    manager reads its own: the tenant's queue is suspended, the event carries the alert's reason."""
    queue = "alerted"
    await edge.send(queue, "a0", "a-0")  # the queue exists
    admin = edge.keys.by_id("admin")
    assert admin is not None
    record = event_record(event="alert", reason="payments-5xx: 12 failures", queue=queue)
    record["tenant"] = admin.tenant
    record["alert"] = {"rule": "payments-5xx", "signatures": []}
    with WireLogWriter(cluster.data_dir / "gateway" / "wirelog", "spark-alerts", fsync="always") as writer:
        writer.write(record)

    async def suspended() -> bool:
        return any(q["queue"] == queue and q["suspended"] for q in (await edge.status())["queues"])

    await until(suspended, within=TIMEOUT, what="the alert to suspend the queue")
    (suspend,) = [e for e in await edge.events("suspend") if e.get("queue") == queue]
    assert suspend["reason"] == "alert: payments-5xx: 12 failures", suspend
    await edge.ok("POST", f"/admin/v1/queues/{queue}/resume", "admin", {"reason": "test over"})


async def test_the_fleets_events_are_in_the_clusters_events_at_every_edge(
    edge: Edge, second_edge: tuple[str, str]
) -> None:
    """A control issued through edge 2 and applied by a worker heartbeating through edge 1: the fleet's
    `control-applied` (decided at edge 1) is in the decider's events, read at both edges."""
    url, ca = second_edge
    worker = "worker-3"
    beat = {"interval": 5.0, "queues": ["fleet-events"]}
    await edge.ok("POST", "/fleet/v1/heartbeat", worker, beat)
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        other = Edge(url, session, edge.keys)
        body = {"kind": "config", "args": {"concurrency": 2}, "workers": [worker]}
        (control,) = (await other.ok("POST", "/admin/v1/fleet/control", "admin", body))["controls"]
        answer = await edge.ok("POST", "/fleet/v1/heartbeat", worker, beat)
        assert [c["id"] for c in answer["controls"]] == [control["id"]]
        ack = {"id": control["id"], "status": "applied", "detail": "concurrency=2"}
        await edge.ok("POST", "/fleet/v1/heartbeat", worker, {**beat, "acks": [ack]})

        async def applied_at(at: Edge) -> list[dict[str, Any]]:
            return [e for e in await at.events("control-applied", worker) if control["id"] in e["reason"]]

        for at in (other, edge):
            (event,) = await until(functools.partial(applied_at, at), within=TIMEOUT, what="control-applied")
            assert event["n"] > 0
        shown = (await other.status())["events"]
        assert any(e["event"] == "control-applied" and e.get("worker") == worker for e in shown)


def test_the_decider_takes_only_the_fleets_events_from_an_edge() -> None:
    """`record` (cluster.edge_events): an edge's `control-*`, `sleep` and `wake` are published as they are;
    anything else (a forged `fence`, a malformed event) is refused, so an edge cannot pass for the decider."""
    applied = {"event": "control-applied", "reason": "config c-1", "at": 1.5, "worker": "w", "queue": "t.q"}
    decision = edge_decision(applied)
    assert decision is not None and decision.to_event() == applied
    assert edge_decision({"event": "sleep", "reason": "idle", "at": 2}) is not None
    for forged in (
        {"event": "fence", "reason": "x", "at": 1.0, "worker": "w"},
        {"event": "wake", "reason": 3, "at": 1.0},
        {"event": "wake", "reason": "x", "at": True},
        {"event": "wake", "reason": "x", "at": 1.0, "worker": ""},
        ["control-applied"],
    ):
        assert edge_decision(forged) is None, forged
