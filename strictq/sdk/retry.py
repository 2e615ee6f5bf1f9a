"""The one retry helper: whether a failed call to the gateway is retried, and how long to wait.

What is retried (`transient`, as the error itself says: strictq.sdk.errors.GatewayError): no answer at
all (connection refused or reset, a timeout), a server error (5xx), too many requests (429), and any
answer whose body says `"retriable": true` (protocol.errors). Everything else is permanent: a refusal
(4xx), an answer the SDK cannot read, and the setup errors (`SetupError`: a key the gateway does not
take, a certificate that cannot be verified), which no retry can fix. A call that is not idempotent (a
send) is retried only when the request cannot have been applied (`unsent`): the connection was refused
before it left, 429, or a retriable body.

The wait is `backoff.Backoff`'s full jitter. `Retry` holds one backoff for one kind of call: the worker's
polls keep theirs across polls (a poll that works resets it), an ack or a send gets a fresh one bounded by
a deadline (the claim's expiry, the producer's patience). It logs once per step of the backoff, not once
per retry, when asked to (`log_steps`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from .backoff import Backoff
from .errors import GatewayError, SetupError

log = logging.getLogger("strictq.sdk")


def transient(error: BaseException) -> bool:
    """The same call may succeed later unchanged (`GatewayError.transient`; never a `SetupError`)."""
    return isinstance(error, GatewayError) and not isinstance(error, SetupError) and error.transient


def unsent(error: BaseException) -> bool:
    """A transient failure that cannot have applied the request: safe to retry even a send."""
    return transient(error) and isinstance(error, GatewayError) and error.unsent


class Retry:
    """Retries of one kind of call with full-jitter backoff; `what` names the call in log lines."""

    def __init__(
        self,
        what: str,
        base: float,
        cap: float,
        *,
        idempotent: bool = True,
        log_steps: bool = False,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.what = what
        self.backoff = Backoff(base, cap, rand=rand)
        self.idempotent = idempotent
        self.log_steps = log_steps

    def retries(self, error: BaseException) -> bool:
        return transient(error) if self.idempotent else unsent(error)

    async def call[T](
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        give_up: Callable[[], bool] = lambda: False,
    ) -> T:
        """`attempt()` until it works; its last error when it is permanent, when the next wait would end
        past `deadline` (loop time), or when `give_up()` turns true (checked after each wait)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                result = await attempt()
            except GatewayError as error:
                if not self.retries(error) or give_up():
                    raise
                delay, grew = self.backoff.fail()
                if deadline is not None and loop.time() + delay >= deadline:
                    raise
                if grew and self.log_steps:  # once per step of the backoff, not per retry
                    log.warning(
                        "%s failed (%s); backing off, up to %.1f s between attempts (%d failure(s) in a row)",
                        self.what,
                        error,
                        self.backoff.ceiling,
                        self.backoff.failures,
                    )
                await sleep(delay)
                if give_up():
                    raise
                continue
            if (failures := self.backoff.succeed()) and self.log_steps:
                log.info("%s works again after %d failure(s)", self.what, failures)
            return result
