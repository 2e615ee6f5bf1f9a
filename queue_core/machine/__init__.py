"""The sans-I/O strict-queue state machine: no clocks, sockets, threads or randomness (ruff enforces it)."""

from .attributes import GroupPolicy, QueueAttributes
from .core import QueueCore
from .errors import (
    AlreadyExists,
    InvalidArgument,
    InvalidReceipt,
    LimitExceeded,
    NotFound,
    NotInFlight,
    NotOwner,
    QueueError,
    QueueNotFound,
    StaleClaim,
    TooLarge,
    Unavailable,
    error_class,
    error_from_dict,
)
from .inputs import SendRequest, Snapshot, parse_receipt
from .records import (
    AckOutcome,
    Delivery,
    MoveStatus,
    PeekItem,
    QueueMetrics,
    Redriven,
    SendResult,
)

__all__ = [
    "AckOutcome",
    "AlreadyExists",
    "Delivery",
    "GroupPolicy",
    "InvalidArgument",
    "InvalidReceipt",
    "LimitExceeded",
    "MoveStatus",
    "NotFound",
    "NotInFlight",
    "NotOwner",
    "PeekItem",
    "QueueAttributes",
    "QueueCore",
    "QueueError",
    "QueueMetrics",
    "QueueNotFound",
    "Redriven",
    "SendRequest",
    "SendResult",
    "Snapshot",
    "StaleClaim",
    "TooLarge",
    "Unavailable",
    "error_class",
    "error_from_dict",
    "parse_receipt",
]
