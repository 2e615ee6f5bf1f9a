"""Append-only, rotating, crash-safe wire-log writer (one per writing process).

Guarantees (docs/wirelog.md has the details):

- Records are appended to the writer's open segment; the file on disk is always a prefix of what was
  written, so a crash can only tear the *last* line, never corrupt earlier records.
- `fsync="always"` syncs every record; `"interval"` at most every `fsync_interval` seconds (on a write
  or on `tick()`), so a crash loses at most that tail; `"never"` leaves it to the OS.
- Rotation (size, or age on write and on `tick()`): the segment is flushed, fsynced and renamed from
  `.jsonl.open` to `.jsonl` (closed, complete), then a background thread gzips it to `.jsonl.gz.tmp`,
  fsyncs, renames it to `.jsonl.gz` and removes the `.jsonl`. At every instant either the complete
  plain segment or the complete gzip exists under its final name, never a half-written gzip.
- The age defaults to 30 s (`$STRICTQ_WIRELOG_SEGMENT_AGE` overrides it), so a running server's records
  are in a closed, indexable segment within a minute (`strictq index` reads closed segments only: it
  tracks what it indexed by whole segment). A segment is opened by a write, never by a timer, so an idle
  writer creates no files.
- On start-up the writer recovers its own name's leftovers: `.open` segments of a crashed predecessor
  lose their torn last line (counted and logged) and are closed and compressed; stale `.gz.tmp` files
  are removed; a `.jsonl` whose `.jsonl.gz` already exists is removed.
- A lock file (`.<writer>.lock`, flock) makes a second live writer of the same name fail fast instead
  of "recovering" the first one's open segment.

Threading: a writer is used from one thread (or one event loop); it is not thread-safe. The
compression thread touches closed files only, and only the counters in `stats` are shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from wirelog.errors import RecordError, SegmentError
from wirelog.layout import (
    CLOSED,
    GZ,
    OPEN,
    TMP,
    WRITER_NAME,
    SegmentName,
    fsync_dir,
    micros_from_stamp,
    parse_segment_name,
    stamp_from_micros,
)
from wirelog.record import KINDS, SCHEMA_VERSION, encode

log = logging.getLogger("wirelog")

MiB = 1024 * 1024
FsyncPolicy = Literal["always", "interval", "never"]
FSYNC_POLICIES: tuple[FsyncPolicy, ...] = ("always", "interval", "never")
FILE_MODE = 0o640  # the wire log holds (redacted) traffic: not world-readable
DIR_MODE = 0o750
COPY_CHUNK = 1 * MiB
DEFAULT_SEGMENT_AGE = 30.0  # seconds: `strictq index` sees a running server's records within a minute
ENV_SEGMENT_AGE = "STRICTQ_WIRELOG_SEGMENT_AGE"


def default_segment_age() -> float:
    """The segment age of writers not given one: `$STRICTQ_WIRELOG_SEGMENT_AGE` (`30`, `30s`, `2m`, `0.2`),
    else 30 s. One variable reaches every writer of `strictq serve` (gateway, core, the proxy child); a bad
    value is one WARNING line and the default, never a server that does not start."""
    text = os.environ.get(ENV_SEGMENT_AGE, "").strip()
    if not text:
        return DEFAULT_SEGMENT_AGE
    from wirelog.times import TimeParseError, parse_duration

    try:
        age = parse_duration(text)
    except TimeParseError as exc:
        age = -1.0
        problem = str(exc)
    else:
        problem = "must be > 0"
    if age > 0:
        return age
    log.warning("%s=%r: %s; using %g s", ENV_SEGMENT_AGE, text, problem, DEFAULT_SEGMENT_AGE)
    return DEFAULT_SEGMENT_AGE


@dataclass(slots=True)
class WriterStats:
    """Counters for /metrics. Plain ints; the compression thread updates its own fields only."""

    records: int = 0
    bytes: int = 0
    fsyncs: int = 0
    segments_opened: int = 0
    segments_closed: int = 0
    segments_compressed: int = 0
    compress_errors: int = 0
    recovered_segments: int = 0
    recovered_torn_lines: int = 0
    recovered_torn_bytes: int = 0
    stale_tmp_removed: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class WireLogWriter:
    """Writes records to `<directory>/<writer>.<stamp>.<seq>.jsonl.open` and rotates them (see module doc)."""

    def __init__(
        self,
        directory: Path,
        writer: str,
        *,
        max_segment_bytes: int = 64 * MiB,
        max_segment_age: float | None = None,
        fsync: FsyncPolicy = "interval",
        fsync_interval: float = 1.0,
        compress: bool = True,
        compress_level: int = 6,
        buffer_bytes: int = 256 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not WRITER_NAME.fullmatch(writer):
            raise ValueError(f"writer name {writer!r}: use 1-64 of A-Z a-z 0-9 _ - (it names files)")
        if max_segment_age is None:
            max_segment_age = default_segment_age()
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        if max_segment_bytes <= 0 or max_segment_age <= 0 or fsync_interval < 0 or buffer_bytes < 0:
            raise ValueError("max_segment_bytes and max_segment_age must be > 0, intervals >= 0")
        self.directory = Path(directory)
        self.name = writer
        self.max_segment_bytes = max_segment_bytes
        self.max_segment_age = max_segment_age
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval = fsync_interval
        self.compress = compress
        self.stats = WriterStats()
        self._clock = clock
        self._buffer_limit = buffer_bytes
        try:
            self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise SegmentError(f"cannot create wire-log directory {self.directory}: {exc}") from exc
        self._lock_fd: int | None = self._lock()
        try:
            self._compressor = _Compressor(self.stats, compress_level) if compress else None
            newest = self._recover()
            micros = max(int(clock() * 1_000_000), newest + 1)
        except BaseException:
            self._unlock()
            raise
        # Distinct from every earlier instance of this writer name in the directory, even if the
        # clock went backwards: record ids stay unique across restarts.
        self.instance = stamp_from_micros(micros)
        self._id_prefix = f"{writer}-{self.instance}-"
        self._counter = 0
        self._seq = 0
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._opened_at = 0.0
        self._buffer = bytearray()
        self._unsynced = False  # bytes handed to the OS since the last fsync
        self._last_sync = clock()
        self._closed = False

    # ------------------------------------------------------------------------------------ writing
    def write(self, record: Mapping[str, Any]) -> str:
        """Append one record; fills `v`, `id`, `ts` (if missing) and `writer`; returns the id."""
        if self._closed:
            raise SegmentError(f"wire-log writer {self.name!r} is closed")
        if not isinstance(record, Mapping):
            raise RecordError(f"a record is a mapping, not {type(record).__name__}")
        kind = record.get("kind")
        if kind not in KINDS:
            raise RecordError(f"record kind {kind!r} is not one of {', '.join(KINDS)}")
        if record.get("v", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise RecordError(f"this writer writes schema v{SCHEMA_VERSION}, not v{record.get('v')}")
        if record.get("id") is not None or record.get("writer", self.name) not in (None, self.name):
            raise RecordError("`id` and `writer` are assigned by the writer")
        now = self._clock()
        record_id = self._id_prefix + str(self._counter + 1)
        ts = record.get("ts")
        # The writer's fields first, then the record's in its order: one C-level merge (the record's own
        # `v`/`kind`/`ts`/... keep their place at the head) and the head's values set again after it.
        out: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "kind": kind,
            "id": record_id,
            "ts": ts,
            "writer": None,
            **record,
        }
        out["v"] = SCHEMA_VERSION
        out["id"] = record_id
        out["ts"] = now if ts is None else ts
        out["writer"] = self.name
        line = encode(out)
        self._counter += 1

        if self._fd is not None and (
            self._size + len(line) > self.max_segment_bytes or now - self._opened_at >= self.max_segment_age
        ):
            self._rotate()
        if self._fd is None:
            self._open_segment(now)
        self._buffer += line
        self._size += len(line)
        self.stats.records += 1
        self.stats.bytes += len(line)
        if self.fsync_policy == "always":
            self._flush_buffer()
            self._fsync(now)
        else:
            if len(self._buffer) >= self._buffer_limit:
                self._flush_buffer()
            if self.fsync_policy == "interval" and now - self._last_sync >= self.fsync_interval:
                self._flush_buffer()
                self._fsync(now)
        return record_id

    def tick(self, now: float | None = None) -> None:
        """Timer duty (call every ~second): age rotation, and the interval flush+fsync of an idle tail."""
        if self._closed:
            return
        now = self._clock() if now is None else now
        if self._fd is None:
            return
        if now - self._opened_at >= self.max_segment_age:
            self._rotate()
            return
        self._flush_buffer()
        if self.fsync_policy != "never" and now - self._last_sync >= self.fsync_interval:
            self._fsync(now)

    def flush(self) -> None:
        """Hand buffered records to the OS (survives a process crash, not a power loss)."""
        if self._fd is not None:
            self._flush_buffer()

    def sync(self) -> None:
        """Flush and fsync now, whatever the policy."""
        if self._fd is not None:
            self._flush_buffer()
            self._fsync(self._clock())

    def rotate(self) -> None:
        """Close the current segment now (it is compressed in the background); no-op when none is open."""
        if self._fd is not None:
            self._rotate()

    def close(self, *, wait: bool = True) -> None:
        """Close the open segment and, with `wait`, let the compression thread finish its queue."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._fd is not None:
                self._rotate()
        finally:
            if self._compressor is not None:
                self._compressor.close(wait=wait)
            self._unlock()

    def wait_compressed(self, timeout: float | None = None) -> bool:
        """Block until every closed segment so far is compressed; False on timeout (tests, shutdown)."""
        return True if self._compressor is None else self._compressor.wait_idle(timeout)

    def __enter__(self) -> WireLogWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def current_segment(self) -> Path | None:
        """The open segment's path (None until the first write after a rotation)."""
        return self._path

    def counters(self) -> dict[str, int]:
        """Counters for /metrics, plus the segments waiting for compression."""
        counters = self.stats.as_dict()
        counters["segments_pending_compression"] = 0 if self._compressor is None else self._compressor.pending
        return counters

    # ---------------------------------------------------------------------------------- internals
    def _open_segment(self, now: float) -> None:
        self._seq += 1
        name = SegmentName(self.name, self.instance, self._seq, OPEN)
        path = self.directory / name.filename(OPEN)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
            fsync_dir(self.directory)  # the new name must survive a crash, or its records vanish with it
        except OSError as exc:
            raise SegmentError(f"cannot open wire-log segment {path}: {exc}") from exc
        self._fd = fd
        self._path = path
        self._size = 0
        self._opened_at = now
        self._last_sync = now
        self.stats.segments_opened += 1

    def _flush_buffer(self) -> None:
        buffer = self._buffer
        if not buffer or self._fd is None:
            return
        try:
            while buffer:  # a short write leaves the rest buffered: the file stays a prefix
                written = os.write(self._fd, buffer)
                del buffer[:written]
        except OSError as exc:
            raise SegmentError(f"cannot append to {self._path}: {exc}") from exc
        self._unsynced = True

    def _fsync(self, now: float) -> None:
        if self._fd is not None and self._unsynced:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise SegmentError(f"cannot fsync {self._path}: {exc}") from exc
            self.stats.fsyncs += 1
            self._unsynced = False
        self._last_sync = now

    def _rotate(self) -> None:
        fd, path = self._fd, self._path
        assert fd is not None and path is not None
        try:
            self._flush_buffer()
            os.fsync(fd)
        except OSError as exc:
            raise SegmentError(f"cannot close segment {path}: {exc}") from exc
        finally:
            # Even when the sync failed, the descriptor is done: the next write opens a new segment
            # and the unsynced file is closed and recovered like a crashed one at the next start.
            self._fd = None
            self._path = None
            self._buffer.clear()
            os.close(fd)
        self._unsynced = False
        closed = path.with_name(path.name.removesuffix(OPEN) + CLOSED)
        try:
            os.rename(path, closed)
            fsync_dir(self.directory)
        except OSError as exc:
            raise SegmentError(f"cannot close segment {path}: {exc}") from exc
        self.stats.segments_closed += 1
        if self._compressor is not None:
            self._compressor.submit(closed)

    def _lock(self) -> int:
        path = self.directory / f".{self.name}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise SegmentError(f"cannot create lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise SegmentError(
                f"wire-log writer name {self.name!r} is in use in {self.directory} by another writer "
                "(give each process its own writer name)"
            ) from None
        return fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _recover(self) -> int:
        """Tidy this writer name's leftovers; returns the newest start stamp seen (µs), or -1."""
        states: dict[str, set[str]] = {}
        names: dict[str, SegmentName] = {}
        for entry in os.scandir(self.directory):
            name = parse_segment_name(entry.name)
            if name is None or name.writer != self.name:
                continue
            states.setdefault(name.base, set()).add(name.state)
            names[name.base] = name
        newest = -1
        changed = False
        to_compress: list[Path] = []
        for base in sorted(states, key=lambda b: names[b].key):
            present = states[base]
            newest = max(newest, micros_from_stamp(names[base].stamp))
            path = {state: self.directory / (base + state) for state in (OPEN, CLOSED, GZ, TMP)}
            if TMP in present:  # a compression that never finished: the plain segment is still there
                path[TMP].unlink(missing_ok=True)
                self.stats.stale_tmp_removed += 1
                changed = True
                log.info("wirelog: removed unfinished compression %s", path[TMP].name)
            if GZ in present:  # the gzip is complete (renamed only after fsync): leftovers are copies
                for state in (CLOSED, OPEN):
                    if state in present:
                        path[state].unlink(missing_ok=True)
                        changed = True
                continue
            if OPEN in present:
                if CLOSED in present:  # cannot happen with atomic renames; keep the closed copy
                    log.warning("wirelog: %s exists both open and closed; keeping the closed one", base)
                    path[OPEN].unlink(missing_ok=True)
                else:
                    self._recover_open(path[OPEN], path[CLOSED])
                changed = True
            if path[CLOSED].exists():
                to_compress.append(path[CLOSED])
        if changed:
            fsync_dir(self.directory)
        if self._compressor is not None:
            for closed in to_compress:
                self._compressor.submit(closed)
        return newest

    def _recover_open(self, open_path: Path, closed_path: Path) -> None:
        """Close a crashed predecessor's open segment: drop its torn last line, then rename it closed."""
        try:
            torn, kept = truncate_torn_tail(open_path)
            if kept == 0:
                open_path.unlink()
            else:
                os.rename(open_path, closed_path)
        except OSError as exc:
            raise SegmentError(f"cannot recover segment {open_path}: {exc}") from exc
        self.stats.recovered_segments += 1
        if torn:
            self.stats.recovered_torn_lines += 1
            self.stats.recovered_torn_bytes += torn
            log.warning(
                "wirelog: recovered %s left open by a crashed writer: dropped a torn last line (%d bytes), "
                "kept %d bytes",
                open_path.name,
                torn,
                kept,
            )
        else:
            log.warning(
                "wirelog: recovered %s left open by a crashed writer (%d bytes)", open_path.name, kept
            )


