"""One feature set in every topology: the same tests against `strictq serve`, `--queue-server` and a
three-node R3 cluster (tests/topologies.py), through the gateway only, with real clients.

Each topology starts once for the module (the fixture is module-scoped and parametrized, so pytest runs
all of one topology's tests before starting the next; conftest keeps the module on one xdist worker).
Where a topology does not yet serve a feature, the test is marked `xfail(strict=True)` with the reason,
per topology (`GAPS`): the matrix is the list of what is left, and a gap that closes fails the run until
its mark is removed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import ClientError
from kit.prometheus import parse_series
from kit.until import until
from topologies import TOPOLOGIES, Edge, running_edge

from queue_core.machine.groups import partition_of

# feature -> topology -> why it is not served there yet (issue 27's list of what is missing).
GAPS: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module", params=TOPOLOGIES)
def edge(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(request.param, tmp_path_factory.mktemp(request.param)) as started:
        yield started


def gapped(feature: str) -> Any:
    """Decorator: the test is a strict xfail on the topologies `GAPS[feature]` names."""

    def decorate(test: Any) -> Any:
        test._conformance_feature = feature
        return test

    return decorate


@pytest.fixture(autouse=True)
def _known_gaps(request: pytest.FixtureRequest) -> None:
    feature = getattr(request.function, "_conformance_feature", None)
    if feature is None or "edge" not in request.fixturenames:
        return
    kind = request.getfixturevalue("edge").kind
    reason = GAPS.get(feature, {}).get(kind)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=f"{kind}: {reason}", strict=True))


def queue_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def call(
    edge: Edge, method: str, path: str, *, role: str = "admin", index: int = 0, **kwargs: Any
) -> tuple[int, Any]:
    """One request to the gateway with `role`'s key; (status, JSON body or text)."""
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        headers = {**edge.headers(role, index), **kwargs.pop("headers", {})}
        async with session.request(method, edge.url + path, headers=headers, **kwargs) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


async def send_emodb(edge: Edge, queue: str, group: str, bodies: list[dict[str, Any]]) -> None:
    for body in bodies:
        status, answer = await call(
            edge, "POST", f"/queue/1/{queue}/send", role="producer", params={"group": group}, json=body
        )
        assert status == 200, answer


# ----------------------------------------------------------------------------------------- data plane
def test_sqs_fifo_groups_in_order_once_at_a_time(edge: Edge) -> None:
    """SQS FIFO through boto3: each group's messages in order of sending, a group's next message only once
    the previous one is deleted, every message once, and the queue empty at the end."""
    producer, worker = edge.sqs("producer"), edge.sqs("worker")
    url = producer.create_queue(
        QueueName=queue_name("conf") + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    groups = [f"g{i}" for i in range(6)]  # enough groups to land on every partition of a cluster
    for n in range(3):
        for group in groups:
            producer.send_message(QueueUrl=url, MessageBody=f"{group}:{n}", MessageGroupId=group)
    seen: dict[str, list[int]] = {group: [] for group in groups}
    for _ in range(60):  # bounded: 18 messages, at most 10 a receive
        if sum(map(len, seen.values())) == 18:
            break
        answer = worker.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["MessageGroupId"]
        )
        batch = answer.get("Messages", [])
        in_batch: dict[str, int] = {}
        for message in batch:
            group, n = message["Body"].split(":")
            assert message["Attributes"]["MessageGroupId"] == group
            in_batch[group] = in_batch.get(group, 0) + 1
            seen[group].append(int(n))
        for message in batch:
            worker.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert seen == {group: [0, 1, 2] for group in groups}
    attributes = producer.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_fifo_deduplication_is_the_scope_reported(edge: Edge) -> None:
    """DeduplicationScope says what really happens: `queue` (one core) drops the same deduplication id in
    another group; `messageGroup` (a cluster, each partition its own core) keeps both, even for two groups
    of one partition. A resend in the same group is dropped everywhere."""
    producer, worker = edge.sqs("producer"), edge.sqs("worker")
    url = producer.create_queue(
        QueueName=queue_name("dedup") + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    scope = producer.get_queue_attributes(QueueUrl=url, AttributeNames=["DeduplicationScope"])["Attributes"]
    expected = "messageGroup" if edge.kind == "cluster" else "queue"
    assert scope["DeduplicationScope"] == expected
    first, other = same_partition_groups(3)  # `cluster up` makes 3 partitions
    for group in (first, first, other):
        producer.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId=group)
    groups: list[str] = []
    for _ in range(20):
        answer = worker.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["MessageGroupId"]
        )
        for message in answer.get("Messages", []):
            groups.append(message["Attributes"]["MessageGroupId"])
            worker.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        attributes = producer.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        if (
            attributes["ApproximateNumberOfMessages"]
            == attributes["ApproximateNumberOfMessagesNotVisible"]
            == "0"
        ):
            break
    assert sorted(groups) == (sorted([first, other]) if expected == "messageGroup" else [first])
    if edge.kind == "cluster":  # the queue-wide scope cannot be kept there: refused, not quietly weakened
        with pytest.raises(ClientError) as refused:
            producer.create_queue(
                QueueName=queue_name("wide") + ".fifo",
                Attributes={"FifoQueue": "true", "DeduplicationScope": "queue"},
            )
        assert "per message group" in str(refused.value)


