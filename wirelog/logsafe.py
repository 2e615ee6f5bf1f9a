"""Server logs that a client cannot forge: one logging set-up for every server process.

Client-supplied text (result and alert reasons, queue names, group and worker ids, fence reasons, header
values, user agents) reaches log messages through their arguments. `SafeFormatter` escapes control
characters (C0, DEL, C1, and the Unicode line and paragraph separators) in the formatted message and in an
exception's message, so one record is always one line, plus, for a server-side exception, its traceback
(whose frame lines are the server's own source). The stdlib has no such formatter and no maintained
library fits the `logging` stack without taking it over, so this is the small piece written by hand.

`MalformedRequestFilter` turns aiohttp's report of a malformed request (bad request line, bad header, bad
chunking: an `HttpProcessingError`, logged at ERROR with a full traceback by `RequestHandler.handle_error`)
into one WARNING line without a traceback: such requests are the client's fault, and a stream of them must
not fill the log (issue 11). Server-side errors keep their ERROR and traceback.

This module sits in the bottom layer (`wirelog`) so that queue_core, gateway and fencing can all use it.
"""

from __future__ import annotations

import logging
import re
import traceback
from types import TracebackType

from aiohttp.http_exceptions import HttpProcessingError

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# C0 controls (with TAB, LF, CR), DEL, C1 controls (with NEL) and U+2028/U+2029: all can break a line or
# drive a terminal. Backslashes are left alone: a literal "\n" typed by a client does not start a line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with every control character written as a visible escape (\\n, \\r, \\t, \\xNN, \\uNNNN)."""
    return _CONTROL.sub(_escape_one, text)


class SafeFormatter(logging.Formatter):
    """A Formatter whose output holds no control character a client put there."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:
        _type, value, tb = ei
        if value is None:
            return super().formatException(ei)
        lines = _format_chain(traceback.TracebackException(type(value), value, tb, compact=True))
        return "".join(lines).rstrip("\n")

    def formatStack(self, stack_info: str) -> str:
        return stack_info  # the server's own call stack: no client text


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _format_chain(te: traceback.TracebackException, depth: int = 0) -> list[str]:
    """Like TracebackException.format(), with each exception's own message escaped: the frame lines are
    the server's source, the message may quote a client."""
    lines: list[str] = []
    if depth < 10:  # chains are short; a cycle-safe bound all the same
        if te.__cause__ is not None:
            lines += [*_format_chain(te.__cause__, depth + 1), _CAUSE]
        elif te.__context__ is not None and not te.__suppress_context__:
            lines += [*_format_chain(te.__context__, depth + 1), _CONTEXT]
    if te.stack:
        lines.append("Traceback (most recent call last):\n")
        lines += te.stack.format()
    lines += [escape_controls(line.rstrip("\n")) + "\n" for line in te.format_exception_only()]
    return lines


class MalformedRequestFilter(logging.Filter):
    """On aiohttp's server logger: a malformed request is one WARNING line, without a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "malformed request from %s: %s"
            record.args = (remote, exc.message or type(exc).__name__)
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
            record.exc_info = None
            record.exc_text = None
        return True


_MALFORMED = MalformedRequestFilter()


def install(level: int = logging.INFO) -> None:
    """The logging set-up of a server process (`strictq serve`, `queue-server`, `proxy`): INFO to stderr,
    every root handler formatting through SafeFormatter, malformed requests as one WARNING line."""
    logging.basicConfig(level=level, format=FORMAT)
    root = logging.getLogger()
    for handler in root.handlers:
        secure_handler(handler)
    server = logging.getLogger("aiohttp.server")
    if _MALFORMED not in server.filters:
        server.addFilter(_MALFORMED)


def secure_handler(handler: logging.Handler) -> None:
    """Give `handler` the safe formatter, keeping its format string (and date format) when it has one."""
    current = handler.formatter
    if isinstance(current, SafeFormatter):
        return
    fmt = current._fmt if current is not None else FORMAT  # no public getter
    datefmt = current.datefmt if current is not None else None
    handler.setFormatter(SafeFormatter(fmt, datefmt))
