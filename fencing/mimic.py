"""I/O mimicry: answer a fenced worker's calls from responses recorded in the wire log.

The patent's I/O fencing with mimicry lets a fenced client keep running (e.g. a new client version
processing real messages) while the proxy answers its calls with what the backends answered before.

Matching (identity = method, host, path, query and body sha256, all after redaction, as the redact
addon computes `CallContext.request_identity` and as capture recorded them):
1. per message: a recording of the same message id and call ordinal with the same identity (the call
   this very message made before);
2. else by identity alone (any recorded call of the same endpoint and request).
Each candidate list is in recording order and replayed in order through a cursor kept per worker and
per message: repeated identical calls (polling a status) walk through the recorded sequence; past its
end the last response is repeated (a finished job stays finished). Cursors are never shared between
workers, so two concurrently mimic-fenced workers each see whole sequences.

Only `http` records with action `pass`, no error and a response whose body was kept are usable.
The index is bounded (records and body bytes); past a bound the oldest recordings are forgotten.

Pure (no mitmproxy): the mimic addon (`fencing.addons.mimic`) answers from it, through
`fencing.answering`; replay's index (`fencing.replay.matching`) is built from the same recordings.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from protocol.headers import PROXY_ACTION
from wirelog.record import ACTION_PASS, body_bytes_of

logger = logging.getLogger(__name__)

Identity = tuple[str, str, str, str, str]  # method, host, path, query, body sha256 (after redaction)

# Not replayed: they describe the recorded connection/encoding, not the answer (the body is stored decoded).
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "upgrade",
     "proxy-connection", "te", "trailer", PROXY_ACTION.lower()}
)  # fmt: skip


@dataclass(slots=True)
class Recording:
    """One recorded response, ready to be replayed."""

    record_id: str
    ts: float
    identity: Identity
    message_id: str | None
    call: int | None
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def sort_key(self) -> tuple[float, str]:
        return (self.ts, self.record_id)

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers) + 200


def identity_from_record(record: dict[str, Any]) -> Identity | None:
    """The request identity of a recorded call: the same tuple redact builds for a live one."""
    request = record.get("request")
    if not isinstance(request, dict):
        return None
    method, url, sha = request.get("method"), request.get("url"), request.get("body_sha256")
    if not isinstance(method, str) or not isinstance(url, str):
        return None
    return identity_from_url(method, url, sha if isinstance(sha, str) else "")


def identity_from_url(method: str, url: str, body_sha256: str) -> Identity:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return (method.upper(), host, parts.path or "/", parts.query, body_sha256 or "")


def recording_from_record(record: dict[str, Any]) -> Recording | None:
    """A usable recording, or None (not http, not passed, errored, no response or body not kept)."""
    if record.get("kind") != "http" or record.get("action") != ACTION_PASS or record.get("error"):
        return None
    response = record.get("response")
    if not isinstance(response, dict) or not isinstance(response.get("status"), int):
        return None
    body = body_bytes_of(response)
    if body is None and response.get("body_bytes"):
        return None  # logged at metadata level: the answer itself is not known
    identity = identity_from_record(record)
    record_id = record.get("id")
    if identity is None or not isinstance(record_id, str):
        return None
    raw_headers = response.get("headers") or []
    headers = [
        (str(pair[0]), str(pair[1]))
        for pair in raw_headers
        if isinstance(pair, list | tuple) and len(pair) == 2 and str(pair[0]).lower() not in HOP_HEADERS
    ]
    call = record.get("call")
    message_id = record.get("message_id")
    return Recording(
        record_id=record_id,
        ts=float(record.get("ts") or 0.0),
        identity=identity,
        message_id=message_id if isinstance(message_id, str) else None,
        call=call if isinstance(call, int) else None,
        status=response["status"],
        headers=headers,
        body=body or b"",
    )


def segment_files(directory: Path) -> list[Path]:
    """Wire-log segments under the directory and its subdirectories (one per writer process), one file
    per segment in its most final state, as wirelog's reader lists them."""
    from wirelog.reader import segments

    if not directory.is_dir():
        return []
    found: list[Path] = []
    for folder in [directory, *sorted(p for p in directory.rglob("*") if p.is_dir())]:
        try:
            found.extend(segments(folder, include_open=True))
        except Exception as exc:  # a folder vanishing mid-scan, or unreadable
            logger.debug("mimic: skipping %s: %s", folder, exc)
    return found


def read_file_records(path: Path) -> Iterator[dict[str, Any]]:
    """One segment's records through wirelog's reader (torn tails and unknown versions skipped)."""
    from wirelog.reader import read_records

    yield from read_records(path, include_open=True)


