"""Attempt results and the retry workflow over real sockets: the internal API of a real `strictq
queue-server` (and `RemoteQueueService` against it), the EmoDB face of the in-process gateway over TLS
(per-item statuses, 4xx JSON for bad input, `history` on the retried poll item, a wire-log `log` record per
result), and the admin routes (release, redrive, policies, log data, parked groups) with their auth.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import ServerProcess, running_server, start_server
from gateway_support import Gateway, delivery_gateway  # noqa: F401  (fixture)
from kit.secret import internal_headers, internal_secret

from access.keys import KeyRing
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.records import ReportOutcome
from queue_core.remote import RemoteQueueService

KiB = 1024


# ------------------------------------------------------------------------------------ internal API
async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    headers.update(kwargs.pop("headers", {}))
    async with session.request(method, url, data=data, headers=headers, **kwargs) as response:
        text = await response.text()
        assert response.content_type == "application/json", (response.status, text[:200])
        return response.status, json.loads(text)


@pytest.fixture
async def plain() -> AsyncIterator[aiohttp.ClientSession]:
    """A session of the internal API (the run's internal secret on every request)."""
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=15), headers=internal_headers()
    ) as s:
        yield s


async def test_internal_api_results_statuses_history_and_bad_input(
    server: ServerProcess, plain: aiohttp.ClientSession
) -> None:
    q = server.url + "/v1/queues/orders"
    assert (await call(plain, "PUT", q, {"attributes": {"retry_backoff": 0}}))[0] == 200
    messages = [{"body": f"m{i}", "group": "A", "id": f"a{i}"} for i in range(3)]
    assert (await call(plain, "POST", q + "/send", {"messages": messages}))[0] == 200
    _, got = await call(plain, "POST", q + "/receive", {"limit": 10, "worker": "w1"})
    a0, a1, a2 = got["messages"]
    assert "history" not in a0
    body = {
        "worker": "w1",
        "results": [
            {"id": "a0", "token": a0["token"], "outcome": "succeeded", "duration_ms": 3.5},
            {
                "id": "a1",
                "token": a1["token"],
                "outcome": "partial",
                "reason": "ship failed",
                "signature": "POST ship 5xx",
                "steps": [{"name": "charged", "result": {"tx": 1}}, "packed"],
                "partial": {"tx": 1},
                "fields": {"region": "eu"},
            },
            {"id": "a2", "token": a2["token"], "outcome": "not_attempted"},
            {"id": "zz", "token": 5, "outcome": "failed"},
        ],
    }
    status, answer = await call(plain, "POST", q + "/results", body)
    assert status == 200, answer
    assert answer["results"] == [
        {"id": "a0", "status": "ok", "group": "A", "attempt": 1},
        {"id": "a1", "status": "ok", "group": "A", "attempt": 1},
        {"id": "a2", "status": "ok", "group": "A", "attempt": 1},
        {"id": "zz", "status": "gone", "message": "no such message (already deleted?)"},
    ]
    _, got = await call(plain, "POST", q + "/receive", {"limit": 10, "worker": "w1"})
    retried = got["messages"]
    assert [m["id"] for m in retried] == ["a1", "a2"]
    assert retried[0]["history"] == {
        "attempts": 1,
        "last_outcome": "partial",
        "last_reason": "ship failed",
        "steps": [{"name": "charged", "result": {"tx": 1}}, {"name": "packed"}],
        "partial": {"tx": 1},
    }
    assert retried[1]["receive_count"] == 1 and "history" not in retried[1]
    # Out of order: a success for a2 after a failure of a1 in the same batch refuses both.
    status, answer = await call(
        plain,
        "POST",
        q + "/results",
        {
            "worker": "w1",
            "results": [
                {"id": "a1", "token": retried[0]["token"], "outcome": "failed"},
                {"id": "a2", "token": retried[1]["token"], "outcome": "succeeded"},
            ],
        },
    )
    assert status == 200 and [r["status"] for r in answer["results"]] == ["out_of_order", "out_of_order"]

    # Bad input: a JSON 4xx for the request, nothing applied.
    good = {"id": "a1", "token": retried[0]["token"], "outcome": "failed"}
    for bad, want_status, field in (
        ({"results": [{**good, "outcome": "exploded"}]}, 400, "outcome"),
        ({"results": [{**good, "partial": {"x": "y" * (17 * KiB)}}]}, 413, "partial"),
        ({"results": [{**good, "fields": ["z" * (17 * KiB)]}]}, 413, "fields"),
        ({"results": [{**good, "reason": "r" * 3000}]}, 413, "reason"),
        ({"results": [{**good, "steps": [{"result": 1}]}]}, 400, "steps"),
        ({"results": [{**good, "token": "abc"}]}, 400, "token"),
        ({"results": [good] * 1001}, 400, "results"),
        ({"results": []}, 400, "results"),
        ({"nothing": 1}, 400, "results"),
        ({"results": [good, good]}, 400, "results"),
    ):
        status, answer = await call(plain, "POST", q + "/results", bad)
        assert status == want_status, (bad if len(json.dumps(bad)) < 300 else field, answer)
        assert answer["error"]["details"]["field"] == field, answer
    async with plain.post(q + "/results", data=b"{not json") as response:
        assert response.status == 400 and (await response.json())["error"]["code"] == "invalid_argument"
    _, info = await call(plain, "GET", q + "/group?name=A")
    assert info["in_flight"] == 2  # the refused and the bad requests changed nothing


