"""The SDK's typed poll item (issue 13): built from the gateway's JSON in one place, with one clear error
naming the item and the field when the answer is malformed; a worker that gets such an answer hands back
what it could read and stops with that error instead of guessing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web
from test_sdk import serve

from strictq.sdk import ClientConfig, MalformedPollItem, Message, PollItem, Worker
from strictq.sdk import serve as serve_workers
from strictq.sdk.item import parse_poll

TEST_TIMEOUT = 20.0

GATEWAY_ITEM = {  # as gateway/emodb.py answers a poll
    "id": "m1",
    "payload": {"n": 1},
    "group": "g",
    "seq": 3,
    "token": 42,
    "attempt": 2,
    "queue_ref": "dedupq/orders",
    "history": {"attempts": 1, "last_reason": "boom", "steps": [{"name": "charged", "result": 7}]},
}


def test_a_gateway_item() -> None:
    item = PollItem.from_wire(GATEWAY_ITEM)
    assert (item.id, item.payload, item.group, item.seq, item.token, item.attempt) == (
        "m1",
        {"n": 1},
        "g",
        3,
        42,
        2,
    )
    assert item.queue_ref == "dedupq/orders" and not item.probe
    assert item.history.attempts == 1 and item.history.result("charged") == 7
    assert item.raw == GATEWAY_ITEM


def test_what_an_older_or_plain_server_sends() -> None:
    """A plain EmoDB answer (id and payload): its own group, no token, first attempt; an older server's
    `receive_count` and token as a decimal string; a probe."""
    plain = PollItem.from_wire({"id": "m2", "payload": "x"})
    assert (plain.group, plain.seq, plain.token, plain.attempt, plain.queue_ref) == ("m2", 0, None, 1, None)
    assert not plain.history
    older = PollItem.from_wire({"id": "m3", "receive_count": 4, "token": "4294967297", "group": ""})
    assert (older.attempt, older.token, older.group) == (4, 4294967297, "m3")
    probe = PollItem.from_wire({"id": "probe-1", "payload": {"probe": True}, "token": 1, "probe": True})
    assert probe.probe and probe.group == "probe-1"


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (["m1"], "expected a JSON object, got list"),
        ({"payload": 1}, "'id' must be a non-empty string"),
        ({"id": ""}, "'id' must be a non-empty string"),
        ({"id": "m1", "seq": "3"}, "(m1): 'seq' must be a non-negative integer, got str '3'"),
        ({"id": "m1", "seq": True}, "'seq' must be a non-negative integer"),
        ({"id": "m1", "token": -1}, "'token' must be a positive integer"),
        ({"id": "m1", "token": "abc"}, "'token' must be a positive integer"),
        ({"id": "m1", "attempt": 1.5}, "'attempt' must be a non-negative integer"),
        ({"id": "m1", "group": 5}, "'group' must be a string"),
        ({"id": "m1", "queue_ref": ["q"]}, "'queue_ref' must be a string"),
        ({"id": "m1", "probe": "yes"}, "'probe' must be true or false"),
        ({"id": "m1", "history": []}, "'history' must be an object"),
    ],
)
def test_a_malformed_item_names_the_field(raw: Any, named: str) -> None:
    with pytest.raises(MalformedPollItem) as caught:
        PollItem.from_wire(raw, "poll of orders: item 0")
    assert str(caught.value).startswith("poll of orders: item 0"), caught.value
    assert named in str(caught.value), caught.value
    assert caught.value.status == 200 and not caught.value.transient


def test_a_poll_answer_keeps_what_it_could_read() -> None:
    with pytest.raises(MalformedPollItem, match="expected a JSON list, got dict"):
        parse_poll({"messages": []}, "orders")
    with pytest.raises(MalformedPollItem, match="item 1 \\(m2\\): 'seq'") as caught:
        parse_poll([GATEWAY_ITEM, {"id": "m2", "seq": -1}, {"id": "m3"}], "orders")
    assert [item.id for item in caught.value.items] == ["m1", "m3"]
    assert [item.id for item in parse_poll([GATEWAY_ITEM, {"id": "m3"}], "orders")] == ["m1", "m3"]


async def test_a_worker_hands_back_a_malformed_answer_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    """A server whose poll answer has one readable and one malformed item: the readable one is released
    (renew ttl 0 with its token), no handler runs, and `serve` returns 1 with one line naming the field."""
    seen: list[tuple[str, str, str, Any]] = []

    async def gateway(request: web.BaseRequest) -> web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append((request.method, request.path, request.query_string, body))
        if request.path.endswith("/poll"):
            return web.json_response([{"id": "m1", "token": 7, "group": "g"}, {"id": "m2", "seq": "1"}])
        return web.json_response({"success": True})

    handled: list[Message] = []

    async def handle(message: Message) -> None:
        handled.append(message)

    caplog.set_level(logging.INFO, logger="strictq.sdk")
    async with serve(gateway) as url:
        config = ClientConfig(url=url, worker_id="worker-1", worker_secret="s3cret-s3cret-s3cret")
        worker = Worker("orders", handle, config=config)
        async with asyncio.timeout(TEST_TIMEOUT):
            code = await serve_workers(worker)
    assert code == 1 and handled == []
    polls = [s for s in seen if s[1].endswith("/poll")]
    assert len(polls) == 1  # not retried
    assert ("POST", "/queue/1/orders/renew", "ttl=0", ["m1"]) in seen
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "item 1 (m2): 'seq' must be a non-negative integer" in errors[0], errors
