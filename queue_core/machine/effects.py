"""Effects: what the state machine asks its shell to make durable or publish, in order.

The store applies them in the order drained; a response that depends on one is sent only after the
commit that contains it, so acknowledged means durable.

Not frozen: a frozen dataclass's __init__ costs ~6x a plain one (1.7 vs 0.3 µs measured), and these are
built for every message on the hot path. Treat them as immutable all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class QueueSaved:
    qid: int
    name: str
    attributes: dict[str, Any]
    created_at: float


@dataclass(slots=True)
class QueueDropped:
    qid: int


@dataclass(slots=True)
class MessageInserted:
    qid: int
    key: int
    message_id: str
    group: str
    body: bytes
    content_type: str
    extra: bytes  # opaque to the core: face-specific attributes (e.g. SQS MessageAttributes)
    available_at: float
    digest: bytes | None  # content hash, kept for dedup queues only
    # The sending request's id, stored beside the body (last, with a default: cluster frames written
    # before it existed decode without it, cluster.codec)
    request_id: str | None = None


@dataclass(slots=True)
class DedupSaved:
    qid: int
    dedup_key: str
    message_id: str
    seq: int
    group: str
    expires_at: float


@dataclass(slots=True)
class ClaimRow:
    key: int
    token: int
    expires: float
    receive_count: int
    first_receive_at: float


@dataclass(slots=True)
class MessagesClaimed:
    claims: tuple[ClaimRow, ...]
    worker: str


@dataclass(slots=True)
class ClaimsChanged:
    """Renew or release: new claim expiry per key (a past time means released)."""

    changes: tuple[tuple[int, float], ...]


@dataclass(slots=True)
class TokensRaised:
    """Messages delivered under an older claim of a group that a newer claim superseded."""

    keys: tuple[int, ...]
    token: int


@dataclass(slots=True)
class MessagesDeleted:
    keys: tuple[int, ...]


@dataclass(slots=True)
class MessagesMoved:
    keys: tuple[int, ...]
    qid: int
    origin: str | None  # set when dead-lettered: the queue it came from
    redrive: bool = False  # out of a dead-letter queue: origin and receive count are cleared


@dataclass(slots=True)
class QueuePurged:
    qid: int


@dataclass(slots=True)
class FloorRaised:
    """A group's valid fencing token rose; the egress proxy refuses calls tagged with anything older."""

    queue: str
    group: str
    token: int


@dataclass(slots=True)
class AttemptRecorded:
    """One counted attempt at a message (docs/failure-management.md): what the health monitor accounts per
    worker, and what the gateway writes to the wire log as a `log` record."""

    queue: str
    group: str
    message_id: str
    worker: str
    attempt: int  # the message's attempt number, 1-based
    outcome: str  # succeeded | failed | partial | expired
    reason: str
    signature: str  # "" when the worker gave none
    at: float


@dataclass(slots=True)
class AttemptLogged:
    """The full log data of one counted attempt, for the store's bounded per-group log (the last `keep`
    attempts of the group, none older than `expires`)."""

    qid: int
    group: str
    message_id: str
    worker: str
    attempt: int
    outcome: str
    reason: str
    signature: str
    steps: list[Any] | None
    partial: Any
    fields: Any
    duration_ms: float | None
    lease: int
    at: float
    keep: int
    expires: float


@dataclass(slots=True)
class HistorySaved:
    """Messages' attempt history (AttemptHistory.to_state()), or None: dropped with the message."""

    rows: tuple[tuple[int, int, str, dict[str, Any] | None], ...]  # (key, qid, message id, state)


@dataclass(slots=True)
class AvailabilityChanged:
    """Retry backoff: messages not deliverable before the given time."""

    rows: tuple[tuple[int, float], ...]  # (key, available_at)


@dataclass(slots=True)
class ReceiveCountsRestored:
    """`not_attempted`: the claim ends and the receive count is as before the delivery."""

    rows: tuple[tuple[int, float, int, float], ...]  # (key, claim ended at, receive_count, first_receive_at)


