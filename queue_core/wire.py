"""The internal API's JSON forms, in one place: `encode_*` / `decode_*` pairs between the core's records
and the bodies the queue server (server.py) reads and writes, the remote backend (remote.py) and the
client (client.py) send and read.

`decode_*` of what a caller sent checks it (`InvalidArgument` naming the field: a 400); `decode_*` of what
the server answered trusts it (the server built it with `encode_*`). Attempt results and their outcomes
keep their bounds in queue_core.results, which the EmoDB face shares; errors are the error model's
(`QueueError.to_dict`, `error_from_dict`). Fields that never leave the process (a move's `limit_key` and
pending groups, a delivery's store key, which is the id in hex for ids the core made) are not on the wire.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from protocol.estimates import Estimate
from protocol.request_ids import RULE as REQUEST_ID_RULE
from protocol.request_ids import is_request_id

from .machine import (
    AckOutcome,
    Delivery,
    GroupPolicy,
    InvalidArgument,
    MoveStatus,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    Redriven,
    SendRequest,
    SendResult,
    error_from_dict,
    parse_receipt,
)
from .machine.capabilities import PLAIN, Capabilities, with_max_bytes, with_version
from .machine.capabilities import parse_list as parse_capabilities
from .machine.inputs import AttemptResult
from .machine.records import Received, ReportOutcome
from .machine.text import DECIMAL_RE, INTEGER_RE, check_json, check_name
from .results import outcome_from_json, outcome_json, parse_results, result_json

MAX_BATCH = 1000
MAX_WORKER = 128
ClaimItems = list[tuple[str, int | None]]


# ------------------------------------------------------------------------------------ plain values
def number(data: dict[str, Any], name: str, default: float | None) -> float | None:
    value = data.get(name, default)
    if value is None:
        return None
    if isinstance(value, str):  # plain ASCII decimals only: not '٣', '1_0', ' 5', 'nan' or 'inf'
        if not DECIMAL_RE.fullmatch(value):
            raise InvalidArgument(f"{name} must be a number in plain digits", field=name)
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number", field=name)
    return float(value)


def integer(data: dict[str, Any] | Any, name: str, default: int) -> int:
    value = data.get(name, default)
    if isinstance(value, str) and INTEGER_RE.fullmatch(value):  # plain ASCII digits only
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer", field=name)
    return value


def worker_of(data: dict[str, Any]) -> str:
    worker = data.get("worker", "")
    if not isinstance(worker, str) or len(worker) > MAX_WORKER:
        raise InvalidArgument(f"worker must be a string of at most {MAX_WORKER} characters", field="worker")
    return str(check_name(worker, "worker"))


def holder_of(data: dict[str, Any]) -> str | None:
    """`holder`: the worker on whose behalf a gateway ends or extends claims; the core then refuses claims
    that went to another worker. Absent: an operator's call (this internal API is for trusted callers:
    the gateway, which authenticates workers, and tools)."""
    holder = data.get("holder")
    if holder is not None and (not isinstance(holder, str) or not 0 < len(holder) <= MAX_WORKER):
        raise InvalidArgument(f"holder must be a string of 1-{MAX_WORKER} characters", field="holder")
    return holder


def held(body: dict[str, Any], holder: str | None) -> dict[str, Any]:
    """A request body acting as `holder` (None: as an operator)."""
    return body if holder is None else {**body, "holder": holder}


# ---------------------------------------------------------------------------------------- bodies
def encode_body(body: bytes, content_type: str, extra: bytes) -> dict[str, Any]:
    """A body as text when it is UTF-8, else base64; `extra` (the message attributes) as JSON."""
    out: dict[str, Any] = {"content_type": content_type}
    try:
        out["body"] = body.decode()
    except UnicodeDecodeError:
        out["body_b64"] = base64.b64encode(body).decode()
    if extra:
        out["attributes"] = orjson.loads(extra)
    return out


def decode_body(item: dict[str, Any]) -> tuple[bytes, str, bytes]:
    if "body_b64" in item:
        body = base64.b64decode(item["body_b64"])
    else:
        body = str(item.get("body", "")).encode()
    attributes = item.get("attributes")
    return body, item.get("content_type", ""), orjson.dumps(attributes) if attributes else b""


def key_of(message_id: str) -> int:
    """The core's key is the id in hex for ids it made; faces never use it, so others get 0."""
    try:
        return int(message_id, 16)
    except ValueError:
        return 0


# ----------------------------------------------------------------------------------------- sends
def encode_send_request(request: SendRequest) -> dict[str, Any]:
    entry: dict[str, Any] = {"content_type": request.content_type or "text/plain"}
    try:
        entry["body"] = request.body.decode()
    except UnicodeDecodeError:
        entry["body_b64"] = base64.b64encode(request.body).decode()
    if request.extra:
        entry["attributes"] = orjson.loads(request.extra)
    for name, value in (
        ("group", request.group),
        ("dedup_id", request.dedup_id),
        ("id", request.message_id),
        ("delay", request.delay),
        ("request_id", request.request_id),
    ):
        if value is not None:
            entry[name] = value
    return entry


