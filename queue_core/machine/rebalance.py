"""Rebalancing a queue's workers by their heartbeats, sans-I/O (docs/fleet.md §rebalancing).

The patent: "put one or more clients to sleep if the heartbeats indicate there are too many active clients
for the current load". A queue's policy (none by default: nobody is put to sleep) sends surplus idle
workers to sleep while the queue's backlog is empty, keeping `min_active` awake, and wakes the sleepers
once the backlog reaches `wake_backlog` messages ready to deliver, or its oldest message is `wake_age`
seconds old. A worker is idle after `idle_heartbeats` heartbeats in a row with nothing in flight and no
message received. `decide` is the pure decision; queue_core.machine.fleet issues the sleep and wake controls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class RebalancePolicy:
    enabled: bool = True
    min_active: int = 1
    idle_heartbeats: int = 3
    wake_backlog: int = 1
    wake_age: float = 0.0  # seconds; 0: the age of the oldest message wakes nobody

    def validate(self) -> RebalancePolicy:
        """InvalidArgument naming the setting that is out of range."""
        if not isinstance(self.enabled, bool):
            raise InvalidArgument("enabled must be true or false", field="enabled")
        for name, low in (("min_active", 0), ("idle_heartbeats", 1), ("wake_backlog", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1_000_000:
                raise InvalidArgument(f"{name} must be an integer from {low} to 1000000", field=name)
        age = self.wake_age
        if isinstance(age, bool) or not isinstance(age, int | float) or not math.isfinite(age) or age < 0:
            raise InvalidArgument("wake_age must be a number of seconds >= 0", field="wake_age")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RebalancePolicy:
        """A policy from JSON (an admin request, a stored row); unknown settings are refused."""
        known = set(cls.__slots__)
        for name in data:
            if name not in known:
                raise InvalidArgument(
                    f"{name!r} is not a rebalancing setting ({', '.join(sorted(known))})", field=name
                )
        return cls(**dict(data)).validate()


class _Load(Protocol):
    @property
    def in_flight(self) -> int: ...


class Member(Protocol):
    """What the decision needs of a registry entry (queue_core.machine.fleet.WorkerEntry)."""

    @property
    def worker(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def desired(self) -> str: ...
    @property
    def idle_beats(self) -> int: ...
    @property
    def first_seen(self) -> float: ...
    @property
    def load(self) -> _Load: ...


@dataclass(frozen=True, slots=True)
class Decision:
    sleep: tuple[str, ...] = ()
    wake: tuple[str, ...] = ()
    reason: str = ""


def decide(policy: RebalancePolicy, workers: Sequence[Member], backlog: int, oldest_age: float) -> Decision:
    """Which of a queue's live workers (with no state change pending) to put to sleep or wake."""
    if not policy.enabled:
        return Decision()
    sleeping = [w.worker for w in workers if w.desired == "sleeping"]
    aged = policy.wake_age > 0 and backlog > 0 and oldest_age >= policy.wake_age
    if sleeping and (backlog >= policy.wake_backlog or aged):
        why = (
            f"backlog {backlog} >= wake_backlog {policy.wake_backlog}"
            if backlog >= policy.wake_backlog
            else f"oldest message {oldest_age:.1f}s >= wake_age {policy.wake_age:g}s"
        )
        return Decision(wake=tuple(sorted(sleeping)), reason=f"rebalance: {why}")
    if backlog > 0:
        return Decision()
    active = [w for w in workers if w.desired == "active" and w.state == "active"]
    surplus = len(active) - policy.min_active
    if surplus <= 0:
        return Decision()
    idle = [w for w in active if w.idle_beats >= policy.idle_heartbeats and w.load.in_flight == 0]
    # The newest workers sleep first: the longest-running ones keep their warm caches.
    idle.sort(key=lambda w: (-w.first_seen, w.worker))
    chosen = tuple(w.worker for w in idle[:surplus])
    if not chosen:
        return Decision()
    reason = (
        f"rebalance: backlog empty, {len(active)} active > min_active {policy.min_active}, "
        f"idle for {policy.idle_heartbeats}+ heartbeats"
    )
    return Decision(sleep=chosen, reason=reason)
