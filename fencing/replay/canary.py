"""The canary hook: what a later live rollout (the patent's "1% of calls, then 2%") builds on.

`strictq replay` is offline. A live canary needs three more things, and this module fixes their shape
so the control-message issue can add the rollout without touching replay:

- which groups a canary worker takes: `in_canary(group, percent)` picks values of the strict order
  parameter by a stable hash (the patent assigns a client a range of those values), so a group stays on
  one side while the percentage holds, and raising the percentage only adds groups;
- how its work is judged: `compare_live(reference, candidate)` is exactly replay's per-message
  comparison (`fencing.replay.compare`), for a message the current worker processed for real
  (reference, recorded) and the canary processed mimic-fenced (`strictq fence --mode mimic`), its calls
  answered from that recording;
- when to go on: `evaluate(comparisons, stage)` turns the comparisons of a stage into a verdict
  (`promote`, `hold`, `rollback`) against the stage's divergence budget; `DEFAULT_STAGES` are the
  patent's 1% for 24 h, then 2% for 12 h.

Nothing here sends control messages, changes fences or moves traffic: `strictq rollout` (strictq.rollout_cli)
does, with `failure_gate` judging each live step from failure management's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fencing.replay.compare import MessageComparison, compare_message
from fencing.replay.stories import MessageStory
from queue_core.machine.routing import BUCKETS, in_share

__all__ = ["BUCKETS", "in_canary"]


@dataclass(frozen=True, slots=True)
class CanaryStage:
    percent: float  # of groups (strict order parameter values) the canary takes
    duration: float  # seconds the stage must run clean before the next
    max_divergence_rate: float = 0.0  # diverging / compared messages tolerated


DEFAULT_STAGES = (CanaryStage(1.0, 24 * 3600.0), CanaryStage(2.0, 12 * 3600.0))


@dataclass(frozen=True, slots=True)
class CanaryVerdict:
    decision: str  # "promote" | "hold" | "rollback"
    compared: int
    diverged: int
    reason: str


def in_canary(group: str, percent: float) -> bool:
    """Whether the canary processes this group at `percent` (stable, monotonic in `percent`): the core's
    routing share (queue_core.machine.routing.in_share), so a live rollout and its replay pick alike."""
    return in_share(group, percent)


def compare_live(reference: MessageStory, candidate: MessageStory, *, attempts: int = 1) -> MessageComparison:
    """Replay's comparison of one message, for a canary's live work."""
    return compare_message(reference, candidate, attempts=attempts)


def evaluate(
    comparisons: Sequence[MessageComparison], stage: CanaryStage, *, elapsed: float, min_messages: int = 100
) -> CanaryVerdict:
    """Roll back as soon as the divergence budget is exceeded; promote once the stage ran its duration
    with enough messages compared; hold otherwise."""
    compared = len(comparisons)
    diverged = sum(c.diverged for c in comparisons)
    rate = diverged / compared if compared else 0.0
    if compared and rate > stage.max_divergence_rate:
        return CanaryVerdict("rollback", compared, diverged, f"divergence rate {rate:.2%} over the budget")
    if elapsed >= stage.duration and compared >= min_messages:
        return CanaryVerdict("promote", compared, diverged, "the stage ran clean for its duration")
    return CanaryVerdict(
        "hold", compared, diverged, "the stage has not run long enough or seen enough messages"
    )


@dataclass(frozen=True, slots=True)
class Tally:
    """A side's attempt results in a live rollout step (GET /admin/v1/queues/{q}/routing's `versions`)."""

    succeeded: int = 0
    failed: int = 0
    fenced: int = 0  # of the side's workers

    @property
    def attempts(self) -> int:
        return self.succeeded + self.failed

    @property
    def failure_rate(self) -> float:
        return self.failed / self.attempts if self.attempts else 0.0


def failure_gate(
    canary: Tally,
    rest: Tally,
    *,
    elapsed: float,
    duration: float,
    min_attempts: int,
    max_increase: float,
) -> CanaryVerdict:
    """A live step's verdict from failure management's figures: roll back at once when a canary worker is
    fenced, or when (with `min_attempts` seen) the canary fails more than `max_increase` above the rest's
    rate; promote once the step ran `duration` with `min_attempts` judged; hold otherwise."""
    if canary.fenced:
        return CanaryVerdict(
            "rollback", canary.attempts, canary.failed, f"{canary.fenced} canary worker(s) fenced"
        )
    if canary.attempts >= min_attempts and canary.failure_rate > rest.failure_rate + max_increase:
        reason = (
            f"canary failure rate {canary.failure_rate:.1%} over the rest's {rest.failure_rate:.1%}"
            f" + {max_increase:.1%}"
        )
        return CanaryVerdict("rollback", canary.attempts, canary.failed, reason)
    if elapsed >= duration and canary.attempts >= min_attempts:
        return CanaryVerdict("promote", canary.attempts, canary.failed, "the step ran clean for its duration")
    waiting = "its duration" if elapsed < duration else f"{min_attempts - canary.attempts} more attempts"
    return CanaryVerdict("hold", canary.attempts, canary.failed, f"waiting for {waiting}")
