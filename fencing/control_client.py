"""Proxy side of the control stream (docs/control-stream.md) (stub, being filled in)."""

from __future__ import annotations


class ControlState:
    """Fences and token floors as last published by the core."""

    def __init__(self) -> None:
        self.fences: dict[str, object] = {}
        self.floors: dict[tuple[str, str], int] = {}
        self.synced = False
        self.last_event_id: str | None = None
