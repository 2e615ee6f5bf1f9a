"""A message's story from the wire log: what it was given, what it called, how each attempt ended.

Both sides of a replay are read the same way: the recording (written by `strictq serve`: the gateway's
`delivery` records and `ack`/`release` events, the proxy's `http` records) and each replay run's own
wire log (the isolated gateway and proxy write the same records). So the comparison is always between
two `MessageStory` values built by this one module.

- An attempt is one delivery (receive count n, fencing token = lease). Its outcome is `ack` (an ack
  with its token, or without one after it), `fail` (released: the worker handed it back) or `timeout`
  (the claim ran out: redelivered later, or nothing recorded; replay also writes `replay-timeout`).
  Workers that report attempt results (docs/failure-management.md §1) leave `log` records instead of
  ack/release events: `succeeded` is an ack, `failed`/`partial` a fail, `not_attempted` a hand-back;
  results the core refused (`status` other than ok) change nothing.
- A delivery that was handed back unprocessed with a failing predecessor of its group (released in
  the same request, not first, no calls) is not a processing attempt: production claims whole groups,
  replay hands a worker one message of a group at a time, and only processing attempts are compared.
- Calls are the `http` records tagged with the message, attached by lease (else attempt number), in
  call-ordinal order. Their comparison key is (method, host, path?query, body sha256) after redaction
  and masks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fencing.replay.masking import Masker
from wirelog.reader import ReadStats, read_records
from wirelog.record import body_bytes_of
from wirelog.times import format_time

OUTCOMES = ("ack", "fail", "timeout")
OUTCOME_ALIASES = {"ack": "ack", "acked": "ack", "fail": "fail", "failed": "fail", "timeout": "timeout"}
TIMEOUT_EVENT = "replay-timeout"
# Reported attempt results (kind `log`, written by the gateway's results route) as the events they mean.
RESULT_EVENTS = {"succeeded": "ack", "failed": "fail", "partial": "fail", "not_attempted": "not-attempted"}
AUTO_GROUP_PREFIX = "~auto."


@dataclass(slots=True)
class CallRecord:
    """One outbound call as compared: identity after redaction and masks, plus what a diff shows."""

    ordinal: int | None
    method: str
    host: str
    path: str  # path and query, masked
    body_sha256: str
    body: str | None  # the redacted, masked body text (None: not kept or not text)
    status: int | None
    action: str
    record_id: str
    latency_ms: float | None
    ts: float
    error: str | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.method, self.host, self.path, self.body_sha256)

    @property
    def endpoint(self) -> tuple[str, str, str]:
        return (self.method, self.host, self.path.split("?", 1)[0])

    @property
    def label(self) -> str:
        return f"{self.method} {self.host}{self.path}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "call": self.ordinal,
            "method": self.method,
            "host": self.host,
            "path": self.path,
            "body_sha256": self.body_sha256,
            "body": self.body,
            "status": self.status,
            "action": self.action,
            "record_id": self.record_id,
            "latency_ms": self.latency_ms,
            "error": self.error,
        }


@dataclass(slots=True)
class Attempt:
    number: int  # the core's receive count (X-Strictq-Attempt)
    lease: int | None
    worker: str | None
    delivered_at: float
    outcome: str = "timeout"
    ended_at: float | None = None
    reason: str | None = None
    calls: list[CallRecord] = field(default_factory=list)
    handed_back: bool = False

    @property
    def latency_ms(self) -> float | None:
        """Delivery to ack or release (what the worker took for the message)."""
        if self.ended_at is None or self.outcome == "timeout":
            return None
        return round((self.ended_at - self.delivered_at) * 1000.0, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "lease": self.lease,
            "worker": self.worker,
            "delivered_at": format_time(self.delivered_at),
            "outcome": self.outcome,
            "reason": self.reason,
            "latency_ms": self.latency_ms,
            "calls": [c.to_dict() for c in self.calls],
        }


@dataclass(slots=True)
class MessageStory:
    message_id: str
    queue: str | None = None
    tenant: str | None = None
    face: str | None = None
    group: str | None = None
    seq: int | None = None
    body: bytes | None = None
    content_type: str | None = None
    attributes: Any = None
    body_problem: str | None = None  # why the message cannot be rebuilt (None: it can)
    attempts: list[Attempt] = field(default_factory=list)
    untagged_attempt_calls: list[CallRecord] = field(default_factory=list)  # calls without a delivery

    @property
    def processed(self) -> list[Attempt]:
        """The processing attempts, in order (deliveries handed back unprocessed left out)."""
        return [a for a in self.attempts if not a.handed_back]

    @property
    def first_delivered(self) -> float:
        return min((a.delivered_at for a in self.attempts), default=float("inf"))

    @property
    def replay_group(self) -> str | None:
        """The group to enqueue with: None for the core's own per-message groups."""
        if self.group is None or self.group.startswith(AUTO_GROUP_PREFIX):
            return None
        return self.group

    @property
    def order_key(self) -> tuple[float, int, str]:
        return (self.first_delivered, self.seq if self.seq is not None else 0, self.message_id)


