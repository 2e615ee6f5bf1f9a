"""Pipelining (the patent's scheduler; docs/pipelining.md): while a message is processed, the next message of
another group is claimed and pre-processed, so that it is ready when a processing slot frees.

    async def fetch(msg):  return await load_inputs(msg.payload)      # no strict order needed
    async def handle(msg): await apply(msg.prepared)                   # in the group's order
    Worker("orders", handle, preprocess=fetch)

How (`Pipeline`, one per `Worker` with a `preprocess` function):
- Processing slots: at most `concurrency` handlers run at once (a semaphore). Pre-processing runs outside
  them: it overlaps the processing of other messages.
- Claiming ahead: once every slot is taken, the worker claims up to `prefetch` more groups (one message
  each), not at once but when the schedule says (below, minus the poll's own latency). Such claims are
  held like any other: heartbeated (their ttl runs while they wait), handed back on stop.
- When pre-processing starts (`start_at`, pure arithmetic): the slots free, each at its handler's start
  plus its processing estimate (now, for a free slot); the messages already waiting take the earliest
  ones first, in order; this message's slot is the earliest left, and its pre-processing starts its own
  pre-processing estimate before that, or now if that is past. So with one slot, a 2.0 s message and a
  0.3 s pre-processing, the next message's pre-processing starts 1.7 s into the current one.
- Estimates: each delivery's `estimate` (the queue sends them to pollers declaring `estimates`: the
  message's own, the queue's settings, or what the queue learned); a field the queue did not give is
  learned here from this worker's own timings against the payload's size (`Learner`, the same fit the
  queue uses: protocol.estimates.Regression), else 0 (start at once).
- Order: a group's messages are processed one at a time in seq order (each claim's run processes them in
  turn); the queue never hands out a group twice at once, so messages claimed ahead are always of other
  groups. Pre-processing needs no order, processing keeps it.
- Failure: a pre-processing that raises is the attempt's failure, reported like a handler failure. A stop
  before a message's handler started hands it back untouched (`NotStarted`: not an attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from protocol.estimates import Estimate, Regression


class Staged(Protocol):
    """What the pipeline reads and sets on a message (strictq.sdk.worker.Message; no import of it: the
    worker imports this module)."""

    payload: Any
    estimate: Estimate | None
    prepared: Any
    preprocess_ms: float | None
    processing_ms: float | None


Preprocess = Callable[[Any], Awaitable[Any]]  # async fn(Message) -> prepared value
Handler = Callable[[Any], Awaitable[Any]]
DEFAULT_FETCH_LATENCY = 0.01  # seconds a poll takes, before any was measured


class NotStarted(Exception):
    """The worker stopped before the message's handler started: hand it back, no attempt made."""


def start_at(
    now: float,
    busy_until: Sequence[float],
    free_slots: int,
    ahead: Sequence[float],
    preprocessing: float,
) -> float:
    """When to start pre-processing the next message (the patent's scheduler, as arithmetic).

    `busy_until`: when each running handler is expected to end (its start + processing estimate);
    `free_slots`: slots free now; `ahead`: processing estimates of the messages already waiting for a slot,
    in order (they take the earliest slots first); `preprocessing`: this message's pre-processing estimate.
    The result is never before `now`."""
    slots = [now] * max(free_slots, 0) + [max(now, t) for t in busy_until]
    if not slots:
        return now
    heapq.heapify(slots)
    for processing in ahead:
        heapq.heappush(slots, heapq.heappop(slots) + max(processing, 0.0))
    return max(now, slots[0] - max(preprocessing, 0.0))


class Learner:
    """This worker's own fit of processing and pre-processing seconds against payload size, for what the
    queue's estimates leave out."""

    def __init__(self) -> None:
        self.processing = Regression()
        self.preprocessing = Regression()

    def estimate(self, size: int, given: Estimate | None) -> Estimate:
        """`given`'s fields, else the learned ones, else 0."""
        learned = Estimate(self.processing.predict(size), self.preprocessing.predict(size))
        chosen = learned if given is None else given.over(learned)
        return Estimate(chosen.processing or 0.0, chosen.preprocessing or 0.0)

    def learn(self, size: int, processing: float, preprocessing: float) -> None:
        self.processing.add(size, processing)
        self.preprocessing.add(size, preprocessing)


@dataclass(eq=False, slots=True)
class _Entry:
    """A message between its claim and its handler's start."""

    order: int
    processing: float
    preprocessing: float
    size: int


@dataclass(slots=True)
class PipelineStats:
    prefetched: int = 0  # polls made to claim ahead
    preprocessed: int = 0  # pre-processings that ended (raised or not)
    preprocess_seconds: float = 0.0
    waited_seconds: float = 0.0  # prepared messages waiting for a slot (the schedule was early)
    released: int = 0  # messages handed back before their handler started (stop)
    fetch_latency: float = DEFAULT_FETCH_LATENCY


