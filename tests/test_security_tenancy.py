"""Issue 11, item 2: every admin route, the control stream and search are scoped to the caller's tenant.

Through the real in-process gateway (TLS, failure management on) with a key file of two tenants, each with
admin, producer, worker and proxy keys, plus one `operator` key. Tenant B's keys must not read, list or
change anything of tenant A (and the answer for A's objects is 404, as for objects that do not exist); the
proxy key reads the control stream only; the operator spans tenants. Regression tests for the leaks the
issue reproduced: search bodies, alerts with wildcard signatures, fences with reasons, the control stream
snapshot, plus status, events, parked groups and the retry routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from control_stream_support import Event, open_stream
from health_support import SETTINGS, TIMEOUT, Health, until

from access.keys import Credential, KeyFileError, KeyRing
from fencing.control_client import ControlClient
from gateway.deliveries import DeliveryLog
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.machine import SendRequest
from queue_core.service import QueueService
from strictq.serve import make_edge_app
from wirelog.record import event_record
from wirelog.writer import WireLogWriter

CREDENTIALS = [
    *(
        Credential(f"{t}-{role}", f"{t}-{role}-secret-0123456789", role, f"t{t}")  # type: ignore[arg-type]
        for t in ("a", "b")
        for role in ("admin", "producer", "worker", "proxy")
    ),
    Credential("ops-1", "operator-secret-0123456789", "operator", "ops"),
]
QUEUE = "jobs"  # each tenant has its own: ta.jobs and tb.jobs
SECRET_REASON = "tenant A's secret fence reason"


# ------------------------------------------------------------------------------------------ fixtures
@contextlib.asynccontextmanager
async def tenancy_gateway(
    tmp_path: Path,
    *,
    deliveries: DeliveryLog | None = None,
    index: Path | None = None,
    alert_poll: float = 0,
) -> AsyncIterator[Health]:
    """The gateway with failure management on, both tenants' `jobs` queues, and no stream client of its own
    (`Health.control` follows the stream with the operator's key)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    service = QueueService(tmp_path / "queue")
    await service.start()
    for tenant in ("ta", "tb"):
        await service.create_queue(f"{tenant}.{QUEUE}", {"retry_backoff": 0.0})
    hub = ControlHub(service)
    manager = FailureManager(service, hub, SETTINGS, wirelog=tmp_path / "events", alert_poll=alert_poll)
    keys = KeyRing(list(CREDENTIALS))
    app = make_edge_app(service, keys, failures=manager, deliveries=deliveries, index=index)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    client = ControlClient(url + "/admin/v1/control", secret("ops-1"), ca_file=str(ca_file))
    client.start()
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file)))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        try:
            await asyncio.wait_for(client.state.wait_synced(), TIMEOUT)
            yield Health(
                url, ca_file, tmp_path / "events", service, hub, manager, keys, session, client.state
            )
        finally:
            await client.stop()
            service.stop_waiting()
            await runner.cleanup()
            await service.close()


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Health]:
    async with tenancy_gateway(tmp_path) as h:
        yield h


def secret(key_id: str) -> str:
    return next(c.secret for c in CREDENTIALS if c.id == key_id)


# ------------------------------------------------------------------------------------------- helpers
async def send(h: Health, tenant: str, group: str, body: Any, queue: str = QUEUE) -> None:
    await h.ok("POST", f"/queue/1/{queue}/send", f"{tenant}-producer", body, params={"group": group})


async def poll(h: Health, tenant: str, queue: str = QUEUE) -> list[dict[str, Any]]:
    """As the SDK polls: declaring `results, probes` (it takes part in failure management)."""
    return await h.poll(f"{tenant}-worker", queue=queue, ttl=60)


async def fail(h: Health, tenant: str, item: dict[str, Any], signature: str) -> None:
    result = {
        "id": item["id"],
        "token": item["token"],
        "outcome": "failed",
        "reason": "x",
        "signature": signature,
    }
    (outcome,) = (await h.ok("POST", f"/queue/1/{QUEUE}/results", f"{tenant}-worker", {"results": [result]}))[
        "results"
    ]
    assert outcome["status"] == "ok", outcome


