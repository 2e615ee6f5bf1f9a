"""The retry workflow's admin routes and moves between queues, served alike in the three topologies:

- `in_process`: the gateway app (make_gateway_app) over a `QueueService` in this process (real TLS);
- `remote`: a real `strictq queue-server` child behind a real `strictq serve --queue-server URL` child;
- `cluster`: one `strictq cluster up` (three JetStream servers, three queue servers, a gateway) per module.

Each test talks to the gateway only, over HTTPS: aiohttp for the EmoDB face and the admin routes, boto3 for
SQS. The remote and in-process key files hold two tenants (t1, t2), so another tenant's queue is checked
there; the cluster's development key file has one tenant, so that check is skipped there.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import pytest
from botocore.config import Config
from cluster_support import start_cluster
from conftest import start_server
from gateway_support import CREDENTIALS, serve_gateway
from kit.process import CLIENT_ENV, LISTENING, launch, strictq
from kit.until import until

from access.keys import Credential, KeyRing, write_keys

REGION = "us-east-1"
names = itertools.count()


@dataclass
class Edge:
    """A gateway as its clients see it: URL, CA file and key file."""

    topology: str
    url: str
    ca: str
    keys: KeyRing

    def credential(self, role: str, tenant: str | None = None) -> Credential | None:
        found = (c for c in self.keys.credentials if c.role == role and tenant in (None, c.tenant))
        return next(found, None)

    def key(self, role: str) -> dict[str, str]:
        credential = self.credential(role)
        assert credential is not None, role
        return {"X-BV-API-Key": credential.secret}

    @property
    def tenant(self) -> str:
        credential = self.credential("admin")
        assert credential is not None
        return credential.tenant

    def other_tenant(self) -> dict[str, str] | None:
        """An admin key of another tenant, where the key file has one."""
        other = next(
            (c for c in self.keys.credentials if c.role == "admin" and c.tenant != self.tenant), None
        )
        return None if other is None else {"X-BV-API-Key": other.secret}

    def sqs(self, role: str = "admin") -> Any:
        credential = self.credential(role)
        assert credential is not None, role
        return boto3.client(
            "sqs",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=credential.id,
            aws_secret_access_key=credential.secret,
            verify=self.ca,
            config=Config(
                retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=30
            ),
        )

    def arn(self, queue: str) -> str:
        return f"arn:aws:sqs:{REGION}:{self.tenant}:{queue}"


# ------------------------------------------------------------------------------------------ topologies
@pytest.fixture(scope="module")
def remote_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    root = tmp_path_factory.mktemp("remote")
    server = start_server(root / "queue-server")
    keys_path = root / "keys.toml"
    write_keys(keys_path, list(CREDENTIALS))
    argv = strictq(
        "serve", "--port", "0", "--data-dir", str(root / "edge"), "--no-proxy",
        "--queue-server", server.url, "--keys", str(keys_path),
    )  # fmt: skip
    edge = launch(argv, root / "serve.log", wait_for=(CLIENT_ENV,))
    try:
        url, ca = edge.value(LISTENING), edge.value("strictq: ca ")
        assert url is not None and ca is not None, edge.lines
        yield Edge("remote", url, ca, KeyRing.load(keys_path))
    finally:
        edge.terminate(timeout=15)
        server.stop()


@pytest.fixture(scope="module")
def cluster_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    cluster = start_cluster(tmp_path_factory.mktemp("retry-cluster") / "c")
    try:
        keys = KeyRing.load(Path(cluster.process.value("strictq: keys ") or ""))
        yield Edge("cluster", cluster.url, cluster.ca, keys)
    finally:
        cluster.process.stop()


@pytest.fixture(params=["in_process", "remote", "cluster"])
async def edge(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Edge]:
    if request.param == "in_process":
        async with serve_gateway(tmp_path) as gw:
            yield Edge("in_process", gw.url, str(gw.ca_file), gw.keys)
    else:
        yield request.getfixturevalue(f"{request.param}_edge")


@pytest.fixture
async def http(edge: Edge) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=edge.ca))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def unique(tag: str) -> str:
    return f"{tag}{next(names)}-{time.time_ns() % 10**9}"


async def call(
    http: aiohttp.ClientSession,
    edge: Edge,
    method: str,
    path: str,
    headers: dict[str, str] | None,
    body: Any = None,
    params: dict[str, str] | None = None,
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    sent = {**(headers or {}), **({"Content-Type": "application/json"} if data is not None else {})}
    async with http.request(method, edge.url + path, data=data, headers=sent, params=params) as answer:
        text = await answer.text()
        assert answer.content_type == "application/json", (answer.status, text[:300])
        return answer.status, json.loads(text) if text else None


def cli(edge: Edge, *args: str) -> Any:
    """`strictq ARGS` against the gateway with the admin key: its JSON answer."""
    admin = edge.credential("admin")
    assert admin is not None
    env = {
        **os.environ,
        "STRICTQ_URL": edge.url,
        "STRICTQ_CA_FILE": edge.ca,
        "STRICTQ_ADMIN_KEY": admin.secret,
    }
    env.pop("STRICTQ_QUEUE_URL", None)
    done = subprocess.run(strictq(*args), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


async def boto(method: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(method, **kwargs)


async def drain(http: aiohttp.ClientSession, edge: Edge, queue: str, count: int) -> list[Any]:
    """Poll and ack `queue` until `count` messages came (bounded): the payloads in the order they came."""
    worker = edge.key("worker")
    got: list[Any] = []
    deadline = time.monotonic() + 60
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages came: {got}"
        status, polled = await call(
            http, edge, "GET", f"/queue/1/{queue}/poll", worker, params={"limit": "10"}
        )
        assert status == 200, polled
        for message in polled:
            params = {"token": str(message["token"])}
            status, _ = await call(
                http, edge, "POST", f"/queue/1/{queue}/ack", worker, [message["id"]], params
            )
            assert status == 200
            got.append(message["payload"])
    return got


def in_group_order(payloads: list[Any], groups: list[str], per_group: int) -> None:
    """Every message came once, each group's in the order it was sent."""
    assert len(payloads) == len(groups) * per_group, payloads
    for group in groups:
        assert [p["n"] for p in payloads if p["g"] == group] == list(range(per_group)), (group, payloads)


