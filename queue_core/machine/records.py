"""In-memory records of the state machine and the results it returns.

Bodies are not kept here: the core sees a body once (size, content hash), hands it to the store in an
effect and from then on holds only ~100 bytes of metadata per message; the shell joins bodies back in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

KEY_SHIFT = 20  # key = (receipt time in ms << 20) | counter: unique, monotonic, and it dates the message


def sent_at_of(key: int) -> float:
    return (key >> KEY_SHIFT) / 1000.0


def message_id_for(key: int) -> str:
    return f"{key:016x}"


def format_receipt(token: int, message_id: str) -> str:
    return f"{token:x}.{message_id}"


class Message:
    """One queued message. `token` is the fencing token of the newest claim on it (0: never claimed)."""

    __slots__ = (
        "available_at",
        "claim_expires",
        "first_receive_at",
        "group",
        "id",
        "key",
        "origin",
        "receive_count",
        "token",
    )

    def __init__(self, key: int, message_id: str, group: GroupState, available_at: float = 0.0) -> None:
        self.key = key
        self.id = message_id
        self.group = group
        self.available_at = available_at  # 0.0 once deliverable (delay over)
        self.receive_count = 0
        self.first_receive_at = 0.0
        self.token = 0
        self.claim_expires = 0.0  # 0.0: not claimed
        self.origin: str | None = None  # source queue, for dead-lettered messages

    @property
    def seq(self) -> int:
        """Per-group sequence id: the receipt key, monotonic within every group and across restarts."""
        return self.key

    @property
    def sent_at(self) -> float:
        return sent_at_of(self.key)


class GroupState:
    """A group's messages in receipt order. Only the current claim's messages are in `claimed`."""

    __slots__ = ("claim_worker", "claimed", "floor", "messages", "name", "partition", "queue")

    def __init__(self, name: str, queue: Any, partition: int) -> None:
        self.name = name
        self.queue = queue  # QueueState (Any avoids an import cycle)
        self.partition = partition
        self.messages: deque[Message] = deque()
        self.claimed: list[Message] = []
        self.floor = 0  # newest fencing token issued for this group; older ones are stale
        self.claim_worker = ""

    def head_available(self) -> bool:
        return bool(self.messages) and not self.claimed and self.messages[0].available_at == 0.0


@dataclass(slots=True)
class SendResult:
    message_id: str
    group: str
    seq: int
    partition: int
    duplicate: bool = False


@dataclass(slots=True)
class Delivery:
    """A claimed message as the core knows it; the shell adds the body from the store."""

    key: int
    message_id: str
    group: str
    seq: int
    token: int
    receipt: str
    receive_count: int
    sent_at: float
    first_receive_at: float
    claim_expires: float
    origin: str | None = None


@dataclass(slots=True)
class PeekItem:
    key: int
    message_id: str
    group: str
    seq: int
    sent_at: float
    receive_count: int
    claimed: bool


@dataclass(slots=True)
class AckOutcome:
    """Per-item result of ack/renew/release: `ok` or an error code, never an exception for the batch."""

    message_id: str
    status: str  # "ok" | "gone" | error code
    message: str = ""


@dataclass(slots=True)
class QueueMetrics:
    name: str
    visible: int
    in_flight: int
    delayed: int
    total: int
    groups: int
    oldest_age: float
    age_of_first_attempt: float
    sent: int
    received: int
    deleted: int
    dead_lettered: int

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class MoveStatus:
    id: str
    source: str
    destination: str
    moved: int = 0
    remaining: int = 0
    state: str = "running"  # running | done | failed | cancelled
    error: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    limit_key: int = 0
    pending_groups: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "from": self.source,
            "to": self.destination,
            "moved": self.moved,
            "remaining": self.remaining,
            "state": self.state,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
