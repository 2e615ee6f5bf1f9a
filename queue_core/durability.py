"""Group commit: a writer thread applies the effects of many requests in one transaction (one fsync).

The event loop never waits on the disk; a request awaits the future of the batch holding its effects,
and batches commit in submission order, so a response never reveals state that a crash could undo.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence

from .machine.effects import DURABLE_EFFECTS, Effect, MessageInserted
from .store import SqliteStore, StoreError

MAX_EFFECTS_PER_COMMIT = 20_000
Bodies = dict[int, tuple[bytes, str, bytes]]
NO_BODIES: Bodies = {}  # shared and empty: never mutate


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
        self._pending: queue.SimpleQueue[tuple[list[Effect], asyncio.Future[Bodies], list[int]] | None] = (
            queue.SimpleQueue()
        )
        self._last: asyncio.Future[Bodies] | None = None
        self._failed: BaseException | None = None
        self.commits = 0
        self.committed_effects = 0
        self._thread = threading.Thread(target=self._run, name="strictq-store-writer", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def submit(self, effects: Sequence[Effect], fetch: Sequence[int] = ()) -> asyncio.Future[Bodies]:
        """Queue effects for the next commit; the future resolves once they are on disk, with the bodies
        of the `fetch` keys read right after the commit. Reading them here rather than on the event loop
        lets SQLite's C code run beside the loop (it releases the GIL)."""
        durable: list[Effect] = [e for e in effects if isinstance(e, DURABLE_EFFECTS)]
        if not durable and not fetch:
            return self.barrier()
        future: asyncio.Future[Bodies] = self._loop.create_future()
        if self._failed is not None:
            future.set_exception(StoreError(f"store failed earlier: {self._failed}"))
            return future
        self._pending.put((durable, future, list(fetch)))
        self._last = future
        return future

    def barrier(self) -> asyncio.Future[Bodies]:
        """A future that resolves when everything submitted so far is durable (e.g. before answering a
        duplicate send whose original may still be in flight to the disk)."""
        last = self._last
        if last is None or last.done():
            done: asyncio.Future[Bodies] = self._loop.create_future()
            if last is not None and not last.cancelled() and last.exception() is not None:
                done.set_exception(StoreError("store write failed"))
            else:
                done.set_result(NO_BODIES)
            return done
        return last

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
            effects = [effect for group, _, _ in batch for effect in group]
            futures = [future for _, future, _ in batch]
            fetch = [key for _, _, keys in batch for key in keys]
            try:
                if effects:
                    self._store.apply(effects)
                bodies = self._store.fetch_bodies(fetch) if fetch else NO_BODIES
            except BaseException as exc:  # the disk said no: fail these and every later request
                self._failed = exc
                self._loop.call_soon_threadsafe(_fail, futures, exc)
                continue
            self.commits += 1
            self.committed_effects += len(effects)
            max_key = max((e.key for e in effects if isinstance(e, MessageInserted)), default=0)
            self._loop.call_soon_threadsafe(self._resolve, futures, max_key, bodies)

    def _resolve(self, futures: list[asyncio.Future[Bodies]], max_key: int, bodies: Bodies) -> None:
        for future in futures:
            if not future.done():
                future.set_result(bodies)
        if max_key and self._on_commit is not None:
            self._on_commit(max_key)


def _fail(futures: list[asyncio.Future[Bodies]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(StoreError(f"store write failed: {exc}"))
