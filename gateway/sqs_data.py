"""SQS message actions: send (and batch), receive, delete (and batch), change visibility (and batch)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from queue_core.backend import QueueBackend
from queue_core.machine import AckOutcome, InvalidArgument, QueueError, SendRequest, SendResult
from queue_core.machine.groups import GROUP_RE, validate_group
from queue_core.machine.text import INTEGER_RE

from .backpressure import BackpressureRefused
from .deliveries import deliveries_of
from .limits_http import check_backlog, check_sends
from .rate_limits import Throttled
from .request_ids import request_id_of
from .sqs_call import ATTEMPT_WINDOW, Attempt, Call, Queue
from .sqs_errors import SqsError, from_core, from_core_code
from .sqs_messages import (
    check_text,
    encode_extra,
    md5_hex,
    md5_of_attributes,
    parse_attributes,
    render_message,
)
from .sqs_receipts import RECEIPTS

Result = dict[str, Any]
MAX_BATCH_BYTES = 1024 * 1024
MAX_VISIBILITY = 43200
ATTEMPT_ID_RE = GROUP_RE  # 1-128 alphanumerics and punctuation, as MessageGroupId


@dataclass(slots=True)
class Prepared:
    request: SendRequest
    size: int
    md5_body: str
    md5_attributes: str | None
    md5_system: str | None


def _prepare(call: Call, queue: Queue, params: dict[str, Any]) -> Prepared:
    body = params.get("MessageBody")
    if body is None or body == "":
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if not isinstance(body, str):
        raise SqsError("InvalidParameterValue", "Value for parameter MessageBody must be a string.")
    check_text(body)
    attributes, attributes_size = parse_attributes(params.get("MessageAttributes"))
    system, _ = parse_attributes(
        params.get("MessageSystemAttributes"), "MessageSystemAttributes", system=True
    )
    raw = body.encode()
    size = len(raw) + attributes_size
    limit = queue.attributes.max_message_size
    if size > limit:
        raise SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes.",
        )
    delay = call.integer("DelaySeconds", 0, 900, params)
    group = _optional_text(params, "MessageGroupId")
    dedup = _optional_text(params, "MessageDeduplicationId")
    if group is not None:
        try:
            validate_group(group)
        except InvalidArgument as exc:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {group} for parameter MessageGroupId is invalid. Reason: {exc.message}.",
            ) from None
    if queue.fifo:
        # FIFO queues take a delay per queue only: SQS accepts DelaySeconds=0 per message (it changes
        # nothing: the queue's delay applies) and refuses any other value.
        if delay:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request include parameter"
                " that is not valid for this queue type.",
            )
        delay = None
        _check_fifo_ids(queue, group, dedup)
        if dedup is not None and not GROUP_RE.fullmatch(dedup):
            raise SqsError(
                "InvalidParameterValue",
                f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: 1-128"
                " alphanumeric or punctuation characters.",
            )
        effective_dedup: str | None = dedup or hashlib.sha256(raw).hexdigest()
        core_group, label_group = group, None
    else:
        if dedup is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: The request"
                " includes a parameter that is not valid for this queue type.",
            )
        effective_dedup = None
        core_group, label_group = None, group  # fair-queue label on standard queues: no ordering by it
    extra = encode_extra(attributes, system, call.credential.id, effective_dedup, label_group)
    request = SendRequest(
        body=raw,
        group=core_group,
        # The content hash computed here is the core's dedup key as it would compute it (machine.sends):
        # handed over, so that each body is hashed once.
        dedup_id=effective_dedup,
        delay=None if delay is None else float(delay),
        content_type="text/plain",
        extra=extra,
        request_id=request_id_of(call.request),  # the x-amzn-RequestId of this send, kept with the message
    )
    return Prepared(
        request,
        size,
        md5_hex(raw),
        md5_of_attributes(attributes) if attributes else None,
        md5_of_attributes(system) if system else None,
    )


def _check_fifo_ids(queue: Queue, group: str | None, dedup: str | None) -> None:
    if group is None:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageGroupId.")
    if dedup is None and not queue.attributes.content_based_dedup:
        raise SqsError(
            "InvalidParameterValue",
            "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId"
            " provided explicitly",
        )


def _optional_text(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"Value for parameter {name} must be a string.")
    return value


async def _send(call: Call, queue: Queue, prepared: Sequence[Prepared]) -> list[SendResult | QueueError]:
    """Each entry goes to the owner of its group's partition (one owner in the embedded default), once
    the queue's backpressure (gateway.backpressure) and the tenant's send rate (gateway.rate_limits) admit
    them all: SQS's RequestThrottled otherwise, for the whole request."""
    try:
        await check_backlog(call.request, queue.service, queue.internal, queue.name, queue.attributes)
        check_sends(call.request, call.credential.tenant, len(prepared))
    except (Throttled, BackpressureRefused) as exc:
        raise SqsError("RequestThrottled", exc.message) from None
    owners: dict[int, tuple[QueueBackend, list[int]]] = {}
    for index, item in enumerate(prepared):
        service = call.service_for_group(item.request.group, queue.internal)
        owners.setdefault(id(service), (service, []))[1].append(index)
    results: list[SendResult | QueueError | None] = [None] * len(prepared)
    for service, indices in owners.values():
        try:
            answers = await service.send(queue.internal, [prepared[i].request for i in indices])
        except QueueError as exc:
            raise from_core(exc) from None
        for index, answer in zip(indices, answers, strict=True):
            results[index] = answer
    return [r for r in results if r is not None]


