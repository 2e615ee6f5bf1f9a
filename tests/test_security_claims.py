"""Issue 11 item 3: ending a claim needs proof of holding it.

Regressions through the real servers (the in-process gateway over TLS, the `strictq queue-server`
process) for each reproduction: results without a token, another worker's renew ttl=0 / ack without a
token, SQS receipt handles guessed from tokens +-3 or tampered; the plain EmoDB client's poll and ack by
id still works. Then the core's identity rule with the fake clock, and the receipt key file.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from conftest import running_server
from gateway_support import CREDENTIALS, Gateway, serve_gateway
from kit.secret import internal_secret
from support import T0, Clock, make_core, send_group, statuses
from test_gateway_emodb import Emo, assert_error
from test_gateway_remote import _serve_gateway
from test_gateway_sqs import call, fifo_queue, sqs_client

from access.keys import KeyRing
from gateway.sqs_receipts import ReceiptKeyError, ReceiptSigner
from queue_core.client import QueueClient, QueueClientError
from queue_core.machine import InvalidArgument
from queue_core.machine.inputs import AttemptResult
from queue_core.remote import RemoteQueueService

LEASE = "X-Strictq-Lease"


@pytest.fixture
async def session(gateway: Gateway) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(gateway.ca_file)))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def emo(gateway: Gateway, session: aiohttp.ClientSession, key_id: str) -> Emo:
    return Emo(gateway, session, key_id)


def held(gateway: Gateway, queue: str) -> dict[str, str]:
    """Message id -> the worker its live claim went to ('' when not claimed now)."""
    state = gateway.service.core.queue(f"t1.{queue}")
    return {
        m.id: (g.claim_worker if m.claim_expires else "") for g in state.groups.values() for m in g.messages
    }


# ------------------------------------------------------------------------------------------ EmoDB face
async def test_results_without_a_token_are_refused_naming_the_field(
    gateway: Gateway, session: aiohttp.ClientSession
) -> None:
    producer, w1, w2 = (emo(gateway, session, k) for k in ("producer-1", "worker-1", "worker-2"))
    await producer.send("jobs", {"n": 1}, params={"group": "g"})
    await producer.send("jobs", {"n": 2}, params={"group": "h"})
    message_ids = list(held(gateway, "jobs"))
    # nobody was given either message: a success without a token must not delete one
    for who in (w1, w2):
        result = await who.call(
            "POST", "/jobs/results", {"results": [{"id": message_ids[0], "outcome": "succeeded"}]}
        )
        error = assert_error(result, 400, "invalid_argument")
        assert error["details"]["field"] == "token"
    assert list(held(gateway, "jobs")) == message_ids
    # a claim held by worker-1: worker-2 with worker-1's (guessable) token is refused too
    (polled,) = await w1.poll("jobs", ttl=60, limit=1)
    item = {"id": polled["id"], "token": polled["token"], "outcome": "succeeded"}
    refused = await w2.ok("POST", "/jobs/results", {"results": [item]})
    assert [r["status"] for r in refused["results"]] == ["stale_claim"]
    assert held(gateway, "jobs")[polled["id"]] == "worker-1"
    # the holder's result with its token is taken
    taken = await w1.ok("POST", "/jobs/results", {"results": [item]})
    assert [r["status"] for r in taken["results"]] == ["ok"]
    assert polled["id"] not in held(gateway, "jobs")


async def test_another_workers_release_or_ack_without_token_leaves_the_claim(
    gateway: Gateway, session: aiohttp.ClientSession
) -> None:
    producer, w1, w2 = (emo(gateway, session, k) for k in ("producer-1", "worker-1", "worker-2"))
    admin = emo(gateway, session, "admin-1")
    await producer.send("orders", {"n": 1}, params={"group": "g"})
    await producer.send("orders", {"n": 2}, params={"group": "g"})
    first = await w1.poll("orders", ttl=60, limit=1)
    assert [m["payload"] for m in first] == [{"n": 1}]
    message_id = first[0]["id"]
    # EmoDB answers success per id, but nothing happens to a claim worker-2 does not hold
    assert await w2.ok("POST", "/orders/renew", [message_id], params={"ttl": "0"}) == {"success": True}
    assert await w2.ok("POST", "/orders/renew", [message_id], params={"ttl": "1"}) == {"success": True}
    assert await w2.ok("POST", "/orders/ack", [message_id]) == {"success": True}
    assert held(gateway, "orders")[message_id] == "worker-1"
    assert await admin.claimcount("orders") == 1
    # so the group stays claimed: worker-2 gets nothing, the message is not delivered twice
    assert await w2.poll("orders", ttl=60) == []
    # with worker-1's token guessed, worker-2 is refused with 409 naming the id
    result = await w2.ack("orders", [message_id], headers={LEASE: str(first[0]["token"])})
    error = assert_error(result, 409, "stale_claim")
    assert error["details"]["ids"] == [message_id]
    # the holder acks by id without a token (EmoDB's plain client), and the group goes on in order
    assert await w1.ok("POST", "/orders/ack", [message_id]) == {"success": True}
    assert message_id not in held(gateway, "orders")
    second = await w2.poll("orders", ttl=60)
    assert [m["payload"] for m in second] == [{"n": 2}]
    assert second[0]["attempt"] == 1  # delivered once


async def test_a_worker_cannot_ack_a_message_nobody_was_given_but_an_admin_can(
    gateway: Gateway, session: aiohttp.ClientSession
) -> None:
    producer, w1, admin = (emo(gateway, session, k) for k in ("producer-1", "worker-1", "admin-1"))
    await producer.send("idle", {"n": 1})
    await producer.send("idle", {"n": 2})
    one, two = list(held(gateway, "idle"))
    assert await w1.ok("POST", "/idle/ack", [one]) == {"success": True}
    assert await w1.ok("POST", "/idle/renew", [one], params={"ttl": "30"}) == {"success": True}
    assert set(held(gateway, "idle")) == {one, two} and held(gateway, "idle")[one] == ""
    # an admin acks by id, as EmoDB allows
    assert await admin.ok("POST", "/idle/ack", [one]) == {"success": True}
    assert list(held(gateway, "idle")) == [two]


async def test_plain_emodb_client_polls_renews_and_acks_by_id(
    gateway: Gateway, session: aiohttp.ClientSession
) -> None:
    producer, w1 = emo(gateway, session, "producer-1"), emo(gateway, session, "worker-1")
    for n in range(3):
        await producer.send("plain", {"n": n})
    polled = await w1.poll("plain", ttl=30, limit=10)
    assert len(polled) == 3
    message_ids = [m["id"] for m in polled]
    assert await w1.ok("POST", "/plain/renew", message_ids, params={"ttl": "120"}) == {"success": True}
    assert await w1.ok("POST", "/plain/renew", message_ids[2:], params={"ttl": "0"}) == {"success": True}
    assert held(gateway, "plain")[message_ids[2]] == ""  # released by its holder
    assert await w1.ok("POST", "/plain/ack", message_ids[:2]) == {"success": True}
    assert list(held(gateway, "plain")) == message_ids[2:]
    # a late ack of its own claim after it expired, nobody having taken it since, still deletes
    (again,) = await w1.poll("plain", ttl=0.05, limit=1)

    async def expired() -> bool:
        return held(gateway, "plain").get(again["id"]) == ""

    deadline = asyncio.get_running_loop().time() + 5
    while not await expired():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    assert await w1.ok("POST", "/plain/ack", [again["id"]]) == {"success": True}
    assert held(gateway, "plain") == {}


# -------------------------------------------------------------------------------------------- SQS face
async def test_forged_and_tampered_receipt_handles_are_invalid(gateway: Gateway) -> None:
    admin, one, two = (sqs_client(gateway, k) for k in ("admin-1", "worker-1", "worker-2"))
    url = await fifo_queue(admin, "pay.fifo", ContentBasedDeduplication="true")
    other = await fifo_queue(admin, "other.fifo", ContentBasedDeduplication="true")
    for body, group in (("a", "g1"), ("b", "g2")):
        await call(admin.send_message, QueueUrl=url, MessageBody=body, MessageGroupId=group)
    (mine,) = (await call(one.receive_message, QueueUrl=url, MaxNumberOfMessages=1))["Messages"]
    (theirs,) = (await call(two.receive_message, QueueUrl=url, MaxNumberOfMessages=1))["Messages"]
    handle = mine["ReceiptHandle"]
    token = int(mine["Attributes"]["StrictqFencingToken"])
    token_hex, mac, message_id = handle.split(".", 2)
    assert int(token_hex, 16) == token and message_id == mine["MessageId"]
    other_id = theirs["MessageId"]
    forged = [f"{token + d:x}.{other_id}" for d in range(-3, 4)]  # the old handle shape, guessed
    forged += [f"{token + d:x}.{mac}.{other_id}" for d in range(-3, 4)]  # a MAC of another handle
    forged += [f"{token + d:x}.{mac}.{message_id}" for d in (-1, 1)]  # a neighbouring token
    forged += [f"{token_hex}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}.{message_id}"]  # a tampered MAC
    forged += [f"{token_hex}.{mac}.{message_id}x", f"0{token_hex}.{mac}.{message_id}", handle + "é"]
    for bad in forged:
        with pytest.raises(two.exceptions.ReceiptHandleIsInvalid):
            await call(two.delete_message, QueueUrl=url, ReceiptHandle=bad)
        with pytest.raises(two.exceptions.ReceiptHandleIsInvalid):
            await call(two.change_message_visibility, QueueUrl=url, ReceiptHandle=bad, VisibilityTimeout=0)
    # a real handle is bound to its queue
    with pytest.raises(one.exceptions.ReceiptHandleIsInvalid):
        await call(one.delete_message, QueueUrl=other, ReceiptHandle=handle)
    # batches refuse forged entries one by one
    entries = [{"Id": f"e{i}", "ReceiptHandle": bad} for i, bad in enumerate(forged[:10])]
    answer = await call(two.delete_message_batch, QueueUrl=url, Entries=entries)
    assert answer.get("Successful", []) == []
    assert {f["Code"] for f in answer["Failed"]} == {"ReceiptHandleIsInvalid"}
    visibility = [{**e, "VisibilityTimeout": 0} for e in entries]
    answer = await call(two.change_message_visibility_batch, QueueUrl=url, Entries=visibility)
    assert {f["Code"] for f in answer["Failed"]} == {"ReceiptHandleIsInvalid"}
    # nothing was touched: both claims are live with their workers
    state = gateway.service.core.queue("t1.pay.fifo")
    workers = {m.id: g.claim_worker for g in state.groups.values() for m in g.claimed}
    assert workers == {message_id: "worker-1", other_id: "worker-2"}
    # the real handles work
    await call(one.change_message_visibility, QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=60)
    await call(one.delete_message, QueueUrl=url, ReceiptHandle=handle)
    await call(two.delete_message, QueueUrl=url, ReceiptHandle=theirs["ReceiptHandle"])
    assert gateway.service.core.queue("t1.pay.fifo").by_id == {}


async def test_receipt_handles_survive_a_restart_with_the_key_file(tmp_path: Path) -> None:
    key = tmp_path / "receipt.key"
    async with serve_gateway(tmp_path, receipt_key=key) as gw:
        admin, worker = sqs_client(gw, "admin-1"), sqs_client(gw, "worker-1")
        url = await fifo_queue(admin, "keep.fifo", ContentBasedDeduplication="true")
        await call(admin.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="g")
        (message,) = (await call(worker.receive_message, QueueUrl=url, VisibilityTimeout=600))["Messages"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    async with serve_gateway(tmp_path, receipt_key=key) as gw:  # the same data dir and key file
        worker = sqs_client(gw, "worker-1")
        url = (await call(worker.get_queue_url, QueueName="keep.fifo"))["QueueUrl"]
        await call(worker.delete_message, QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        assert gw.service.core.queue("t1.keep.fifo").by_id == {}
    key.unlink()  # a new key: old handles no longer verify
    async with serve_gateway(tmp_path, receipt_key=key) as gw:
        worker = sqs_client(gw, "worker-1")
        with pytest.raises(worker.exceptions.ReceiptHandleIsInvalid):
            await call(worker.delete_message, QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def test_the_receipt_key_file_is_private_shared_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "data" / "receipt.key"
    old = os.umask(0)  # the mode comes from os.open, not from a friendly umask
    try:
        first = ReceiptSigner.load(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["receipt.key"]  # no temporary file left
    second = ReceiptSigner.load(path)  # another process on the same data dir: the same key
    handle = first.sign("t1.q", 0x1_0000_0005, "m-1")
    assert second.verify("t1.q", handle) == ("m-1", 0x1_0000_0005)
    assert second.verify("t1.other", handle) is None
    assert ReceiptSigner.ephemeral().verify("t1.q", handle) is None
    for bad in (None, 5, "", "a.b", "zz.x.m-1", "1.2.3.4", "x" * 2000):
        assert first.verify("t1.q", bad) is None
    path.write_text("short\n")
    with pytest.raises(ReceiptKeyError, match=r"receipt\.key"):
        ReceiptSigner.load(path)


# ---------------------------------------------------------------------------------- the internal API
async def test_internal_api_enforces_the_holder_it_is_given(client: QueueClient) -> None:
    await client.send("work", [{"body": "a", "group": "g"}, {"body": "b", "group": "h"}])
    (got,) = await client.receive("work", limit=1, ttl=60, worker="w1")
    other = next(m for m in await client.peek("work", 10) if m["id"] != got["id"])["id"]
    receipt = got["receipt"]
    assert [r["status"] for r in await client.ack("work", [receipt], holder="w2")] == ["stale_claim"]
    assert [r["status"] for r in await client.renew("work", [receipt], 0, holder="w2")] == ["stale_claim"]
    assert [r["status"] for r in await client.ack_ids("work", [other], holder="w1")] == ["stale_claim"]
    assert await client.claim_count("work") == 1
    untokened = {"results": [{"id": got["id"], "outcome": "succeeded"}], "worker": "w1"}
    with pytest.raises(QueueClientError) as refused:
        await client.request("POST", "/v1/queues/work/results", untokened)
    assert refused.value.status == 400 and refused.value.details["field"] == "token"
    assert [r["status"] for r in await client.ack("work", [receipt], holder="w1")] == ["ok"]
    assert [r["status"] for r in await client.ack_ids("work", [other])] == ["ok"]  # an operator's
    assert await client.size("work") == 0


async def test_a_gateway_over_a_queue_server_forwards_the_holder(tmp_path: Path) -> None:
    """`strictq serve --queue-server`: the identity rides to the queue server's core, which enforces it."""
    with running_server(tmp_path / "queue-server") as server:
        backend = RemoteQueueService(server.url, probe_interval=0.2, secret=internal_secret())
        await backend.start()
        runner, url, ca_file = await _serve_gateway(tmp_path, backend)
        gw = Gateway(url, ca_file, backend, KeyRing(list(CREDENTIALS)))  # type: ignore[arg-type]
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file)))
        try:
            async with aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=30)
            ) as s:
                producer, w1, w2, admin = (
                    emo(gw, s, k) for k in ("producer-1", "worker-1", "worker-2", "admin-1")
                )
                await producer.send("remote", {"n": 1}, params={"group": "g"})
                (polled,) = await w1.poll("remote", ttl=60)
                message_id = polled["id"]
                assert await w2.ok("POST", "/remote/renew", [message_id], params={"ttl": "0"}) == {
                    "success": True
                }
                assert await w2.ok("POST", "/remote/ack", [message_id]) == {"success": True}
                item = {"id": message_id, "token": polled["token"], "outcome": "succeeded"}
                refused = await w2.ok("POST", "/remote/results", {"results": [item]})
                assert [r["status"] for r in refused["results"]] == ["stale_claim"]
                del item["token"]
                error = assert_error(await w1.call("POST", "/remote/results", {"results": [item]}), 400)
                assert error["details"]["field"] == "token"
                assert await admin.claimcount("remote") == 1 and await admin.size("remote") == 1
                assert await w2.poll("remote", ttl=60) == []
                assert await w1.ok("POST", "/remote/ack", [message_id]) == {"success": True}
                assert await admin.size("remote") == 0
        finally:
            backend.stop_waiting()
            await runner.cleanup()
            await backend.close()


