"""Queue attributes on the SQS face: SQS names and string values to the core's QueueAttributes and back.

Attributes the core has no field for live in the queue's `labels` under `sqs:<AttributeName>` (FifoQueue,
ReceiveMessageWaitTimeSeconds, FifoThroughputLimit, policies, KMS settings, LastModifiedTimestamp); tags
live there under `tag:<key>`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from queue_core.backend import DedupReach
from queue_core.machine import QueueAttributes, QueueMetrics
from queue_core.machine.text import CONTROL_RE, INTEGER_RE

from .sqs_errors import SqsError

LABEL = "sqs:"
TAG = "tag:"
FIFO_LABEL = f"{LABEL}FifoQueue"
WAIT_LABEL = f"{LABEL}ReceiveMessageWaitTimeSeconds"
MODIFIED_LABEL = f"{LABEL}LastModifiedTimestamp"
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024  # SQS's default (and ceiling) since 2025
STANDARD_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
FIFO_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
TAG_LIMIT = 50

# name -> (core field or label, low, high)
INTEGERS: dict[str, tuple[str, int, int]] = {
    "VisibilityTimeout": ("visibility_timeout", 0, 43200),
    "MessageRetentionPeriod": ("retention", 60, 1209600),
    "DelaySeconds": ("delay", 0, 900),
    "MaximumMessageSize": ("max_message_size", 1024, 1048576),
    "ReceiveMessageWaitTimeSeconds": (WAIT_LABEL, 0, 20),
    "KmsDataKeyReusePeriodSeconds": (f"{LABEL}KmsDataKeyReusePeriodSeconds", 60, 86400),
}
LABELLED = ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId", "SqsManagedSseEnabled", "FifoThroughputLimit")
FIFO_ONLY = ("ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
SETTABLE = frozenset([*INTEGERS, *LABELLED, *FIFO_ONLY, "RedrivePolicy"])
READ_ONLY = frozenset(
    [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
        "CreatedTimestamp",
        "LastModifiedTimestamp",
        "QueueArn",
    ]
)
ALL_NAMES = SETTABLE | READ_ONLY | {"FifoQueue"}

# resolves a dead-letter target ARN to (internal name, is FIFO); raises SqsError when it is not usable
DlqResolver = Callable[[str], Awaitable[tuple[str, bool]]]


def is_fifo(attributes: QueueAttributes) -> bool:
    return attributes.labels.get(FIFO_LABEL) == "true"


def check_new_queue_name(name: str, fifo_attribute: str | None) -> bool:
    """SQS's naming rules for CreateQueue; returns whether the queue is FIFO."""
    fifo = name.endswith(".fifo")
    if fifo_attribute is not None and fifo_attribute.lower() not in ("true", "false"):
        raise SqsError("InvalidAttributeValue", "Invalid value for the parameter FifoQueue.")
    wants_fifo = fifo_attribute is not None and fifo_attribute.lower() == "true"
    if fifo or wants_fifo:
        if not (fifo and wants_fifo and FIFO_NAME_RE.fullmatch(name)):
            raise SqsError(
                "InvalidParameterValue",
                "The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores,"
                " must end with .fifo suffix and be 1 to 80 in length, and FifoQueue must be true.",
            )
        return True
    if not STANDARD_NAME_RE.fullmatch(name):
        raise SqsError(
            "InvalidParameterValue",
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length.",
        )
    return False


async def to_core(
    changes: dict[str, str], *, fifo: bool, resolve_dlq: DlqResolver
) -> tuple[dict[str, Any], dict[str, str | None]]:
    """SQS attribute changes as (core attribute changes, label changes; None removes a label).
    FifoQueue is handled by the caller (create only)."""
    core: dict[str, Any] = {}
    labels: dict[str, str | None] = {}
    for name, value in changes.items():
        if name not in SETTABLE or (name in FIFO_ONLY and not fifo):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if not isinstance(value, str):
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        if name in INTEGERS:
            target, low, high = INTEGERS[name]
            number = _integer(name, value, low, high)
            if target.startswith(LABEL):
                labels[target] = str(number)
            else:
                core[target] = number
        elif name == "RedrivePolicy":
            core.update(await _redrive(value, fifo, resolve_dlq))
        elif name == "ContentBasedDeduplication":
            core["content_based_dedup"] = _boolean(name, value) == "true"
        elif name == "DeduplicationScope":
            if value not in ("messageGroup", "queue"):
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            core["dedup_scope"] = "group" if value == "messageGroup" else "queue"
        elif name == "FifoThroughputLimit":
            if value not in ("perQueue", "perMessageGroupId"):
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
            labels[f"{LABEL}{name}"] = value
        elif name == "SqsManagedSseEnabled":
            labels[f"{LABEL}{name}"] = _boolean(name, value)
        else:
            labels[f"{LABEL}{name}"] = value if value else None
    if labels.get(f"{LABEL}FifoThroughputLimit") == "perMessageGroupId":
        scope = core.get("dedup_scope")
        if scope is not None and scope != "group":
            raise SqsError(
                "InvalidAttributeValue",
                "FifoThroughputLimit perMessageGroupId requires DeduplicationScope messageGroup.",
            )
    return core, labels


