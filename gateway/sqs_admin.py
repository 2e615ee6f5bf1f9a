"""SQS queue actions: create, look up, list, attributes, delete, purge, tags, dead-letter sources and
message move tasks (redrive). Each takes a Call and returns the JSON result."""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import orjson

from access.permissions import visible_names
from access.tenancy import core_name
from queue_core.machine import NotFound, NotInFlight, QueueError, QueueNotFound

from .sqs_call import PURGE_INTERVAL, Call, MoveRecord, Queue
from .sqs_errors import NO_QUEUE, SqsError, from_core
from .sqs_queues import (
    ALL_NAMES,
    DEFAULT_MAX_MESSAGE_SIZE,
    FIFO_LABEL,
    MODIFIED_LABEL,
    TAG,
    DlqResolver,
    check_new_queue_name,
    describe,
    is_fifo,
    matches,
    merged_labels,
    tag_changes,
    tags_of,
    to_core,
)

Result = dict[str, Any]
MOVE_STATUS = {"running": "RUNNING", "done": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED"}


def _dlq_resolver(call: Call, source: str | None) -> DlqResolver:
    async def resolve(arn: str) -> tuple[str, bool]:
        try:
            dlq = await call.queue_from_arn(arn, "InvalidAttributeValue")
        except SqsError:
            raise SqsError(
                "InvalidAttributeValue",
                "Value for parameter RedrivePolicy is invalid. Reason: Dead letter target does not exist.",
            ) from None
        if dlq.internal == source:
            raise SqsError(
                "InvalidAttributeValue",
                "Value for parameter RedrivePolicy is invalid. Reason: A queue cannot be its own dead-letter"
                " queue.",
            )
        return dlq.internal, dlq.fifo

    return resolve


async def create_queue(call: Call) -> Result:
    name = call.string("QueueName")
    attributes = call.mapping("Attributes")
    tags = call.mapping("tags")
    fifo_attribute = attributes.get("FifoQueue")
    if fifo_attribute is not None and not isinstance(fifo_attribute, str):
        raise SqsError("InvalidAttributeValue", "Invalid value for the parameter FifoQueue.")
    fifo = check_new_queue_name(name, fifo_attribute)
    if not call.credential.may_use(name):
        raise SqsError("AccessDenied", f"Access to the queue name {name} is denied for this credential.")
    internal = core_name(call.tenant, name)
    others = {k: v for k, v in attributes.items() if k != "FifoQueue"}
    core, labels = await to_core(others, fifo=fifo, resolve_dlq=_dlq_resolver(call, internal))
    service = call.service(internal)
    try:
        existing = await service.attributes(internal)
    except QueueNotFound:
        existing = None
    if existing is not None:
        if is_fifo(existing) != fifo or not matches(existing, core, labels):
            raise SqsError(
                "QueueNameExists",
                f"A queue already exists with the same name {name} and a different value for an attribute.",
            )
        return {"QueueUrl": call.url(name)}
    core.setdefault("max_message_size", DEFAULT_MAX_MESSAGE_SIZE)
    new_labels = merged_labels({FIFO_LABEL: "true"} if fifo else {}, labels)
    if tags:  # every tag is set (None, a removal, only comes from UntagQueue)
        new_labels = merged_labels(new_labels, tag_changes(tags, {}, name))
    try:
        await service.create_queue(internal, {**core, "labels": new_labels})
    except QueueError as exc:
        raise from_core(exc) from None
    return {"QueueUrl": call.url(name)}


async def get_queue_url(call: Call) -> Result:
    name = call.string("QueueName")
    owner = call.optional_string("QueueOwnerAWSAccountId")
    if owner is not None and not call.is_own_account(owner):
        raise SqsError("QueueDoesNotExist", NO_QUEUE)
    queue = await call.queue_named(name)
    return {"QueueUrl": call.url(queue.name)}


def _page(call: Call, names: list[str], key: str) -> Result:
    """SQS pagination: MaxResults (1-1000) enables NextToken; without it, the first 1000."""
    limit = call.integer("MaxResults", 1, 1000)
    token = call.optional_string("NextToken")
    if token is not None:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise SqsError("InvalidParameterValue", "Invalid NextToken value.") from None
        names = [n for n in names if n > after]
    page = names[: limit or 1000]
    result: Result = {key: [call.url(n) for n in page]}
    if limit is not None and len(names) > limit:
        result["NextToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
    return result


async def list_queues(call: Call) -> Result:
    prefix = call.string("QueueNamePrefix", required=False)
    tenant_queues = await call.service().list_queues(core_name(call.tenant, ""))  # "<tenant>."
    names = visible_names(call.credential, tenant_queues, prefix)
    result = _page(call, sorted(names), "QueueUrls")
    if not result["QueueUrls"]:
        del result["QueueUrls"]
    return result


async def list_dead_letter_source_queues(call: Call) -> Result:
    dlq = await call.queue()
    service = call.service()
    sources = [
        internal
        for internal in await service.list_queues(core_name(call.tenant, ""))
        if (await service.attributes(internal)).dead_letter_queue == dlq.internal
    ]
    return _page(call, sorted(visible_names(call.credential, sources)), "queueUrls")


async def delete_queue(call: Call) -> Result:
    queue = await call.queue()
    try:
        await queue.service.delete_queue(queue.internal)
    except QueueError as exc:
        raise from_core(exc) from None
    call.state.purged_at.pop(queue.internal, None)
    return {}


async def get_queue_attributes(call: Call) -> Result:
    queue = await call.queue()
    names = call.strings("AttributeNames")
    unknown = [n for n in names if n not in ALL_NAMES and n != "All"]
    if unknown or call.params.get("AttributeNames") == []:  # an empty list names no attribute, as in SQS
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0] if unknown else ''}.")
    if not names:
        return {}
    created_at = await queue.service.created_at(queue.internal)
    metrics = await queue.service.metrics(queue.internal)
    reach = queue.service.dedup_reach
    everything = describe(queue.attributes, metrics, created_at, call.arn(queue.name), call.arn_of, reach)
    if "All" not in names:
        everything = {k: v for k, v in everything.items() if k in names}
    return {"Attributes": everything} if everything else {}