# ------------------------------------------------------------------------------- the core's rule
def test_core_ends_a_claim_only_for_its_holder() -> None:
    clock = Clock()
    core = make_core("q", {"visibility_timeout": 10})
    send_group(core, "q", clock.now, "g", ["m1", "m2"])
    send_group(core, "q", clock.now, "h", ["n1"])
    (d,) = core.receive("q", 1, None, "w1", clock.advance(1))
    assert d.message_id == "m1"
    # not the holder: with or without the right token, nothing changes
    for token in (None, d.token):
        assert statuses(core.ack("q", [("m1", token)], clock.now, holder="w2")) == ["stale_claim"]
        assert statuses(core.release("q", [("m1", token)], clock.now, holder="w2")) == ["stale_claim"]
        assert statuses(core.renew("q", [("m1", token)], 60, clock.now, holder="w2")) == ["stale_claim"]
    assert core.queue("q").groups["g"].claimed[0].claim_expires == T0 + 11
    # never delivered: nobody's (the superseded m2 of w1's group too, and n1 of an idle group)
    assert statuses(core.ack("q", [("n1", None), ("m2", None)], clock.now, holder="w1")) == [
        "stale_claim",
        "stale_claim",
    ]
    # the holder renews and releases without a token
    assert statuses(core.renew("q", [("m1", None)], 60, clock.now, holder="w1")) == ["ok"]
    assert statuses(core.release("q", [("m1", None)], clock.now, holder="w1")) == ["ok"]
    assert core.queue("q").in_flight == 0
    # a late ack of the holder's expired claim nobody took since deletes; once another took it, no more
    (d,) = core.receive("q", 1, 5, "w1", clock.advance(1))
    core.handle_timer(clock.advance(6))
    assert statuses(core.ack("q", [("m1", None)], clock.now, holder="w1")) == ["ok"]
    (d,) = core.receive("q", 1, 5, "w1", clock.advance(1))
    assert d.message_id == "m2"
    core.handle_timer(clock.advance(6))
    (again,) = core.receive("q", 1, 5, "w2", clock.advance(1))
    assert again.message_id == "m2"
    assert statuses(core.ack("q", [("m2", None)], clock.now, holder="w1")) == ["stale_claim"]
    assert statuses(core.ack("q", [("m2", None)], clock.now, holder="w2")) == ["ok"]
    # an operator (no holder) acks by id whatever the claims
    assert statuses(core.ack("q", [("n1", None)], clock.now)) == ["ok"]
    assert core.queue("q").by_id == {}


