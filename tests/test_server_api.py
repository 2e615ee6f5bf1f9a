"""The queue server's internal HTTP API over real sockets: `QueueClient` and raw aiohttp against the real
app factory served in process (kit.inprocess: the `server` fixture here), and against the real
`strictq queue-server` process (conftest.start_server) where the process is the point: SIGTERM and restarts.

Semantics pinned here: SQS FIFO delivery (oldest available group first, as many of its messages as fit,
one claim per group), fencing tokens in receipts, stale claims as per-item `stale_claim` statuses, the JSON
error body `{"error": {"code", "message"}}` for every 4xx, and durability across a clean restart.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from conftest import ServerProcess, running_server, start_server
from kit.inprocess import InProcessServer, serve_in_process
from kit.secret import internal_headers
from kit.until import until

from queue_core.client import QueueClient, QueueClientError

MiB = 1024 * 1024


# ------------------------------------------------------------------------------------------ helpers
async def raw(
    server: ServerProcess | InProcessServer,
    method: str,
    path: str,
    body: bytes | None = None,
    **kwargs: Any,
) -> tuple[int, Any]:
    """One request with a fresh connection (with the run's internal secret); returns (status, decoded JSON
    body)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=internal_headers()) as session,
        session.request(method, server.url + path, data=body, **kwargs) as response,
    ):
        data = await response.read()
        assert response.content_type == "application/json", (response.status, data[:200])
        return response.status, orjson.loads(data)


def assert_error(status: int, payload: Any, want_status: int, want_code: str) -> None:
    assert status == want_status, payload
    assert isinstance(payload, dict) and set(payload) == {"error"}, payload
    error = payload["error"]
    assert error["code"] == want_code, payload
    assert isinstance(error["message"], str) and error["message"], payload


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The internal API in process (overrides conftest's subprocess; conftest's `client` follows it)."""
    async with serve_in_process(tmp_path / "data") as served:
        yield served


@pytest.fixture
def process(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real `strictq queue-server` process, for the tests about the process (SIGTERM)."""
    with running_server(tmp_path / "data") as proc:
        yield proc


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


async def stop(server: ServerProcess) -> int:
    return await asyncio.to_thread(server.terminate)


async def restart(server: ServerProcess) -> ServerProcess:
    assert await stop(server) == 0
    return await asyncio.to_thread(start_server, server.data_dir)


# ------------------------------------------------------------------------------------ health, queues
async def test_health_and_ready(server: InProcessServer) -> None:
    assert await raw(server, "GET", "/healthz") == (200, {"status": "ok"})
    assert await raw(server, "GET", "/readyz") == (200, {"ready": True})


async def test_queue_lifecycle(client: QueueClient, server: InProcessServer) -> None:
    created = await client.create_queue("orders", visibility_timeout=12, dedup_window=60)
    assert created["queue"] == "orders"
    assert created["attributes"]["visibility_timeout"] == 12.0
    assert created["attributes"]["dedup_window"] == 60.0
    await client.create_queue("orders-dlq")
    await client.create_queue("other")

    assert await client.list_queues() == ["orders", "orders-dlq", "other"]
    assert await client.list_queues("orders") == ["orders", "orders-dlq"]
    assert await client.list_queues("zzz") == []

    info = await client.queue_info("orders")
    assert info["queue"] == "orders"
    assert info["attributes"]["visibility_timeout"] == 12.0
    assert info["metrics"]["total"] == 0 and info["metrics"]["in_flight"] == 0

    patched = await client.set_attributes("orders", visibility_timeout=5, max_receive_count=3)
    assert patched["attributes"]["visibility_timeout"] == 5.0
    assert patched["attributes"]["max_receive_count"] == 3
    assert (await client.queue_info("orders"))["attributes"]["visibility_timeout"] == 5.0

    # Re-creating with the same attributes is a no-op; different ones are a conflict (SQS).
    again = await client.create_queue("orders", visibility_timeout=5, dedup_window=60, max_receive_count=3)
    assert again["attributes"]["visibility_timeout"] == 5.0
    with pytest.raises(QueueClientError) as conflict:
        await client.create_queue("orders", visibility_timeout=99)
    assert (conflict.value.status, conflict.value.code) == (409, "already_exists")

    with pytest.raises(QueueClientError) as unknown_attr:
        await client.set_attributes("orders", no_such_attribute=1)
    assert (unknown_attr.value.status, unknown_attr.value.code) == (400, "invalid_argument")
    with pytest.raises(QueueClientError) as out_of_range:
        await client.set_attributes("orders", visibility_timeout=-1)
    assert (out_of_range.value.status, out_of_range.value.code) == (400, "invalid_argument")
    status, payload = await raw(server, "PUT", "/v1/queues/bad%20name", b"{}")
    assert_error(status, payload, 400, "invalid_argument")

    await client.send("orders", [{"body": "x", "group": "g"}])
    await client.delete_queue("orders")
    assert await client.list_queues() == ["orders-dlq", "other"]
    with pytest.raises(QueueClientError) as gone:
        await client.queue_info("orders")
    assert (gone.value.status, gone.value.code) == (404, "queue_not_found")
    with pytest.raises(QueueClientError) as gone_twice:
        await client.delete_queue("orders")
    assert gone_twice.value.code == "queue_not_found"
    # A new queue of the same name starts empty.
    await client.create_queue("orders")
    assert await client.size("orders") == 0


