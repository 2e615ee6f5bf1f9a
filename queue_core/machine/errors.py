"""One small error family for the core. Each class carries its HTTP status, whether a retry may succeed and
its snake_case code (protocol.errors.StrictqError); every API renders them through one renderer
(queue_core.http_errors), the SQS face through its AWS table (gateway/sqs_errors.py). docs/errors.md."""

from __future__ import annotations

from typing import Any

from protocol.errors import NOT_OWNER, StrictqError, snake_code


class QueueError(StrictqError):
    """Base of every error the core raises on purpose; `code` is stable and machine-readable."""

    status = 400
    code = "queue_error"


class NotFound(QueueError):
    status = 404
    code = "not_found"


class QueueNotFound(NotFound):
    code = "queue_not_found"


class InvalidArgument(QueueError):
    code = "invalid_argument"


class InvalidReceipt(InvalidArgument):
    code = "invalid_receipt"


class AlreadyExists(QueueError):
    status = 409
    code = "already_exists"


class StaleClaim(QueueError):
    """The claim was superseded: the group was claimed again since, with a newer fencing token."""

    status = 409
    code = "stale_claim"


class Gone(QueueError):
    """The message no longer exists (someone acked it). An ack of it succeeds; where the call cannot (the
    EmoDB face's fenced renew: the lease it would keep alive is lost) it is refused with this status."""

    status = 409
    code = "gone"


class NotInFlight(QueueError):
    """The message is not claimed now (its claim expired or was released), so its visibility cannot be set."""

    status = 409
    code = "not_in_flight"


class TooLarge(QueueError):
    status = 413
    code = "too_large"


class LimitExceeded(QueueError):
    """A count limit (group policy overrides per queue, ...) is reached: 429; a retry succeeds only once
    room is made, so not `retriable` unless an instance sets `retry_after`."""

    status = 429
    code = "limit_exceeded"


class Unavailable(QueueError):
    """The queue server cannot answer now (a remote one is down or restarting); retry later. Raised by
    the shells around the core, never by the state machine."""

    status = 503
    retriable = True
    code = "unavailable"


class NotOwner(QueueError):
    """A cluster node does not serve the request's partition now (another node owns it, or nobody does
    yet): 421 Misdirected Request. Retriable: the same request to the partition's current owner may
    succeed; the cluster gateway re-reads its owner map and retries (cluster/backend.py)."""

    status = 421
    retriable = True
    code = NOT_OWNER


def _subclasses(root: type[QueueError]) -> list[type[QueueError]]:
    out = [root]
    for sub in root.__subclasses__():
        out += _subclasses(sub)
    return out


def error_class(code: str) -> type[QueueError]:
    """The core error class of a code (either casing), `QueueError` itself for a code it does not know."""
    return next((cls for cls in _subclasses(QueueError) if cls.code == snake_code(code)), QueueError)


def error_from_dict(body: dict[str, Any]) -> QueueError:
    """Rebuild a core error from its `to_dict()` form (a remote queue server's answer), same class by code;
    a code no class has keeps its code on a plain QueueError."""
    code = snake_code(str(body.get("code", "queue_error")))
    details = body.get("details")
    message = str(body.get("message", code))
    error = error_class(code)(message, **(details if isinstance(details, dict) else {}))
    if error.code != code:
        error.code = code
    return error
