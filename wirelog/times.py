"""Times on command lines (docs/contracts.md): ISO-8601 (`2026-11-22T10:00:00Z`) or relative (`15m` ago).

Stdlib only: the CLI imports this before deciding anything else.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime

# ASCII digits only: `\d` alone also matches other scripts' digits ('٣'), which float() then accepts.
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)?\s*", re.IGNORECASE | re.ASCII)
_AGO = re.compile(r"\s+ago\s*$", re.IGNORECASE | re.ASCII)
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class TimeParseError(ValueError):
    """The text is neither an ISO-8601 time nor a relative duration like `15m`."""


def parse_duration(text: str, *, unit_required: bool = False) -> float:
    """Seconds in `600`, `600s`, `30m`, `2h`, `7d` or `1w` (a bare number is seconds unless
    `unit_required`): the one duration syntax of every command line (ttls, windows, intervals)."""
    match = _DURATION.fullmatch(text)
    if match is None or (unit_required and match.group(2) is None):
        raise TimeParseError(f"not a duration: {text!r} (use seconds, or a number with s, m, h, d or w)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "s").lower()]
    if not math.isfinite(seconds):  # 400 nines: float() gives inf, and `now - inf` would mean "no filter"
        raise TimeParseError(f"duration too large: {text[:40]!r}")
    return seconds


def parse_time(text: str, *, now: float | None = None) -> float:
    """Seconds since the epoch for `text`: ISO-8601 (naive means UTC) or `<n><s|m|h|d|w>` before `now`."""
    try:
        amount = parse_duration(_AGO.sub("", text), unit_required=True)
    except TimeParseError:
        pass
    else:
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