# ------------------------------------------------------------------------------- the retry workflow
async def test_the_retry_workflows_admin_routes(edge: Edge, http: aiohttp.ClientSession) -> None:
    queue = unique("rt")
    dlq = queue + "-dlq"
    admin, producer, worker = edge.key("admin"), edge.key("producer"), edge.key("worker")
    sqs = edge.sqs()
    await boto(sqs.create_queue, QueueName=dlq)
    policy = json.dumps({"deadLetterTargetArn": edge.arn(dlq), "maxReceiveCount": "100"})
    await boto(sqs.create_queue, QueueName=queue, Attributes={"RedrivePolicy": policy})
    for n in range(2):
        status, _ = await call(
            http, edge, "POST", f"/queue/1/{queue}/send", producer, {"n": n}, {"group": "A"}
        )
        assert status == 200
    await call(http, edge, "POST", f"/queue/1/{queue}/send", producer, {"n": 9}, {"group": "B"})
    adm = f"/admin/v1/queues/{queue}"

    # Per-group policies: A parks after one failure, B dead-letters its message after one.
    park = {"max_attempts": 1, "retry_backoff": 0}
    status, answer = await call(http, edge, "PUT", adm + "/groups/policy", admin, park, {"group": "A"})
    assert status == 200 and answer["override"] == park, answer
    assert answer["queue"] == queue and answer["effective"]["on_exhausted"] == "park"
    dead = {**park, "on_exhausted": "dead_letter_message"}
    status, answer = await call(http, edge, "PUT", adm + "/groups/policy", admin, dead, {"group": "B"})
    assert status == 200, answer
    status, answer = await call(http, edge, "GET", adm + "/groups/policy", admin, params={"group": "B"})
    assert status == 200 and answer["override"] == dead

    heads: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 30
    while len(heads) < 2:  # a cluster may answer the groups from two partitions in two polls
        assert time.monotonic() < deadline, heads
        _, polled = await call(http, edge, "GET", f"/queue/1/{queue}/poll", worker, params={"limit": "10"})
        heads.update((m["group"], m) for m in polled)
    failures = [
        {"id": m["id"], "token": m["token"], "outcome": "failed", "reason": "down"} for m in heads.values()
    ]
    status, answer = await call(
        http, edge, "POST", f"/queue/1/{queue}/results", worker, {"results": failures}
    )
    assert status == 200 and [r["status"] for r in answer["results"]] == ["ok", "ok"], answer

    status, answer = await call(http, edge, "GET", adm + "/parked", admin)
    assert status == 200 and answer == {"queue": queue, "groups": ["A"]}
    status, answer = await call(http, edge, "GET", adm + "/groups/log", admin, params={"group": "A"})
    assert status == 200 and [(a["outcome"], a["reason"]) for a in answer["attempts"]] == [("failed", "down")]
    status, answer = await call(http, edge, "GET", f"/queue/1/{dlq}/size", admin)
    assert status == 200 and answer == 1  # B's message

    status, answer = await call(http, edge, "POST", adm + "/groups/release", admin, params={"group": "A"})
    assert status == 200 and answer["released"] == 1, answer
    status, answer = await call(http, edge, "POST", adm + "/groups/redrive", admin, params={"group": "B"})
    assert status == 200 and (answer["restored"], answer["released"]) == (1, 0), answer
    status, answer = await call(http, edge, "GET", adm + "/parked", admin)
    assert answer["groups"] == []
    status, answer = await call(http, edge, "DELETE", adm + "/groups/policy", admin, params={"group": "A"})
    assert status == 200 and answer["override"] == {}
    # Both groups go on from their heads, A's second message behind its first.
    payloads = await drain(http, edge, queue, 3)
    assert [p["n"] for p in payloads if p["n"] != 9] == [0, 1] and 9 in [p["n"] for p in payloads]

    # Roles, tenants and bad input: as in one process.
    release = adm + "/groups/release"
    status, answer = await call(http, edge, "POST", release, worker, params={"group": "A"})
    assert status == 403 and answer["error"]["code"] == "forbidden"
    status, answer = await call(http, edge, "POST", release, None, params={"group": "A"})
    assert status == 401
    other = edge.other_tenant()
    if other is not None:
        status, answer = await call(http, edge, "POST", release, other, params={"group": "A"})
        assert status == 404, answer  # another tenant's queue does not exist for it
    status, answer = await call(http, edge, "POST", release, admin, params={"group": "nope"})
    assert status == 404 and answer["error"]["code"] == "not_found"
    status, answer = await call(http, edge, "POST", release, admin)
    assert status == 400 and answer["error"]["code"] == "invalid_argument"
    status, answer = await call(
        http, edge, "PUT", adm + "/groups/policy", admin, {"on_exhausted": "shrug"}, {"group": "A"}
    )
    assert status == 400 and answer["error"]["code"] == "invalid_argument"
    status, answer = await call(
        http, edge, "GET", adm + "/groups/log", admin, params={"group": "A", "limit": "5000"}
    )
    assert status == 400 and answer["error"]["code"] == "invalid_argument"
    status, answer = await call(http, edge, "GET", "/admin/v1/queues/no-such-queue/parked", admin)
    assert status == 404 and answer["error"]["code"] == "queue_not_found", answer


