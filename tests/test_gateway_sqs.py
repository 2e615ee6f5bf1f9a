"""The SQS face with real boto3 over the in-process gateway's TLS: FIFO group semantics (the SQS FIFO post's
auction), message attributes and MD5s, long polling, receive-attempt retries, dead-letter redrive, fencing
of stale receipts, batches and standard queues. Errors, SigV4, roles and tenants: test_gateway_sqs_errors.

botocore (unlike the Java SDK) does not check MD5OfMessageBody/MD5OfMessageAttributes itself, so the tests
check them against published vectors and an implementation of SQS's documented encoding written here.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.config import Config
from gateway_support import Gateway
from kit.until import until

REGION = "us-east-1"
NO_RETRIES = Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=30)


# ------------------------------------------------------------------------------------------- helpers
def sqs_client(gw: Gateway, key_id: str = "admin-1", secret: str | None = None, region: str = REGION) -> Any:
    credential = gw.credential(key_id)
    return boto3.client(
        "sqs",
        endpoint_url=gw.url,
        region_name=region,
        aws_access_key_id=credential.id,
        aws_secret_access_key=credential.secret if secret is None else secret,
        verify=str(gw.ca_file),
        config=NO_RETRIES,
    )


async def call(method: Callable[..., Any], **kwargs: Any) -> Any:
    """boto3 blocks; the gateway runs on this loop, so every call goes through a thread."""
    return await asyncio.to_thread(method, **kwargs)


async def fifo_queue(sqs: Any, name: str, **attributes: str) -> str:
    attrs = {"FifoQueue": "true", **attributes}
    return (await call(sqs.create_queue, QueueName=name, Attributes=attrs))["QueueUrl"]


async def bodies_of(sqs: Any, url: str, **kwargs: Any) -> tuple[list[str], list[str]]:
    messages = (await call(sqs.receive_message, QueueUrl=url, **kwargs)).get("Messages", [])
    return [m["Body"] for m in messages], [m["ReceiptHandle"] for m in messages]


async def delete_all(sqs: Any, url: str, receipts: list[str]) -> None:
    for start in range(0, len(receipts), 10):
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts[start : start + 10])]
        result = await call(sqs.delete_message_batch, QueueUrl=url, Entries=entries)
        assert not result.get("Failed"), result


def expected_md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """SQS's documented encoding, written independently of the gateway's."""
    data = b""
    for name in sorted(attributes):
        value = attributes[name]
        binary = value["DataType"].startswith("Binary")
        raw = value["BinaryValue"] if binary else value["StringValue"].encode()
        for field in (name.encode(), value["DataType"].encode()):
            data += struct.pack("!I", len(field)) + field
        data += bytes([2 if binary else 1]) + struct.pack("!I", len(raw)) + raw
    return hashlib.md5(data).hexdigest()


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


# ------------------------------------------------------------------------- the auction (FIFO post)
@pytest.mark.parametrize("consumer_two_slow", [False, True], ids=["both-delete", "consumer-2-slow"])
async def test_auction_groups_go_to_one_consumer_each(gateway: Gateway, consumer_two_slow: bool) -> None:
    admin, producer = sqs_client(gateway), sqs_client(gateway, "producer-1")
    one, two = sqs_client(gateway, "worker-1"), sqs_client(gateway, "worker-2")
    url = await fifo_queue(admin, "auction.fifo")
    bids = [f"{group}{n}" for n in range(1, 12) for group in "AB"]  # A1 B1 A2 B2 ... A11 B11
    for start in range(0, len(bids), 10):
        entries = [
            {"Id": bid, "MessageBody": bid, "MessageGroupId": bid[0], "MessageDeduplicationId": bid}
            for bid in bids[start : start + 10]
        ]
        result = await call(producer.send_message_batch, QueueUrl=url, Entries=entries)
        assert [s["Id"] for s in result["Successful"]] == [e["Id"] for e in entries]

    first, first_receipts = await bodies_of(one, url, MaxNumberOfMessages=10)
    second, second_receipts = await bodies_of(two, url, MaxNumberOfMessages=10)
    assert first == [f"A{n}" for n in range(1, 11)]
    assert second == [f"B{n}" for n in range(1, 11)]

    await delete_all(one, url, first_receipts)
    if not consumer_two_slow:
        await delete_all(two, url, second_receipts)
        assert (await bodies_of(one, url, MaxNumberOfMessages=10))[0] == ["A11", "B11"]
        return
    # Consumer 2 has not deleted: group B is still in flight, so consumer 1 only gets the last A.
    rest, rest_receipts = await bodies_of(one, url, MaxNumberOfMessages=10)
    assert rest == ["A11"]
    await delete_all(one, url, rest_receipts)
    assert (await bodies_of(one, url, MaxNumberOfMessages=10))[0] == []
    await delete_all(two, url, second_receipts)
    assert (await bodies_of(one, url, MaxNumberOfMessages=10))[0] == ["B11"]


async def test_fifo_system_attributes_and_strictq_extensions(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = await fifo_queue(admin, "attrs.fifo", ContentBasedDeduplication="true")
    sent = await call(producer.send_message, QueueUrl=url, MessageBody="hello", MessageGroupId="g1")
    again = await call(producer.send_message, QueueUrl=url, MessageBody="hello", MessageGroupId="g1")
    assert again["MessageId"] == sent["MessageId"]  # content-based deduplication
    assert int(again["SequenceNumber"]) == int(sent["SequenceNumber"])
    before = time.time()
    result = await call(
        worker.receive_message, QueueUrl=url, MessageSystemAttributeNames=["All"], VisibilityTimeout=30
    )
    (message,) = result["Messages"]
    attributes = message["Attributes"]
    assert message["MD5OfBody"] == md5("hello")
    assert attributes["MessageGroupId"] == "g1"
    assert attributes["SequenceNumber"] == sent["SequenceNumber"]
    assert attributes["MessageDeduplicationId"] == hashlib.sha256(b"hello").hexdigest()
    assert attributes["ApproximateReceiveCount"] == "1"
    assert attributes["SenderId"] == "producer-1"
    assert abs(int(attributes["SentTimestamp"]) / 1000 - before) < 5
    assert int(attributes["ApproximateFirstReceiveTimestamp"]) >= int(attributes["SentTimestamp"])
    assert int(attributes["StrictqFencingToken"]) > 0 and attributes["StrictqGroup"] == "g1"
    assert attributes["StrictqAttempt"] == "1"
    # Only what was asked for, plus the Strictq extensions.
    await call(
        worker.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle=message["ReceiptHandle"],
        VisibilityTimeout=0,
    )
    plain = (await call(worker.receive_message, QueueUrl=url, AttributeNames=["SentTimestamp"]))["Messages"][
        0
    ]
    assert set(plain["Attributes"]) == {
        "SentTimestamp",
        "StrictqFencingToken",
        "StrictqGroup",
        "StrictqAttempt",
    }
    assert int(plain["Attributes"]["StrictqFencingToken"]) > int(attributes["StrictqFencingToken"])


# ------------------------------------------------------------------------------ attributes and MD5s
async def test_message_attributes_round_trip_with_sqs_md5s(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = (await call(admin.create_queue, QueueName="attributes"))["QueueUrl"]
    # Published vectors (other SQS implementations' tests) pin the encoding independently of this code.
    vectors = [
        (
            {"timestamp": {"DataType": "Number", "StringValue": "1493147359900"}},
            "235c5c510d26fb653d073faed50ae77c",
        ),
        (
            {
                "ordinal": {"DataType": "Number", "StringValue": "1"},
                "category": {"DataType": "String", "StringValue": "test"},
            },
            "d21ae90c49061e927f57df5f5d72be1f",
        ),
    ]
    for attributes, digest in vectors:
        sent = await call(producer.send_message, QueueUrl=url, MessageBody="v", MessageAttributes=attributes)
        assert sent["MD5OfMessageAttributes"] == digest
        assert sent["MD5OfMessageBody"] == md5("v")
    rich = {
        "City": {"DataType": "String", "StringValue": "Any City ✓"},
        "Greeting": {"DataType": "Binary", "BinaryValue": b"\x00Hello, World!\xff"},
        "Population": {"DataType": "Number", "StringValue": "1250800"},
        "trace.id": {"DataType": "String.uuid", "StringValue": "3f1c"},
    }
    body = '{"auction": "A", "bid": 12.5, "note": "ünïcode"}'
    sent = await call(
        producer.send_message,
        QueueUrl=url,
        MessageBody=body,
        MessageAttributes=rich,
        MessageSystemAttributes={
            "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3f"}
        },
    )
    assert sent["MD5OfMessageBody"] == md5(body)
    assert sent["MD5OfMessageAttributes"] == expected_md5_of_attributes(rich)
    assert sent["MD5OfMessageSystemAttributes"] == expected_md5_of_attributes(
        {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3f"}}
    )
    await until(lambda: _visible(admin, url, 3), what="three visible messages")
    messages = []
    while len(messages) < 3:
        result = await call(
            worker.receive_message,
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            AttributeNames=["AWSTraceHeader"],
        )
        messages += result.get("Messages", [])
    (message,) = [m for m in messages if m["Body"] == body]
    assert message["MD5OfBody"] == md5(body)
    assert message["MessageAttributes"] == rich  # binary comes back as bytes (botocore decodes base64)
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["AWSTraceHeader"] == "Root=1-5759e988-bd862e3f"
    await call(
        worker.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle=message["ReceiptHandle"],
        VisibilityTimeout=0,
    )
    # A selection by name and prefix: the MD5 covers exactly the attributes returned.
    result = await call(
        worker.receive_message,
        QueueUrl=url,
        MessageAttributeNames=["City", "trace.*"],
        MaxNumberOfMessages=10,
    )
    (again,) = [m for m in result["Messages"] if m["Body"] == body]
    subset = {k: rich[k] for k in ("City", "trace.id")}
    assert again["MessageAttributes"] == subset
    assert again["MD5OfMessageAttributes"] == expected_md5_of_attributes(subset)


async def _visible(sqs: Any, url: str, count: int) -> bool:
    attributes = await call(
        sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"]) == count


async def test_an_emodb_json_message_reads_as_its_json_text(gateway: Gateway) -> None:
    from queue_core.machine import SendRequest

    admin, worker = sqs_client(gateway), sqs_client(gateway, "worker-1")
    url = (await call(admin.create_queue, QueueName="mixed"))["QueueUrl"]
    payload = b'{"order": 7, "items": ["a", "b"]}'
    await gateway.service.send("t1.mixed", [SendRequest(payload, content_type="application/json")])
    (message,) = (await call(worker.receive_message, QueueUrl=url))["Messages"]
    assert message["Body"] == payload.decode() and message["MD5OfBody"] == hashlib.md5(payload).hexdigest()
    assert "MessageAttributes" not in message


# ---------------------------------------------------------------------------------- long polling
async def test_long_poll_returns_within_half_a_second_of_a_send(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = await fifo_queue(admin, "poll.fifo", ReceiveMessageWaitTimeSeconds="10")
    await call(worker.get_queue_url, QueueName="poll.fifo")  # warm the worker's TLS connection
    started = time.monotonic()
    poll = asyncio.create_task(call(worker.receive_message, QueueUrl=url))  # waits by the queue's default
    await until(lambda: _waiting(gateway, "t1.poll.fifo"), what="the long poll to wait")
    assert not poll.done()
    sending = time.monotonic()
    await call(
        producer.send_message, QueueUrl=url, MessageBody="now", MessageGroupId="g", MessageDeduplicationId="1"
    )
    result = await asyncio.wait_for(poll, 5)
    answered = time.monotonic()
    assert [m["Body"] for m in result["Messages"]] == ["now"]
    assert answered - sending < 0.5, f"long poll answered {answered - sending:.3f}s after the send"
    assert sending - started < 5
    # An empty long poll ends at its wait time.
    started = time.monotonic()
    assert "Messages" not in await call(worker.receive_message, QueueUrl=url, WaitTimeSeconds=1)
    assert 0.9 < time.monotonic() - started < 3


async def _waiting(gw: Gateway, internal: str) -> bool:
    return gw.service.has_waiters(internal)


# --------------------------------------------------------------------------- receive attempt retries
async def test_receive_request_attempt_id_retry_returns_the_same_messages(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = await fifo_queue(admin, "attempts.fifo", ContentBasedDeduplication="true")
    for body in ("m1", "m2", "m3"):
        await call(producer.send_message, QueueUrl=url, MessageBody=body, MessageGroupId="g")
    first = await call(
        worker.receive_message, QueueUrl=url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1"
    )
    retry = await call(
        worker.receive_message, QueueUrl=url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1"
    )
    assert [m["Body"] for m in first["Messages"]] == ["m1", "m2"]
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in retry["Messages"]] == [
        (m["MessageId"], m["ReceiptHandle"]) for m in first["Messages"]
    ]
    # Another attempt id is a new receive: group g is in flight, so nothing.
    assert "Messages" not in await call(worker.receive_message, QueueUrl=url, ReceiveRequestAttemptId="try-2")
    # Once the messages are deleted the attempt id no longer replays them.
    await delete_all(worker, url, [m["ReceiptHandle"] for m in first["Messages"]])
    after = await call(
        worker.receive_message, QueueUrl=url, MaxNumberOfMessages=2, ReceiveRequestAttemptId="try-1"
    )
    assert [m["Body"] for m in after["Messages"]] == ["m3"]


# ------------------------------------------------------------------------------- DLQ and redrive
async def test_dead_letter_queue_and_redrive_restore_group_order(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    dlq_url = await fifo_queue(admin, "orders-dlq.fifo")
    dlq_arn = (await call(admin.get_queue_attributes, QueueUrl=dlq_url, AttributeNames=["QueueArn"]))[
        "Attributes"
    ]["QueueArn"]
    assert dlq_arn == f"arn:aws:sqs:{REGION}:t1:orders-dlq.fifo"
    policy = f'{{"deadLetterTargetArn": "{dlq_arn}", "maxReceiveCount": "1"}}'
    url = await fifo_queue(admin, "orders.fifo", RedrivePolicy=policy)
    source_arn = f"arn:aws:sqs:{REGION}:t1:orders.fifo"
    described = await call(admin.get_queue_attributes, QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert described["Attributes"]["RedrivePolicy"] == (
        f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":1}}'
    )
    sources = await call(admin.list_dead_letter_source_queues, QueueUrl=dlq_url)
    assert sources["queueUrls"] == [url]

    order = ["g1", "g2", "g3", "h1", "h2"]
    for body in ("g1", "h1", "g2", "h2", "g3"):
        await call(
            producer.send_message,
            QueueUrl=url,
            MessageBody=body,
            MessageGroupId=body[0],
            MessageDeduplicationId=body,
        )
    # Received once and let go at once (visibility 0): at maxReceiveCount 1 every message is dead-lettered.
    got, _ = await bodies_of(worker, url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert got == order
    await until(lambda: _visible(admin, dlq_url, 5), what="five dead-lettered messages")
    dead = (
        await call(
            worker.receive_message,
            QueueUrl=dlq_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=0,
            MessageSystemAttributeNames=["DeadLetterQueueSourceArn", "MessageGroupId"],
        )
    )["Messages"]
    assert [m["Body"] for m in dead] == order
    assert {m["Attributes"]["DeadLetterQueueSourceArn"] for m in dead} == {source_arn}

    handle = (await call(admin.start_message_move_task, SourceArn=dlq_arn))["TaskHandle"]

    async def completed() -> bool:
        tasks = (await call(admin.list_message_move_tasks, SourceArn=dlq_arn))["Results"]
        return tasks[0]["Status"] == "COMPLETED"

    await until(completed, what="the move task to complete")
    (task,) = (await call(admin.list_message_move_tasks, SourceArn=dlq_arn, MaxResults=10))["Results"]
    assert task["ApproximateNumberOfMessagesMoved"] == 5 and task["DestinationArn"] == source_arn
    with pytest.raises(admin.exceptions.ResourceNotFoundException, match="RUNNING"):
        await call(admin.cancel_message_move_task, TaskHandle=handle)  # a completed task
    got, receipts = await bodies_of(worker, url, MaxNumberOfMessages=10)
    assert got == order  # back in the source in their original group order
    await delete_all(worker, url, receipts)
    assert await _visible(admin, dlq_url, 0)


async def test_cancel_message_move_task_stops_a_running_redrive(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    dlq_url = await fifo_queue(admin, "jobs-dlq.fifo")
    dlq_arn = f"arn:aws:sqs:{REGION}:t1:jobs-dlq.fifo"
    policy = f'{{"deadLetterTargetArn": "{dlq_arn}", "maxReceiveCount": "1"}}'
    url = await fifo_queue(admin, "jobs.fifo", RedrivePolicy=policy)
    for body in ("a1", "b1", "a2"):
        await call(
            producer.send_message,
            QueueUrl=url,
            MessageBody=body,
            MessageGroupId=body[0],
            MessageDeduplicationId=body,
        )
    await bodies_of(worker, url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    await until(lambda: _visible(admin, dlq_url, 3), what="three dead-lettered messages")
    # Group a is in flight in the DLQ: the redrive moves b1 and then waits for group a's claim to end.
    held = await call(worker.receive_message, QueueUrl=dlq_url, MaxNumberOfMessages=1, VisibilityTimeout=60)
    assert [m["Body"] for m in held["Messages"]] == ["a1"]
    handle = (await call(admin.start_message_move_task, SourceArn=dlq_arn))["TaskHandle"]

    async def moved_one() -> bool:
        (task,) = (await call(admin.list_message_move_tasks, SourceArn=dlq_arn))["Results"]
        return task["Status"] == "RUNNING" and task["ApproximateNumberOfMessagesMoved"] == 1

    await until(moved_one, what="the redrive to move b1 and wait for group a")
    cancelled = await call(admin.cancel_message_move_task, TaskHandle=handle)
    assert cancelled["ApproximateNumberOfMessagesMoved"] == 1
    (task,) = (await call(admin.list_message_move_tasks, SourceArn=dlq_arn))["Results"]
    assert task["Status"] == "CANCELLED" and "TaskHandle" not in task
    await delete_all(worker, dlq_url, [held["Messages"][0]["ReceiptHandle"]])
    got, _ = await bodies_of(worker, dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert got == ["a2"]  # not moved after the cancel
    got, _ = await bodies_of(worker, url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert got == ["b1"]  # moved before it
    with pytest.raises(admin.exceptions.ResourceNotFoundException):
        await call(admin.cancel_message_move_task, TaskHandle=handle)


# ---------------------------------------------------------------------------- fencing and visibility
async def test_a_superseded_receipt_is_refused_and_visibility_zero_redelivers(gateway: Gateway) -> None:
    admin, producer = sqs_client(gateway), sqs_client(gateway, "producer-1")
    one, two = sqs_client(gateway, "worker-1"), sqs_client(gateway, "worker-2")
    url = await fifo_queue(admin, "fenced.fifo")
    await call(
        producer.send_message, QueueUrl=url, MessageBody="job", MessageGroupId="g", MessageDeduplicationId="1"
    )
    (_, [old]) = await bodies_of(one, url, VisibilityTimeout=60)
    assert (await bodies_of(two, url))[0] == []  # in flight
    await call(one.change_message_visibility, QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=0)
    (body, [new]) = await bodies_of(two, url, VisibilityTimeout=60)
    assert body == ["job"] and new != old
    with pytest.raises(one.exceptions.ReceiptHandleIsInvalid, match="superseded"):
        await call(one.delete_message, QueueUrl=url, ReceiptHandle=old)
    with pytest.raises(one.exceptions.ReceiptHandleIsInvalid):
        await call(one.change_message_visibility, QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=30)
    await call(two.delete_message, QueueUrl=url, ReceiptHandle=new)
    await call(two.delete_message, QueueUrl=url, ReceiptHandle=new)  # already deleted: silent, as in SQS
    assert (await bodies_of(one, url))[0] == []


# ------------------------------------------------------------------------------------------ batches
async def test_batches_answer_per_entry(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = await fifo_queue(admin, "batch.fifo")
    sent = await call(
        producer.send_message_batch,
        QueueUrl=url,
        Entries=[
            {"Id": "ok-1", "MessageBody": "one", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
            {
                "Id": "bad-chars",
                "MessageBody": "bad \x00",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "d3",
            },
            {
                "Id": "delayed",
                "MessageBody": "x",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "d4",
                "DelaySeconds": 5,
            },
            {
                "Id": "ok-2",
                "MessageBody": "three",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "d5",
                "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
            },
        ],
    )
    assert [(s["Id"], s["MD5OfMessageBody"]) for s in sent["Successful"]] == [
        ("ok-1", md5("one")),
        ("ok-2", md5("three")),
    ]
    assert sent["Successful"][1]["MD5OfMessageAttributes"] == expected_md5_of_attributes(
        {"k": {"DataType": "String", "StringValue": "v"}}
    )
    assert int(sent["Successful"][0]["SequenceNumber"]) < int(sent["Successful"][1]["SequenceNumber"])
    failed = {f["Id"]: f for f in sent["Failed"]}
    assert failed["bad-chars"]["Code"] == "InvalidMessageContents"
    assert failed["delayed"]["Code"] == "InvalidParameterValue"

    _, receipts = await bodies_of(worker, url, MaxNumberOfMessages=10)
    changed = await call(
        worker.change_message_visibility_batch,
        QueueUrl=url,
        Entries=[
            {"Id": "a", "ReceiptHandle": receipts[0], "VisibilityTimeout": 120},
            {"Id": "b", "ReceiptHandle": receipts[1], "VisibilityTimeout": 60},
            {"Id": "c", "ReceiptHandle": "not-a-receipt", "VisibilityTimeout": 60},
        ],
    )
    assert sorted(s["Id"] for s in changed["Successful"]) == ["a", "b"]
    assert [(f["Id"], f["Code"]) for f in changed["Failed"]] == [("c", "ReceiptHandleIsInvalid")]
    deleted = await call(
        worker.delete_message_batch,
        QueueUrl=url,
        Entries=[
            {"Id": "a", "ReceiptHandle": receipts[0]},
            {"Id": "b", "ReceiptHandle": receipts[1]},
            {"Id": "c", "ReceiptHandle": "zz.garbage"},
        ],
    )
    assert sorted(s["Id"] for s in deleted["Successful"]) == ["a", "b"]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("c", "ReceiptHandleIsInvalid")]
    # Changing the visibility of a deleted message fails per entry, as SQS does.
    gone = await call(
        worker.change_message_visibility_batch,
        QueueUrl=url,
        Entries=[{"Id": "a", "ReceiptHandle": receipts[0], "VisibilityTimeout": 5}],
    )
    assert [(f["Id"], f["Code"]) for f in gone["Failed"]] == [("a", "InvalidParameterValue")]


# ----------------------------------------------------------------------------------- standard queues
async def test_standard_queue_basics(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = (await call(admin.create_queue, QueueName="plain", Attributes={"VisibilityTimeout": "45"}))[
        "QueueUrl"
    ]
    assert url == f"{gateway.url}/t1/plain"
    sent = await call(producer.send_message, QueueUrl=url, MessageBody="a")
    assert "SequenceNumber" not in sent
    await call(producer.send_message, QueueUrl=url, MessageBody="b", MessageGroupId="tenant-7")  # fair queues
    await call(producer.send_message, QueueUrl=url, MessageBody="later", DelaySeconds=60)
    attributes = (await call(admin.get_queue_attributes, QueueUrl=url, AttributeNames=["All"]))["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "2"
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"
    assert attributes["VisibilityTimeout"] == "45" and "FifoQueue" not in attributes
    assert attributes["QueueArn"] == f"arn:aws:sqs:{REGION}:t1:plain"
    result = await call(worker.receive_message, QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
    messages = {m["Body"]: m for m in result["Messages"]}
    assert set(messages) == {"a", "b"}  # no group per message: both at once; the delayed one waits
    assert messages["b"]["Attributes"]["MessageGroupId"] == "tenant-7"
    assert (
        "MessageGroupId" not in messages["a"]["Attributes"]
        and "SequenceNumber" not in messages["a"]["Attributes"]
    )
    attributes = (await call(admin.get_queue_attributes, QueueUrl=url, AttributeNames=["All"]))["Attributes"]
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "2"
    # ChangeMessageVisibility(0): receivable again at once, with a new receipt.
    receipt = messages["a"]["ReceiptHandle"]
    await call(worker.change_message_visibility, QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)
    again = (await call(worker.receive_message, QueueUrl=url, AttributeNames=["ApproximateReceiveCount"]))[
        "Messages"
    ]
    assert [m["Body"] for m in again] == ["a"] and again[0]["ReceiptHandle"] != receipt
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    # Let go (visibility 0), a message is no longer in flight: extending it now is refused.
    receipt = messages["b"]["ReceiptHandle"]
    await call(worker.change_message_visibility, QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)
    with pytest.raises(worker.exceptions.MessageNotInflight):
        await call(
            worker.change_message_visibility, QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=30
        )


async def test_queue_management(gateway: Gateway) -> None:
    admin = sqs_client(gateway)
    url = await fifo_queue(
        admin,
        "jobs.fifo",
        VisibilityTimeout="10",
        DeduplicationScope="messageGroup",
        FifoThroughputLimit="perMessageGroupId",
    )
    assert await fifo_queue(admin, "jobs.fifo", VisibilityTimeout="10") == url  # same attributes: same queue
    with pytest.raises(admin.exceptions.QueueNameExists):
        await fifo_queue(admin, "jobs.fifo", VisibilityTimeout="11")
    assert (await call(admin.get_queue_url, QueueName="jobs.fifo"))["QueueUrl"] == url
    for name in ("a-1", "a-2", "b-1"):
        await call(admin.create_queue, QueueName=name, tags={"team": name})
    listed = await call(admin.list_queues, QueueNamePrefix="a-")
    assert listed["QueueUrls"] == [f"{gateway.url}/t1/a-1", f"{gateway.url}/t1/a-2"]
    page = await call(admin.list_queues, MaxResults=2)
    assert len(page["QueueUrls"]) == 2 and page["NextToken"]
    rest = await call(admin.list_queues, MaxResults=2, NextToken=page["NextToken"])
    assert len(rest["QueueUrls"]) == 2 and "NextToken" not in rest

    await call(
        admin.set_queue_attributes,
        QueueUrl=url,
        Attributes={
            "VisibilityTimeout": "20",
            "ReceiveMessageWaitTimeSeconds": "3",
            "MessageRetentionPeriod": "3600",
            "DelaySeconds": "2",
            "MaximumMessageSize": "2048",
            "ContentBasedDeduplication": "true",
        },
    )
    attributes = (await call(admin.get_queue_attributes, QueueUrl=url, AttributeNames=["All"]))["Attributes"]
    assert {
        k: attributes[k]
        for k in (
            "VisibilityTimeout",
            "ReceiveMessageWaitTimeSeconds",
            "MessageRetentionPeriod",
            "DelaySeconds",
            "MaximumMessageSize",
            "ContentBasedDeduplication",
            "FifoQueue",
            "DeduplicationScope",
            "FifoThroughputLimit",
        )
    } == {
        "VisibilityTimeout": "20",
        "ReceiveMessageWaitTimeSeconds": "3",
        "MessageRetentionPeriod": "3600",
        "DelaySeconds": "2",
        "MaximumMessageSize": "2048",
        "ContentBasedDeduplication": "true",
        "FifoQueue": "true",
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
    }
    assert int(attributes["LastModifiedTimestamp"]) >= int(attributes["CreatedTimestamp"])
    internal = await gateway.service.attributes("t1.jobs.fifo")
    assert (internal.visibility_timeout, internal.dedup_scope, internal.content_based_dedup) == (
        20.0,
        "group",
        True,
    )
    some = await call(admin.get_queue_attributes, QueueUrl=url, AttributeNames=["DelaySeconds", "QueueArn"])
    assert set(some["Attributes"]) == {"DelaySeconds", "QueueArn"}

    tagged = f"{gateway.url}/t1/a-1"
    await call(admin.tag_queue, QueueUrl=tagged, Tags={"env": "test", "team": "x"})
    await call(admin.untag_queue, QueueUrl=tagged, TagKeys=["env"])
    assert (await call(admin.list_queue_tags, QueueUrl=tagged))["Tags"] == {"team": "x"}
    assert (await gateway.service.attributes("t1.a-1")).labels["tag:team"] == "x"

    await call(admin.send_message, QueueUrl=tagged, MessageBody="x")
    await call(admin.purge_queue, QueueUrl=tagged)
    assert await _visible(admin, tagged, 0)
    with pytest.raises(admin.exceptions.PurgeQueueInProgress):
        await call(admin.purge_queue, QueueUrl=tagged)
    await call(admin.delete_queue, QueueUrl=tagged)
    with pytest.raises(admin.exceptions.QueueDoesNotExist):
        await call(admin.get_queue_url, QueueName="a-1")