def _integer(name: str, value: str, low: int, high: int) -> int:
    """Plain ASCII digits only (`isdigit` is also true for '²', which int() refuses, and for '٣')."""
    if not INTEGER_RE.fullmatch(value) or not low <= int(value) <= high:
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {name}: must be an integer from {low} to {high}.",
        )
    return int(value)


def _boolean(name: str, value: str) -> str:
    if value.lower() not in ("true", "false"):
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
    return value.lower()


async def _redrive(value: str, fifo: bool, resolve_dlq: DlqResolver) -> dict[str, Any]:
    if value == "":
        return {"dead_letter_queue": None, "max_receive_count": 0}
    try:
        policy = orjson.loads(value)
    except orjson.JSONDecodeError:
        policy = None
    if not isinstance(policy, dict) or not isinstance(policy.get("deadLetterTargetArn"), str):
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy is not a valid JSON map"
            " with deadLetterTargetArn.",
        )
    count = policy.get("maxReceiveCount", 10)
    if isinstance(count, str) and INTEGER_RE.fullmatch(count):
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Invalid value for maxReceiveCount: must be"
            " an integer from 1 to 1000.",
        )
    internal, dlq_fifo = await resolve_dlq(policy["deadLetterTargetArn"])
    if dlq_fifo != fifo:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Dead-letter queue must be same type of"
            " queue as the source.",
        )
    return {"dead_letter_queue": internal, "max_receive_count": count}


def matches(existing: QueueAttributes, core: dict[str, Any], labels: dict[str, str | None]) -> bool:
    """CreateQueue on an existing queue: every attribute given must equal the queue's current value."""
    current = existing.to_dict()
    for name, value in core.items():
        if current[name] != value and not (isinstance(value, int) and float(current[name]) == value):
            return False
    return all(existing.labels.get(name) == value for name, value in labels.items())


def merged_labels(current: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    labels = dict(current)
    for name, value in changes.items():
        if value is None:
            labels.pop(name, None)
        else:
            labels[name] = value
    return labels


def describe(
    attributes: QueueAttributes,
    metrics: QueueMetrics,
    created_at: float,
    arn: str,
    arn_of: Callable[[str], str | None],
    dedup_reach: DedupReach = "queue",
) -> dict[str, str]:
    """Every SQS attribute of a queue, as strings. `dedup_reach`: the backend's (queue_core.backend): in a
    cluster a send is deduplicated within its partition only, so the scope it really has is per group."""
    labels = attributes.labels
    created = str(int(created_at))
    out = {
        "QueueArn": arn,
        "ApproximateNumberOfMessages": str(metrics.visible),
        "ApproximateNumberOfMessagesNotVisible": str(metrics.in_flight),
        "ApproximateNumberOfMessagesDelayed": str(metrics.delayed),
        "CreatedTimestamp": created,
        "LastModifiedTimestamp": labels.get(MODIFIED_LABEL, created),
        "VisibilityTimeout": str(int(attributes.visibility_timeout)),
        "MaximumMessageSize": str(attributes.max_message_size),
        "MessageRetentionPeriod": str(int(attributes.retention)),
        "DelaySeconds": str(int(attributes.delay)),
        "ReceiveMessageWaitTimeSeconds": labels.get(WAIT_LABEL, "0"),
        "SqsManagedSseEnabled": labels.get(f"{LABEL}SqsManagedSseEnabled", "false"),
    }
    dlq_arn = arn_of(attributes.dead_letter_queue) if attributes.dead_letter_queue else None
    if dlq_arn is not None and attributes.max_receive_count:
        policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": attributes.max_receive_count}
        out["RedrivePolicy"] = orjson.dumps(policy).decode()
    for name in ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"):
        if f"{LABEL}{name}" in labels:
            out[name] = labels[f"{LABEL}{name}"]
    if is_fifo(attributes):
        out["FifoQueue"] = "true"
        out["ContentBasedDeduplication"] = "true" if attributes.content_based_dedup else "false"
        per_group = attributes.dedup_scope == "group" or dedup_reach == "partition"
        out["DeduplicationScope"] = "messageGroup" if per_group else "queue"
        out["FifoThroughputLimit"] = labels.get(f"{LABEL}FifoThroughputLimit", "perQueue")
    return out


def tags_of(attributes: QueueAttributes) -> dict[str, str]:
    return {k[len(TAG) :]: v for k, v in attributes.labels.items() if k.startswith(TAG)}


def tag_changes(tags: Any, current: dict[str, str], queue: str) -> dict[str, str | None]:
    if not isinstance(tags, dict) or not tags:
        raise SqsError("MissingParameter", "The request must contain the parameter Tags.")
    for key, value in tags.items():
        if not isinstance(value, str) or not 1 <= len(key) <= 128 or len(value) > 256:
            raise SqsError(
                "InvalidParameterValue", f"Tag {key!r} is invalid: keys are 1-128, values 0-256 characters."
            )
        if CONTROL_RE.search(key) or CONTROL_RE.search(value):  # stored as labels, echoed by ListQueueTags
            raise SqsError(
                "InvalidParameterValue",
                f"Tag {key!r} is invalid: keys and values must not hold control characters.",
            )
    if len(current.keys() | tags.keys()) > TAG_LIMIT:  # SQS's text; a queue has at most 50 tags
        raise SqsError("InvalidParameterValue", f"Too many tags added for queue {queue}.")
    return {f"{TAG}{k}": v for k, v in tags.items()}
