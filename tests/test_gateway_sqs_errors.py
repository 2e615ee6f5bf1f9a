"""SQS errors exactly as botocore understands them, SigV4 verification, roles and tenant isolation.

Modeled errors are checked by botocore's exception class (`client.exceptions.X`), the others by the
ClientError code botocore reads from `x-amzn-query-error`. Requests boto3 would refuse to build
(malformed JSON, unknown actions, unsigned or skewed requests) are signed with botocore and sent raw.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import ssl
import urllib.error
import urllib.request
from typing import Any
from unittest import mock

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from gateway_support import Gateway
from test_gateway_sqs import REGION, call, fifo_queue, sqs_client

JSON = "application/x-amz-json-1.0"


def raw(
    gw: Gateway,
    action: str,
    body: bytes,
    *,
    key_id: str = "admin-1",
    sign: bool = True,
    service: str = "sqs",
    send_body: bytes | None = None,
    skew: datetime.timedelta | None = None,
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One POST / signed with botocore's SigV4 (or not), sent with urllib over the gateway's TLS."""
    credential = gw.credential(key_id)
    headers = {"Content-Type": JSON, "X-Amz-Target": f"AmazonSQS.{action}"}
    request = AWSRequest(method="POST", url=f"{gw.url}/", data=body, headers=headers)
    if sign:
        signer = SigV4Auth(Credentials(credential.id, credential.secret), service, REGION)
        if skew is None:
            signer.add_auth(request)
        else:
            then = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + skew
            with mock.patch("botocore.auth.get_current_datetime", return_value=then):
                signer.add_auth(request)
    prepared = request.prepare()
    outgoing = urllib.request.Request(
        prepared.url,
        data=body if send_body is None else send_body,
        headers=dict(prepared.headers),
        method="POST",
    )
    context = ssl.create_default_context(cafile=str(gw.ca_file))
    try:
        with urllib.request.urlopen(outgoing, context=context, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read() or b"{}")


def code_of(error: ClientError) -> str:
    return error.response["Error"]["Code"]


async def expect(exception: type[Exception], method: Any, **kwargs: Any) -> ClientError:
    with pytest.raises(exception) as info:
        await call(method, **kwargs)
    assert isinstance(info.value, ClientError)
    return info.value


# ------------------------------------------------------------------------------------ wire format
async def test_error_wire_format_is_sqs_json(gateway: Gateway) -> None:
    status, headers, body = await asyncio.to_thread(raw, gateway, "GetQueueUrl", b'{"QueueName": "missing"}')
    assert status == 400
    assert headers["Content-Type"] == JSON
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert body == {
        "__type": "com.amazonaws.sqs#QueueDoesNotExist",
        "message": "The specified queue does not exist.",
    }
    assert headers.get("x-amzn-RequestId")
    sqs = sqs_client(gateway)
    error = await expect(sqs.exceptions.QueueDoesNotExist, sqs.get_queue_url, QueueName="missing")
    assert code_of(error) == "AWS.SimpleQueueService.NonExistentQueue"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400


async def test_malformed_json_unknown_actions_and_unsupported_ones(gateway: Gateway) -> None:
    status, headers, body = await asyncio.to_thread(raw, gateway, "ListQueues", b'{"QueueNamePrefix": ')
    assert status == 400 and headers["x-amzn-query-error"] == "SerializationException;Sender"
    assert body["__type"].endswith("#SerializationException")
    status, headers, body = await asyncio.to_thread(raw, gateway, "ListQueues", b"[1, 2]")
    assert status == 400 and body["__type"].endswith("#SerializationException")
    status, headers, body = await asyncio.to_thread(raw, gateway, "FlyToTheMoon", b"{}")
    assert status == 400 and headers["x-amzn-query-error"] == "InvalidAction;Sender"
    status, _, body = await asyncio.to_thread(raw, gateway, "ListQueues", b"{}")
    assert status == 200 and body == {}
    status, _, body = await asyncio.to_thread(raw, gateway, "SendMessage", b'{"QueueUrl": 7}')
    assert status == 400 and body["__type"] == "com.amazonaws.sqs#InvalidParameterValueException"
    # AddPermission / RemovePermission are offered (test_sqs_fidelity), no longer UnsupportedOperation.


