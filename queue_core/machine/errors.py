"""One small error family for the core; each API face maps `code` to its own status and body in one place."""

from __future__ import annotations

from typing import Any, ClassVar


class QueueError(Exception):
    """Base of every error the core raises on purpose; `code` is stable and machine-readable."""

    code: ClassVar[str] = "queue_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class NotFound(QueueError):
    code = "not_found"


class QueueNotFound(NotFound):
    code = "queue_not_found"


class InvalidArgument(QueueError):
    code = "invalid_argument"


class InvalidReceipt(InvalidArgument):
    code = "invalid_receipt"


class AlreadyExists(QueueError):
    code = "already_exists"


class StaleClaim(QueueError):
    """The claim was superseded: the group was claimed again since, with a newer fencing token."""

    code = "stale_claim"


class NotInFlight(QueueError):
    """The message is not claimed now (its claim expired or was released), so its visibility cannot be set."""

    code = "not_in_flight"


class TooLarge(QueueError):
    code = "too_large"


class LimitExceeded(QueueError):
    code = "limit_exceeded"


class Unavailable(QueueError):
    """The queue server cannot answer now (a remote one is down or restarting); retry later. Raised by
    the shells around the core, never by the state machine."""

    code = "unavailable"


def _subclasses(root: type[QueueError]) -> list[type[QueueError]]:
    out = [root]
    for sub in root.__subclasses__():
        out += _subclasses(sub)
    return out


def error_from_dict(body: dict[str, Any]) -> QueueError:
    """Rebuild a core error from its `to_dict()` form (a remote queue server's answer), same class by code."""
    code = str(body.get("code", "queue_error"))
    by_code = {cls.code: cls for cls in _subclasses(QueueError)}
    details = body.get("details")
    error = by_code.get(code, QueueError)(
        str(body.get("message", code)), **(details if isinstance(details, dict) else {})
    )
    return error
