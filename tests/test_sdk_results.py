"""The worker SDK's log data (docs/failure-management.md §1-§3) against the real in-process gateway: what
each attempt reports (outcome, reason, signature, steps, partial results, fields, duration), the batch
rule (stop at the first failure, the rest `not_attempted`, in order), the prior attempts' `history` on a
retried delivery, probes routed to the `probe` handler, and the fallback to acks on an older gateway."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web
from gateway_support import CREDENTIALS, Gateway, delivery_gateway  # noqa: F401  (fixture)
from kit import until
from test_sdk import config, running, send, serve, size

from access.keys import KeyRing
from gateway.app import make_gateway_app
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.fences import FenceRegistry
from queue_core.machine.health import HealthSettings
from queue_core.service import QueueService
from strictq.sdk import AttemptFailed, History, Message, Worker
from strictq.sdk.attempt import MAX_JSON_BYTES, call_signature, result_item

TEST_TIMEOUT = 20.0


def log_records(gw: Gateway) -> list[dict[str, Any]]:
    """The gateway's wire-log `log` records (one per reported result), oldest first."""
    from wirelog.reader import read_records

    assert gw.deliveries is not None
    gw.deliveries.flush()
    return [r for r in read_records(gw.deliveries.directory) if r["kind"] == "log"]


async def no_retry_delay(gw: Gateway, queue: str) -> None:
    """Retries at once (the default backoff is 1 s): the tests only wait for what they check."""
    await gw.service.set_attributes(f"t1.{queue}", {"retry_backoff": 0})


# ------------------------------------------------------------------------------------------ log data
async def test_each_attempt_reports_its_log_data_and_the_retry_sees_the_history(
    delivery_gateway: Gateway,  # noqa: F811
) -> None:
    """m1 succeeds with a step and fields; m2's first attempt charges, then its shipping call gets a 502:
    `partial` with the step, the partial result, the 502 as reason and the failed call as signature. The
    retry sees all of it in `message.history`, skips the charge, and succeeds."""
    gw = delivery_gateway
    shipped: list[int] = []

    async def backend(request: web.BaseRequest) -> web.Response:
        body = await request.json()
        if body["n"] == 2 and 2 not in shipped:
            shipped.append(2)
            return web.json_response({"error": "warehouse down"}, status=502)
        return web.json_response({"shipped": body["n"]})

    charges: list[int] = []
    histories: dict[tuple[int, int], History] = {}

    async with serve(backend) as backend_url:

        async def handle(msg: Message) -> None:
            n = msg.payload["n"]
            histories[(n, msg.attempt)] = msg.history
            if msg.history.done("charged-card"):
                charge = msg.history.result("charged-card")  # verified, not charged again
            else:
                charges.append(n)
                charge = {"charge": f"ch-{n}"}
            await msg.step("charged-card", charge)
            msg.fields["amount"] = 10 * n
            msg.partial = {"charged": charge["charge"]}
            async with msg.http.post(f"{backend_url}/v1/ship/{n}", json={"n": n}) as resp:
                resp.raise_for_status()

        await send(gw, "logged", [{"n": 1}, {"n": 2}], "g")
        await no_retry_delay(gw, "logged")
        worker = Worker("logged", handle, config=config(gw), ttl=30.0)
        async with asyncio.timeout(TEST_TIMEOUT), running(worker):
            await until(lambda: worker.stats.acked == 2, what="both messages to succeed")
    assert charges == [1, 2]  # m2's retry did not charge again
    assert not histories[(1, 1)] and histories[(1, 1)].attempts == 0
    retry = histories[(2, 2)]
    assert retry.attempts == 1 and retry.last_outcome == "partial"
    assert "502" in retry.last_reason
    assert retry.done("charged-card") and retry.result("charged-card") == {"charge": "ch-2"}
    assert retry.partial == {"charged": "ch-2"}
    assert worker.stats.reported == 3 and worker.stats.failed == 1 and worker.report_results is True

    logs = log_records(gw)
    assert [r["outcome"] for r in logs] == ["succeeded", "partial", "succeeded"]
    first, failed, retried = logs
    assert failed["message_id"] == retried["message_id"] != first["message_id"]
    port = backend_url.rsplit(":", 1)[1]
    assert failed["signature"] == f"http POST 127.0.0.1:{port}/v1/ship/{{id}} 5xx"
    assert failed["reason"] == f"POST {backend_url}/v1/ship/2: 502 Bad Gateway"
    assert failed["steps"] == [{"name": "charged-card", "result": {"charge": "ch-2"}}]
    assert failed["partial"] == {"charged": "ch-2"}
    assert (failed["attempt"], retried["attempt"]) == (1, 2)
    stored = await gw.service.group_log("t1.logged", "g")  # the core keeps them per group, newest first
    assert [(s["outcome"], s["attempt"]) for s in stored] == [
        ("succeeded", 2),
        ("partial", 1),
        ("succeeded", 1),
    ]
    assert stored[2]["fields"] == {"amount": 10} and stored[2]["duration_ms"] > 0
    assert stored[1]["signature"] == failed["signature"]