async def fence(h: Health, key_id: str, worker: str, reason: str = SECRET_REASON) -> tuple[int, Any]:
    return await h.call("PUT", f"/admin/v1/fences/{worker}", key_id, {"mode": "block", "reason": reason})


def not_found(answer: tuple[int, Any]) -> bool:
    """404 with the JSON error {code, message, details?}: what a name that exists nowhere gets (never 403;
    `details` only echo the name the caller gave)."""
    status, body = answer
    return status == 404 and set(body) == {"error"} and {"code", "message"} <= set(body["error"]) <= {
        "code",
        "message",
        "details",
    }


# ------------------------------------------------------------------------------------------- fences
async def test_fences_of_another_tenant_are_invisible_and_untouchable(gw: Health) -> None:
    assert (await fence(gw, "a-admin", "a-worker"))[0] == 200
    mine = await gw.ok("GET", "/admin/v1/fences", "a-admin")
    assert [(f["worker"], f["reason"]) for f in mine["fences"]] == [("a-worker", SECRET_REASON)]
    assert await gw.ok("GET", "/admin/v1/fences", "b-admin") == {"fences": []}
    # B can neither fence nor lift A's worker, and is told it does not exist (as for a made-up name).
    for answer in (
        await fence(gw, "b-admin", "a-worker"),
        await gw.call("DELETE", "/admin/v1/fences/a-worker", "b-admin"),
        await gw.call("DELETE", "/admin/v1/fences/nobody-at-all", "b-admin"),
        await fence(gw, "b-admin", "nobody-at-all"),
    ):
        assert not_found(answer) and answer[1]["error"]["code"] == "unknown_worker", answer
    assert [f.worker for f in gw.hub.fences()] == ["a-worker"]  # still fenced
    # A blacklist of another tenant's worker does not exist either.
    assert not_found(await gw.call("DELETE", "/admin/v1/blacklist/a-worker", "b-admin"))


async def test_proxy_key_reads_the_control_stream_only(gw: Health) -> None:
    await fence(gw, "b-admin", "b-worker", "b's own reason")
    for method, path, params in (
        ("GET", "/admin/v1/fences", None),
        ("GET", "/admin/v1/status", None),
        ("GET", "/admin/v1/events", None),
        ("GET", f"/admin/v1/queues/{QUEUE}/parked", None),
        ("GET", f"/admin/v1/queues/{QUEUE}/groups/log", {"group": "g"}),
        ("POST", f"/admin/v1/queues/{QUEUE}/suspend", None),
        ("PUT", "/admin/v1/fences/b-worker", None),
    ):
        status, body = await gw.call(method, path, "b-proxy", {"reason": "x"}, params=params)
        assert (status, body["error"]["code"]) == (403, "forbidden"), (method, path)
    async with open_stream(gw.url, secret("b-proxy"), ca_file=gw.ca_file) as stream:
        (snapshot,), _ = await stream.catch_up()
    assert [f["worker"] for f in snapshot.data["fences"]] == ["b-worker"]