# ------------------------------------------------------------------------------------------ selection
@dataclass(frozen=True, slots=True)
class Selection:
    """Which recorded attempts to replay; a message is replayed when one of its attempts matches."""

    queues: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    message_ids: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    outcome: str | None = None  # ack | fail | timeout

    def wants_message(self, story: MessageStory) -> bool:
        if self.queues and story.queue not in self.queues:
            return False
        if self.groups and story.group not in self.groups:
            return False
        return not self.message_ids or story.message_id in self.message_ids

    def wants_attempt(self, attempt: Attempt) -> bool:
        if self.since is not None and attempt.delivered_at < self.since:
            return False
        if self.until is not None and attempt.delivered_at > self.until:
            return False
        return self.outcome is None or attempt.outcome == self.outcome

    def select(self, stories: Iterable[MessageStory]) -> list[MessageStory]:
        """The selected messages in their original order (first delivery, then sequence)."""
        chosen = [
            s for s in stories if self.wants_message(s) and any(self.wants_attempt(a) for a in s.processed)
        ]
        return sorted(chosen, key=lambda s: s.order_key)

    def describe(self) -> str:
        parts = []
        named = (("queue", self.queues), ("group", self.groups), ("message id", self.message_ids))
        for label, values in named:
            if values:
                parts.append(f"{label} {', '.join(values)}")
        if self.since is not None:
            parts.append(f"since {format_time(self.since)}")
        if self.until is not None:
            parts.append(f"until {format_time(self.until)}")
        if self.outcome is not None:
            parts.append(f"outcome {self.outcome}")
        return "; ".join(parts) or "everything"

    def to_dict(self) -> dict[str, Any]:
        return {
            "queues": list(self.queues),
            "groups": list(self.groups),
            "message_ids": list(self.message_ids),
            "since": format_time(self.since) if self.since is not None else None,
            "until": format_time(self.until) if self.until is not None else None,
            "outcome": self.outcome,
        }


# -------------------------------------------------------------------------------------------- reading
@dataclass
class _Pending:
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)


class StoryBuilder:
    """Collects records (any order), then assembles one story per message."""

    def __init__(self, masker: Masker | None = None, *, message_ids: Iterable[str] = ()) -> None:
        self.masker = masker or Masker()
        self.only = frozenset(message_ids)
        self._pending: dict[str, _Pending] = {}
        self.untagged_calls: list[CallRecord] = []

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        message_id = record.get("message_id")
        if not isinstance(message_id, str):
            if kind == "http":
                call = self.call_of(record)
                if call is not None:
                    self.untagged_calls.append(call)
            return
        if self.only and message_id not in self.only:
            return
        pending = self._pending.setdefault(message_id, _Pending())
        if kind == "delivery":
            pending.deliveries.append(record)
        elif kind == "event" or (kind == "log" and record.get("status") in (None, "ok")):
            pending.events.append(record)
        elif kind == "http":
            pending.calls.append(record)

    def call_of(self, record: dict[str, Any]) -> CallRecord | None:
        request = record.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return None
        url = request.get("url")
        if not isinstance(url, str) or request["method"] == "CONNECT":
            return None
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        path = self.masker.text(parts.path or "/")
        query = self.masker.text(parts.query)
        body = body_bytes_of(request)
        recorded_sha = request.get("body_sha256")
        sha = self.masker.body_sha256(body, recorded_sha if isinstance(recorded_sha, str) else None)
        text: str | None = None
        if body is not None:
            masked = self.masker.body(body)
            try:
                text = masked.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        response = record.get("response")
        status = response.get("status") if isinstance(response, dict) else None
        call = record.get("call")
        latency = record.get("latency_ms")
        return CallRecord(
            ordinal=call if isinstance(call, int) else None,
            method=request["method"].upper(),
            host=host,
            path=path + (f"?{query}" if query else ""),
            body_sha256=sha,
            body=text,
            status=status if isinstance(status, int) else None,
            action=str(record.get("action") or "pass"),
            record_id=str(record.get("id") or ""),
            latency_ms=float(latency) if isinstance(latency, int | float) else None,
            ts=float(record.get("ts") or 0.0),
            error=record.get("error") if isinstance(record.get("error"), str) else None,
        )

    def stories(self) -> dict[str, MessageStory]:
        return {mid: self._assemble(mid, pending) for mid, pending in self._pending.items()}

    def _assemble(self, message_id: str, pending: _Pending) -> MessageStory:
        story = MessageStory(message_id)
        deliveries = sorted(pending.deliveries, key=_ts)
        for record in deliveries:
            if story.queue is None:
                _describe(story, record)
            number = record.get("attempt") or record.get("receive_count") or 1
            lease = record.get("lease")
            story.attempts.append(
                Attempt(
                    number=int(number),
                    lease=lease if isinstance(lease, int) else None,
                    worker=record.get("worker"),
                    delivered_at=_ts(record),
                )
            )
        if not deliveries:
            story.body_problem = "no delivery record (the recording was made without the gateway's log)"
            for record in (*pending.calls, *pending.events):
                if story.queue is None and isinstance(record.get("queue"), str):
                    story.queue = record["queue"]
                    story.group = record.get("group") if isinstance(record.get("group"), str) else None
        self._apply_events(story, sorted(pending.events, key=_ts))
        self._attach_calls(story, pending.calls)
        return story

    def _apply_events(self, story: MessageStory, events: list[dict[str, Any]]) -> None:
        attempts = story.attempts
        for event in events:
            outcome = event.get("outcome")
            name = (
                event.get("event")
                if event.get("kind") == "event"
                else RESULT_EVENTS.get(outcome)
                if isinstance(outcome, str)
                else None
            )
            if name not in ("ack", "release", "fail", "not-attempted", TIMEOUT_EVENT):
                continue
            attempt = _attempt_for(attempts, event.get("lease"), _ts(event))
            if attempt is None or attempt.ended_at is not None:
                continue
            attempt.ended_at = _ts(event)
            if name == "ack":
                attempt.outcome = "ack"
            elif name == "release":
                attempt.outcome = "fail"
                attempt.reason = "released by the worker"
                position = event.get("position")
                attempt.handed_back = isinstance(position, int) and position > 0
            elif name == "fail":
                attempt.outcome = "fail"
                attempt.reason = f"reported {event.get('outcome')}" + (
                    f": {event['reason']}" if event.get("reason") else ""
                )
            elif name == "not-attempted":
                attempt.outcome = "fail"
                attempt.reason = "handed back (not attempted)"
                attempt.handed_back = True
            else:
                attempt.outcome = "timeout"
                attempt.reason = str(event.get("reason") or "replay timed out")
        for index, attempt in enumerate(attempts):
            if attempt.ended_at is None and attempt.reason is None:
                later = index + 1 < len(attempts)
                attempt.reason = "claim expired (delivered again)" if later else "no ack or release recorded"

    def _attach_calls(self, story: MessageStory, records: list[dict[str, Any]]) -> None:
        by_lease = {a.lease: a for a in story.attempts if a.lease is not None}
        for record in sorted(records, key=_ts):
            call = self.call_of(record)
            if call is None:
                continue
            lease = record.get("lease")
            attempt = by_lease.get(lease) if isinstance(lease, int) else None
            if attempt is None:
                number = record.get("attempt")
                attempt = next((a for a in story.attempts if a.number == number), None)
            if attempt is None:
                story.untagged_attempt_calls.append(call)
                continue
            attempt.calls.append(call)
        for attempt in story.attempts:
            attempt.calls.sort(key=lambda c: (c.ordinal if c.ordinal is not None else 1 << 30, c.ts))
            if attempt.handed_back and attempt.calls:
                attempt.handed_back = False  # it did work: a real (failed) attempt