# ------------------------------------------------------------------------------------------- moves
async def test_an_sqs_move_task_keeps_every_groups_order(edge: Edge, http: aiohttp.ClientSession) -> None:
    base = unique("mv")
    dlq, source, destination = f"{base}-dlq.fifo", f"{base}.fifo", f"{base}-dst.fifo"
    sqs, producer = edge.sqs(), edge.sqs("producer")
    fifo = {"FifoQueue": "true"}
    dlq_url = (await boto(sqs.create_queue, QueueName=dlq, Attributes=fifo))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": edge.arn(dlq), "maxReceiveCount": "5"})
    await boto(sqs.create_queue, QueueName=source, Attributes={**fifo, "RedrivePolicy": policy})
    dst_url = (await boto(sqs.create_queue, QueueName=destination, Attributes=fifo))["QueueUrl"]

    # What the gateway refuses, it refuses before any partition sees it.
    with pytest.raises(sqs.exceptions.ClientError, match="Dead Letter Queue"):
        await boto(sqs.start_message_move_task, SourceArn=edge.arn(destination))
    with pytest.raises(sqs.exceptions.ClientError, match=r"ResourceNotFound|does not exist"):
        await boto(sqs.start_message_move_task, SourceArn=edge.arn(base + "-none.fifo"))

    groups = [f"g{i}" for i in range(6)]  # over every partition of a three-partition cluster
    for n in range(4):
        for group in groups:
            body = json.dumps({"g": group, "n": n})
            await boto(
                producer.send_message,
                QueueUrl=dlq_url,
                MessageBody=body,
                MessageGroupId=group,
                MessageDeduplicationId=f"{group}-{n}",
            )
    started = await boto(
        sqs.start_message_move_task, SourceArn=edge.arn(dlq), DestinationArn=edge.arn(destination)
    )
    assert started["TaskHandle"]

    async def completed() -> bool:
        (task,) = (await boto(sqs.list_message_move_tasks, SourceArn=edge.arn(dlq)))["Results"]
        return bool(task["Status"] == "COMPLETED")

    await until(completed, within=60, what="the move task to complete")
    (task,) = (await boto(sqs.list_message_move_tasks, SourceArn=edge.arn(dlq)))["Results"]
    assert task["ApproximateNumberOfMessagesMoved"] == 24 and task["DestinationArn"] == edge.arn(destination)
    with pytest.raises(sqs.exceptions.ResourceNotFoundException, match="RUNNING"):
        await boto(sqs.cancel_message_move_task, TaskHandle=started["TaskHandle"])

    worker = edge.sqs("worker")
    payloads: list[Any] = []
    deadline = time.monotonic() + 60
    while len(payloads) < 24:
        assert time.monotonic() < deadline, payloads
        got = (await boto(worker.receive_message, QueueUrl=dst_url, MaxNumberOfMessages=10)).get(
            "Messages", []
        )
        payloads += [json.loads(m["Body"]) for m in got]
        for m in got:
            await boto(worker.delete_message, QueueUrl=dst_url, ReceiptHandle=m["ReceiptHandle"])
    in_group_order(payloads, groups, 4)
    status, answer = await call(http, edge, "GET", f"/queue/1/{dlq}/size", edge.key("admin"))
    assert status == 200 and answer == 0


