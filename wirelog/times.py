"""Times on command lines (design note): ISO-8601 (`2026-11-22T10:00:00Z`) or relative (`15m` ago).

Stdlib only: the CLI imports this before deciding anything else.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)(?:\s+ago)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class TimeParseError(ValueError):
    """The text is neither an ISO-8601 time nor a relative duration like `15m`."""


def parse_time(text: str, *, now: float | None = None) -> float:
    """Seconds since the epoch for `text`: ISO-8601 (naive means UTC) or `<n><s|m|h|d|w>` before `now`."""
    match = _RELATIVE.match(text)
    if match:
        amount = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
        return (time.time() if now is None else now) - amount
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TimeParseError(
            f"not a time: {text!r} (use ISO-8601 like 2026-11-22T10:00:00Z, or 15m / 2h / 7d ago)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # wire-log times are UTC; so is a bare time
    return parsed.timestamp()


def format_time(ts: float | None) -> str:
    """ISO-8601 UTC with milliseconds (`2026-11-22T10:00:00.123Z`), `-` when unknown."""
    if ts is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