# ------------------------------------------------------------------------------------------ SigV4
async def test_sigv4_is_verified(gateway: Gateway) -> None:
    wrong = sqs_client(gateway, "admin-1", secret="not-the-secret-0123456789")
    error = await expect(ClientError, wrong.list_queues)
    assert code_of(error) == "SignatureDoesNotMatch"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    status, headers, _ = await asyncio.to_thread(
        raw, gateway, "ListQueues", b'{"QueueNamePrefix": "a"}', send_body=b'{"QueueNamePrefix": "b"}'
    )
    assert status == 403 and headers["x-amzn-query-error"] == "SignatureDoesNotMatch;Sender"  # body tampered
    status, headers, body = await asyncio.to_thread(raw, gateway, "ListQueues", b"{}", service="sns")
    assert status == 403 and "sqs" in body["message"]
    status, headers, body = await asyncio.to_thread(
        raw, gateway, "ListQueues", b"{}", skew=datetime.timedelta(minutes=-20)
    )
    assert status == 403 and headers["x-amzn-query-error"] == "SignatureDoesNotMatch;Sender"
    assert "expired" in body["message"]
    status, _, _ = await asyncio.to_thread(
        raw, gateway, "ListQueues", b"{}", skew=datetime.timedelta(minutes=-5)
    )
    assert status == 200  # within the 15-minute window
    status, headers, _ = await asyncio.to_thread(raw, gateway, "ListQueues", b"{}", sign=False)
    assert status == 403 and headers["x-amzn-query-error"] == "MissingAuthenticationToken;Sender"

    stranger = sqs_client(gateway, "admin-1")
    stranger._request_signer._credentials = Credentials("NOBODY-KNOWN", "whatever-secret-0123456789")
    assert code_of(await expect(ClientError, stranger.list_queues)) == "InvalidClientTokenId"