# --------------------------------------------------------------------------------- alerts, status, events
async def test_wildcard_alert_suspends_only_the_callers_queues(gw: Health) -> None:
    # Each tenant's worker fails with a signature `*` matches. (Distinct signatures: one signature on both
    # tenants' workers would be judged a shared failure, see the report on queue_core.machine.health.)
    for tenant in ("a", "b"):
        await send(gw, tenant, "g1", {"n": 1})
        (item,) = await poll(gw, tenant)
        await fail(gw, tenant, item, f"{tenant}-db-down")
    answer = await gw.ok("POST", "/admin/v1/alerts", "b-admin", {"reason": "b's db", "signatures": ["*"]})
    assert answer == {"suspended": [QUEUE]}
    assert gw.manager.monitor.suspended("tb.jobs") and not gw.manager.monitor.suspended("ta.jobs")
    # A sees its queue running and none of B's alert; B sees its own alert event.
    a_status = await gw.ok("GET", "/admin/v1/status", "a-admin")
    assert [(q["queue"], q["suspended"]) for q in a_status["queues"]] == [(QUEUE, False)]
    assert "alert" not in json.dumps(a_status["events"]) and "b's db" not in json.dumps(a_status)
    assert "alert" not in a_status["counts"] and "suspend" not in a_status["counts"]
    assert [e["event"] for e in await gw.events(key_id="a-admin")] == []
    b_events = await gw.events(key_id="b-admin")
    assert [e["event"] for e in b_events] == ["alert", "suspend"]
    assert all(e.get("queue", QUEUE) == QUEUE for e in b_events)
    # A named queue of another tenant does not exist for B.
    assert not_found(
        await gw.call("POST", "/admin/v1/alerts", "b-admin", {"reason": "x", "queue": "ta.jobs"})
    )
    # The operator spans tenants: its wildcard alert reaches A's queue, named by its core name.
    answer = await gw.ok("POST", "/admin/v1/alerts", "ops-1", {"reason": "all dbs", "signatures": ["*-db-*"]})
    assert answer == {"suspended": ["ta.jobs"]}
    ops = await gw.ok("GET", "/admin/v1/status", "ops-1")
    assert {q["queue"]: q["suspended"] for q in ops["queues"]} == {"ta.jobs": True, "tb.jobs": True}
    # The operator's alert (no tenant) is shown to no tenant admin.
    assert [e["event"] for e in await gw.events(key_id="a-admin")] == ["suspend"]
    assert [e["event"] for e in await gw.events(key_id="b-admin")] == ["alert", "suspend"]


async def test_a_tenants_alert_record_in_the_wire_log_reaches_only_its_queues(tmp_path: Path) -> None:
    async with tenancy_gateway(tmp_path, alert_poll=0.05) as gw:
        for tenant in ("a", "b"):
            await send(gw, tenant, "g1", {"n": 1})
            (item,) = await poll(gw, tenant)
            await fail(gw, tenant, item, f"{tenant}-db-down")
        record = event_record(event="alert", reason="b's rule fired")
        record["tenant"] = "tb"
        record["alert"] = {"rule": "b-db", "signature": "*-db-down", "signatures": []}
        with WireLogWriter(gw.wirelog, "spark-alerts", fsync="always") as writer:
            writer.write(record)
        await until(lambda: gw.manager.monitor.suspended("tb.jobs"), what="B's alert")
        assert not gw.manager.monitor.suspended("ta.jobs")  # one alert, one decision: A was never a target
        assert [e["event"] for e in await gw.events(key_id="b-admin")] == ["alert", "suspend"]
        assert await gw.events(key_id="a-admin") == []


async def test_status_events_suspend_and_resume_stay_within_the_tenant(gw: Health) -> None:
    assert (await fence(gw, "a-admin", "a-worker"))[0] == 200
    await gw.ok("POST", f"/admin/v1/queues/{QUEUE}/suspend", "a-admin", {"reason": "a's maintenance"})
    assert [e["event"] for e in await gw.events(key_id="a-admin")] == ["suspend"]
    # B: nothing of A in status or events; its own queue only, under its own name.
    b_status = await gw.ok("GET", "/admin/v1/status", "b-admin")
    text = json.dumps(b_status)
    assert "a-worker" not in text and "a's maintenance" not in text and "ta." not in text
    assert b_status["workers"] == [] and b_status["operator_fences"] == [] and b_status["events"] == []
    assert b_status["counts"] == {} and b_status["probes"] == 0
    assert await gw.events(key_id="b-admin") == []
    # B cannot resume (or suspend) A's queue: its `jobs` is its own, and `ta.jobs` does not exist for it.
    status, body = await gw.call("POST", f"/admin/v1/queues/{QUEUE}/resume", "b-admin", {})
    assert (status, body["error"]["code"]) == (404, "not_suspended")
    assert gw.manager.monitor.suspended("ta.jobs")
    for path in ("/admin/v1/queues/ta.jobs/resume", "/admin/v1/queues/ta.jobs/suspend"):
        assert not_found(await gw.call("POST", path, "b-admin", {"reason": "x"})), path
    assert gw.manager.monitor.suspended("ta.jobs") and not gw.manager.monitor.suspended("tb.jobs")
    # The operator sees both tenants, by core name, and resumes A's queue.
    ops = await gw.ok("GET", "/admin/v1/status", "ops-1")
    assert {q["queue"] for q in ops["queues"]} >= {"ta.jobs"}
    assert "a-worker" in {f["worker"] for f in ops["operator_fences"]}
    await gw.ok("POST", "/admin/v1/queues/ta.jobs/resume", "ops-1", {})
    assert not gw.manager.monitor.suspended("ta.jobs")
    # A tenant admin cannot reach a queue by its core name, even its own tenant's.
    assert not_found(await gw.call("POST", "/admin/v1/queues/ta.jobs/suspend", "a-admin", {"reason": "x"}))