async def test_an_emodb_move_keeps_every_groups_order(edge: Edge, http: aiohttp.ClientSession) -> None:
    source, destination = unique("emo-src"), unique("emo-dst")
    admin, producer = edge.key("admin"), edge.key("producer")
    groups = [f"e{i}" for i in range(6)]
    for n in range(3):
        for group in groups:
            body = {"g": group, "n": n}
            status, _ = await call(
                http, edge, "POST", f"/queue/1/{source}/send", producer, body, {"group": group}
            )
            assert status == 200
    status, moved = await call(
        http, edge, "POST", "/queue/1/_move", admin, params={"from": source, "to": destination}
    )
    assert status == 200 and set(moved) == {"id"}, moved

    async def complete() -> bool:
        _, answer = await call(http, edge, "GET", f"/queue/1/_move/{moved['id']}", admin)
        return bool(answer["status"] == "COMPLETE")

    await until(complete, within=60, what="the move to complete")
    status, answer = await call(http, edge, "GET", f"/queue/1/_move/{moved['id']}", admin)
    assert status == 200 and answer == {
        "id": moved["id"],
        "from": source,
        "to": destination,
        "status": "COMPLETE",
        "moved": 18,
        "remaining": 0,
    }
    in_group_order(await drain(http, edge, destination, 18), groups, 3)
    status, answer = await call(http, edge, "GET", f"/queue/1/{source}/size", admin)
    assert status == 200 and answer == 0
    other = edge.other_tenant()
    if other is not None:
        status, answer = await call(http, edge, "GET", f"/queue/1/_move/{moved['id']}", other)
        assert status == 404 and answer["error"]["code"] == "not_found"
    status, answer = await call(http, edge, "GET", "/queue/1/_move/mv-c00000000", admin)
    assert status == 404 and answer["error"]["code"] == "not_found"
    status, answer = await call(
        http, edge, "POST", "/queue/1/_move", admin, params={"from": source, "to": source}
    )
    assert status == 400 and answer["error"]["code"] == "invalid_argument"