@dataclass(slots=True)
class GroupPolicySaved:
    qid: int
    group: str
    policy: dict[str, Any] | None  # None: the override is removed


@dataclass(slots=True)
class GroupEvent:
    """A retry-workflow decision about a group, published for the event log (not stored): `park`,
    `release`, `dead_letter` (message or group), `redrive`."""

    queue: str
    group: str
    event: str
    reason: str
    message_id: str
    at: float


@dataclass(slots=True)
class MessagesExpired:
    """Messages past their queue's TTL or retention left it (published for the log, not stored: their
    deletion or move is its own durable effect). `dead_letter_queue`: where they went; None: dropped."""

    queue: str
    count: int
    dead_letter_queue: str | None
    at: float


@dataclass(slots=True)
class ParticipationChanged:
    """A worker's poll declared `results` (it takes part in failure management) or stopped declaring it.
    Durable, so that after a restart its restored claims keep their meaning (a lapse counts or not)."""

    worker: str
    participates: bool
    at: float


@dataclass(slots=True)
class FenceSaved:
    """A worker's fence (queue_core.fences.Fence.to_dict()), or None: lifted. Written by the control hub
    through the group commit, so a fence is durable before the proxies hear of it."""

    worker: str
    fence: dict[str, Any] | None


@dataclass(slots=True)
class SuspensionSaved:
    """A suspended queue (`{"reason", "manual", "since"}`), or None: resumed (failure management)."""

    queue: str
    state: dict[str, Any] | None


@dataclass(slots=True)
class BlacklistSaved:
    """A blacklisted worker (`{"reason", "since", "until", "queue"}`), or None: lifted."""

    worker: str
    state: dict[str, Any] | None


@dataclass(slots=True)
class HandoverSaved:
    """A group's handover record (machine.handover.Handover.to_dict(), with any transferred state), or
    None: the handover is over (the state was used, the timeout let the group go, an operator released it)."""

    qid: int
    group: str
    record: dict[str, Any] | None


@dataclass(slots=True)
class FleetControlSaved:
    """A control message for a worker (queue_core.machine.fleet.Control.to_row()), or None: acknowledged
    or expired. Durable until then, across restarts (docs/fleet.md)."""

    control_id: str
    row: dict[str, Any] | None


@dataclass(slots=True)
class FleetPolicySaved:
    """A queue's rebalancing policy (queue_core.machine.rebalance.RebalancePolicy.to_dict()), or None."""

    queue: str
    policy: dict[str, Any] | None


Effect = (
    QueueSaved
    | QueueDropped
    | MessageInserted
    | DedupSaved
    | MessagesClaimed
    | ClaimsChanged
    | TokensRaised
    | MessagesDeleted
    | MessagesMoved
    | QueuePurged
    | FloorRaised
    | AttemptRecorded
    | AttemptLogged
    | HistorySaved
    | AvailabilityChanged
    | ReceiveCountsRestored
    | GroupPolicySaved
    | GroupEvent
    | MessagesExpired
    | ParticipationChanged
    | FenceSaved
    | SuspensionSaved
    | BlacklistSaved
    | HandoverSaved
    | FleetControlSaved
    | FleetPolicySaved
)

DURABLE_EFFECTS = (
    QueueSaved,
    QueueDropped,
    MessageInserted,
    DedupSaved,
    MessagesClaimed,
    ClaimsChanged,
    TokensRaised,
    MessagesDeleted,
    MessagesMoved,
    QueuePurged,
    AttemptLogged,
    HistorySaved,
    AvailabilityChanged,
    ReceiveCountsRestored,
    GroupPolicySaved,
    ParticipationChanged,
    FenceSaved,
    SuspensionSaved,
    BlacklistSaved,
    HandoverSaved,
    FleetControlSaved,
    FleetPolicySaved,
)
