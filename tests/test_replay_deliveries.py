"""The gateway's side of the wire log (gateway.deliveries): a `delivery` record per message handed to a
worker on either face, `ack`/`release` events for the claims workers end, redacted like the proxy's."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from gateway_support import Gateway, delivery_gateway, sqs_client  # noqa: F401 (fixture)

from wirelog.reader import read_records

SECRET = "hunter2-very-secret"


def records(gw: Gateway) -> list[dict[str, Any]]:
    assert gw.deliveries is not None
    gw.deliveries.flush()
    return list(read_records(gw.deliveries.directory))


async def emodb(
    session: aiohttp.ClientSession, gw: Gateway, key_id: str, method: str, path: str, **kwargs: Any
) -> Any:
    headers = {"X-BV-API-Key": gw.credential(key_id).secret, **kwargs.pop("headers", {})}
    async with session.request(method, f"{gw.url}/queue/1/{path}", headers=headers, **kwargs) as response:
        assert response.status in (200, 409), await response.text()
        return await response.json()


async def test_emodb_poll_ack_and_release(delivery_gateway: Gateway) -> None:  # noqa: F811
    gw = delivery_gateway
    seen: list[dict[str, Any]] = []
    assert gw.deliveries is not None
    gw.deliveries.listener = seen.append
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_ssl(gw))) as session:
        for group, body in (("g1", {"n": 1}), ("g1", {"n": 2, "password": SECRET}), ("g2", {"n": 3})):
            await emodb(session, gw, "producer-1", "POST", f"orders/send?group={group}", json=body)
        polled = await emodb(session, gw, "worker-1", "GET", "orders/poll?limit=10&ttl=30")
        by_n = {orjson.loads(orjson.dumps(m["payload"]))["n"]: m for m in polled}
        assert sorted(by_n) == [1, 2, 3]
        one, two, three = by_n[1], by_n[2], by_n[3]
        await emodb(session, gw, "worker-1", "POST", f"orders/ack?token={one['token']}", json=[one["id"]])
        await emodb(
            session, gw, "worker-1", "POST", f"orders/renew?ttl=0&token={two['token']}", json=[two["id"]]
        )
        stale = await emodb(session, gw, "worker-1", "POST", "orders/ack?token=1", json=[three["id"]])
        assert stale["error"]["code"] == "stale_claim"
        await emodb(session, gw, "worker-1", "POST", "orders/ack", json=[three["id"]])  # tokenless
    written = records(gw)
    assert [r["id"] for r in seen] == [r["id"] for r in written]  # the listener saw each, in order
    deliveries = {r["message_id"]: r for r in written if r["kind"] == "delivery"}
    assert set(deliveries) == {one["id"], two["id"], three["id"]}
    first = deliveries[one["id"]]
    assert first["writer"] == "gateway" and first["queue"] == "orders" and first["tenant"] == "t1"
    assert first["face"] == "emodb" and first["worker"] == "worker-1" and first["group"] == "g1"
    assert first["lease"] == one["token"] and first["attempt"] == first["receive_count"] == 1
    assert orjson.loads(first["body"]) == {"n": 1} and first["body_redacted"] is False
    assert first["content_type"] == "application/json" and first["seq"] == one["seq"]
    secret = deliveries[two["id"]]
    assert secret["body_redacted"] is True and "redacted:" in secret["body"] and SECRET not in secret["body"]
    events = [(r["event"], r["message_id"], r["lease"]) for r in written if r["kind"] == "event"]
    assert events == [
        ("ack", one["id"], one["token"]),
        ("release", two["id"], two["token"]),
        ("ack", three["id"], None),
    ]
    raw = (
        b"".join(p.read_bytes() for p in gw.deliveries.directory.iterdir() if p.is_file())
        if gw.deliveries
        else b""
    )
    assert SECRET.encode() not in raw


async def test_sqs_receive_visibility_and_delete(delivery_gateway: Gateway) -> None:  # noqa: F811
    gw = delivery_gateway
    sqs = sqs_client(gw, "admin-1")
    worker = sqs_client(gw, "worker-1")
    url = (await _call(sqs.create_queue, QueueName="jobs.fifo", Attributes={"FifoQueue": "true"}))["QueueUrl"]
    attributes = {"kind": {"DataType": "String", "StringValue": "refund"}}
    await _call(
        sqs.send_message,
        QueueUrl=url,
        MessageBody='{"job": 1}',
        MessageGroupId="acct-1",
        MessageDeduplicationId="d1",
        MessageAttributes=attributes,
    )
    first = (await _call(worker.receive_message, QueueUrl=url, MessageAttributeNames=["All"]))["Messages"][0]
    await _call(
        worker.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle=first["ReceiptHandle"],
        VisibilityTimeout=0,
    )
    second = (await _call(worker.receive_message, QueueUrl=url))["Messages"][0]
    await _call(worker.delete_message, QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    written = records(gw)
    deliveries = [r for r in written if r["kind"] == "delivery"]
    assert [(r["attempt"], r["face"], r["queue"], r["group"]) for r in deliveries] == [
        (1, "sqs", "jobs.fifo", "acct-1"),
        (2, "sqs", "jobs.fifo", "acct-1"),
    ]
    assert deliveries[0]["attributes"] == attributes and deliveries[0]["body"] == '{"job": 1}'
    tokens = [int(m["Attributes"]["StrictqFencingToken"]) for m in (first, second)]
    events = [(r["event"], r["lease"]) for r in written if r["kind"] == "event"]
    assert events == [("release", tokens[0]), ("ack", tokens[1])]


def _ssl(gw: Gateway) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(gw.ca_file))


async def _call(method: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(method, **kwargs)