async def test_any_region_signs_and_names_the_arn(gateway: Gateway) -> None:
    sqs = sqs_client(gateway, region="eu-west-3")
    url = (await call(sqs.create_queue, QueueName="paris"))["QueueUrl"]
    arn = (await call(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn"]))["Attributes"]
    assert arn["QueueArn"] == "arn:aws:sqs:eu-west-3:t1:paris"


async def test_a_body_over_the_edge_cap_is_an_sqs_error(gateway: Gateway) -> None:
    admin, producer = sqs_client(gateway), sqs_client(gateway, "producer-1")
    url = (await call(admin.create_queue, QueueName="big"))["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": "x" * 500_000} for i in range(10)]  # ~5 MB > the 4 MiB cap
    await expect(
        producer.exceptions.BatchRequestTooLong, producer.send_message_batch, QueueUrl=url, Entries=entries
    )
    error = await expect(ClientError, producer.send_message, QueueUrl=url, MessageBody="y" * 4_300_000)
    assert code_of(error) == "InvalidParameterValue"
    # The connection and the gateway are fine afterwards.
    assert (await call(producer.send_message, QueueUrl=url, MessageBody="small"))["MessageId"]


# ------------------------------------------------------------------------------------ the catalogue
async def test_every_error_is_the_one_sqs_returns(gateway: Gateway) -> None:
    sqs, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    fifo = await fifo_queue(sqs, "errors.fifo")
    plain = (await call(sqs.create_queue, QueueName="plain", Attributes={"MaximumMessageSize": "2048"}))[
        "QueueUrl"
    ]
    missing = f"{gateway.url}/t1/missing"
    ex = sqs.exceptions

    async def code(method: Any, **kwargs: Any) -> str:
        return code_of(await expect(ClientError, method, **kwargs))

    # queues
    await expect(ex.QueueDoesNotExist, producer.send_message, QueueUrl=missing, MessageBody="x")
    await expect(ex.QueueDoesNotExist, worker.receive_message, QueueUrl=missing)
    await expect(ex.QueueDoesNotExist, sqs.delete_queue, QueueUrl=missing)
    await expect(ex.QueueDoesNotExist, sqs.get_queue_attributes, QueueUrl="not-a-url")  # a bare name, as SQS
    await expect(ex.QueueNameExists, sqs.create_queue, QueueName="plain", Attributes={"DelaySeconds": "5"})
    assert await code(sqs.create_queue, QueueName="x.fifo") == "InvalidParameterValue"  # no FifoQueue=true
    assert await code(sqs.create_queue, QueueName="bad name") == "InvalidParameterValue"
    assert (
        await code(sqs.create_queue, QueueName="y", Attributes={"FifoQueue": "true"})
        == "InvalidParameterValue"
    )
    await expect(
        ex.InvalidAttributeName,
        sqs.create_queue,
        QueueName="z",
        Attributes={"ContentBasedDeduplication": "true"},
    )
    await expect(ex.InvalidAttributeName, sqs.create_queue, QueueName="z", Attributes={"Colour": "blue"})
    await expect(
        ex.InvalidAttributeValue, sqs.create_queue, QueueName="z", Attributes={"VisibilityTimeout": "99999"}
    )
    await expect(ex.InvalidAttributeName, sqs.get_queue_attributes, QueueUrl=plain, AttributeNames=["Bogus"])
    await expect(
        ex.InvalidAttributeName, sqs.set_queue_attributes, QueueUrl=fifo, Attributes={"FifoQueue": "false"}
    )
    await expect(
        ex.InvalidAttributeValue, sqs.set_queue_attributes, QueueUrl=plain, Attributes={"DelaySeconds": "-1"}
    )
    plain_arn = f"arn:aws:sqs:{REGION}:t1:plain"
    redrive = json.dumps({"deadLetterTargetArn": plain_arn, "maxReceiveCount": 3})
    await expect(
        ex.InvalidAttributeValue,
        sqs.set_queue_attributes,
        QueueUrl=fifo,
        Attributes={"RedrivePolicy": redrive},
    )
    nowhere = json.dumps(
        {"deadLetterTargetArn": f"arn:aws:sqs:{REGION}:t1:nowhere.fifo", "maxReceiveCount": 3}
    )
    await expect(
        ex.InvalidAttributeValue,
        sqs.set_queue_attributes,
        QueueUrl=fifo,
        Attributes={"RedrivePolicy": nowhere},
    )
    # moves
    await expect(
        ex.ResourceNotFoundException, sqs.start_message_move_task, SourceArn=f"arn:aws:sqs:{REGION}:t1:none"
    )
    assert (
        await code(sqs.start_message_move_task, SourceArn=plain_arn) == "InvalidParameterValue"
    )  # not a DLQ
    await expect(
        ex.ResourceNotFoundException, sqs.list_message_move_tasks, SourceArn=f"arn:aws:sqs:{REGION}:t2:plain"
    )
    await expect(ex.ResourceNotFoundException, sqs.cancel_message_move_task, TaskHandle="garbage")
    # sends
    assert await code(producer.send_message, QueueUrl=fifo, MessageBody="x", MessageDeduplicationId="1") == (
        "MissingParameter"
    )
    assert await code(producer.send_message, QueueUrl=fifo, MessageBody="x", MessageGroupId="g") == (
        "InvalidParameterValue"  # no MessageDeduplicationId and no ContentBasedDeduplication
    )
    assert (
        await code(
            producer.send_message,
            QueueUrl=fifo,
            MessageBody="x",
            MessageGroupId="g",
            MessageDeduplicationId="1",
            DelaySeconds=3,
        )
        == "InvalidParameterValue"
    )
    assert await code(producer.send_message, QueueUrl=plain, MessageBody="x", MessageDeduplicationId="1") == (
        "InvalidParameterValue"
    )
    assert (
        await code(producer.send_message, QueueUrl=plain, MessageBody="x" * 3000) == "InvalidParameterValue"
    )
    assert (
        await code(producer.send_message, QueueUrl=plain, MessageBody="x", DelaySeconds=901)
        == "InvalidParameterValue"
    )
    await expect(ex.InvalidMessageContents, producer.send_message, QueueUrl=plain, MessageBody="bell \x07")
    eleven = {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}
    assert await code(producer.send_message, QueueUrl=plain, MessageBody="x", MessageAttributes=eleven) == (
        "InvalidParameterValue"
    )
    reserved = {"AWS.thing": {"DataType": "String", "StringValue": "v"}}
    assert await code(producer.send_message, QueueUrl=plain, MessageBody="x", MessageAttributes=reserved) == (
        "InvalidParameterValue"
    )
    not_a_number = {"n": {"DataType": "Number", "StringValue": "twelve"}}
    assert await code(
        producer.send_message, QueueUrl=plain, MessageBody="x", MessageAttributes=not_a_number
    ) == ("InvalidParameterValue")
    # batches
    one = {"Id": "a", "MessageBody": "x"}
    await expect(ex.EmptyBatchRequest, producer.send_message_batch, QueueUrl=plain, Entries=[])
    await expect(
        ex.TooManyEntriesInBatchRequest,
        producer.send_message_batch,
        QueueUrl=plain,
        Entries=[{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)],
    )
    await expect(ex.BatchEntryIdsNotDistinct, producer.send_message_batch, QueueUrl=plain, Entries=[one, one])
    await expect(
        ex.InvalidBatchEntryId,
        producer.send_message_batch,
        QueueUrl=plain,
        Entries=[{"Id": "no way!", "MessageBody": "x"}],
    )
    big = (await call(sqs.create_queue, QueueName="big"))["QueueUrl"]
    await expect(
        ex.BatchRequestTooLong,
        producer.send_message_batch,
        QueueUrl=big,
        Entries=[{"Id": f"e{i}", "MessageBody": "x" * 200_000} for i in range(6)],  # 1.2 MB > 1 MiB
    )
    await expect(
        ex.BatchEntryIdsNotDistinct,
        worker.delete_message_batch,
        QueueUrl=plain,
        Entries=[{"Id": "a", "ReceiptHandle": "1.a"}, {"Id": "a", "ReceiptHandle": "1.b"}],
    )
    await expect(ex.EmptyBatchRequest, worker.change_message_visibility_batch, QueueUrl=plain, Entries=[])
    # receives and receipts
    assert (
        await code(worker.receive_message, QueueUrl=plain, MaxNumberOfMessages=11) == "InvalidParameterValue"
    )
    assert await code(worker.receive_message, QueueUrl=plain, WaitTimeSeconds=21) == "InvalidParameterValue"
    assert (
        await code(worker.receive_message, QueueUrl=plain, VisibilityTimeout=43201) == "InvalidParameterValue"
    )
    await expect(ex.ReceiptHandleIsInvalid, worker.delete_message, QueueUrl=plain, ReceiptHandle="garbage")
    await expect(
        ex.ReceiptHandleIsInvalid,
        worker.change_message_visibility,
        QueueUrl=plain,
        ReceiptHandle="x.y.z",
        VisibilityTimeout=5,
    )
    error = await expect(
        ex.ReceiptHandleIsInvalid, worker.delete_message, QueueUrl=plain, ReceiptHandle="nothex"
    )
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 404  # as SQS's model says
    # a handle the face never issued (handles are authenticated: tests/test_security_claims.py)
    await expect(
        ex.ReceiptHandleIsInvalid, worker.delete_message, QueueUrl=plain, ReceiptHandle="1ff.00000000deadbeef"
    )
    # a receipt for a message that is not there: deleting succeeds silently, changing visibility does not
    await call(producer.send_message, QueueUrl=plain, MessageBody="gone soon")
    (gone,) = (await call(worker.receive_message, QueueUrl=plain))["Messages"]
    await call(worker.delete_message, QueueUrl=plain, ReceiptHandle=gone["ReceiptHandle"])
    await call(worker.delete_message, QueueUrl=plain, ReceiptHandle=gone["ReceiptHandle"])
    assert (
        await code(
            worker.change_message_visibility,
            QueueUrl=plain,
            ReceiptHandle=gone["ReceiptHandle"],
            VisibilityTimeout=5,
        )
        == "InvalidParameterValue"
    )
    # tags
    assert await code(sqs.untag_queue, QueueUrl=plain, TagKeys=[]) == "InvalidParameterValue"  # as SQS
    too_many = {f"k{i}": "v" for i in range(51)}
    assert await code(sqs.tag_queue, QueueUrl=plain, Tags=too_many) == "InvalidParameterValue"


# ------------------------------------------------------------------------------------ roles, tenants
async def test_roles_limit_what_a_credential_may_do(gateway: Gateway) -> None:
    admin, producer, worker = (sqs_client(gateway, k) for k in ("admin-1", "producer-1", "worker-1"))
    url = (await call(admin.create_queue, QueueName="roles"))["QueueUrl"]
    assert (await call(producer.get_queue_url, QueueName="roles"))["QueueUrl"] == url  # reading is fine
    await call(producer.send_message, QueueUrl=url, MessageBody="x")
    denied = [
        (producer.receive_message, {"QueueUrl": url}),
        (producer.delete_message, {"QueueUrl": url, "ReceiptHandle": "1.a"}),
        (
            producer.change_message_visibility,
            {"QueueUrl": url, "ReceiptHandle": "1.a", "VisibilityTimeout": 1},
        ),
        (worker.send_message, {"QueueUrl": url, "MessageBody": "x"}),
        (worker.create_queue, {"QueueName": "mine"}),
        (producer.purge_queue, {"QueueUrl": url}),
        (worker.delete_queue, {"QueueUrl": url}),
        (producer.set_queue_attributes, {"QueueUrl": url, "Attributes": {"DelaySeconds": "1"}}),
        (worker.tag_queue, {"QueueUrl": url, "Tags": {"a": "b"}}),
    ]
    for method, kwargs in denied:
        error = await expect(ClientError, method, **kwargs)
        assert code_of(error) == "AccessDenied", (method, error)
        assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    (message,) = (await call(worker.receive_message, QueueUrl=url))["Messages"]
    await call(worker.delete_message, QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert gateway.service.core.queue("t1.roles").groups == {}


async def test_tenants_never_see_each_others_queues(gateway: Gateway) -> None:
    t1, t2 = sqs_client(gateway, "admin-1"), sqs_client(gateway, "other-1")
    url = (await call(t1.create_queue, QueueName="secret"))["QueueUrl"]
    await call(t1.send_message, QueueUrl=url, MessageBody="for t1 only")
    ex = t2.exceptions
    await expect(ex.QueueDoesNotExist, t2.get_queue_url, QueueName="secret")
    await expect(ex.QueueDoesNotExist, t2.get_queue_url, QueueName="secret", QueueOwnerAWSAccountId="t1")
    await expect(ex.QueueDoesNotExist, t2.receive_message, QueueUrl=url)
    await expect(ex.QueueDoesNotExist, t2.send_message, QueueUrl=url, MessageBody="x")
    await expect(ex.QueueDoesNotExist, t2.purge_queue, QueueUrl=url)
    assert "QueueUrls" not in await call(t2.list_queues)
    # t2's own queue of the same name is another queue.
    own = (await call(t2.create_queue, QueueName="secret"))["QueueUrl"]
    assert own == f"{gateway.url}/t2/secret"
    assert "Messages" not in await call(t2.receive_message, QueueUrl=own)
    assert (await call(t1.list_queues))["QueueUrls"] == [url]
    # A credential limited to a prefix sees only those queues of its tenant.
    limited = sqs_client(gateway, "limited-1")
    orders = (await call(limited.create_queue, QueueName="orders-eu"))["QueueUrl"]
    assert (await call(limited.list_queues))["QueueUrls"] == [orders]
    await expect(ex.QueueDoesNotExist, limited.get_queue_url, QueueName="secret")
    assert code_of(await expect(ClientError, limited.create_queue, QueueName="misc")) == "AccessDenied"
