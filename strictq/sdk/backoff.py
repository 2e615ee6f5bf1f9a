"""Backoff with full jitter for what the worker retries on its own: polls that fail (gateway down, 5xx) and
calls the egress proxy refuses (403 block, 409 stale-lease, 407).

Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter"): after the n-th failure in a row the
wait is uniform in [0, min(cap, base * 2**(n-1))], so many workers that failed together do not come back
together; a success resets it. `grew` tells when the ceiling rose, so callers log once per step of the
backoff (a handful of lines up to the cap), never once per retry.
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Consecutive failures and the wait they call for."""

    def __init__(self, base: float, cap: float, *, rand: Callable[[], float] = random.random) -> None:
        if base <= 0 or cap < base:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = float(base)
        self.cap = float(cap)
        self.failures = 0  # in a row, since the last success
        self._rand = rand

    @property
    def active(self) -> bool:
        return self.failures > 0

    @property
    def ceiling(self) -> float:
        """The current bound of the wait (0 when not backing off)."""
        if self.failures == 0:
            return 0.0
        return min(self.cap, self.base * 2.0 ** min(self.failures - 1, 64))

    def fail(self) -> tuple[float, bool]:
        """One more failure: the wait to apply (full jitter) and whether the ceiling grew (log it)."""
        before = self.ceiling
        self.failures += 1
        return self._rand() * self.ceiling, self.ceiling > before

    def succeed(self) -> int:
        """A success: the backoff ends. Returns how many failures in a row it ended (0: none)."""
        failures, self.failures = self.failures, 0
        return failures
