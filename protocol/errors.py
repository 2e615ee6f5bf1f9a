"""One error model: each error class carries its HTTP status, whether a retry may succeed, and its code.

Like h11's `error_status_hint`, the status travels with the error, so no API keeps its own table that could
disagree with another's. `StrictqError` is the base of every error strictq answers on purpose (the core's
`QueueError` family, fences, admin, store, failure management, search); `queue_core.http_errors` renders any
of them as the one JSON body of the internal API, the admin routes, the EmoDB face and search:

    {"error": {"code": "stale_claim", "message": "...", "retriable": true?, "details": {...}?}}

`retriable` is present (true) only when the same request may succeed later unchanged. Codes are snake_case,
one casing everywhere (docs/errors.md lists them). The SQS face translates codes into AWS's errors
(gateway/sqs_errors.py), the one other dialect. Clients read bodies with `parse_error`, which also takes the
flat `{"code", "message"}` body and the kebab-case codes older servers answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# aiohttp's own answers (no route, wrong method, body over the cap) and the last-resort ones.
NO_SUCH_ROUTE = "no_such_route"
METHOD_NOT_ALLOWED = "method_not_allowed"
REQUEST_TOO_LARGE = "request_too_large"
BAD_REQUEST = "bad_request"
HTTP_ERROR = "http_error"
INTERNAL = "internal"
BAD_RESPONSE = "bad_response"  # a client's code for an answer that is not the JSON it expected
NOT_READY = "not_ready"  # /readyz of the gateway, the queue server and the proxy admin app (503, retriable)
TIMEOUT = "timeout"  # aiohttp gave up on a handler (504)
# A cluster node asked for a partition it does not own now (421, retriable: the owner map moved on; the
# gateway re-reads it and sends the request to the new owner).
NOT_OWNER = "not_owner"
# A tenant's sends over its rate at the edge (429 with Retry-After, retriable; SQS: RequestThrottled).
THROTTLED = "throttled"
HTTP_ERROR_CODES = {
    400: BAD_REQUEST,
    404: NO_SUCH_ROUTE,
    405: METHOD_NOT_ALLOWED,
    413: REQUEST_TOO_LARGE,
    504: TIMEOUT,
}

# The egress proxy's refusals (its JSON body's `code`; the wire log's `code` field), docs/errors.md.
STALE_LEASE = "stale_lease"  # 409
UNSYNCED = "unsynced"  # 503
FENCED = "fenced"  # 403
UNMATCHED = "unmatched"  # 503
TENANT_NOT_SERVED = "tenant_not_served"  # 407
MALFORMED_TAGS = "malformed_tags"  # 400
# 407: why the proxy did not take the worker's Proxy-Authorization.
PROXY_AUTH_REQUIRED = "proxy_auth_required"
BAD_PROXY_AUTHORIZATION = "bad_proxy_authorization"
BAD_CREDENTIALS = "bad_credentials"
ROLE_NOT_ALLOWED = "role_not_allowed"


class StrictqError(Exception):
    """Base of every error strictq answers on purpose; subclasses set `status`, `retriable` and `code`.

    `message` is for people and is shown to the caller; `details` (JSON values) help a program act on the
    error. `public_message`, when set, is shown instead of `message` (which is then only logged), for errors
    whose text may carry internals. `retry_after` (seconds), when set, becomes a Retry-After header."""

    status: int = 400
    retriable: bool = False
    code: str = BAD_REQUEST
    public_message: str | None = None
    retry_after: float | None = None

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The inner object of the error body (also a batch item's `error`)."""
        message = self.public_message if self.public_message is not None else self.message
        return error_object(self.code, message, retriable=self.retriable, details=self.details or None)


class RequestTooLarge(StrictqError):
    """A request body over a route's cap, as aiohttp answers one over the app's cap."""

    status = 413
    code = REQUEST_TOO_LARGE


class Unauthorized(StrictqError):
    """No credential, or one the key file does not have."""

    status = 401
    code = "unauthorized"


class Forbidden(StrictqError):
    """A credential whose role may not use this route, or a name outside its tenant."""

    status = 403
    code = "forbidden"


class ShuttingDown(StrictqError):
    """The process is stopping; the same request to its successor may succeed."""

    status = 503
    retriable = True
    code = "shutting_down"


def error_object(
    code: str, message: str, *, retriable: bool = False, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`{"code", "message", "retriable"?, "details"?}`: the object under the body's `error` key."""
    error: dict[str, Any] = {"code": code, "message": message}
    if retriable:
        error["retriable"] = True
    if details:
        error["details"] = details
    return error


def error_body(code: str, message: str, *, retriable: bool = False, **details: Any) -> dict[str, Any]:
    """The one error body shape: `{"error": {"code", "message", "retriable"?, "details"?}}`."""
    return {"error": error_object(code, message, retriable=retriable, details=details or None)}


def snake_code(code: str) -> str:
    """A code in the one casing: older servers answered some in kebab case (`stale-lease`)."""
    return code.replace("-", "_")


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error answer as a client reads it."""

    code: str
    message: str
    retriable: bool = False
    details: dict[str, Any] = field(default_factory=dict)


def parse_error(payload: object, default_code: str = HTTP_ERROR) -> ErrorInfo:
    """The error in an answer's JSON: `{"error": {...}}`, or the flat `{"code", "message"}` of older admin
    routes and of the egress proxy; codes in snake case whatever the server sent."""
    inner = payload.get("error") if isinstance(payload, dict) else None
    source = inner if isinstance(inner, dict) else payload if isinstance(payload, dict) else {}
    code = source.get("code")
    message = source.get("message")
    details = source.get("details")
    return ErrorInfo(
        code=snake_code(code) if isinstance(code, str) and code else default_code,
        message=message if isinstance(message, str) else "",
        retriable=source.get("retriable") is True,
        details=details if isinstance(details, dict) else {},
    )
