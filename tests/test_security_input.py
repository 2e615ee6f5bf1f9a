"""Input hygiene (issue 11, items 1, 5, 10b) through the real servers: one request fails only itself.

The embedded gateway (real TLS, tenants t1 and t2; tests/gateway_support.py) and the queue server's internal
API and admin routes (its real app, served in process: kit.inprocess). Pinned here: text that cannot be
encoded (a lone surrogate, valid JSON) is refused at the edge with a 400 JSON body naming the field, and
afterwards the other tenant still writes, /readyz is 200 and earlier messages are intact; names are matched
whole (a trailing newline is refused) and hold no control characters; numbers in query strings are plain
ASCII; unknown routes and wrong methods answer JSON. Plus the core's own refusal and the group commit's
isolation of one submission's bad data from a real SQLite failure.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from gateway_support import CREDENTIALS, Gateway, delivery_gateway  # noqa: F401 (fixture)
from kit.inprocess import InProcessServer, serve_in_process

from access.keys import KeyRing
from queue_core.durability import DurableLog, commit
from queue_core.machine import InvalidArgument, QueueCore, SendRequest
from queue_core.machine.effects import MessageInserted
from queue_core.machine.inputs import AttemptResult
from queue_core.store import SqliteStore, StoreDataError, StoreError
from wirelog.reader import read_records

SURROGATE = "bad \ud800"  # json.dumps writes it as the escape "\ud800": valid JSON, not encodable text


# ------------------------------------------------------------------------------------------ helpers
@pytest.fixture
async def https(gateway: Gateway) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(gateway.ca_file))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=15)
    ) as session:
        yield session


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    *,
    key: str | None = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:
    """One request; (status, JSON body, headers). Every answer must be JSON."""
    sent = dict(headers or {})
    if key is not None:
        sent["X-BV-API-Key"] = key
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()  # ASCII: surrogates escaped
        sent["Content-Type"] = "application/json"
    async with session.request(method, url, data=data, params=params, headers=sent) as response:
        raw = await response.read()
        assert response.content_type == "application/json", (response.status, raw[:200])
        return response.status, json.loads(raw), response.headers


def secret(gateway: Gateway, key_id: str) -> str:
    return gateway.credential(key_id).secret


def assert_bad(result: tuple[int, Any, Any], field: str, status: int = 400) -> None:
    """A 4xx JSON error naming `field` (EmoDB and internal API shape)."""
    code, body, _ = result
    assert code == status, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert error.get("details", {}).get("field") == field, body


class Emo:
    """The EmoDB face for one credential."""

    def __init__(self, gateway: Gateway, session: aiohttp.ClientSession, key_id: str) -> None:
        self.gateway, self.session, self.key = gateway, session, secret(gateway, key_id)

    async def __call__(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any, Any]:
        return await call(
            self.session, method, self.gateway.url + "/queue/1" + path, body, key=self.key, **kwargs
        )

    async def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, data, _ = await self(method, path, body, **kwargs)
        assert status == 200, (method, path, status, data)
        return data


async def assert_still_serving(gateway: Gateway, session: aiohttp.ClientSession, kept: list[Any]) -> None:
    """The other tenant writes, the gateway is ready, and what t1 had before is intact."""
    other = Emo(gateway, session, "other-1")
    await other.ok("POST", "/elsewhere/send", {"still": "writing"})
    assert await other.ok("GET", "/elsewhere/size") >= 1
    status, body, _ = await call(session, "GET", gateway.url + "/readyz")
    assert (status, body) == (200, {"ready": True})
    assert gateway.service.healthy
    peeked = await Emo(gateway, session, "admin-1").ok("GET", "/jobs/peek", params={"limit": "100"})
    assert [item["payload"] for item in peeked] == kept


async def delivered(gateway: Gateway, session: aiohttp.ClientSession) -> tuple[list[Any], dict[str, Any]]:
    """Two messages in t1's `jobs`, the first claimed by worker-1: (payloads, its delivery)."""
    producer = Emo(gateway, session, "producer-1")
    kept = [{"n": 1}, {"n": 2}]
    for message in kept:
        await producer.ok("POST", "/jobs/send", message, params={"group": "g"})
    (item,) = await Emo(gateway, session, "worker-1").ok("GET", "/jobs/poll", params={"limit": "1"})
    return kept, item


