"""What goes into the core from outside: send requests, receipts, and the store's snapshot at a restart."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidReceipt, QueueError


@dataclass(slots=True)
class SendRequest:
    body: bytes
    group: str | None = None
    dedup_id: str | None = None
    message_id: str | None = None
    delay: float | None = None
    content_type: str = ""
    extra: bytes = b""
    # The id of the request that sent it (protocol.request_ids; the faces check it): kept with the body,
    # never in the core's per-message memory, and handed back with each delivery (Received.request_id).
    request_id: str | None = None


OUTCOMES = ("succeeded", "failed", "partial", "not_attempted")


@dataclass(slots=True)
class AttemptResult:
    """A worker's account of one attempt at one message (docs/failure-management.md §1). `steps`,
    `partial` and `fields` are JSON values; the API faces bound their sizes before they get here."""

    message_id: str
    token: int | None
    outcome: str  # succeeded | failed | partial | not_attempted
    reason: str = ""
    signature: str = ""  # what failed (endpoint + status class, or error kind): the health monitor's key
    steps: list[Any] = field(default_factory=list)  # steps completed in this attempt
    partial: Any = None
    fields: Any = None  # free-form structured fields (log data only)
    duration_ms: float | None = None
    preprocess_ms: float | None = None  # the attempt's pre-processing, when it had one (pipelining)
    request_id: str | None = None  # the id of the request that sent the message (its delivery's): log data
    # A garbled result (queue_core.results.parse_results, lenient per item): why it could not be read.
    # A probe's fails the probe; a real message's refuses the whole request with this error.
    error: QueueError | None = None
    raw: Any = None  # the item as sent, forwarded as is by the remote client (so the server sees it too)


@dataclass(slots=True)
class ControlRows:
    """What the store keeps for the control hub and failure management, read once when it opens: fences
    by worker (queue_core.fences.Fence.to_dict()), suspended queues and blacklisted workers."""

    fences: dict[str, dict[str, Any]] = field(default_factory=dict)
    suspensions: dict[str, dict[str, Any]] = field(default_factory=dict)
    blacklists: dict[str, dict[str, Any]] = field(default_factory=dict)
    fleet_controls: dict[str, dict[str, Any]] = field(default_factory=dict)  # pending, by id (docs/fleet.md)
    fleet_policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # rebalancing, by queue


MessageRow = tuple[int, int, str, str, float, int, float, int, float, str, "str | None", "bytes | None", int]


@dataclass(slots=True)
class Snapshot:
    """Everything the store kept, for a restart. Message rows must come in key order."""

    queues: list[tuple[int, str, dict[str, Any], float]] = field(default_factory=list)
    # (key, qid, message id, group, available_at, receive_count, first_receive_at, token, claim_expires,
    #  claim_worker, origin, content digest, body size)
    messages: Iterable[MessageRow] = ()
    # (qid, dedup key, message id, seq, group, expires)
    dedup: list[tuple[int, str, str, int, str, float]] = field(default_factory=list)
    key_high_water: int = 0
    # (key, qid, message id, AttemptHistory.to_state()): messages with failed attempts
    histories: list[tuple[int, int, str, dict[str, Any]]] = field(default_factory=list)
    # (qid, group, override): per-group retry policy overrides
    policies: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    # workers whose latest poll declared `results` (QueueCore.participants)
    participants: list[str] = field(default_factory=list)
    # (qid, group, machine.handover.Handover.to_dict()): groups moving between workers with their state
    handovers: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)


def parse_receipt(receipt: object) -> tuple[str, int]:
    """A receipt handle is `<token hex>.<message id>`: it names the claim, so a stale one is detectable."""
    if not isinstance(receipt, str) or "." not in receipt or len(receipt) > 160:
        raise InvalidReceipt("receipt handle is not one this queue issued", receipt=str(receipt)[:160])
    token_hex, message_id = receipt.split(".", 1)
    try:
        token = int(token_hex, 16)
    except ValueError:
        raise InvalidReceipt("receipt handle is not one this queue issued", receipt=receipt) from None
    return message_id, token
