"""Streaming reader over wire-log segments: gzip or plain, constant memory, problems counted not hidden.

`read_records` decodes chunk by chunk (never a whole segment in memory) and skips, *and counts in
`ReadStats`*, torn last lines (an open segment mid-write, a truncated gzip), lines that are not JSON
records and records of unknown schema versions. `merged_records` gives a directory's records in time
order (the writers' streams merged), `tail_records` the newest ones. `Follower` reads what is appended
after a point, across rotation and compression (for `tail --follow`). `RecordFilter` is the one record
predicate shared by the CLI, and later by replay.
"""

from __future__ import annotations

import gzip
import heapq
import io
import os
import re
import zlib
from collections import deque
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wirelog.errors import RecordError, SegmentError, TornLine, UnknownVersion
from wirelog.layout import CLOSED, GZ, OPEN, TMP, SegmentName, parse_segment_name
from wirelog.record import KINDS, LineSplitter, Record, compat, decode_line

CHUNK = 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_STATUS_CLASS = re.compile(r"^([1-5])xx$", re.IGNORECASE)
# Which file to read when several states of one segment exist at once (mid-rotation/compression).
_PREFERENCE = {GZ: 0, CLOSED: 1, OPEN: 2}


# ------------------------------------------------------------------------------------------- stats
@dataclass(slots=True)
class ReadStats:
    """What a read saw, including everything it skipped, with one note per file that had problems."""

    files: int = 0
    records: int = 0  # valid records decoded (before filtering)
    matched: int = 0  # records yielded (after filtering)
    torn_lines: int = 0  # incomplete last lines: an open segment mid-write, a truncated gzip
    bad_lines: int = 0  # not JSON, not an object, no integer `v`, empty, oversized
    unknown_versions: int = 0  # valid JSON records of a schema version this code does not know
    corrupt_files: int = 0  # gzip streams that end early or fail their CRC
    missing_files: int = 0  # segments that disappeared between listing and reading
    notes: list[str] = field(default_factory=list)

    @property
    def problems(self) -> int:
        return (
            self.torn_lines + self.bad_lines + self.unknown_versions + self.corrupt_files + self.missing_files
        )

    def summary(self) -> str:
        """One line for stderr: what was skipped."""
        parts = [
            f"{count} {label}"
            for count, label in (
                (self.torn_lines, "torn last line(s)"),
                (self.bad_lines, "unreadable line(s)"),
                (self.unknown_versions, "record(s) of an unknown schema version"),
                (self.corrupt_files, "truncated/corrupt gzip segment(s)"),
                (self.missing_files, "segment(s) gone before they could be read"),
            )
            if count
        ]
        read = f"read {self.records} record(s) from {self.files} segment(s)"
        return read + ("; skipped " + ", ".join(parts) if parts else "")


# ------------------------------------------------------------------------------------------ filter
def parse_status(value: int | str) -> int | str:
    """`502` -> 502, `"5xx"` -> `"5xx"`; ValueError otherwise (the CLI maps it to exit 2)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 100 <= value <= 599:
            return value
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit() and 100 <= int(text) <= 599:
            return int(text)
        if _STATUS_CLASS.fullmatch(text):
            return text.lower()
    raise ValueError(f"status must be an HTTP status (100-599) or a class like 5xx, not {value!r}")


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Conjunction of the given criteria; None means "any". `since`/`until` are inclusive epoch seconds."""

    message_id: str | None = None
    group: str | None = None
    worker: str | None = None
    status: int | str | None = None  # 502, or a class "5xx" (matches http responses only)
    since: float | None = None
    until: float | None = None
    kind: str | None = None
    queue: str | None = None
    action: str | None = None
    request_id: str | None = None  # the id of the request that sent the message

    def __post_init__(self) -> None:
        if self.status is not None:
            object.__setattr__(self, "status", parse_status(self.status))
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")

    @property
    def empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__slots__)

    def matches(self, record: Mapping[str, Any]) -> bool:
        for name in ("message_id", "group", "worker", "kind", "queue", "action", "request_id"):
            wanted = getattr(self, name)
            if wanted is not None and record.get(name) != wanted:
                return False
        if self.since is not None or self.until is not None:
            ts = record.get("ts")
            if not isinstance(ts, int | float):
                return False
            if (self.since is not None and ts < self.since) or (self.until is not None and ts > self.until):
                return False
        if self.status is not None:
            response = record.get("response")
            status = response.get("status") if isinstance(response, dict) else None
            if not isinstance(status, int):
                return False
            if isinstance(self.status, int):
                return status == self.status
            return status // 100 == int(self.status[0])
        return True