# ---------------------------------------------------------------------------------------- retry routes
async def test_retry_routes_of_another_tenant_are_404(gw: Health) -> None:
    await gw.service.create_queue("ta.private")  # A's only
    await gw.service.create_queue("ta_dedupq.private")  # A's EmoDB dedup queue of the same name
    await gw.service.create_queue("loose")  # a queue of no tenant (only the internal API makes those)
    group = {"group": "g1"}
    routes = [
        ("GET", "parked", None),
        ("GET", "groups/log", group),
        ("GET", "groups/policy", group),
        ("PUT", "groups/policy", group),
        ("DELETE", "groups/policy", group),
        ("POST", "groups/release", group),
        ("POST", "groups/redrive", group),
    ]
    for method, route, params in routes:
        for name, extra in (("private", {}), ("private", {"face": "dedupq"}), ("loose", {})):
            answer = await gw.call(
                method, f"/admin/v1/queues/{name}/{route}", "b-admin", {"max_attempts": 2},
                params={**(params or {}), **extra},
            )  # fmt: skip
            assert not_found(answer), (method, route, name, extra, answer)
    assert (await gw.call("GET", "/admin/v1/queues/private/parked", "a-admin"))[0] == 200
    status, body = await gw.call(
        "GET", "/admin/v1/queues/private/parked", "a-admin", params={"face": "dedupq"}
    )
    assert (status, body["queue"]) == (200, "private")
    assert not_found(await gw.call("GET", "/admin/v1/queues/loose/parked", "a-admin"))
    # The operator names any tenant's queue (and the tenantless one) by its core name.
    for name in ("ta.private", "ta_dedupq.private", "loose"):
        status, body = await gw.call("GET", f"/admin/v1/queues/{name}/parked", "ops-1")
        assert (status, body["queue"]) == (200, name)
    assert not_found(await gw.call("GET", "/admin/v1/queues/private/parked", "ops-1"))
    status, body = await gw.call(
        "GET", "/admin/v1/queues/ta.private/parked", "ops-1", params={"face": "dedupq"}
    )
    assert status == 400 and body["error"]["code"] and "face" in body["error"]["message"]