def decode_send_request(entry: Any) -> SendRequest:
    """One entry of `messages`: `body` (text), `body_b64` or `json`, with optional `group`, `dedup_id`,
    `id`, `delay`, `content_type`, `attributes` and `request_id` (the id of the request that sent it: a
    gateway forwards its own request's; protocol.request_ids)."""
    if not isinstance(entry, dict):
        raise InvalidArgument("each message must be a JSON object")
    content_type = entry.get("content_type", "text/plain")
    if "json" in entry:
        body = orjson.dumps(entry["json"])
        content_type = entry.get("content_type", "application/json")
    elif "body_b64" in entry:
        try:
            body = base64.b64decode(entry["body_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise InvalidArgument("body_b64 is not valid base64", field="body_b64") from None
        content_type = entry.get("content_type", "application/octet-stream")
    elif isinstance(entry.get("body"), str):
        body = entry["body"].encode()
    else:
        raise InvalidArgument("a message needs 'body' (text), 'body_b64' or 'json'", field="body")
    attributes = entry.get("attributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise InvalidArgument("attributes must be a JSON object", field="attributes")
    delay = number(entry, "delay", None)
    for name in ("group", "dedup_id", "id", "content_type"):
        if name in entry and entry[name] is not None and not isinstance(entry[name], str):
            raise InvalidArgument(f"{name} must be a string", field=name)
        check_name(entry.get(name), name)
    check_json(attributes, "attributes")
    request_id = entry.get("request_id")
    if request_id is not None and not is_request_id(request_id):
        raise InvalidArgument(f"request_id must be {REQUEST_ID_RULE}", field="request_id")
    return SendRequest(
        body=body,
        group=entry.get("group"),
        dedup_id=entry.get("dedup_id"),
        message_id=entry.get("id"),
        delay=delay,
        content_type=content_type,
        extra=orjson.dumps(attributes) if attributes else b"",
        request_id=request_id,
    )


def encode_send(requests: Sequence[SendRequest], create: bool) -> dict[str, Any]:
    return {"messages": [encode_send_request(r) for r in requests], "create": create}


def encode_entries(entries: Sequence[dict[str, Any]], create: bool) -> dict[str, Any]:
    """A send of entries in their JSON form as a tool gives them (QueueClient): the server checks each."""
    return {"messages": list(entries), "create": create}


def decode_send(data: dict[str, Any]) -> tuple[list[SendRequest | QueueError], bool]:
    """A send request's entries, each parsed on its own (a bad entry is its error, the rest go on)."""
    entries = data.get("messages")
    if not isinstance(entries, list) or not entries:
        raise InvalidArgument("messages must be a non-empty list", field="messages")
    if len(entries) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} messages per request", field="messages")
    requests: list[SendRequest | QueueError] = []
    for entry in entries:
        try:
            requests.append(decode_send_request(entry))
        except QueueError as exc:
            requests.append(exc)
    return requests, bool(data.get("create"))


def encode_send_result(result: SendResult | QueueError) -> dict[str, Any]:
    if isinstance(result, QueueError):
        return {"error": result.to_dict()}
    return {
        "id": result.message_id,
        "group": result.group,
        "seq": result.seq,
        "partition": result.partition,
        "duplicate": result.duplicate,
    }


def decode_send_result(item: dict[str, Any]) -> SendResult | QueueError:
    if "error" in item:
        return error_from_dict(item["error"])
    return SendResult(item["id"], item["group"], item["seq"], item["partition"], item["duplicate"])


# --------------------------------------------------------------------------------------- receive
@dataclass(frozen=True, slots=True)
class ReceiveRequest:
    limit: int = 10
    ttl: float | None = None
    worker: str = ""
    wait: float = 0.0
    probes: bool = True  # false: the caller cannot hand out probes (the SQS face)
    capabilities: Capabilities = PLAIN  # what the poller declared (machine.capabilities)


def encode_receive(request: ReceiveRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"limit": request.limit, "worker": request.worker, "wait": request.wait}
    if request.ttl is not None:
        body["ttl"] = request.ttl
    if not request.probes:
        body["probes"] = False
    if request.capabilities != PLAIN:  # the poller's declaration, forwarded as it was made
        body["capabilities"] = request.capabilities.tokens()
    if request.capabilities.version:
        body["version"] = request.capabilities.version
    if request.capabilities.max_bytes:
        body["max_bytes"] = request.capabilities.max_bytes
    return body


def encode_declared(request: ReceiveRequest, declared: Sequence[str] | None) -> dict[str, Any]:
    """A poll with the capabilities as its caller declared them (QueueClient; None: plain semantics):
    the server decides what it makes of them."""
    body = encode_receive(request)
    if declared is not None:
        body["capabilities"] = list(declared)
    return body


def decode_receive(data: dict[str, Any]) -> ReceiveRequest:
    return ReceiveRequest(
        worker=worker_of(data),
        limit=integer(data, "limit", 10),
        ttl=number(data, "ttl", None),
        wait=number(data, "wait", 0.0) or 0.0,
        probes=data.get("probes", True) is not False,
        capabilities=with_max_bytes(
            with_version(parse_capabilities(data.get("capabilities")), data.get("version"), "version"),
            data.get("max_bytes"),
            "max_bytes",
        ),
    )


def encode_received(item: Received) -> dict[str, Any]:
    d = item.delivery
    return {
        "id": d.message_id,
        "group": d.group,
        "seq": d.seq,
        "token": d.token,
        "receipt": d.receipt,
        "receive_count": d.receive_count,
        "sent_at": d.sent_at,
        "first_receive_at": d.first_receive_at,
        "claim_expires": d.claim_expires,
        "origin": d.origin,
        **encode_body(item.body, item.content_type, item.extra),
        **({"probe": True} if item.probe else {}),  # failure management's dummy message
        **({"history": d.history} if d.history else {}),  # prior failed attempts' log data
        **({"request_id": item.request_id} if item.request_id else {}),  # the sending request's id
        **({"estimate": item.estimate.to_json()} if item.estimate else {}),  # pipelining (estimates)
        **({"state": item.state} if item.state is not None else {}),  # a moved group's state (handover)
    }


def decode_received(item: dict[str, Any]) -> Received:
    delivery = Delivery(
        key_of(item["id"]),
        item["id"],
        item["group"],
        item["seq"],
        item["token"],
        item["receipt"],
        item["receive_count"],
        item["sent_at"],
        item["first_receive_at"],
        item["claim_expires"],
        item.get("origin"),
        item.get("history"),
    )
    request_id = item.get("request_id")
    return Received(
        delivery,
        *decode_body(item),
        probe=item.get("probe") is True,
        request_id=request_id if isinstance(request_id, str) else None,
        estimate=Estimate.from_json(item.get("estimate")),
        state=item.get("state"),
    )


# ------------------------------------------------------------------------------- claims, outcomes
def encode_claims(
    items: Sequence[tuple[str, int | None]], holder: str | None, **extra: Any
) -> dict[str, Any]:
    """Ack, renew or release by `items`: `[[id, token or null], ...]` (`extra`: renew's ttl and mode)."""
    return held({"items": [[message_id, token] for message_id, token in items], **extra}, holder)


def encode_receipts(receipts: Sequence[str], holder: str | None, **extra: Any) -> dict[str, Any]:
    """Ack, renew or release by receipts as a tool holds them (QueueClient; `extra`: renew's ttl and
    mode): the server, not the tool, parses them."""
    return held({"receipts": list(receipts), **extra}, holder)


def encode_ids(ids: Sequence[str], token: int | None, holder: str | None) -> dict[str, Any]:
    """Ack by message ids with one optional fencing token for all (QueueClient)."""
    return held({"ids": list(ids), "token": token}, holder)


def decode_claims(data: dict[str, Any]) -> ClaimItems:
    """`receipts` (they carry the fencing token), `ids` with an optional shared `token`, or `items`:
    `[[id, token or null], ...]` (a gateway forwarding a batch whose messages carry different tokens)."""
    items: ClaimItems
    if "items" in data:
        raw = data["items"]
        if not isinstance(raw, list) or not raw:
            raise InvalidArgument("items must be a non-empty list of [id, token] pairs", field="items")
        items = []
        for entry in raw:
            if (
                not isinstance(entry, list)
                or len(entry) != 2
                or not isinstance(entry[0], str)
                or not (entry[1] is None or (isinstance(entry[1], int) and not isinstance(entry[1], bool)))
            ):
                raise InvalidArgument("each item must be [id, token or null]", field="items")
            items.append((check_name(entry[0], "items"), entry[1]))
    elif "receipts" in data:
        receipts = data["receipts"]
        if not isinstance(receipts, list) or not receipts:
            raise InvalidArgument("receipts must be a non-empty list", field="receipts")
        items = [parse_receipt(r) for r in receipts]
    elif "ids" in data:
        ids = data["ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise InvalidArgument("ids must be a non-empty list of strings", field="ids")
        for message_id in ids:
            check_name(message_id, "ids")
        token = data.get("token")
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
            raise InvalidArgument("token must be an integer", field="token")
        items = [(i, token) for i in ids]
    else:
        raise InvalidArgument("give 'receipts' or 'ids'", field="receipts")
    if len(items) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} items per request", field="receipts")
    return items


def encode_outcome(outcome: AckOutcome) -> dict[str, Any]:
    """A per-item status (`ok`, `gone` or an error code), with a report's group and attempt."""
    return outcome_json(outcome)


def decode_ack_outcome(item: dict[str, Any]) -> AckOutcome:
    return AckOutcome(item["id"], item["status"], item.get("message", ""))


def decode_report_outcome(item: dict[str, Any]) -> ReportOutcome:
    return outcome_from_json(item)


def encode_report(worker: str, results: Sequence[AttemptResult], holder: str | None) -> dict[str, Any]:
    return held({"worker": worker, "results": [result_json(r) for r in results]}, holder)


def decode_report(data: dict[str, Any]) -> tuple[str, list[AttemptResult], str | None]:
    """(worker, results, holder); the results' own bounds are queue_core.results'."""
    worker = worker_of(data)
    holder = holder_of(data)
    return worker, parse_results(data), holder


# ------------------------------------------------------------------------- queues, metrics, moves
def encode_queue(name: str, attributes: QueueAttributes) -> dict[str, Any]:
    return {"queue": name, "attributes": attributes.to_dict()}


def decode_attributes(payload: dict[str, Any]) -> QueueAttributes:
    return QueueAttributes.from_dict(payload["attributes"])


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    attributes: QueueAttributes
    metrics: QueueMetrics
    created_at: float


def encode_queue_info(info: QueueInfo) -> dict[str, Any]:
    return {
        **encode_queue(info.name, info.attributes),
        "metrics": encode_metrics(info.metrics),
        "created_at": info.created_at,
    }


def decode_queue_info(payload: dict[str, Any]) -> QueueInfo:
    return QueueInfo(
        payload["queue"],
        decode_attributes(payload),
        decode_metrics(payload["metrics"]),
        float(payload["created_at"]),
    )


def encode_metrics(metrics: QueueMetrics) -> dict[str, Any]:
    return metrics.to_dict()


def decode_metrics(data: dict[str, Any]) -> QueueMetrics:
    return QueueMetrics(**data)


def encode_peek(item: PeekItem, body: bytes, content_type: str, extra: bytes) -> dict[str, Any]:
    return {
        "id": item.message_id,
        "group": item.group,
        "seq": item.seq,
        "sent_at": item.sent_at,
        "receive_count": item.receive_count,
        "claimed": item.claimed,
        **encode_body(body, content_type, extra),
    }


def decode_peek(item: dict[str, Any]) -> tuple[PeekItem, bytes, str, bytes]:
    peeked = PeekItem(
        key_of(item["id"]),
        item["id"],
        item["group"],
        item["seq"],
        item["sent_at"],
        item["receive_count"],
        item["claimed"],
    )
    return (peeked, *decode_body(item))


def encode_move(move: MoveStatus) -> dict[str, Any]:
    return move.to_dict()


def decode_move(data: dict[str, Any]) -> MoveStatus:
    return MoveStatus(
        id=data["id"],
        source=data["from"],
        destination=data["to"],
        moved=data["moved"],
        remaining=data["remaining"],
        state=data["state"],
        error=data["error"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
    )


def encode_move_request(source: str, destination: str, move_id: str | None = None) -> dict[str, Any]:
    return {"from": source, "to": destination, **({"id": move_id} if move_id is not None else {})}


def decode_move_request(data: dict[str, Any]) -> tuple[str, str, str | None]:
    """(from, to, the cluster's id of the move or None); the core checks the id (machine.moves)."""
    source, destination, move_id = data.get("from"), data.get("to"), data.get("id")
    if not isinstance(source, str) or not isinstance(destination, str):
        raise InvalidArgument("give 'from' and 'to' queue names", field="from")
    if move_id is not None and not isinstance(move_id, str):
        raise InvalidArgument("id must be a string", field="id")
    return source, destination, move_id


# ------------------------------------------------------------------------------- the retry workflow
def encode_redriven(redriven: Redriven) -> dict[str, Any]:
    return {"restored": redriven.restored, "released": redriven.released}


def decode_redriven(data: dict[str, Any]) -> Redriven:
    return Redriven(int(data["restored"]), int(data["released"]))


def decode_group_policy(data: dict[str, Any]) -> GroupPolicy:
    return GroupPolicy.from_dict(data)


def decode_override(data: dict[str, Any]) -> dict[str, Any] | None:
    """A `PUT .../groups/policy` body: `{"override": {...}}`; null or {} removes the override."""
    override = data.get("override")
    if override is not None and not isinstance(override, dict):
        raise InvalidArgument("override must be a JSON object of retry policy fields", field="override")
    return override
