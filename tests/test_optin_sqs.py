"""Plain SQS clients keep SQS semantics with failure management on (issue 12): boto3 never declares
capabilities, so its lapsed visibility timeouts are ordinary redeliveries, never failure evidence.

Real boto3 through the real in-process gateway (TLS on 127.0.0.1) with failure management on, at
health_support's fast settings (fenced after 3 failures). The queue's visibility timeout is set to 0.3 s
on the core (SQS's own API takes whole seconds), so ten lapses take a few seconds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config
from health_support import TIMEOUT, Health, running_health

REGION = "us-east-1"
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=30)
LAPSE_TTL = 0.3  # the queue's visibility timeout, seconds
LAPSES = 10


def sqs_client(h: Health, key_id: str) -> Any:
    credential = h.keys.by_id(key_id)
    assert credential is not None
    return boto3.client(
        "sqs",
        endpoint_url=h.url,
        region_name=REGION,
        aws_access_key_id=credential.id,
        aws_secret_access_key=credential.secret,
        verify=str(h.ca_file),
        config=NO_RETRIES,
    )


async def call(method: Any, **kwargs: Any) -> Any:
    """boto3 blocks; the gateway runs on this loop."""
    return await asyncio.to_thread(method, **kwargs)


async def no_claims(h: Health, queue: str) -> None:
    """Wait (bounded) until every claim of the queue has lapsed."""
    deadline = time.monotonic() + TIMEOUT
    while (await h.service.metrics(queue)).in_flight:
        assert time.monotonic() < deadline, "the claims never lapsed"
        await asyncio.sleep(0.02)


async def receive(sqs: Any, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    answer = await call(
        sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"], **kwargs
    )
    messages: list[dict[str, Any]] = answer.get("Messages", [])
    return messages


async def setup_queue(h: Health, fifo: bool) -> tuple[Any, Any, str, str, list[str]]:
    admin, producer = sqs_client(h, "admin-1"), sqs_client(h, "producer-1")
    name = "lapses.fifo" if fifo else "lapses"
    attributes = {"FifoQueue": "true"} if fifo else {}
    url = (await call(admin.create_queue, QueueName=name, Attributes=attributes))["QueueUrl"]
    internal = f"t1.{name}"
    await h.service.set_attributes(internal, {"visibility_timeout": LAPSE_TTL, "retry_backoff": 0.0})
    sent: list[str] = []
    for group in ("g1", "g2"):
        for n in range(3):
            body = f"{group}-{n}"
            extra: dict[str, str] = {}
            if fifo:
                extra = {"MessageGroupId": group, "MessageDeduplicationId": body}
            await call(producer.send_message, QueueUrl=url, MessageBody=body, **extra)
            sent.append(body)
    return admin, producer, url, internal, sent


async def assert_never_accounted(h: Health, worker: str) -> None:
    status = await h.status()
    assert status["operator_fences"] == []
    assert all(w["worker"] != worker for w in status["workers"]), status["workers"]
    assert not [e for e in await h.events() if e.get("worker") == worker]
    assert "fence" not in h.event_names()
    assert h.hub.registry.get(worker) is None
    assert not h.manager.monitor.blocked(worker)


@pytest.mark.parametrize("fifo", [True, False], ids=["fifo", "standard"])
async def test_boto3_lapses_are_redeliveries_not_failures(tmp_path: Any, fifo: bool) -> None:
    async with running_health(tmp_path) as h:
        _, _, url, internal, sent = await setup_queue(h, fifo)
        consumer = sqs_client(h, "worker-1")
        first: list[str] | None = None
        for lapse in range(LAPSES):  # the SQS way to retry: let the visibility timeout run out
            got = await receive(consumer, url)
            bodies = [m["Body"] for m in got]
            assert sorted(bodies) == sorted(sent), (lapse, bodies)
            if fifo:  # every message of each group, in group order, on every redelivery
                assert [b for b in bodies if b.startswith("g1")] == ["g1-0", "g1-1", "g1-2"]
                assert [b for b in bodies if b.startswith("g2")] == ["g2-0", "g2-1", "g2-2"]
            counts = {int(m["Attributes"]["ApproximateReceiveCount"]) for m in got}
            assert counts == {lapse + 1}  # a redelivery still counts as a receive, as in SQS
            first = first or bodies
            await no_claims(h, internal)
        await assert_never_accounted(h, "worker-1")
        assert (await h.service.metrics(internal)).total == len(sent)  # nothing parked, lost or moved

        # Right after a lapse the messages are anyone's: a second consumer takes them (no exclusion of
        # the lapsing worker, no reservation for it).
        await receive(consumer, url)
        await no_claims(h, internal)
        other = sqs_client(h, "worker-2")
        taken = await receive(other, url, VisibilityTimeout=30)
        assert sorted(m["Body"] for m in taken) == sorted(sent)
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(taken)]
        answer = await call(other.delete_message_batch, QueueUrl=url, Entries=entries)
        assert not answer.get("Failed"), answer
        assert (await h.service.metrics(internal)).total == 0
        await assert_never_accounted(h, "worker-1")
        await assert_never_accounted(h, "worker-2")


async def test_a_lapse_after_an_opted_in_poll_counts(tmp_path: Any) -> None:
    """The rule over time: a worker id takes part from its poll that declared `results` until one that
    does not. The same credential polling through the EmoDB face as the SDK does (declaring) has its
    lapses counted; through boto3 (no declaration) it is plain again, and its lapses are not."""
    async with running_health(tmp_path) as h:
        queue = "t1.jobs"
        await h.service.set_attributes(queue, {"visibility_timeout": LAPSE_TTL})
        for n in range(3):
            await h.send(f"g{n}", {"n": n})
        items = await h.poll("worker-1", ttl=LAPSE_TTL)  # declares: results, probes
        assert len(items) == 3
        await no_claims(h, queue)
        # Three lapses of a participant reach the threshold (3): fenced.
        deadline = time.monotonic() + TIMEOUT
        while h.hub.registry.get("worker-1") is None:
            assert time.monotonic() < deadline, "the participant's lapses were not counted"
            await asyncio.sleep(0.02)
        # worker-2 polls plainly (an EmoDB client): its lapses are not counted, it is never held.
        items = await h.poll("worker-2", ttl=LAPSE_TTL, capabilities=None)
        assert len(items) == 3 and not any(i.get("probe") for i in items)
        await no_claims(h, queue)
        again = await h.poll("worker-2", ttl=30, capabilities=None)
        assert len(again) == 3
        assert not [e for e in await h.events() if e.get("worker") == "worker-2"]