def truncate_torn_tail(path: Path) -> tuple[int, int]:
    """Cut `path` after its last newline (fsynced); returns (bytes removed, bytes kept)."""
    with open(path, "r+b") as file:
        size = file.seek(0, os.SEEK_END)
        keep = 0
        position = size
        while position > 0:  # scan backwards: only the torn tail is read
            start = max(0, position - COPY_CHUNK)
            file.seek(start)
            newline = file.read(position - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            position = start
        if keep < size:
            file.truncate(keep)
            file.flush()
            os.fsync(file.fileno())
    return size - keep, keep


def compress_segment(closed: Path, *, level: int = 6) -> Path:
    """Gzip a closed `.jsonl` segment crash-safely: `.gz.tmp`, fsync, rename to `.gz`, drop the plain one."""
    final = closed.with_name(closed.name.removesuffix(CLOSED) + GZ)
    tmp = closed.with_name(closed.name.removesuffix(CLOSED) + TMP)
    try:
        with open(closed, "rb") as source:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
            with os.fdopen(fd, "wb") as raw:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0) as gz:
                    while chunk := source.read(COPY_CHUNK):
                        gz.write(chunk)
                raw.flush()
                os.fsync(raw.fileno())
        os.replace(tmp, final)
        fsync_dir(closed.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    closed.unlink()
    fsync_dir(closed.parent)
    return final


class _Compressor:
    """One daemon thread compressing closed segments in order (one at a time: the box has 2 cores).

    zlib releases the GIL while deflating, so a 64 MiB segment does not stall the writer's event loop.
    A segment whose compression fails stays a complete `.jsonl` (readable); the next writer start
    retries it. If the process exits mid-compression, the same recovery applies.
    """

    def __init__(self, stats: WriterStats, level: int) -> None:
        self._stats = stats
        self._level = level
        self._jobs: deque[Path | None] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False

    @property
    def pending(self) -> int:
        with self._cond:
            return sum(job is not None for job in self._jobs) + self._busy

    def submit(self, path: Path) -> None:
        with self._cond:
            self._jobs.append(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wirelog-compress", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
                if job is None:
                    self._cond.notify_all()
                    return
                self._busy = True
            try:
                compress_segment(job, level=self._level)
                self._stats.segments_compressed += 1
            except Exception:
                self._stats.compress_errors += 1
                log.exception("wirelog: compressing %s failed; it stays uncompressed", job.name)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self._thread is None or (not self._busy and not any(self._jobs)), timeout
            )

    def close(self, *, wait: bool) -> None:
        with self._cond:
            thread = self._thread
            if thread is None:
                return
            self._jobs.append(None)
            self._cond.notify_all()
        if wait:
            thread.join()
