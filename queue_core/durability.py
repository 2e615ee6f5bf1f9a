"""Group commit: a writer thread applies the effects of many requests in one transaction (one fsync).

The event loop never waits on the disk; a request awaits the future of the batch holding its effects,
and batches commit in submission order, so a response never reveals state that a crash could undo.

Two kinds of store errors, kept apart (`commit`):
- the store's own failure (sqlite3.OperationalError: disk I/O error, disk full; corruption): nothing more
  can be made durable, so this batch and every later submission fail and readiness turns 503;
- one submission's data (`StoreDataError`: a value the store cannot hold). The batch is rolled back and
  its submissions are applied again one transaction each, in order: only the one at fault fails, the
  others commit, and the store stays healthy. One request never stops the writes of everyone else.

What a refused submission means for the in-memory core, which applied its effects before they reached
the disk: the core refuses any text it could not persist before changing its state (machine.text), and
the API faces refuse it before the core, so no client input can get here; a refused submission is a bug
in what the core emits. Its request fails (its client was never told it happened, as with a crash before
the commit), its effects are absent from disk, and the effects of later submissions stay correct on disk
without them: every statement after an insert addresses rows by key (an UPDATE or DELETE of a row that is
not there changes nothing; an orphan history row is swept at the next open), so the store holds exactly
"that request never happened". Memory may hold its effects until the next restart, which rebuilds the core
from the store; that is logged at ERROR naming the error, so an operator can restart at a quiet moment.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .machine.effects import DURABLE_EFFECTS, Effect, MessageInserted
from .store import SqliteStore, StoreDataError, StoredBody, StoreError

log = logging.getLogger("strictq.store")

MAX_EFFECTS_PER_COMMIT = 20_000
Bodies = dict[int, StoredBody]  # by key: body, content type, extra, the sending request's id
NO_BODIES: Bodies = {}  # shared and empty: never mutate


class CommitLog(Protocol):
    """What `QueueService` writes through: this module's `DurableLog`, or a cluster partition's replicated
    log (cluster.replicated_log), which appends to the partition's stream before committing here."""

    @property
    def failed(self) -> BaseException | None: ...
    def submit(self, effects: Sequence[Effect], fetch: Sequence[int] = ()) -> asyncio.Future[Bodies]: ...
    def close(self) -> None: ...


# Builds a service's log when it starts: (store, loop, on_commit) -> log.
LogFactory = Callable[[SqliteStore, asyncio.AbstractEventLoop, Callable[[int], None]], CommitLog]


