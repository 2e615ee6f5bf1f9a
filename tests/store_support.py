"""Reading what a running (or stopped) server's SQLite store holds, through a read-only connection of
the test's own (WAL readers never block the server's writer)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson

STORE_FILE = "queue.sqlite3"


def _rows(store: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5.0)
    try:
        return list(db.execute(sql))
    finally:
        db.close()


def stored_fences(store: Path) -> list[dict[str, Any]]:
    """The fences table (Fence.to_dict() per worker), sorted by worker."""
    rows = _rows(store, "SELECT worker, fence FROM fences ORDER BY worker")
    return [orjson.loads(fence) for _, fence in rows]


def stored_suspensions(store: Path) -> dict[str, dict[str, Any]]:
    return {q: orjson.loads(state) for q, state in _rows(store, "SELECT queue, state FROM suspensions")}


def stored_blacklists(store: Path) -> dict[str, dict[str, Any]]:
    return {w: orjson.loads(state) for w, state in _rows(store, "SELECT worker, state FROM blacklists")}


def stored_participants(store: Path) -> list[str]:
    return [w for (w,) in _rows(store, "SELECT worker FROM participants ORDER BY worker")]