def test_core_results_need_a_token_and_the_holder() -> None:
    clock = Clock()
    core = make_core("q", {"visibility_timeout": 30})
    send_group(core, "q", clock.now, "g", ["m1"])
    with pytest.raises(InvalidArgument) as missing:
        core.report("q", "w2", [AttemptResult("m1", None, "succeeded")], clock.now, holder="w2")
    assert missing.value.details["field"] == "token"
    (d,) = core.receive("q", 1, None, "w1", clock.advance(1))
    result = AttemptResult("m1", d.token, "succeeded")
    assert statuses(core.report("q", "w2", [result], clock.now, holder="w2")) == ["stale_claim"]
    assert "m1" in core.queue("q").by_id
    assert statuses(core.report("q", "w1", [result], clock.now, holder="w1")) == ["ok"]
    assert core.queue("q").by_id == {}


def test_fencing_tokens_still_count_up() -> None:
    clock = Clock()
    core = make_core("q")
    send_group(core, "q", clock.now, "g", ["m1"])
    tokens: list[int] = []
    for _ in range(3):
        (d,) = core.receive("q", 1, 5, "w", clock.advance(1))
        tokens.append(d.token)
        assert statuses(core.release("q", [("m1", d.token)], clock.now, holder="w")) == ["ok"]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
