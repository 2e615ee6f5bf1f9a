"""Lookup without a JVM: read only the message's bucket, prune row groups by their min/max statistics.

Files are sorted by message id, so a message's rows sit in one or two row groups of each file of its
bucket, and the row-group statistics in the footer tell which: a lookup reads `_index.json`, the
footers of its bucket's files (bounded by compaction), and those row groups only. `SearchStats` says
what was opened and read (the tests assert it). Searches without a message id (by group or worker)
scan every file with pyarrow's dataset filter, still without Spark. A search by request id (the id of
the request that sent a message) scans the `request_id` and `message_id` columns of every file for the
messages that request sent, then looks each of them up by message id: their whole stories, records that
do not carry the request id included (a worker that does not pass it on, fence events).

Imports: pyarrow, orjson and the stdlib only (never pyspark, mitmproxy or aiohttp): `strictq search`
starts in a few tens of milliseconds.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.request_ids import REQUEST_ID_RE
from protocol.request_ids import RULE as REQUEST_ID_RULE

from . import layout
from .buckets import bucket_of
from .schema import SUMMARY_COLUMNS

# The queue core's rule for message ids (queue_core.machine.groups), kept here so search stays light.
MESSAGE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
NAME = re.compile(r"^[\x21-\x7e]{1,256}$")  # groups and worker ids: printable ASCII, no spaces


class QueryError(ValueError):
    """The query is malformed (bad message id, time range, status): a usage error, not a crash."""


@dataclass(frozen=True, slots=True)
class Query:
    message_id: str | None = None
    group: str | None = None
    worker: str | None = None
    status: int | str | None = None  # 502 or "5xx"
    since: float | None = None
    until: float | None = None
    limit: int | None = None
    request_id: str | None = None  # the messages a request sent (the id of the request that sent them)

    def validate(self) -> Query:
        if self.message_id is not None and not MESSAGE_ID.fullmatch(self.message_id):
            raise QueryError(
                f"malformed message id {self.message_id[:80]!r}: 1-128 characters of letters, digits, "
                "'_', '.', ':' and '-'"
            )
        if self.request_id is not None and not REQUEST_ID_RE.fullmatch(self.request_id):
            raise QueryError(f"malformed request id {self.request_id[:80]!r}: {REQUEST_ID_RULE}")
        for name in ("group", "worker"):
            value = getattr(self, name)
            if value is not None and not NAME.fullmatch(value):
                raise QueryError(
                    f"malformed {name} {value[:80]!r}: 1-256 printable ASCII characters, no spaces"
                )
        if self.message_id is None and self.request_id is None and self.group is None and self.worker is None:
            raise QueryError(
                "give --message-id, --request-id, --group or --worker (with optional "
                "--status/--since/--until)"
            )
        if self.since is not None and self.until is not None and self.since > self.until:
            raise QueryError("--since is after --until: nothing can match")
        if self.limit is not None and self.limit < 1:
            raise QueryError("--limit must be >= 1")
        if self.status is not None:
            from wirelog.reader import parse_status

            try:
                object.__setattr__(self, "status", parse_status(self.status))
            except ValueError as exc:
                raise QueryError(f"--status: {exc}") from None
        return self

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__ if getattr(self, name) is not None}


@dataclass(slots=True)
class SearchStats:
    """What the lookup touched: files opened, row groups in them, row groups actually read."""

    bucket: int | None = None
    files_opened: list[str] = field(default_factory=list)
    row_groups_total: int = 0
    row_groups_read: int = 0
    rows_read: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "files": len(self.files_opened),
            "row_groups_total": self.row_groups_total,
            "row_groups_read": self.row_groups_read,
            "rows_read": self.rows_read,
        }


@dataclass(slots=True)
class SearchResult:
    query: Query
    rows: list[dict[str, Any]]  # index rows (flat columns; `record` when asked for), in time order
    stats: SearchStats
    truncated: bool = False


def open_parquet(path: Path, metadata: Any = None) -> Any:
    """Open one index file (a seam for the tests, which count what a lookup opens); with `metadata`
    (a cached footer) the footer is not read and parsed again."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, memory_map=True, metadata=metadata)