def _describe(story: MessageStory, record: dict[str, Any]) -> None:
    """Message facts from its first delivery record, and whether its body can be rebuilt."""
    story.queue = record.get("queue")
    story.tenant = record.get("tenant")
    story.face = record.get("face")
    story.group = record.get("group")
    story.seq = record.get("seq") if isinstance(record.get("seq"), int) else None
    story.content_type = record.get("content_type")
    story.attributes = record.get("attributes")
    body = body_bytes_of(record)
    if body is None and record.get("body_bytes"):
        story.body_problem = "body not recorded (metadata-only or over the size limit)"
    elif record.get("body_redacted"):
        story.body_problem = "body was redacted (secret fields replaced by tokens): cannot be rebuilt"
    else:
        story.body = body if body is not None else b""


def _attempt_for(attempts: list[Attempt], lease: Any, ts: float) -> Attempt | None:
    if isinstance(lease, int):
        for attempt in attempts:
            if attempt.lease == lease:
                return attempt
        return None
    before = [a for a in attempts if a.delivered_at <= ts]  # a tokenless ack: the latest delivery
    return before[-1] if before else None


def _ts(record: dict[str, Any]) -> float:
    value = record.get("ts")
    return float(value) if isinstance(value, int | float) else 0.0


def iter_records(directory: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
    """Every record under `directory` and its subdirectories (a run's wire log, or a whole data dir)."""
    from fencing.mimic import segment_files

    for path in segment_files(directory):
        yield from read_records(path, stats=stats)


def read_stories(
    directory: Path, masker: Masker | None = None, *, message_ids: Iterable[str] = ()
) -> tuple[dict[str, MessageStory], list[CallRecord], ReadStats]:
    """Stories of every message in the wire log (or only `message_ids`), the untagged calls, and what
    the read skipped (torn lines, unknown versions, with a note per file)."""
    stats = ReadStats()
    builder = StoryBuilder(masker, message_ids=message_ids)
    for record in iter_records(directory, stats):
        builder.add(record)
    return builder.stories(), builder.untagged_calls, stats


def pretty_body(text: str | None) -> list[str]:
    """A body as lines for a diff: indented JSON with sorted keys when it parses, else the text."""
    if not text:
        return []
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    except ValueError:
        return text.splitlines() or [text]