async def test_remote_queue_service_reports_through_the_internal_api(server: ServerProcess) -> None:
    remote = RemoteQueueService(server.url, timeout=10.0, secret=internal_secret())
    await remote.start()
    try:
        await remote.create_queue("jobs", {"retry_backoff": 0, "max_attempts": 1})
        from queue_core.machine import SendRequest

        await remote.send("jobs", [SendRequest(b"x", group="G", message_id="j1")])
        (item,) = await remote.receive("jobs", 1, worker="w9")
        outcomes = await remote.report(
            "jobs",
            "w9",
            [AttemptResult("j1", item.delivery.token, "failed", reason="nope", steps=[{"name": "s"}])],
        )
        assert outcomes == [ReportOutcome("j1", "ok", "", "G", 1)]
        assert await remote.receive("jobs", 1, worker="w9") == []  # max_attempts 1: parked
        stale = await remote.report("jobs", "w9", [AttemptResult("j1", item.delivery.token - 1, "succeeded")])
        assert stale[0].status == "stale_claim"
    finally:
        await remote.close()


async def test_acknowledged_results_survive_a_sigkill(tmp_path: Path, plain: aiohttp.ClientSession) -> None:
    """Results answered 200 are durable: a parked group, a backoff, the history and the log data survive
    SIGKILL right after the answer."""
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    admin = next(c for c in KeyRing.load(data_dir / "keys.toml")._by_id.values() if c.role == "admin")
    headers = {"X-BV-API-Key": admin.secret}
    try:
        q = server.url + "/v1/queues/jobs"
        attributes = {"retry_backoff": 300, "retry_backoff_max": 300, "retry_same_worker": 0}
        assert (await call(plain, "PUT", q, {"attributes": attributes}))[0] == 200
        status, _ = await call(
            plain,
            "PUT",
            server.url + "/admin/v1/queues/jobs/groups/policy",
            {"max_attempts": 1},
            params={"group": "A"},
            headers=headers,
        )
        assert status == 200
        messages = [{"body": "a", "group": "A", "id": "a1"}, {"body": "b", "group": "B", "id": "b1"}]
        assert (await call(plain, "POST", q + "/send", {"messages": messages}))[0] == 200
        _, got = await call(plain, "POST", q + "/receive", {"limit": 10, "worker": "w1"})
        a1, b1 = got["messages"]
        results = [
            {"id": "a1", "token": a1["token"], "outcome": "failed", "reason": "one", "steps": ["s1"]},
            {"id": "b1", "token": b1["token"], "outcome": "failed", "reason": "b"},
        ]
        status, answer = await call(plain, "POST", q + "/results", {"worker": "w1", "results": results})
        assert status == 200 and [r["status"] for r in answer["results"]] == ["ok", "ok"]
        server.kill()  # at once, right after the answer
    finally:
        if server.running():
            server.kill()
    with running_server(data_dir) as server:
        q = server.url + "/v1/queues/jobs"
        adm = server.url + "/admin/v1/queues/jobs"
        _, got = await call(plain, "POST", q + "/receive", {"limit": 10, "worker": "w3"})
        assert got["messages"] == []  # A parked, B in its backoff: both remembered
        status, answer = await call(plain, "GET", adm + "/parked", headers=headers)
        assert status == 200 and answer["groups"] == ["A"]
        status, answer = await call(plain, "GET", adm + "/groups/log", params={"group": "A"}, headers=headers)
        assert [(a["reason"], a["worker"]) for a in answer["attempts"]] == [("one", "w1")]
        status, answer = await call(
            plain, "GET", adm + "/groups/policy", params={"group": "A"}, headers=headers
        )
        assert answer["override"] == {"max_attempts": 1}
        status, _ = await call(plain, "POST", adm + "/groups/release", params={"group": "A"}, headers=headers)
        _, got = await call(plain, "POST", q + "/receive", {"limit": 10, "worker": "w3"})
        (a1,) = got["messages"]
        assert a1["history"]["attempts"] == 1 and a1["history"]["steps"] == [{"name": "s1"}]


# ---------------------------------------------------------------------------------- the EmoDB face
@pytest.fixture
async def tls(delivery_gateway: Gateway) -> AsyncIterator[aiohttp.ClientSession]:  # noqa: F811
    context = ssl.create_default_context(cafile=str(delivery_gateway.ca_file))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=15)
    ) as s:
        yield s


def key(gw: Gateway, key_id: str) -> dict[str, str]:
    return {"X-BV-API-Key": gw.credential(key_id).secret}


def wire_log(gw: Gateway) -> list[dict[str, Any]]:
    from wirelog.reader import read_records

    assert gw.deliveries is not None
    gw.deliveries.writer.flush()
    return list(read_records(gw.deliveries.directory))


async def test_emodb_results_endpoint_history_and_log_records(
    delivery_gateway: Gateway,  # noqa: F811
    tls: aiohttp.ClientSession,
) -> None:
    gw = delivery_gateway
    base = gw.url + "/queue/1/orders"
    producer, worker = key(gw, "producer-1"), key(gw, "worker-1")
    for n in range(2):
        status, _ = await call(tls, "POST", base + "/send", {"n": n}, params={"group": "A"}, headers=producer)
        assert status == 200
    await gw.service.set_attributes("t1.orders", {"retry_backoff": 0, "retry_same_worker": 0})
    status, polled = await call(tls, "GET", base + "/poll", params={"limit": "10"}, headers=worker)
    assert status == 200 and len(polled) == 2
    first, second = polled
    results = [
        {
            "id": first["id"],
            "token": first["token"],
            "outcome": "failed",
            "reason": "card declined",
            "signature": "POST billing/charge 5xx",
            "steps": [{"name": "reserved", "result": {"password": "hunter2", "slot": 3}}],
            "partial": {"slot": 3},
        },
        {"id": second["id"], "token": second["token"], "outcome": "not_attempted"},
    ]
    status, answer = await call(tls, "POST", base + "/results", {"results": results}, headers=worker)
    assert status == 200, answer
    assert [(r["status"], r["group"], r["attempt"]) for r in answer["results"]] == [
        ("ok", "A", 1),
        ("ok", "A", 1),
    ]
    status, again = await call(
        tls, "GET", base + "/poll", params={"limit": "10"}, headers=key(gw, "worker-2")
    )
    assert [m["id"] for m in again] == [first["id"], second["id"]]
    assert again[0]["history"]["last_reason"] == "card declined"
    assert again[0]["history"]["steps"][0]["name"] == "reserved"
    assert "history" not in again[1] and again[1]["attempt"] == 1
    # A success now: deleted, like a fenced ack.
    done = [{"id": m["id"], "token": m["token"], "outcome": "succeeded"} for m in again]
    status, answer = await call(
        tls, "POST", base + "/results", {"results": done}, headers=key(gw, "worker-2")
    )
    assert [r["status"] for r in answer["results"]] == ["ok", "ok"]
    assert (await gw.service.metrics("t1.orders")).total == 0

    logs = [r for r in wire_log(gw) if r["kind"] == "log"]
    assert [(r["message_id"], r["outcome"], r["worker"], r["attempt"]) for r in logs] == [
        (first["id"], "failed", "worker-1", 1),
        (second["id"], "not_attempted", "worker-1", 1),
        (first["id"], "succeeded", "worker-2", 2),
        (second["id"], "succeeded", "worker-2", 1),
    ]
    failed = logs[0]
    assert failed["queue"] == "orders" and failed["group"] == "A" and failed["lease"] == first["token"]
    assert failed["reason"] == "card declined" and failed["signature"] == "POST billing/charge 5xx"
    assert failed["partial"] == {"slot": 3} and failed["status"] == "ok" and failed["face"] == "emodb"
    assert failed["steps"][0]["result"]["password"] != "hunter2"  # redacted like delivered bodies
    assert failed["steps"][0]["result"]["slot"] == 3


