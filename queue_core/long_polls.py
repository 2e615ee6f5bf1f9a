"""Waiting long polls, per queue, and who of them to wake.

Waking every waiting receive on every send and ack (one `asyncio.Event` per queue) made each change a
herd: with 30 consumers long-polling a FIFO queue whose groups are mostly in flight, an ack that frees one
group woke 30 tasks, 29 of which polled the core for nothing. Here a send or an ack wakes one receive
(`wake_one`): the longest-waiting one that the queue may have something for. The woken one passes the wake
on (`pass_on`) after its poll: at once when it took something (there may be more), with one try fewer when
it took nothing (the gate, a byte cap or a fairness cap held it back: a "may have" is a superset), so a
change no waiter can take wakes each at most once and the chain always ends.

Everything else that may let a poll find something (a timer, a probe, new routing, a handover) wakes them
all (`wake_all`), as does shutting down; so do the watchers (`watch`: a cluster gateway's wait over many
partitions, which claims nothing and so has nothing to pass on).

Written by hand: it is a small piece of the service's own scheduling, over asyncio futures.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

WOKEN_BY_ALL = 0  # `wait`'s answer when a wake of everyone ended it: no tries to pass on


@dataclass(eq=False, slots=True)
class Waiter:
    """One waiting receive: who polls (for `may_take`) and the future a wake resolves with its tries."""

    worker: str
    version: str
    woken: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


MayTake = Callable[[Waiter], bool]


class LongPolls:
    """Every queue's waiting receives (oldest first) and watchers."""

    def __init__(self) -> None:
        self._receives: dict[str, deque[Waiter]] = {}
        self._watchers: dict[str, asyncio.Event] = {}

    def __contains__(self, queue: str) -> bool:
        return bool(self._receives.get(queue)) or queue in self._watchers

    def queues(self) -> list[str]:
        return [*{*self._receives, *self._watchers}]

    async def wait(self, queue: str, worker: str, version: str, within: float) -> int | None:
        """Wait up to `within` seconds for a wake: the tries left to pass on after polling (`pass_on`),
        WOKEN_BY_ALL, or None when the time ran out. A wake given to a receive that is cancelled or times
        out at that moment is passed on, never lost."""
        waiter = Waiter(worker, version)
        waiting = self._receives.setdefault(queue, deque())
        waiting.append(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.woken), within)
        except TimeoutError:
            if waiter.woken.done():  # woken in the same turn of the loop as the time ran out
                return waiter.woken.result()
            return None
        except asyncio.CancelledError:
            if waiter.woken.done() and waiter.woken.result() > 0:
                self._hand_over(queue, waiter.woken.result())
            raise
        finally:
            if not waiter.woken.done():
                waiter.woken.cancel()
                self._forget(queue, waiter)

    async def watch(self, queue: str, within: float) -> bool:
        """Whether any change of `queue` came within `within` seconds (a watcher claims nothing)."""
        event = self._watchers.setdefault(queue, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), within)
        except TimeoutError:
            return False
        return True

    def wake_one(self, queue: str, may_take: MayTake) -> None:
        """A send or an ack: the oldest waiting receive the queue may have something for looks again,
        with as many tries to pass on as there are receives waiting; every watcher too."""
        self._wake_watchers(queue)
        waiting = self._receives.get(queue)
        if waiting:
            self._wake_first(queue, waiting, len(waiting), may_take)

    def pass_on(self, queue: str, tries: int, took: bool, may_take: MayTake) -> None:
        """After a woken receive's poll: the next one looks, unless nobody may take anything now or the
        tries are used up (a poll that took something does not use one)."""
        left = tries if took else tries - 1
        waiting = self._receives.get(queue)
        if left > 0 and waiting:
            self._wake_first(queue, waiting, left, may_take)

    def wake_all(self, queue: str | None = None) -> None:
        """Every receive and watcher of `queue` (None: of every queue) looks again."""
        for name in [queue] if queue is not None else self.queues():
            self._wake_watchers(name)
            for waiter in self._receives.pop(name, ()):
                waiter.woken.set_result(WOKEN_BY_ALL)

    # ---------------------------------------------------------------------------------------- inside
    def _wake_first(self, queue: str, waiting: deque[Waiter], tries: int, may_take: MayTake) -> None:
        for waiter in waiting:
            if may_take(waiter):
                waiting.remove(waiter)
                waiter.woken.set_result(tries)
                break
        if not waiting:
            del self._receives[queue]

    def _hand_over(self, queue: str, tries: int) -> None:
        """A wake its receiver can no longer use goes to the next receive waiting (any of them)."""
        waiting = self._receives.get(queue)
        if waiting:
            self._wake_first(queue, waiting, tries, lambda _: True)

    def _forget(self, queue: str, waiter: Waiter) -> None:
        waiting = self._receives.get(queue)
        if waiting is not None:
            try:
                waiting.remove(waiter)
            except ValueError:
                pass
            if not waiting:
                del self._receives[queue]

    def _wake_watchers(self, queue: str) -> None:
        event = self._watchers.pop(queue, None)
        if event is not None:
            event.set()
