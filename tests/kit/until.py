"""The one poll-until of the test suite, sync and async: wait for a condition another process or task
makes true, with a bound, and fail naming what never happened."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

TIMEOUT = 15.0
INTERVAL = 0.02


async def until[T](
    predicate: Callable[[], T | Awaitable[T]],
    within: float = TIMEOUT,
    *,
    interval: float = INTERVAL,
    what: str = "condition",
) -> T:
    """Poll `predicate` (plain or async) until it returns something truthy; return that value.

    Raises AssertionError after `within` seconds, naming `what` and the last value seen."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {within}s (last value {value!r})")
        await asyncio.sleep(interval)


def until_sync[T](
    predicate: Callable[[], T],
    within: float = TIMEOUT,
    *,
    interval: float = INTERVAL,
    what: str = "condition",
) -> T:
    """`until` for threads and blocking code: the same contract without an event loop."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {within}s (last value {value!r})")
        time.sleep(interval)
