"""Asking a JetStream server about itself over NATS, with the system account's login.

Why a module of its own: the servers run without nats-server's HTTP monitoring port (it has no login,
so any local user could read every stream's layout and leader from it). What `cluster up` and the tests
need to know at start-up (is JetStream current on this server, who leads the meta group, where is a
stream's leader) they ask instead as the system account's user (cluster.nats_roles), on the server's
own client port: `$SYS.REQ.SERVER.<server id>.<ENDPOINT>` answers with the same JSON the HTTP endpoint
gave, and only that server answers, as the HTTP port did.

Synchronous and one-shot on purpose (one TCP connection per question, bounded by `timeout`): the callers
(cluster.nats_servers) are synchronous and poll a starting server, possibly from a test that already runs
an event loop. The client protocol needed is four lines: INFO (which carries the server's id), CONNECT,
SUB/PUB on a private inbox, and the one MSG that answers it.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any

ENDPOINTS = ("HEALTHZ", "JSZ", "VARZ", "ROUTEZ", "CONNZ", "SUBSZ", "STATSZ", "ACCOUNTZ", "LEAFZ", "GATEWAYZ")
MAX_LINE = 64 * 1024  # INFO and control lines are short; a longer one is not a NATS server talking
MAX_ANSWER = 16 * 1024 * 1024  # JSZ with stream details of many partitions stays far below this


class SystemLoginRefused(RuntimeError):
    """The server refused the system account's login (a wrong password: the message says which)."""


@dataclass(frozen=True, slots=True)
class SystemLogin:
    user: str
    password: str = field(repr=False)


def ask(
    host: str,
    port: int,
    login: SystemLogin,
    endpoint: str,
    options: dict[str, Any] | None = None,
    *,
    timeout: float = 1.0,
) -> dict[str, Any] | None:
    """The `data` of the server at host:port's answer to `$SYS.REQ.SERVER.<its id>.<endpoint>` (HEALTHZ,
    JSZ, ... with `options` as the HTTP query would give them), or None if it does not answer in time,
    answers with an error, or is not reachable. SystemLoginRefused if it refuses the login."""
    name = endpoint.upper()
    if name not in ENDPOINTS:
        raise ValueError(f"not a server endpoint: {endpoint!r} (one of {', '.join(ENDPOINTS)})")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            reader = _Reader(sock, deadline)
            info = _info(reader.line())
            server_id = info.get("server_id")
            if not isinstance(server_id, str) or not server_id.isalnum():
                return None
            inbox = f"_INBOX.{secrets.token_hex(8)}"
            body = json.dumps(options or {}).encode()
            connect = {
                "verbose": False,
                "pedantic": False,
                "user": login.user,
                "pass": login.password,
                "name": "strictq-system",
                "lang": "python",
                "version": "0",
                "protocol": 1,
                "headers": False,
            }
            sock.sendall(
                b"CONNECT "
                + json.dumps(connect).encode()
                + b"\r\n"
                + f"SUB {inbox} 1\r\n".encode()
                + f"PUB $SYS.REQ.SERVER.{server_id}.{name} {inbox} {len(body)}\r\n".encode()
                + body
                + b"\r\n"
                + b"PING\r\n"
            )
            return _answer(reader, sock)
    except (OSError, ValueError):
        return None


def _answer(reader: _Reader, sock: socket.socket) -> dict[str, Any] | None:
    """Read until the inbox's one message (answering the server's PINGs); None on a `-ERR` other than
    a refused login, which raises."""
    while True:
        line = reader.line()
        if line.startswith(b"MSG "):
            size = int(line.split()[-1])
            if size > MAX_ANSWER:
                return None
            answer = json.loads(reader.exactly(size + 2)[:size])
            data = answer.get("data") if isinstance(answer, dict) else None
            return data if isinstance(data, dict) else None
        if line.startswith(b"PING"):
            sock.sendall(b"PONG\r\n")
        elif line.startswith(b"-ERR"):
            text = line.decode(errors="replace")
            if "authorization" in text.lower() or "authentication" in text.lower():
                raise SystemLoginRefused(f"the JetStream server refused the system account's login ({text})")
            return None
        # +OK, PONG, INFO (a cluster's servers announce each other): nothing to do


def _info(line: bytes) -> dict[str, Any]:
    if not line.startswith(b"INFO "):
        raise ValueError("not a NATS server")
    info = json.loads(line[5:])
    if not isinstance(info, dict):
        raise ValueError("not a NATS server")
    return info


class _Reader:
    """Lines and exact byte counts from a socket, never past the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = b""

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                raise ValueError("line too long")
            self._more()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._more()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _more(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk
