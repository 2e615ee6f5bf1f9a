"""The EmoDB face (`/queue/1`, `/dedupq/1`) over real TLS: aiohttp and the page's curl examples.

Pinned here: every REST call of the EmoDB queue page with EmoDB's response shapes, the page's curl examples
as written (apart from host, port, TLS and the key header), API keys and tenants, roles, the strictq
extensions (group on send; group, seq and token on poll; fenced ack and renew), the dedup queue's collapse
at poll time, moves, bodies crossing faces, and bad input answered with a JSON 4xx while serving goes on.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from gateway_support import Gateway

from queue_core.machine import SendRequest

KiB = 1024
MiB = 1024 * KiB
NOBODY = object()
CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")

# The page's two curl examples, verbatim apart from the line continuations.
PAGE_SEND = (
    'curl -s -XPOST -H "Content-Type: application/json" '
    '"http://localhost:8080/queue/1/demo-app_provision-q/send" '
    '--data-binary \'{"provision":"TestCustomer"}\''
)
PAGE_SENDBATCH = (
    'curl -s -XPOST -H "Content-Type: application/json" '
    '"http://localhost:8080/queue/1/_sendbatch" '
    '--data-binary \'{"demo-app_provision-q":[{"provision":"TestCustomer"}]}\''
)


# ------------------------------------------------------------------------------------------ helpers
class Emo:
    """One credential's view of one service (`/queue/1` or `/dedupq/1`)."""

    def __init__(
        self, gw: Gateway, session: aiohttp.ClientSession, key_id: str | None, base: str = "/queue/1"
    ) -> None:
        self.gw = gw
        self.session = session
        self.secret = gw.credential(key_id).secret if key_id else None
        self.base = base

    async def call(
        self,
        method: str,
        path: str,
        body: Any = NOBODY,
        *,
        raw: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One request; (status, JSON body). Every answer of the face must be JSON."""
        sent = {} if self.secret is None else {"X-BV-API-Key": self.secret}
        data = raw
        if body is not NOBODY:
            data = json.dumps(body).encode()
        if data is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        async with self.session.request(
            method, self.gw.url + self.base + path, data=data, params=params, headers=sent
        ) as response:
            text = await response.text()
            assert response.content_type == "application/json", (response.status, text[:200])
            return response.status, json.loads(text)  # the stdlib keeps big integers exact

    async def ok(self, method: str, path: str, body: Any = NOBODY, **kwargs: Any) -> Any:
        status, data = await self.call(method, path, body, **kwargs)
        assert status == 200, (method, path, status, data)
        return data

    async def send(self, queue: str, message: Any, **kwargs: Any) -> None:
        assert await self.ok("POST", f"/{queue}/send", message, **kwargs) == {"success": True}

    async def poll(self, queue: str, ttl: float | None = None, limit: int | None = None) -> list[Any]:
        params = {k: str(v) for k, v in (("ttl", ttl), ("limit", limit)) if v is not None}
        return await self.ok("GET", f"/{queue}/poll", params=params)

    async def ack(self, queue: str, ids: list[str], **kwargs: Any) -> tuple[int, Any]:
        return await self.call("POST", f"/{queue}/ack", ids, **kwargs)

    async def size(self, queue: str) -> Any:
        return await self.ok("GET", f"/{queue}/size")

    async def claimcount(self, queue: str) -> Any:
        return await self.ok("GET", f"/{queue}/claimcount")


def assert_error(result: tuple[int, Any], status: int, code: str | None = None) -> dict[str, Any]:
    got_status, body = result
    assert got_status == status, result
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), result
    error = body["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str) and error["message"], result
    if code is not None:
        assert error["code"] == code, result
    return error


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.05)


def curl_args(gw: Gateway, command: str, secret: str, *extra: str) -> list[str]:
    """A curl command line of the page with our host, port, TLS and key header; nothing else changed."""
    args = shlex.split(command.replace("http://localhost:8080", gw.url))
    assert args[0] == "curl"
    return [
        CURL or "curl",
        *args[1:],
        *("--cacert", str(gw.ca_file), "-H", f"X-BV-API-Key: {secret}", "--max-time", "10"),
        *extra,
    ]


async def curl(gw: Gateway, command: str, key_id: str = "admin-1") -> Any:
    """Run the command as written; its output must be the JSON answer."""
    args = curl_args(gw, command, gw.credential(key_id).secret)
    result = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=15)
    assert result.returncode == 0, (args, result.stderr)
    return json.loads(result.stdout)


async def curl_status(gw: Gateway, command: str, key_id: str = "admin-1") -> tuple[int, Any]:
    """Like `curl`, with the HTTP status appended by -w to see the status of error answers."""
    args = curl_args(gw, command, gw.credential(key_id).secret, "-w", "\n%{http_code}")
    result = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=15)
    assert result.returncode == 0, (args, result.stderr)
    text, _, status = result.stdout.rpartition("\n")
    return int(status), json.loads(text)


@pytest.fixture
async def session(gateway: Gateway) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(gateway.ca_file))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=15)
    ) as s:
        yield s


@pytest.fixture
def emo(gateway: Gateway, session: aiohttp.ClientSession) -> Callable[..., Emo]:
    def make(key_id: str | None = "admin-1", base: str = "/queue/1") -> Emo:
        return Emo(gateway, session, key_id, base)

    return make


# ----------------------------------------------------------------------------------- the page, curl
@needs_curl
async def test_the_pages_curl_examples_work_as_written(gateway: Gateway, emo: Callable[..., Emo]) -> None:
    assert await curl(gateway, PAGE_SEND, "producer-1") == {"success": True}
    assert await curl(gateway, PAGE_SENDBATCH, "producer-1") == {"success": True}
    admin = emo()
    assert await admin.size("demo-app_provision-q") == 2
    polled = await emo("worker-1").poll("demo-app_provision-q")
    assert [m["payload"] for m in polled] == [{"provision": "TestCustomer"}] * 2


@needs_curl
async def test_every_rest_call_of_the_page_over_curl(gateway: Gateway) -> None:
    base = "http://localhost:8080/queue/1"
    q = f"{base}/demo-app_curl-q"
    send = f"curl -s -XPOST -H 'Content-Type: application/json' '{q}/send' --data-binary"
    assert await curl(gateway, send + " '{\"n\":1}'") == {"success": True}
    assert await curl(gateway, send + " '[1,2,3]'") == {"success": True}
    batch = f"curl -s -XPOST -H 'Content-Type: application/json' '{base}/_sendbatch' --data-binary"
    assert await curl(gateway, batch + ' \'{"demo-app_curl-q":["three",null]}\'') == {"success": True}
    assert await curl(gateway, f"curl -s '{q}/size'") == 4
    assert await curl(gateway, f"curl -s '{q}/size?limit=2'") == 4  # counted exactly in any case
    peeked = await curl(gateway, f"curl -s '{q}/peek?limit=10'")
    assert [m["payload"] for m in peeked] == [{"n": 1}, [1, 2, 3], "three", None]

    polled = await curl(gateway, f"curl -s '{q}/poll?ttl=60&limit=2'", "worker-1")
    assert [m["payload"] for m in polled] == [{"n": 1}, [1, 2, 3]]
    assert all(set(m) == {"id", "payload", "group", "seq", "token", "attempt", "queue_ref"} for m in polled)
    assert {m["queue_ref"] for m in polled} == {"demo-app_curl-q"}  # the plain face: the bare name
    assert await curl(gateway, f"curl -s '{q}/claimcount'") == 2
    ids = json.dumps([m["id"] for m in polled])
    post = "curl -s -XPOST -H 'Content-Type: application/json'"
    assert await curl(gateway, f"{post} '{q}/renew?ttl=120' --data-binary '{ids}'", "worker-1") == {
        "success": True
    }
    assert await curl(gateway, f"{post} '{q}/renew?ttl=0' --data-binary '{ids}'", "worker-1") == {
        "success": True
    }  # the page's "Unclaim": renew with ttl 0
    assert await curl(gateway, f"curl -s '{q}/claimcount'") == 0
    polled = await curl(gateway, f"curl -s '{q}/poll?ttl=60&limit=10'", "worker-1")
    assert len(polled) == 4
    assert await curl(gateway, f"curl -s -XPOST '{q}/unclaimall'") == {"success": True}
    assert await curl(gateway, f"curl -s '{q}/claimcount'") == 0
    first = json.dumps([polled[0]["id"]])
    assert await curl(gateway, f"{post} '{q}/ack' --data-binary '{first}'", "worker-1") == {"success": True}
    assert await curl(gateway, f"curl -s '{q}/size'") == 3

    moved = await curl(gateway, f"curl -s -XPOST '{base}/_move?from=demo-app_curl-q&to=demo-app_curl-done'")
    assert set(moved) == {"id"} and isinstance(moved["id"], str)

    async def complete() -> bool:
        status = await curl(gateway, f"curl -s '{base}/_move/{moved['id']}'")
        return bool(status["status"] == "COMPLETE")

    await eventually(complete)
    status = await curl(gateway, f"curl -s '{base}/_move/{moved['id']}'")
    assert (status["from"], status["to"], status["moved"]) == ("demo-app_curl-q", "demo-app_curl-done", 3)
    assert await curl(gateway, f"curl -s -XDELETE '{base}/demo-app_curl-done'") == {"success": True}
    assert await curl(gateway, f"curl -s '{base}/demo-app_curl-done/size'") == 0
    # The dedup service answers the same calls.
    dq = "http://localhost:8080/dedupq/1/demo-app_curl-q"
    dsend = f"curl -s -XPOST -H 'Content-Type: application/json' '{dq}/send' --data-binary"
    assert await curl(gateway, dsend + " '{\"same\":1}'") == {"success": True}
    assert await curl(gateway, f"curl -s '{dq}/size'") == 1
    # An unknown key is a 403 with a JSON body, over curl too.
    args = curl_args(gateway, f"curl -s '{q}/size'", "not-a-key-of-anyone", "-w", "\n%{http_code}")
    result = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, timeout=15)
    text, _, code = result.stdout.rpartition("\n")
    assert code == "403" and json.loads(text)["error"]["code"] == "invalid_api_key"


# ------------------------------------------------------------------------------ the calls, aiohttp
async def test_send_accepts_any_json_value_and_poll_returns_it(emo: Callable[..., Emo]) -> None:
    producer, worker = emo("producer-1"), emo("worker-1")
    values: list[Any] = [
        None,
        True,
        1.5,
        "text",
        [1, "two", None],
        {"a": {"b": [1, 2]}, "ü": "ß"},
        123456789012345678901234567890,  # JSON has no integer limit; every digit comes back
    ]
    for value in values:
        await producer.send("values", value)
    polled = await worker.poll("values", limit=100)
    assert [m["payload"] for m in polled] == values
    assert len({m["id"] for m in polled}) == len(values)
    for m in polled:
        assert set(m) == {"id", "payload", "group", "seq", "token", "attempt", "queue_ref"}
        assert isinstance(m["seq"], int) and isinstance(m["token"], int) and m["token"] > 0
    assert await worker.poll("values") == []  # all claimed for the default 30 s
    assert await emo().claimcount("values") == len(values)


async def test_poll_defaults_and_limits(emo: Callable[..., Emo], gateway: Gateway) -> None:
    producer, worker, admin = emo("producer-1"), emo("worker-1"), emo()
    status, _ = await producer.call(
        "POST", "/_sendbatch", {"many": list(range(15)), "other": ["x"], "empty": []}
    )
    assert status == 200
    first = await worker.poll("many")  # default limit 10, default ttl 30
    assert [m["payload"] for m in first] == list(range(10))
    claim = gateway.service.core.queue("t1.many").by_id[first[0]["id"]].claim_expires
    assert 25 < claim - time.time() <= 30.5
    assert [m["payload"] for m in await worker.poll("many", limit=1000)] == list(range(10, 15))
    assert await admin.claimcount("many") == 15
    assert await admin.size("many") == 15
    assert await admin.size("other") == 1
    assert await admin.size("empty") == 0


async def test_ack_deletes_and_renew_extends_only(emo: Callable[..., Emo], gateway: Gateway) -> None:
    producer, worker, admin = emo("producer-1"), emo("worker-1"), emo()
    for i in range(3):
        await producer.send("claims", {"i": i})
    polled = await worker.poll("claims", ttl=60)
    ids = [m["id"] for m in polled]
    queue = gateway.service.core.queue("t1.claims")

    def expires(message_id: str) -> float:
        return queue.by_id[message_id].claim_expires

    before = expires(ids[0])
    assert await worker.ok("POST", "/claims/renew", ids[:1], params={"ttl": "5"}) == {"success": True}
    assert expires(ids[0]) == before  # renewing never shortens a claim
    assert await worker.ok("POST", "/claims/renew", ids[:1], params={"ttl": "600"}) == {"success": True}
    assert expires(ids[0]) - time.time() > 590
    assert await worker.ok("POST", "/claims/renew", ids[1:2], params={"ttl": "0"}) == {"success": True}
    assert await admin.claimcount("claims") == 2  # ttl 0 released it
    assert [m["id"] for m in await worker.poll("claims", ttl=0)] == [ids[1]]  # a claim that ends at once
    # Renew recreates an expired claim (nobody claimed the message since).
    await eventually(lambda: _claims(admin, "claims", 2))
    assert await worker.ok("POST", "/claims/renew", ids[1:2], params={"ttl": "30"}) == {"success": True}
    assert await admin.claimcount("claims") == 3
    assert await worker.poll("claims") == []
    assert (await worker.ack("claims", ids[:2]))[1] == {"success": True}
    assert await admin.size("claims") == 1
    assert (await worker.ack("claims", ids)) == (200, {"success": True})  # already gone: still success
    assert (await worker.ack("claims", [])) == (200, {"success": True})
    assert await admin.size("claims") == 0


async def _claims(admin: Emo, queue: str, want: int) -> bool:
    return bool(await admin.claimcount(queue) == want)


async def test_peek_size_claimcount_unclaimall_purge(emo: Callable[..., Emo]) -> None:
    producer, worker, admin = emo("producer-1"), emo("worker-1"), emo()
    for i in range(3):
        await producer.send("admin-q", f"m{i}", params={"group": "g"} if i < 2 else None)
    assert [m["payload"] for m in await worker.poll("admin-q", ttl=60)] == ["m0", "m1", "m2"]
    assert await admin.claimcount("admin-q") == 3
    peeked = await admin.ok("GET", "/admin-q/peek")  # ignores claims
    assert [m["payload"] for m in peeked] == ["m0", "m1", "m2"]
    assert all(set(m) == {"id", "payload", "group", "seq"} for m in peeked)
    assert [m["group"] for m in peeked[:2]] == ["g", "g"]
    assert len(await admin.ok("GET", "/admin-q/peek", params={"limit": "1"})) == 1
    assert await admin.ok("POST", "/admin-q/unclaimall") == {"success": True}
    assert await admin.claimcount("admin-q") == 0
    assert len(await worker.poll("admin-q")) == 3  # all available again
    assert await admin.ok("DELETE", "/admin-q") == {"success": True}
    assert await admin.size("admin-q") == 0
    assert await admin.claimcount("admin-q") == 0
    assert await admin.ok("GET", "/admin-q/peek") == []


async def test_unknown_queues_behave_like_emodb(emo: Callable[..., Emo], gateway: Gateway) -> None:
    admin = emo()
    assert await admin.poll("never-sent") == []
    assert await admin.ok("GET", "/never-sent/peek") == []
    assert await admin.size("never-sent") == 0
    assert await admin.claimcount("never-sent") == 0
    assert await admin.ack("never-sent", ["0000000000000001"]) == (200, {"success": True})
    assert await admin.ok("POST", "/never-sent/renew", ["x"]) == {"success": True}
    assert await admin.ok("POST", "/never-sent/unclaimall") == {"success": True}
    assert await admin.ok("DELETE", "/never-sent") == {"success": True}
    assert await gateway.service.list_queues() == []  # none of that created a queue


async def test_move_runs_to_completion(emo: Callable[..., Emo]) -> None:
    producer, worker, admin = emo("producer-1"), emo("worker-1"), emo()
    for i in range(3):
        await producer.send("move-src", i, params={"group": "g1"})
    await producer.send("move-src", "solo")
    moved = await admin.ok("POST", "/_move", params={"from": "move-src", "to": "move-dst"})
    assert set(moved) == {"id"}

    async def complete() -> bool:
        return bool((await admin.ok("GET", f"/_move/{moved['id']}"))["status"] == "COMPLETE")

    await eventually(complete)
    status = await admin.ok("GET", f"/_move/{moved['id']}")
    assert status == {
        "id": moved["id"],
        "from": "move-src",
        "to": "move-dst",
        "status": "COMPLETE",
        "moved": 4,
        "remaining": 0,
    }
    assert await admin.size("move-src") == 0
    polled = await worker.poll("move-dst")
    assert sorted(json.dumps(m["payload"]) for m in polled) == ['"solo"', "0", "1", "2"]
    assert [m["payload"] for m in polled if m["group"] == "g1"] == [0, 1, 2]  # the group keeps its order
    # Another tenant does not see the move.
    assert_error(await emo("other-1").call("GET", f"/_move/{moved['id']}"), 404, "not_found")
    assert_error(await emo(base="/dedupq/1").call("GET", f"/_move/{moved['id']}"), 404, "not_found")


async def _move_state(admin: Emo, reference: str, state: str) -> bool:
    return bool((await admin.ok("GET", f"/_move/{reference}"))["status"] == state)


async def test_a_move_of_an_empty_queue_is_complete_at_once(emo: Callable[..., Emo]) -> None:
    admin = emo()
    moved = await admin.ok("POST", "/_move", params={"from": "nobody-sent", "to": "move-dst"})
    await eventually(lambda: _move_state(admin, moved["id"], "COMPLETE"), within=1.0)


# -------------------------------------------------------------------------------- strictq extensions
async def test_groups_keep_order_and_carry_seq_and_token(emo: Callable[..., Emo]) -> None:
    producer, worker, worker2 = emo("producer-1"), emo("worker-1"), emo("worker-2")
    await producer.send("ordered", {"n": 1}, params={"group": "customer-1"})
    await producer.send("ordered", {"n": 2}, headers={"X-Strictq-Group": "customer-1"})
    await producer.send("ordered", {"n": 3}, params={"group": "customer-2"})
    status, _ = await producer.call(
        "POST", "/_sendbatch", {"ordered": [{"n": 4}, {"n": 5}]}, params={"group": "customer-1"}
    )
    assert status == 200
    first = await worker.poll("ordered", limit=2, ttl=60)
    assert [(m["group"], m["payload"]["n"]) for m in first] == [("customer-1", 1), ("customer-1", 2)]
    assert first[0]["seq"] < first[1]["seq"] and first[0]["token"] == first[1]["token"]
    # The group is claimed: nobody gets its later messages while the claim lasts.
    second = await worker2.poll("ordered", ttl=60)
    assert [(m["group"], m["payload"]["n"]) for m in second] == [("customer-2", 3)]
    assert await worker2.poll("ordered") == []
    headers = {"X-Strictq-Lease": str(first[0]["token"])}
    assert await worker.ack("ordered", [m["id"] for m in first], headers=headers) == (200, {"success": True})
    third = await worker2.poll("ordered", ttl=60)
    assert [(m["group"], m["payload"]["n"]) for m in third] == [("customer-1", 4), ("customer-1", 5)]
    assert third[0]["token"] > first[0]["token"] and third[0]["seq"] > first[1]["seq"]


async def test_a_stale_token_is_refused_and_a_plain_ack_still_deletes(
    emo: Callable[..., Emo], gateway: Gateway
) -> None:
    producer, worker1, worker2, admin = emo("producer-1"), emo("worker-1"), emo("worker-2"), emo()
    await producer.send("fenced", {"job": 1}, params={"group": "g"})
    (old,) = await worker1.poll("fenced", ttl=0.2)
    # The claim expires; another worker claims the message with a newer token.
    claimed: list[Any] = []

    async def taken() -> bool:
        claimed.extend(await worker2.poll("fenced", ttl=60))
        return bool(claimed)

    await eventually(taken)
    (new,) = claimed
    assert new["id"] == old["id"] and new["token"] > old["token"]
    assert gateway.service.core.queue("t1.fenced").groups["g"].claim_worker == "worker-2"

    stale = await worker1.ack("fenced", [old["id"]], headers={"X-Strictq-Lease": str(old["token"])})
    error = assert_error(stale, 409, "stale_claim")
    assert error["details"]["ids"] == [old["id"]]
    assert stale[1]["results"] == [{"id": old["id"], "status": "stale_claim"}]
    stale = await worker1.call("POST", "/fenced/renew", [old["id"]], params={"token": str(old["token"])})
    assert assert_error(stale, 409, "stale_claim")["details"]["ids"] == [old["id"]]
    assert await admin.size("fenced") == 1  # nothing happened
    # The current holder renews with its token; renewing by token recreates its expired claim too.
    current = {"token": str(new["token"])}
    assert await worker2.ok("POST", "/fenced/renew", [new["id"]], params=current) == {"success": True}
    # A plain EmoDB ack (no token) answers success, but deletes only for the claim's holder (issue 11).
    assert await worker1.ack("fenced", [old["id"]]) == (200, {"success": True})
    assert await admin.size("fenced") == 1
    assert await worker2.ack("fenced", [new["id"]]) == (200, {"success": True})
    assert await admin.size("fenced") == 0
    # Acking again with the current token: the message is gone, which is no refusal.
    assert await worker2.ack("fenced", [new["id"]], params=current) == (200, {"success": True})
    # But a fenced renew of a gone message is: the lease it would keep alive no longer exists.
    lost = await worker2.call("POST", "/fenced/renew", [new["id"]], params=current)
    assert assert_error(lost, 409, "gone")["details"]["ids"] == [new["id"]]


async def test_poll_with_wait_answers_as_soon_as_a_message_arrives(
    emo: Callable[..., Emo], gateway: Gateway
) -> None:
    producer, worker = emo("producer-1"), emo("worker-1")
    await producer.send("lp", {"warm": True})
    assert [m["payload"] for m in await worker.poll("lp")] == [{"warm": True}]
    polling = asyncio.create_task(worker.ok("GET", "/lp/poll", params={"wait": "10"}))
    await eventually(lambda: _now(gateway.service.has_waiters("t1.lp")))
    sent_at = time.monotonic()
    await producer.send("lp", {"n": 1})
    answer = await asyncio.wait_for(polling, 10)
    assert [m["payload"] for m in answer] == [{"n": 1}]
    assert time.monotonic() - sent_at < 0.5  # the long poll answers at the send, not at the end of the wait


async def _now(value: bool) -> bool:
    return value


async def test_a_token_renew_recreates_an_expired_claim_nobody_superseded(emo: Callable[..., Emo]) -> None:
    producer, worker, admin = emo("producer-1"), emo("worker-1"), emo()
    await producer.send("recreate", "x", params={"group": "g"})
    (m,) = await worker.poll("recreate", ttl=0)  # expires at once
    await eventually(lambda: _claims(admin, "recreate", 0))
    lease = {"X-Strictq-Lease": str(m["token"])}
    assert await worker.ok("POST", "/recreate/renew", [m["id"]], headers=lease) == {"success": True}
    assert await admin.claimcount("recreate") == 1
    assert await worker.poll("recreate") == []
    # Released (ttl=0) and claimed by someone else: the old token is refused for renew as well.
    assert await worker.ok("POST", "/recreate/renew", [m["id"]], params={"ttl": "0"}, headers=lease) == {
        "success": True
    }
    (again,) = await emo("worker-2").poll("recreate", ttl=60)
    refused = await worker.call("POST", "/recreate/renew", [m["id"]], headers=lease)
    assert assert_error(refused, 409, "stale_claim")["details"]["ids"] == [m["id"]]
    assert again["token"] > m["token"]


# -------------------------------------------------------------------------------------- dedup queue
async def test_dedupq_collapses_duplicates_at_poll_time(emo: Callable[..., Emo], gateway: Gateway) -> None:
    producer = emo("producer-1", "/dedupq/1")
    worker, admin = emo("worker-1", "/dedupq/1"), emo(base="/dedupq/1")
    await producer.send("dq", {"m": 1})
    await producer.send("dq", {"m": 1})
    status, _ = await producer.call("POST", "/dq/send", raw=b'{ "m" : 1 }')  # the same value, spelt apart
    assert status == 200
    await producer.send("dq", {"m": 2})
    peeked = await admin.ok("GET", "/dq/peek")  # peek still shows the duplicates
    assert [m["payload"] for m in peeked] == [{"m": 1}] * 3 + [{"m": 2}]
    polled = await worker.poll("dq", ttl=60)  # M1 M1 M1 M2 -> P: M1 once
    assert [m["payload"] for m in polled] == [{"m": 1}, {"m": 2}]
    assert await admin.size("dq") == 2
    # M1 -> P1 -> M1 -> P2: both polls see M1.
    await producer.send("dq", {"m": 1})
    assert [m["payload"] for m in await worker.poll("dq", ttl=60)] == [{"m": 1}]
    # The same name on the queue service is another queue, and a dedup queue in the core.
    assert await emo().size("dq") == 0
    assert (await gateway.service.attributes("t1_dedupq.dq")).kind == "dedup"
    assert "t1.dq" not in await gateway.service.list_queues()
    # _sendbatch and _move on the dedup service stay on dedup queues.
    status, _ = await producer.call("POST", "/_sendbatch", {"dq2": ["a", "b"]})
    assert status == 200
    moved = await admin.ok("POST", "/_move", params={"from": "dq2", "to": "dq3"})
    await eventually(lambda: _move_state(admin, moved["id"], "COMPLETE"))
    assert (await gateway.service.attributes("t1_dedupq.dq3")).kind == "dedup"
    assert [m["payload"] for m in await worker.poll("dq3")] == ["a", "b"]


async def test_moved_duplicates_collapse_in_a_dedup_queue(emo: Callable[..., Emo]) -> None:
    producer, worker, admin = (emo(k, "/dedupq/1") for k in ("producer-1", "worker-1", "admin-1"))
    status, _ = await producer.call("POST", "/_sendbatch", {"dq2": ["a", "a", "b"]})
    assert status == 200
    moved = await admin.ok("POST", "/_move", params={"from": "dq2", "to": "dq3"})
    await eventually(lambda: _move_state(admin, moved["id"], "COMPLETE"))
    assert [m["payload"] for m in await worker.poll("dq3")] == ["a", "b"]


# ------------------------------------------------------------------------------------ across faces
async def test_bodies_cross_faces(emo: Callable[..., Emo], gateway: Gateway) -> None:
    producer, worker = emo("producer-1"), emo("worker-1")
    await producer.send("cross", {"a": 1, "b": [True, None]})
    ((_, body, content_type, _),) = await gateway.service.peek("t1.cross")
    assert (body, content_type) == (b'{"a":1,"b":[true,null]}', "application/json")
    # Bodies another face stored as text: JSON text comes back parsed, anything else as a string.
    texts = [b'{"x": [1, 2]}', b"plain words", b"\xff\xferaw", b"NaN", b"12 apples", b'"quoted"']
    await gateway.service.send(
        "t1.cross", [SendRequest(body=t, content_type="text/plain") for t in texts], create=True
    )
    polled = await worker.poll("cross", limit=20)
    assert [m["payload"] for m in polled] == [
        {"a": 1, "b": [True, None]},
        {"x": [1, 2]},
        "plain words",
        "\ufffd\ufffdraw",
        "NaN",
        "12 apples",
        "quoted",
    ]


# ------------------------------------------------------------------------------- keys, tenants, roles
async def test_api_keys_and_tenant_isolation(emo: Callable[..., Emo]) -> None:
    for headers in ({}, {"X-BV-API-Key": "not-a-key-of-anyone"}, {"X-BV-API-Key": ""}):
        nobody = emo(None)
        assert_error(await nobody.call("GET", "/q/poll", headers=headers), 403, "invalid_api_key")
        assert_error(await nobody.call("POST", "/q/send", {"x": 1}, headers=headers), 403, "invalid_api_key")
    t1, t2 = emo(), emo("other-1")
    await t2.send("shared-name", "t2's message")
    assert await t1.poll("shared-name") == []  # a different queue: tenants never share names
    assert await t1.size("shared-name") == 0
    assert [m["payload"] for m in await t2.poll("shared-name")] == ["t2's message"]
    # A credential limited to prefixes does not see other names at all: 404 on every call.
    limited = emo("limited-1")
    await limited.send("orders-eu", 1)
    assert await limited.size("orders-eu") == 1
    for method, path, body in [
        ("POST", "/payments/send", 1),
        ("GET", "/payments/poll", NOBODY),
        ("GET", "/payments/size", NOBODY),
        ("POST", "/payments/ack", ["x"]),
        ("DELETE", "/payments", NOBODY),
        ("POST", "/_sendbatch", {"orders-eu": [1], "payments": [2]}),
    ]:
        assert_error(await limited.call(method, path, body), 404, "queue_not_found")
    assert await limited.size("orders-eu") == 1  # the refused batch sent nothing
    assert_error(await limited.call("POST", "/_move", params={"from": "orders-eu", "to": "x"}), 404)


async def test_roles(emo: Callable[..., Emo]) -> None:
    producer, worker = emo("producer-1"), emo("worker-1")
    await producer.send("roles", "m")
    assert (await producer.call("POST", "/_sendbatch", {"roles": ["n"]}))[0] == 200
    for who, method, path, body, params in [
        (producer, "GET", "/roles/poll", NOBODY, None),
        (producer, "POST", "/roles/ack", ["x"], None),
        (producer, "POST", "/roles/renew", ["x"], None),
        (producer, "GET", "/roles/size", NOBODY, None),
        (worker, "POST", "/roles/send", "m", None),
        (worker, "POST", "/_sendbatch", {"roles": ["m"]}, None),
        (worker, "GET", "/roles/peek", NOBODY, None),
        (worker, "GET", "/roles/size", NOBODY, None),
        (worker, "GET", "/roles/claimcount", NOBODY, None),
        (worker, "DELETE", "/roles", NOBODY, None),
        (worker, "POST", "/roles/unclaimall", NOBODY, None),
        (worker, "POST", "/_move", NOBODY, {"from": "roles", "to": "roles2"}),
        (worker, "GET", "/_move/mv-1-1", NOBODY, None),
    ]:
        error = assert_error(await who.call(method, path, body, params=params), 403, "forbidden")
        assert who.secret not in error["message"]
    polled = await worker.poll("roles")
    assert len(polled) == 2
    assert await worker.ok("POST", "/roles/renew", [polled[0]["id"]]) == {"success": True}
    assert await worker.ack("roles", [m["id"] for m in polled]) == (200, {"success": True})
    assert_error(await emo("other-1").call("GET", "/roles/poll", headers={"X-BV-API-Key": "x" * 20}), 403)


# ----------------------------------------------------------------------------------------- bad input
async def test_bad_input_is_a_json_4xx_and_serving_goes_on(emo: Callable[..., Emo], gateway: Gateway) -> None:
    admin = emo()
    await admin.send("bad", "seed")
    cases: list[tuple[tuple[str, str], dict[str, Any], int, str | None]] = [
        (("POST", "/bad/send"), {"raw": b'{"a":'}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b""}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b"NaN"}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b"\xff\xfe"}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b"[" * 100_000}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b"1e999"}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b"{}", "headers": {"Content-Type": "text/plain"}}, 415, None),
        (("POST", "/bad/send"), {"raw": b"{}", "params": {"group": "has space"}}, 400, "invalid_argument"),
        (("POST", "/bad/send"), {"raw": b"{}", "params": {"group": ""}}, 400, "invalid_argument"),
        (
            ("POST", "/bad/send"),
            {"raw": b"{}", "params": {"group": "a"}, "headers": {"X-Strictq-Group": "b"}},
            400,
            "invalid_argument",
        ),
        (("POST", "/bad/send"), {"body": "x" * (300 * KiB)}, 413, "too_large"),
        (("POST", "/bad/send"), {"raw": b'"' + b"x" * (4 * MiB) + b'"'}, 413, "request_too_large"),
        (("POST", "/_sendbatch"), {"body": ["not", "an", "object"]}, 400, "invalid_argument"),
        (("POST", "/_sendbatch"), {"body": {"bad": "not a list"}}, 400, "invalid_argument"),
        (("POST", "/_sendbatch"), {"body": {"bad": ["x" * (300 * KiB)]}}, 413, "too_large"),
        (("POST", "/_sendbatch"), {"body": {"no/slash": [1]}}, 404, "queue_not_found"),
        (("POST", "/" + "n" * 81 + "/send"), {"body": 1}, 404, "queue_not_found"),
        (("GET", "/bad/poll"), {"params": {"ttl": "-1"}}, 400, "invalid_argument"),
        (("GET", "/bad/poll"), {"params": {"ttl": "3601"}}, 400, "invalid_argument"),
        (("GET", "/bad/poll"), {"params": {"ttl": "abc"}}, 400, "invalid_argument"),
        (("GET", "/bad/poll"), {"params": {"ttl": "nan"}}, 400, "invalid_argument"),
        (("GET", "/bad/poll"), {"params": {"limit": "0"}}, 400, "invalid_argument"),
        (("GET", "/bad/poll"), {"params": {"limit": "1001"}}, 400, "invalid_argument"),
        (("GET", "/bad/poll"), {"params": {"limit": "ten"}}, 400, "invalid_argument"),
        (("GET", "/bad/peek"), {"params": {"limit": "0"}}, 400, "invalid_argument"),
        (("GET", "/bad/size"), {"params": {"limit": "-5"}}, 400, "invalid_argument"),
        (("POST", "/bad/ack"), {"body": {"ids": ["x"]}}, 400, "invalid_argument"),
        (("POST", "/bad/ack"), {"body": [1, 2]}, 400, "invalid_argument"),
        (("POST", "/bad/ack"), {"body": None}, 400, "invalid_argument"),
        (("POST", "/bad/ack"), {"body": ["x"], "params": {"token": "abc"}}, 400, "invalid_argument"),
        (("POST", "/bad/ack"), {"body": ["x"], "headers": {"X-Strictq-Lease": "-1"}}, 400, None),
        (("POST", "/bad/renew"), {"body": ["x"], "params": {"ttl": "3601"}}, 400, "invalid_argument"),
        (("POST", "/_move"), {"params": {"from": "bad"}}, 400, "invalid_argument"),
        (("POST", "/_move"), {"params": {"from": "bad", "to": "bad"}}, 400, "invalid_argument"),
        (("GET", "/_move/mv-9-99"), {}, 404, "not_found"),
        (("GET", "/bad/nope"), {}, 404, "no_such_route"),
        (("GET", ""), {}, 404, "no_such_route"),
        (("GET", "/bad/send"), {}, 405, "method_not_allowed"),
        (("PUT", "/bad"), {}, 405, "method_not_allowed"),
    ]
    for (method, path), kwargs, status, code in cases:
        body = kwargs.pop("body", NOBODY)
        result = await admin.call(method, path, body, **kwargs)
        assert_error(result, status, code)
    dedup = emo(base="/dedupq/1")
    assert_error(await dedup.call("POST", "/bad/poll"), 405, "method_not_allowed")
    assert_error(await dedup.call("GET", "/bad/poll/extra"), 404, "no_such_route")
    # Nothing bad was stored, and the gateway still serves.
    assert await admin.size("bad") == 1
    assert [m["payload"] for m in await admin.poll("bad")] == ["seed"]
    async with admin.session.get(gateway.url + "/healthz") as response:
        assert response.status == 200