async def set_queue_attributes(call: Call) -> Result:
    queue = await call.queue()
    attributes = call.mapping("Attributes", required=True)
    if "FifoQueue" in attributes:
        raise SqsError("InvalidAttributeName", "FifoQueue can only be set when the queue is created.")
    core, labels = await to_core(attributes, fifo=queue.fifo, resolve_dlq=_dlq_resolver(call, queue.internal))
    await update_queue(queue, core, labels)
    return {}


async def update_queue(queue: Queue, core: dict[str, Any], labels: dict[str, str | None]) -> None:
    changed = merged_labels(queue.attributes.labels, labels)
    changed[MODIFIED_LABEL] = str(int(time.time()))
    try:
        await queue.service.set_attributes(queue.internal, {**core, "labels": changed})
    except QueueError as exc:
        if exc.code == "invalid_argument":
            raise SqsError("InvalidAttributeValue", exc.message) from None
        raise from_core(exc) from None


async def purge_queue(call: Call) -> Result:
    queue = await call.queue()
    now = time.monotonic()
    last = call.state.purged_at.get(queue.internal)
    if last is not None and now - last < PURGE_INTERVAL:
        raise SqsError(
            "PurgeQueueInProgress",
            f"Only one PurgeQueue operation on {queue.name} is allowed every {PURGE_INTERVAL:.0f} seconds.",
        )
    await queue.service.purge(queue.internal)
    call.state.purged_at[queue.internal] = now
    return {}


async def tag_queue(call: Call) -> Result:
    queue = await call.queue()
    changes = tag_changes(call.params.get("Tags"), tags_of(queue.attributes), queue.name)
    await update_queue(queue, {}, changes)
    return {}


async def untag_queue(call: Call) -> Result:
    queue = await call.queue()
    keys = call.strings("TagKeys")
    if not keys or not all(1 <= len(k) <= 128 for k in keys):
        raise SqsError("InvalidParameterValue", "Tag keys must be between 1 and 128 characters in length.")
    await update_queue(queue, {}, {f"{TAG}{k}": None for k in keys})
    return {}


async def list_queue_tags(call: Call) -> Result:
    tags = tags_of((await call.queue()).attributes)
    return {"Tags": tags} if tags else {}


