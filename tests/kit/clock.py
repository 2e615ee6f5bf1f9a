"""The one fake clock of the test suite: a float you advance by hand.

The core takes `now` as an argument (read `.now`); the health monitor and the supervisor get `now` passed
in too; the wire-log writer and reader take a `clock` callable (pass the clock itself: calling it
returns `.now`). Nothing here reads the wall clock or sleeps.
"""

from __future__ import annotations

T0 = 1_000.0  # the default start (0.0 means "unset" for several core fields, so avoid it)


class FakeClock:
    """`now` moves only when a test calls `advance` (or sets it)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