class Pipeline:
    """One worker's processing slots and its schedule of pre-processing (see the module's docstring)."""

    def __init__(
        self,
        preprocess: Preprocess,
        concurrency: int,
        prefetch: int,
        stopping: asyncio.Event,
    ) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        self.preprocess = preprocess
        self.concurrency = concurrency
        self.prefetch_limit = prefetch
        self.stopping = stopping
        self.slots = asyncio.Semaphore(concurrency)
        self.learner = Learner()
        self.stats = PipelineStats()
        self._busy: dict[int, float] = {}  # running handlers: order -> expected end
        self._waiting: dict[int, _Entry] = {}  # claimed, handler not started, in claim order
        self._order = itertools.count()
        self._pulse = asyncio.Event()
        self._guess = 0.0  # the latest pre-processing estimate: for messages not claimed yet

    # ------------------------------------------------------------------------------------ the schedule
    def _notify(self) -> None:
        """Wake everyone waiting on the schedule (a slot was taken or freed, a message came or went)."""
        self._pulse.set()
        self._pulse = asyncio.Event()

    def _start_at(self, now: float, entry: _Entry | None, preprocessing: float) -> float:
        ahead = [e.processing for e in self._waiting.values() if entry is None or e.order < entry.order]
        free = self.concurrency - len(self._busy)
        return start_at(now, list(self._busy.values()), free, ahead, preprocessing)

    async def _wait(self, seconds: float | None, *others: asyncio.Event) -> None:
        """Until the schedule changes, `seconds` pass (None: no limit), the worker stops or `others` fire."""
        waits = [asyncio.ensure_future(event.wait()) for event in (self._pulse, self.stopping, *others)]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()

    async def prefetch(self, staged: int, changed: asyncio.Event) -> int:
        """The poll loop's question once every slot is taken: how many messages to claim ahead now (0:
        none yet; it asks again). `staged`: claims held beyond the slots; `changed`: the worker's event
        (a run ended)."""
        if staged >= self.prefetch_limit:
            await self._wait(None, changed)
            return 0
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._start_at(now, None, self._guess) - self.stats.fetch_latency
        if due > now:
            await self._wait(due - now, changed)
            if loop.time() < due:
                return 0  # something changed: look again
        self.stats.prefetched += 1
        return 1

    async def pause(self, seconds: float, changed: asyncio.Event) -> None:
        """The back-off after a poll that found nothing to claim ahead: cut short when a run ends (its
        slot is free: the worker polls for it at once) or the schedule changes."""
        await self._wait(seconds, changed)

    def polled(self, seconds: float) -> None:
        """A poll's latency (an average of the recent ones: claim ahead by that much)."""
        latency = self.stats.fetch_latency
        self.stats.fetch_latency = 0.8 * latency + 0.2 * max(seconds, 0.0)

    # ------------------------------------------------------------------------------------- one message
    async def run(self, message: Staged, handler: Handler) -> None:
        """Pre-process `message` when the schedule says, then run `handler` in a processing slot. Sets
        `message.estimate`, `.prepared`, `.preprocess_ms` and `.processing_ms`. Raises what the
        pre-processing or the handler raised, or `NotStarted` when the worker stops first."""
        loop = asyncio.get_running_loop()
        size = _size(message.payload)
        message.estimate = estimate = self.learner.estimate(size, message.estimate)
        assert estimate.processing is not None and estimate.preprocessing is not None
        self._guess = estimate.preprocessing
        entry = _Entry(next(self._order), estimate.processing, estimate.preprocessing, size)
        self._waiting[entry.order] = entry
        self._notify()
        acquired = False
        try:
            while (due := self._start_at(loop.time(), entry, entry.preprocessing)) > loop.time():
                await self._wait(due - loop.time())
                self._check_stop()
            self._check_stop()
            started = loop.time()
            message.prepared = await self._stoppable(self.preprocess(message))
            prepared = loop.time()
            message.preprocess_ms = (prepared - started) * 1000
            self.stats.preprocessed += 1
            self.stats.preprocess_seconds += prepared - started
            await self._stoppable(self.slots.acquire(), slot=True)
            acquired = True
            self._check_stop()  # the slot freed as the worker stopped: hand it back all the same
            handler_started = loop.time()
            self.stats.waited_seconds += handler_started - prepared
            del self._waiting[entry.order]
            self._busy[entry.order] = handler_started + entry.processing
            self._notify()
            try:
                await handler(message)
            finally:
                message.processing_ms = (loop.time() - handler_started) * 1000
            self.learner.learn(size, message.processing_ms / 1000, (prepared - started))
        except NotStarted:
            self.stats.released += 1
            raise
        finally:
            self._waiting.pop(entry.order, None)
            self._busy.pop(entry.order, None)
            if acquired:
                self.slots.release()
            self._notify()

    def _check_stop(self) -> None:
        if self.stopping.is_set():
            raise NotStarted("worker stopping: handed back before its handler started")

    async def _stoppable[T](self, awaitable: Awaitable[T], *, slot: bool = False) -> T:
        """`awaitable`, unless the worker stops first (then NotStarted, and it is cancelled). `slot`: it
        acquires a processing slot, which goes back if it was taken just as the wait ended."""
        if self.stopping.is_set():
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never started: no "was never awaited" warning
            self._check_stop()
        task = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            if slot and task.done() and not task.cancelled():
                self.slots.release()
            raise
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if slot and not task.cancelled() and task.exception() is None:
            self.slots.release()
        raise NotStarted("worker stopping: handed back before its handler started")


def _size(payload: Any) -> int:
    """The payload's size in bytes, as the learner sees it (its JSON)."""
    try:
        return len(orjson.dumps(payload))
    except TypeError:
        return 0


async def inline(preprocess: Preprocess, message: Staged, handler: Handler) -> None:
    """Without pipelining (`Worker(pipeline=False)`): pre-process, then process, in the same slot."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    message.prepared = await preprocess(message)
    prepared = loop.time()
    message.preprocess_ms = (prepared - started) * 1000
    try:
        await handler(message)
    finally:
        message.processing_ms = (loop.time() - prepared) * 1000