def same_partition_groups(partitions: int) -> tuple[str, str]:
    """Two group names that hash to one partition of `partitions`."""
    seen: dict[int, str] = {}
    for n in range(1000):
        group = f"group-{n}"
        partition = partition_of(group, partitions)
        if partition in seen:
            return seen[partition], group
        seen[partition] = group
    raise AssertionError("no two groups in one partition")


async def test_emodb_send_poll_ack_size(edge: Edge) -> None:
    """The EmoDB face: sends counted by `size`, a poll claims in group order with rising tokens, an ack
    of the claimed ids empties the queue."""
    queue = queue_name("emo")
    await send_emodb(edge, queue, "customer-1", [{"order": 1}, {"order": 2}])
    await send_emodb(edge, queue, "customer-2", [{"order": 7}])
    status, size = await call(edge, "GET", f"/queue/1/{queue}/size")
    assert (status, size) == (200, 3)
    claimed: list[dict[str, Any]] = []
    for _ in range(20):
        status, items = await call(
            edge, "GET", f"/queue/1/{queue}/poll", role="worker", params={"ttl": "30", "limit": "10"}
        )
        assert status == 200, items
        claimed += items
        if len(claimed) == 3:
            break
    by_group: dict[str, list[int]] = {}
    for item in claimed:
        by_group.setdefault(item["group"], []).append(item["payload"]["order"])
        assert item["token"] > 0
    assert by_group == {"customer-1": [1, 2], "customer-2": [7]}
    status, answer = await call(
        edge, "POST", f"/queue/1/{queue}/ack", role="worker", json=[item["id"] for item in claimed]
    )
    assert status == 200, answer
    status, size = await call(edge, "GET", f"/queue/1/{queue}/size")
    assert (status, size) == (200, 0)


async def test_tenants_take_turns_whatever_partition_their_groups_hash_to(edge: Edge) -> None:
    """A queue shared by tenants (`tenant_separator`): three quiet tenants, one group each on each of a
    cluster's 3 partitions, beside a flooding tenant with 12 groups on every partition. One receive of 10
    serves every quiet tenant, near its head: within the first 4 in one core (four tenants take turns),
    within the first 2 x partitions in a cluster (each partition takes turns, the edge asks all of them and
    interleaves their answers: the bound docs/cluster.md gives). Taking the whole receive from one partition
    would leave two of the quiet tenants behind the flood."""
    queue = queue_name("shared")
    loud = groups_per_partition("loud:", 12)
    quiet = [next(iter(groups_per_partition(f"quiet{p}:", 1)[p])) for p in range(3)]
    await send_emodb(edge, queue, loud[0][0], [{"t": "loud"}])  # creates the queue
    status, body = await call(
        edge, "PUT", f"/admin/v1/queues/{queue}/protections", json={"tenant_separator": ":"}
    )
    assert status == 200, body
    for group in [g for groups in loud for g in groups][1:]:
        await send_emodb(edge, queue, group, [{"t": "loud"}])
    for group in quiet:
        await send_emodb(edge, queue, group, [{"t": group.split(":")[0]}])
    status, items = await call(
        edge, "GET", f"/queue/1/{queue}/poll", role="worker", params={"ttl": "30", "limit": "10"}
    )
    assert status == 200, items
    tenants = [item["payload"]["t"] for item in items]
    assert len(tenants) == 10, tenants
    bound = 2 * 3 if edge.kind == "cluster" else 4
    for tenant in ("quiet0", "quiet1", "quiet2"):
        assert tenant in tenants[:bound], (tenant, tenants)


