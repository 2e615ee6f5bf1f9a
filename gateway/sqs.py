"""The SQS face: the AWS JSON protocol (`POST /`, `X-Amz-Target: AmazonSQS.<Action>`) over the queue core.

Requests are SigV4-verified against the key file (sqs_auth: SigV4 as botocore signs it, keys cached), the
credential's role is checked per action, queue URLs are `<gateway>/<tenant>/<queue>` and names are the
credential's tenant namespace. Errors are SQS's own, in the JSON dialect (sqs_errors). Modules:
sqs_auth (SigV4), sqs_call (a call's parameters, URLs, ARNs and the face's state), sqs_admin (queue
actions), sqs_data (message actions), sqs_messages (attributes, MD5s, rendering), sqs_queues (attributes),
sqs_permissions (AddPermission / RemovePermission), sqs_regions (the regions the endpoint answers for).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from access.permissions import Permission, allowed
from queue_core.http_errors import client_gone
from queue_core.machine import QueueError
from queue_core.machine.text import check_json_numbers

from . import sqs_admin as admin
from . import sqs_data as data
from . import sqs_permissions as permissions
from .app_keys import KEYS, MAX_EDGE_BODY
from .request_ids import request_id_of
from .sqs_auth import identify, parse_authorization, verify
from .sqs_call import SQS_STATE, Call, SqsState
from .sqs_errors import SqsError, error_response, from_core, json_response
from .sqs_receipts import RECEIPTS, ReceiptSigner
from .sqs_regions import check_region

log = logging.getLogger("strictq.gateway.sqs")
TARGET_PREFIX = "AmazonSQS."

Action = Callable[[Call], Awaitable[dict[str, Any]]]

ACTIONS: dict[str, tuple[Action, Permission]] = {
    "CreateQueue": (admin.create_queue, "create"),
    "GetQueueUrl": (admin.get_queue_url, "read"),
    "ListQueues": (admin.list_queues, "read"),
    "DeleteQueue": (admin.delete_queue, "admin"),
    "GetQueueAttributes": (admin.get_queue_attributes, "read"),
    "SetQueueAttributes": (admin.set_queue_attributes, "admin"),
    "PurgeQueue": (admin.purge_queue, "admin"),
    "ListDeadLetterSourceQueues": (admin.list_dead_letter_source_queues, "read"),
    "TagQueue": (admin.tag_queue, "admin"),
    "UntagQueue": (admin.untag_queue, "admin"),
    "ListQueueTags": (admin.list_queue_tags, "read"),
    "StartMessageMoveTask": (admin.start_message_move_task, "admin"),
    "ListMessageMoveTasks": (admin.list_message_move_tasks, "read"),
    "CancelMessageMoveTask": (admin.cancel_message_move_task, "admin"),
    "AddPermission": (permissions.add_permission, "admin"),
    "RemovePermission": (permissions.remove_permission, "admin"),
    "SendMessage": (data.send_message, "send"),
    "SendMessageBatch": (data.send_message_batch, "send"),
    "ReceiveMessage": (data.receive_message, "consume"),
    "DeleteMessage": (data.delete_message, "consume"),
    "DeleteMessageBatch": (data.delete_message_batch, "consume"),
    "ChangeMessageVisibility": (data.change_message_visibility, "consume"),
    "ChangeMessageVisibilityBatch": (data.change_message_visibility_batch, "consume"),
}
# Real SQS actions this face does not offer: UnsupportedOperation, not InvalidAction. (None at present.)
UNSUPPORTED: frozenset[str] = frozenset()


def add_routes(
    app: web.Application, receipt_key: Path | None = None, regions: Collection[str] | None = None
) -> None:
    """`receipt_key`: the file of the key that authenticates receipt handles (made if missing); None:
    a key for this process only (sqs_receipts). `regions`: the regions requests may be signed for
    (sqs_regions); None or empty: any region."""
    app[SQS_STATE] = SqsState(regions=frozenset(regions) if regions else None)
    app[RECEIPTS] = ReceiptSigner.load(receipt_key) if receipt_key is not None else ReceiptSigner.ephemeral()
    app.router.add_post("/", handle)


async def handle(request: web.Request) -> web.Response:
    # One id per request (gateway.request_ids): the client's X-Request-Id when well formed. AWS's JSON
    # errors have no body field for it: x-amzn-RequestId carries it on every answer, errors included.
    request_id = request_id_of(request)
    try:
        return json_response(await _dispatch(request), request_id)
    except SqsError as error:
        return error_response(error, request_id)
    except QueueError as error:
        return error_response(from_core(error), request_id)
    except Exception as exc:
        if client_gone(request, exc):
            raise  # one WARNING line in queue_core.http_guard, not an error with a traceback
        log.exception("SQS request %s failed", request_id)
        return error_response(
            SqsError("InternalError", "We encountered an internal error. Please try again."), request_id
        )


async def _dispatch(request: web.Request) -> dict[str, Any]:
    target = request.headers.get("X-Amz-Target", "")
    action = target.removeprefix(TARGET_PREFIX) if target.startswith(TARGET_PREFIX) else ""
    auth = parse_authorization(request)
    credential = identify(auth, request.app[KEYS])
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        kind = "BatchRequestTooLong" if action == "SendMessageBatch" else "InvalidParameterValue"
        raise SqsError(kind, f"Request body must be at most {MAX_EDGE_BODY} bytes.") from None
    verify(request, body, auth, credential)
    check_region(request.app[SQS_STATE].regions, auth.region)
    if action in UNSUPPORTED:
        raise SqsError("UnsupportedOperation", f"{action} is not supported by this SQS endpoint.")
    entry = ACTIONS.get(action)
    if entry is None:
        raise SqsError(
            "InvalidAction", f"The action {action or target or '(none)'} is not valid for this endpoint."
        )
    handler, permission = entry
    if not allowed(credential, permission):
        raise SqsError(
            "AccessDenied",
            f"Access to the resource is denied: credential {credential.id} (role {credential.role}) may not"
            f" call {action}.",
        )
    content_type = request.headers.get("Content-Type", "")
    if not content_type.startswith(("application/x-amz-json-1.0", "application/json")):
        raise SqsError("UnsupportedOperation", "Only the AWS JSON 1.0 protocol is supported.")
    try:
        params = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise SqsError("SerializationException", f"The request body is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    # The shared checker (queue_core.machine.text), as on every API, for what orjson lets through: it
    # refuses lone surrogates and non-finite numbers itself, but takes integers up to 2**64 - 1, beyond
    # what the store holds. Its text walk would never fail on orjson's output, so only numbers are walked.
    # Names and ids are matched whole by their own rules (fullmatch), bodies and attributes by SQS's set.
    check_json_numbers(params, "request body")
    return await handler(Call(request, credential, auth.region, params))
