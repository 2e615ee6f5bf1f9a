"""Messages on the SQS face: body and attribute validation, SQS's MD5 digests, what is kept in the core's
`extra` bytes, and how a delivery is rendered back as an SQS `Message`.

`extra` holds JSON `{"sqs": {...}}` with the message attributes (binary values base64, as on the wire),
system attributes (AWSTraceHeader), the sender's key id, the deduplication id and, on standard queues, the
MessageGroupId (fair-queue label only: standard queues do not order by it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Callable, Collection
from typing import Any

import orjson

from queue_core.machine.records import Received
from queue_core.machine.text import CONTROL_RE

from .sqs_errors import SqsError

MAX_MESSAGE_ATTRIBUTES = 10
ATTRIBUTE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")
DATA_TYPE_RE = re.compile(r"^(String|Number|Binary)(\.[A-Za-z0-9_.\-]+)?$")
# ASCII digits only (`\d` in a str pattern also takes "٣" and fullwidth digits; real SQS refuses them)
NUMBER_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
# SQS accepts #x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF
INVALID_CHARS_RE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
SYSTEM_ATTRIBUTES = ("AWSTraceHeader",)
STRICTQ_ATTRIBUTES = ("StrictqFencingToken", "StrictqGroup", "StrictqAttempt")
# Returned only when asked for by this exact name (AttributeNames or MessageSystemAttributeNames; `All`
# does not include it, so a plain client's answers are as SQS's): the RequestId of the send.
REQUEST_ID_ATTRIBUTE = "StrictqRequestId"


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: dict[str, dict[str, str]]) -> str:
    """SQS's digest: for each attribute by name, length-prefixed (4-byte big-endian) name, data type, a
    transport byte (1 string/number, 2 binary) and length-prefixed value."""
    out = bytearray()
    for name in sorted(attributes):
        value = attributes[name]
        data_type = value["DataType"]
        for part in (name.encode(), data_type.encode()):
            out += struct.pack(">I", len(part)) + part
        if "BinaryValue" in value:
            raw = base64.b64decode(value["BinaryValue"])
            out += b"\x02" + struct.pack(">I", len(raw)) + raw
        else:
            raw = value["StringValue"].encode()
            out += b"\x01" + struct.pack(">I", len(raw)) + raw
    return md5_hex(bytes(out))


def check_text(text: str, what: str = "message body") -> None:
    bad = INVALID_CHARS_RE.search(text)
    if bad is not None:
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid characters found in the {what}: U+{ord(bad.group()):04X} is outside the allowed set.",
        )


def parse_attributes(
    raw: Any, field: str = "MessageAttributes", system: bool = False
) -> tuple[dict[str, dict[str, str]], int]:
    """Validated attributes as stored (binary base64), and their size as SQS counts it."""
    if raw is None:
        return {}, 0
    if not isinstance(raw, dict):
        raise SqsError("InvalidParameterValue", f"{field} must be a map of attribute names to values.")
    if len(raw) > MAX_MESSAGE_ATTRIBUTES:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of message attributes [{len(raw)}] exceeds the allowed maximum"
            f" [{MAX_MESSAGE_ATTRIBUTES}].",
        )
    out: dict[str, dict[str, str]] = {}
    size = 0
    for name, value in raw.items():
        if system:
            if name not in SYSTEM_ATTRIBUTES:
                raise SqsError("InvalidParameterValue", f"Message system attribute name '{name}' is invalid.")
        else:
            _check_attribute_name(name)
        stored, value_size = _attribute_value(name, value, field)
        if system and stored["DataType"] != "String":
            raise SqsError(
                "InvalidParameterValue", f"Message system attribute {name} must be of type String."
            )
        if system and CONTROL_RE.search(stored["StringValue"]):  # a trace header: one line, no controls
            raise SqsError(
                "InvalidParameterValue",
                f"Message system attribute {name} must not contain control characters.",
            )
        out[name] = stored
        size += len(name.encode()) + len(stored["DataType"].encode()) + value_size
    return out, size


def _check_attribute_name(name: str) -> None:
    lower = name.lower()
    if (
        not ATTRIBUTE_NAME_RE.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or lower.startswith(("aws.", "amazon."))
    ):
        raise SqsError("InvalidParameterValue", f"Message attribute name '{name}' is invalid.")


def _attribute_value(name: str, value: Any, field: str) -> tuple[dict[str, str], int]:
    if not isinstance(value, dict):
        raise SqsError("InvalidParameterValue", f"The message attribute '{name}' must be a structure.")
    data_type = value.get("DataType")
    if not isinstance(data_type, str) or not data_type:
        raise SqsError(
            "InvalidParameterValue", f"The message attribute '{name}' must contain a non-empty data type."
        )
    if len(data_type) > 256 or not DATA_TYPE_RE.fullmatch(data_type):
        raise SqsError("InvalidParameterValue", f"The type of message attribute '{name}' is invalid.")
    if value.get("StringListValues") or value.get("BinaryListValues"):
        raise SqsError("InvalidParameterValue", f"Message attribute '{name}': list values are not supported.")
    if data_type.startswith("Binary"):
        encoded = value.get("BinaryValue")
        if not isinstance(encoded, str) or "StringValue" in value:
            raise SqsError(
                "InvalidParameterValue", f"The message attribute '{name}' must contain a binary value."
            )
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise SqsError(
                "InvalidParameterValue", f"Message attribute '{name}' is not valid base64."
            ) from None
        if not raw:
            raise SqsError("InvalidParameterValue", f"The message attribute '{name}' has an empty value.")
        return {"DataType": data_type, "BinaryValue": base64.b64encode(raw).decode()}, len(raw)
    text = value.get("StringValue")
    if not isinstance(text, str) or "BinaryValue" in value:
        raise SqsError(
            "InvalidParameterValue", f"The message attribute '{name}' must contain a string value."
        )
    if not text:
        raise SqsError("InvalidParameterValue", f"The message attribute '{name}' has an empty value.")
    check_text(text, f"message attribute '{name}'")
    if data_type.startswith("Number"):
        mantissa = text.split("e")[0].split("E")[0]
        if not NUMBER_RE.fullmatch(text) or sum(c in "0123456789" for c in mantissa) > 38:
            raise SqsError(
                "InvalidParameterValue", f"Value of message attribute '{name}' is not a valid number."
            )
    return {"DataType": data_type, "StringValue": text}, len(text.encode())


def encode_extra(
    attributes: dict[str, dict[str, str]],
    system: dict[str, dict[str, str]],
    sender: str,
    dedup_id: str | None,
    group: str | None,
) -> bytes:
    sqs: dict[str, Any] = {"sender": sender}
    if attributes:
        sqs["attributes"] = attributes
    if system:
        sqs["system"] = system
    if dedup_id is not None:
        sqs["dedup"] = dedup_id
    if group is not None:
        sqs["group"] = group
    return orjson.dumps({"sqs": sqs})


def decode_extra(extra: bytes) -> dict[str, Any]:
    """The SQS part of a message's extra bytes; {} for messages from other faces or unreadable extras."""
    if not extra:
        return {}
    try:
        data = orjson.loads(extra)
    except orjson.JSONDecodeError:
        return {}
    sqs = data.get("sqs") if isinstance(data, dict) else None
    return sqs if isinstance(sqs, dict) else {}