@dataclass
class LoadResult:
    """What one (re)load read from disk, built off the event loop and merged on it."""

    recordings: list[Recording]
    files: dict[str, tuple[int, int]]  # path -> (size, mtime_ns) as read
    errors: int = 0


def scan(directory: Path, known_files: dict[str, tuple[int, int]], known_ids: set[str]) -> LoadResult:
    """Read segments that are new or changed since `known_files`; blocking (run in a thread)."""
    result = LoadResult([], {})
    for path in segment_files(directory):
        try:
            stat = path.stat()
        except OSError:
            continue
        signature = (stat.st_size, stat.st_mtime_ns)
        key = str(path)
        result.files[key] = signature
        if known_files.get(key) == signature:
            continue
        try:
            for record in read_file_records(path):
                recording = recording_from_record(record)
                if recording is not None and recording.record_id not in known_ids:
                    result.recordings.append(recording)
        except Exception as exc:  # one unreadable segment must not hide the others
            result.errors += 1
            logger.warning("mimic: cannot read wire-log segment %s: %s", path, exc)
    result.recordings.sort(key=lambda r: r.sort_key)
    return result


@dataclass
class RecordingIndex:
    """Recordings by (message id, call, identity) and by identity, in recording order, bounded."""

    max_records: int = 200_000
    max_bytes: int = 256 * 1024 * 1024
    by_call: dict[tuple[str, int, Identity], list[Recording]] = field(default_factory=dict)
    by_identity: dict[Identity, list[Recording]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    loaded_at: float = 0.0  # monotonic time of the last merge
    bytes: int = 0
    evicted: int = 0
    _order: deque[Recording] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.ids)

    def merge(self, result: LoadResult) -> int:
        """Add what a scan found (on the event loop); returns how many recordings were new."""
        self.files.update(result.files)
        added = 0
        for recording in result.recordings:
            if recording.record_id in self.ids:
                continue
            self.add(recording)
            added += 1
        self.loaded_at = time.monotonic()
        return added

    def add(self, recording: Recording) -> None:
        self.ids.add(recording.record_id)
        self.bytes += recording.size
        self._order.append(recording)
        _insert(self.by_identity.setdefault(recording.identity, []), recording)
        if recording.message_id is not None and recording.call is not None:
            key = (recording.message_id, recording.call, recording.identity)
            _insert(self.by_call.setdefault(key, []), recording)
        while self._order and (len(self.ids) > self.max_records or self.bytes > self.max_bytes):
            self._evict(self._order.popleft())

    def _evict(self, recording: Recording) -> None:
        self.ids.discard(recording.record_id)
        self.bytes -= recording.size
        self.evicted += 1
        _remove(self.by_identity, recording.identity, recording)
        if recording.message_id is not None and recording.call is not None:
            _remove(self.by_call, (recording.message_id, recording.call, recording.identity), recording)

    def candidates(
        self, identity: Identity, message_id: str | None, call: int | None
    ) -> tuple[tuple[object, ...], list[Recording]] | None:
        """The sequence to replay from and the cursor key naming it, or None when nothing matches."""
        if message_id is not None and call is not None:
            found = self.by_call.get((message_id, call, identity))
            if found:
                return ("call", message_id, call, identity), found
        found = self.by_identity.get(identity)
        if found:
            return ("identity", message_id, identity), found
        return None


def _insert(items: list[Recording], recording: Recording) -> None:
    if not items or items[-1].sort_key <= recording.sort_key:
        items.append(recording)
    else:
        bisect.insort(items, recording, key=lambda r: r.sort_key)


def _remove(index: dict[Any, list[Recording]], key: Any, recording: Recording) -> None:
    items = index.get(key)
    if items is None:
        return
    try:
        items.remove(recording)
    except ValueError:
        return
    if not items:
        del index[key]


class Cursors:
    """Per-worker replay positions: worker -> sequence key -> next index. Bounded per worker."""

    def __init__(self, max_per_worker: int = 100_000) -> None:
        self.max_per_worker = max_per_worker
        self._by_worker: dict[str, dict[tuple[object, ...], int]] = {}

    def next(self, worker: str, key: tuple[object, ...], sequence: list[Recording]) -> Recording:
        positions = self._by_worker.setdefault(worker, {})
        position = positions.pop(key, 0)
        if len(positions) >= self.max_per_worker:  # forget the oldest sequence of this worker
            positions.pop(next(iter(positions)))
        positions[key] = position + 1
        return sequence[min(position, len(sequence) - 1)]

    def reset(self, worker: str) -> None:
        self._by_worker.pop(worker, None)

    def workers(self) -> Iterable[str]:
        return self._by_worker.keys()
