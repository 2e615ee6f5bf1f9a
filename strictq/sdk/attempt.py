"""Log data of one attempt (docs/failure-management.md §1), as the worker reports it, and the prior
attempts' log data a retried delivery carries (§2), as the handler reads it.

The handler's side of it lives on the `Message`:

    async def handle(message: Message) -> None:
        if message.history.done("charged-card"):          # a prior attempt got that far: verify, don't redo
            charge = message.history.result("charged-card")
        else:
            charge = await charge_card(message)
        await message.step("charged-card", charge)          # completed in this attempt
        message.fields["amount"] = charge["amount"]         # free-form structured fields
        message.partial = {"shipped": 2, "of": 3}           # partial results the next attempt can build on
        await ship(message)                                 # raising here: outcome `partial` (a step is done)

The worker builds the result from it: `succeeded` when the handler returns; when it raises, `partial` if it
completed a step or set `partial` in this attempt, else `failed`, with a reason (the exception, or what
`AttemptFailed` says) and a signature (what failed: the outbound call that failed, or the error's kind).
This module has no I/O: it only shapes, bounds and names things.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

# The contract's bounds (queue_core.results checks them too; a result over them fails the whole request,
# so the SDK trims before sending rather than lose an acknowledgement over log data).
MAX_REASON_BYTES = 2048
MAX_SIGNATURE_BYTES = 512
MAX_JSON_BYTES = 16 * 1024
MAX_STEPS = 100
MAX_STEP_NAME = 128
OUTCOMES = ("succeeded", "failed", "partial", "not_attempted")


class AttemptFailed(Exception):
    """Raise from a handler to fail the attempt with your own reason (and, optionally, signature, partial
    results and fields) instead of an exception's text; no traceback is logged for it."""

    def __init__(
        self,
        reason: str,
        *,
        signature: str | None = None,
        partial: Any = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.signature = signature
        self.partial = partial
        self.fields = dict(fields or {})


@dataclass(frozen=True, slots=True)
class History:
    """What earlier attempts at this message left (the poll item's `history`; empty on a first delivery).

    `steps` are the steps completed so far (`{"name", "result"}`, a step done again replacing its earlier
    entry), `partial` the latest partial results, `last_reason`/`last_outcome` the latest failure's."""

    attempts: int = 0  # failed attempts so far
    last_reason: str = ""
    last_outcome: str = ""
    steps: tuple[dict[str, Any], ...] = ()
    partial: Any = None

    @classmethod
    def from_poll(cls, raw: Any) -> History:
        if not isinstance(raw, Mapping):
            return EMPTY_HISTORY
        steps = raw.get("steps")
        attempts = raw.get("attempts")
        return cls(
            attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
            last_reason=str(raw.get("last_reason") or ""),
            last_outcome=str(raw.get("last_outcome") or ""),
            steps=tuple(s for s in steps if isinstance(s, dict)) if isinstance(steps, list) else (),
            partial=raw.get("partial"),
        )

    def __bool__(self) -> bool:
        return self.attempts > 0 or bool(self.steps)

    def step(self, name: str) -> dict[str, Any] | None:
        """The step `name` as a prior attempt reported it, or None."""
        found: dict[str, Any] | None = next((s for s in reversed(self.steps) if s.get("name") == name), None)
        return found

    def done(self, name: str) -> bool:
        """Whether a prior attempt completed the step `name` (skip it, or verify it)."""
        return self.step(name) is not None

    def result(self, name: str, default: Any = None) -> Any:
        """The result a prior attempt recorded for the step `name`."""
        step = self.step(name)
        return default if step is None else step.get("result", default)


EMPTY_HISTORY = History()


def add_step(steps: list[dict[str, Any]], name: str, result: Any = None) -> None:
    """Record a completed step in `steps` (a step done again in the same attempt: the newer one counts)."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_STEP_NAME:
        raise ValueError(f"a step name is a string of 1-{MAX_STEP_NAME} characters, not {name!r}")
    step: dict[str, Any] = {"name": name}
    if result is not None:
        step["result"] = result
    steps[:] = [s for s in steps if s.get("name") != name]
    steps.append(step)


def result_item(
    message_id: str,
    token: int | str | None,
    outcome: str,
    *,
    reason: str = "",
    signature: str = "",
    steps: list[dict[str, Any]] | None = None,
    partial: Any = None,
    fields: Mapping[str, Any] | None = None,
    duration_ms: float | None = None,
    request_id: str | None = None,
    preprocess_ms: float | None = None,
) -> dict[str, Any]:
    """One entry of `POST /queue/1/{queue}/results`, within the contract's bounds: what is over them is
    left out (and named in `fields._dropped`) rather than making the gateway refuse the whole report.
    `request_id`: the id of the request that sent the message, as its delivery carried it (the result's
    wire-log `log` record names it)."""
    assert outcome in OUTCOMES, outcome
    item: dict[str, Any] = {"id": message_id, "token": _token(token), "outcome": outcome}
    if request_id is not None:
        item["request_id"] = request_id
    if reason:
        item["reason"] = _truncate(reason, MAX_REASON_BYTES)
    if signature:
        item["signature"] = _truncate(signature, MAX_SIGNATURE_BYTES)
    if duration_ms is not None:
        item["duration_ms"] = round(max(duration_ms, 0.0), 3)
    if preprocess_ms is not None:  # pipelining: the queue learns pre-processing times from it
        item["preprocess_ms"] = round(max(preprocess_ms, 0.0), 3)
    dropped: list[str] = []
    done = [_jsonable(s) for s in (steps or [])[-MAX_STEPS:]]
    if done:
        if _fits(done):
            item["steps"] = done
        else:  # keep the names at least: what the next attempt may skip
            names = [{"name": s["name"]} for s in done]
            item["steps"] = names if _fits(names) else []
            dropped.append("steps.result")
    if partial is not None:
        value = _jsonable(partial)
        if _fits(value):
            item["partial"] = value
        else:
            dropped.append("partial")
    extra = _jsonable(dict(fields)) if fields else {}
    if extra and not _fits(extra):
        extra, dropped = {}, [*dropped, "fields"]
    if dropped:
        extra = {**extra, "_dropped": dropped}
    if extra:
        item["fields"] = extra
    return item


def failure_signature(error: BaseException, last_failed_call: str | None) -> str:
    """What failed, in the wire log's signature form (spark.masking: `http METHOD host/path 5xx`), so the
    health monitor sees one signature across workers for one backend problem and alert rules match it:
    the HTTP error the handler raised, else the latest failed outbound call of the attempt, else the
    error's kind."""
    if isinstance(error, AttemptFailed) and error.signature:
        return error.signature
    if isinstance(error, aiohttp.ClientResponseError) and error.request_info is not None:
        info = error.request_info
        return call_signature(info.method, str(info.real_url), error.status, None)
    if last_failed_call:
        return last_failed_call
    return type(error).__name__


def call_signature(method: str, url: str, status: int | None, action: str | None) -> str:
    """`http POST api.example/v1/charges/{id} 5xx` (no response: `error`; a proxy refusal: its action)."""
    from spark.masking import mask_endpoint, status_class  # stdlib only; the one definition of the form

    return " ".join(("http", method.upper(), mask_endpoint(url) or "-", status_class(status, None, action)))


def failure_reason(error: BaseException) -> str:
    """The reason reported for a failed attempt: `AttemptFailed`'s, an HTTP error as `POST url: 503
    Service Unavailable`, else the exception as `Kind: text`."""
    if isinstance(error, AttemptFailed):
        return error.reason
    if isinstance(error, aiohttp.ClientResponseError) and error.request_info is not None:
        info = error.request_info
        return f"{info.method} {info.real_url}: {error.status} {error.message}".rstrip()
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _token(token: int | str | None) -> int | None:
    """The claim's token as the results endpoint wants it (a probe's token 0 is no token)."""
    if isinstance(token, str):
        token = int(token) if token.isdigit() else None
    return token if isinstance(token, int) and token > 0 else None


def _truncate(text: str, limit: int) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def _jsonable(value: Any) -> Any:
    """JSON the gateway can take: values orjson cannot encode become their repr."""
    try:
        return orjson.loads(orjson.dumps(value, default=repr, option=orjson.OPT_NON_STR_KEYS))
    except orjson.JSONEncodeError:  # e.g. integers beyond 64 bits
        return json.loads(json.dumps(value, default=repr))


def _fits(value: Any) -> bool:
    return len(orjson.dumps(value)) <= MAX_JSON_BYTES
