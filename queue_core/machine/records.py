"""In-memory records of the state machine and the results it returns.

Bodies are not kept here: the core sees a body once (size, content hash), hands it to the store in an
effect and from then on holds only ~100 bytes of metadata per message; the shell joins bodies back in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from protocol.estimates import Estimate

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
        "history",
        "id",
        "key",
        "origin",
        "receive_count",
        "size",
        "token",
    )

    def __init__(
        self, key: int, message_id: str, group: GroupState, available_at: float = 0.0, size: int = 0
    ) -> None:
        self.key = key
        self.size = size  # body bytes: a worker declaring a smaller max_bytes is passed over for it
        self.id = message_id
        self.group = group
        self.available_at = available_at  # 0.0 once deliverable (delay over)
        self.receive_count = 0
        self.first_receive_at = 0.0
        self.token = 0
        self.claim_expires = 0.0  # 0.0: not claimed
        self.origin: str | None = None  # source queue, for dead-lettered messages
        self.history: AttemptHistory | None = None  # only once an attempt at it failed (most never do)

    @property
    def seq(self) -> int:
        """Per-group sequence id: the receipt key, monotonic within every group and across restarts."""
        return self.key

    @property
    def sent_at(self) -> float:
        return sent_at_of(self.key)


class GroupState:
    """A group's messages in receipt order. Only the current claim's messages are in `claimed`."""

    __slots__ = (
        "claim_worker",
        "claimed",
        "floor",
        "messages",
        "name",
        "partition",
        "pool",
        "queue",
        "sidelined",
    )

    def __init__(self, name: str, queue: Any, partition: int) -> None:
        self.name = name
        self.queue = queue  # QueueState (Any avoids an import cycle)
        self.partition = partition
        self.messages: deque[Message] = deque()
        self.claimed: list[Message] = []
        self.floor = 0  # newest fencing token issued for this group; older ones are stale
        self.claim_worker = ""
        # Scheduling of a queue shared by tenants (scheduling.py): the worker pool the group is served
        # by (-1: not placed), and whether it is in the spillover lane (until it drains).
        self.pool = -1
        self.sidelined = False

    def head_available(self) -> bool:
        if not self.messages or self.claimed:
            return False
        head = self.messages[0]
        return head.available_at == 0.0 and (head.history is None or not head.history.parked)


MAX_STEPS = 100  # steps kept per message (the newest); the API bounds each report's size too
MAX_FAILED_WORKERS = 16


class AttemptHistory:
    """A message's failed attempts: what the next delivery carries and what the retry policy reads.

    Exists only for messages with a failed attempt (failing heads and dead-lettered messages: few), so the
    common message pays one empty slot for it. `failures` is the retry budget used (reset by release and
    redrive); `attempts` counts every failed attempt ever. `reserved_for`/`reserve_until` (same-worker
    retry) are not durable: after a restart any worker may take the retry.
    """

    __slots__ = (
        "attempts",
        "exclude",
        "failed_workers",
        "failures",
        "last_outcome",
        "last_reason",
        "parked",
        "partial",
        "reserve_until",
        "reserved_for",
        "steps",
    )

    def __init__(self) -> None:
        self.attempts = 0
        self.failures = 0
        self.last_outcome = ""
        self.last_reason = ""
        self.steps: list[Any] = []
        self.partial: Any = None
        self.failed_workers: tuple[str, ...] = ()
        self.exclude = False  # same-worker retries are used up: failed workers wait while others poll
        self.parked = False
        self.reserved_for = ""
        self.reserve_until = 0.0

    def record(
        self, outcome: str, reason: str, worker: str, steps: Sequence[Any] | None, partial: Any
    ) -> None:
        self.attempts += 1
        self.failures += 1
        self.last_outcome = outcome
        self.last_reason = reason
        if steps:
            self.steps = merge_steps(self.steps, steps)
        if partial is not None:
            self.partial = partial
        if worker not in self.failed_workers:
            self.failed_workers = (*self.failed_workers, worker)[-MAX_FAILED_WORKERS:]

    def reset_budget(self) -> None:
        """Released or redriven: a fresh retry budget, nobody excluded; the log data stays."""
        self.failures = 0
        self.failed_workers = ()
        self.exclude = False
        self.parked = False
        self.reserved_for = ""
        self.reserve_until = 0.0

    def view(self) -> dict[str, Any]:
        """The poll item's `history` (a copy: the delivery must not change when the message does)."""
        return {
            "attempts": self.attempts,
            "last_outcome": self.last_outcome,
            "last_reason": self.last_reason,
            "steps": list(self.steps),
            "partial": self.partial,
        }

    def to_state(self) -> dict[str, Any]:
        """What the store keeps (everything but the reservation)."""
        return {
            "attempts": self.attempts,
            "failures": self.failures,
            "last_outcome": self.last_outcome,
            "last_reason": self.last_reason,
            "steps": self.steps,
            "partial": self.partial,
            "failed_workers": list(self.failed_workers),
            "exclude": self.exclude,
            "parked": self.parked,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> AttemptHistory:
        history = cls()
        history.attempts = int(state.get("attempts", 0))
        history.failures = int(state.get("failures", 0))
        history.last_outcome = str(state.get("last_outcome", ""))
        history.last_reason = str(state.get("last_reason", ""))
        steps = state.get("steps")
        history.steps = list(steps) if isinstance(steps, list) else []
        history.partial = state.get("partial")
        history.failed_workers = tuple(str(w) for w in state.get("failed_workers") or ())
        history.exclude = bool(state.get("exclude", False))
        history.parked = bool(state.get("parked", False))
        return history


def merge_steps(done: list[Any], new: Sequence[Any]) -> list[Any]:
    """Steps completed so far: a step reported again (same name) replaces its earlier entry in place,
    so a retry that verified a finished step does not list it twice; at most MAX_STEPS, the newest."""
    out = list(done)
    where = {_step_name(step): i for i, step in enumerate(out)}
    for step in new:
        name = _step_name(step)
        if name is not None and name in where:
            out[where[name]] = step
        else:
            if name is not None:
                where[name] = len(out)
            out.append(step)
    return out[-MAX_STEPS:]


def _step_name(step: Any) -> str | None:
    if isinstance(step, dict):
        name = step.get("name")
        return name if isinstance(name, str) else None
    return None


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
    history: dict[str, Any] | None = None  # prior failed attempts' log data (AttemptHistory.view)


@dataclass(slots=True)
class Received:
    """A delivered message with its body joined back in (by the shell, from its cache or the store; or
    read off the internal API by the remote backend, queue_core.wire)."""

    delivery: Delivery
    body: bytes
    content_type: str
    extra: bytes
    probe: bool = False  # a dummy message of failure management (queue_core.failures), not the core's
    request_id: str | None = None  # the id of the request that sent it (kept with the body, not the core)
    # The group's transferred local state (machine.handover), on its first item, for a poller taking state.
    state: Any = None
    # Seconds to process / pre-process it (machine.estimates), for pollers declaring `estimates`.
    estimate: Estimate | None = None


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
class ReportOutcome(AckOutcome):
    """Per-item result of `report`: also the message's group and attempt number (the delivery's receive
    count), which the gateway's wire-log `log` record names; "" and 0 when the message is unknown."""

    group: str = ""
    attempt: int = 0


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
    expired: int = 0  # past TTL or retention (dropped or dead-lettered)
    sidelined: int = 0  # groups moved to the spillover lane (scheduling.py)

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


# ------------------------------------------------------------------ the retry workflow's answers (retries.py)
@dataclass(frozen=True, slots=True)
class Redriven:
    """A redrive: messages back from the dead-letter queue at the group's head, parked ones released."""

    restored: int
    released: int


# ------------------------------------------------------------------------------ state transfer (handover.py)
HandoverPhase = Literal["draining", "awaiting", "waiting", "arrived"]
HELD_PHASES = frozenset(("draining", "awaiting", "waiting"))


@dataclass(slots=True)
class Handover:
    """One group moving away from `donor`. Phases: `draining` (a claim is still out: the move waits for
    it), `awaiting` (held; the donor is asked for the state until `deadline`), `waiting` (the timeout
    passed under policy `wait`: held until released), `arrived` (the state is here and the group is
    deliverable; `given` is the token of the claim it was handed to, 0 before)."""

    group: str
    donor: str
    since: float
    policy: Literal["proceed", "wait"]
    phase: HandoverPhase
    deadline: float = 0.0
    state: Any = None
    size: int = 0
    given: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "donor": self.donor,
            "since": self.since,
            "policy": self.policy,
            "phase": self.phase,
            "deadline": self.deadline,
            "state": self.state,
            "size": self.size,
            "given": self.given,
        }

    @classmethod
    def from_dict(cls, group: str, data: dict[str, Any]) -> Handover:
        return cls(
            group,
            str(data["donor"]),
            float(data["since"]),
            data["policy"],
            data["phase"],
            float(data.get("deadline", 0.0)),
            data.get("state"),
            int(data.get("size", 0)),
            int(data.get("given", 0)),
        )

    def view(self) -> dict[str, Any]:
        """What an operator sees (the state itself stays out: it may be large)."""
        out = self.to_dict()
        del out["state"]
        return {"group": self.group, **out}