# ---------------------------------------------------------------------------------- send and receive
async def test_send_batch_results(client: QueueClient) -> None:
    results = await client.send(
        "q",
        [
            {"body": "a1", "group": "a"},
            {"body": "b1", "group": "b"},
            {"body": "a2", "group": "a"},
            {"body": "free"},
        ],
    )
    assert [r["group"] for r in results[:3]] == ["a", "b", "a"]
    assert all(r["duplicate"] is False for r in results)
    assert len({r["id"] for r in results}) == 4
    assert results[0]["seq"] < results[2]["seq"]  # per-group sequence follows the send order
    assert all(isinstance(r["partition"], int) for r in results)
    assert results[3]["group"].startswith("~auto.")  # no group: the queue invents one
    assert await client.size("q") == 4


async def test_receive_follows_sqs_fifo_rules(client: QueueClient) -> None:
    await client.send(
        "fifo",
        [
            {"body": "a1", "group": "a"},
            {"body": "b1", "group": "b"},
            {"body": "a2", "group": "a"},
            {"body": "b2", "group": "b"},
            {"body": "a3", "group": "a"},
            {"body": "c1", "group": "c"},
        ],
    )
    # Rule 1+2: the oldest group first, as many of its messages as fit; rule 3: then the next group.
    first = await client.receive("fifo", limit=4, ttl=30)
    assert bodies(first) == ["a1", "a2", "a3", "b1"]
    assert len({m["token"] for m in first if m["group"] == "a"}) == 1  # one batch per group, one claim
    assert first[0]["token"] != first[3]["token"]
    assert all(m["receive_count"] == 1 for m in first)
    assert all(m["receipt"] == f"{m['token']:x}.{m['id']}" for m in first)

    # a and b are claimed: only c is available, b2 waits behind the claim on b1.
    assert bodies(await client.receive("fifo", limit=10, ttl=30)) == ["c1"]
    assert await client.receive("fifo", limit=10, ttl=30) == []
    assert await client.claim_count("fifo") == 5

    # Deleting a's messages frees nothing new; deleting b1 makes b2 the head.
    acks = await client.ack("fifo", [m["receipt"] for m in first[:3]])
    assert [a["status"] for a in acks] == ["ok"] * 3
    assert await client.receive("fifo", limit=10, ttl=30) == []
    assert [a["status"] for a in await client.ack("fifo", [first[3]["receipt"]])] == ["ok"]
    second = await client.receive("fifo", limit=10, ttl=30)
    assert bodies(second) == ["b2"]
    assert second[0]["token"] > first[3]["token"]


async def test_one_claim_per_group_with_limit_one(client: QueueClient) -> None:
    await client.send("one", [{"body": f"{g}{i}", "group": g} for i in range(3) for g in "xy"])
    assert bodies(await client.receive("one", limit=1, ttl=30)) == ["x0"]
    assert bodies(await client.receive("one", limit=1, ttl=30)) == ["y0"]
    assert await client.receive("one", limit=1, ttl=30) == []  # x1 and y1 wait for their group's claim
    assert (await client.group("one", "x"))["in_flight"] == 1
    assert (await client.group("one", "x"))["visible"] == 2


async def test_ack_renew_release_and_stale_receipts(client: QueueClient) -> None:
    await client.send("s", [{"body": "m1", "group": "g"}, {"body": "m2", "group": "g"}])
    old = await client.receive("s", limit=10, ttl=0.3)
    assert bodies(old) == ["m1", "m2"]

    async def expired() -> bool:
        return (await client.group("s", "g"))["in_flight"] == 0

    await until(expired, 5.0)
    new = await client.receive("s", limit=1, ttl=30)  # a newer claim supersedes the old receipts
    assert bodies(new) == ["m1"] and new[0]["receive_count"] == 2
    assert new[0]["token"] > old[0]["token"]
    group = await client.group("s", "g")
    assert group["floor"] == new[0]["token"]

    # Superseded receipts are refused per item with a distinct status, in a 200 response.
    for call in (client.ack, client.release):
        outcome = await call("s", [old[0]["receipt"]])
        assert [o["status"] for o in outcome] == ["stale_claim"], outcome
        assert outcome[0]["id"] == old[0]["id"] and outcome[0]["message"]
    renewed = await client.renew("s", [old[0]["receipt"], old[1]["receipt"]], 30)
    assert [o["status"] for o in renewed] == ["stale_claim", "stale_claim"]
    assert bodies(await client.peek("s")) == ["m1", "m2"]  # nothing was deleted by the stale holder

    # The current holder can; acking twice says `gone`; an unknown id in a well-formed receipt too.
    assert [o["status"] for o in await client.ack("s", [new[0]["receipt"]])] == ["ok"]
    assert [o["status"] for o in await client.ack("s", [new[0]["receipt"]])] == ["gone"]
    assert [o["status"] for o in await client.ack("s", ["1f.no-such-message"])] == ["gone"]
    # Mixed batch: each item answered on its own.
    third = await client.receive("s", limit=1, ttl=30)
    assert bodies(third) == ["m2"]
    mixed = await client.ack("s", [old[1]["receipt"], third[0]["receipt"], "1f.unknown"])
    assert [o["status"] for o in mixed] == ["stale_claim", "ok", "gone"]
    assert await client.size("s") == 0