class IndexCache:
    """A long-running process's (the gateway's) parsed `_index.json` and Parquet footers, so a warm
    lookup parses neither again (~0.3 ms of one). Checked by one stat of `_index.json` per search: the
    index commits by replacing that file (layout's atomic rename: a new inode), and a committed state's
    files never change under their names, so a new commit drops every footer. A file a newer commit
    removed raises FileNotFoundError, which `search` answers by reading the state again. Thread-safe:
    the gateway runs lookups in threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._state: layout.IndexState | None = None
        self._footers: dict[str, Any] = {}

    def state(self, root: Path) -> layout.IndexState:
        try:
            st = os.stat(root / layout.STATE_FILE)
        except OSError:
            return layout.load_state(root)  # its errors (no index, not a directory) say it best
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key == self._key and self._state is not None:
                return self._state
        state = layout.load_state(root)
        with self._lock:
            self._key, self._state, self._footers = key, state, {}
        return state

    def open(self, path: Path) -> Any:
        name = str(path)
        with self._lock:
            metadata = self._footers.get(name)
        parquet = open_parquet(path, metadata)
        if metadata is None:
            with self._lock:
                self._footers[name] = parquet.metadata
        return parquet


_CACHES: dict[Path, IndexCache] = {}
_CACHES_LOCK = threading.Lock()


def cache_for(index_dir: Path) -> IndexCache:
    """The process's cache of one index directory (one per directory a server serves)."""
    root = Path(index_dir)
    with _CACHES_LOCK:
        return _CACHES.setdefault(root, IndexCache())


def search(
    index_dir: Path, query: Query, *, with_records: bool = True, cache: IndexCache | None = None
) -> SearchResult:
    """Run a query against the committed index (retrying once if a compaction swapped files under us);
    `cache` (a server's) keeps the state and footers between searches."""
    query = query.validate()
    root = Path(index_dir)
    for attempt in range(3):
        state = layout.load_state(root) if cache is None else cache.state(root)
        try:
            return _search(root, state, query, with_records, cache)
        except FileNotFoundError:
            if attempt == 2:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _search(
    root: Path, state: layout.IndexState, query: Query, with_records: bool, cache: IndexCache | None
) -> SearchResult:
    started = time.perf_counter()
    stats = SearchStats()
    columns = [*SUMMARY_COLUMNS, "record"] if with_records else list(SUMMARY_COLUMNS)
    if query.message_id is not None:
        stats.bucket = bucket_of(query.message_id, state.buckets)
        rows = _point_lookup(
            layout.bucket_files(root, state, stats.bucket), query.message_id, columns, stats, cache
        )
        if query.request_id is not None:
            rows = [row for row in rows if _of_request(row, query.request_id, {query.message_id})]
    elif query.request_id is not None:
        rows = _by_request(root, state, query.request_id, columns, stats, cache)
    else:
        rows = _scan(layout.all_files(root, state), query, columns, stats)
    rows = [row for row in rows if _matches(row, query)]
    rows.sort(key=lambda row: (row["ts"] if row["ts"] is not None else 0.0, row["id"] or ""))
    truncated = query.limit is not None and len(rows) > query.limit
    if truncated:
        rows = rows[: query.limit]
    stats.seconds = time.perf_counter() - started
    return SearchResult(query, rows, stats, truncated)


def _may_contain(statistics: Any, value: str) -> bool:
    if statistics is None or not statistics.has_min_max:
        return True  # no statistics: cannot prune
    return bool(statistics.min <= value <= statistics.max)


