"""Slow readers and slow heads cannot pin the server (issue 11, item 8): a real `strictq serve` process.

200 connections pipeline `peek?limit=1000` (about 1 MB per answer) and never read: the server's RSS stays
well below what it reached before (713 MB here, 1.1 GB in the report), and drops back near its baseline
once they have closed. A plain or TLS connection that never completes its request head (or its TLS
handshake) is closed by the server within the (short, test-configured) header timeout.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_support import Serve, start_serve, stop

CONNECTIONS = 200
PIPELINED = 50
GROWTH_BOUND_MB = 400  # while they are connected (before the fix: +646 MB)
RETURN_BOUND_MB = 60  # after they closed (before the fix: +644 MB, kept)
HEADER_TIMEOUT = 1.0
WAIT = 15.0  # bounded waits; no timing is asserted
SAMPLING = 8.0  # at most this long watching the RSS while the readers are connected
SAMPLE_EVERY = 0.1
FLAT_SAMPLES = 15  # RSS within FLAT_MB over this many samples in a row: the server sent what it could
FLAT_MB = 10.0  # allocator noise is a few MB; unbounded buffering grows tens of MB a second


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    process = start_serve(tmp_path / "data", "--header-timeout", str(HEADER_TIMEOUT))
    try:
        yield process
    finally:
        stop(process)


@pytest.fixture
def tls_serve(tmp_path: Path) -> Iterator[Serve]:
    process = start_serve(tmp_path / "tls-data", "--header-timeout", str(HEADER_TIMEOUT), tls=True)
    try:
        yield process
    finally:
        stop(process)


def test_slow_readers_do_not_pin_memory(serve: Serve) -> None:
    admin = serve.secret("admin")
    for _ in range(10):
        batch = {"big": [{"text": "x" * 1000} for _ in range(100)]}
        assert serve.call("POST", "/queue/1/_sendbatch", admin, batch)[0] == 200
    status, peeked = serve.call("GET", "/queue/1/big/peek?limit=1000", admin)
    assert status == 200 and len(json.dumps(peeked)) > 1_000_000
    baseline = rss_mb(serve.pid)
    head = f"GET /queue/1/big/peek?limit=1000 HTTP/1.1\r\nHost: x\r\nX-BV-API-Key: {admin}\r\n\r\n"
    request = head.encode()
    sockets: list[socket.socket] = []
    peak = baseline
    try:
        for _ in range(CONNECTIONS):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that never reads
            sock.settimeout(10)
            sock.connect(serve.address())
            sock.setblocking(False)
            try:
                sock.send(request * PIPELINED)
            except BlockingIOError:
                pass
            sockets.append(sock)
        # The server works through what it can send, then waits on them: sample its RSS until it has
        # stayed flat for a while (a server that buffers without bound keeps growing), at most SAMPLING s.
        samples = [rss_mb(serve.pid)]
        deadline = time.monotonic() + SAMPLING
        while time.monotonic() < deadline:
            time.sleep(SAMPLE_EVERY)
            samples.append(rss_mb(serve.pid))
            flat = samples[-FLAT_SAMPLES:]
            if len(flat) == FLAT_SAMPLES and max(flat) - min(flat) < FLAT_MB:
                break
        peak = max(peak, *samples)
        assert serve.call("GET", "/readyz", admin)[0] == 200  # a normal request still gets through
    finally:
        for sock in sockets:
            sock.close()
    assert peak - baseline < GROWTH_BOUND_MB, (baseline, peak)
    deadline = time.monotonic() + WAIT
    while rss_mb(serve.pid) - baseline >= RETURN_BOUND_MB and time.monotonic() < deadline:
        time.sleep(SAMPLE_EVERY)
    after = rss_mb(serve.pid)
    assert after - baseline < RETURN_BOUND_MB, (baseline, peak, after)


def _closed_by_server(sock: socket.socket) -> bool:
    """Blocks (bounded) until the server closes the connection; False if it was still open at the end."""
    sock.settimeout(WAIT)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError, OSError):
        return True
    return True


def test_a_plain_connection_without_a_complete_head_is_closed(serve: Serve) -> None:
    with socket.create_connection(serve.address(), timeout=10) as silent:
        with socket.create_connection(serve.address(), timeout=10) as partial:
            partial.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            assert _closed_by_server(partial)
        assert _closed_by_server(silent)
    # A second request on a kept-alive connection has the same limit for its head.
    with socket.create_connection(serve.address(), timeout=10) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 ")
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        assert _closed_by_server(kept)
    assert "no request head in 1s" in serve.full_log()


def test_a_tls_connection_without_a_complete_head_or_handshake_is_closed(tls_serve: Serve) -> None:
    context = tls_serve.ssl_context()
    assert context is not None
    host, port = tls_serve.address()
    with socket.create_connection((host, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
            assert _closed_by_server(tls)
    with socket.create_connection((host, port), timeout=10) as no_handshake:
        no_handshake.sendall(b"\x16\x03\x01")  # the start of a ClientHello, never finished
        assert _closed_by_server(no_handshake)
    # A complete request still works.
    assert tls_serve.call("GET", "/healthz", tls_serve.secret("admin"))[0] == 200