def _sent(queue: Queue, item: Prepared, result: SendResult) -> Result:
    out: Result = {"MessageId": result.message_id, "MD5OfMessageBody": item.md5_body}
    if item.md5_attributes is not None:
        out["MD5OfMessageAttributes"] = item.md5_attributes
    if item.md5_system is not None:
        out["MD5OfMessageSystemAttributes"] = item.md5_system
    if queue.fifo:
        out["SequenceNumber"] = str(result.seq)
    return out


async def send_message(call: Call) -> Result:
    queue = await call.queue()
    item = _prepare(call, queue, call.params)
    (result,) = await _send(call, queue, [item])
    if isinstance(result, QueueError):
        raise from_core(result)
    return _sent(queue, item, result)


async def send_message_batch(call: Call) -> Result:
    queue = await call.queue()
    entries = call.entries("SendMessageBatchRequestEntry")
    if queue.fifo:
        # SQS refuses the whole request (not just the entry) when a FIFO entry lacks its MessageGroupId, or
        # its MessageDeduplicationId on a queue without content-based deduplication.
        for entry in entries:
            group = _optional_text(entry, "MessageGroupId")
            _check_fifo_ids(queue, group, _optional_text(entry, "MessageDeduplicationId"))
    failed: list[Result] = []
    ready: list[tuple[str, Prepared]] = []
    total = 0
    for entry in entries:
        try:
            item = _prepare(call, queue, entry)
        except SqsError as error:
            body = entry.get("MessageBody")
            total += len(body.encode()) if isinstance(body, str) else 0
            failed.append(error.batch_entry(entry["Id"]))
            continue
        total += item.size
        ready.append((entry["Id"], item))
    if total > MAX_BATCH_BYTES:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. You have sent {total} bytes.",
        )
    successful: list[Result] = []
    results = await _send(call, queue, [item for _, item in ready]) if ready else []
    for (entry_id, item), result in zip(ready, results, strict=True):
        if isinstance(result, QueueError):
            failed.append(from_core(result).batch_entry(entry_id))
        else:
            successful.append({"Id": entry_id, **_sent(queue, item, result)})
    return {"Successful": successful, "Failed": failed}


