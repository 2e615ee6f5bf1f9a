"""Per-tenant send limits at the edge (gateway.rate_limits, gateway.limits_http, `strictq limits`).

The token bucket with an explicit clock (a hypothesis property: never more than burst + rate x elapsed is
admitted, and a client that waits as told gets in), then the real gateway over TLS: EmoDB 429 with
Retry-After and the one error body, boto3's RequestThrottled, nothing of a refused send stored, the other
tenant untouched, the admin routes scoped to tenant and role, limits kept across restarts, and the CLI
against a real `strictq serve`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from gateway_support import CREDENTIALS, Emo, serve_gateway, sqs_client
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_support import start_serve

from access.keys import Credential
from gateway.rate_limits import InvalidLimit, TenantLimit, TenantRateLimiter
from wirelog.files import StartupError

OPERATOR = Credential("operator-1", "operator-secret-0123456789", "operator", "ops")
KEYS = [*CREDENTIALS, OPERATOR]
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=30)


# ------------------------------------------------------------------------------------ the bucket
def test_a_burst_then_the_rate_and_a_refusal_takes_nothing() -> None:
    limiter = TenantRateLimiter(default=TenantLimit(rate=10, burst=5))
    assert [limiter.admit("t1", 1, 0.0) for _ in range(5)] == [0.0] * 5
    wait = limiter.admit("t1", 1, 0.0)
    assert wait == pytest.approx(0.1)  # one message's worth at 10/s
    assert limiter.admit("t1", 1, 0.05) == pytest.approx(0.05)  # the refusal took nothing
    assert limiter.admit("t1", 1, 0.1) == 0.0
    assert limiter.admit("t2", 5, 0.1) == 0.0  # every tenant its own bucket
    counters = limiter.counters["t1"]
    assert (counters.admitted, counters.throttled_requests, counters.throttled_messages) == (6, 2, 2)


def test_a_batch_larger_than_the_burst_passes_on_a_full_bucket_only() -> None:
    limiter = TenantRateLimiter(default=TenantLimit(rate=1, burst=5))
    assert limiter.admit("t1", 10, 0.0) == 0.0  # costs the whole burst
    assert limiter.admit("t1", 10, 1.0) == pytest.approx(4.0)  # until the bucket is full again


def test_an_unlimited_tenant_and_an_override() -> None:
    limiter = TenantRateLimiter()
    assert all(limiter.admit("t1", 100, 0.0) == 0.0 for _ in range(100))
    limiter.set("t1", TenantLimit(rate=1, burst=1))
    assert limiter.admit("t1", 1, 0.0) == 0.0 and limiter.admit("t1", 1, 0.0) > 0
    limiter.default = TenantLimit(rate=1, burst=1)
    limiter.set("t2", None)  # unlimited whatever the default
    assert all(limiter.admit("t2", 10, 0.0) == 0.0 for _ in range(10))


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 1000),
    burst=st.floats(1, 100),
    steps=st.lists(st.tuples(st.floats(0, 2), st.integers(1, 10)), min_size=1, max_size=60),
)
def test_never_more_than_burst_plus_rate_times_elapsed(
    rate: float, burst: float, steps: list[tuple[float, int]]
) -> None:
    limiter = TenantRateLimiter(default=TenantLimit(rate, burst))
    now, taken = 0.0, 0.0
    for gap, cost in steps:
        now += gap
        wait = limiter.admit("t", cost, now)
        if wait == 0.0:
            taken += min(cost, burst)  # the tokens a request costs
        else:  # waiting as told admits it (nothing else takes from this bucket meanwhile)
            assert limiter.admit("t", cost, now + wait + 1e-9) == 0.0
            now += wait + 1e-9
            taken += min(cost, burst)
        assert taken <= burst + rate * now + 1e-6


@pytest.mark.parametrize(
    ("rate", "burst", "message"),
    [
        (0, None, "rate"),
        (-1, None, "rate"),
        (True, None, "rate"),
        ("5", None, "rate"),
        (5, 0.5, "burst"),
        (float("nan"), None, "rate"),
        (1e12, None, "rate"),
        (5, float("inf"), "burst"),
    ],
)
def test_a_limit_is_a_positive_rate_and_a_burst_of_one_or_more(rate: Any, burst: Any, message: str) -> None:
    with pytest.raises(InvalidLimit, match=message):
        TenantLimit.parse(rate, burst)


def test_limits_persist_privately_and_a_damaged_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    limiter = TenantRateLimiter.load(path, TenantLimit(100, 100))
    limiter.set("t1", TenantLimit(5, 10))
    limiter.set("t2", None)
    assert path.stat().st_mode & 0o777 == 0o600
    again = TenantRateLimiter.load(path, None)
    assert again.overrides == {"t1": TenantLimit(5, 10), "t2": None}
    assert again.limit_of("t3") is None  # the default is the flags', not the file's
    assert again.clear("t1") and not again.clear("t1")
    assert TenantRateLimiter.load(path, None).overrides == {"t2": None}
    path.write_text('{"version": 1, "tenants": {"t1": {"rate": -3}}}')
    with pytest.raises(StartupError, match="not a limits file"):
        TenantRateLimiter.load(path, None)


# --------------------------------------------------------------------------- the gateway, over TLS
async def test_emodb_sends_over_the_rate_get_429_with_retry_after_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    limiter = TenantRateLimiter(default=TenantLimit(rate=0.5, burst=5))
    async with serve_gateway(tmp_path, limiter=limiter, credentials=KEYS) as gw:
        t1, t2, admin = Emo(gw, "producer-1"), Emo(gw, "other-1"), Emo(gw, "admin-1")
        try:
            status, _, _ = await t1.call(
                "POST", "/queue/1/_sendbatch", {"orders": [{"i": i} for i in range(5)]}
            )
            assert status == 200
            status, answer_headers, body = await t1.call("POST", "/queue/1/orders/send", {"i": 5})
            assert status == 429, body
            assert int(answer_headers["Retry-After"]) >= 1
            error = body["error"]
            assert error["code"] == "throttled" and error["retriable"] is True
            assert error["details"]["tenant"] == "t1" and error["details"]["rate"] == 0.5
            assert "t1" in error["message"] and "0.5 messages/s" in error["message"]
            status, _, size = await admin.call("GET", "/queue/1/orders/size")
            assert (status, size) == (200, 5)  # the refused send stored nothing
            # The other tenant's bucket is its own.
            for i in range(5):
                status, _, _ = await t2.call("POST", "/queue/1/orders/send", {"i": i})
                assert status == 200
            # /metrics: each tenant's admitted and throttled counts, a tenant's admin seeing its own only.
            operator = Emo(gw, "operator-1")
            try:
                assert await operator.samples("strictq_tenant_throttled_requests_total") == {
                    (("tenant", "t1"),): 1.0,
                    (("tenant", "t2"),): 0.0,
                }
            finally:
                await operator.close()
            assert await admin.samples("strictq_tenant_admitted_messages_total") == {(("tenant", "t1"),): 5.0}
        finally:
            for client in (t1, t2, admin):
                await client.close()


async def test_sqs_sends_over_the_rate_get_request_throttled(tmp_path: Path) -> None:
    limiter = TenantRateLimiter(default=TenantLimit(rate=0.5, burst=10))
    async with serve_gateway(tmp_path, limiter=limiter, credentials=KEYS) as gw:
        sqs = sqs_client(gw, "admin-1")
        url = (await asyncio.to_thread(sqs.create_queue, QueueName="jobs"))["QueueUrl"]
        entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
        sent = await asyncio.to_thread(sqs.send_message_batch, QueueUrl=url, Entries=entries)
        assert len(sent["Successful"]) == 10
        with pytest.raises(ClientError) as refused:
            await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="one too many")
        assert refused.value.response["Error"]["Code"] == "RequestThrottled"
        with pytest.raises(ClientError) as refused_batch:  # the whole batch, as SQS refuses it
            await asyncio.to_thread(sqs.send_message_batch, QueueUrl=url, Entries=entries[:2])
        assert refused_batch.value.response["Error"]["Code"] == "RequestThrottled"
        attributes = await asyncio.to_thread(
            sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )
        assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "10"


async def test_limit_routes_are_scoped_and_change_the_limit_at_run_time(tmp_path: Path) -> None:
    limiter = TenantRateLimiter.load(tmp_path / "limits.json", TenantLimit(rate=0.5, burst=1))
    async with serve_gateway(tmp_path, limiter=limiter, credentials=KEYS) as gw:
        admin, other, operator = Emo(gw, "admin-1"), Emo(gw, "other-1"), Emo(gw, "operator-1")
        producer, worker = Emo(gw, "producer-1"), Emo(gw, "worker-1")
        try:
            status, _, body = await admin.call("GET", "/admin/v1/limits")
            assert status == 200 and [t["tenant"] for t in body["tenants"]] == ["t1"]
            assert body["default"] == {"rate": 0.5, "burst": 1.0}
            status, _, body = await operator.call("GET", "/admin/v1/limits")
            assert status == 200 and [t["tenant"] for t in body["tenants"]] == ["t1", "t2"]
            assert (await worker.call("GET", "/admin/v1/limits"))[0] == 403
            # A tenant's admin may not raise its own limit where the key file has several tenants.
            status, _, body = await admin.call("PUT", "/admin/v1/limits/t1", {"rate": 1000})
            assert status == 403 and body["error"]["code"] == "forbidden"
            assert (await other.call("PUT", "/admin/v1/limits/t1", {"rate": 1000}))[0] == 403
            status, _, body = await operator.call("PUT", "/admin/v1/limits/nobody", {"rate": 5})
            assert status == 404 and body["error"]["code"] == "unknown_tenant"
            for bad in ({"rate": 0}, {"burst": 5}, {"rate": 5, "extra": 1}, [5], {"rate": None, "burst": 3}):
                status, _, body = await operator.call("PUT", "/admin/v1/limits/t1", bad)
                assert status == 400 and body["error"]["code"] == "invalid_limit", bad

            assert (await producer.call("POST", "/queue/1/q/send", {"i": 0}))[0] == 200
            assert (await producer.call("POST", "/queue/1/q/send", {"i": 1}))[0] == 429
            status, _, body = await operator.call("PUT", "/admin/v1/limits/t1", {"rate": 1000, "burst": 50})
            assert status == 200 and body["limit"] == {"rate": 1000.0, "burst": 50.0}
            assert body["source"] == "tenant" and body["throttled_requests"] == 1
            assert (await producer.call("POST", "/queue/1/q/send", {"i": 1}))[0] == 200  # at once
            assert TenantRateLimiter.load(tmp_path / "limits.json", None).overrides == {
                "t1": TenantLimit(1000, 50)
            }
            status, _, body = await operator.call("DELETE", "/admin/v1/limits/t1")
            assert status == 200 and body["source"] == "default"
            assert (await producer.call("POST", "/queue/1/q/send", {"i": 2}))[0] == 200  # a new full bucket
            assert (await producer.call("POST", "/queue/1/q/send", {"i": 3}))[0] == 429
        finally:
            for client in (admin, other, operator, producer, worker):
                await client.close()


# ------------------------------------------------------------------------------ the CLI, for real
def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strictq", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
    )


def test_serve_refuses_a_bad_default_limit_in_one_line(tmp_path: Path) -> None:
    for args, line in (
        (("--tenant-rate", "0"), "strictq: --tenant-rate: rate must be"),
        (("--tenant-rate", "5", "--tenant-burst", "0.5"), "strictq: --tenant-burst: burst must be"),
        (("--tenant-burst", "5"), "strictq: --tenant-burst goes with --tenant-rate"),
    ):
        done = run_cli("serve", "--data-dir", str(tmp_path / "d"), "--no-proxy", *args, env={})
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(line) and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_limits_cli_against_a_real_serve(tmp_path: Path) -> None:
    data_dir = tmp_path / "serve"
    serve = start_serve(data_dir, "--tenant-rate", "1", "--tenant-burst", "2")
    try:
        env = {"STRICTQ_URL": serve.url, "STRICTQ_ADMIN_KEY": serve.secret("admin")}
        done = run_cli("limits", env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == "default: 1 msg/s, burst 2"
        assert done.stdout.splitlines()[2].split()[:4] == ["dev", "1", "msg/s,", "burst"]
        # make run's key file serves one tenant: its admin is the operator and may change the limit.
        done = run_cli("limits", "set", "dev", "--rate", "50", "--burst", "100", env=env)
        assert (done.returncode, done.stdout) == (0, "dev: 50 msg/s, burst 100 (its own)\n"), done.stderr
        done = run_cli("limits", "set", "dev", "--unlimited", env=env)
        assert (done.returncode, done.stdout) == (0, "dev: unlimited (its own)\n"), done.stderr
        done = run_cli("limits", "set", "dev", "--rate", "-1", env=env)
        assert done.returncode == 2 and "--rate -1: give a positive number" in done.stderr
        done = run_cli("limits", "set", "nobody", "--rate", "5", env=env)
        assert done.returncode == 1 and "404 unknown_tenant" in done.stderr, done.stderr
        done = run_cli("limits", "clear", "dev", "--json", env=env)
        assert done.returncode == 0 and orjson.loads(done.stdout)["source"] == "default"
        # strictq protections, on the same server (gateway.backpressure; tests/test_backpressure.py)
        for i in range(2):
            assert serve.call("POST", "/queue/1/orders/send", serve.secret("producer"), {"i": i})[0] == 200
        done = run_cli("protections", "orders", "--backpressure-depth", "1", "--ttl", "3600", env=env)
        assert done.returncode == 0, done.stderr
        first, ttl, now, fairness = done.stdout.splitlines()
        assert fairness == "fairness: no tenants (oldest first); 0 groups sidelined"
        assert first == "orders: backpressure age off, depth 1 messages"
        assert ttl == "ttl 3600 s, then dropped; 0 expired"
        assert now.startswith("now: 2 messages, the oldest ")  # its age: seconds since the send
        assert now.endswith(
            "; slowing producers to 50%: it holds 2 messages (threshold 1); 0 sends refused by this gateway"
        )
        done = run_cli(
            "protections", "orders", "--tenant-separator", ":", "--tenant-concurrency", "4",
            "--worker-pools", "8", "--sideline-rate", "50", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == (
            "fairness: tenants by ':', taking turns, 4 claims per tenant, 2 of 8 worker pools per tenant,"
            " sidelining groups over 50/s per tenant; 0 groups sidelined"
        )
        done = run_cli("protections", "orders", "--tenant-separator", "", "--tenant-concurrency", "0", env=env)  # noqa: E501
        assert done.returncode == 1 and "400 invalid_argument" in done.stderr, done.stderr
        assert "worker_pools works per tenant: set tenant_separator too" in done.stderr  # still 8 pools
        done = run_cli("protections", "orders", "--tenant-separator", "x", env=env)
        assert done.returncode == 1 and "tenant_separator must be one ASCII punctuation" in done.stderr
        done = run_cli("protections", "orders", "--backpressure-depth", "-3", env=env)
        assert done.returncode == 2 and "--backpressure-depth -3: give a number, 0 or more" in done.stderr
        done = run_cli("protections", "nosuch", "--json", env=env)
        assert done.returncode == 1 and "404 queue_not_found" in done.stderr, done.stderr
    finally:
        serve.stop()
    restarted = start_serve(data_dir)  # the default is the flags' (none now); a tenant's own is kept
    try:
        env = {"STRICTQ_URL": restarted.url, "STRICTQ_ADMIN_KEY": restarted.secret("admin")}
        assert run_cli("limits", "set", "dev", "--rate", "7", env=env).returncode == 0
    finally:
        restarted.stop()
    again = start_serve(data_dir)
    try:
        env = {"STRICTQ_URL": again.url, "STRICTQ_ADMIN_KEY": again.secret("admin")}
        done = run_cli("limits", "list", "--json", env=env)
        assert done.returncode == 0, done.stderr
        answer = orjson.loads(done.stdout)
        assert answer["default"] is None
        assert answer["tenants"][0]["limit"] == {"rate": 7.0, "burst": 7.0}
    finally:
        again.stop()