async def test_ack_by_id_with_and_without_token(client: QueueClient) -> None:
    await client.send("ids", [{"body": "x", "group": "g", "id": "msg-1"}, {"body": "y", "group": "h"}])
    claim = await client.receive("ids", limit=10, ttl=30)
    x = next(m for m in claim if m["id"] == "msg-1")
    assert [o["status"] for o in await client.ack_ids("ids", ["msg-1"], token=x["token"] - 1)] == [
        "stale_claim"
    ]
    assert [o["status"] for o in await client.ack_ids("ids", ["msg-1"], token=x["token"])] == ["ok"]
    y = next(m for m in claim if m["id"] != "msg-1")
    assert [o["status"] for o in await client.ack_ids("ids", [y["id"]])] == ["ok"]  # EmoDB: no fencing
    assert await client.size("ids") == 0


async def test_renew_extend_and_set(client: QueueClient) -> None:
    await client.send("r", [{"body": "m", "group": "g"}])
    (claim,) = await client.receive("r", ttl=30)
    receipt = claim["receipt"]

    # extend never shortens a claim: a 0.2 s extend on a 30 s claim keeps it claimed.
    assert [o["status"] for o in await client.renew("r", [receipt], 0.2, mode="extend")] == ["ok"]
    await asyncio.sleep(0.4)
    assert await client.receive("r", ttl=30) == []
    assert await client.claim_count("r") == 1

    # set shortens (SQS ChangeMessageVisibility): the message comes back soon after.
    assert [o["status"] for o in await client.renew("r", [receipt], 0.2, mode="set")] == ["ok"]
    got: list[dict[str, Any]] = []

    async def redelivered() -> bool:
        got.extend(await client.receive("r", ttl=0.2))
        return bool(got)

    await until(redelivered, 5.0)
    assert got[0]["id"] == claim["id"] and got[0]["receive_count"] == 2

    async def idle() -> bool:
        return await client.claim_count("r") == 0

    await until(idle, 5.0)
    # extend recreates an expired claim nobody superseded; set refuses (not in flight).
    assert [o["status"] for o in await client.renew("r", [got[0]["receipt"]], 5, mode="set")] == [
        "not_in_flight"
    ]
    assert [o["status"] for o in await client.renew("r", [got[0]["receipt"]], 30, mode="extend")] == ["ok"]
    assert await client.claim_count("r") == 1
    assert await client.receive("r", ttl=30) == []

    with pytest.raises(QueueClientError) as bad_mode:
        await client.renew("r", [receipt], 1, mode="forever")
    assert (bad_mode.value.status, bad_mode.value.code) == (400, "invalid_argument")
    with pytest.raises(QueueClientError) as bad_ttl:
        await client.renew("r", [receipt], -1)
    assert (bad_ttl.value.status, bad_ttl.value.code) == (400, "invalid_argument")


async def test_release_unclaimall_claimcount(client: QueueClient) -> None:
    await client.send("u", [{"body": f"{g}", "group": g} for g in "abc"])
    claimed = await client.receive("u", limit=10, ttl=30)
    assert sorted(bodies(claimed)) == ["a", "b", "c"]
    assert await client.claim_count("u") == 3

    released = await client.release("u", [claimed[0]["receipt"]])
    assert [o["status"] for o in released] == ["ok"]
    assert await client.claim_count("u") == 2
    again = await client.receive("u", limit=10, ttl=30)
    assert [m["id"] for m in again] == [claimed[0]["id"]]
    assert again[0]["receive_count"] == 2

    assert await client.unclaim_all("u") == 3
    assert await client.claim_count("u") == 0
    assert len(await client.receive("u", limit=10, ttl=30)) == 3
    assert await client.unclaim_all("u") == 3
    assert await client.unclaim_all("u") == 0


async def test_peek_size_purge(client: QueueClient, server: InProcessServer) -> None:
    await client.send("p", [{"body": f"{g}{i}", "group": g} for i in range(3) for g in "ab"])
    await client.receive("p", limit=1, ttl=30)
    peeked = await client.peek("p", limit=100)
    assert bodies(peeked) == ["a0", "b0", "a1", "b1", "a2", "b2"]  # peek ignores claims
    assert [m["claimed"] for m in peeked] == [True, False, False, False, False, False]
    assert len(await client.peek("p", limit=2)) == 2
    assert await client.size("p") == 6
    status, payload = await raw(server, "GET", "/v1/queues/p/size")
    assert (status, payload) == (200, {"size": 6, "exact": True})
    metrics = (await client.queue_info("p"))["metrics"]
    assert (metrics["visible"], metrics["in_flight"], metrics["total"], metrics["groups"]) == (5, 1, 6, 2)

    assert await client.purge("p") == 6
    assert await client.size("p") == 0
    assert await client.claim_count("p") == 0
    assert await client.peek("p") == []
    assert await client.receive("p", limit=10) == []
    await client.send("p", [{"body": "after", "group": "a"}])
    assert bodies(await client.receive("p", limit=10, ttl=30)) == ["after"]


async def test_purge_then_old_claims_and_delays_expire_cleanly(client: QueueClient) -> None:
    """Claims and delays that were pending at the purge must not skew the counts when their time comes."""
    await client.send("pc", [{"body": "x", "group": "g"}, {"body": "later", "group": "h", "delay": 0.3}])
    assert bodies(await client.receive("pc", ttl=0.3)) == ["x"]
    assert await client.purge("pc") == 2
    await asyncio.sleep(0.5)
    metrics = (await client.queue_info("pc"))["metrics"]
    assert (metrics["visible"], metrics["in_flight"], metrics["delayed"], metrics["total"]) == (0, 0, 0, 0)
    await client.send("pc", [{"body": "y", "group": "g"}])
    assert bodies(await client.receive("pc", ttl=30)) == ["y"]
    assert await client.claim_count("pc") == 1


