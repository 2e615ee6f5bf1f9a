"""DurableLog's futures are each their caller's (QueueService awaits them without asyncio.shield): a
request whose client hung up (its future cancelled) still commits, and a barrier taken after it waits
for that commit instead of trusting the cancelled future."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from queue_core.durability import DurableLog
from queue_core.machine.effects import MessageInserted
from queue_core.store import SqliteStore


def _insert(key: int) -> MessageInserted:
    return MessageInserted(1, key, f"{key:016x}", "g", b"body", "text/plain", b"", 0.0, None, None)


def _stored_keys(path: Path) -> list[int]:
    db = sqlite3.connect(path)
    try:
        return [key for (key,) in db.execute("SELECT key FROM messages ORDER BY key")]
    finally:
        db.close()


def test_a_barrier_after_a_cancelled_submission_waits_for_its_commit(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite3"
    store = SqliteStore(path)
    store.open(now=1.0)

    async def run() -> None:
        log = DurableLog(store, asyncio.get_running_loop())
        try:
            first = log.submit([_insert(1)])
            last = log.submit([_insert(2)])
            assert first is not last  # each caller's own future
            last.cancel()  # its client hung up
            barrier = log.barrier()
            assert not barrier.done()  # the cancelled future says nothing about the disk
            await barrier
            assert _stored_keys(path) == [1, 2]
            assert (await first) == {}
            assert log.barrier().done()  # nothing in flight any more
        finally:
            await asyncio.to_thread(log.close)

    asyncio.run(run())
    store.close()


def test_a_submission_without_durable_effects_is_a_barrier(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "queue.sqlite3")
    store.open(now=1.0)

    async def run() -> None:
        log = DurableLog(store, asyncio.get_running_loop())
        try:
            log.submit([_insert(1)])
            waiting = log.submit([])
            assert not waiting.done()
            assert (await waiting) == {}
            assert log.commits >= 1
        finally:
            await asyncio.to_thread(log.close)

    asyncio.run(run())
    store.close()