def _by_request(
    root: Path,
    state: layout.IndexState,
    request_id: str,
    columns: list[str],
    stats: SearchStats,
    cache: IndexCache | None,
) -> list[dict[str, Any]]:
    """The stories of the messages request `request_id` sent: which messages, from a scan of two columns
    of every file; then each message's records by its bucket, as a message-id lookup reads them."""
    import pyarrow.dataset as ds

    from .schema import arrow_schema

    files = layout.all_files(root, state)
    if not files:
        return []
    stats.files_opened.extend(str(p) for p in files)
    dataset = ds.dataset([str(p) for p in files], format="parquet", schema=arrow_schema())
    table = dataset.to_table(
        columns=["message_id", "request_id"], filter=ds.field("request_id") == request_id
    )
    stats.rows_read += table.num_rows
    messages = {m for m in table.column("message_id").to_pylist() if m is not None}
    rows: list[dict[str, Any]] = []
    for message_id in sorted(messages):
        found = _point_lookup(
            layout.bucket_files(root, state, bucket_of(message_id, state.buckets)),
            message_id,
            columns,
            stats,
            cache,
        )
        rows.extend(row for row in found if _of_request(row, request_id, messages))
    return rows


def _of_request(row: dict[str, Any], request_id: str, messages: set[str]) -> bool:
    """A record of a message the request sent: its own request id, or none (a record that does not say,
    such as a fence event or a call of a worker that does not pass it on). A message id sent again by
    another request (a replay, a redrive under the same id) keeps that request's records apart."""
    return row["message_id"] in messages and row["request_id"] in (None, request_id)


def _point_lookup(
    files: list[Path], message_id: str, columns: list[str], stats: SearchStats, cache: IndexCache | None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    key = _sort_key(message_id)
    for path in files:
        parquet = open_parquet(path) if cache is None else cache.open(path)
        stats.files_opened.append(str(path))
        metadata = parquet.metadata
        column = parquet.schema_arrow.get_field_index("message_id")
        stats.row_groups_total += metadata.num_row_groups
        wanted = [
            i
            for i in range(metadata.num_row_groups)
            if _may_contain(metadata.row_group(i).column(column).statistics, message_id)
        ]
        if not wanted:
            continue
        stats.row_groups_read += len(wanted)
        # Two steps: the message id column alone first (a few % of a row group's bytes: the `record`
        # column is most of them), then the other columns only when the id is there. An absent id
        # (statistics admit most ids) costs one small column; threads do not pay for reads this small.
        ids = parquet.read_row_groups(wanted, columns=["message_id"], use_threads=False).column(0).to_pylist()
        stats.rows_read += len(ids)
        # Rows are sorted by message id: the match is one contiguous run. (Slicing needs no compute
        # kernels: pyarrow.compute's filter would import pandas, 150 ms, when it is installed.)
        start = bisect.bisect_left(ids, key, key=_sort_key)
        end = bisect.bisect_right(ids, key, key=_sort_key)
        if start == end:
            continue
        table = parquet.read_row_groups(wanted, columns=columns, use_threads=False)
        rows.extend(
            row for row in table.slice(start, end - start).to_pylist() if row["message_id"] == message_id
        )
    return rows


def _sort_key(value: str | None) -> tuple[bool, str]:
    """The files' order: nulls first, then by code point (= UTF-8 byte order, Parquet's)."""
    return (value is not None, value or "")


def _scan(files: list[Path], query: Query, columns: list[str], stats: SearchStats) -> list[dict[str, Any]]:
    import pyarrow.dataset as ds

    from .schema import arrow_schema

    if not files:
        return []
    stats.files_opened.extend(str(p) for p in files)
    expression = None
    for name in ("group", "worker"):
        value = getattr(query, name)
        if value is not None:
            term = ds.field(name) == value
            expression = term if expression is None else expression & term
    dataset = ds.dataset([str(p) for p in files], format="parquet", schema=arrow_schema())
    table = dataset.to_table(columns=columns, filter=expression)
    stats.rows_read = table.num_rows
    found: list[dict[str, Any]] = table.to_pylist()
    return found


def _matches(row: dict[str, Any], query: Query) -> bool:
    if query.group is not None and row["group"] != query.group:
        return False
    if query.worker is not None and row["worker"] != query.worker:
        return False
    if query.since is not None or query.until is not None:
        ts = row["ts"]
        if ts is None:
            return False
        if (query.since is not None and ts < query.since) or (query.until is not None and ts > query.until):
            return False
    if query.status is not None:
        status = row["status"]
        if status is None:
            return False
        if isinstance(query.status, int):
            return bool(status == query.status)
        return bool(status // 100 == int(str(query.status)[0]))
    return True