async def test_group_info(client: QueueClient) -> None:
    odd = "tenant/1?x=#frag"  # group ids may hold characters a path segment could not
    await client.send("gi", [{"body": "1", "group": odd}, {"body": "2", "group": odd}])
    before = await client.group("gi", odd)
    assert before["group"] == odd
    assert (before["visible"], before["in_flight"], before["delayed"], before["floor"]) == (2, 0, 0, 0)
    assert before["worker"] == ""
    claim = await client.receive("gi", limit=1, ttl=30, worker="worker-7")
    after = await client.group("gi", odd)
    assert (after["visible"], after["in_flight"]) == (1, 1)
    assert after["floor"] == claim[0]["token"]
    assert after["worker"] == "worker-7"
    assert after["partition"] == before["partition"]
    assert after["oldest_age"] >= 0
    unknown = await client.group("gi", "nobody")
    assert (unknown["visible"], unknown["in_flight"], unknown["floor"]) == (0, 0, 0)


async def test_move_keeps_group_order(client: QueueClient) -> None:
    await client.send(
        "src", [{"body": f"{g}{i}", "group": g, "attributes": {"i": i}} for i in range(4) for g in "abc"]
    )
    held = await client.receive("src", limit=4, ttl=30)  # all of a: in flight, moved when released
    assert bodies(held) == ["a0", "a1", "a2", "a3"]
    move = await client.start_move("src", "dst")
    assert (move["from"], move["to"]) == ("src", "dst")
    assert move["state"] == "running"

    async def others_moved() -> bool:
        status = await client.move_status(move["id"])
        return status["moved"] >= 8

    await until(others_moved, 5.0)
    status = await client.move_status(move["id"])
    assert status["state"] == "running" and status["remaining"] == 4  # waits for the claim on a
    await client.release("src", [m["receipt"] for m in held])

    async def done() -> bool:
        return (await client.move_status(move["id"]))["state"] == "done"

    await until(done, 5.0)
    final = await client.move_status(move["id"])
    assert final["moved"] == 12 and final["remaining"] == 0 and final["finished_at"] >= final["started_at"]
    assert await client.size("src") == 0
    assert "dst" in await client.list_queues()

    received = await client.receive("dst", limit=100, ttl=30)
    by_group: dict[str, list[str]] = {}
    for message in received:
        by_group.setdefault(message["group"], []).append(message["body"])
    assert by_group == {g: [f"{g}{i}" for i in range(4)] for g in "abc"}
    assert [m["attributes"] for m in received if m["group"] == "b"] == [{"i": i} for i in range(4)]

    with pytest.raises(QueueClientError) as onto_itself:
        await client.start_move("dst", "dst")
    assert onto_itself.value.status == 400
    with pytest.raises(QueueClientError) as missing:
        await client.start_move("no-such-queue", "dst")
    assert (missing.value.status, missing.value.code) == (404, "queue_not_found")


async def test_a_move_under_a_clusters_id_and_its_refusals(
    server: InProcessServer, client: QueueClient
) -> None:
    """POST /v1/moves with `id` (a cluster gateway's one id over its partitions): repeated, it answers the
    move it started; a malformed id or one naming another move is a 400."""
    await client.send("idsrc", [{"body": "x", "group": "g"}])
    body = orjson.dumps({"from": "idsrc", "to": "iddst", "id": "mv-cfeed"})
    status, move = await raw(server, "POST", "/v1/moves", body)
    assert status == 200 and move["id"] == "mv-cfeed", move
    status, again = await raw(server, "POST", "/v1/moves", body)
    assert status == 200 and again["id"] == "mv-cfeed" and again["started_at"] == move["started_at"]
    for bad in ({"id": "mine"}, {"id": 7}, {"id": "mv-c" + "0" * 70}, {"id": "mv-cfeed", "to": "other"}):
        status, answer = await raw(
            server, "POST", "/v1/moves", orjson.dumps({"from": "idsrc", "to": "iddst", **bad})
        )
        assert_error(status, answer, 400, "invalid_argument")
    status, answer = await raw(server, "GET", "/v1/moves/mv-cfeed")
    assert status == 200 and answer["id"] == "mv-cfeed"