# ------------------------------------------------------------------------------------------- receive
async def receive_message(call: Call) -> Result:
    queue = await call.queue()
    limit = call.integer("MaxNumberOfMessages", 1, 10) or 1
    ttl = call.integer("VisibilityTimeout", 0, MAX_VISIBILITY)
    wait = call.integer("WaitTimeSeconds", 0, 20)
    if wait is None:
        stored = queue.attributes.labels.get("sqs:ReceiveMessageWaitTimeSeconds", "0")
        # set by this face as plain digits; the internal API could store anything: never a 500 here
        wait = max(0, min(int(stored), 20)) if INTEGER_RE.fullmatch(stored) else 0
    system_names = set(call.strings("AttributeNames")) | set(call.strings("MessageSystemAttributeNames"))
    attribute_names = set(call.strings("MessageAttributeNames"))
    attempt_id = call.optional_string("ReceiveRequestAttemptId")
    if attempt_id is not None and not ATTEMPT_ID_RE.fullmatch(attempt_id):
        raise SqsError(
            "InvalidParameterValue",
            "Value for parameter ReceiveRequestAttemptId is invalid. Reason: 1-128 alphanumeric or"
            " punctuation characters.",
        )
    effective_ttl = float(queue.attributes.visibility_timeout if ttl is None else ttl)
    key = (queue.internal, call.credential.id, attempt_id or "")
    if queue.fifo and attempt_id is not None:
        again = await _retry(call, queue, key)
        if again:
            return {"Messages": again}
    try:
        received = await queue.service.receive(
            queue.internal,
            limit,
            None if ttl is None else float(ttl),
            worker=call.credential.id,
            wait=wait,
            probes=False,  # failure management's probes are for SDK workers: an SQS one cannot report one
        )
    except QueueError as exc:
        raise from_core(exc) from None
    if received and (deliveries := deliveries_of(call.request)) is not None:
        deliveries.delivered(call.credential, "sqs", queue.name, received)
    signer = call.request.app[RECEIPTS]
    messages = [
        render_message(
            r,
            receipt=signer.sign(queue.internal, r.delivery.token, r.delivery.message_id),
            fifo=queue.fifo,
            system_names=system_names,
            attribute_names=attribute_names,
            arn_of=call.arn_of,
        )
        for r in received
    ]
    if queue.fifo and attempt_id is not None and messages and effective_ttl > 0:
        items = [(r.delivery.message_id, r.delivery.token) for r in received]
        call.state.remember(key, Attempt(time.monotonic() + ATTEMPT_WINDOW, items, messages, effective_ttl))
    return {"Messages": messages} if messages else {}


async def _retry(call: Call, queue: Queue, key: tuple[str, str, str]) -> list[Result]:
    """The messages of an earlier receive with this attempt id that are still in flight under its claim
    (their visibility timeout is reset, as SQS does); [] when none are, and the attempt is forgotten."""
    attempt = call.state.attempt(key)
    if attempt is None:
        return []
    outcomes = await queue.service.renew(queue.internal, attempt.items, attempt.ttl, mode="set")
    live = [m for m, o in zip(attempt.messages, outcomes, strict=True) if o.status == "ok"]
    if not live:
        call.state.attempts.pop(key, None)
    return live


# ------------------------------------------------------------------------------ delete and visibility
def _receipt(call: Call, queue: Queue, params: dict[str, Any], *, batch: bool = False) -> tuple[str, int]:
    """(message id, token) of a handle this face issued for this queue; its MAC is checked in constant
    time (sqs_receipts), so a guessed token or an edited handle is refused as SQS refuses one it never
    issued. A verified handle is the proof of holding the claim: the core then only checks its token.
    SQS's texts: a batch entry quotes the handle, a single call does not."""
    receipt = params.get("ReceiptHandle")
    if receipt is None or receipt == "":
        raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
    item = call.request.app[RECEIPTS].verify(queue.internal, receipt)
    if item is None:
        if not batch:
            raise SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
        shown = str(receipt)[:160].encode("ascii", "backslashreplace").decode("ascii")
        raise SqsError(
            "ReceiptHandleIsInvalid", f'The input receipt handle "{shown}" is not a valid receipt handle.'
        )
    return item


