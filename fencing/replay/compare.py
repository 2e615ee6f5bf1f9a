"""Compare one message's stories (reference: the recording or a baseline run; candidate: the new worker).

Per processing attempt (1..`attempts`): the outcome (ack / fail / timeout), then the sequence of outbound
calls by (method, host, path?query, body sha256 after redaction and masks), then calls the recording
could not answer (`unmatched`). Divergence kinds:

- `outcome`        the attempt ended differently (or exists on one side only);
- `call-changed`   same endpoint at the same place, different body or query (with a body diff);
- `call-added`     a call the reference did not make there;
- `call-removed`   a call the reference made that the candidate did not;
- `calls-swapped`  the same calls in another order;
- `unmatched`      the proxy had no recording for a candidate call (it got a 503);
- `latency`        only with `max_slowdown`: slower than the reference by more than that factor;
- `not-replayed`   the candidate never got the message (worker exited, overall timeout).

The first divergence gets a readable explanation (`first_difference`): for a changed body, a unified
diff of the two bodies pretty-printed as JSON.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from fencing.replay.stories import Attempt, CallRecord, MessageStory, pretty_body
from wirelog.record import ACTION_UNMATCHED

KINDS = (
    "outcome",
    "call-changed",
    "call-added",
    "call-removed",
    "calls-swapped",
    "unmatched",
    "latency",
    "not-replayed",
)
LATENCY_FLOOR_MS = 50.0  # below this a slowdown factor means nothing (scheduling noise)


@dataclass(slots=True)
class Divergence:
    kind: str
    attempt: int
    call: int | None  # 1-based position in the candidate's (added/changed) or reference's (removed) calls
    summary: str
    detail: str | None = None  # the readable diff

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "attempt": self.attempt,
            "call": self.call,
            "summary": self.summary,
            "detail": self.detail,
        }


@dataclass(slots=True)
class MessageComparison:
    message_id: str
    queue: str | None
    group: str | None
    reference: list[Attempt]
    candidate: list[Attempt]
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return bool(self.divergences)

    @property
    def kinds(self) -> list[str]:
        return list(dict.fromkeys(d.kind for d in self.divergences))

    @property
    def first_difference(self) -> str | None:
        if not self.divergences:
            return None
        first = self.divergences[0]
        text = f"attempt {first.attempt}: {first.summary}"
        return f"{text}\n{first.detail}" if first.detail else text

    def outcome(self, side: str) -> str:
        attempts = self.reference if side == "reference" else self.candidate
        return attempts[-1].outcome if attempts else "-"

    def latency_ms(self, side: str) -> float | None:
        attempts = self.reference if side == "reference" else self.candidate
        return attempts[-1].latency_ms if attempts else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "queue": self.queue,
            "group": self.group,
            "status": "diverged" if self.diverged else "same",
            "kinds": self.kinds,
            "first_difference": self.first_difference,
            "divergences": [d.to_dict() for d in self.divergences],
            "reference": {
                "outcome": self.outcome("reference"),
                "latency_ms": self.latency_ms("reference"),
                "attempts": [a.to_dict() for a in self.reference],
            },
            "candidate": {
                "outcome": self.outcome("candidate"),
                "latency_ms": self.latency_ms("candidate"),
                "attempts": [a.to_dict() for a in self.candidate],
            },
        }


def compare_message(
    reference: MessageStory,
    candidate: MessageStory | None,
    *,
    attempts: int = 1,
    max_slowdown: float | None = None,
) -> MessageComparison:
    """Compare the first `attempts` processing attempts of a message."""
    ref = reference.processed[:attempts]
    cand = candidate.processed[:attempts] if candidate is not None else []
    result = MessageComparison(reference.message_id, reference.queue, reference.group, ref, cand)
    if not cand:
        result.divergences.append(
            Divergence("not-replayed", 1, None, "the candidate never received the message")
        )
        return result
    for number in range(1, max(len(ref), len(cand)) + 1):
        left = ref[number - 1] if number <= len(ref) else None
        right = cand[number - 1] if number <= len(cand) else None
        result.divergences.extend(compare_attempt(number, left, right, max_slowdown))
    return result


def compare_attempt(
    number: int, left: Attempt | None, right: Attempt | None, max_slowdown: float | None = None
) -> list[Divergence]:
    if left is None or right is None:
        shown = "none" if left is None else left.outcome
        other = "none" if right is None else right.outcome
        return [Divergence("outcome", number, None, f"outcome: reference {shown}, candidate {other}")]
    out: list[Divergence] = []
    if left.outcome != right.outcome:
        why = f" ({right.reason})" if right.reason and right.outcome != "ack" else ""
        summary = f"outcome: reference {left.outcome}, candidate {right.outcome}{why}"
        out.append(Divergence("outcome", number, None, summary))
    out.extend(compare_calls(number, left.calls, right.calls))
    for position, call in enumerate(right.calls, 1):
        if call.action == ACTION_UNMATCHED:
            out.append(
                Divergence(
                    "unmatched",
                    number,
                    position,
                    f"call {position}: no recording matched {call.label} (the worker got 503 unmatched)",
                )
            )
    slow = _slowdown(number, left, right, max_slowdown)
    if slow is not None:
        out.append(slow)
    return out


def compare_calls(number: int, left: list[CallRecord], right: list[CallRecord]) -> list[Divergence]:
    """The differences between two call sequences, in the order they occur."""
    left_keys = [c.key for c in left]
    right_keys = [c.key for c in right]
    if left_keys == right_keys:
        return []
    if sorted(left_keys) == sorted(right_keys):
        first = next(i for i, (a, b) in enumerate(zip(left_keys, right_keys, strict=True)) if a != b)
        detail = "\n".join(
            [
                "reference: " + ", ".join(f"#{i} {c.label}" for i, c in enumerate(left, 1)),
                "candidate: " + ", ".join(f"#{i} {c.label}" for i, c in enumerate(right, 1)),
            ]
        )
        summary = (
            f"calls reordered from call {first + 1}: reference made {left[first].label} there, "
            f"candidate {right[first].label}"
        )
        return [Divergence("calls-swapped", number, first + 1, summary, detail)]
    out: list[Divergence] = []
    matcher = difflib.SequenceMatcher(None, left_keys, right_keys, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        pairs = min(i2 - i1, j2 - j1) if op == "replace" else 0
        for k in range(pairs):
            a, b = left[i1 + k], right[j1 + k]
            if a.endpoint == b.endpoint:
                out.append(_changed(number, j1 + k + 1, a, b))
            else:
                out.append(_removed(number, i1 + k + 1, a, len(left), len(right)))
                out.append(_added(number, j1 + k + 1, b, len(left), len(right)))
        for i in range(i1 + pairs, i2):
            out.append(_removed(number, i + 1, left[i], len(left), len(right)))
        for j in range(j1 + pairs, j2):
            out.append(_added(number, j + 1, right[j], len(left), len(right)))
    return out


def _changed(number: int, position: int, a: CallRecord, b: CallRecord) -> Divergence:
    what = "body" if a.body_sha256 != b.body_sha256 else "query"
    lines: list[str] = []
    if a.path != b.path:
        lines.append(f"path: {a.path} -> {b.path}")
    if a.body_sha256 != b.body_sha256:
        if a.body is not None and b.body is not None:
            diff = difflib.unified_diff(
                pretty_body(a.body), pretty_body(b.body), "reference", "candidate", lineterm="", n=2
            )
            lines.extend(diff)
        else:
            lines.append(
                f"body sha256 {a.body_sha256[:16]}… -> {b.body_sha256[:16]}… (bodies not kept at this "
                "endpoint's log level)"
            )
    summary = f"call {position} changed ({what}): {b.label}"
    return Divergence("call-changed", number, position, summary, "\n".join(lines))


def _added(number: int, position: int, call: CallRecord, ref_len: int, cand_len: int) -> Divergence:
    summary = f"call {position} added: {call.label} ({_counts(ref_len, cand_len)})"
    return Divergence("call-added", number, position, summary, _body_lines(call, "+"))


def _removed(number: int, position: int, call: CallRecord, ref_len: int, cand_len: int) -> Divergence:
    summary = f"call {position} removed: {call.label} ({_counts(ref_len, cand_len)})"
    return Divergence("call-removed", number, position, summary, _body_lines(call, "-"))


def _counts(ref_len: int, cand_len: int) -> str:
    return f"reference made {ref_len} call(s), candidate {cand_len}"


def _body_lines(call: CallRecord, sign: str) -> str | None:
    lines = pretty_body(call.body)
    if not lines:
        return None
    return "\n".join(f"{sign} {line}" for line in lines)


def _slowdown(number: int, left: Attempt, right: Attempt, factor: float | None) -> Divergence | None:
    if factor is None:
        return None
    before, after = left.latency_ms, right.latency_ms
    if before is None or after is None or after - before < LATENCY_FLOOR_MS:
        return None
    if after <= before * factor:
        return None
    summary = f"latency {after:.0f} ms vs reference {before:.0f} ms (more than {factor:g}x)"
    return Divergence("latency", number, None, summary)
