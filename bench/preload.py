"""Fill a store with a backlog before the server starts, through the real core and the real store code.

The queue core makes the messages (its own keys, ids and `MessageInserted` effects, exactly what a send
produces) and `SqliteStore.apply` commits them, 10,000 per transaction, with the store's own pragmas
(WAL, synchronous=FULL). Only HTTP is skipped: the rows are the ones the server would have written had
the messages been sent to it, and the server then restores them like after any restart. Committing runs
in a thread while the core makes the next chunk (sqlite3 releases the GIL while it works).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from queue_core.machine import QueueCore, SendRequest
from queue_core.store import SqliteStore

CHUNK = 10_000


@dataclass
class PreloadInfo:
    messages: int
    seconds: float
    db_bytes: int


def preload(data_dir: Path, queue: str, count: int, groups: int, body_size: int) -> PreloadInfo:
    started = time.perf_counter()
    data_dir.mkdir(parents=True, exist_ok=True)
    store = SqliteStore(data_dir / "queue.sqlite3")
    now = time.time()
    epoch, snapshot = store.open(now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, now)
    core.create_queue(queue, now)
    store.apply(core.drain_effects())
    body = b"b" * body_size
    names = [f"g{i}" for i in range(groups)]
    pending: Future[None] | None = None
    sent = 0
    with ThreadPoolExecutor(1) as pool:
        while sent < count:
            n = min(CHUNK, count - sent)
            requests = [SendRequest(body, group=names[(sent + i) % groups]) for i in range(n)]
            results = core.send(queue, requests, time.time())
            if any(not hasattr(r, "message_id") for r in results):
                raise RuntimeError(f"preload: the core refused a message: {results[:3]}")
            effects = core.drain_effects()
            if pending is not None:
                pending.result()
            pending = pool.submit(store.apply, effects)
            sent += n
        if pending is not None:
            pending.result()
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    size = sum(p.stat().st_size for p in data_dir.iterdir() if p.is_file())
    return PreloadInfo(count, time.perf_counter() - started, size)