def groups_per_partition(prefix: str, count: int, partitions: int = 3) -> list[list[str]]:
    """`count` group names starting with `prefix` for each of `partitions` partitions."""
    found: list[list[str]] = [[] for _ in range(partitions)]
    for n in range(100_000):
        group = f"{prefix}{n}"
        bucket = found[partition_of(group, partitions)]
        if len(bucket) < count:
            bucket.append(group)
        if all(len(b) == count for b in found):
            return found
    raise AssertionError("not enough group names")


async def test_bad_input_is_a_json_4xx(edge: Edge) -> None:
    """A malformed request is refused with the one JSON error body, and the edge keeps serving."""
    status, body = await call(edge, "GET", "/queue/1/x/poll", role="worker", params={"ttl": "soon"})
    assert status == 400 and body["error"]["code"], body
    status, body = await call(
        edge, "GET", "/queue/1/x/size", role="producer", headers={"X-BV-API-Key": "nope"}
    )
    assert status in (401, 403) and "error" in body, body
    assert (await call(edge, "GET", "/healthz"))[0] == 200


# ---------------------------------------------------------------------------------------- control plane
@gapped("fences")
async def test_fence_set_listed_and_lifted(edge: Edge) -> None:
    """An operator's fence through the admin routes: listed, then lifted."""
    worker = edge.credential("worker", 1).id
    status, body = await call(
        edge, "PUT", f"/admin/v1/fences/{worker}", json={"mode": "block", "reason": "conformance"}
    )
    assert status == 200, body
    status, fences = await call(edge, "GET", "/admin/v1/fences")
    assert status == 200, fences
    assert [f["worker"] for f in fences["fences"]] == [worker]
    status, body = await call(edge, "DELETE", f"/admin/v1/fences/{worker}")
    assert status == 200, body
    status, fences = await call(edge, "GET", "/admin/v1/fences")
    assert fences["fences"] == []


@gapped("metrics")
async def test_metrics_show_queue_depth(edge: Edge) -> None:
    """/metrics (an admin key) has the queue's depth after sends: summed over partitions in a cluster."""
    queue = queue_name("metrics")
    for group in ("a", "b", "c", "d"):
        await send_emodb(edge, queue, group, [{"n": 1}, {"n": 2}])
    internal = f"{edge.credential('admin').tenant}.{queue}"

    async def depth() -> float | None:
        status, text = await call(edge, "GET", "/metrics")
        assert status == 200, text
        series = parse_series(text)
        for (name, labels), value in series.items():
            if name == "strictq_queue_visible_messages" and dict(labels).get("queue") in (queue, internal):
                return value
        return None

    async def eight() -> bool:
        return await depth() == 8.0

    assert await until(eight, 30.0, what="the queue's depth on /metrics")


@gapped("dashboard")
async def test_dashboard_is_served(edge: Edge) -> None:
    """GET /dashboard serves the operator's page (not a pointer elsewhere), and once logged in its failure
    panel reads failure management wherever it runs (beside the core, the queue server, the decider)."""
    status, page = await call(edge, "GET", "/dashboard")
    assert status == 200
    assert "strictq status" not in page  # the placeholder of a gateway without the core says to use it
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    jar = aiohttp.CookieJar(unsafe=True)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar, timeout=timeout) as session:
        login = {"key": edge.credential("admin").secret}
        async with session.post(edge.url + "/dashboard/login", data=login) as answer:
            assert answer.status == 200, await answer.text()  # redirected to the page, logged in
            page = await answer.text()
    assert 'id="panels"' in page, page[:2000]
    assert "no worker states, suspensions or events here" not in page  # failure management is read