class DurableLog:
    def __init__(
        self,
        store: SqliteStore,
        loop: asyncio.AbstractEventLoop,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._loop = loop
        self._on_commit = on_commit  # called on the loop with the highest message key committed
        self._pending: queue.SimpleQueue[
            tuple[list[Effect], asyncio.Future[Bodies], list[int], int] | None
        ] = queue.SimpleQueue()
        # Submissions counted in order; `_done` of them resolved (batches commit in submission order).
        # A barrier waits for a count, never on a request's own future: that one is its awaiter's alone
        # and is cancelled when its client hangs up (see `private_futures`).
        self._submitted = 0
        self._done = 0
        self._barriers: list[tuple[int, asyncio.Future[Bodies]]] = []
        self._failed: BaseException | None = None
        self.commits = 0
        self.committed_effects = 0
        self._thread = threading.Thread(target=self._run, name="strictq-store-writer", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    # Every future `submit` and `barrier` return is new and awaited by one caller, so the caller may
    # await it without `asyncio.shield`: cancelling it (a client hanging up) affects nobody else, and the
    # commit goes on. Saves a future and a loop hop per request (QueueService._durable).
    private_futures = True

    def submit(
        self, effects: Sequence[Effect], fetch: Sequence[int] = (), position: int = 0
    ) -> asyncio.Future[Bodies]:
        """Queue effects for the next commit; the future resolves once they are on disk, with the bodies
        of the `fetch` keys read right after the commit. Reading them here rather than on the event loop
        lets SQLite's C code run beside the loop (it releases the GIL). `position`: the replicated stream's
        sequence these effects were appended at (a cluster partition's owner), recorded in the same commit."""
        durable: list[Effect] = [e for e in effects if isinstance(e, DURABLE_EFFECTS)]
        if not durable and not fetch and not position:
            return self.barrier()
        future: asyncio.Future[Bodies] = self._loop.create_future()
        if self._failed is not None:
            future.set_exception(StoreError(f"store failed earlier: {self._failed}"))
            return future
        self._pending.put((durable, future, list(fetch), position))
        self._submitted += 1
        return future

    def barrier(self) -> asyncio.Future[Bodies]:
        """A future that resolves when everything submitted so far is durable (e.g. before answering a
        duplicate send whose original may still be in flight to the disk)."""
        done: asyncio.Future[Bodies] = self._loop.create_future()
        if self._done < self._submitted:
            self._barriers.append((self._submitted, done))
        elif self._failed is not None:  # not a refused submission's data: the store itself failed
            done.set_exception(StoreError(f"store failed earlier: {self._failed}"))
        else:
            done.set_result(NO_BODIES)
        return done

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        self._pending.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        pending = self._pending
        stop = False
        while not stop:
            item = pending.get()
            if item is None:
                break
            batch = [item]
            size = len(item[0])
            while size < MAX_EFFECTS_PER_COMMIT:
                try:
                    more = pending.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
                size += len(more[0])
            futures = [future for _, future, _, _ in batch]
            position = max(item[3] for item in batch)
            try:
                done = commit(self._store, [(effects, keys) for effects, _, keys, _ in batch], position)
            except BaseException as exc:  # the disk said no: fail these and every later request
                self._failed = exc
                log.error("store failed; every later write fails until a restart: %s", exc)
                self._loop.call_soon_threadsafe(self._fail, futures, exc)
                continue
            for error in done.refused.values():
                log.error("store refused one request's data (that request fails, the rest commit): %s", error)
            self.commits += done.transactions
            self.committed_effects += done.effects
            self._loop.call_soon_threadsafe(self._resolve, futures, done)

    def _resolve(self, futures: list[asyncio.Future[Bodies]], done: Committed) -> None:
        for index, future in enumerate(futures):
            if future.done():  # cancelled: its client hung up; the commit holds its effects all the same
                continue
            error = done.refused.get(index)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.bodies)
        self._count_done(len(futures), None)
        if done.max_key and self._on_commit is not None:
            self._on_commit(done.max_key)

    def _fail(self, futures: list[asyncio.Future[Bodies]], exc: BaseException) -> None:
        _fail(futures, exc)
        self._count_done(len(futures), exc)

    def _count_done(self, count: int, exc: BaseException | None) -> None:
        """`count` more submissions are settled: wake the barriers waiting for no more than that."""
        self._done += count
        if not self._barriers or self._barriers[0][0] > self._done:
            return
        waiting = self._barriers
        self._barriers = [(target, future) for target, future in waiting if target > self._done]
        for target, future in waiting:
            if target <= self._done and not future.done():
                if exc is not None:
                    future.set_exception(StoreError(f"store write failed: {exc}"))
                else:
                    future.set_result(NO_BODIES)


@dataclass(slots=True)
class Committed:
    """What one batch made durable: bodies read after it, and the submissions refused for their data."""

    bodies: Bodies
    refused: dict[int, StoreDataError]  # index of the submission in the batch -> why
    effects: int = 0
    transactions: int = 0
    max_key: int = 0  # the highest message key inserted


def commit(
    store: SqliteStore, submissions: Sequence[tuple[Sequence[Effect], Sequence[int]]], position: int = 0
) -> Committed:
    """Make a batch of submissions (effects, keys whose bodies to read after) durable, in order: one
    transaction, or, when one submission's data is refused, one transaction per submission so that only
    that one fails. Raises for a failure of the store itself (see the module docstring). `position`: the
    replicated stream's sequence of the batch's last frame, recorded with it (0: not replicated)."""
    everything = [effect for effects, _ in submissions for effect in effects]
    refused: dict[int, StoreDataError] = {}
    applied: list[Effect] = []
    transactions = 0
    try:
        if everything or position:
            store.apply(everything, position)
            transactions = 1
        applied = everything
    except StoreDataError:
        for index, (effects, _) in enumerate(submissions):
            if not effects:
                continue
            try:
                store.apply(effects, position)
            except StoreDataError as error:
                refused[index] = error
                continue
            transactions += 1
            applied.extend(effects)
    fetch = [key for index, (_, keys) in enumerate(submissions) if index not in refused for key in keys]
    bodies = store.fetch_bodies(fetch) if fetch else NO_BODIES
    max_key = max((e.key for e in applied if isinstance(e, MessageInserted)), default=0)
    return Committed(bodies, refused, len(applied), transactions, max_key)


def _fail(futures: list[asyncio.Future[Bodies]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(StoreError(f"store write failed: {exc}"))
