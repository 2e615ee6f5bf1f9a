"""Wire-log record schema v1 (docs/wirelog.md): the line codec, version compatibility and builders.

A record is one JSON object per line, encoded with orjson (UTF-8, no raw newlines inside a line, so a
newline always ends a record). Readers call `decode_line` and then `compat`, which upgrades any older
schema version to the current one; that keeps every consumer (CLI, Spark, replay) on one shape.

The builders (`http_record`, `delivery_record`, `log_record`, `event_record`) exist so writers never
misspell a field and every record of a kind carries the same keys (nulls included), which keeps
Spark's inferred schema stable.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from wirelog.errors import RecordError, TornLine, UnknownVersion

SCHEMA_VERSION = 1
KINDS = ("http", "delivery", "log", "event")
# The egress proxy's action on a call (an http record's `action`, the X-Strictq-Proxy-Action header).
ACTION_PASS = "pass"
ACTION_BLOCK = "block"  # the worker is fenced
ACTION_MIMIC = "mimic"  # answered from the recordings
ACTION_STALE_LEASE = "stale-lease"  # the call's lease is below the floor
ACTION_UNSYNCED = "unsynced"  # the control stream is not synchronised
ACTION_UNMATCHED = "unmatched"  # mimic found no recording to answer with
ACTIONS = (ACTION_PASS, ACTION_BLOCK, ACTION_MIMIC, ACTION_STALE_LEASE, ACTION_UNSYNCED, ACTION_UNMATCHED)

# The schema's fields and their JSON types: the one definition the builders below follow and Spark's parse
# schema (spark/schema.py) is derived from, so the two cannot disagree (tests/test_record_schema.py).
# Types: string, double, long, bool, object, array, any. Every field may be null. Writers may add fields of
# their own after a builder (`tenant`, `face`, `code`, ...); readers ignore what they do not know.
BODY_FIELDS: tuple[tuple[str, str], ...] = (
    ("body", "string"),  # UTF-8 text, or null
    ("body_b64", "string"),  # base64 when the body is not UTF-8
    ("body_sha256", "string"),
    ("body_bytes", "long"),
)
REQUEST_FIELDS: tuple[tuple[str, str], ...] = (
    ("method", "string"),
    ("url", "string"),
    ("headers", "array"),  # [[name, value], ...]
    ("headers_omitted", "object"),  # {bytes, sha256} when headers are not kept
    *BODY_FIELDS,
)
RESPONSE_FIELDS: tuple[tuple[str, str], ...] = (
    ("status", "long"),
    ("headers", "array"),
    ("headers_omitted", "object"),
    *BODY_FIELDS,
)
COMMON_FIELDS: tuple[tuple[str, str], ...] = (
    ("v", "long"),
    ("kind", "string"),
    ("id", "string"),  # assigned by the writer
    ("ts", "double"),
    ("writer", "string"),  # assigned by the writer
    ("worker", "string"),
    ("queue", "string"),
    ("message_id", "string"),
    ("group", "string"),
    ("lease", "long"),
    ("attempt", "long"),
    ("call", "long"),
    # The id of the request that sent the message (the producer's X-Request-Id, or the one the gateway
    # gave it; docs/wirelog.md). Added within v1: a record written before it lacks the key, and `compat`
    # fills it in as null, so every reader sees one shape.
    ("request_id", "string"),
)
# Optional fields added to the current schema version after records of it were first written (readers of
# older files find them absent): `compat` fills them in as null. A new version starts this list afresh.
ADDED_FIELDS: tuple[str, ...] = ("request_id",)
KIND_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "http": (
        ("request", "object"),  # REQUEST_FIELDS
        ("response", "object"),  # RESPONSE_FIELDS
        ("error", "string"),
        ("latency_ms", "double"),
        ("action", "string"),  # one of ACTIONS
        ("replayed_from", "string"),
    ),
    "delivery": (*BODY_FIELDS, ("attributes", "object"), ("seq", "long"), ("receive_count", "long")),
    "log": (("outcome", "string"), ("reason", "string"), ("steps", "array"), ("partial", "any")),
    "event": (("event", "string"), ("reason", "string")),
}


def field_types() -> dict[str, str]:
    """Every top-level field of any kind -> its type (a name shared by kinds has one type)."""
    types: dict[str, str] = dict(COMMON_FIELDS)
    for fields in KIND_FIELDS.values():
        for name, kind in fields:
            if types.setdefault(name, kind) != kind:
                raise RecordError(f"field {name!r} has two types: {types[name]} and {kind}")
    return types


# Lines longer than this are skipped by the line splitter (and counted) instead of growing memory
# without bound when a file is corrupt (no newline for gigabytes).
MAX_LINE_BYTES = 256 * 1024 * 1024

Record = dict[str, Any]
HeaderPairs = Iterable[tuple[str | bytes, str | bytes] | list[str] | list[bytes]]


# ------------------------------------------------------------------------------------------- codec
def encode(record: Mapping[str, Any]) -> bytes:
    """One record as one line: orjson bytes ending in b"\\n"."""
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError as exc:  # non-str keys, unsupported types, out-of-range ints
        raise RecordError(f"record cannot be encoded: {exc}") from None


def decode_line(line: bytes) -> Record:
    """Parse one line (with or without its newline) into a record dict; does not upgrade versions.

    Raises RecordError when the line is not a JSON object carrying an integer schema version `v`.
    Call `compat` on the result to get the current schema.
    """
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RecordError(f"not a JSON object but {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int:
        raise RecordError("missing or non-integer schema version 'v'")
    return obj


# Upgrade steps: version n -> n + 1. Empty while v1 is the only version; v2 will add `1: _v1_to_v2`.
_UPGRADES: dict[int, Callable[[Record], Record]] = {}


def compat(record: Record) -> Record:
    """Bring a decoded record to the current schema version, with the fields added to it since it was
    first written (`ADDED_FIELDS`) as null when absent: the same record object for the current version.

    Unknown versions, including future ones this code cannot know, raise UnknownVersion: a reader
    must count and skip them rather than misread fields whose meaning may have changed.
    """
    version = record.get("v")
    if version == SCHEMA_VERSION and type(version) is int:
        return _with_added_fields(record)
    if type(version) is not int or version > SCHEMA_VERSION or version < 1:
        raise UnknownVersion(version)
    while version < SCHEMA_VERSION:
        step = _UPGRADES.get(version)
        if step is None:
            raise UnknownVersion(record.get("v"))
        record = step(record)
        version += 1
        record["v"] = version
    return _with_added_fields(record)


def _with_added_fields(record: Record) -> Record:
    """The record, in place, with every optional field added to its version since (absent: null)."""
    for name in ADDED_FIELDS:
        if name not in record:
            record[name] = None
    return record


class LineSplitter:
    """Incremental line codec: feed byte chunks, get complete lines back (without the newline).

    Memory stays bounded by the longest line (capped at `max_line_bytes`; longer lines are dropped and
    counted in `oversized`), so a reader streams segments of any size.
    """

    __slots__ = ("_pending", "_pending_size", "_skipping", "max_line_bytes", "oversized")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.oversized = 0
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._skipping = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """Complete lines in order; bytes after the last newline wait for the next chunk."""
        if not chunk:
            return []
        limit = self.max_line_bytes
        parts = chunk.split(b"\n")
        tail = parts.pop()  # after the last newline (b"" when the chunk ends with one)
        if parts:
            if self._skipping:  # the end of an oversized line, already counted
                self._skipping = False
                del parts[0]
            elif self._pending:
                if self._pending_size + len(parts[0]) > limit:
                    self.oversized += 1
                    del parts[0]
                else:
                    self._pending.append(parts[0])
                    parts[0] = b"".join(self._pending)
            self._pending = []
            self._pending_size = 0
            if len(chunk) > limit:
                kept = [line for line in parts if len(line) <= limit]
                self.oversized += len(parts) - len(kept)
                parts = kept
        if tail and not self._skipping:
            self._pending.append(tail)
            self._pending_size += len(tail)
            if self._pending_size > limit:
                self.oversized += 1
                self._pending = []
                self._pending_size = 0
                self._skipping = True
        return parts

    @property
    def pending(self) -> int:
        """Bytes received after the last newline (an incomplete line so far)."""
        return self._pending_size

    def finish(self) -> None:
        """End of input: raise TornLine if an incomplete line is left over (it is discarded)."""
        size = self._pending_size
        self._pending = []
        self._pending_size = 0
        self._skipping = False
        if size:
            raise TornLine(size)


# ------------------------------------------------------------------------------------------ bodies
def body_fields(
    data: bytes | None, *, prefix: str = "", keep: bool = True, max_bytes: int | None = None
) -> Record:
    """`body` (UTF-8 text) or `body_b64`, plus `body_sha256` and `body_bytes` of exactly `data`.

    `data` is the body as it will be logged, i.e. after redaction, so the hash is safe to store and
    two requests that redact to the same bytes match. `keep=False` (or a body over `max_bytes`) keeps
    only the hash and size: the metadata level. `data=None` means no body is known (all null).
    """
    if data is None:
        return {
            f"{prefix}body": None,
            f"{prefix}body_b64": None,
            f"{prefix}body_sha256": None,
            f"{prefix}body_bytes": None,
        }
    text: str | None = None
    b64: str | None = None
    if keep and (max_bytes is None or len(data) <= max_bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            b64 = base64.b64encode(data).decode("ascii")
    return {
        f"{prefix}body": text,
        f"{prefix}body_b64": b64,
        f"{prefix}body_sha256": hashlib.sha256(data).hexdigest(),
        f"{prefix}body_bytes": len(data),
    }


def body_bytes_of(part: Mapping[str, Any], *, prefix: str = "") -> bytes | None:
    """The logged body back as bytes (text or base64), or None when it was not kept."""
    text = part.get(f"{prefix}body")
    if isinstance(text, str):
        return text.encode("utf-8")
    b64 = part.get(f"{prefix}body_b64")
    if isinstance(b64, str):
        return base64.b64decode(b64)
    return None


def header_text(value: str | bytes) -> str:
    """A header name or value as text: UTF-8 when it is, else Latin-1 (lossless for any bytes)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:  # lone surrogates: bytes decoded with surrogateescape (mitmproxy)
            try:
                raw = value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                return value.encode("utf-8", "replace").decode("utf-8")
    else:
        raw = value
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def header_block(pairs: Iterable[tuple[str, str] | list[str]]) -> Record:
    """`{bytes, sha256}` of the header block `Name: value\\r\\n...` (the `headers_omitted` field)."""
    block = b"".join(f"{name}: {value}\r\n".encode("utf-8", "replace") for name, value in pairs)
    return {"bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()}


# ---------------------------------------------------------------------------------------- builders
def _common(
    kind: str,
    *,
    ts: float | None,
    worker: str | None,
    queue: str | None,
    message_id: str | None,
    group: str | None,
    lease: int | None,
    attempt: int | None,
    call: int | None,
    request_id: str | None,
) -> Record:
    return {
        "v": SCHEMA_VERSION,
        "kind": kind,
        "ts": ts,
        "worker": worker,
        "queue": queue,
        "message_id": message_id,
        "group": group,
        "lease": lease,
        "attempt": attempt,
        "call": call,
        "request_id": request_id,
    }


def http_request(
    *,
    method: str,
    url: str,
    headers: list[list[str]] | None,
    body: bytes | None,
    headers_omitted: Mapping[str, Any] | None = None,
    keep_body: bool = True,
    max_body_bytes: int | None = None,
) -> Record:
    """The `request` object of an http record; `headers=None` means omitted (give `headers_omitted`)."""
    return {
        "method": method,
        "url": url,
        "headers": headers,
        "headers_omitted": dict(headers_omitted) if headers_omitted is not None else None,
        **body_fields(body, keep=keep_body, max_bytes=max_body_bytes),
    }


def http_response(
    *,
    status: int,
    headers: list[list[str]] | None,
    body: bytes | None,
    headers_omitted: Mapping[str, Any] | None = None,
    keep_body: bool = True,
    max_body_bytes: int | None = None,
) -> Record:
    """The `response` object of an http record."""
    return {
        "status": status,
        "headers": headers,
        "headers_omitted": dict(headers_omitted) if headers_omitted is not None else None,
        **body_fields(body, keep=keep_body, max_bytes=max_body_bytes),
    }


def http_record(
    *,
    request: Mapping[str, Any],
    response: Mapping[str, Any] | None,
    action: str = ACTION_PASS,
    error: str | None = None,
    latency_ms: float | None = None,
    replayed_from: str | None = None,
    ts: float | None = None,
    worker: str | None = None,
    queue: str | None = None,
    message_id: str | None = None,
    group: str | None = None,
    lease: int | None = None,
    attempt: int | None = None,
    call: int | None = None,
    request_id: str | None = None,
) -> Record:
    """An `http` record: one outbound interaction, including refused ones and errors. `request_id`: the
    id of the request that sent the message the call was made for (the worker's X-Strictq-Request-Id)."""
    if action not in ACTIONS:
        raise RecordError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    record = _common(
        "http", ts=ts, worker=worker, queue=queue, message_id=message_id, group=group,
        lease=lease, attempt=attempt, call=call, request_id=request_id,
    )  # fmt: skip
    record.update(
        request=dict(request),
        response=dict(response) if response is not None else None,
        error=error,
        latency_ms=latency_ms,
        action=action,
        replayed_from=replayed_from,
    )
    return record


def delivery_record(
    *,
    queue: str,
    message_id: str,
    group: str | None,
    body: bytes | None,
    attributes: Mapping[str, Any] | None = None,
    seq: int | None = None,
    receive_count: int | None = None,
    keep_body: bool = True,
    ts: float | None = None,
    worker: str | None = None,
    lease: int | None = None,
    attempt: int | None = None,
    request_id: str | None = None,
) -> Record:
    """A `delivery` record: the gateway handing a message to a worker (the other side of its story)."""
    record = _common(
        "delivery", ts=ts, worker=worker, queue=queue, message_id=message_id, group=group,
        lease=lease, attempt=attempt, call=None, request_id=request_id,
    )  # fmt: skip
    record.update(body_fields(body, keep=keep_body))
    record.update(
        attributes=dict(attributes) if attributes is not None else None,
        seq=seq,
        receive_count=receive_count,
    )
    return record


def log_record(
    *,
    outcome: str,
    reason: str | None = None,
    steps: list[Any] | None = None,
    partial: Any = None,
    ts: float | None = None,
    worker: str | None = None,
    queue: str | None = None,
    message_id: str | None = None,
    group: str | None = None,
    lease: int | None = None,
    attempt: int | None = None,
    request_id: str | None = None,
) -> Record:
    """A `log` record: a worker's account of processing (outcome, reason, steps done, partial result)."""
    record = _common(
        "log", ts=ts, worker=worker, queue=queue, message_id=message_id, group=group,
        lease=lease, attempt=attempt, call=None, request_id=request_id,
    )  # fmt: skip
    record.update(outcome=outcome, reason=reason, steps=steps, partial=partial)
    return record


def event_record(
    *,
    event: str,
    reason: str | None = None,
    ts: float | None = None,
    worker: str | None = None,
    queue: str | None = None,
    message_id: str | None = None,
    group: str | None = None,
    lease: int | None = None,
    request_id: str | None = None,
) -> Record:
    """An `event` record: something that happened to a worker or group (fenced, lease lost, ...)."""
    record = _common(
        "event", ts=ts, worker=worker, queue=queue, message_id=message_id, group=group,
        lease=lease, attempt=None, call=None, request_id=request_id,
    )  # fmt: skip
    record.update(event=event, reason=reason)
    return record