async def test_emodb_results_roles_bad_input_and_unknown_queue(
    delivery_gateway: Gateway,  # noqa: F811
    tls: aiohttp.ClientSession,
) -> None:
    gw = delivery_gateway
    worker = key(gw, "worker-1")
    one = {"results": [{"id": "x", "token": 1, "outcome": "failed"}]}
    status, answer = await call(tls, "POST", gw.url + "/queue/1/nobody/results", one, headers=worker)
    assert status == 200 and answer["results"][0]["status"] == "gone"  # a queue nobody sent to
    status, answer = await call(tls, "POST", gw.url + "/dedupq/1/nobody/results", one, headers=worker)
    assert status == 200 and answer["results"][0]["status"] == "gone"
    status, answer = await call(
        tls, "POST", gw.url + "/queue/1/q/results", one, headers=key(gw, "producer-1")
    )
    assert status == 403, answer
    status, answer = await call(tls, "POST", gw.url + "/queue/1/q/results", one)
    assert status == 403 and answer["error"]["code"] == "invalid_api_key"
    status, answer = await call(tls, "POST", gw.url + "/queue/1/q/results", one, headers=key(gw, "admin-1"))
    assert status == 200  # admins may too
    for bad, want in (
        ({"results": [{"id": "x", "token": 1, "outcome": "maybe"}]}, 400),
        ({"results": [{"id": "x", "token": 1, "outcome": "failed", "partial": "p" * (20 * KiB)}]}, 413),
        ({"results": [{"id": "x", "outcome": "failed"}] * 1001}, 400),
        ([1, 2], 400),
    ):
        status, answer = await call(tls, "POST", gw.url + "/queue/1/q/results", bad, headers=worker)
        assert status == want and answer["error"]["code"] in ("invalid_argument", "too_large"), answer
    # Serving goes on.
    status, _ = await call(tls, "GET", gw.url + "/queue/1/q/poll", headers=worker)
    assert status == 200


