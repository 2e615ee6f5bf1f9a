"""The store's multi-row statements (store.MULTI_ROW): a run of inserts, claims and deletes applied in one
transaction lands exactly as the same effects applied one per transaction (row by row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from queue_core.machine.effects import ClaimRow, Effect, MessageInserted, MessagesClaimed, MessagesDeleted
from queue_core.store import MULTI_ROW_CHUNKS, SqliteStore, multi_row_statement

COUNT = 203  # every chunk size at least once (203 = 3 x 64 + 8 + 2 + 1)


def _insert(key: int) -> MessageInserted:
    body = bytes([key % 256]) * (key % 7 + 1)
    group = f"g{key % 5}"
    return MessageInserted(1, key, f"{key:016x}", group, body, "text/plain", b"", 0.5 * key, None, None)


def _effects() -> list[Effect]:
    effects: list[Effect] = [_insert(key) for key in range(1, COUNT + 1)]
    first = tuple(ClaimRow(key, 1, 100.0 + key, 1, 10.25) for key in range(1, COUNT + 1, 2))
    again = tuple(ClaimRow(key, 2, 200.5 + key, 2, 10.25) for key in range(1, 40, 2))  # claimed twice
    effects.append(MessagesClaimed(first + again, "worker-a"))
    effects.append(MessagesDeleted(tuple(range(2, COUNT + 1, 3))))
    effects.append(MessagesClaimed((ClaimRow(7, 3, 300.0, 3, 10.25),), "worker-b"))
    return effects


def _rows(store: SqliteStore) -> list[tuple[Any, ...]]:
    return store.db.execute("SELECT * FROM messages ORDER BY key").fetchall()


def test_one_transaction_of_many_rows_equals_row_by_row(tmp_path: Path) -> None:
    together = SqliteStore(tmp_path / "together.sqlite3")
    together.open(now=1.0)
    together.apply(_effects())
    apart = SqliteStore(tmp_path / "apart.sqlite3")
    apart.open(now=1.0)
    for effect in _effects():
        if isinstance(effect, MessagesClaimed):  # one row per transaction: the single-row statements
            for claim in effect.claims:
                apart.apply([MessagesClaimed((claim,), effect.worker)])
        elif isinstance(effect, MessagesDeleted):
            for key in effect.keys:
                apart.apply([MessagesDeleted((key,))])
        else:
            apart.apply([effect])
    rows = _rows(together)
    assert rows == _rows(apart)
    assert len(rows) == COUNT - len(range(2, COUNT + 1, 3))
    by_key = {row[0]: row for row in rows}
    assert by_key[3][10:13] == (2, 203.5, "worker-a")  # (token, claim_expires, claim_worker): last claim
    assert by_key[7][10:13] == (3, 300.0, "worker-b")
    assert by_key[43][10:13] == (1, 143.0, "worker-a")
    assert by_key[4][10:13] == (0, 0.0, "")  # never claimed
    together.close()
    apart.close()


def test_the_statements_stay_few() -> None:
    """Powers of two only, so the connection's statement cache holds every variant."""
    assert MULTI_ROW_CHUNKS == tuple(sorted(MULTI_ROW_CHUNKS, reverse=True))
    assert all(size & (size - 1) == 0 for size in MULTI_ROW_CHUNKS)
    assert multi_row_statement("DELETE FROM messages WHERE key = ?", 4).count("?") == 4
