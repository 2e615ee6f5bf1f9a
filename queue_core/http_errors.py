"""The one rendering of errors as HTTP for the internal API, the admin routes, the EmoDB face and search.

Every error strictq answers on purpose is a `protocol.errors.StrictqError` carrying its status, whether it
is retriable and its snake_case code; `error_response` turns it (or aiohttp's own 404/405/413, or an
unexpected exception: 500 `internal`) into the one body `{"error": {"code", "message", "retriable"?,
"details"?}}` (docs/errors.md). Each app's middleware (or the admin routes' wrapper) calls it; no API keeps
a status table of its own. `json_http_errors` is the middleware of the gateway app (the queue server app's one
middleware, queue_core.server.errors_as_json, renders the same)
for what no handler took: an unknown route, a wrong method or a body over the cap, which aiohttp would
answer in text/plain. The SQS face answers in AWS's dialect instead (gateway/sqs_errors.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import ClientPayloadError, web

from protocol.errors import HTTP_ERROR, HTTP_ERROR_CODES, INTERNAL, StrictqError, error_body

log = logging.getLogger("strictq.errors")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(
    exc: BaseException,
    request: web.BaseRequest | None = None,
    logger: logging.Logger = log,
    request_id: str | None = None,
) -> web.Response:
    """The status and body of `exc`, taken from the error itself; anything unexpected is a logged 500.
    `request_id`: the request's id (the gateway's faces, gateway.request_ids), beside `error` in the body
    (`{"error": {...}, "request_id": ...}`: the request's, not the error's, as AWS puts RequestId beside
    Error), so a client reporting a failure can name the request an operator looks for."""
    if isinstance(exc, StrictqError):
        if exc.public_message is not None:  # the real text may quote data: the log has it, the caller not
            logger.error("%s: %s", exc.public_message, exc.message)
        response = json_response(with_request_id({"error": exc.to_dict()}, request_id), exc.status)
        if exc.retry_after is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return response
    if isinstance(exc, web.HTTPException):
        reason = exc.reason or "error"
        if request is not None and exc.status in (404, 405):  # aiohttp's own: name what was asked
            reason = f"{reason}: {request.method} {request.path}"
        body = error_body(HTTP_ERROR_CODES.get(exc.status, HTTP_ERROR), reason)
        response = json_response(with_request_id(body, request_id), exc.status)
        if isinstance(exc, web.HTTPMethodNotAllowed):
            response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        return response
    if request_id is not None:
        logger.error("unexpected error (request %s)", request_id, exc_info=exc)
    else:
        logger.error("unexpected error", exc_info=exc)
    body = error_body(INTERNAL, "internal error; see the server log")
    return json_response(with_request_id(body, request_id), 500)


def with_request_id(body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    """An error body naming its request (`request_id` beside `error`), when the request has an id."""
    if request_id is not None:
        body["request_id"] = request_id
    return body


def client_gone(request: web.BaseRequest, exc: BaseException | None) -> bool:
    """Whether `exc` is the client dropping its connection during the request (mid-body, typically:
    aiohttp's `request.read()` raises ConnectionResetError once the connection is lost). That is the
    client's doing, not a server error: the faces re-raise it and `http_guard.GuardedHandler` logs one
    WARNING line without a traceback. A reset of one of the server's own connections (to a queue server,
    say) while the client is still there stays an error."""
    if not isinstance(exc, ConnectionResetError | ClientPayloadError):
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


@web.middleware
async def json_http_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """An HTTPException of status >= 400 that is not JSON already, as JSON (see the module docstring)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        return error_response(exc, request)