async def test_attempt_failed_gives_the_reason_and_signature(
    delivery_gateway: Gateway,  # noqa: F811
) -> None:
    """`AttemptFailed` instead of an exception's text; no step done: `failed`, not `partial`."""
    gw = delivery_gateway
    seen: list[int] = []

    async def handle(msg: Message) -> None:
        seen.append(msg.attempt)
        if msg.attempt == 1:
            raise AttemptFailed("card declined", signature="card-declined", fields={"code": "expired"})

    await send(gw, "declined", [{"n": 1}], "g")
    await no_retry_delay(gw, "declined")
    worker = Worker("declined", handle, config=config(gw), ttl=30.0)
    async with asyncio.timeout(TEST_TIMEOUT), running(worker):
        await until(lambda: worker.stats.acked == 1, what="the retry to succeed")
    assert seen == [1, 2]
    failed, done = log_records(gw)
    assert (failed["outcome"], failed["reason"], failed["signature"]) == (
        "failed",
        "card declined",
        "card-declined",
    )
    assert (done["outcome"], done["attempt"]) == ("succeeded", 2)
    [_, first] = await gw.service.group_log("t1.declined", "g")
    assert first["fields"] == {"code": "expired"}


# -------------------------------------------------------------------------------------------- batches
async def test_a_failure_in_a_batch_hands_back_the_rest_not_attempted_in_order(
    delivery_gateway: Gateway,  # noqa: F811
) -> None:
    """One claim of four messages of one group: m1 succeeds, m2 fails, m3 and m4 are reported
    `not_attempted` in the same request (their receive count restored), and all come back in order."""
    gw = delivery_gateway
    order: list[tuple[int, int]] = []

    async def handle(msg: Message) -> None:
        n = msg.payload["n"]
        order.append((n, msg.attempt))
        if n == 2 and msg.attempt == 1:
            raise RuntimeError("m2's first attempt fails")

    await send(gw, "batch", [{"n": n} for n in range(1, 5)], "g")
    await no_retry_delay(gw, "batch")
    worker = Worker("batch", handle, config=config(gw), ttl=30.0, limit=10)
    async with asyncio.timeout(TEST_TIMEOUT), running(worker):
        await until(lambda: worker.stats.acked == 4, what="four successes")
    assert order == [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1)]  # m3, m4 untouched: still first attempts
    outcomes = [r["outcome"] for r in log_records(gw)]
    assert outcomes == ["succeeded", "failed", "not_attempted", "not_attempted"] + ["succeeded"] * 3
    assert (worker.stats.failed, worker.stats.released) == (1, 3)  # m2 failed, m3 and m4 handed back
    assert await size(gw, "batch") == 0


async def test_stopping_hands_back_unprocessed_claims_not_attempted(
    delivery_gateway: Gateway,  # noqa: F811
) -> None:
    gw = delivery_gateway
    started = asyncio.Event()

    async def slow(msg: Message) -> None:
        started.set()
        await asyncio.Event().wait()  # until the stop cancels it

    await send(gw, "stopping", [{"n": n} for n in range(3)], "g")
    worker = Worker("stopping", slow, config=config(gw), ttl=30.0, grace=0.2)
    async with asyncio.timeout(TEST_TIMEOUT):
        task = asyncio.create_task(worker.run())
        await started.wait()
        worker.stop()
        await task
    assert [r["outcome"] for r in log_records(gw)] == ["not_attempted"] * 3
    async with asyncio.timeout(TEST_TIMEOUT):  # at once available to another worker, attempt 1 again
        polled: list[Message] = []

        async def take(msg: Message) -> None:
            polled.append(msg)

        other = Worker("stopping", take, config=config(gw, "worker-2"), ttl=30.0)
        async with running(other):
            await until(lambda: len(polled) == 3, within=3.0, what="the handed-back claims")
    assert [m.payload["n"] for m in polled] == [0, 1, 2] and {m.attempt for m in polled} == {1}