# ------------------------------------------------------------------ lone surrogates on the EmoDB face
@pytest.mark.parametrize("field", ["reason", "signature"])
async def test_a_result_with_a_lone_surrogate_is_refused_and_writes_go_on(
    gateway: Gateway, https: aiohttp.ClientSession, field: str
) -> None:
    """The reported reproduction: this used to stop every write of every tenant (503 until a restart)."""
    kept, item = await delivered(gateway, https)
    worker = Emo(gateway, https, "worker-1")
    result = {"id": item["id"], "token": item["token"], "outcome": "failed", field: SURROGATE}
    assert_bad(await worker("POST", "/jobs/results", {"results": [result]}), field)
    await assert_still_serving(gateway, https, kept)
    # Nothing of the refused request was applied: the claim is still the worker's to report on.
    good = {"id": item["id"], "token": item["token"], "outcome": "succeeded"}
    answer = await worker.ok("POST", "/jobs/results", {"results": [good]})
    assert [r["status"] for r in answer["results"]] == ["ok"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": SURROGATE}, "id"),
        ({"id": "m\n"}, "id"),
        ({"steps": [{"name": SURROGATE}]}, "steps"),
        ({"partial": {"k": SURROGATE}}, "partial"),
        ({"fields": {SURROGATE: 1}}, "fields"),
        ({"signature": "GET /x 5xx\nforged"}, "signature"),
    ],
)
async def test_every_text_of_a_result_is_checked(
    gateway: Gateway, https: aiohttp.ClientSession, change: dict[str, Any], field: str
) -> None:
    kept, item = await delivered(gateway, https)
    result = {"id": item["id"], "token": item["token"], "outcome": "failed", **change}
    assert_bad(await Emo(gateway, https, "worker-1")("POST", "/jobs/results", {"results": [result]}), field)
    await assert_still_serving(gateway, https, kept)


@pytest.mark.parametrize("path", ["/jobs/ack", "/jobs/renew"])
async def test_ids_with_a_lone_surrogate_are_refused(
    gateway: Gateway, https: aiohttp.ClientSession, path: str
) -> None:
    kept, _ = await delivered(gateway, https)
    for ids in ([SURROGATE], ["ok-id", "nl\n"]):
        assert_bad(await Emo(gateway, https, "worker-1")("POST", path, ids), "ids")
    await assert_still_serving(gateway, https, kept)


async def test_sendbatch_queue_names_with_a_lone_surrogate_are_refused(
    gateway: Gateway, https: aiohttp.ClientSession
) -> None:
    kept, _ = await delivered(gateway, https)
    producer = Emo(gateway, https, "producer-1")
    assert_bad(await producer("POST", "/_sendbatch", {SURROGATE: [{"a": 1}], "jobs": [{"n": 3}]}), "queue")
    await assert_still_serving(gateway, https, kept)  # nothing of the batch was sent, not even to `jobs`


async def test_a_payload_with_a_surrogate_escape_is_kept_as_json_text(
    gateway: Gateway, https: aiohttp.ClientSession
) -> None:
    """A payload is stored as JSON bytes: the escape is legitimate JSON and comes back as it went in."""
    producer = Emo(gateway, https, "producer-1")
    await producer.ok("POST", "/texts/send", {"text": SURROGATE})
    (item,) = await Emo(gateway, https, "admin-1").ok("GET", "/texts/peek")
    assert item["payload"] == {"text": SURROGATE}
    status, body, _ = await call(https, "GET", gateway.url + "/readyz")
    assert (status, body) == (200, {"ready": True})


