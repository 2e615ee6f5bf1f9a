"""The embedded store: SQLite in WAL mode with synchronous=FULL.

Why SQLite: it ships with Python, survives SIGKILL at any instant (WAL + fsync on commit), and measured
here it sustains 100k+ insert/claim/delete cycles per second at ~100 messages per commit, far above what
one event loop can feed it. Group commit comes from the writer thread (`durability.DurableLog`) applying
many requests' effects in one transaction. This class is synchronous and single-threaded by design.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from .machine import Snapshot
from .machine.effects import (
    ClaimsChanged,
    DedupSaved,
    Effect,
    MessageInserted,
    MessagesClaimed,
    MessagesDeleted,
    MessagesMoved,
    QueueDropped,
    QueuePurged,
    QueueSaved,
    TokensRaised,
)
from .machine.inputs import MessageRow

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS queues (
    qid INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, attributes BLOB NOT NULL, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    key INTEGER PRIMARY KEY, qid INTEGER NOT NULL, id TEXT NOT NULL, grp TEXT NOT NULL,
    body BLOB NOT NULL, content_type TEXT NOT NULL, extra BLOB NOT NULL, available_at REAL NOT NULL,
    receive_count INTEGER NOT NULL DEFAULT 0, first_receive_at REAL NOT NULL DEFAULT 0,
    token INTEGER NOT NULL DEFAULT 0, claim_expires REAL NOT NULL DEFAULT 0,
    claim_worker TEXT NOT NULL DEFAULT '', origin TEXT, digest BLOB
);
CREATE TABLE IF NOT EXISTS dedup (
    qid INTEGER NOT NULL, dkey TEXT NOT NULL, message_id TEXT NOT NULL, seq INTEGER NOT NULL,
    grp TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY (qid, dkey)
) WITHOUT ROWID;
"""

