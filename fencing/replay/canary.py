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

Nothing here sends control messages, changes fences or moves traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fencing.replay.compare import MessageComparison, compare_message
from fencing.replay.stories import MessageStory
from queue_core.machine.groups import group_hash

BUCKETS = 10_000  # percent resolution: 0.01 %


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
    """Whether the canary processes this group at `percent` (stable, monotonic in `percent`)."""
    if percent <= 0:
        return False
    return group_hash(group) % BUCKETS < percent * BUCKETS / 100.0


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