# -------------------------------------------------------------------------- names matched whole
@pytest.mark.parametrize("group", ["poison\n", "poison\r", "tab\there", "nul\x00", "del\x7f"])
async def test_group_names_are_matched_whole_and_hold_no_control_characters(
    gateway: Gateway, https: aiohttp.ClientSession, group: str
) -> None:
    producer = Emo(gateway, https, "producer-1")
    assert_bad(await producer("POST", "/jobs/send", {"n": 1}, params={"group": group}), "group")
    assert_bad(await producer("POST", "/_sendbatch", {"jobs": [{"n": 1}]}, params={"group": group}), "group")
    assert await Emo(gateway, https, "admin-1").ok("GET", "/jobs/size") == 0


async def test_queue_names_with_a_trailing_newline_are_not_queues(
    gateway: Gateway, https: aiohttp.ClientSession
) -> None:
    producer = Emo(gateway, https, "producer-1")
    status, body, _ = await producer("POST", "/jobs%0A/send", {"n": 1})
    assert 400 <= status < 500, body
    assert_bad(await producer("POST", "/_sendbatch", {"jobs\n": [{"n": 1}]}), "queue")
    assert gateway.service.core.list_queues() == []


def test_the_core_matches_names_whole() -> None:
    core = QueueCore()
    for name in ("jobs\n", "jobs\r\n"):
        with pytest.raises(InvalidArgument):
            core.create_queue(name, now=1.0)
    core.create_queue("jobs", now=1.0)
    (result,) = core.send("jobs", [SendRequest(b"x", group="g\n")], now=1.0)
    assert isinstance(result, InvalidArgument) and result.details["field"] == "group"
    (result,) = core.send("jobs", [SendRequest(b"x", message_id="m\n")], now=1.0)
    assert isinstance(result, InvalidArgument) and result.details["field"] == "id"


# ------------------------------------------------------------------------------ strict numbers
@pytest.mark.parametrize(
    ("path", "name", "value"),
    [
        ("/jobs/poll", "limit", "٣"),  # an Arabic-Indic digit: int() takes it
        ("/jobs/poll", "limit", "1_0"),
        ("/jobs/poll", "limit", " 5"),
        ("/jobs/poll", "limit", "+5"),
        ("/jobs/poll", "limit", "1e3"),
        ("/jobs/poll", "ttl", "nan"),
        ("/jobs/poll", "ttl", "inf"),
        ("/jobs/poll", "ttl", "1e1"),
        ("/jobs/poll", "wait", "٣"),
        ("/jobs/renew", "token", "٣"),
        ("/jobs/renew", "token", " 5"),
        ("/jobs/renew", "token", "1_0"),
    ],
)
async def test_numbers_are_plain_ascii(
    gateway: Gateway, https: aiohttp.ClientSession, path: str, name: str, value: str
) -> None:
    worker = Emo(gateway, https, "worker-1")
    method, body = ("GET", None) if path.endswith("poll") else ("POST", ["some-id"])
    assert_bad(await worker(method, path, body, params={name: value}), name)
    # Plain digits still work.
    good = {"limit": "2", "ttl": "1.5", "wait": "0", "token": "5"}[name]
    status, _, _ = await worker(method, path, body, params={name: good})
    assert status in (200, 409), (name, good)


# ---------------------------------------------------------------------------- JSON everywhere
@pytest.mark.parametrize(
    ("method", "path", "status", "admin_shape"),
    [
        ("GET", "/admin/v1/no-such-route", 404, True),
        ("GET", "/no/such/route", 404, False),
        ("POST", "/healthz", 405, False),
        ("GET", "/", 405, False),
        ("DELETE", "/admin/v1/fences", 405, True),
    ],
)
async def test_unknown_routes_and_wrong_methods_answer_json_on_the_gateway(
    gateway: Gateway, https: aiohttp.ClientSession, method: str, path: str, status: int, admin_shape: bool
) -> None:
    code, body, headers = await call(https, method, gateway.url + path, key=secret(gateway, "admin-1"))
    assert code == status, body
    error = body["error"]  # one shape, admin routes included (docs/errors.md)
    assert error["code"] == ("no_such_route" if status == 404 else "method_not_allowed"), body
    assert path in error["message"]
    if status == 405:
        assert headers["Allow"]


