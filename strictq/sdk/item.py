"""One polled message as the SDK works with it: built from the gateway's JSON in one place
(`PollItem.from_wire`), so the worker never reads loose dict keys and a malformed answer fails with one
clear error naming the item and the field.

The EmoDB face's poll answer (gateway/emodb.py) is a list of objects:
`{"id", "payload", "group", "seq", "token", "attempt", "queue_ref", "probe"?, "history"?, "request_id"?,
"state"?, "estimate"?}` (`state`: a moved group's local state, for a poll declaring `state`).
Only `id` is required (a plain EmoDB server sends `id` and `payload`): no `group` means the message is its
own group, no `token` means an unfenced claim, no `attempt` (or `receive_count`, an older name) means the
first. `request_id` (the id of the request that sent the message, for pollers declaring `request_ids`)
is kept only when well formed (protocol.request_ids): it is a diagnostic, and never worth failing over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.estimates import Estimate
from protocol.request_ids import is_request_id

from .attempt import EMPTY_HISTORY, History
from .errors import MalformedPollItem


@dataclass(frozen=True, slots=True)
class PollItem:
    """A claimed message: `token` is the claim's fencing token (None: none given; a probe's is not a claim),
    `attempt` the delivery's receive count, `queue_ref` the name the egress proxy knows the queue by."""

    id: str
    payload: Any
    group: str  # the message's own id when the gateway named no group
    seq: int = 0
    token: int | None = None
    attempt: int = 1
    queue_ref: str | None = None
    probe: bool = False
    history: History = EMPTY_HISTORY
    request_id: str | None = None  # the id of the request that sent the message (None: not given)
    state: dict[str, Any] | None = None  # the group's transferred local state (it moved to this worker)
    # Seconds to process / pre-process it, for pollers declaring `estimates` (pipelining); lenient, like
    # request_id: a hint, never worth failing over.
    estimate: Estimate | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, item: Any, where: str = "poll item") -> PollItem:
        """The item from its JSON; `MalformedPollItem` naming `where` and the field otherwise."""
        if not isinstance(item, dict):
            raise MalformedPollItem(f"{where}: expected a JSON object, got {_show(item)}", item)
        message_id = item.get("id")
        if not isinstance(message_id, str) or not message_id:
            expected = "'id' must be a non-empty string"
            raise MalformedPollItem(f"{where}: {expected}, got {_show(message_id)}", item)
        where = f"{where} ({message_id})"

        def wrong(name: str, expected: str) -> MalformedPollItem:
            return MalformedPollItem(f"{where}: {name!r} must be {expected}, got {_show(item[name])}", item)

        group = item.get("group")
        if group is not None and not isinstance(group, str):
            raise wrong("group", "a string")
        seq = _integer(item, "seq", 0)
        if seq is None:
            raise wrong("seq", "a non-negative integer")
        token = _token(item.get("token"))
        if token is False:
            raise wrong("token", "a positive integer")
        attempt_key = "attempt" if "attempt" in item else "receive_count"
        attempt = _integer(item, attempt_key, 1)
        if attempt is None:
            raise wrong(attempt_key, "a non-negative integer")
        queue_ref = item.get("queue_ref")
        if queue_ref is not None and not isinstance(queue_ref, str):
            raise wrong("queue_ref", "a string")
        probe = item.get("probe", False)
        if not isinstance(probe, bool):
            raise wrong("probe", "true or false")
        history = item.get("history")
        if history is not None and not isinstance(history, dict):
            raise wrong("history", "an object")
        request_id = item.get("request_id")
        state = item.get("state")
        if state is not None and not isinstance(state, dict):
            raise wrong("state", "an object")
        return cls(
            id=message_id,
            payload=item.get("payload"),
            group=group or message_id,
            seq=seq,
            token=token or None,
            attempt=max(attempt, 1),
            queue_ref=queue_ref or None,
            probe=probe,
            history=History.from_poll(history),
            request_id=request_id if is_request_id(request_id) else None,
            state=state,
            estimate=Estimate.from_json(item.get("estimate")),
            raw=item,
        )


def parse_poll(answer: Any, queue: str) -> list[PollItem]:
    """A whole poll answer (a JSON list). A malformed item raises `MalformedPollItem` carrying the items of
    the same answer that could be read (claimed too: the caller hands them back)."""
    if not isinstance(answer, list):
        raise MalformedPollItem(f"poll of {queue}: expected a JSON list, got {_show(answer)}", answer)
    items: list[PollItem] = []
    error: MalformedPollItem | None = None
    for index, raw in enumerate(answer):
        try:
            items.append(PollItem.from_wire(raw, f"poll of {queue}: item {index}"))
        except MalformedPollItem as exc:
            error = error or exc
    if error is not None:
        raise MalformedPollItem(str(error), error.body, tuple(items))
    return items


def _integer(item: Mapping[str, Any], name: str, default: int) -> int | None:
    """The field as an int >= 0 (absent or null: `default`); None when it is something else."""
    value = item.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _token(value: Any) -> int | bool:
    """A fencing token: a positive int (or its decimal string, as older servers sent it); 0 or absent:
    none (0); False: malformed."""
    if value is None or value == "" or value == 0:
        return 0
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return False
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
