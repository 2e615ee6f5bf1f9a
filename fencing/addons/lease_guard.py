"""Lease guard addon: refuse calls tagged with a lease below the group's floor (stub, being filled in)."""

from __future__ import annotations

from fencing.control_client import ControlState


class LeaseGuard:
    """409 `stale-lease` below the floor, 503 `unsynced` while the control stream is not synchronised."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
