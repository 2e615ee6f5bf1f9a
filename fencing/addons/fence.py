"""Fence addon: block or mimic fenced workers (stub, being filled in)."""

from __future__ import annotations

from fencing.control_client import ControlState


class Fence:
    """Answers calls of fenced workers itself (block: 403, mimic: recorded responses)."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