# ---------------------------------------------------------------------------------- message moves
def _handle(move_id: str, source_arn: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"taskId": move_id, "sourceArn": source_arn})).decode()


def _move_of_handle(call: Call, handle: str) -> MoveRecord:
    try:
        move_id = orjson.loads(base64.urlsafe_b64decode(handle.encode()))["taskId"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise SqsError("ResourceNotFoundException", "The specified task handle is not valid.") from None
    record = call.state.moves.get(move_id) if isinstance(move_id, str) else None
    if record is None or record.tenant != call.tenant:
        raise SqsError("ResourceNotFoundException", "The specified task does not exist.")
    return record


async def start_message_move_task(call: Call) -> Result:
    source_arn = call.string("SourceArn")
    source = await call.queue_from_arn(source_arn)
    service = source.service
    rate = call.integer("MaxNumberOfMessagesPerSecond", 1, 500)
    origins = [
        internal
        for internal in await service.list_queues(core_name(call.tenant, ""))
        if (await service.attributes(internal)).dead_letter_queue == source.internal
    ]
    if not origins:
        raise SqsError("InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")
    destination_arn = call.optional_string("DestinationArn")
    if destination_arn is not None:
        destination = (await call.queue_from_arn(destination_arn)).internal
    elif len(origins) == 1:
        destination = origins[0]
    else:
        raise SqsError(
            "UnsupportedOperation",
            "This dead-letter queue has several source queues; redriving each message to its own source is"
            " not supported yet: name the DestinationArn.",
        )
    if destination == source.internal:
        raise SqsError("InvalidParameterValue", "The destination must differ from the source queue.")
    for record in call.state.moves.values():
        if record.source == source.internal and await _status(call, record) == "running":
            raise SqsError(
                "InvalidParameterValue",
                "There is already a task running. Only one active task is allowed for each source queue arn"
                " at a given time.",
            )
    try:
        move = await service.start_move(source.internal, destination)
    except QueueError as exc:
        raise from_core(exc) from None
    call.state.moves[move.id] = MoveRecord(
        move.id, call.tenant, source.internal, destination, move.remaining, rate
    )
    return {"TaskHandle": _handle(move.id, source_arn)}


async def _status(call: Call, record: MoveRecord) -> str | None:
    try:
        return (await call.service(record.source).move_status(record.move_id)).state
    except NotFound:
        return None


async def list_message_move_tasks(call: Call) -> Result:
    source_arn = call.string("SourceArn")
    source = await call.queue_from_arn(source_arn)
    limit = call.integer("MaxResults", 1, 10) or 1
    results = []
    for record in reversed(list(call.state.moves.values())):
        if record.source != source.internal:
            continue
        try:
            move = await source.service.move_status(record.move_id)
        except NotFound:  # started before a restart: the core no longer knows it
            continue
        status = MOVE_STATUS.get(move.state, move.state.upper())
        entry: Result = {
            "Status": status,
            "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": move.moved,
            "ApproximateNumberOfMessagesToMove": record.total,
            "StartedTimestamp": int(move.started_at * 1000),
        }
        destination_arn = call.arn_of(record.destination)
        if destination_arn is not None:
            entry["DestinationArn"] = destination_arn
        if status == "RUNNING":
            entry["TaskHandle"] = _handle(record.move_id, source_arn)
        if record.rate is not None:
            entry["MaxNumberOfMessagesPerSecond"] = record.rate
        if move.error:
            entry["FailureReason"] = move.error
        results.append(entry)
        if len(results) >= limit:
            break
    return {"Results": results}


async def cancel_message_move_task(call: Call) -> Result:
    """Stop a RUNNING task; messages already moved stay moved (SQS). A finished task cannot be cancelled."""
    record = _move_of_handle(call, call.string("TaskHandle"))
    try:
        move = await call.service(record.source).cancel_move(record.move_id)
    except NotFound:
        raise SqsError("ResourceNotFoundException", "The specified task does not exist.") from None
    except NotInFlight:
        raise SqsError(
            "ResourceNotFoundException", "Only a message move task with status RUNNING can be cancelled."
        ) from None
    return {"ApproximateNumberOfMessagesMoved": move.moved}
