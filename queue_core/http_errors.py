"""aiohttp's own error answers as JSON: the one middleware of the gateway app and the queue server app.

An unknown route, a wrong method or a body over the cap is answered by aiohttp itself, in text/plain,
unless a middleware turns it into JSON. Every error of these apps is JSON: `{"error": {"code", "message"}}`,
or under /admin/ that API's `{"code", "message"}` (queue_core.admin_http). The faces answer their own errors
in their own dialects (the SQS face's AWS JSON at `POST /`, the EmoDB face's catch-all), so this only sees
what no face took.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import ClientPayloadError, web

HTTP_ERROR_CODES = {404: "no_such_route", 405: "method_not_allowed", 413: "request_too_large"}


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
        code = HTTP_ERROR_CODES.get(exc.status, "http_error")
        message = f"{exc.reason}: {request.method} {request.path}" if exc.status in (404, 405) else exc.reason
        error = {"code": code, "message": message}
        body = error if request.path.startswith("/admin/") else {"error": error}
        response = web.Response(body=orjson.dumps(body), status=exc.status, content_type="application/json")
        if isinstance(exc, web.HTTPMethodNotAllowed):
            response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        return response
