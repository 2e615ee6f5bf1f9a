"""Text the store, the wire log and the logs can hold: the one checker every API face and the core call.

Python's `json.loads` accepts `"\\ud800"` (a lone surrogate, valid JSON text) but such a str cannot be
encoded as UTF-8: SQLite, orjson and the wire log all refuse it, far from the request that brought it. So
text is checked at each API's edge (400 naming the field) and again by the core (defence in depth), never
left to fail in the store's writer thread. Names, ids and anything that may become a header value or a log
key must in addition hold no control characters (a trailing newline, say, forges log lines and breaks
headers). Sans-I/O like the rest of the machine.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import InvalidArgument

# C0 controls, DEL and the C1 controls: never part of a name, an id or a header value.
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
# The same but TAB, LF and CR: never part of a stored value that may span lines (a JSON policy text).
VALUE_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
MAX_DEPTH = 200  # JSON nesting walked by `check_json`; the parsers bound it lower already
# Numbers given as text (query strings, headers): plain ASCII only, nothing else int()/float() would also
# take ('٣', '1_0', ' 5', '+5', '1e3' for an integer, 'nan', 'inf'). Use with `fullmatch`.
INTEGER_RE = re.compile(r"-?[0-9]{1,19}")
DECIMAL_RE = re.compile(r"-?(?:[0-9]{1,19}(?:\.[0-9]{0,19})?|\.[0-9]{1,19})")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what orjson, the store and the wire log all hold


def encodable(text: str) -> bool:
    """Whether `text` is valid Unicode (UTF-8-encodable: no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: Any, field: str, **details: Any) -> Any:
    """`value` unchanged when it is not a str or is valid Unicode; InvalidArgument naming `field` if not."""
    if isinstance(value, str) and not encodable(value):
        raise InvalidArgument(
            f"{field} is not valid Unicode text (it holds a lone surrogate such as \\ud800)",
            field=field,
            **details,
        )
    return value


def check_name(value: Any, field: str, **details: Any) -> Any:
    """Like `check_text`, and no control characters: for names, ids, signatures and header values."""
    return _check_controls(value, field, CONTROL_RE, details)


def check_value(value: Any, field: str, **details: Any) -> Any:
    """Like `check_text`, and no control characters other than TAB, LF and CR (`VALUE_CONTROL_RE`): for
    stored values that may span lines, such as queue labels (an SQS policy is JSON text)."""
    return _check_controls(value, field, VALUE_CONTROL_RE, details)


def _check_controls(value: Any, field: str, controls: re.Pattern[str], details: dict[str, Any]) -> Any:
    check_text(value, field, **details)
    if isinstance(value, str):
        bad = controls.search(value)
        if bad is not None:
            raise InvalidArgument(
                f"{field} must not contain control characters (found U+{ord(bad.group()):04X})",
                field=field,
                **details,
            )
    return value


def check_number(value: Any, field: str, **details: Any) -> Any:
    """`value` unchanged unless it is a number no JSON peer of the store can hold: an integer outside
    signed 64 bits (the stdlib's `json` keeps any size; orjson, used by the store, the internal API and
    the wire log, refuses them) or a non-finite float (`json.loads("1e999")` gives inf, stored as null)."""
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        raise InvalidArgument(
            f"{field} holds an integer outside the signed 64-bit range (send it as a string)",
            field=field,
            **details,
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{field} holds a number that is not finite", field=field, **details)
    return value


def check_json(value: Any, field: str, **details: Any) -> Any:
    """Every str of a parsed JSON value (object keys too) valid Unicode, every number one orjson can hold
    (`check_number`); InvalidArgument naming `field`."""
    return _walk(value, field, True, details)


def check_json_numbers(value: Any, field: str, **details: Any) -> Any:
    """Only the numbers of a parsed JSON value (`check_number`), its text left to a later check."""
    return _walk(value, field, False, details)


def _walk(value: Any, field: str, text: bool, details: dict[str, Any]) -> Any:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if text:
                check_text(item, field, **details)
        elif isinstance(item, int | float):
            check_number(item, field, **details)
        elif depth >= MAX_DEPTH:
            raise InvalidArgument(f"{field} nests too deeply", field=field, **details)
        elif isinstance(item, dict):
            for key, child in item.items():
                if text:
                    check_text(key, field, **details)
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
    return value
