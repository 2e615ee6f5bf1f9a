"""/metrics of the gateway with the core in process (gateway.app, failure management on) over real TLS:
real EmoDB sends, polls, acks, a fence and a suspension, read back from the Prometheus text; who may
scrape; and the request counter of the faces (operators only: it spans tenants). The same series in front
of a queue server (observe_support.remote_edge); in front of a cluster: tests/test_cluster_observe.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from health_support import CREDENTIALS, QUEUE, Health, running_health, until
from kit.prometheus import Series, parse_series, value
from observe_support import RemoteEdge, remote_edge

from access.keys import Credential, KeyRing
from queue_core.machine.health import HealthSettings

OPERATOR = Credential("ops-1", "operator-secret-0123456789", "operator", "ops")
Q = {"tenant": "t1", "face": "queue", "queue": QUEUE}


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Health]:
    async with running_health(tmp_path, keys=KeyRing([*CREDENTIALS, OPERATOR])) as health:
        yield health


async def scrape(h: Health, key_id: str) -> Series:
    headers = {"Authorization": f"Bearer {h.secret(key_id)}"}
    async with h.session.get(h.url + "/metrics", headers=headers) as response:
        text = await response.text()
        assert response.status == 200, text
    return parse_series(text)


def names(found: Series) -> set[str]:
    return {name for name, _ in found}


async def test_depth_in_flight_age_and_empty_receives_after_real_calls(gw: Health) -> None:
    for n in range(3):
        await gw.send("customer-1", {"n": n})
    await asyncio.sleep(0.05)
    found = await scrape(gw, "admin-1")
    assert value(found, "strictq_queue_visible_messages", **Q) == 3
    assert value(found, "strictq_queue_in_flight_messages", **Q) == 0
    assert value(found, "strictq_queue_oldest_message_age_seconds", **Q) > 0.04
    assert value(found, "strictq_queue_oldest_unattempted_age_seconds", **Q) > 0.04
    assert value(found, "strictq_group_backlog_messages", **Q, group="customer-1") == 3

    (item,) = await gw.poll("worker-1", limit=1, capabilities=None)
    assert await gw.poll("worker-2", capabilities=None) == []  # its group is claimed: an empty receive
    found = await scrape(gw, "admin-1")
    assert value(found, "strictq_queue_in_flight_messages", **Q) == 1
    assert value(found, "strictq_queue_visible_messages", **Q) == 2
    assert value(found, "strictq_queue_empty_receives_total", **Q) == 1
    assert value(found, "strictq_queue_received_messages_total", **Q) == 1

    await gw.ok("POST", f"/queue/1/{QUEUE}/ack", "worker-1", [item["id"]])
    found = await scrape(gw, "admin-1")
    assert value(found, "strictq_queue_in_flight_messages", **Q) == 0
    assert value(found, "strictq_queue_deleted_messages_total", **Q) == 1
    assert value(found, "strictq_group_backlog_messages", **Q, group="customer-1") == 2


async def test_fences_held_workers_and_suspensions(gw: Health) -> None:
    for group in ("g1", "g2", "g3"):
        await gw.send(group, {"group": group})
    for item in await gw.poll("worker-1"):
        await gw.fail("worker-1", item, "KeyError: 'amount'")
    await until(lambda: "worker-1" in gw.control.fences, what="failure management's fence")
    await gw.ok("POST", f"/admin/v1/queues/{QUEUE}/suspend", "admin-1", {"reason": "maintenance"})
    found = await scrape(gw, "admin-1")
    assert value(found, "strictq_fences", tenant="t1", mode="block") == 1
    held = {dict(labels)["state"]: v for (name, labels), v in found.items() if name == "strictq_workers_held"}
    assert sum(held.values()) == 1 and set(held) <= {"fenced", "probing"}, held
    assert value(found, "strictq_queue_suspended", **Q) == 1
    other = await scrape(gw, "other-1")  # tenant t2's admin: none of t1's queues, fences or workers
    assert not [key for key in other if dict(key[1]).get("tenant") == "t1"], other


async def test_tenant_scoping_and_the_request_counter(gw: Health) -> None:
    await gw.send("g", {"mine": True})
    await gw.ok("POST", "/queue/1/secret/send", "other-1", {"theirs": True}, params={"group": "g"})
    async with gw.session.post(gw.url + "/", data=b"{}") as response:  # an unsigned SQS call: 4xx
        assert 400 <= response.status < 500
    t1 = await scrape(gw, "admin-1")
    assert {dict(k[1])["queue"] for k in t1 if k[0] == "strictq_queue_visible_messages"} == {QUEUE}
    assert "strictq_http_requests_total" not in names(t1)  # process-wide: operators only
    t2 = await scrape(gw, "other-1")
    assert {dict(k[1])["queue"] for k in t2 if k[0] == "strictq_queue_visible_messages"} == {"secret"}
    ops = await scrape(gw, "ops-1")
    assert value(ops, "strictq_queue_visible_messages", tenant="t2", face="queue", queue="secret") == 1
    assert value(ops, "strictq_queue_visible_messages", **Q) == 1
    assert value(ops, "strictq_http_requests_total", face="emodb", status_class="2xx") >= 2
    assert value(ops, "strictq_http_requests_total", face="sqs", status_class="4xx") == 1
    assert value(ops, "strictq_http_requests_total", face="admin", status_class="2xx") >= 2  # the scrapes

    for headers, status in (({}, 401), ({"X-BV-API-Key": gw.secret("worker-1")}, 403)):
        async with gw.session.get(gw.url + "/metrics", headers=headers) as response:
            assert response.status == status and response.content_type == "application/json"
            assert (await response.json())["error"]["code"] in ("unauthorized", "forbidden")
    ops = await scrape(gw, "ops-1")
    assert value(ops, "strictq_http_requests_total", face="admin", status_class="4xx") == 2


# ----------------------------------------------------------------------- in front of a queue server
async def test_a_gateway_in_front_of_a_queue_server_has_the_queue_series(tmp_path: Path) -> None:
    """`--queue-server`: depth, in flight, ages and groups through the port (`GET /v1/figures`), scoped as
    in process; fences are the queue server's (its own /metrics), not this gateway's."""
    keys = KeyRing([*CREDENTIALS, OPERATOR])
    async with remote_edge(tmp_path, keys, HealthSettings()) as edge:
        for n in range(3):
            await edge.call("POST", f"/queue/1/{QUEUE}/send", "producer-1", {"n": n}, group=f"g{n % 2}")
        await edge.call("POST", "/queue/1/secret/send", "other-1", {"theirs": True}, group="g")
        found = await remote_scrape(edge, "admin-1")
        assert value(found, "strictq_queue_visible_messages", **Q) == 3
        assert value(found, "strictq_queue_in_flight_messages", **Q) == 0
        assert value(found, "strictq_queue_groups", **Q) == 2
        assert value(found, "strictq_group_backlog_messages", **Q, group="g0") == 2
        assert value(found, "strictq_queue_oldest_message_age_seconds", **Q) > 0
        assert not [k for k in found if dict(k[1]).get("tenant") == "t2"]  # t2's queue: not t1's business
        assert not [k for k in found if k[0] == "strictq_fences"]  # the queue server holds them

        items = await edge.call("GET", f"/queue/1/{QUEUE}/poll", "worker-1", limit="1", ttl="60")
        assert len(items) == 1
        found = await remote_scrape(edge, "ops-1")
        assert value(found, "strictq_queue_in_flight_messages", **Q) == 1
        assert value(found, "strictq_queue_visible_messages", **Q) == 2
        assert value(found, "strictq_queue_received_messages_total", **Q) == 1
        assert value(found, "strictq_queue_visible_messages", tenant="t2", face="queue", queue="secret") == 1
        assert value(found, "strictq_http_requests_total", face="emodb", status_class="2xx") >= 5
        assert not [k for k in found if k[0].startswith("strictq_partition_")]  # one queue server: none

        # Suspended at the queue server (its failure management): the gateway's series say so.
        async with edge.session.post(
            f"{edge.server.url}/admin/v1/queues/{QUEUE}/suspend",
            json={"reason": "maintenance"},
            headers={"X-BV-API-Key": edge.secret("admin-1")},
        ) as answer:
            assert answer.status == 200, await answer.text()
        found = await remote_scrape(edge, "admin-1")
        assert value(found, "strictq_queue_suspended", **Q) == 1

        # The queue server gone: the gateway's own series still answer, the queue series are left out.
        await edge.server.stop_serving()
        await until(lambda: not edge.backend.healthy, what="the gateway to see the queue server gone")
        found = await remote_scrape(edge, "ops-1")
        assert "strictq_http_requests_total" in names(found)
        assert "strictq_queue_visible_messages" not in names(found)


async def remote_scrape(edge: RemoteEdge, key_id: str) -> Series:
    headers = {"Authorization": f"Bearer {edge.secret(key_id)}"}
    async with edge.session.get(edge.url + "/metrics", headers=headers) as response:
        text = await response.text()
        assert response.status == 200, text
    return parse_series(text)


async def test_the_figures_route_refuses_a_bad_top(tmp_path: Path) -> None:
    async with remote_edge(tmp_path, KeyRing(list(CREDENTIALS))) as edge:
        for top in ("-1", "101", "x"):
            async with edge.session.get(edge.server.url + "/v1/figures", params={"top": top}) as answer:
                assert answer.status == 400, top
                error = (await answer.json())["error"]
                assert error["code"] == "invalid_argument" and "top" in error["message"], error