# ---------------------------------------------------------------------------------------- segments
def _best_segments(directory: Path) -> dict[tuple[str, int, str], SegmentName]:
    best: dict[tuple[str, int, str], SegmentName] = {}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        raise SegmentError(f"wire-log directory {directory} does not exist") from None
    except NotADirectoryError:
        raise SegmentError(f"{directory} is not a directory") from None
    for entry in entries:
        name = parse_segment_name(entry.name)
        if name is None or name.state == TMP:
            continue
        current = best.get(name.key)
        if current is None or _PREFERENCE[name.state] < _PREFERENCE[current.state]:
            best[name.key] = name
    return best


def segments(directory: Path, *, include_open: bool = True) -> list[Path]:
    """Segment files in time order (writer start stamp, then sequence; across writers).

    One file per segment: when a segment exists in two states mid-rotation (`.jsonl` and `.jsonl.gz`),
    the more final one is listed, so nothing is read twice. `.gz.tmp` files are never listed.
    """
    directory = Path(directory)
    chosen = sorted(
        (n for n in _best_segments(directory).values() if include_open or n.state != OPEN),
        key=lambda n: n.key,
    )
    return [directory / n.filename(n.state) for n in chosen]


# ----------------------------------------------------------------------------------------- reading
def _open_stream(path: Path) -> io.BufferedIOBase:
    raw = open(path, "rb")  # handed to the caller, closed by _close
    try:
        magic = raw.read(2)
        raw.seek(0)
    except BaseException:
        raw.close()
        raise
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # closing it does not close raw: see _close
    return raw


def _close(stream: io.BufferedIOBase) -> None:
    inner = getattr(stream, "fileobj", None)
    stream.close()
    if inner is not None:
        inner.close()


def _scan(
    stream: io.BufferedIOBase,
    *,
    label: str,
    stats: ReadStats,
    where: RecordFilter | None,
    skip: int = 0,
    live: bool = False,
) -> Generator[Record, None, tuple[int, bool]]:
    """Yield the records of complete lines after uncompressed offset `skip`.

    Returns (offset just after the last complete line, whether the stream ended cleanly). With
    `live`, an incomplete last line is left for later instead of being counted as torn.
    """
    splitter = LineSplitter()
    consumed = skip
    bad = unknown = 0
    first_bad: int | None = None
    lines_seen = 0
    clean = True
    failure = ""
    remaining = skip
    # GzipFile.read() loops over several raw reads and loses what it decompressed when a later one
    # hits a truncated stream; read1() does one at a time, so everything before a tear is delivered.
    read = stream.read1 if isinstance(stream, gzip.GzipFile) else stream.read
    while True:
        try:
            if remaining and not isinstance(stream, gzip.GzipFile):
                stream.seek(skip)
                remaining = 0
            while remaining > 0:  # gzip cannot seek cheaply: decompress and drop what was read before
                dropped = read(min(remaining, CHUNK))
                if not dropped:
                    break
                remaining -= len(dropped)
            chunk = read(CHUNK)
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:  # truncated or corrupt gzip
            clean = False
            failure = str(exc) or type(exc).__name__
            break
        if not chunk:
            break
        consumed += len(chunk)
        for line in splitter.feed(chunk):
            lines_seen += 1
            try:
                record = compat(decode_line(line))
            except UnknownVersion:
                unknown += 1
                continue
            except RecordError:
                bad += 1
                if first_bad is None:
                    first_bad = lines_seen
                continue
            stats.records += 1
            if where is None or where.matches(record):
                stats.matched += 1
                yield record
    position = consumed - splitter.pending
    bad += splitter.oversized
    if not clean:
        stats.corrupt_files += 1
        stats.notes.append(f"{label}: gzip stream ends early or is corrupt ({failure}); read up to there")
    if not live or not clean:
        try:
            splitter.finish()
        except TornLine as torn:
            stats.torn_lines += 1
            position += torn.size
            where_from = "segment still open or its writer crashed" if label.endswith(OPEN) else "truncated"
            stats.notes.append(f"{label}: skipped a torn last line ({torn.size} bytes; {where_from})")
    if bad:
        stats.bad_lines += bad
        at = f" (first at line {first_bad} after offset {skip})" if first_bad is not None else ""
        stats.notes.append(f"{label}: skipped {bad} line(s) that are not wire-log records{at}")
    if unknown:
        stats.unknown_versions += unknown
        stats.notes.append(f"{label}: skipped {unknown} record(s) of an unknown schema version")
    return position, clean


