"""Backpressure at the edge: a queue whose backlog is past its thresholds slows its producers, in proportion
to the backlog, so a backlog that grows faster than workers drain it stops growing before it becomes
insurmountable (the backlog article's "slow the producers" protection).

A queue opts in with the attributes `backpressure_age` (seconds: the age of its oldest message) and
`backpressure_depth` (messages); 0 turns a threshold off, and both are off by default: order processing
may prefer to accept everything and drain later. Past a threshold the edge admits only the share
`threshold / observed` of the sends (the smaller share of the two thresholds; at least MIN_SHARE, so the
producers' sends keep testing the queue), spread evenly by a credit counter per queue, and refuses the rest
with 429 `backpressure` and Retry-After (SQS: RequestThrottled), saying why. It releases as soon as the
backlog is back under its thresholds.

Sans-I/O: `admit(queue, attributes, metrics, now)` takes what the faces read; `BackpressureGate` keeps
each queue's metrics for REFRESH seconds so a send costs a metrics read at most once a second per queue
(and none for a queue without thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.errors import StrictqError
from queue_core.machine.attributes import QueueAttributes
from queue_core.machine.records import QueueMetrics

MIN_SHARE = 0.05  # of the sends still admitted however large the backlog
REFRESH = 1.0  # seconds a queue's metrics are reused for
MAX_QUEUES = 100_000  # cached queues, forgotten oldest first past this (memory stays bounded)


class BackpressureRefused(StrictqError):
    """A send to a queue whose backlog is past its thresholds: 429, retriable after `retry_after`."""

    status = 429
    retriable = True
    code = "backpressure"


@dataclass(frozen=True, slots=True)
class Pressure:
    """How hard a queue pushes back now: the share of sends admitted (1.0: none refused) and why."""

    share: float
    reason: str = ""


def pressure(attributes: QueueAttributes, metrics: QueueMetrics) -> Pressure:
    """The share of sends to admit for this backlog (the smaller of the thresholds' shares)."""
    share, reasons = 1.0, []
    age_limit, depth_limit = attributes.backpressure_age, attributes.backpressure_depth
    if age_limit > 0 and metrics.oldest_age > age_limit:
        share = min(share, age_limit / metrics.oldest_age)
        reasons.append(f"its oldest message is {metrics.oldest_age:.0f} s old (threshold {age_limit:g} s)")
    if depth_limit > 0 and metrics.total > depth_limit:
        share = min(share, depth_limit / metrics.total)
        reasons.append(f"it holds {metrics.total} messages (threshold {depth_limit})")
    if share >= 1.0:
        return Pressure(1.0)
    return Pressure(max(MIN_SHARE, share), " and ".join(reasons))


@dataclass(slots=True)
class _QueueState:
    metrics: QueueMetrics | None = None
    read_at: float = float("-inf")
    credit: float = 0.0
    refused: int = 0


@dataclass
class BackpressureGate:
    """Each queue's last metrics and admission credit (one per edge process)."""

    _queues: dict[str, _QueueState] = field(default_factory=dict)

    def wants_metrics(self, queue: str, attributes: QueueAttributes, now: float) -> bool:
        """Whether the caller should read the queue's metrics now (thresholds set, cache stale)."""
        if attributes.backpressure_age <= 0 and attributes.backpressure_depth <= 0:
            return False
        state = self._queues.get(queue)
        return state is None or now - state.read_at >= REFRESH

    def update(self, queue: str, metrics: QueueMetrics, now: float) -> None:
        state = self._queues.get(queue)
        if state is None:
            if len(self._queues) >= MAX_QUEUES:
                del self._queues[next(iter(self._queues))]
            state = self._queues[queue] = _QueueState()
        state.metrics, state.read_at = metrics, now

    def admit(self, queue: str, visible_name: str, attributes: QueueAttributes) -> None:
        """Admit one send request or raise BackpressureRefused; sends are admitted evenly at the share."""
        state = self._queues.get(queue)
        if state is None or state.metrics is None:
            return
        push = pressure(attributes, state.metrics)
        if push.share >= 1.0:
            state.credit = 0.0
            return
        state.credit += push.share
        if state.credit >= 1.0:
            state.credit -= 1.0
            return
        state.refused += 1
        wait = (1.0 - state.credit) / push.share * REFRESH / 10  # a tenth of a refresh per missing credit
        error = BackpressureRefused(
            f"queue {visible_name!r} is slowing its producers: {push.reason}; {push.share:.0%} of sends are "
            "admitted until its workers catch up",
            queue=visible_name,
            admitted_share=round(push.share, 3),
            oldest_age=round(state.metrics.oldest_age, 3),
            messages=state.metrics.total,
        )
        error.retry_after = max(wait, 0.001)
        raise error

    def forget(self, queue: str) -> None:
        """Drop the queue's cached metrics and credit (its thresholds changed); its refusals count on."""
        state = self._queues.get(queue)
        if state is not None:
            state.metrics, state.read_at, state.credit = None, float("-inf"), 0.0

    def refusals(self) -> list[tuple[str, int]]:
        """(queue, sends refused) of every queue that refused one, for metrics."""
        return [(queue, state.refused) for queue, state in self._queues.items() if state.refused]

    def refused(self, queue: str) -> int:
        state = self._queues.get(queue)
        return 0 if state is None else state.refused