async def test_the_sqs_face_keeps_its_dialect_for_post_root(
    gateway: Gateway, https: aiohttp.ClientSession
) -> None:
    async with https.post(
        gateway.url + "/", data=b"{}", headers={"X-Amz-Target": "AmazonSQS.Nope"}
    ) as response:
        assert response.status in (400, 403)
        assert response.content_type == "application/x-amz-json-1.0"
        assert "__type" in json.loads(await response.read())


# --------------------------------------------------------------------------------- internal API
@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The queue server's internal API and admin routes as its process composes them, served in process
    (kit.inprocess; overrides conftest's subprocess): the requests are the point, not the process."""
    async with serve_in_process(tmp_path / "data", keys=KeyRing(list(CREDENTIALS))) as served:
        yield served


async def raw(
    server: InProcessServer, method: str, path: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        return await call(session, method, server.url + path, body, **kwargs)


async def test_the_internal_api_refuses_bad_text_and_keeps_serving(server: InProcessServer) -> None:
    q = "/v1/queues/jobs"
    status, _, _ = await raw(server, "POST", q + "/send", {"create": True, "messages": [{"body": "kept"}]})
    assert status == 200
    refused = [
        ({"group": "g\n"}, "group"),
        ({"id": "m\r\n"}, "id"),
        ({"dedup_id": "d\x00"}, "dedup_id"),
        ({"content_type": "text/plain\r\nX-Forged: 1"}, "content_type"),
    ]
    for change, field in refused:
        result = await raw(server, "POST", q + "/send", {"messages": [{"body": "x", **change}]})
        assert_bad(result, field)
    # A lone surrogate escape: orjson refuses it while parsing (400, nothing reaches the core).
    body = json.dumps({"messages": [{"body": SURROGATE}]}).encode()
    status, error, _ = await raw(server, "POST", q + "/send", body)
    assert status == 400 and error["error"]["code"] == "invalid_argument"
    assert_bad(await raw(server, "POST", q + "/receive", {"worker": "w\n"}), "worker")
    assert_bad(await raw(server, "POST", q + "/ack", {"ids": ["a\n"]}), "ids")
    assert_bad(await raw(server, "GET", q + "/group", params={"name": "g\n"}), "name")
    for value in ("٣", "1_0", " 5", "1e3"):
        assert_bad(await raw(server, "GET", q + "/peek", params={"limit": value}), "limit")
    assert_bad(await raw(server, "POST", q + "/receive", {"ttl": "nan"}), "ttl")
    assert_bad(await raw(server, "POST", q + "/receive", {"wait": "٣"}), "wait")
    # Still serving: ready, and the earlier message intact.
    assert (await raw(server, "GET", "/readyz"))[:2] == (200, {"ready": True})
    status, peeked, _ = await raw(server, "GET", q + "/peek", params={"limit": "10"})
    assert status == 200 and [m["body"] for m in peeked["messages"]] == ["kept"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", "/admin/v1/nope", 404),
        ("DELETE", "/healthz", 405),
        ("PUT", "/v1/queues", 405),
    ],
)
async def test_unknown_routes_and_wrong_methods_answer_json_on_the_queue_server(
    server: InProcessServer, method: str, path: str, status: int
) -> None:
    code, body, headers = await raw(server, method, path)
    assert code == status, body
    error = body["error"]  # one shape, admin routes included (docs/errors.md)
    assert error["code"] == ("no_such_route" if status == 404 else "method_not_allowed"), body
    assert path in error["message"]
    if status == 405:
        assert "GET" in headers["Allow"]


# ------------------------------------------------------------------------ the core, defence in depth
def test_the_core_refuses_text_it_could_not_store_before_changing_anything() -> None:
    core = QueueCore()
    core.create_queue("jobs", now=1.0)
    core.drain_effects()
    for request, field in (
        (SendRequest(b"x", content_type=SURROGATE), "content_type"),
        (SendRequest(b"x", dedup_id=SURROGATE), "dedup_id"),
    ):
        (result,) = core.send("jobs", [request], now=1.0)
        assert isinstance(result, InvalidArgument) and result.details["field"] == field
    assert core.metrics("jobs", 1.0).total == 0 and core.drain_effects() == []
    with pytest.raises(InvalidArgument):
        core.create_queue("labelled", now=1.0, attributes={"labels": {"k": SURROGATE}})
    with pytest.raises(InvalidArgument):
        core.create_queue("probing", now=1.0, attributes={"probe_payload": {"k": SURROGATE}})
    with pytest.raises(InvalidArgument):
        core.receive("jobs", 1, None, SURROGATE, now=1.0)

    core.send("jobs", [SendRequest(b"x", group="g")], now=1.0)
    (delivery,) = core.receive("jobs", 1, 30.0, "w", now=2.0)
    core.drain_effects()
    for change in ({"reason": SURROGATE}, {"signature": "a\nb"}, {"partial": [SURROGATE]}):
        result = AttemptResult(delivery.message_id, delivery.token, "failed", **change)
        with pytest.raises(InvalidArgument) as refused:
            core.report("jobs", "w", [result], now=3.0)
        assert refused.value.details["field"] == next(iter(change))
    assert core.drain_effects() == []  # the whole request refused before anything changed
    assert core.metrics("jobs", 3.0).in_flight == 1


# -------------------------------------------------------------------- the group commit's isolation
def inserted(key: int, group: str) -> MessageInserted:
    return MessageInserted(1, key, f"m{key}", group, b"body", "text/plain", b"", 0.0, None)


def stored_ids(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [row[0] for row in db.execute("SELECT id FROM messages ORDER BY key")]
    finally:
        db.close()


def test_one_submissions_bad_data_fails_that_submission_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "queue.sqlite3")
    store.open(1.0)
    try:
        submissions = [([inserted(1, "a")], []), ([inserted(2, SURROGATE)], []), ([inserted(3, "c")], [3])]
        done = commit(store, submissions)
        assert set(done.refused) == {1} and isinstance(done.refused[1], StoreDataError)
        assert done.transactions == 2 and done.max_key == 3 and set(done.bodies) == {3}
        # The store is healthy: the next batch commits in one transaction.
        assert commit(store, [([inserted(4, "d")], [])]).refused == {}
    finally:
        store.close()
    assert stored_ids(tmp_path / "queue.sqlite3") == ["m1", "m3", "m4"]


async def test_the_writer_fails_a_bad_submission_alone_and_a_real_failure_stops_the_store(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queue.sqlite3"
    store = SqliteStore(path)
    store.open(1.0)
    log = DurableLog(store, asyncio.get_running_loop())
    try:
        futures = [
            log.submit([inserted(1, "a")]),
            log.submit([inserted(2, SURROGATE)]),
            log.submit([inserted(3, "c")]),
        ]
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
        assert isinstance(outcomes[1], StoreDataError)
        assert not isinstance(outcomes[0], BaseException) and not isinstance(outcomes[2], BaseException)
        assert log.failed is None
        await asyncio.wait_for(log.submit([inserted(4, "d")]), 30)
        await asyncio.wait_for(log.barrier(), 30)

        # A real SQLite failure (the table is gone: sqlite3.OperationalError) still stops every write.
        other = sqlite3.connect(path)
        other.execute("DROP TABLE messages")
        other.close()
        with pytest.raises(StoreError) as failed:
            await asyncio.wait_for(log.submit([inserted(5, "e")]), 30)
        assert not isinstance(failed.value, StoreDataError)
        assert isinstance(log.failed, StoreError)
        with pytest.raises(StoreError):
            await asyncio.wait_for(log.submit([inserted(6, "f")]), 30)
        with pytest.raises(StoreError):
            await asyncio.wait_for(log.barrier(), 30)
    finally:
        await asyncio.to_thread(log.close)
        store.close()


# ------------------------------------------------------------------------------- the wire log
async def test_delivery_records_of_a_payload_with_a_surrogate_escape_are_written(
    delivery_gateway: Gateway,  # noqa: F811
) -> None:
    """A payload holding the escape (with a field redaction rewrites) is delivered, acked and recorded:
    no record is dropped for text it cannot encode."""
    gw = delivery_gateway
    assert gw.deliveries is not None
    context = ssl.create_default_context(cafile=str(gw.ca_file))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        producer, worker = Emo(gw, session, "producer-1"), Emo(gw, session, "worker-1")
        payload = {"text": SURROGATE, "password": "hunter2-very-secret"}
        await producer.ok("POST", "/texts/send", payload, params={"group": "g"})
        (item,) = await worker.ok("GET", "/texts/poll")
        assert item["payload"] == payload
        result = {"id": item["id"], "token": item["token"], "outcome": "succeeded", "reason": "done"}
        answer = await worker.ok("POST", "/texts/results", {"results": [result]})
        assert [r["status"] for r in answer["results"]] == ["ok"]
    gw.deliveries.flush()
    written = list(read_records(gw.deliveries.directory))
    kinds = [(r["kind"], r.get("message_id")) for r in written]
    assert ("delivery", item["id"]) in kinds, kinds
    assert len([k for k in kinds if k[1] == item["id"]]) >= 2, kinds  # the delivery and the result's log


async def test_readiness_follows_the_stores_real_health(
    gateway: Gateway, https: aiohttp.ClientSession
) -> None:
    """/readyz is 503 once the durable log failed for real (a SQLite error, not a request's data), while
    /healthz stays liveness."""
    producer = Emo(gateway, https, "producer-1")
    await producer.ok("POST", "/jobs/send", {"n": 1})
    other = sqlite3.connect(gateway.service.data_dir / "queue.sqlite3")
    other.execute("DROP TABLE messages")  # the next write fails inside SQLite: sqlite3.OperationalError
    other.close()
    status, body, _ = await producer("POST", "/jobs/send", {"n": 2})
    assert status == 503 and body["error"]["code"] == "store_unavailable", body
    status, body, _ = await call(https, "GET", gateway.url + "/readyz")
    assert status == 503 and body["ready"] is False and body["error"]["code"] == "not_ready"
    assert (await call(https, "GET", gateway.url + "/healthz"))[:2] == (200, {"status": "ok"})


# ------------------------------------------------------------------------------------ SQS face
def sqs_client(gateway: Gateway, key_id: str) -> Any:
    credential = gateway.credential(key_id)
    return boto3.client(
        "sqs",
        endpoint_url=gateway.url,
        region_name="us-east-1",
        aws_access_key_id=credential.id,
        aws_secret_access_key=credential.secret,
        verify=str(gateway.ca_file),
        config=Config(retries={"mode": "standard", "max_attempts": 1}),
    )


async def test_the_sqs_face_matches_names_and_ids_whole(gateway: Gateway) -> None:
    sqs = sqs_client(gateway, "admin-1")
    url = (
        await asyncio.to_thread(sqs.create_queue, QueueName="jobs.fifo", Attributes={"FifoQueue": "true"})
    )["QueueUrl"]
    refused = [
        {"MessageGroupId": "g\n", "MessageDeduplicationId": "d"},
        {"MessageGroupId": "g", "MessageDeduplicationId": "d\n"},
    ]
    for params in refused:
        with pytest.raises(ClientError) as error:
            await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="x", **params)
        assert error.value.response["Error"]["Code"] == "InvalidParameterValue", params
    with pytest.raises(ClientError) as error:
        await asyncio.to_thread(sqs.create_queue, QueueName="jobs\n")
    assert error.value.response["Error"]["Code"] == "InvalidParameterValue"
    with pytest.raises(ClientError) as error:
        await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="a\x01b", MessageGroupId="g")
    assert error.value.response["Error"]["Code"] == "InvalidMessageContents"
    await asyncio.to_thread(
        sqs.send_message, QueueUrl=url, MessageBody="kept", MessageGroupId="g", MessageDeduplicationId="d"
    )
    assert gateway.service.core.metrics("t1.jobs.fifo", 0.0).total == 1
