"""Logs a client cannot forge or flood (issue 11, items 6 and 10): a real `strictq serve` process.

Client text with CR/LF and terminal escapes (a worker's result reason, an admin's alert reason) must not start
a line of its own in the server's log; malformed HTTP requests give one WARNING line each, no traceback.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import until_sync
from serve_support import Serve, start_serve, stop

from wirelog import logsafe

FORGED = "2026-01-01 00:00:00,000 ERROR strictq.forged: injected"
EVIL = f"db down\n{FORGED}\r\n{FORGED}\x1b[2J\u2028{FORGED}"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    process = start_serve(tmp_path / "data")
    try:
        yield process
    finally:
        stop(process)


def _wait_for(serve: Serve, text: str, timeout: float = 10.0) -> str:
    """The server's log once it holds `text`."""
    return until_sync(lambda: text in (log := serve.full_log()) and log, timeout, what=f"{text!r} in the log")


def test_reasons_with_line_breaks_do_not_forge_log_lines(serve: Serve) -> None:
    admin, worker = serve.secret("admin"), serve.secret("worker")
    assert serve.call("POST", "/queue/1/orders/send", admin, {"n": 1})[0] == 200
    status, polled = serve.call("GET", "/queue/1/orders/poll?limit=1&ttl=30", worker)
    assert status == 200 and len(polled) == 1
    result = {"id": polled[0]["id"], "token": polled[0]["token"], "outcome": "failed", "reason": EVIL}
    serve.call("POST", "/queue/1/orders/results", worker, {"results": [result]})
    status, _ = serve.call("POST", "/admin/v1/alerts", admin, {"reason": EVIL, "queue": "orders"})
    assert status == 200
    escaped = logsafe.escape_controls(EVIL)
    log = _wait_for(serve, escaped)
    assert escaped in log  # the alert's decision was logged, escaped
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith(FORGED)], log[-3000:]
    assert "\x1b" not in log and "\u2028" not in log and "\r" not in log


MALFORMED = [
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /queue/1/q/send HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)) + b"\r\n\r\n",  # TLS on plain HTTP
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Evil: a\rb\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * 10000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n Folded: continuation\r\n\r\n",
    b"BREW /coffee HTTP/1.1\r\nHost: x\r\n\r\n",
]


def _send_raw(address: tuple[str, int], data: bytes) -> None:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass


def test_malformed_requests_are_one_warning_line_each(serve: Serve) -> None:
    before = serve.full_log()
    for index in range(50):
        _send_raw(serve.address(), MALFORMED[index % len(MALFORMED)])
    assert serve.call("GET", "/readyz", serve.secret("admin"))[0] == 200  # still serving
    time.sleep(0.5)  # the last lines reach the log file (stderr, unbuffered)
    added = serve.full_log()[len(before) :]
    lines = [line for line in added.splitlines() if line.strip()]
    assert "Traceback" not in added, added[-3000:]
    assert not [line for line in lines if " ERROR " in line], added[-3000:]
    warnings = [line for line in lines if " WARNING aiohttp.server: malformed request" in line]
    assert 0 < len(warnings) <= 50
    assert len(lines) <= 50 + 5, added[-3000:]


# --------------------------------------------------------------------------------- the formatter itself
def _format(message: str, *args: object, exc: BaseException | None = None) -> str:
    formatter = logsafe.SafeFormatter(logsafe.FORMAT)
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = logging.LogRecord("t", logging.INFO, __file__, 1, message, args, info)
    return formatter.format(record)


def test_the_formatter_escapes_arguments_and_exception_messages() -> None:
    assert _format("reason %s", "a\nb\rc\x1b[31m\x85\u2029").endswith("reason a\\nb\\rc\\x1b[31m\\x85\\u2029")
    try:
        raise ValueError(f"bad name\n{FORGED}")
    except ValueError as error:
        text = _format("failed", exc=error)
    lines = text.splitlines()
    assert lines[1] == "Traceback (most recent call last):"  # the server's traceback keeps its lines
    assert lines[-1] == f"ValueError: bad name\\n{FORGED}"
    assert not any(re.match(r"^\d{4}-", line) for line in lines[1:])