async def test_the_retry_workflow_routes_answer_json_errors(
    server: InProcessServer, client: QueueClient
) -> None:
    """The port's retry routes on the internal API (RemoteQueueService speaks them): each error its status."""
    await client.send("rq", [{"body": "x", "group": "g"}])
    status, answer = await raw(
        server, "PUT", "/v1/queues/rq/groups/policy?group=g", b'{"override": {"max_attempts": 2}}'
    )
    assert (
        status == 200
        and answer["override"] == {"max_attempts": 2}
        and answer["effective"]["max_attempts"] == 2
    )
    status, answer = await raw(server, "GET", "/v1/queues/rq/groups/policy?group=g")
    assert status == 200 and answer["override"] == {"max_attempts": 2}
    status, answer = await raw(server, "PUT", "/v1/queues/rq/groups/policy?group=g", b'{"override": null}')
    assert status == 200 and answer["override"] == {}
    status, answer = await raw(server, "GET", "/v1/queues/rq/parked")
    assert status == 200 and answer == {"groups": []}
    status, answer = await raw(server, "GET", "/v1/queues/rq/groups/log?group=g&limit=3")
    assert status == 200 and answer == {"attempts": []}
    status, answer = await raw(server, "POST", "/v1/queues/rq/groups/redrive?group=g")
    assert status == 200 and answer == {"restored": 0, "released": 0}
    for method, path, body, want, code in (
        ("POST", "/v1/queues/rq/groups/release", None, 400, "invalid_argument"),
        ("POST", "/v1/queues/rq/groups/release?group=none", None, 404, "not_found"),
        ("POST", "/v1/queues/nope/groups/release?group=g", None, 404, "queue_not_found"),
        ("GET", "/v1/queues/nope/parked", None, 404, "queue_not_found"),
        (
            "PUT",
            "/v1/queues/rq/groups/policy?group=g",
            b'{"override": {"on_exhausted": "shrug"}}',
            400,
            "invalid_argument",
        ),
        ("PUT", "/v1/queues/rq/groups/policy?group=g", b'{"override": [1]}', 400, "invalid_argument"),
        ("GET", "/v1/queues/rq/groups/log?group=g&limit=0", None, 400, "invalid_argument"),
        ("GET", "/v1/queues/rq/groups/log?group=g&limit=x", None, 400, "invalid_argument"),
        ("POST", "/v1/queues/rq/handover", b'{"groups": ["g"]}', 400, "invalid_argument"),
        ("POST", "/v1/queues/rq/handover/release", b'{"groups": "g"}', 400, "invalid_argument"),
    ):
        status, answer = await raw(server, method, path, body)
        assert_error(status, answer, want, code)


async def test_long_poll_returns_when_another_task_sends(server: InProcessServer) -> None:
    async with QueueClient(server.url) as consumer, QueueClient(server.url) as producer:
        await producer.create_queue("lp")
        started = time.monotonic()
        waiting = asyncio.create_task(consumer.receive("lp", limit=5, ttl=30, wait=10))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        sent_at = time.monotonic()
        await producer.send("lp", [{"body": "wake up", "group": "g"}])
        got = await asyncio.wait_for(waiting, 5)
        assert bodies(got) == ["wake up"]
        assert time.monotonic() - sent_at < 1.5
        assert time.monotonic() - started < 5

        # Without a sender it waits about `wait` and returns nothing.
        started = time.monotonic()
        assert await consumer.receive("lp", limit=5, ttl=30, wait=0.4) == []
        assert 0.3 <= time.monotonic() - started < 3


async def test_long_poll_wakes_when_a_claim_ends(client: QueueClient) -> None:
    await client.send("lp2", [{"body": "m", "group": "g"}])
    (claim,) = await client.receive("lp2", ttl=30)
    waiting = asyncio.create_task(client.receive("lp2", ttl=30, wait=10))
    await asyncio.sleep(0.2)
    await client.release("lp2", [claim["receipt"]])
    got = await asyncio.wait_for(waiting, 5)
    assert [m["id"] for m in got] == [claim["id"]]


async def test_bodies_and_attributes_round_trip(client: QueueClient) -> None:
    binary = bytes([0xFF, 0xFE, 0x00, 0x80, 0x41])
    results = await client.send(
        "b",
        [
            {"body": "héllo wörld ✓ \n tab\t", "group": "g", "attributes": {"trace": "abc", "n": 1}},
            {"json": {"order": 1, "items": [1, 2], "note": None}, "group": "g"},
            {"body_b64": base64.b64encode(binary).decode(), "group": "g"},
            {"body_b64": base64.b64encode("plain ütf-8".encode()).decode(), "group": "g"},
            {"body": "", "group": "g", "content_type": "text/x-empty"},
        ],
    )
    assert all("error" not in r for r in results), results

    for view in (await client.peek("b", 10), await client.receive("b", limit=10, ttl=30)):
        text, as_json, as_bytes, utf8, empty = view
        assert text["body"] == "héllo wörld ✓ \n tab\t"
        assert text["attributes"] == {"trace": "abc", "n": 1}
        assert text["content_type"] == "text/plain"
        assert as_json["content_type"] == "application/json"
        assert orjson.loads(as_json["body"]) == {"order": 1, "items": [1, 2], "note": None}
        assert "body" not in as_bytes and base64.b64decode(as_bytes["body_b64"]) == binary
        assert as_bytes["content_type"] == "application/octet-stream"
        assert utf8["body"] == "plain ütf-8"  # valid UTF-8 comes back as text
        assert empty["body"] == "" and empty["content_type"] == "text/x-empty"
        assert "attributes" not in as_json


async def test_dedup_and_message_id_idempotency(client: QueueClient) -> None:
    first = await client.send_one("d", "payload", group="g", dedup_id="dd-1")
    second = await client.send_one("d", "other payload", group="g", dedup_id="dd-1")
    assert second["duplicate"] is True and second["id"] == first["id"] and second["seq"] == first["seq"]
    assert await client.size("d") == 1
    by_id = await client.send_one("d", "x", group="h", id="caller-id-1")
    again = await client.send_one("d", "x", group="h", id="caller-id-1")
    assert by_id["id"] == again["id"] == "caller-id-1" and again["duplicate"] is True
    assert await client.size("d") == 2
    # The dedup window outlives the message: a resend after the delete is still a duplicate.
    claim = await client.receive("d", limit=10, ttl=30)
    await client.ack("d", [m["receipt"] for m in claim])
    third = await client.send_one("d", "payload", group="g", dedup_id="dd-1")
    assert third["duplicate"] is True and third["id"] == first["id"]
    assert await client.size("d") == 0


