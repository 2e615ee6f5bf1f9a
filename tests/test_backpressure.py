"""Backpressure (gateway.backpressure): a queue past its backlog thresholds slows its producers in proportion
to the backlog and releases when its workers catch up; off by default; per queue.

The policy as pure functions, then the real gateway over TLS with aiohttp (EmoDB: 429 `backpressure` with
Retry-After, saying why) and boto3 (RequestThrottled), the admin route that sets the thresholds, scoped to
the caller's tenant, and nothing of a refused send stored.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from gateway_support import Emo, serve_gateway, sqs_client

from gateway.backpressure import MIN_SHARE, REFRESH, BackpressureGate, BackpressureRefused, pressure
from queue_core.machine.attributes import QueueAttributes
from queue_core.machine.records import QueueMetrics


def metrics(total: int = 0, oldest_age: float = 0.0) -> QueueMetrics:
    return QueueMetrics("t1.q", total, 0, 0, total, 1, oldest_age, oldest_age, total, 0, 0, 0)


# ------------------------------------------------------------------------------------------ the policy
def test_off_by_default_and_under_the_thresholds() -> None:
    assert pressure(QueueAttributes(), metrics(10**6, 10**5)).share == 1.0
    attributes = QueueAttributes(backpressure_age=60, backpressure_depth=1000)
    assert pressure(attributes, metrics(1000, 60)).share == 1.0
    assert not BackpressureGate().wants_metrics("t1.q", QueueAttributes(), 0.0)  # no read for such a queue


def test_the_share_is_the_threshold_over_the_backlog_the_smaller_of_the_two() -> None:
    attributes = QueueAttributes(backpressure_age=60, backpressure_depth=1000)
    push = pressure(attributes, metrics(2000, 90))
    assert push.share == pytest.approx(0.5)  # depth: 1000/2000 < age: 60/90
    assert "2000 messages (threshold 1000)" in push.reason and "90 s old (threshold 60 s)" in push.reason
    assert pressure(attributes, metrics(10, 240)).share == pytest.approx(0.25)
    assert pressure(attributes, metrics(10**9, 0)).share == MIN_SHARE  # never a full stop


def test_the_gate_admits_the_share_evenly_and_releases_at_once() -> None:
    gate = BackpressureGate()
    attributes = QueueAttributes(backpressure_depth=100)
    assert gate.wants_metrics("t1.q", attributes, 0.0)
    gate.update("t1.q", metrics(400), 0.0)
    assert not gate.wants_metrics("t1.q", attributes, REFRESH / 2)  # read at most once per REFRESH
    admitted = []
    for _ in range(40):
        try:
            gate.admit("t1.q", "q", attributes)
            admitted.append(True)
        except BackpressureRefused as exc:
            assert exc.retry_after is not None and exc.retry_after > 0
            assert exc.details["admitted_share"] == 0.25 and exc.details["messages"] == 400
            admitted.append(False)
    assert sum(admitted) == 10 and admitted[3::4] == [True] * 10  # one in four, evenly
    assert gate.refused("t1.q") == 30
    gate.update("t1.q", metrics(50), REFRESH)
    for _ in range(10):
        gate.admit("t1.q", "q", attributes)  # under the threshold: every send


# -------------------------------------------------------------------------------- the gateway, over TLS
async def test_a_deep_queue_slows_its_producers_and_releases_when_drained(tmp_path: Path) -> None:
    async with serve_gateway(tmp_path) as gw:
        producer, admin, worker = Emo(gw, "producer-1"), Emo(gw, "admin-1"), Emo(gw, "worker-1")
        try:
            batch = {"orders": [{"i": i} for i in range(10)]}
            assert (await producer.call("POST", "/queue/1/_sendbatch", batch))[0] == 200
            status, _, body = await admin.call(
                "PUT", "/admin/v1/queues/orders/protections", {"backpressure_depth": 5}
            )
            assert status == 200, body
            assert (body["backpressure_depth"], body["backpressure_age"], body["messages"]) == (5, 0.0, 10)
            assert body["admitted_share"] == 0.5 and body["ttl"] == 0.0
            assert "10 messages (threshold 5)" in body["why"]

            outcomes = []
            for i in range(10, 14):
                status, answer_headers, body = await producer.call("POST", "/queue/1/orders/send", {"i": i})
                outcomes.append(status)
                if status == 429:
                    error = body["error"]
                    assert error["code"] == "backpressure" and error["retriable"] is True
                    assert "'orders' is slowing its producers" in error["message"], error
                    assert error["details"]["admitted_share"] == 0.5
                    assert int(answer_headers["Retry-After"]) >= 1
            assert outcomes == [429, 200, 429, 200]  # half of the sends, evenly
            status, _, size = await admin.call("GET", "/queue/1/orders/size")
            assert (status, size) == (200, 12)  # nothing of a refused send stored
            status, _, body = await admin.call("GET", "/admin/v1/queues/orders/protections")
            assert status == 200 and body["refused"] == 2
            labels = (("face", "queue"), ("queue", "orders"), ("tenant", "t1"))
            assert await admin.samples("strictq_queue_backpressure_refused_requests_total") == {labels: 2.0}

            # The workers catch up: the next read of the backlog (within a second) releases the producers.
            while True:
                status, _, claims = await worker.call("GET", "/queue/1/orders/poll?limit=10&ttl=30")
                assert status == 200
                if not claims:
                    break
                for claim in claims:
                    path = f"/queue/1/orders/ack?token={claim['token']}"
                    assert (await worker.call("POST", path, [claim["id"]]))[0] == 200
            await asyncio.sleep(REFRESH + 0.1)
            for i in range(14, 18):
                assert (await producer.call("POST", "/queue/1/orders/send", {"i": i}))[0] == 200
        finally:
            for client in (producer, admin, worker):
                await client.close()


async def test_sqs_producers_get_request_throttled(tmp_path: Path) -> None:
    async with serve_gateway(tmp_path) as gw:
        sqs = sqs_client(gw, "admin-1")
        url = (await asyncio.to_thread(sqs.create_queue, QueueName="jobs"))["QueueUrl"]
        entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
        await asyncio.to_thread(sqs.send_message_batch, QueueUrl=url, Entries=entries)
        admin = Emo(gw, "admin-1")
        try:
            status, _, body = await admin.call(
                "PUT", "/admin/v1/queues/jobs/protections", {"backpressure_depth": 1}
            )
            assert status == 200 and body["admitted_share"] == pytest.approx(0.1)
        finally:
            await admin.close()
        refused = 0
        for _ in range(10):
            try:
                await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="more")
            except ClientError as exc:
                assert exc.response["Error"]["Code"] == "RequestThrottled"
                assert "slowing its producers" in exc.response["Error"]["Message"]
                refused += 1
        assert refused == 9


async def test_the_thresholds_route_is_scoped_and_validated(tmp_path: Path) -> None:
    async with serve_gateway(tmp_path) as gw:
        admin, other, worker = Emo(gw, "admin-1"), Emo(gw, "other-1"), Emo(gw, "worker-1")
        try:
            assert (await admin.call("POST", "/queue/1/orders/send", {"i": 0}))[0] == 200
            status, _, body = await other.call("GET", "/admin/v1/queues/orders/protections")
            assert status == 404 and body["error"]["code"] == "queue_not_found"  # t2 has no such queue
            assert (await worker.call("GET", "/admin/v1/queues/orders/protections"))[0] == 403
            for bad in (
                {},
                {"ttl": 5, "x": 1},
                [1],
                {"backpressure_depth": -1},
                {"backpressure_age": "soon"},
                {"backpressure_depth": 1.5},
                {"on_expiry": "archive"},
                {"retention": 60},
            ):
                status, _, body = await admin.call("PUT", "/admin/v1/queues/orders/protections", bad)
                assert status == 400 and body["error"]["code"] == "invalid_argument", (bad, body)
            settings = {"backpressure_age": 120, "ttl": 3600, "on_expiry": "dead_letter"}
            status, _, body = await admin.call("PUT", "/admin/v1/queues/orders/protections", settings)
            assert status == 200 and (body["backpressure_age"], body["backpressure_depth"]) == (120.0, 0)
            assert (body["ttl"], body["on_expiry"], body["expired"]) == (3600.0, "dead_letter", 0)
            status, _, body = await admin.call(
                "PUT", "/admin/v1/queues/orders/protections", {"backpressure_age": 0}
            )
            assert status == 200 and body["admitted_share"] == 1.0  # off again
        finally:
            for client in (admin, other, worker):
                await client.close()