# --------------------------------------------------------------------------------------- control stream
async def test_control_stream_of_a_proxy_key_shows_nothing_of_another_tenant(gw: Health) -> None:
    service = gw.service
    # Both tenants claim groups (floors) and have a fenced worker.
    await claim(service, {"ta.jobs": ["a1", "a2"], "tb.jobs": ["b1"]})
    assert (await fence(gw, "a-admin", "a-worker"))[0] == 200
    assert (await fence(gw, "b-admin", "b-worker", "b's reason"))[0] == 200
    await until(
        lambda: gw.control.floor("tb.jobs", "b1") > 0 and "b-worker" in gw.control.fences, what="sync"
    )

    async with open_stream(gw.url, secret("b-proxy"), ca_file=gw.ca_file) as stream:
        (snapshot,), synced = await stream.catch_up()
        assert snapshot.event == "snapshot" and synced.data == {"instance": snapshot.data["instance"]}
        assert [f["worker"] for f in snapshot.data["fences"]] == ["b-worker"]
        assert [entry[:2] for entry in snapshot.data["floors"]] == [["tb.jobs", "b1"]]
        assert "ta." not in json.dumps(snapshot.data) and SECRET_REASON not in json.dumps(snapshot.data)
        before_a = synced.id

        # A's events are skipped; a floor event of both tenants is cut down to B's part, same ids.
        assert (await fence(gw, "a-admin", "a-worker", "again"))[0] == 200
        await gw.call("DELETE", "/admin/v1/fences/a-worker", "a-admin")
        await claim(service, {"ta.jobs": ["a3"], "tb.jobs": ["b2"]})
        floor = await stream.next()
        assert floor.event == "floor" and [e[:2] for e in floor.data["floors"]] == [["tb.jobs", "b2"]]
        await gw.call("DELETE", "/admin/v1/fences/b-worker", "b-admin")
        unfence = await stream.next()
        assert (unfence.event, unfence.data["worker"]) == ("unfence", "b-worker")
        assert _n(unfence) > _n(floor) > _n(synced) + 2  # A's fence and unfence came in between
        await claim(service, {"ta.jobs": ["a4"]})  # A alone: nothing reaches B

    # Resuming replays only B's part of what followed.
    async with open_stream(gw.url, secret("b-proxy"), last_event_id=before_a, ca_file=gw.ca_file) as stream:
        replayed, _ = await stream.catch_up()
    assert [(e.event, e.id) for e in replayed] == [("floor", floor.id), ("unfence", unfence.id)]
    assert replayed[0].data == floor.data

    # The operator's stream (the fixture's client) has both tenants.
    await until(lambda: gw.control.floor("ta.jobs", "a4") > 0, what="A's floor on the operator's stream")
    assert gw.control.floor("tb.jobs", "b2") > 0

    # The proxy's own client, with B's proxy key, learns B's floors and fences only.
    client = ControlClient(gw.url + "/admin/v1/control", secret("b-proxy"), ca_file=str(gw.ca_file))
    client.start()
    try:
        await asyncio.wait_for(client.state.wait_synced(), TIMEOUT)
        assert {queue for queue, _ in client.state.floors} == {"tb.jobs"}
        assert client.state.fences == {}
    finally:
        await client.stop()


async def test_admin_key_stream_is_scoped_too(gw: Health) -> None:
    assert (await fence(gw, "a-admin", "a-worker"))[0] == 200
    async with open_stream(gw.url, secret("b-admin"), ca_file=gw.ca_file) as stream:
        (snapshot,), _ = await stream.catch_up()
        assert snapshot.data["fences"] == []
        await fence(gw, "a-admin", "a-worker", "again")
        await fence(gw, "b-admin", "b-worker", "b's")
        event = await stream.next()
        assert (event.event, event.data["worker"]) == ("fence", "b-worker")
    async with open_stream(gw.url, secret("ops-1"), ca_file=gw.ca_file) as stream:
        (snapshot,), _ = await stream.catch_up()
    assert [f["worker"] for f in snapshot.data["fences"]] == ["a-worker", "b-worker"]


async def claim(service: QueueService, groups: dict[str, list[str]]) -> None:
    """One message per group, then all claimed in one go (their floors raise in one coalescing window)."""
    for queue, names in groups.items():
        await service.send(queue, [SendRequest(body=g.encode(), group=g) for g in names])
    receives = [service.receive(q, limit=1, ttl=60) for q, names in groups.items() for _ in names]
    got = await asyncio.gather(*receives)
    assert sum(len(batch) for batch in got) == sum(len(names) for names in groups.values())


def _n(event: Event) -> int:
    return int(str(event.id).rpartition("-")[2])