def _successors(path: Path) -> list[Path]:
    """Where a segment goes next if it vanished under us: open -> closed -> gz."""
    name = parse_segment_name(path.name)
    if name is None:
        return []
    order = [OPEN, CLOSED, GZ]
    if name.state not in order:
        return []
    return [path.with_name(name.filename(state)) for state in order[order.index(name.state) + 1 :]]


def _read_one(path: Path, stats: ReadStats, where: RecordFilter | None) -> Iterator[Record]:
    for candidate in (path, *_successors(path)):
        try:
            stream = _open_stream(candidate)
        except FileNotFoundError:
            continue  # rotated or compressed between listing and opening: read its next state
        except OSError as exc:
            stats.missing_files += 1
            stats.notes.append(f"{candidate.name}: cannot read ({exc})")
            return
        stats.files += 1
        try:
            yield from _scan(stream, label=candidate.name, stats=stats, where=where)
        finally:
            _close(stream)
        return
    stats.missing_files += 1
    stats.notes.append(f"{path.name}: disappeared before it could be read")


def read_records(
    path_or_dir: Path | str,
    *,
    include_open: bool = True,
    stats: ReadStats | None = None,
    where: RecordFilter | None = None,
) -> Iterator[Record]:
    """Records of one segment file or of every segment in a directory (time order), streamed.

    Skipped lines are counted in `stats` (pass one in to see them). Records are upgraded with
    `compat`. `where` keeps only matching records.
    """
    stats = stats if stats is not None else ReadStats()
    path = Path(path_or_dir)
    if path.is_dir():
        for segment in segments(path, include_open=include_open):
            yield from _read_one(segment, stats, where)
    elif path.exists() or any(successor.exists() for successor in _successors(path)):
        yield from _read_one(path, stats, where)  # a segment named in an older state is read in its new one
    else:
        raise SegmentError(f"{path} does not exist")


