"""Local state per group (state transfer, docs/state-transfer.md): what a handler keeps across the messages
of one group on this worker (`msg.state`, a JSON-able dict), and what moves with the group when the queue
service hands it to another worker.

A `Worker(state_limit=N)` declares the `state` capability on its polls. Then:
- `msg.state` is the same dict for every message of the group on this worker (created empty);
- a poll item carrying `state` (the group moved here, with its former worker's state) replaces it;
- after each handler, the group's state must fit in `state_limit` bytes of compact JSON, else the attempt
  fails with `StateTooLarge` naming the group and both sizes (the state is kept as the handler left it);
- a poll answer naming groups in `X-Strictq-Handover` (the group moves away from this worker) makes the
  worker upload their state (`PUT /queue/1/{queue}/state`, in requests under the edge's body cap) and
  forget its copy once the gateway has it.

Without `state_limit`, `msg.state` is a fresh dict per message that refuses writes with a message saying
how to turn local state on, so a handler relying on it cannot silently lose counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

MAX_UPLOAD_BYTES = 3 * 1024 * 1024  # one upload request's body, at most (the edge refuses over 4 MiB)


class StateTooLarge(ValueError):
    """A group's local state grew past the worker's `state_limit`."""


class StateDisabled(dict[str, Any]):
    """`msg.state` of a worker without local state: reads find nothing, writes explain what to do."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("local state is off for this worker: pass Worker(..., state_limit=<bytes>)")

    __setitem__ = _refuse
    __delitem__ = _refuse
    update = _refuse
    setdefault = _refuse
    pop = _refuse
    clear = _refuse


def encoded(state: dict[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


class LocalState:
    """The groups' state on this worker, bounded per group by `limit` bytes of compact JSON."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("state_limit must be a positive number of bytes")
        self.limit = limit
        self.groups: dict[str, dict[str, Any]] = {}
        self.imported = 0  # groups that arrived with transferred state
        self.exported = 0  # groups whose state went to the gateway

    def of(self, group: str) -> dict[str, Any]:
        """The group's state (the same dict across its messages)."""
        state = self.groups.get(group)
        if state is None:
            state = self.groups[group] = {}
        return state

    def take(self, group: str, state: dict[str, Any]) -> None:
        """A moved group's state, from its former worker: it replaces whatever this worker had."""
        self.groups[group] = dict(state)
        self.imported += 1

    def check(self, group: str) -> int:
        """The group's size; StateTooLarge past the limit, TypeError/ValueError when it is not JSON."""
        state = self.groups.get(group)
        if state is None:
            return 0
        size = len(encoded(state))
        if size > self.limit:
            raise StateTooLarge(
                f"the local state of group {group!r} is {size} bytes, over this worker's state_limit of"
                f" {self.limit} bytes"
            )
        return size

    def batches(self, groups: Iterable[str], max_bytes: int = MAX_UPLOAD_BYTES) -> list[dict[str, Any]]:
        """The named groups' state (empty for one this worker never saw) in upload requests of at most
        `max_bytes` each (a group over it goes alone)."""
        out: list[dict[str, Any]] = []
        batch: dict[str, Any] = {}
        used = 2
        for group in dict.fromkeys(groups):
            state = self.groups.get(group, {})
            size = len(encoded(state)) + len(json.dumps(group)) + 2
            if batch and used + size > max_bytes:
                out.append(batch)
                batch, used = {}, 2
            batch[group] = state
            used += size
        if batch:
            out.append(batch)
        return out

    def forget(self, groups: Iterable[str]) -> None:
        for group in groups:
            if self.groups.pop(group, None) is not None:
                self.exported += 1