# ------------------------------------------------------------------------------------------------ search
async def test_search_returns_only_the_callers_records(spark: Any, tmp_path: Path) -> None:
    from spark.index import run_index

    wirelog, index = tmp_path / "wirelog", tmp_path / "index"
    deliveries = DeliveryLog(wirelog, key_dir=tmp_path, compress=False)
    deliveries.start()
    async with tenancy_gateway(tmp_path, deliveries=deliveries, index=index) as gw:
        await send(gw, "a", "shared-group", {"text": "A's body, not for B"})
        (a_item,) = await poll(gw, "a")
        await send(gw, "b", "shared-group", {"note": "B's body"})
        (b_item,) = await poll(gw, "b")
        await deliveries.close()
        await asyncio.to_thread(run_index, spark, wirelog, index)

        async def search(key_id: str, **params: str) -> tuple[int, Any]:
            return await gw.call("GET", "/admin/v1/search", key_id, params=params)

        # B: A's message is as absent as a made-up one, by id or by group; its own is there.
        absent = await search("b-admin", message_id="no-such-message")
        status, body = await search("b-admin", message_id=a_item["id"])
        assert status == 200 and body["records"] == [] == absent[1]["records"]
        assert "A's body" not in json.dumps(body)
        status, body = await search("b-admin", group="shared-group")
        assert status == 200 and [r["message_id"] for r in body["records"]] == [b_item["id"]]
        assert [r["tenant"] for r in body["records"]] == ["tb"] and "A's body" not in json.dumps(body)
        status, body = await search("b-admin", group="shared-group", limit="1")
        assert status == 200 and len(body["records"]) == 1 and body["truncated"] is False
        # A sees its own; the operator sees both; the proxy key may not search at all.
        status, body = await search("a-admin", message_id=a_item["id"])
        assert status == 200 and [r["tenant"] for r in body["records"]] == ["ta"]
        status, body = await search("ops-1", group="shared-group")
        assert status == 200 and sorted(r["tenant"] for r in body["records"]) == ["ta", "tb"]
        status, body = await search("ops-1", group="shared-group", limit="1")
        assert status == 200 and len(body["records"]) == 1 and body["truncated"] is True
        status, body = await search("b-proxy", message_id=a_item["id"])
        assert (status, body["error"]["code"]) == (403, "forbidden")


# --------------------------------------------------------------------------------------- the operator
async def test_operator_role_spans_tenants_on_admin_routes_only(gw: Health) -> None:
    # Admin routes: fences of either tenant's workers.
    for worker in ("a-worker", "b-worker"):
        status, body = await fence(gw, "ops-1", worker, "operator's fence")
        assert status == 200 and body["worker"] == worker
    fences = await gw.ok("GET", "/admin/v1/fences", "ops-1")
    assert [f["worker"] for f in fences["fences"]] == ["a-worker", "b-worker"]
    mine = await gw.ok("GET", "/admin/v1/fences", "a-admin")
    assert [f["worker"] for f in mine["fences"]] == ["a-worker"]
    await gw.ok("DELETE", "/admin/v1/fences/b-worker", "ops-1")
    # ...but no data access on the faces: no send, no poll, no listing, on either face.
    status, _ = await gw.call("POST", f"/queue/1/{QUEUE}/send", "ops-1", {"x": 1}, params={"group": "g"})
    assert status in (403, 404)
    status, _ = await gw.call("GET", f"/queue/1/{QUEUE}/poll", "ops-1", params={"limit": "1"})
    assert status in (403, 404)
    assert gw.service.core.queues["ta.jobs"].groups == {}  # nothing was sent anywhere


def test_operator_is_a_key_file_role(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        '[[credential]]\nid = "ops-1"\nsecret = "operator-secret-0123456789"\n'
        'role = "operator"\ntenant = "ops"\n'
    )
    (credential,) = KeyRing.load(path).credentials
    assert credential.role == "operator" and not credential.can_send and not credential.can_consume
    path.write_text(path.read_text().replace('"operator"', '"superuser"'))
    with pytest.raises(KeyFileError, match="operator"):
        KeyRing.load(path)
