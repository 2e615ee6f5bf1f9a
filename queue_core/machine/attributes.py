"""Queue attributes with their SQS/EmoDB defaults and ranges, validated in one place."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InvalidArgument

KIB = 1024
MAX_MESSAGE_SIZE_CEILING = 1024 * KIB
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")

QueueKind = Literal["queue", "dedup"]
DedupScope = Literal["queue", "group"]


@dataclass(frozen=True, slots=True)
class QueueAttributes:
    """Per-queue settings; times are float seconds. `labels` carries face-specific extras (e.g. FifoQueue)."""

    visibility_timeout: float = 30.0
    max_receive_count: int = 0  # 0: never dead-letter
    dead_letter_queue: str | None = None
    retention: float = 4 * 24 * 3600.0
    delay: float = 0.0
    dedup_window: float = 300.0
    dedup_scope: DedupScope = "queue"
    content_based_dedup: bool = False
    max_message_size: int = 256 * KIB
    kind: QueueKind = "queue"
    labels: dict[str, str] = field(default_factory=dict)

    def validate(self) -> QueueAttributes:
        _check_range("visibility_timeout", self.visibility_timeout, 0, 12 * 3600)
        _check_range("retention", self.retention, 60, 14 * 24 * 3600)
        _check_range("delay", self.delay, 0, 900)
        _check_range("dedup_window", self.dedup_window, 0, 24 * 3600)
        _check_range("max_message_size", self.max_message_size, 1, MAX_MESSAGE_SIZE_CEILING)
        _check_range("max_receive_count", self.max_receive_count, 0, 1000)
        if self.dedup_scope not in ("queue", "group"):
            raise InvalidArgument("dedup_scope must be 'queue' or 'group'", field="dedup_scope")
        if self.kind not in ("queue", "dedup"):
            raise InvalidArgument("kind must be 'queue' or 'dedup'", field="kind")
        if self.dead_letter_queue is not None:
            validate_queue_name(self.dead_letter_queue)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()):
            raise InvalidArgument("labels must map strings to strings", field="labels")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueueAttributes:
        return cls().updated(data)

    def updated(self, changes: dict[str, Any]) -> QueueAttributes:
        """A copy with `changes` applied and validated; unknown names are refused, not ignored."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidArgument(f"unknown queue attribute(s): {', '.join(unknown)}", fields=unknown)
        try:
            new = dataclasses.replace(self, **_coerce(changes))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad queue attribute value: {exc}") from exc
        return new.validate()


def _coerce(changes: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name in ("visibility_timeout", "retention", "delay", "dedup_window"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"{name} must be a number of seconds", field=name)
            value = float(value)
        elif name in ("max_receive_count", "max_message_size"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgument(f"{name} must be an integer", field=name)
        elif name == "content_based_dedup":
            if not isinstance(value, bool):
                raise InvalidArgument(f"{name} must be a boolean", field=name)
        elif name == "labels":
            if not isinstance(value, dict):
                raise InvalidArgument("labels must be an object", field=name)
            value = dict(value)
        out[name] = value
    return out


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}, got {value}", field=name)


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise InvalidArgument(
            "queue names are 1-128 characters of letters, digits, '_', '-' and '.'", field="queue"
        )
    return name