def select_attributes(
    attributes: dict[str, dict[str, str]], wanted: Collection[str]
) -> dict[str, dict[str, str]]:
    """MessageAttributeNames as SQS reads them: exact names; `All`, `.*` or `*` for every attribute; and
    `<prefix>.*` for every name starting with <prefix>: `.*` is "anything", so `bar.*` returns `bar.baz`
    and `Hel.*` returns both `Hello` and `Help.Me` (the API reference's "all message attributes starting
    with a prefix, for example bar.*", as SQS answers it)."""
    if not attributes or not wanted:
        return {}
    if "All" in wanted or ".*" in wanted or "*" in wanted:
        return dict(attributes)
    prefixes = tuple(w[:-2] for w in wanted if w.endswith(".*"))
    return {n: v for n, v in attributes.items() if n in wanted or (prefixes and n.startswith(prefixes))}


def render_message(
    received: Received,
    *,
    receipt: str,
    fifo: bool,
    system_names: Collection[str],
    attribute_names: Collection[str],
    arn_of: Callable[[str], str | None],
) -> dict[str, Any]:
    """One delivery as an SQS `Message`; the Strictq* attributes (token, group, attempt) always ride along,
    `StrictqRequestId` (the send's request id) only when asked for by name. `receipt`: its authenticated
    receipt handle (sqs_receipts), never the core's guessable one."""
    delivery = received.delivery
    meta = decode_extra(received.extra)
    raw = received.body
    try:
        body = raw.decode("utf-8")
        digest = md5_hex(raw)  # valid UTF-8: the bytes are what the client will hash
    except UnicodeDecodeError:  # a body from another face: shown (and hashed) with replacement characters
        body = raw.decode("utf-8", errors="replace")
        digest = md5_hex(body.encode())
    message: dict[str, Any] = {
        "MessageId": delivery.message_id,
        "ReceiptHandle": receipt,
        "MD5OfBody": digest,
        "Body": body,
    }
    attributes: dict[str, str] = {}
    if system_names:  # most receives ask for none: nothing to format
        every = "All" in system_names
        values: dict[str, str | None] = {
            "SenderId": meta.get("sender"),
            "SentTimestamp": str(int(delivery.sent_at * 1000)),
            "ApproximateReceiveCount": str(delivery.receive_count),
            "ApproximateFirstReceiveTimestamp": str(int(delivery.first_receive_at * 1000)),
            "MessageGroupId": delivery.group if fifo else meta.get("group"),
            "SequenceNumber": str(delivery.seq) if fifo else None,
            "MessageDeduplicationId": meta.get("dedup") if fifo else None,
            "AWSTraceHeader": (meta.get("system") or {}).get("AWSTraceHeader", {}).get("StringValue"),
            "DeadLetterQueueSourceArn": arn_of(delivery.origin) if delivery.origin else None,
        }
        attributes = {k: v for k, v in values.items() if v is not None and (every or k in system_names)}
    attributes["StrictqFencingToken"] = str(delivery.token)
    attributes["StrictqGroup"] = delivery.group
    attributes["StrictqAttempt"] = str(delivery.receive_count)
    if received.request_id and REQUEST_ID_ATTRIBUTE in system_names:
        attributes[REQUEST_ID_ATTRIBUTE] = received.request_id
    message["Attributes"] = attributes
    selected = select_attributes(meta.get("attributes") or {}, attribute_names)
    if selected:
        message["MD5OfMessageAttributes"] = md5_of_attributes(selected)
        message["MessageAttributes"] = selected
    return message