# --------------------------------------------------------------------------------------- handovers
async def test_the_handover_routes(edge: Edge, http: aiohttp.ClientSession) -> None:
    queue = unique("ho")
    admin, producer, worker = edge.key("admin"), edge.key("producer"), edge.key("worker")
    donor = edge.credential("worker")
    assert donor is not None
    groups = [f"h{i}" for i in range(6)]  # over every partition of a three-partition cluster
    for group in groups:
        body = {"g": group, "n": 0}
        status, _ = await call(http, edge, "POST", f"/queue/1/{queue}/send", producer, body, {"group": group})
        assert status == 200
    adm = f"/admin/v1/queues/{queue}/handover"
    move = {"from": donor.id, "groups": groups[::-1], "policy": "wait"}
    status, answer = await call(http, edge, "POST", adm, admin, move)
    assert status == 200 and answer == {
        "queue": queue,
        "from": donor.id,
        "groups": groups[::-1],
        "already": [],
    }
    status, answer = await call(http, edge, "POST", adm, admin, {**move, "groups": groups})
    assert status == 200 and (answer["groups"], answer["already"]) == ([], groups)  # in the caller's order
    status, answer = await call(http, edge, "GET", adm, admin)
    assert status == 200 and [row["group"] for row in answer["handovers"]] == sorted(groups)
    status, polled = await call(http, edge, "GET", f"/queue/1/{queue}/poll", worker, params={"limit": "10"})
    assert status == 200 and polled == []  # held until the state comes or an operator lets them go
    listed = await asyncio.to_thread(cli, edge, "handover", queue, "--json")  # the CLI, at this gateway
    assert [row["group"] for row in listed["handovers"]] == groups, listed
    status, answer = await call(http, edge, "POST", adm + "/release", admin, {"groups": groups})
    assert status == 200 and answer == {"queue": queue, "released": groups}
    status, answer = await call(http, edge, "GET", adm, admin)
    assert answer["handovers"] == []
    assert sorted(p["g"] for p in await drain(http, edge, queue, 6)) == groups

    status, answer = await call(http, edge, "POST", adm, worker, move)
    assert status == 403
    status, answer = await call(http, edge, "POST", adm, admin, {"groups": groups})
    assert status == 400 and answer["error"]["details"]["field"] == "from", answer
    status, answer = await call(http, edge, "POST", adm, admin, {**move, "policy": "later"})
    assert status == 400 and answer["error"]["code"] == "invalid_argument"
    status, answer = await call(http, edge, "GET", "/admin/v1/queues/no-such-queue/handover", admin)
    assert status == 404
