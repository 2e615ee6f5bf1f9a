"""The AWS CLI (awscli from PyPI) sends and receives once against the gateway, unchanged."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from gateway_support import Gateway

AWS = Path(sys.executable).with_name("aws")


def aws(gw: Gateway, key_id: str, *args: str) -> dict[str, object]:
    credential = gw.credential(key_id)
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": credential.id,
        "AWS_SECRET_ACCESS_KEY": credential.secret,
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_CA_BUNDLE": str(gw.ca_file),
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    result = subprocess.run(
        [str(AWS), "sqs", *args, "--endpoint-url", gw.url, "--output", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if result.stdout.strip() else {}


async def test_aws_cli_sends_and_receives(gateway: Gateway) -> None:
    created = await asyncio.to_thread(
        aws,
        gateway,
        "admin-1",
        "create-queue",
        "--queue-name",
        "cli.fifo",
        "--attributes",
        "FifoQueue=true,ContentBasedDeduplication=true",
    )
    url = str(created["QueueUrl"])
    assert url == f"{gateway.url}/t1/cli.fifo"
    sent = await asyncio.to_thread(
        aws,
        gateway,
        "producer-1",
        "send-message",
        "--queue-url",
        url,
        "--message-body",
        "hello from the aws cli",
        "--message-group-id",
        "g1",
    )
    assert sent["MessageId"] and sent["SequenceNumber"]
    received = await asyncio.to_thread(
        aws,
        gateway,
        "worker-1",
        "receive-message",
        "--queue-url",
        url,
        "--message-system-attribute-names",
        "MessageGroupId",
    )
    (message,) = received["Messages"]  # type: ignore[misc]
    assert message["Body"] == "hello from the aws cli"
    assert message["MessageId"] == sent["MessageId"]
    assert message["Attributes"]["MessageGroupId"] == "g1"
    await asyncio.to_thread(
        aws,
        gateway,
        "worker-1",
        "delete-message",
        "--queue-url",
        url,
        "--receipt-handle",
        message["ReceiptHandle"],
    )
    assert (await gateway.service.metrics("t1.cli.fifo")).total == 0
