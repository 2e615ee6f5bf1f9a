"""/metrics of the queue server's app (as strictq.queue_server composes it, served in process over a real
socket): Prometheus text parsed with prometheus_client's parser, real values after real sends, receives and
acks on a fake clock, and who sees which queue's series."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kit import FakeClock
from kit.inprocess import InProcessServer, serve_in_process
from kit.prometheus import Series, parse_series, value

from access.keys import Credential, KeyRing

KEYS = KeyRing(
    [
        Credential("admin-1", "admin-secret-0123456789", "admin", "t1"),
        Credential("other-1", "other-secret-0123456789", "admin", "t2"),
        Credential("ops-1", "operator-secret-0123456789", "operator", "ops"),
        Credential("worker-1", "worker-secret-0123456789", "worker", "t1"),
    ]
)
SECRETS = {c.id: c.secret for c in KEYS.credentials}


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[InProcessServer, FakeClock, aiohttp.ClientSession]]:
    clock = FakeClock()
    async with serve_in_process(tmp_path / "queue", clock=clock, keys=KEYS) as srv:
        async with aiohttp.ClientSession() as session:
            yield srv, clock, session


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def send(session: aiohttp.ClientSession, base: str, queue: str, group: str, n: int) -> None:
    messages = [{"json": {"n": i}, "group": group} for i in range(n)]
    await post(session, f"{base}/v1/queues/{queue}/send", {"messages": messages, "create": True})


async def scrape(
    session: aiohttp.ClientSession, base: str, headers: dict[str, str] | None
) -> tuple[int, str, str]:
    async with session.get(f"{base}/metrics", headers=headers or {}) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


async def series(session: aiohttp.ClientSession, base: str, key_id: str) -> Series:
    status, content_type, text = await scrape(session, base, {"X-BV-API-Key": SECRETS[key_id]})
    assert status == 200 and content_type.startswith("text/plain; version="), (status, text)
    return parse_series(text)


def queues_in(found: Series) -> set[tuple[str, str]]:
    return {
        (dict(labels)["tenant"], dict(labels)["queue"])
        for (name, labels) in found
        if name == "strictq_queue_visible_messages"
    }


async def test_gauges_follow_sends_receives_and_acks(server: Any) -> None:
    srv, clock, session = server
    base = srv.url
    await send(session, base, "t1.orders", "customer-1", 3)
    await send(session, base, "t1.orders", "customer-2", 1)
    clock.advance(5.0)
    q = {"tenant": "t1", "face": "queue", "queue": "orders"}
    found = await series(session, base, "admin-1")
    assert value(found, "strictq_queue_visible_messages", **q) == 4
    assert value(found, "strictq_queue_in_flight_messages", **q) == 0
    assert value(found, "strictq_queue_delayed_messages", **q) == 0
    assert value(found, "strictq_queue_oldest_message_age_seconds", **q) == pytest.approx(5.0, abs=0.01)
    assert value(found, "strictq_queue_oldest_unattempted_age_seconds", **q) == pytest.approx(5.0, abs=0.01)
    assert value(found, "strictq_queue_sent_messages_total", **q) == 4
    assert value(found, "strictq_group_backlog_messages", **q, group="customer-1") == 3
    assert value(found, "strictq_group_backlog_messages", **q, group="customer-2") == 1
    assert value(found, "strictq_queue_suspended", **q) == 0

    received = await post(
        session, f"{base}/v1/queues/t1.orders/receive", {"limit": 10, "ttl": 60, "worker": "w"}
    )
    claimed = received["messages"]
    assert {m["group"] for m in claimed} == {"customer-1", "customer-2"} and len(claimed) == 4
    clock.advance(2.0)
    await send(session, base, "t1.orders", "customer-3", 1)  # sent at t+7: waits 3 s before the scrape
    clock.advance(3.0)
    found = await series(session, base, "admin-1")
    assert value(found, "strictq_queue_visible_messages", **q) == 1
    assert value(found, "strictq_queue_in_flight_messages", **q) == 4
    assert value(found, "strictq_queue_oldest_message_age_seconds", **q) == pytest.approx(10.0, abs=0.01)
    assert value(found, "strictq_queue_oldest_unattempted_age_seconds", **q) == pytest.approx(3.0, abs=0.01)
    assert value(found, "strictq_queue_first_attempt_wait_seconds", **q) == pytest.approx(5.0, abs=0.01)
    assert value(found, "strictq_queue_received_messages_total", **q) == 4

    # Nothing left for another worker: an empty receive, counted once (not per wake-up).
    third = await post(session, f"{base}/v1/queues/t1.orders/receive", {"limit": 10, "worker": "x"})
    assert [m["group"] for m in third["messages"]] == ["customer-3"]
    empty = await post(session, f"{base}/v1/queues/t1.orders/receive", {"limit": 10, "worker": "x"})
    assert empty == {"messages": []}
    acked = await post(
        session, f"{base}/v1/queues/t1.orders/ack", {"receipts": [m["receipt"] for m in claimed]}
    )
    assert [r["status"] for r in acked["results"]] == ["ok"] * 4
    found = await series(session, base, "admin-1")
    assert value(found, "strictq_queue_empty_receives_total", **q) == 1
    assert value(found, "strictq_queue_in_flight_messages", **q) == 1  # customer-3's, to worker x
    assert value(found, "strictq_queue_visible_messages", **q) == 0
    assert value(found, "strictq_queue_deleted_messages_total", **q) == 4
    assert value(found, "strictq_queue_oldest_unattempted_age_seconds", **q) == 0


async def test_top_groups_are_bounded_to_five_per_queue(server: Any) -> None:
    srv, _, session = server
    for index in range(8):
        await send(session, srv.url, "t1.wide", f"g{index}", index + 1)
    found = await series(session, srv.url, "admin-1")
    groups = {
        dict(labels)["group"]: v
        for (name, labels), v in found.items()
        if name == "strictq_group_backlog_messages"
    }
    assert groups == {"g7": 8, "g6": 7, "g5": 6, "g4": 5, "g3": 4}


async def test_scrapes_are_scoped_to_the_callers_tenant(server: Any) -> None:
    srv, _, session = server
    await send(session, srv.url, "t1.orders", "g", 1)
    await send(session, srv.url, "t2.secret", "g", 2)
    await send(session, srv.url, "jobs", "g", 1)  # the internal API's own queue: no tenant
    fenced = await session.put(
        f"{srv.url}/admin/v1/fences/worker-1",
        json={"mode": "block", "reason": "metrics test"},
        headers={"X-BV-API-Key": SECRETS["admin-1"]},
    )
    assert fenced.status == 200, await fenced.text()

    t1 = await series(session, srv.url, "admin-1")
    assert queues_in(t1) == {("t1", "orders"), ("", "jobs")}  # untenanted: every admin's on the queue server
    assert value(t1, "strictq_fences", tenant="t1", mode="block") == 1
    t2 = await series(session, srv.url, "other-1")
    assert queues_in(t2) == {("t2", "secret"), ("", "jobs")}
    assert not [key for key in t2 if key[0] == "strictq_fences"]  # t1's fence is none of t2's business
    assert not any("orders" in str(key) for key in t2)
    ops = await series(session, srv.url, "ops-1")
    assert queues_in(ops) == {("t1", "orders"), ("t2", "secret"), ("", "jobs")}
    assert value(ops, "strictq_queue_visible_messages", tenant="t2", face="queue", queue="secret") == 2

    # Prometheus' `authorization` scrape setting: a bearer token.
    status, _, text = await scrape(session, srv.url, {"Authorization": f"Bearer {SECRETS['ops-1']}"})
    assert status == 200 and "strictq_queue_visible_messages" in text


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "unauthorized"),
        ({"X-BV-API-Key": "not-a-key-of-this-server"}, 401, "unauthorized"),
        ({"X-BV-API-Key": SECRETS["worker-1"]}, 403, "forbidden"),
        ({"Authorization": "Bearer " + SECRETS["worker-1"]}, 403, "forbidden"),
    ],
)
async def test_scrapes_need_an_admin_or_operator_key(
    server: Any, headers: dict[str, str], status: int, code: str
) -> None:
    srv, _, session = server
    async with session.get(f"{srv.url}/metrics", headers=headers) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        body = await response.json()
    assert body["error"]["code"] == code and body["error"]["message"]


async def test_the_figures_route_answers_what_the_core_reads(server: Any) -> None:
    """`GET /v1/figures` (what a gateway's dashboard and /metrics read through the port) decodes to the
    core's own figures; merged over partitions, counts add up, ages are the oldest, top groups the largest."""
    from queue_core import figures as wire_figures
    from queue_core.figures import merge_queues

    srv, clock, session = server
    await send(session, srv.url, "t1.orders", "customer-1", 3)
    await send(session, srv.url, "t1.orders", "customer-2", 1)
    clock.advance(4.0)
    async with session.get(f"{srv.url}/v1/figures", params={"top": "1"}) as answer:
        assert answer.status == 200
        decoded = wire_figures.decode(await answer.json())
    assert decoded == await srv.service.figures(top=1)
    (orders,) = decoded.queues
    assert (orders.gauges.visible, orders.gauges.groups, orders.gauges.oldest_age) == (4, 2, 4.0)
    assert [g.name for g in orders.gauges.top_groups] == ["customer-1"]

    clock.advance(1.0)
    await send(session, srv.url, "t1.orders", "customer-9", 5)
    later = await srv.service.figures(top=1)
    (merged,) = merge_queues([decoded.queues, later.queues], top=1)
    assert merged.gauges.visible == 4 + 9 and merged.gauges.sent == 4 + 9
    assert merged.gauges.oldest_age == 5.0  # the older reading's queue has aged since: the oldest wins
    assert [(g.name, g.messages) for g in merged.gauges.top_groups] == [("customer-9", 5)]
