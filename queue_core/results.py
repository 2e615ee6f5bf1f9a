"""Attempt results as JSON (docs/failure-management.md §1): the contract's bounds, checked in one place
for the internal API, the EmoDB face and the remote client.

A request is `{"results": [{"id", "token", "outcome", "reason"?, "signature"?, "steps"?, "partial"?,
"fields"?, "duration_ms"?, "preprocess_ms"?, "request_id"?}, ...]}` (`request_id`: the id of the request
that sent the message, as its delivery carried it; log data, written into the result's wire-log `log`
record; `preprocess_ms`: the attempt's pre-processing, which pipelining's estimates learn from); bad
input raises `InvalidArgument` (400) or `TooLarge` (413) for the whole request, before anything is
applied. Unknown keys in an item are ignored (newer SDKs may add some).

One exception, decided where the probes are known (queue_core.machine.supervisor): an item with a
readable `id` but garbage elsewhere comes back as a failed result carrying its `error` (and the item as
sent, `raw`). A result for an outstanding probe then fails that probe; for anything else the request is
refused with that error, as before.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from protocol.request_ids import RULE as REQUEST_ID_RULE
from protocol.request_ids import is_request_id

from .machine import AckOutcome, InvalidArgument, QueueError, TooLarge
from .machine.inputs import OUTCOMES, AttemptResult
from .machine.records import ReportOutcome
from .machine.text import check_json, check_json_numbers, check_name, check_text

MAX_RESULTS = 1000
MAX_REASON_BYTES = 2048
MAX_SIGNATURE_BYTES = 512
MAX_JSON_BYTES = 16 * 1024  # each of steps, partial and fields, serialised
MAX_STEPS = 100
MAX_STEP_NAME = 128
MAX_ID = 128
MAX_TOKEN = (1 << 63) - 1
TOKEN_TEXT_RE = re.compile(r"[0-9]{1,19}")


def parse_results(data: Any) -> list[AttemptResult]:
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise InvalidArgument('send {"results": [{"id", "token", "outcome", ...}, ...]}', field="results")
    items = data["results"]
    if not items:
        raise InvalidArgument("results must not be empty", field="results")
    if len(items) > MAX_RESULTS:
        raise InvalidArgument(f"at most {MAX_RESULTS} results per request", field="results", count=len(items))
    for index, item in enumerate(items):
        _check_numbers(item, index)
    return [_lenient(item, index) for index, item in enumerate(items)]


def _check_numbers(item: Any, index: int) -> None:
    """Refuse the whole request (400 naming the field) for a number no JSON peer can hold: an integer
    outside signed 64 bits or a non-finite one (the EmoDB face parses with the stdlib, which keeps both).
    Before the lenient per-item reading: such an item cannot even be forwarded as it was sent (orjson, on
    the way to a queue server), logged in the wire log or stored, so it never becomes a garbled result."""
    if not isinstance(item, dict):
        return
    message_id = item.get("id") if isinstance(item.get("id"), str) else None
    for name, value in item.items():
        if isinstance(name, str):
            check_json_numbers(value, name, index=index, id=message_id)


def _lenient(item: Any, index: int) -> AttemptResult:
    try:
        return parse_result(item, index)
    except QueueError as error:
        message_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(message_id, str) or not 0 < len(message_id) <= MAX_ID:
            raise
        try:
            check_name(message_id, "id", index=index)
        except QueueError:
            raise error from None
        return AttemptResult(message_id, None, "failed", error=error, raw=item)


def parse_result(item: Any, index: int = 0) -> AttemptResult:
    if not isinstance(item, dict):
        raise InvalidArgument("each result must be a JSON object", field="results", index=index)
    message_id = item.get("id")
    if not isinstance(message_id, str) or not 0 < len(message_id) <= MAX_ID:
        raise InvalidArgument(f"id must be a string of 1-{MAX_ID} characters", field="id", index=index)
    check_name(message_id, "id", index=index)
    outcome = item.get("outcome")
    if outcome not in OUTCOMES:
        raise InvalidArgument(
            f"outcome must be one of {', '.join(OUTCOMES)}, got {str(outcome)[:40]!r}",
            field="outcome",
            index=index,
            id=message_id,
        )
    return AttemptResult(
        message_id=message_id,
        token=_token(item.get("token"), index, message_id),
        outcome=outcome,
        reason=_text(item, "reason", MAX_REASON_BYTES, index, message_id),
        signature=_text(item, "signature", MAX_SIGNATURE_BYTES, index, message_id),
        steps=_steps(item.get("steps"), index, message_id),
        partial=_bounded(item, "partial", index, message_id),
        fields=_bounded(item, "fields", index, message_id),
        duration_ms=_duration(item.get("duration_ms"), index, message_id),
        preprocess_ms=_duration(item.get("preprocess_ms"), index, message_id, "preprocess_ms"),
        request_id=_request_id(item.get("request_id"), index, message_id),
    )


def _request_id(raw: Any, index: int, message_id: str) -> str | None:
    if raw is None:
        return None
    if not is_request_id(raw):
        raise InvalidArgument(
            f"request_id must be {REQUEST_ID_RULE}", field="request_id", index=index, id=message_id
        )
    return str(raw)


def _token(raw: Any, index: int, message_id: str) -> int:
    if raw is None:  # a result ends a claim: its token is the least proof of holding it
        raise InvalidArgument(
            "each result needs its claim's token (the `token` its delivery carried)",
            field="token",
            index=index,
            id=message_id,
        )
    if isinstance(raw, str) and TOKEN_TEXT_RE.fullmatch(raw):  # plain ASCII digits only
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 < raw <= MAX_TOKEN:
        raise InvalidArgument("token must be a positive integer", field="token", index=index, id=message_id)
    return raw


def _text(item: dict[str, Any], name: str, limit: int, index: int, message_id: str) -> str:
    value = item.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string", field=name, index=index, id=message_id)
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise TooLarge(f"{name} is over {limit} bytes", field=name, index=index, id=message_id, limit=limit)
    # Stored and logged as text: valid Unicode only. A reason may span lines (the logs escape them); a
    # signature is a key (the health monitor's, the alerts') and holds no control characters.
    check = check_name if name == "signature" else check_text
    return str(check(value, name, index=index, id=message_id))


def _size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # integers beyond 64 bits (the EmoDB face keeps them): the stdlib can say
        return len(json.dumps(value, default=str))


def _bounded(item: dict[str, Any], name: str, index: int, message_id: str) -> Any:
    value = check_json(item.get(name), name, index=index, id=message_id)
    if value is not None and _size(value) > MAX_JSON_BYTES:
        raise TooLarge(
            f"{name} is over {MAX_JSON_BYTES} bytes of JSON",
            field=name,
            index=index,
            id=message_id,
            limit=MAX_JSON_BYTES,
        )
    return value


def _steps(raw: Any, index: int, message_id: str) -> list[Any]:
    """Steps completed in this attempt: `{"name": ..., "result"?: ...}` objects (a bare name is taken
    as `{"name": name}`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidArgument("steps must be a list", field="steps", index=index, id=message_id)
    check_json(raw, "steps", index=index, id=message_id)
    if len(raw) > MAX_STEPS:
        raise TooLarge(f"at most {MAX_STEPS} steps per result", field="steps", index=index, id=message_id)
    steps: list[Any] = []
    for step in raw:
        if isinstance(step, str):
            step = {"name": step}
        name = step.get("name") if isinstance(step, dict) else None
        if not isinstance(name, str) or not 0 < len(name) <= MAX_STEP_NAME:
            raise InvalidArgument(
                f'each step must be {{"name": <1-{MAX_STEP_NAME} characters>, "result": ...}}',
                field="steps",
                index=index,
                id=message_id,
            )
        steps.append(step)
    if _size(steps) > MAX_JSON_BYTES:
        raise TooLarge(
            f"steps are over {MAX_JSON_BYTES} bytes of JSON", field="steps", index=index, id=message_id
        )
    return steps


def _duration(raw: Any, index: int, message_id: str, name: str = "duration_ms") -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        raise InvalidArgument(f"{name} must be a non-negative number", field=name, index=index, id=message_id)
    return float(raw)


def result_json(result: AttemptResult) -> dict[str, Any]:
    """The wire form of a result (the remote client forwards parsed results with it; a garbled one as it
    was sent, so the server decides on it the same way)."""
    if result.error is not None:
        raw = result.raw if isinstance(result.raw, dict) else {"id": result.message_id}
        try:
            orjson.dumps(raw)
        except TypeError:  # a lone surrogate, say: unreadable either way, and the server must hear of it
            why = str(result.error).encode("utf-8", "backslashreplace").decode("utf-8")
            return {"id": result.message_id, "outcome": f"unreadable: {why}"[:200]}
        return raw
    out: dict[str, Any] = {"id": result.message_id, "token": result.token, "outcome": result.outcome}
    for name in ("reason", "signature", "request_id"):
        if getattr(result, name):
            out[name] = getattr(result, name)
    if result.steps:
        out["steps"] = list(result.steps)
    for name in ("partial", "fields", "duration_ms", "preprocess_ms"):
        if getattr(result, name) is not None:
            out[name] = getattr(result, name)
    return out


def outcome_json(outcome: AckOutcome) -> dict[str, Any]:
    """A per-item status: `ok`, `gone`, `stale_claim`, `not_in_flight`, `out_of_order`, with the
    message's group and attempt number when the core knows the message."""
    out: dict[str, Any] = {"id": outcome.message_id, "status": outcome.status}
    if outcome.message:
        out["message"] = outcome.message
    if isinstance(outcome, ReportOutcome) and outcome.group:
        out["group"] = outcome.group
        out["attempt"] = outcome.attempt
    return out


def outcome_from_json(item: dict[str, Any]) -> ReportOutcome:
    return ReportOutcome(
        str(item["id"]),
        str(item["status"]),
        str(item.get("message", "")),
        str(item.get("group", "")),
        int(item.get("attempt", 0)),
    )