@gapped("status")
async def test_failure_management_status(edge: Edge) -> None:
    """`strictq status`'s route answers the workers and queues failure management knows."""
    status, body = await call(edge, "GET", "/admin/v1/status")
    assert status == 200, body
    assert "workers" in body and "queues" in body, body


@gapped("retry")
async def test_retry_workflow_parked_groups(edge: Edge) -> None:
    """The retry workflow's admin route lists a queue's parked groups (none yet)."""
    queue = queue_name("retry")
    await send_emodb(edge, queue, "g", [{"n": 1}])
    status, body = await call(edge, "GET", f"/admin/v1/queues/{queue}/parked")
    assert status == 200, body


@gapped("move")
async def test_move_between_queues_keeps_group_order(edge: Edge) -> None:
    """The EmoDB `_move`: every message of the source arrives in the destination, each group in order."""
    source, destination = queue_name("from"), queue_name("to")
    for group in ("a", "b", "c", "d"):
        await send_emodb(edge, source, group, [{"g": group, "n": n} for n in range(3)])
    status, body = await call(edge, "POST", "/queue/1/_move", params={"from": source, "to": destination})
    assert status == 200, body
    reference = body["id"]

    async def state() -> str:
        status, answer = await call(edge, "GET", f"/queue/1/_move/{reference}")
        assert status == 200, answer
        return str(answer["status"])

    async def finished() -> bool:
        return await state() not in ("IN_PROGRESS", "RUNNING")

    assert await until(finished, 30.0, what="the move")
    claimed: list[dict[str, Any]] = []
    for _ in range(20):
        status, items = await call(
            edge, "GET", f"/queue/1/{destination}/poll", role="worker", params={"ttl": "30", "limit": "10"}
        )
        claimed += items
        ids = [item["id"] for item in items]
        if ids:  # a group's next message comes once its claim ends
            assert (await call(edge, "POST", f"/queue/1/{destination}/ack", role="worker", json=ids))[
                0
            ] == 200
        if len(claimed) >= 12:
            break
    orders: dict[str, list[int]] = {}
    for item in claimed:
        orders.setdefault(item["payload"]["g"], []).append(item["payload"]["n"])
    assert orders == {group: [0, 1, 2] for group in ("a", "b", "c", "d")}


async def poll_with_state(edge: Edge, queue: str, index: int) -> tuple[list[dict[str, Any]], str]:
    """A state-taking worker's poll (capability `state`): its items and the X-Strictq-Handover header."""
    connector = aiohttp.TCPConnector(ssl=edge.ssl_context())
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        headers = {**edge.headers("worker", index), "X-Strictq-Capabilities": "state"}
        params = {"ttl": "30", "limit": "10"}
        async with session.get(f"{edge.url}/queue/1/{queue}/poll", headers=headers, params=params) as answer:
            assert answer.status == 200, await answer.text()
            return list(await answer.json()), answer.headers.get("X-Strictq-Handover", "")