# --------------------------------------------------------------------------------------- bad input
BAD_REQUESTS: list[tuple[str, str, bytes | None, int, str]] = [
    ("POST", "/v1/queues/keep/send", b"{not json", 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/send", b"[1, 2]", 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/send", b"null", 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/send", b'{"messages": []}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/send", b'{"messages": "x"}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/send", b"\xff\xfe\x00", 400, "invalid_argument"),
    ("POST", "/v1/queues/nope/send", b'{"messages": [{"body": "x"}]}', 404, "queue_not_found"),
    ("POST", "/v1/queues/nope/receive", b"{}", 404, "queue_not_found"),
    ("POST", "/v1/queues/nope/ack", b'{"receipts": ["1.x"]}', 404, "queue_not_found"),
    ("GET", "/v1/queues/nope", None, 404, "queue_not_found"),
    ("GET", "/v1/queues/nope/peek", None, 404, "queue_not_found"),
    ("GET", "/v1/queues/nope/size", None, 404, "queue_not_found"),
    ("DELETE", "/v1/queues/nope", None, 404, "queue_not_found"),
    ("POST", "/v1/queues/keep/receive", b'{"ttl": -1}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"ttl": 100000}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"ttl": "soon"}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"ttl": true}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"ttl": 1e400}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"limit": 0}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"limit": 1001}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"limit": 2.5}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"limit": "many"}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"worker": 7}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/receive", b'{"wait": "later"}', 400, "invalid_argument"),
    ("GET", "/v1/queues/keep/peek?limit=0", None, 400, "invalid_argument"),
    ("GET", "/v1/queues/keep/peek?limit=abc", None, 400, "invalid_argument"),
    ("GET", "/v1/queues/keep/group", None, 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/ack", b'{"receipts": ["garbage"]}', 400, "invalid_receipt"),
    ("POST", "/v1/queues/keep/ack", b'{"receipts": ["zz.abc"]}', 400, "invalid_receipt"),
    ("POST", "/v1/queues/keep/ack", b'{"receipts": [42]}', 400, "invalid_receipt"),
    ("POST", "/v1/queues/keep/ack", b'{"receipts": []}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/ack", b"{}", 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/ack", b'{"ids": ["a"], "token": "x"}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/renew", b'{"receipts": ["nodot"], "ttl": 5}', 400, "invalid_receipt"),
    ("POST", "/v1/queues/keep/renew", b'{"receipts": ["1.x"], "ttl": -5}', 400, "invalid_argument"),
    ("POST", "/v1/queues/keep/release", b'{"receipts": ["g.x"]}', 400, "invalid_receipt"),
    ("PUT", "/v1/queues/keep", b'{"attributes": {"retention": 1}}', 400, "invalid_argument"),
    ("PUT", "/v1/queues/keep", b'{"attributes": []}', 400, "invalid_argument"),
    ("PATCH", "/v1/queues/keep", b'{"attributes": {"kind": "weird"}}', 400, "invalid_argument"),
    ("PATCH", "/v1/queues/keep", b"{}", 400, "invalid_argument"),
    ("POST", "/v1/moves", b'{"from": 1}', 400, "invalid_argument"),
    ("GET", "/no/such/route", None, 404, "no_such_route"),
    ("DELETE", "/healthz", None, 405, "method_not_allowed"),
]


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the table of bad requests (each case is independent and changes nothing)."""
    with running_server(tmp_path_factory.mktemp("shared") / "data") as proc:
        yield proc


@pytest.mark.parametrize("method,path,body,status,code", BAD_REQUESTS)
async def test_bad_request_gets_json_error(
    shared_server: InProcessServer, method: str, path: str, body: bytes | None, status: int, code: str
) -> None:
    await raw(shared_server, "PUT", "/v1/queues/keep", b"{}")
    got_status, payload = await raw(shared_server, method, path, body)
    assert_error(got_status, payload, status, code)
    assert shared_server.running()


async def test_bad_input_loses_nothing_and_server_keeps_going(
    client: QueueClient, server: InProcessServer
) -> None:
    kept = await client.send_one("keep", "precious", group="g")
    await client.send("keep", [{"body": "claimed", "group": "h"}])
    assert len(await client.receive("keep", limit=10, ttl=60)) == 2  # claims survive bad input too
    for method, path, body, status, code in BAD_REQUESTS:
        got_status, payload = await raw(server, method, path, body)
        assert_error(got_status, payload, status, code)
    too_big = b'{"messages": [{"body": "' + b"a" * (8 * MiB + 16) + b'"}]}'
    got_status, payload = await raw(server, "POST", "/v1/queues/keep/send", too_big)
    assert_error(got_status, payload, 413, "request_too_large")

    assert await raw(server, "GET", "/readyz") == (200, {"ready": True})
    peeked = await client.peek("keep", 10)
    assert [m["id"] for m in peeked if m["group"] == "g"] == [kept["id"]]
    assert sorted(bodies(peeked)) == ["claimed", "precious"]
    assert server.running()


async def test_request_over_8_mib_gets_413_json(server: InProcessServer, client: QueueClient) -> None:
    sent = await client.send_one("big", "before", group="g")
    body = orjson.dumps({"messages": [{"body": "x" * (9 * MiB), "group": "g"}]})
    status, payload = await raw(server, "POST", "/v1/queues/big/send", body)
    assert_error(status, payload, 413, "request_too_large")
    # Just under the limit is parsed, and the oversized message refused as an entry (the only one, so the
    # batch answers with that entry's status, see test_batch_status_contract).
    near = orjson.dumps({"messages": [{"body": "y" * (8 * MiB - 100), "group": "g"}]})
    status, payload = await raw(server, "POST", "/v1/queues/big/send", near)
    assert (status, payload["error"]["code"]) == (413, "too_large"), payload
    assert payload["results"][0]["error"]["code"] == "too_large"
    assert [m["id"] for m in await client.peek("big")] == [sent["id"]]
    assert await raw(server, "GET", "/readyz") == (200, {"ready": True})


async def test_per_entry_errors_do_not_sink_good_entries(client: QueueClient) -> None:
    await client.create_queue("pe", max_message_size=1024)
    entries: list[dict[str, Any]] = [
        {"body": "good-1", "group": "g"},
        {"body": "x", "group": "x" * 129},
        {"body": "x", "group": "has space"},
        {"body": "x", "group": "ünïcode"},
        {"body": "x", "group": ""},
        {"body": "x", "group": "~auto.reserved"},
        {"body": "x", "group": 5},
        {"body": "y" * 1025, "group": "g"},
        {"body_b64": "***not base64***", "group": "g"},
        {"group": "g"},
        {"body": "x", "group": "g", "delay": 901},
        {"body": "x", "group": "g", "id": "bad id!"},
        {"body": "x", "group": "g", "dedup_id": "d" * 129},
        {"body": "x", "group": "g", "attributes": [1]},
        "not an object",
        {"body": "good-2", "group": "g" * 128},
    ]
    results = await client.send("pe", entries)
    codes = [r["error"]["code"] if "error" in r else "ok" for r in results]
    assert codes == (["ok"] + ["invalid_argument"] * 6 + ["too_large"] + ["invalid_argument"] * 7 + ["ok"]), (
        results
    )
    assert results[7]["error"]["details"] == {"size": 1025, "limit": 1024}
    assert all(r["error"]["message"] for r in results if "error" in r)
    assert sorted(bodies(await client.peek("pe", 100))) == ["good-1", "good-2"]

    # The default limit is 256 KiB; the ceiling for the attribute is 1 MiB.
    assert (await client.send("pe2", [{"body": "z" * (256 * 1024)}]))[0]["duplicate"] is False
    over = await client.send("pe2", [{"body": "z" * (256 * 1024 + 1)}])
    assert over[0]["error"]["code"] == "too_large"


async def test_batch_status_contract(server: InProcessServer, client: QueueClient) -> None:
    """Batches answer 200 with per-item results when any item succeeded; when every item failed, the status
    of the first failure with the same `error` body plus the per-item `results`. `gone` counts as done."""

    async def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return await raw(server, "POST", "/v1/queues/bs" + path, orjson.dumps(body))

    await client.send("bs", [{"body": "m1", "group": "g"}, {"body": "m2", "group": "g"}])
    old = await client.receive("bs", limit=10, ttl=0.2)

    async def expired() -> bool:
        return await client.claim_count("bs") == 0

    await until(expired, 5.0)
    new = await client.receive("bs", limit=1, ttl=30)

    status, payload = await post("/ack", {"receipts": [old[0]["receipt"]]})
    assert_error(status, {"error": payload["error"]}, 409, "stale_claim")
    assert [r["status"] for r in payload["results"]] == ["stale_claim"]
    status, payload = await post("/renew", {"receipts": [old[0]["receipt"]], "ttl": 5})
    assert (status, [r["status"] for r in payload["results"]]) == (409, ["stale_claim"])
    status, payload = await post("/ack", {"receipts": [old[0]["receipt"], new[0]["receipt"]]})
    assert (status, [r["status"] for r in payload["results"]]) == (200, ["stale_claim", "ok"])
    status, payload = await post("/ack", {"receipts": [new[0]["receipt"]]})
    assert (status, [r["status"] for r in payload["results"]]) == (200, ["gone"])

    status, payload = await post("/send", {"messages": [{"body": "x", "group": "bad group"}]})
    assert_error(status, {"error": payload["error"]}, 400, "invalid_argument")
    assert payload["results"][0]["error"]["code"] == "invalid_argument"
    status, payload = await post(
        "/send", {"messages": [{"body": "x", "group": "bad group"}, {"body": "ok", "group": "g"}]}
    )
    assert status == 200 and "error" in payload["results"][0] and "id" in payload["results"][1]
    assert bodies(await client.peek("bs")) == ["m2", "ok"]


# ----------------------------------------------------------------------------------------- restarts
async def test_sigterm_exits_zero(process: ServerProcess) -> None:
    async with QueueClient(process.url) as client:
        await client.send_one("t", "x", group="g")
    assert await stop(process) == 0


async def test_restart_keeps_messages_claims_dedup_and_raises_tokens(tmp_path: Path) -> None:
    server = await asyncio.to_thread(start_server, tmp_path / "data")
    try:
        async with QueueClient(server.url) as client:
            await client.create_queue("keep", visibility_timeout=30, dedup_window=600)
            sent = await client.send(
                "keep",
                [{"body": f"{g}{i}", "group": g, "attributes": {"i": i}} for i in range(3) for g in "abc"],
            )
            dedup = await client.send_one("keep", "deduped", group="d", dedup_id="once")
            held = await client.receive("keep", limit=3, ttl=60)  # all of a
            assert bodies(held) == ["a0", "a1", "a2"]
            # b0: expires after the restart (seconds of it: a server restart on a loaded CI machine is slow)
            short = await client.receive("keep", limit=1, ttl=8.0)
            assert bodies(short) == ["b0"]
            max_token = max(m["token"] for m in held + short)
            before = await client.peek("keep", 100)

        server = await restart(server)
        async with QueueClient(server.url) as client:
            assert await client.list_queues() == ["keep"]
            assert (await client.queue_info("keep"))["attributes"]["dedup_window"] == 600.0
            after = await client.peek("keep", 100)
            assert after == before  # ids, groups, seqs, bodies, attributes, claimed flags
            assert len(after) == len(sent) + 1
            # Claims survive: a and b stay claimed; only c and d are handed out.
            assert await client.claim_count("keep") == 4
            fresh = await client.receive("keep", limit=100, ttl=60)
            assert sorted({m["group"] for m in fresh}) == ["c", "d"]
            assert min(m["token"] for m in fresh) > max_token  # tokens after a restart exceed those before
            assert (await client.group("keep", "a"))["in_flight"] == 3

            # The dedup window survives.
            again = await client.send_one("keep", "deduped", group="d", dedup_id="once")
            assert again["duplicate"] is True and again["id"] == dedup["id"]

            # The holder of the pre-restart claim can still use its receipts.
            renewed = await client.renew("keep", [held[0]["receipt"]], 60)
            assert [o["status"] for o in renewed] == ["ok"]
            assert [o["status"] for o in await client.ack("keep", [m["receipt"] for m in held])] == ["ok"] * 3

            # b's claim ends at its pre-restart expiry, then b is delivered in order from b0.
            got: list[dict[str, Any]] = []

            async def b_back() -> bool:
                got.extend(await client.receive("keep", limit=10, ttl=60))
                return bool(got)

            await until(b_back, 15)
            assert bodies(got) == ["b0", "b1", "b2"]
            assert got[0]["receive_count"] == 2
            assert [o["status"] for o in await client.ack("keep", [short[0]["receipt"]])] == ["stale_claim"]
    finally:
        await stop(server)


async def test_superseded_receipt_stays_stale_after_restart(tmp_path: Path) -> None:
    """A claim on m1+m2 expires; a newer claim takes m1 only and deletes it. The old holder's receipt for
    m2 is stale before the restart and must stay stale after it (the floor must not go backwards)."""
    server = await asyncio.to_thread(start_server, tmp_path / "data")
    try:
        async with QueueClient(server.url) as client:
            await client.send("f", [{"body": "m1", "group": "g"}, {"body": "m2", "group": "g"}])
            old = await client.receive("f", limit=10, ttl=0.2)
            assert bodies(old) == ["m1", "m2"]

            async def expired() -> bool:
                return await client.claim_count("f") == 0

            await until(expired, 5.0)
            new = await client.receive("f", limit=1, ttl=60)
            assert bodies(new) == ["m1"]
            assert [o["status"] for o in await client.ack("f", [new[0]["receipt"]])] == ["ok"]
            assert [o["status"] for o in await client.ack("f", [old[1]["receipt"]])] == ["stale_claim"]

        server = await restart(server)
        async with QueueClient(server.url) as client:
            assert [o["status"] for o in await client.renew("f", [old[1]["receipt"]], 30)] == ["stale_claim"]
            assert [o["status"] for o in await client.ack("f", [old[1]["receipt"]])] == ["stale_claim"]
            assert bodies(await client.peek("f")) == ["m2"]
            assert bodies(await client.receive("f", ttl=30)) == ["m2"]
    finally:
        await stop(server)


async def test_claims_with_different_expiries_all_expire_after_restart(tmp_path: Path) -> None:
    """m1 and m2 are claimed together; m2 alone is renewed for longer. After a restart both claims must
    still end (the group must not stay claimed forever)."""
    server = await asyncio.to_thread(start_server, tmp_path / "data")
    try:
        async with QueueClient(server.url) as client:
            await client.send("x", [{"body": "m1", "group": "g"}, {"body": "m2", "group": "g"}])
            # Seconds, not less: the claims must outlive a restart of a server process on a loaded machine.
            claim = await client.receive("x", limit=10, ttl=6.0)
            renewed = await client.renew("x", [claim[1]["receipt"]], 9.0, mode="set")
            assert [o["status"] for o in renewed] == ["ok"]
        server = await restart(server)
        async with QueueClient(server.url) as client:
            assert await client.claim_count("x") >= 1
            got: list[dict[str, Any]] = []

            async def back() -> bool:
                got.extend(await client.receive("x", limit=10, ttl=30))
                return bool(got)

            await until(back, 15, interval=0.1)
            assert bodies(got) == ["m1", "m2"]
    finally:
        await stop(server)


async def test_long_poll_wait_nan_is_a_client_error(server: InProcessServer) -> None:
    await raw(server, "PUT", "/v1/queues/n", b"{}")
    status, payload = await raw(server, "POST", "/v1/queues/n/receive", b'{"wait": "nan"}')
    assert status == 400, payload
    assert payload["error"]["code"] == "invalid_argument"


async def test_sigterm_during_long_poll_stops_promptly(process: ServerProcess) -> None:
    async with QueueClient(process.url) as client:
        await client.create_queue("lp")
        waiting = asyncio.create_task(client.receive("lp", wait=20))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        try:
            code = await asyncio.to_thread(process.terminate, 5.0)
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        assert code == 0
        assert time.monotonic() - started < 5