def _ack_error(outcome: AckOutcome, *, gone_ok: bool) -> SqsError | None:
    if outcome.status == "ok" or (gone_ok and outcome.status == "gone"):
        return None
    return from_core_code(outcome.status, outcome.message)


async def delete_message(call: Call) -> Result:
    queue = await call.queue()
    item = _receipt(call, queue, call.params)
    (outcome,) = await queue.service.ack(queue.internal, [item])
    _log_ended(call, queue, "ack", [item], [outcome])
    error = _ack_error(outcome, gone_ok=True)  # deleting a deleted message succeeds, as in SQS
    if error is not None:
        raise error
    return {}


async def change_message_visibility(call: Call) -> Result:
    queue = await call.queue()
    item = _receipt(call, queue, call.params)
    ttl = call.integer("VisibilityTimeout", 0, MAX_VISIBILITY)
    if ttl is None:
        raise SqsError("MissingParameter", "The request must contain the parameter VisibilityTimeout.")
    (outcome,) = await queue.service.renew(queue.internal, [item], float(ttl), mode="set")
    if ttl == 0:
        _log_ended(call, queue, "release", [item], [outcome])
    error = _ack_error(outcome, gone_ok=False)
    if error is not None:
        raise error
    return {}


def _log_ended(
    call: Call, queue: Queue, event: str, items: list[tuple[str, int]], outcomes: Sequence[AckOutcome]
) -> None:
    """Delivery log: the claims a delete (`ack`) or a visibility of 0 (`release`) ended."""
    deliveries = deliveries_of(call.request)
    if deliveries is not None:
        deliveries.ended(call.credential, "sqs", queue.name, event, list(items), list(outcomes))


async def delete_message_batch(call: Call) -> Result:
    queue = await call.queue()
    failed: list[Result] = []
    ids: list[str] = []
    items: list[tuple[str, int]] = []
    for entry in call.entries("DeleteMessageBatchRequestEntry"):
        try:
            items.append(_receipt(call, queue, entry, batch=True))
            ids.append(entry["Id"])
        except SqsError as error:
            failed.append(error.batch_entry(entry["Id"]))
    outcomes = await queue.service.ack(queue.internal, items) if items else []
    _log_ended(call, queue, "ack", items, outcomes)
    successful: list[Result] = []
    for entry_id, outcome in zip(ids, outcomes, strict=True):
        problem = _ack_error(outcome, gone_ok=True)
        if problem is None:
            successful.append({"Id": entry_id})
        else:
            failed.append(problem.batch_entry(entry_id))
    return {"Successful": successful, "Failed": failed}


async def change_message_visibility_batch(call: Call) -> Result:
    queue = await call.queue()
    failed: list[Result] = []
    by_ttl: dict[int, list[tuple[str, tuple[str, int]]]] = {}
    for entry in call.entries("ChangeMessageVisibilityBatchRequestEntry"):
        try:
            item = _receipt(call, queue, entry, batch=True)
            ttl = call.integer("VisibilityTimeout", 0, MAX_VISIBILITY, entry)
            if ttl is None:
                raise SqsError(
                    "MissingParameter", "The request must contain the parameter VisibilityTimeout."
                )
        except SqsError as error:
            failed.append(error.batch_entry(entry["Id"]))
            continue
        by_ttl.setdefault(ttl, []).append((entry["Id"], item))
    successful: list[Result] = []
    for ttl, group in by_ttl.items():
        items = [item for _, item in group]
        outcomes = await queue.service.renew(queue.internal, items, float(ttl), mode="set")
        if ttl == 0:
            _log_ended(call, queue, "release", items, outcomes)
        for (entry_id, _), outcome in zip(group, outcomes, strict=True):
            problem = _ack_error(outcome, gone_ok=False)
            if problem is None:
                successful.append({"Id": entry_id})
            else:
                failed.append(problem.batch_entry(entry_id))
    return {"Successful": successful, "Failed": failed}