# ------------------------------------------------------------------------------------ admin routes
async def test_admin_routes_release_redrive_policy_log_and_parked(
    delivery_gateway: Gateway,  # noqa: F811
    tls: aiohttp.ClientSession,
) -> None:
    gw = delivery_gateway
    admin, worker = key(gw, "admin-1"), key(gw, "worker-1")
    base = gw.url + "/queue/1/orders"
    for n in range(2):
        await call(
            tls, "POST", base + "/send", {"n": n}, params={"group": "A"}, headers=key(gw, "producer-1")
        )
    await call(tls, "POST", base + "/send", {"n": 9}, params={"group": "B"}, headers=key(gw, "producer-1"))
    await gw.service.set_attributes(
        "t1.orders", {"retry_backoff": 0, "dead_letter_queue": "t1.orders-dlq", "max_attempts": 3}
    )
    await gw.service.create_queue("t1.orders-dlq")
    adm = gw.url + "/admin/v1/queues/orders"

    # Per-group policy: A parks after one failure, B dead-letters its message after one.
    status, answer = await call(
        tls, "PUT", adm + "/groups/policy", {"max_attempts": 1}, params={"group": "A"}, headers=admin
    )
    assert status == 200 and answer["override"] == {"max_attempts": 1}
    assert answer["effective"]["max_attempts"] == 1 and answer["effective"]["on_exhausted"] == "park"
    policy_b = {"max_attempts": 1, "on_exhausted": "dead_letter_message"}
    status, answer = await call(
        tls, "PUT", adm + "/groups/policy", policy_b, params={"group": "B"}, headers=admin
    )
    assert status == 200, answer
    status, answer = await call(tls, "GET", adm + "/groups/policy", params={"group": "B"}, headers=admin)
    assert answer["override"] == policy_b

    _, polled = await call(tls, "GET", base + "/poll", params={"limit": "10"}, headers=worker)
    a_head = polled[0]
    b_head = next(m for m in polled if m["group"] == "B")
    failures = [
        {"id": m["id"], "token": m["token"], "outcome": "failed", "reason": "down"} for m in (a_head, b_head)
    ]
    status, answer = await call(tls, "POST", base + "/results", {"results": failures}, headers=worker)
    assert [r["status"] for r in answer["results"]] == ["ok", "ok"]

    status, answer = await call(tls, "GET", adm + "/parked", headers=admin)
    assert status == 200 and answer == {"queue": "orders", "groups": ["A"]}
    status, answer = await call(tls, "GET", adm + "/groups/log", params={"group": "A"}, headers=admin)
    assert status == 200 and [(a["outcome"], a["reason"], a["worker"]) for a in answer["attempts"]] == [
        ("failed", "down", "worker-1")
    ]
    assert (await gw.service.metrics("t1.orders-dlq")).total == 1  # B's message

    # Release A; redrive B's message back to the head of B.
    status, answer = await call(tls, "POST", adm + "/groups/release", params={"group": "A"}, headers=admin)
    assert status == 200 and answer["released"] == 1
    status, answer = await call(tls, "POST", adm + "/groups/redrive", params={"group": "B"}, headers=admin)
    assert status == 200 and (answer["restored"], answer["released"]) == (1, 0)
    _, polled = await call(tls, "GET", base + "/poll", params={"limit": "10"}, headers=worker)
    assert [m["id"] for m in polled] == [a_head["id"], polled[1]["id"], b_head["id"]]
    assert polled[0]["history"]["attempts"] == 1 and polled[2]["history"]["attempts"] == 1

    status, answer = await call(tls, "DELETE", adm + "/groups/policy", params={"group": "A"}, headers=admin)
    assert status == 200 and answer["override"] == {} and answer["effective"]["max_attempts"] == 3

    # Auth, tenants and bad input.
    status, answer = await call(tls, "POST", adm + "/groups/release", params={"group": "A"}, headers=worker)
    assert status == 403 and answer["error"]["code"] == "forbidden"
    status, answer = await call(tls, "POST", adm + "/groups/release", params={"group": "A"})
    assert status == 401
    status, answer = await call(
        tls, "POST", adm + "/groups/release", params={"group": "A"}, headers=key(gw, "other-1")
    )
    assert status == 404  # another tenant's queue does not exist for it
    status, answer = await call(tls, "POST", adm + "/groups/release", params={"group": "nope"}, headers=admin)
    assert status == 404 and answer["error"]["code"] == "not_found"
    status, answer = await call(tls, "POST", adm + "/groups/release", headers=admin)
    assert status == 400 and answer["error"]["code"] == "invalid_argument"
    status, answer = await call(
        tls, "PUT", adm + "/groups/policy", {"on_exhausted": "shrug"}, params={"group": "A"}, headers=admin
    )
    assert status == 400 and answer["error"]["code"] == "invalid_argument"
    status, answer = await call(
        tls, "PUT", adm + "/groups/policy", {"visibility_timeout": 1}, params={"group": "A"}, headers=admin
    )
    assert status == 400
    status, answer = await call(
        tls, "GET", adm + "/groups/log", params={"group": "A", "limit": "x"}, headers=admin
    )
    assert status == 400
