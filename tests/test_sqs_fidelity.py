"""SQS fidelity, measured by moto's own test suite (issue 14): each strictq finding of a run of moto's
`tests/test_sqs` against `strictq serve`, reproduced with unchanged boto3 through the real in-process
gateway over TLS. The expected answers are SQS's: its API reference, its JSON-protocol guide, and the
texts moto's tests assert where they are AWS's (AWS-validated tests of other SQS emulators where moto's
tests are silent). Where moto's expectation is moto's own (the query-era "... for this wsdl version."
text), the test follows AWS's JSON protocol and says so.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from gateway_support import Gateway, serve_gateway
from kit.process import strictq
from serve_support import start_serve, stop
from test_gateway_sqs import NO_RETRIES, REGION, call, expected_md5_of_attributes, fifo_queue, sqs_client

from gateway.sqs_regions import parse_regions


async def expect_error(method: Any, **kwargs: Any) -> dict[str, Any]:
    """The ClientError a call raises, as (code, message, HTTP status)."""
    with pytest.raises(ClientError) as caught:
        await call(method, **kwargs)
    response = caught.value.response
    return {
        "code": response["Error"]["Code"],
        "message": response["Error"]["Message"],
        "status": response["ResponseMetadata"]["HTTPStatusCode"],
    }


def resource(gw: Gateway, key_id: str = "admin-1", region: str = REGION) -> Any:
    credential = gw.credential(key_id)
    return boto3.resource(
        "sqs",
        endpoint_url=gw.url,
        region_name=region,
        aws_access_key_id=credential.id,
        aws_secret_access_key=credential.secret,
        verify=str(gw.ca_file),
        config=NO_RETRIES,
    )


# ------------------------------------------------------------------------ FIFO DelaySeconds=0
async def test_fifo_takes_delay_seconds_zero_and_refuses_any_other(gateway: Gateway) -> None:
    """moto test_fifo_send_message_batch / test_send_message_delay_seconds_validation: SQS accepts
    DelaySeconds=0 on a FIFO queue (per message and per batch entry) and refuses non-zero values."""
    sqs = sqs_client(gateway)
    url = await fifo_queue(sqs, "delays.fifo")
    error = await expect_error(
        sqs.send_message,
        QueueUrl=url,
        MessageBody="late",
        DelaySeconds=5,
        MessageGroupId="g",
        MessageDeduplicationId="d0",
    )
    assert error == {
        "code": "InvalidParameterValue",
        "message": "Value 5 for parameter DelaySeconds is invalid. Reason: The request include parameter"
        " that is not valid for this queue type.",
        "status": 400,
    }
    await call(
        sqs.send_message,
        QueueUrl=url,
        MessageBody="zero",
        DelaySeconds=0,
        MessageGroupId="g",
        MessageDeduplicationId="d1",
    )
    sent = await call(
        sqs.send_message_batch,
        QueueUrl=url,
        Entries=[
            {
                "Id": f"id_{i}",
                "MessageBody": f"body_{i}",
                "DelaySeconds": 0,
                "MessageGroupId": "g",
                "MessageDeduplicationId": f"b{i}",
            }
            for i in (1, 2)
        ],
    )
    assert sorted(s["Id"] for s in sent["Successful"]) == ["id_1", "id_2"] and not sent.get("Failed")
    received = await call(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in received["Messages"]] == ["zero", "body_1", "body_2"]  # none delayed

    # A FIFO queue may have a queue-level delay; DelaySeconds=0 per message is still accepted.
    delayed = await fifo_queue(sqs, "delayed.fifo", DelaySeconds="10")
    await call(
        sqs.send_message,
        QueueUrl=delayed,
        MessageBody="x",
        DelaySeconds=0,
        MessageGroupId="g",
        MessageDeduplicationId="d",
    )
    attributes = await call(
        sqs.get_queue_attributes, QueueUrl=delayed, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )
    assert attributes["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"  # the queue's delay applies


# ----------------------------------------------------------------------------------- QueueUrl forms
async def test_a_bare_queue_name_is_a_queue_url(gateway: Gateway) -> None:
    """moto test_receive_message_using_name_should_return_name_as_url: SQS takes the queue's name where a
    QueueUrl is expected; boto3's resource then reports the name as the message's queue_url."""
    sqs = sqs_client(gateway)
    url = (await call(sqs.create_queue, QueueName="named"))["QueueUrl"]
    assert url.endswith("/t1/named")
    queue = resource(gateway).Queue("named")
    await call(queue.send_message, MessageBody="this is a test message")
    (message,) = await call(queue.receive_messages)
    assert message.queue_url == "named" and message.body == "this is a test message"
    attributes = await call(sqs.get_queue_attributes, QueueUrl="named", AttributeNames=["QueueArn"])
    assert attributes["Attributes"]["QueueArn"] == f"arn:aws:sqs:{REGION}:t1:named"
    # The name is the credential's tenant's: another tenant's credential does not see it.
    other = sqs_client(gateway, "other-1")
    error = await expect_error(other.send_message, QueueUrl="named", MessageBody="x")
    assert error["code"] == "AWS.SimpleQueueService.NonExistentQueue"


async def test_an_url_naming_no_queue_is_nonexistent_queue_400(gateway: Gateway) -> None:
    """moto test_get_nonexistent_queue / test_get_queue_url_error_not_exists: an URL that names no queue
    of this endpoint is NonExistentQueue with HTTP 400 (not InvalidAddress 404). The text is AWS's in the
    JSON protocol ("The specified queue does not exist.", the SQS developer guide's JSON error example);
    moto asserts the query protocol's older "... for this wsdl version."."""
    sqs = sqs_client(gateway)
    await call(sqs.create_queue, QueueName="real")
    for url in (
        "http://whatever-incorrect-queue-address",
        f"{gateway.url}/t1/not-exists",
        f"{gateway.url}/t2/real",  # another account's path
        f"{gateway.url}/t1/real/extra",
        "not a queue name",
    ):
        error = await expect_error(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"])
        assert error == {
            "code": "AWS.SimpleQueueService.NonExistentQueue",
            "message": "The specified queue does not exist.",
            "status": 400,
        }, url
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):  # botocore's modeled exception
        await call(resource(gateway).Queue("http://whatever-incorrect-queue-address").load)
    error = await expect_error(sqs.get_queue_url, QueueName="not-exists")
    assert (error["code"], error["status"]) == ("AWS.SimpleQueueService.NonExistentQueue", 400)


# ------------------------------------------------------------------- MessageAttributeNames wildcards
ATTRIBUTES = {
    "Help.Me": {"DataType": "String", "StringValue": "Me"},
    "Hello": {"DataType": "String", "StringValue": "There"},
    "General": {"DataType": "String", "StringValue": "Kenobi"},
    "Custom1": {"DataType": "String", "StringValue": "one"},
    "Custom2": {"DataType": "Number", "StringValue": "2"},
}


async def test_message_attribute_names_wildcards_match_sqs(gateway: Gateway) -> None:
    """moto test_message_attributes_with_wildcards; the API reference: "return all of the attributes by
    specifying All or .* ... You can also use all message attributes starting with a prefix, for example
    bar.*". `.*` is "anything": `Hel.*` returns Hello and Help.Me, `Custom.*` returns Custom1."""
    sqs = sqs_client(gateway)
    url = (await call(sqs.create_queue, QueueName="wild", Attributes={"VisibilityTimeout": "0"}))["QueueUrl"]
    await call(sqs.send_message, QueueUrl=url, MessageBody="msg", MessageAttributes=ATTRIBUTES)

    async def selected(names: list[str]) -> dict[str, Any] | None:
        (message,) = (await call(sqs.receive_message, QueueUrl=url, MessageAttributeNames=names))["Messages"]
        attributes = message.get("MessageAttributes")
        if attributes is not None:
            assert message["MD5OfMessageAttributes"] == expected_md5_of_attributes(attributes)
        return attributes

    for everything in (["All"], [".*"], ["*"]):
        assert await selected(everything) == ATTRIBUTES, everything
    assert set(await selected(["Hel.*"]) or {}) == {"Hello", "Help.Me"}
    assert set(await selected(["Custom.*"]) or {}) == {"Custom1", "Custom2"}
    assert set(await selected(["Help.*", "General"]) or {}) == {"Help.Me", "General"}
    assert set(await selected(["Foo", "Hello"]) or {}) == {"Hello"}
    assert await selected(["Foo", "Help"]) is None  # exact names only match exactly
    assert await selected([]) is None


# ------------------------------------------------------------------- AddPermission / RemovePermission
async def test_add_and_remove_permission_edit_the_queue_policy(tmp_path: Path) -> None:
    """moto test_permissions: AddPermission adds a statement (Sid = label) to the queue's Policy, creating
    `<arn>/SQSDefaultPolicy`; RemovePermission removes it. The policy is durable (kept across a restart)
    and is bookkeeping only on a tenant-scoped endpoint (the key file decides access)."""
    name = "perm.fifo"
    arn = f"arn:aws:sqs:{REGION}:t1:{name}"
    first = {
        "Sid": "account1",
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::111111111111:root"},
        "Action": "SQS:*",
        "Resource": arn,
    }
    async with serve_gateway(tmp_path) as gw:
        sqs = sqs_client(gw)
        url = await fifo_queue(sqs, name)
        await call(
            sqs.add_permission, QueueUrl=url, Label="account1", AWSAccountIds=["111111111111"], Actions=["*"]
        )
        await call(
            sqs.add_permission,
            QueueUrl=url,
            Label="account2",
            AWSAccountIds=["222211111111", "333311111111"],
            Actions=["SendMessage", "ReceiveMessage"],
        )
        attributes = await call(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Policy"])
        policy = json.loads(attributes["Attributes"]["Policy"])
        assert policy == {
            "Version": "2012-10-17",
            "Id": f"{arn}/SQSDefaultPolicy",
            "Statement": [
                first,
                {
                    "Sid": "account2",
                    "Effect": "Allow",
                    "Principal": {
                        "AWS": ["arn:aws:iam::222211111111:root", "arn:aws:iam::333311111111:root"]
                    },
                    "Action": ["SQS:SendMessage", "SQS:ReceiveMessage"],
                    "Resource": arn,
                },
            ],
        }
        await call(sqs.remove_permission, QueueUrl=url, Label="account2")
    async with serve_gateway(tmp_path) as gw:  # the same store, reopened
        sqs = sqs_client(gw)
        attributes = await call(sqs.get_queue_attributes, QueueUrl=name, AttributeNames=["All"])
        assert json.loads(attributes["Attributes"]["Policy"])["Statement"] == [first]
        await call(sqs.remove_permission, QueueUrl=name, Label="account1")
        attributes = await call(sqs.get_queue_attributes, QueueUrl=name, AttributeNames=["All"])
        assert "Policy" not in attributes["Attributes"]  # no statement left: no policy, as a new queue


async def test_add_permission_extends_a_policy_set_by_set_queue_attributes(gateway: Gateway) -> None:
    sqs = sqs_client(gateway)
    url = (await call(sqs.create_queue, QueueName="pol"))["QueueUrl"]
    own = {
        "Version": "2012-10-17",
        "Id": "mine",
        "Statement": [{"Sid": "s", "Effect": "Allow", "Action": "*"}],
    }
    await call(sqs.set_queue_attributes, QueueUrl=url, Attributes={"Policy": json.dumps(own)})
    await call(sqs.add_permission, QueueUrl=url, Label="more", AWSAccountIds=["t2"], Actions=["SendMessage"])
    policy = json.loads(
        (await call(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Policy"]))["Attributes"][
            "Policy"
        ]
    )
    assert policy["Id"] == "mine" and [s["Sid"] for s in policy["Statement"]] == ["s", "more"]
    await call(sqs.set_queue_attributes, QueueUrl=url, Attributes={"Policy": "not json"})
    error = await expect_error(
        sqs.add_permission, QueueUrl=url, Label="x", AWSAccountIds=["t2"], Actions=["*"]
    )
    assert error["code"] == "InvalidAttributeValue"


async def test_permission_errors_are_sqs_errors(gateway: Gateway) -> None:
    """moto test_add_permission_errors / test_remove_permission_errors: SQS's codes, statuses and texts."""
    sqs = sqs_client(gateway)
    url = (await call(sqs.create_queue, QueueName="perms"))["QueueUrl"]
    await call(
        sqs.add_permission,
        QueueUrl=url,
        Label="test",
        AWSAccountIds=["111111111111"],
        Actions=["ReceiveMessage"],
    )
    cases: list[tuple[dict[str, Any], tuple[str, int, str]]] = [
        (
            {
                "Label": "test",
                "AWSAccountIds": ["111111111111"],
                "Actions": ["ReceiveMessage", "SendMessage"],
            },
            (
                "InvalidParameterValue",
                400,
                "Value test for parameter Label is invalid. Reason: Already exists.",
            ),
        ),
        (
            {"Label": "test-2", "AWSAccountIds": ["111111111111"], "Actions": ["RemovePermission"]},
            (
                "InvalidParameterValue",
                400,
                "Value SQS:RemovePermission for parameter ActionName is invalid. Reason: Only the queue owner"
                " is allowed to invoke this action.",
            ),
        ),
        (
            {"Label": "test-2", "AWSAccountIds": ["111111111111"], "Actions": []},
            ("MissingParameter", 400, "The request must contain the parameter Actions."),
        ),
        (
            {"Label": "test-2", "AWSAccountIds": [], "Actions": ["ReceiveMessage"]},
            (
                "InvalidParameterValue",
                400,
                "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.",
            ),
        ),
        (
            {
                "Label": "test-2",
                "AWSAccountIds": ["111111111111"],
                "Actions": [
                    "ChangeMessageVisibility",
                    "DeleteMessage",
                    "GetQueueAttributes",
                    "GetQueueUrl",
                    "ListDeadLetterSourceQueues",
                    "PurgeQueue",
                    "ReceiveMessage",
                    "SendMessage",
                ],
            },
            ("OverLimit", 403, "8 Actions were found, maximum allowed is 7."),
        ),
    ]
    for params, (code, status, message) in cases:
        error = await expect_error(sqs.add_permission, QueueUrl=url, **params)
        assert (error["code"], error["status"], error["message"]) == (code, status, message), params
    error = await expect_error(
        sqs.add_permission, QueueUrl=url, Label="bad label!", AWSAccountIds=["1"], Actions=["*"]
    )
    assert error["code"] == "InvalidParameterValue" and "Label" in error["message"]
    error = await expect_error(
        sqs.add_permission, QueueUrl=url, Label="x", AWSAccountIds=["1"], Actions=["Fly"]
    )
    assert error["code"] == "InvalidParameterValue" and "SQS:Fly" in error["message"]
    error = await expect_error(sqs.remove_permission, QueueUrl=url, Label="nope")
    assert error == {
        "code": "InvalidParameterValue",
        "message": "Value nope for parameter Label is invalid. Reason: can't find label on existing policy.",
        "status": 400,
    }
    # Editing a queue's policy is an admin's action, as SetQueueAttributes is.
    producer = sqs_client(gateway, "producer-1")
    error = await expect_error(producer.remove_permission, QueueUrl=url, Label="test")
    assert error["code"] == "AccessDenied"
    error = await expect_error(sqs.remove_permission, QueueUrl=f"{gateway.url}/t1/missing", Label="test")
    assert error["code"] == "AWS.SimpleQueueService.NonExistentQueue"


# ------------------------------------------------------------------------------- batch validation
async def _visible(sqs: Any, url: str) -> str:
    attributes = await call(
        sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return str(attributes["Attributes"]["ApproximateNumberOfMessages"])


async def test_a_fifo_batch_entry_without_its_ids_fails_the_whole_request(gateway: Gateway) -> None:
    """moto test_send_messages_to_fifo_without_message_group_id / test_fifo_dedupe_error_no_message_dedupe_id
    _batch (and an AWS-validated test of LocalStack's): SQS refuses the whole SendMessageBatch, sending
    nothing, when a FIFO entry lacks MessageGroupId, or MessageDeduplicationId without content-based
    deduplication."""
    sqs = sqs_client(gateway)
    url = await fifo_queue(sqs, "strict.fifo")
    good = {"Id": "id_1", "MessageBody": "body_1", "MessageGroupId": "g1", "MessageDeduplicationId": "d1"}
    error = await expect_error(
        sqs.send_message_batch,
        QueueUrl=url,
        Entries=[good, {"Id": "id_2", "MessageBody": "b", "MessageGroupId": "g2"}],
    )
    assert error == {
        "code": "InvalidParameterValue",
        "message": "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId"
        " provided explicitly",
        "status": 400,
    }
    error = await expect_error(
        sqs.send_message_batch,
        QueueUrl=url,
        Entries=[good, {"Id": "id_2", "MessageBody": "b", "MessageDeduplicationId": "d2"}],
    )
    assert error == {
        "code": "MissingParameter",
        "message": "The request must contain the parameter MessageGroupId.",
        "status": 400,
    }
    assert await _visible(sqs, url) == "0"  # the good entry was not sent either

    dedup = await fifo_queue(sqs, "content.fifo", ContentBasedDeduplication="true")
    error = await expect_error(
        sqs.send_message_batch, QueueUrl=dedup, Entries=[{"Id": "id_1", "MessageBody": "b"}]
    )
    assert (error["code"], error["message"]) == (
        "MissingParameter",
        "The request must contain the parameter MessageGroupId.",
    )
    sent = await call(
        sqs.send_message_batch,
        QueueUrl=dedup,
        Entries=[{"Id": "id_1", "MessageBody": "b", "MessageGroupId": "g"}],
    )
    assert [s["Id"] for s in sent["Successful"]] == ["id_1"]
    # Other faults stay per entry, as in SQS: a non-zero DelaySeconds on a FIFO entry.
    sent = await call(
        sqs.send_message_batch,
        QueueUrl=url,
        Entries=[good, {**good, "Id": "late", "MessageDeduplicationId": "d9", "DelaySeconds": 3}],
    )
    assert [s["Id"] for s in sent["Successful"]] == ["id_1"]
    assert [(f["Id"], f["Code"]) for f in sent["Failed"]] == [("late", "InvalidParameterValue")]


# ------------------------------------------------------------------------------------ error texts
async def test_error_texts_are_sqs_texts(gateway: Gateway) -> None:
    """The texts moto's tests assert where they are AWS's (test_send_message_batch_errors,
    test_delete_message_errors, test_change_message_visibility_on_unknown_receipt_handle,
    test_delete_message_batch_with_invalid_receipt_id, test_get_queue_attributes_errors,
    test_untag_queue_errors, test_tag_queue_errors)."""
    sqs = sqs_client(gateway)
    url = (await call(sqs.create_queue, QueueName="texts", tags={"tag_key_1": "tag_value_X"}))["QueueUrl"]
    for method, shape in (
        (sqs.send_message_batch, "SendMessageBatchRequestEntry"),
        (sqs.delete_message_batch, "DeleteMessageBatchRequestEntry"),
        (sqs.change_message_visibility_batch, "ChangeMessageVisibilityBatchRequestEntry"),
    ):
        error = await expect_error(method, QueueUrl=url, Entries=[])
        assert (error["code"], error["message"]) == (
            "AWS.SimpleQueueService.EmptyBatchRequest",
            f"There should be at least one {shape} in the request.",
        )
    error = await expect_error(sqs.delete_message, QueueUrl=url, ReceiptHandle="not-existing")
    assert (error["code"], error["message"]) == (
        "ReceiptHandleIsInvalid",
        "The input receipt handle is invalid.",
    )
    error = await expect_error(
        sqs.change_message_visibility, QueueUrl=url, ReceiptHandle="unknown-stuff", VisibilityTimeout=432
    )
    assert (error["code"], error["message"]) == (
        "ReceiptHandleIsInvalid",
        "The input receipt handle is invalid.",
    )
    await call(sqs.send_message, QueueUrl=url, MessageBody="coucou")
    (message,) = (await call(sqs.receive_message, QueueUrl=url, VisibilityTimeout=0))["Messages"]
    result = await call(
        sqs.delete_message_batch,
        QueueUrl=url,
        Entries=[
            {"Id": "fake-receipt-handle-1", "ReceiptHandle": "fake-receipt-handle-1"},
            {"Id": "real", "ReceiptHandle": message["ReceiptHandle"]},
        ],
    )
    assert result["Successful"] == [{"Id": "real"}]
    assert result["Failed"] == [
        {
            "Id": "fake-receipt-handle-1",
            "SenderFault": True,
            "Code": "ReceiptHandleIsInvalid",
            "Message": 'The input receipt handle "fake-receipt-handle-1" is not a valid receipt handle.',
        }
    ]
    for names in ([""], []):
        error = await expect_error(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=names)
        assert (error["code"], error["message"]) == ("InvalidAttributeName", "Unknown Attribute ."), names
    error = await expect_error(
        sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn", "not-existing"]
    )
    assert error["message"] == "Unknown Attribute not-existing."
    assert "Attributes" not in await call(sqs.get_queue_attributes, QueueUrl=url)  # no AttributeNames: none
    error = await expect_error(sqs.untag_queue, QueueUrl=url, TagKeys=[])
    assert error["message"] == "Tag keys must be between 1 and 128 characters in length."
    error = await expect_error(sqs.tag_queue, QueueUrl=url, Tags={})
    assert error["message"] == "The request must contain the parameter Tags."
    error = await expect_error(sqs.tag_queue, QueueUrl=url, Tags={f"tag_key_{i}": f"v{i}" for i in range(51)})
    assert error["message"] == "Too many tags added for queue texts."
    assert (await call(sqs.list_queue_tags, QueueUrl=url))["Tags"] == {"tag_key_1": "tag_value_X"}


# ------------------------------------------------------------------------------------------ regions
async def test_by_default_every_region_names_the_same_queues(gateway: Gateway) -> None:
    """Queues are the same whatever region the caller signs for; the ARN carries the caller's region."""
    east = sqs_client(gateway, region="us-east-1")
    url = (await call(east.create_queue, QueueName="everywhere"))["QueueUrl"]
    for region in ("eu-west-1", "ap-south-1"):
        other = sqs_client(gateway, region=region)
        assert (await call(other.get_queue_url, QueueName="everywhere"))["QueueUrl"] == url
        arn = (await call(other.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]
        assert arn["QueueArn"] == f"arn:aws:sqs:{region}:t1:everywhere"


async def test_configured_regions_refuse_others_as_sqs_does(tmp_path: Path) -> None:
    """With `--region` given, a request signed for another region is refused as an SQS regional endpoint
    refuses it (SignatureDoesNotMatch, 403), and an ARN naming another region names no queue."""
    async with serve_gateway(tmp_path, sqs_regions=frozenset({"us-east-1", "eu-west-1"})) as gw:
        east, west = sqs_client(gw, region="us-east-1"), sqs_client(gw, region="eu-west-1")
        url = (await call(east.create_queue, QueueName="dlq"))["QueueUrl"]
        arn = (await call(west.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn"]))["Attributes"]
        assert arn["QueueArn"] == "arn:aws:sqs:eu-west-1:t1:dlq"
        error = await expect_error(sqs_client(gw, region="ap-south-1").list_queues)
        assert error == {
            "code": "SignatureDoesNotMatch",
            "message": "Credential should be scoped to a valid region, not 'ap-south-1'. ",
            "status": 403,
        }
        policy = {"deadLetterTargetArn": "arn:aws:sqs:ap-south-1:t1:dlq", "maxReceiveCount": 3}
        error = await expect_error(
            east.create_queue, QueueName="src", Attributes={"RedrivePolicy": json.dumps(policy)}
        )
        assert error["code"] == "InvalidAttributeValue"
        policy["deadLetterTargetArn"] = "arn:aws:sqs:eu-west-1:t1:dlq"  # a region it answers for
        await call(east.create_queue, QueueName="src", Attributes={"RedrivePolicy": json.dumps(policy)})


def test_region_names_are_checked() -> None:
    assert parse_regions([]) is None
    assert parse_regions(["us-east-1", "local"]) == frozenset({"us-east-1", "local"})
    for bad in ("US-EAST-1", "", "eu west", "1abc", "a" * 60):
        with pytest.raises(ValueError, match="invalid region"):
            parse_regions([bad])


def test_md5_helper_is_sqs_vector() -> None:
    """The MD5 helper the wildcard test relies on is SQS's encoding (the vector moto's tests use)."""
    attributes = {"timestamp": {"DataType": "Number.java.lang.Long", "StringValue": "1493147359900"}}
    assert expected_md5_of_attributes(attributes) == "2e2e4876d8e0bd6b8c2c8f556831c349"
    assert hashlib.md5(b"derp").hexdigest() == "58fd9edd83341c29f1aebba81c31e257"


def test_strictq_serve_region_flag(tmp_path: Path) -> None:
    """`strictq serve --region` reaches the SQS face: the listed region works, another is refused."""
    serve = start_serve(tmp_path / "data", "--region", "eu-west-1")
    try:
        keys = tomllib.loads((serve.data_dir / "keys.toml").read_text())
        admin = next(c for c in keys["credential"] if c["role"] == "admin")

        def client(region: str) -> Any:
            return boto3.client(
                "sqs",
                endpoint_url=serve.url,
                region_name=region,
                aws_access_key_id=admin["id"],
                aws_secret_access_key=admin["secret"],
                config=NO_RETRIES,
            )

        url = client("eu-west-1").create_queue(QueueName="regional")["QueueUrl"]
        arn = client("eu-west-1").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        assert arn["Attributes"]["QueueArn"].startswith("arn:aws:sqs:eu-west-1:")
        with pytest.raises(ClientError) as caught:
            client("us-east-1").list_queues()
        assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    finally:
        stop(serve)


def test_strictq_serve_refuses_a_bad_region_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        strictq("serve", "--data-dir", str(tmp_path / "d"), "--region", "Not A Region"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "strictq: --region: invalid region 'Not A Region': lowercase letters, digits and hyphens, starting"
        " with a letter"
    ]
    assert not (tmp_path / "d").exists()  # refused before touching anything
