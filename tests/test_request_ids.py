"""Request ids (issue 17): one per gateway request, named in every answer on both faces, kept with the
messages a send stored, and handed back to the pollers that ask for it; the pieces below the gateway
(the rule, the store's compact column and its migration, the cluster codec, the results contract, the
proxy's tag, wire-log compatibility).

The faces run in the real in-process gateway (TLS on 127.0.0.1, gateway_support) with its delivery log;
boto3 and aiohttp are the clients. tests/test_request_ids_e2e.py runs the whole chain through a real
`strictq serve`, its egress proxy and the SDK.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import ssl
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import msgpack  # type: ignore[import-untyped]
import orjson
import pytest
from gateway_support import Gateway, delivery_gateway, sqs_client  # noqa: F401 (fixture)

from cluster.codec import CodecError, EffectsFrame, decode_frame, encode_frame
from fencing.addons.tagging import MalformedTags, parse_into
from fencing.context import CallContext
from protocol import headers
from protocol.request_ids import accept_request_id, is_request_id, new_request_id
from queue_core.machine import InvalidArgument
from queue_core.machine.effects import MessageInserted
from queue_core.machine.inputs import SendRequest
from queue_core.results import parse_results, result_json
from queue_core.store import SCHEMA, SqliteStore, pack_request_id, unpack_request_id
from queue_core.wire import decode_send_request, encode_send_request
from wirelog.reader import RecordFilter, read_records
from wirelog.record import compat, decode_line, http_record, http_request
from wirelog.writer import WireLogWriter

UUID_SHAPED = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CAPABILITIES = headers.CAPABILITIES


# ------------------------------------------------------------------------------------------ the rule
def test_ids_are_accepted_when_well_formed_and_made_otherwise() -> None:
    for good in ("a", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "Root=1-5759e988-bd862e3fe1be46a994272793",
                 "order:42/retry@2", "QUJD+/=", "x" * 128):  # fmt: skip
        assert is_request_id(good) and accept_request_id(good) == good
    for bad in ("", "x" * 129, "has space", "new\nline", "tab\t", "é", "semi;colon", "quote\"", None):
        made = accept_request_id(bad)  # type: ignore[arg-type]
        assert made != bad and UUID_SHAPED.fullmatch(made), (bad, made)
        assert not is_request_id(bad)
    assert not is_request_id(7) and not is_request_id(b"abc")
    made = {new_request_id() for _ in range(1000)}
    assert len(made) == 1000 and all(UUID_SHAPED.fullmatch(m) for m in made)


def test_the_store_keeps_uuid_shaped_ids_in_16_bytes_and_others_as_text() -> None:
    rid = new_request_id()
    packed = pack_request_id(rid)
    assert isinstance(packed, bytes) and len(packed) == 16 and unpack_request_id(packed) == rid
    for other in ("order-42", rid.upper(), rid.replace("-", ""), "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fz",
                  "0f1e2d3c-4b5a-6978-8796-a5b4c3d2-e1f", "-" * 36):  # fmt: skip
        assert pack_request_id(other) == other and unpack_request_id(other) == other
    assert pack_request_id(None) is None and unpack_request_id(None) is None


# ------------------------------------------------------------------------------- the store and codec
def _insert(key: int, request_id: str | None) -> MessageInserted:
    return MessageInserted(1, key, f"{key:016x}", "g", b"body", "text/plain", b"", 0.0, None, request_id)


def test_the_store_keeps_the_id_with_the_body_and_upgrades_an_older_store(tmp_path: Path) -> None:
    """A store written before request ids (no column) opens with the column added: its messages read no
    id, new ones keep theirs, across a reopen."""
    path = tmp_path / "queue.sqlite3"
    old_schema = SCHEMA.replace(", digest BLOB, request_id\n", ", digest BLOB\n")
    assert old_schema != SCHEMA
    db = sqlite3.connect(path)
    db.executescript(old_schema)
    db.execute(
        "INSERT INTO messages (key, qid, id, grp, body, content_type, extra, available_at)"
        " VALUES (1, 1, 'old', 'g', x'6f6c64', 'text/plain', x'', 0)"
    )
    db.execute("INSERT INTO queues VALUES (1, 'q', '{}', 0)")
    db.commit()
    db.close()
    rid, text = new_request_id(), "client/order-7"
    store = SqliteStore(path)
    store.open(now=1.0)
    store.apply([_insert(2, rid), _insert(3, text), _insert(4, None)])
    assert store.fetch_bodies([1, 2, 3, 4]) == {
        1: (b"old", "text/plain", b"", None),
        2: (b"body", "text/plain", b"", rid),
        3: (b"body", "text/plain", b"", text),
        4: (b"body", "text/plain", b"", None),
    }
    store.close()
    again = SqliteStore(path)
    again.open(now=2.0)
    assert again.fetch_bodies([2, 3])[2][3] == rid
    kinds = dict(again.db.execute("SELECT key, typeof(request_id) FROM messages").fetchall())
    assert kinds == {1: "null", 2: "blob", 3: "text", 4: "null"}  # 16 bytes for the UUID-shaped id
    again.close()


def test_cluster_frames_carry_the_id_and_frames_of_older_owners_still_decode() -> None:
    rid = new_request_id()
    frame = EffectsFrame((_insert(5, rid), _insert(6, None)))
    assert decode_frame(encode_frame(frame)).effects == frame.effects
    # An owner from before request ids wrote MessageInserted (type 3) with 9 fields: no id, as before.
    old = [3, 1, 7, "m", "g", b"body", "text/plain", b"", 0.0, None]
    (effect,) = decode_frame(msgpack.packb([1, 0, [old]], use_bin_type=True)).effects
    assert effect == MessageInserted(1, 7, "m", "g", b"body", "text/plain", b"", 0.0, None)
    assert effect.request_id is None
    with pytest.raises(CodecError, match="MessageInserted"):  # one field short of that: not a frame
        decode_frame(msgpack.packb([1, 0, [old[:-1]]], use_bin_type=True))


def test_the_internal_api_forwards_the_id_and_checks_it() -> None:
    request = SendRequest(b"x", group="g", request_id="rid-1")
    entry = encode_send_request(request)
    assert entry["request_id"] == "rid-1" and decode_send_request(entry).request_id == "rid-1"
    assert "request_id" not in encode_send_request(SendRequest(b"x"))
    with pytest.raises(InvalidArgument, match="request_id"):
        decode_send_request({"body": "x", "request_id": "no spaces allowed"})


def test_results_carry_the_id_as_log_data() -> None:
    item = {"id": "m", "token": 5, "outcome": "failed", "request_id": "r-1"}
    (result,) = parse_results({"results": [item]})
    assert result.request_id == "r-1" and result_json(result)["request_id"] == "r-1"
    (plain,) = parse_results({"results": [{"id": "m", "token": 5, "outcome": "succeeded"}]})
    assert plain.request_id is None and "request_id" not in result_json(plain)
    (garbled,) = parse_results({"results": [{"id": "m", "token": 5, "outcome": "failed", "request_id": 7}]})
    assert garbled.error is not None and garbled.error.details["field"] == "request_id"


# ----------------------------------------------------------------------------------- the proxy's tag
def _tags(**extra: bytes) -> list[tuple[bytes, bytes]]:
    found = [(b"x-strictq-message-id", b"m-1"), (b"x-strictq-call", b"1")]
    return found + [(name.encode(), value) for name, value in extra.items()]


def test_the_proxy_reads_the_request_id_tag_and_refuses_a_malformed_one() -> None:
    tag = headers.REQUEST_ID_TAG.lower()
    ctx = CallContext(started=0.0)
    parse_into(ctx, _tags(**{tag: b"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}), 256)
    assert ctx.request_id == "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    ctx = CallContext(started=0.0)
    parse_into(ctx, _tags(), 256)  # optional: calls of SDKs that do not send it
    assert ctx.request_id is None and ctx.message_id == "m-1"
    with pytest.raises(MalformedTags, match="X-Strictq-Request-Id"):
        parse_into(CallContext(started=0.0), _tags(**{tag: b"not one"}), 256)


# ------------------------------------------------------------------------------ wire-log compatibility
def test_records_written_before_request_ids_still_read(tmp_path: Path) -> None:
    """A record of an older writer has no `request_id` key: readers see it as null, and new records
    carry it; the filter tells them apart."""
    old_line = (
        b'{"v":1,"kind":"http","id":"proxy-0-20261122T100000000000Z-1","ts":1795341600.0,"writer":"proxy-0",'
        b'"worker":"w1","queue":"orders","message_id":"m-1","group":"g","lease":5,"attempt":1,"call":1,'
        b'"request":{"method":"GET","url":"http://a/b"},"response":null,"error":null,"latency_ms":1.0,'
        b'"action":"pass","replayed_from":null}'
    )
    record = compat(decode_line(old_line))
    assert record["request_id"] is None and record["message_id"] == "m-1"
    request = http_request(method="GET", url="http://a/b", headers=None, body=None)
    older = {k: v for k, v in http_record(request=request, response=None, message_id="m-1").items()}
    del older["request_id"]  # what a writer from before request ids wrote
    with WireLogWriter(tmp_path, "proxy-0", compress=False) as writer:
        writer.write(older)
        writer.write(http_record(request=request, response=None, message_id="m-2", request_id="rid-2"))
    records = list(read_records(tmp_path))
    assert [r["request_id"] for r in records] == [None, "rid-2"]
    found = read_records(tmp_path, where=RecordFilter(request_id="rid-2"))
    assert [r["message_id"] for r in found] == ["m-2"]


# --------------------------------------------------------------------------------- the gateway's faces
def _session(gw: Gateway, key_id: str) -> aiohttp.ClientSession:
    context = ssl.create_default_context(cafile=str(gw.ca_file))
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context),
        headers={headers.API_KEY: gw.credential(key_id).secret},
        timeout=aiohttp.ClientTimeout(total=30),
    )


async def _emo(
    session: aiohttp.ClientSession, gw: Gateway, method: str, path: str, body: Any = None, **head: str
) -> tuple[int, Any, Any]:
    data = None if body is None else orjson.dumps(body)
    sent = {**({"Content-Type": "application/json"} if data is not None else {}), **head}
    async with session.request(method, gw.url + path, data=data, headers=sent) as answer:
        raw = await answer.read()
        return answer.status, answer.headers, orjson.loads(raw) if raw else None


async def test_every_emodb_answer_names_its_request_and_sends_keep_it(delivery_gateway: Gateway) -> None:  # noqa: F811
    gw = delivery_gateway
    async with _session(gw, "producer-1") as producer, _session(gw, "worker-1") as worker:
        mine = f"order-{uuid.uuid4().hex[:8]}/try=1"
        status, head, body = await _emo(producer, gw, "POST", "/queue/1/rq/send?group=g", {"n": 1},
                                        **{headers.REQUEST_ID: mine})  # fmt: skip
        assert (status, body, head[headers.REQUEST_ID]) == (200, {"success": True}, mine)
        status, head, _ = await _emo(producer, gw, "POST", "/queue/1/rq/send?group=g", {"n": 2})
        made = head[headers.REQUEST_ID]
        assert status == 200 and UUID_SHAPED.fullmatch(made)
        for bad in ("two words", "x" * 129):
            status, head, _ = await _emo(producer, gw, "POST", "/queue/1/rq/send?group=g", {"n": 3},
                                         **{headers.REQUEST_ID: bad})  # fmt: skip
            assert status == 200 and UUID_SHAPED.fullmatch(head[headers.REQUEST_ID])
        batch = "batch-7"
        status, _, _ = await _emo(producer, gw, "POST", "/queue/1/_sendbatch?group=h",
                                  {"rq": [{"n": 4}, {"n": 5}]}, **{headers.REQUEST_ID: batch})  # fmt: skip
        assert status == 200

        # A plain EmoDB poll: the items it always had, nothing new.
        status, head, items = await _emo(worker, gw, "GET", "/queue/1/rq/poll?ttl=30&limit=10")
        assert status == 200 and UUID_SHAPED.fullmatch(head[headers.REQUEST_ID])
        assert items and all("request_id" not in item for item in items)
        assert {tuple(sorted(item)) for item in items} == {
            ("attempt", "group", "id", "payload", "queue_ref", "seq", "token")
        }
        ids = [item["id"] for item in items]
        await _emo(worker, gw, "POST", "/queue/1/rq/renew?ttl=0", ids)  # hand them back
        # A poll declaring `request_ids` (the SDK does): each item names the request that sent it.
        status, _, items = await _emo(worker, gw, "GET", "/queue/1/rq/poll?ttl=30&limit=10",
                                      **{CAPABILITIES: "request_ids"})  # fmt: skip
        by_payload = {item["payload"]["n"]: item["request_id"] for item in items}
        assert by_payload[1] == mine and by_payload[2] == made
        assert by_payload[4] == by_payload[5] == batch
        assert UUID_SHAPED.fullmatch(by_payload[3])

        # The delivery records of both polls name the sending request.
        assert gw.deliveries is not None
        gw.deliveries.flush()
        deliveries = [r for r in read_records(gw.deliveries.directory) if r["kind"] == "delivery"]
        assert {r["request_id"] for r in deliveries if orjson.loads(r["body"])["n"] == 1} == {mine}

        # Error bodies name the request beside the error, as the header does.
        status, head, body = await _emo(worker, gw, "POST", "/queue/1/rq/ack", {"not": "a list"},
                                        **{headers.REQUEST_ID: "ack-1"})  # fmt: skip
        assert status == 400 and body["request_id"] == head[headers.REQUEST_ID] == "ack-1"
        assert body["error"]["code"] == "invalid_argument"
        status, head, body = await _emo(worker, gw, "GET", "/queue/1/rq/nowhere")
        assert status == 404 and body["request_id"] == head[headers.REQUEST_ID]
        stale = items[0]
        status, head, body = await _emo(worker, gw, "POST", f"/queue/1/rq/ack?token={stale['token'] - 1}",
                                        [stale["id"]])  # fmt: skip
        assert status == 409 and body["request_id"] == head[headers.REQUEST_ID]
        # Other routes of the gateway name their request in the header.
        async with worker.get(gw.url + "/healthz", headers={headers.REQUEST_ID: "health-1"}) as answer:
            assert answer.headers[headers.REQUEST_ID] == "health-1"


async def test_results_name_the_request_in_their_log_records(delivery_gateway: Gateway) -> None:  # noqa: F811
    gw = delivery_gateway
    async with _session(gw, "producer-1") as producer, _session(gw, "worker-1") as worker:
        named = {headers.REQUEST_ID: "rid-9"}
        await _emo(producer, gw, "POST", "/queue/1/jobs/send?group=g", {"n": 1}, **named)
        _, _, (item,) = await _emo(worker, gw, "GET", "/queue/1/jobs/poll?ttl=30",
                                   **{CAPABILITIES: "results, probes, request_ids"})  # fmt: skip
        assert item["request_id"] == "rid-9"
        report = {"id": item["id"], "token": item["token"], "outcome": "failed", "reason": "boom"}
        status, _, body = await _emo(worker, gw, "POST", "/queue/1/jobs/results",
                                     {"results": [{**report, "request_id": "not valid"}]})  # fmt: skip
        assert status == 400 and body["error"]["details"]["field"] == "request_id"
        status, _, body = await _emo(worker, gw, "POST", "/queue/1/jobs/results",
                                     {"results": [{**report, "request_id": item["request_id"]}]})  # fmt: skip
        assert status == 200 and body["results"][0]["status"] == "ok", body
    assert gw.deliveries is not None
    gw.deliveries.flush()
    records = list(read_records(gw.deliveries.directory, where=RecordFilter(request_id="rid-9")))
    assert sorted(r["kind"] for r in records) == ["delivery", "log"]
    (log,) = [r for r in records if r["kind"] == "log"]
    assert (log["message_id"], log["outcome"], log["reason"]) == (item["id"], "failed", "boom")


async def _call(method: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(method, **kwargs)


async def test_boto3_sees_what_sqs_answers_and_the_id_only_when_it_asks(delivery_gateway: Gateway) -> None:  # noqa: F811
    gw = delivery_gateway
    sqs = sqs_client(gw, "admin-1")
    url = (await _call(sqs.create_queue, QueueName="rids"))["QueueUrl"]
    sent = await _call(sqs.send_message, QueueUrl=url, MessageBody="plain")
    meta = sent["ResponseMetadata"]
    request_id = meta["RequestId"]  # botocore reads x-amzn-RequestId
    assert UUID_SHAPED.fullmatch(request_id)
    assert meta["HTTPHeaders"]["x-amzn-requestid"] == request_id
    assert "x-request-id" not in meta["HTTPHeaders"]  # a plain client gets SQS's headers only

    # A client naming its request: that id is the RequestId, and X-Request-Id is echoed to it.
    named = sqs_client(gw, "admin-1")

    def add_request_id(request: Any, **_: Any) -> None:
        request.headers[headers.REQUEST_ID] = "sqs-order-1"

    named.meta.events.register("before-sign.sqs", add_request_id)
    answer = await _call(named.send_message, QueueUrl=url, MessageBody="named")
    assert answer["ResponseMetadata"]["RequestId"] == "sqs-order-1"
    assert answer["ResponseMetadata"]["HTTPHeaders"]["x-request-id"] == "sqs-order-1"

    # Receiving: `All` and the Strictq attributes as before; the id only when asked for by name.
    received = await _call(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                           VisibilityTimeout=0)  # fmt: skip
    for message in received["Messages"]:
        assert "StrictqRequestId" not in message["Attributes"]
        assert {"SenderId", "SentTimestamp", "StrictqFencingToken"} <= set(message["Attributes"])
    received = await _call(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10,
                           MessageSystemAttributeNames=["StrictqRequestId"])  # fmt: skip
    by_body = {m["Body"]: m["Attributes"] for m in received["Messages"]}
    assert by_body["plain"]["StrictqRequestId"] == request_id
    assert by_body["named"]["StrictqRequestId"] == "sqs-order-1"
    strictq_attributes = {"StrictqRequestId", "StrictqFencingToken", "StrictqGroup", "StrictqAttempt"}
    assert set(by_body["plain"]) == strictq_attributes

    # Errors: AWS's JSON error body, with the id in x-amzn-RequestId (botocore's RequestId).
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as refused:
        await _call(named.get_queue_url, QueueName="nowhere")
    assert refused.value.response["ResponseMetadata"]["RequestId"] == "sqs-order-1"
    assert gw.deliveries is not None
    gw.deliveries.flush()
    deliveries = [r for r in read_records(gw.deliveries.directory) if r["kind"] == "delivery"]
    assert {r["body"]: r["request_id"] for r in deliveries} == {"plain": request_id, "named": "sqs-order-1"}