# ----------------------------------------------------------------------------------------- follow
class Follower:
    """Reads records appended to a directory's segments, across rotation and compression, exactly once.

    Segments are tracked by identity (writer, stamp, seq), not by file name, so a segment that is
    renamed `.open` -> `.jsonl` -> `.jsonl.gz` while followed continues where it left off.
    """

    def __init__(self, directory: Path, *, stats: ReadStats | None = None, where: RecordFilter | None = None):
        self.directory = Path(directory)
        self.stats = stats if stats is not None else ReadStats()
        self.where = where
        self._offsets: dict[tuple[str, int, str], int] = {}
        self._finished: set[tuple[str, int, str]] = set()

    def skip(self, key: tuple[str, int, str]) -> None:
        """Treat a (closed) segment as already read."""
        self._finished.add(key)

    def read_segment(self, name: SegmentName) -> list[Record]:
        """New records of one segment since the last call (all of it the first time)."""
        key = name.key
        if key in self._finished:
            return []
        for state in (CLOSED, GZ, OPEN) if name.state != OPEN else (OPEN, CLOSED, GZ):
            path = self.directory / name.filename(state)
            try:
                stream = _open_stream(path)
            except FileNotFoundError:
                continue
            live = state == OPEN
            records: list[Record] = []
            try:
                scan = _scan(
                    stream, label=path.name, stats=self.stats, where=self.where,
                    skip=self._offsets.get(key, 0), live=live,
                )  # fmt: skip
                while True:
                    try:
                        records.append(next(scan))
                    except StopIteration as stop:
                        position, clean = stop.value
                        break
            finally:
                _close(stream)
            if key not in self._offsets:
                self.stats.files += 1
            self._offsets[key] = position
            if not live or not clean:
                self._finished.add(key)
                self._offsets.pop(key, None)
            return records
        return []  # gone in every state: removed by retention

    def poll(self) -> list[Record]:
        """Everything new in the directory since the last poll, in segment order."""
        found: list[Record] = []
        for name in sorted(_best_segments(self.directory).values(), key=lambda n: n.key):
            found.extend(self.read_segment(name))
        return found


def tail_records(
    directory: Path, count: int, *, where: RecordFilter | None = None, stats: ReadStats | None = None
) -> tuple[list[Record], Follower]:
    """The last `count` (matching) records by time, across every writer, and a Follower positioned right
    after them.

    Segment names order a writer's own segments in time, but not different writers' (a name carries its
    writer instance's start, and a proxy started after the core writes segments named later than the
    core's newest). So each writer's stream is read newest segment first until it has given `count`
    records; the newest `count` overall are among those. Open segments are always read (the follower
    goes on from their end). Memory: `count` records per writer, whatever the segments' sizes.
    """
    follower = Follower(directory, stats=stats, where=where)
    directory = Path(directory)
    collected: list[Record] = []
    for names in _by_writer(directory, include_open=True).values():
        have = 0
        for name in reversed(names):
            if name.state == OPEN:
                got = follower.read_segment(name)
            elif have < count:
                follower.skip(name.key)  # closed: nothing more will be appended
                recent: deque[Record] = deque(maxlen=count)
                recent.extend(_read_one(directory / name.filename(name.state), follower.stats, where))
                got = list(recent)
            else:
                follower.skip(name.key)
                continue
            if count > 0:
                collected.extend(got[-count:])
                have += len(got)
    collected.sort(key=_ts_key)
    return (collected[-count:] if count > 0 else []), follower


def merged_records(
    directory: Path | str,
    *,
    include_open: bool = True,
    stats: ReadStats | None = None,
    where: RecordFilter | None = None,
) -> Iterator[Record]:
    """Every (matching) record of a directory in time order, streamed: each writer's segments are read in
    order (a writer appends in time order) and the writers' streams are merged by `ts` (heapq.merge). One
    open segment per writer at a time, so memory stays bounded whatever the directory holds."""
    stats = stats if stats is not None else ReadStats()
    directory = Path(directory)
    streams = [
        _chain(directory, names, stats, where)
        for names in _by_writer(directory, include_open=include_open).values()
    ]
    return heapq.merge(*streams, key=_ts_key)


def _by_writer(directory: Path, *, include_open: bool) -> dict[str, list[SegmentName]]:
    """Each writer name's segments in time order (writer start stamp, then sequence)."""
    streams: dict[str, list[SegmentName]] = {}
    for name in sorted(_best_segments(directory).values(), key=lambda n: n.key):
        if include_open or name.state != OPEN:
            streams.setdefault(name.writer, []).append(name)
    return streams


def _chain(
    directory: Path, names: list[SegmentName], stats: ReadStats, where: RecordFilter | None
) -> Iterator[Record]:
    for name in names:
        yield from _read_one(directory / name.filename(name.state), stats, where)


def _ts_key(record: Mapping[str, Any]) -> float:
    ts = record.get("ts")
    return float(ts) if isinstance(ts, int | float) else 0.0
