"""How the proxy in replay mode picks the recorded response for a candidate's call.

Every call of every worker is answered from the recording (`strictq proxy --replay-from DIR`): nothing
is ever forwarded. The order of preference, first match wins (identities are fencing.mimic's: method,
host, path, query and body sha256 after redaction, here also after the replay masks):

1. the same message, the same call ordinal and the same identity (the call this message made there);
2. the same message and identity at another ordinal (a call moved: swapped, or one added before it);
3. the same message and ordinal and the same method, host and path with another body or query (the
   call changed: the candidate still gets the answer the recording had, and the comparison reports
   the changed body rather than everything that would follow from an error);
4. the same identity in any message (an endpoint the recording knows);
5. nothing: the proxy answers 503 `unmatched`, which replay counts as a divergence.

Each candidate sequence is replayed in recording order through the mimic addon's per-worker cursors
(repeated polls walk through what was recorded; past the end the last answer repeats).

Pure (no mitmproxy): loaded off the event loop with `load_index`, read on it with `candidates`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fencing.mimic import Identity, Recording, read_file_records, recording_from_record, segment_files
from fencing.replay.masking import Masker
from wirelog.record import body_bytes_of

Endpoint = tuple[str, str, str]  # method, host, path (no query, no body)


def masked_identity(identity: Identity, view: dict[str, Any] | None, masker: Masker | None) -> Identity:
    """The identity with masks applied to path, query and (when the view kept it) the body."""
    if masker is None or not masker.active:
        return identity
    method, host, path, query, sha = identity
    body = body_bytes_of(view) if isinstance(view, dict) else None
    return (method, host, masker.text(path), masker.text(query), masker.body_sha256(body, sha or None))


@dataclass
class ReplayIndex:
    """Recordings by message/ordinal/identity, message/identity, message/ordinal/endpoint and identity."""

    masker: Masker | None = None
    by_call: dict[tuple[str, int, Identity], list[Recording]] = field(default_factory=dict)
    by_message: dict[tuple[str, Identity], list[Recording]] = field(default_factory=dict)
    by_endpoint: dict[tuple[str, int, Endpoint], list[Recording]] = field(default_factory=dict)
    by_identity: dict[Identity, list[Recording]] = field(default_factory=dict)
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    errors: int = 0
    loaded_at: float = 0.0

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, recording: Recording) -> None:
        """Add one recording whose identity is already masked (records arrive in time order)."""
        if recording.record_id in self.ids:
            return
        self.ids.add(recording.record_id)
        identity = recording.identity
        self.by_identity.setdefault(identity, []).append(recording)
        message, call = recording.message_id, recording.call
        if message is None:
            return
        self.by_message.setdefault((message, identity), []).append(recording)
        if call is not None:
            self.by_call.setdefault((message, call, identity), []).append(recording)
            endpoint = identity[:3]
            self.by_endpoint.setdefault((message, call, endpoint), []).append(recording)

    def candidates(
        self, identity: Identity, message_id: str | None, call: int | None
    ) -> tuple[tuple[object, ...], list[Recording]] | None:
        """The sequence to answer from and its cursor key (the mimic addon's contract), or None."""
        if message_id is not None:
            if call is not None:
                found = self.by_call.get((message_id, call, identity))
                if found:
                    return ("call", message_id, call, identity), found
            found = self.by_message.get((message_id, identity))
            if found:
                return ("message", message_id, identity), found
            if call is not None:
                found = self.by_endpoint.get((message_id, call, identity[:3]))
                if found:
                    return ("endpoint", message_id, call, identity[:3]), found
        found = self.by_identity.get(identity)
        if found:
            return ("identity", message_id, identity), found
        return None


def load_index(directory: Path, masker: Masker | None = None) -> ReplayIndex:
    """Read every usable recording under `directory` (blocking: run it in a thread)."""
    index = ReplayIndex(masker=masker)
    recordings: list[Recording] = []
    for path in segment_files(directory):
        try:
            for record in read_file_records(path):
                recording = recording_from_record(record)
                if recording is not None:
                    recording.identity = masked_identity(recording.identity, record.get("request"), masker)
                    recordings.append(recording)
            stat = path.stat()
            index.files[str(path)] = (stat.st_size, stat.st_mtime_ns)
        except Exception:  # one unreadable segment must not hide the others; counted for the log
            index.errors += 1
    recordings.sort(key=lambda r: r.sort_key)
    for recording in recordings:
        index.add(recording)
    index.loaded_at = time.monotonic()
    return index