INSERT_MESSAGE = (
    "INSERT INTO messages (key, qid, id, grp, body, content_type, extra, available_at, digest)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
CLAIM_MESSAGE = (
    "UPDATE messages SET token = ?, claim_expires = ?, receive_count = ?, first_receive_at = ?,"
    " claim_worker = ? WHERE key = ?"
)
RAISE_TOKEN = "UPDATE messages SET token = ? WHERE key = ?"
CHANGE_CLAIM = "UPDATE messages SET claim_expires = ? WHERE key = ?"
DELETE_MESSAGE = "DELETE FROM messages WHERE key = ?"
MOVE_MESSAGE = "UPDATE messages SET qid = ?, origin = coalesce(?, origin), available_at = 0 WHERE key = ?"
REDRIVE_MESSAGE = (
    "UPDATE messages SET qid = ?, origin = NULL, receive_count = 0, first_receive_at = 0, available_at = 0"
    " WHERE key = ?"
)
SAVE_DEDUP = (
    "INSERT OR REPLACE INTO dedup (qid, dkey, message_id, seq, grp, expires) VALUES (?, ?, ?, ?, ?, ?)"
)
DEDUP_SWEEP_INTERVAL = 60.0


class StoreError(Exception):
    """The store cannot make effects durable (disk full, corruption): the server must stop accepting."""


class SqliteStore:
    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock  # only for sweeping expired dedup rows; the core's own `now` drives the rest
        self._db: sqlite3.Connection | None = None
        self._last_sweep = 0.0

    # ------------------------------------------------------------------------------------ lifecycle
    def open(self, now: float) -> tuple[int, Snapshot]:
        """Open (creating if needed), bump the epoch durably, and return it with everything stored."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA cache_size=-16384")  # 16 MiB page cache
        db.executescript(SCHEMA)
        self._db = db
        db.execute("BEGIN IMMEDIATE")
        epoch = self._meta("epoch") + 1
        self._set_meta("epoch", epoch)
        db.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('key_hw', 0)")
        db.execute("DELETE FROM dedup WHERE expires <= ?", (now,))
        db.execute("COMMIT")
        return epoch, self._snapshot()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError("store is not open")
        return self._db

    def _meta(self, name: str) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _set_meta(self, name: str, value: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    def _snapshot(self) -> Snapshot:
        db = self.db
        queues = [
            (qid, name, orjson.loads(attributes), created_at)
            for qid, name, attributes, created_at in db.execute(
                "SELECT qid, name, attributes, created_at FROM queues ORDER BY qid"
            )
        ]
        dedup = list(db.execute("SELECT qid, dkey, message_id, seq, grp, expires FROM dedup"))
        return Snapshot(
            queues=queues, messages=self._message_rows(), dedup=dedup, key_high_water=self._meta("key_hw")
        )

    def _message_rows(self) -> Iterator[MessageRow]:
        yield from self.db.execute(
            "SELECT key, qid, id, grp, available_at, receive_count, first_receive_at, token, claim_expires,"
            " claim_worker, origin, digest FROM messages ORDER BY key"
        )

    # ---------------------------------------------------------------------------------------- writes
    def apply(self, effects: Sequence[Effect]) -> None:
        """Make a run of effects durable in one transaction (one fsync), preserving their order."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            max_key = 0
            for statement, rows in _batches(effects):
                if statement == INSERT_MESSAGE:
                    max_key = max(max_key, max(row[0] for row in rows))
                db.executemany(statement, rows)
            if max_key:
                db.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'key_hw'", (max_key,))
            now = self.clock()
            if now - self._last_sweep > DEDUP_SWEEP_INTERVAL:
                db.execute("DELETE FROM dedup WHERE expires <= ?", (now,))
                self._last_sweep = now
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StoreError(f"store write failed: {exc}") from exc

    # ----------------------------------------------------------------------------------------- reads
    def fetch_bodies(self, keys: Iterable[int]) -> dict[int, tuple[bytes, str, bytes]]:
        keys = list(keys)
        if not keys:
            return {}
        marks = ",".join("?" * len(keys))
        rows = self.db.execute(
            f"SELECT key, body, content_type, extra FROM messages WHERE key IN ({marks})", keys
        )
        return {key: (body, content_type, extra) for key, body, content_type, extra in rows}


def _batches(effects: Sequence[Effect]) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    """Consecutive effects of one kind become one executemany; order between kinds is kept."""
    statement: str | None = None
    rows: list[tuple[Any, ...]] = []
    for effect in effects:
        for next_statement, row in _rows(effect):
            if next_statement != statement:
                if statement is not None and rows:
                    yield statement, rows
                statement, rows = next_statement, []
            rows.append(row)
    if statement is not None and rows:
        yield statement, rows


def _rows(effect: Effect) -> Iterator[tuple[str, tuple[Any, ...]]]:
    match effect:
        case MessageInserted():
            yield (
                INSERT_MESSAGE,
                (
                    effect.key,
                    effect.qid,
                    effect.message_id,
                    effect.group,
                    effect.body,
                    effect.content_type,
                    effect.extra,
                    effect.available_at,
                    effect.digest,
                ),
            )
        case MessagesClaimed():
            for claim in effect.claims:
                yield (
                    CLAIM_MESSAGE,
                    (
                        claim.token,
                        claim.expires,
                        claim.receive_count,
                        claim.first_receive_at,
                        effect.worker,
                        claim.key,
                    ),
                )
        case MessagesDeleted():
            for key in effect.keys:
                yield DELETE_MESSAGE, (key,)
        case TokensRaised():
            for key in effect.keys:
                yield RAISE_TOKEN, (effect.token, key)
        case ClaimsChanged():
            for key, expires in effect.changes:
                yield CHANGE_CLAIM, (expires, key)
        case MessagesMoved():
            for key in effect.keys:
                if effect.redrive:
                    yield REDRIVE_MESSAGE, (effect.qid, key)
                else:
                    yield MOVE_MESSAGE, (effect.qid, effect.origin, key)
        case DedupSaved():
            yield (
                SAVE_DEDUP,
                (
                    effect.qid,
                    effect.dedup_key,
                    effect.message_id,
                    effect.seq,
                    effect.group,
                    effect.expires_at,
                ),
            )
        case QueueSaved():
            yield (
                "INSERT OR REPLACE INTO queues (qid, name, attributes, created_at) VALUES (?, ?, ?, ?)",
                (effect.qid, effect.name, orjson.dumps(effect.attributes), effect.created_at),
            )
        case QueueDropped():
            yield "DELETE FROM queues WHERE qid = ?", (effect.qid,)
            yield "DELETE FROM messages WHERE qid = ?", (effect.qid,)
            yield "DELETE FROM dedup WHERE qid = ?", (effect.qid,)
        case QueuePurged():
            yield "DELETE FROM messages WHERE qid = ?", (effect.qid,)
        case _:  # FloorRaised and other published-only effects
            return