@gapped("state")
async def test_state_transfer_moves_a_groups_state_to_the_next_worker(edge: Edge) -> None:
    """A handover asks the donor's poll for the group's state, the upload is kept, and the next worker to
    claim the group gets it inline (docs/state-transfer.md)."""
    queue = queue_name("state")
    donor = edge.credential("worker", 0).id
    await send_emodb(edge, queue, "g", [{"n": 1}])
    items, _ = await poll_with_state(edge, queue, 0)
    assert [item["payload"] for item in items] == [{"n": 1}]
    status, body = await call(
        edge, "POST", f"/admin/v1/queues/{queue}/handover", json={"from": donor, "groups": ["g"]}
    )
    assert status == 200 and body["groups"] == ["g"], body
    status, body = await call(edge, "POST", f"/queue/1/{queue}/ack", role="worker", json=[items[0]["id"]])
    assert status == 200, body  # the donor's claim ends: the group now waits for its state

    async def named() -> bool:
        return (await poll_with_state(edge, queue, 0))[1] == "g"

    assert await until(named, 30.0, what="the donor's poll naming the group to upload")
    status, body = await call(
        edge, "PUT", f"/queue/1/{queue}/state", role="worker", json={"g": {"count": 1}, "other": {}}
    )
    assert status == 200, body
    assert body["results"] == [{"group": "g", "status": "ok"}, {"group": "other", "status": "not_requested"}]
    await send_emodb(edge, queue, "g", [{"n": 2}])
    items, _ = await poll_with_state(edge, queue, 1)
    assert [(item["payload"], item.get("state")) for item in items] == [({"n": 2}, {"count": 1})]


@gapped("fleet")
async def test_fleet_heartbeat_is_listed(edge: Edge) -> None:
    """A worker's heartbeat makes it a member of the fleet the admin route lists."""
    worker = edge.credential("worker", 2)
    status, body = await call(
        edge,
        "POST",
        "/fleet/v1/heartbeat",
        role="worker",
        index=2,
        json={"queues": ["orders"], "version": "1"},
    )
    assert status == 200, body
    status, fleet = await call(edge, "GET", "/admin/v1/fleet")
    assert status == 200, fleet
    assert worker.id in json.dumps(fleet)


@gapped("routing")
async def test_routing_pins_versions_and_a_rollout_step(edge: Edge) -> None:
    """Group routing over the port: a pin set through the admin route reads back, a worker's polled
    version is counted (from whichever partition it polled), and a rollout step sets the canary share and
    is one event in failure management's events."""
    queue = queue_name("routing")
    worker = edge.credential("worker").id
    await send_emodb(edge, queue, "g", [{"n": 1}])
    pin = {"pins": [{"name": "vip", "prefix": "vip:", "workers": [worker]}]}
    status, body = await call(edge, "PUT", f"/admin/v1/queues/{queue}/routing", json=pin)
    assert status == 200, body
    assert body["routing"]["pins"][0]["name"] == "vip", body
    status, items = await call(
        edge,
        "GET",
        f"/queue/1/{queue}/poll",
        role="worker",
        params={"ttl": "30", "limit": "10"},
        headers={"X-Strictq-Worker-Version": "1.0"},
    )
    assert status == 200 and [item["payload"] for item in items] == [{"n": 1}], items
    status, body = await call(edge, "GET", f"/admin/v1/queues/{queue}/routing")
    assert status == 200, body
    assert body["workers"] == {worker: "1.0"} and body["versions"]["1.0"]["workers"] == 1, body
    step = {"version": "2.0", "percent": 25, "state": "running", "reason": "canary"}
    status, body = await call(edge, "PUT", f"/admin/v1/queues/{queue}/rollout", json=step)
    assert status == 200, body
    assert body["routing"]["canary"] == {"version": "2.0", "percent": 25}, body
    assert body["rollout"]["state"] == "running", body
    # The step is in failure management's events wherever it runs (durable before the answer).
    status, body = await call(edge, "GET", "/admin/v1/events")
    assert status == 200, body
    steps = [e for e in body["events"] if e["event"] == "rollout-running" and e.get("queue") == queue]
    assert len(steps) == 1 and "version 2.0 at 25% of groups: canary" in steps[0]["reason"], body
    status, body = await call(edge, "PUT", f"/admin/v1/queues/{queue}/rollout", json={**step, "state": "x"})
    assert status == 400 and body["error"]["code"] == "bad_state", body


def test_topologies_are_what_they_say(edge: Edge, tmp_path: Path) -> None:
    """The fixture really runs the topology it names (a guard against a starter that quietly falls back)."""
    if edge.kind == "cluster":
        done = edge.cli("cluster", "status", "--json", "--data-dir", str(edge.data_dir.parent))
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)["nodes"]) == 3
    else:
        store = edge.data_dir / "queue"
        assert store.exists() == (edge.kind == "inprocess")