# --------------------------------------------------------------------------------------------- probes
@contextlib.asynccontextmanager
async def failure_gateway(tmp_path: Path, settings: HealthSettings) -> AsyncIterator[Gateway]:
    """The in-process gateway with failure management on (no proxy: fences only go on the stream)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    service = QueueService(tmp_path / "queue")
    await service.start()
    keys = KeyRing(list(CREDENTIALS))
    hub = ControlHub(service, FenceRegistry(tmp_path / "fences.json"))
    failures = FailureManager(service, hub, settings)
    runner = web.AppRunner(make_gateway_app(service, keys, control=hub, failures=failures), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield Gateway(f"https://127.0.0.1:{runner.addresses[0][1]}", ca_file, service, keys)
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()


async def test_probes_go_to_the_probe_handler_and_restore_the_worker(tmp_path: Path) -> None:
    """worker-1 fails twice (the threshold): fenced, it gets only probes; its `probe` handler passes one,
    so it is unfenced and gets messages again. Probes never reach the normal handler, and are reported
    like any message (no ack, no heartbeat)."""
    settings = HealthSettings(window=30, worker_failures=2, probe_interval=0.2, probe_backoff_max=0.2)
    async with failure_gateway(tmp_path, settings) as gw:
        healthy = asyncio.Event()
        handled: list[tuple[int, bool]] = []
        probes: list[Message] = []

        async def handle(msg: Message) -> None:
            assert not msg.probe
            handled.append((msg.payload["n"], healthy.is_set()))
            if not healthy.is_set():
                raise AttemptFailed("bad deploy", signature="worker-1 bug")

        async def probe(msg: Message) -> None:
            probes.append(msg)
            healthy.set()  # the fix is out: the probe passes

        for n in range(3):
            await send(gw, "probed", [{"n": n}], f"g{n}")
        await gw.service.set_attributes("t1.probed", {"retry_backoff": 0, "retry_same_worker": 0})
        worker = Worker("probed", handle, probe=probe, config=config(gw), ttl=1.0, wait=0.5)
        async with asyncio.timeout(TEST_TIMEOUT), running(worker):
            await until(lambda: worker.stats.acked == 3, within=15.0, what="all three after the probe")
        assert probes and all(p.probe and p.id.startswith("probe-") for p in probes)
        assert probes[0].payload == {"probe": True}  # the queue's default probe payload
        assert worker.stats.probes == len(probes) and worker.stats.probes_failed == 0
        # The threshold (in flight: all three). The failure that fences the worker releases its other
        # claims in the same step (queue_core.machine.supervisor), so a third failure reported after it
        # may find its claim gone: at most that one is lost.
        assert worker.stats.failed >= 2 and worker.stats.lost <= worker.stats.failed - 2
        after = [n for n, ok in handled if ok]
        assert sorted(after) == [0, 1, 2] and len(handled) == 3 + worker.stats.failed


async def test_without_a_probe_handler_probes_go_to_the_handler(tmp_path: Path) -> None:
    settings = HealthSettings(window=30, worker_failures=1, probe_interval=0.2, probe_backoff_max=0.2)
    async with failure_gateway(tmp_path, settings) as gw:
        seen: list[bool] = []

        async def handle(msg: Message) -> None:
            seen.append(msg.probe)
            if not msg.probe and seen.count(False) == 1:
                raise RuntimeError("first one fails")

        await send(gw, "probed2", [{"n": 1}], "g")
        await gw.service.set_attributes("t1.probed2", {"retry_backoff": 0})
        worker = Worker("probed2", handle, config=config(gw), ttl=1.0, wait=0.5)
        async with asyncio.timeout(TEST_TIMEOUT), running(worker):
            await until(lambda: worker.stats.acked == 1, within=15.0, what="the retry after the probe")
        assert seen[0] is False and True in seen and seen[-1] is False


# ------------------------------------------------------------------------------------ compatibility
@contextlib.asynccontextmanager
async def older_gateway(tmp_path: Path, asked: list[str]) -> AsyncIterator[Gateway]:
    """The real gateway app as an older version serves it: without the results route. Its router never
    sees `POST /queue/1/{queue}/results`: the innermost middleware answers it as an unmatched route
    (aiohttp's HTTPNotFound, rendered by the gateway as 404 `no_such_route`) and notes the queue."""

    @web.middleware
    async def no_results_route(request: web.Request, handler: Any) -> web.StreamResponse:
        prefix, _, queue_and_route = request.path.partition("/queue/1/")
        queue, _, route = queue_and_route.partition("/")
        if request.method == "POST" and not prefix and route == "results":
            asked.append(queue)
            raise web.HTTPNotFound()
        response: web.StreamResponse = await handler(request)
        return response

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    service = QueueService(tmp_path / "queue")
    await service.start()
    keys = KeyRing(list(CREDENTIALS))
    app = make_gateway_app(service, keys, control=ControlHub(service))
    app.middlewares.append(no_results_route)  # innermost: after the gateway's error rendering
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield Gateway(f"https://127.0.0.1:{runner.addresses[0][1]}", ca_file, service, keys)
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()


async def test_an_older_gateway_without_results_gets_acks_and_releases(tmp_path: Path) -> None:
    """A gateway answering 404 to the results route: the worker falls back to ack / release for good."""
    calls: list[str] = []
    order: list[str] = []

    async def handle(msg: Message) -> None:
        n = msg.payload["n"]
        order.append(f"m{n}")
        if n == 2 and order.count("m2") == 1:
            raise RuntimeError("fails once")

    async with older_gateway(tmp_path, calls) as gateway:
        await send(gateway, "legacy", [{"n": 1}, {"n": 2}], "g")
        worker = Worker("legacy", handle, config=config(gateway), ttl=30.0, retry_backoff=(0.05, 0.1))
        async with asyncio.timeout(TEST_TIMEOUT), running(worker):
            await until(lambda: worker.stats.acked == 2, what="both acked")
        assert await size(gateway, "legacy") == 0
    assert order == ["m1", "m2", "m2"] and worker.report_results is False
    assert calls == ["legacy"]  # asked once, then acks and releases only
    assert worker.stats.released == 1 and worker.stats.reported == 0


# -------------------------------------------------------------------------------------- unit pieces
def test_result_items_stay_within_the_contract_bounds() -> None:
    big = {"blob": "x" * (MAX_JSON_BYTES + 10)}
    item = result_item(
        "m1",
        "4294967297",
        "partial",
        reason="r" * 5000,
        signature="s",
        steps=[{"name": "a", "result": big}],
        partial=big,
        fields={"ok": 1, "when": time.time},
        duration_ms=-1,
    )
    assert item["token"] == 4294967297 and len(item["reason"].encode()) <= 2048
    assert item["steps"] == [{"name": "a"}] and "partial" not in item
    assert item["fields"]["_dropped"] == ["steps.result", "partial"] and item["fields"]["ok"] == 1
    assert isinstance(item["fields"]["when"], str) and item["duration_ms"] == 0
    assert result_item("probe-1", 0, "succeeded")["token"] is None  # a probe's token 0 is no token
    with pytest.raises(AssertionError):
        result_item("m", 1, "maybe")


def test_history_from_the_poll_item() -> None:
    history = History.from_poll(
        {"attempts": 2, "last_reason": "x", "steps": [{"name": "a", "result": 1}, "junk"], "partial": [1]}
    )
    assert history.attempts == 2 and history.done("a") and history.result("a") == 1
    assert not history.done("b") and history.result("b", 7) == 7 and history.partial == [1]
    assert not History.from_poll(None) and History.from_poll(None).steps == ()


def test_call_signatures_match_the_wire_log_signatures() -> None:
    from spark.masking import signature

    ours = call_signature("post", "https://API.example.com/v1/charges/ch_12345678/capture?x=1", 503, None)
    theirs = signature(
        {
            "kind": "http",
            "method": "POST",
            "url": "https://api.example.com/v1/charges/ch_12345678/capture",
            "status": 503,
        }
    )
    assert ours == theirs == "http POST api.example.com/v1/charges/{id}/capture 5xx"
    assert call_signature("GET", "http://h/x", None, None) == "http GET h/x error"
    assert call_signature("GET", "http://h/x", 403, "block") == "http GET h/x block"
