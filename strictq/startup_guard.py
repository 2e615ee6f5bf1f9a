"""What `strictq serve` and `strictq queue-server` check before they touch anything: that no other server
runs on the same data dir (a lock held for the process's lifetime) and that every port they will listen
on is free. Each fault is one line naming what to do (rendered by strictq.cli.run_server, exit code 2),
found before a store is opened, a file written or a child started.

Why a lock: a second server on a live data dir would open the same store (moving its epoch under the
running server) and fight over the wire-log writers before failing on the port. Why the ports first:
a port found busy by the proxy child comes as mitmproxy's advice about `--mode regular@PORT`, after the
gateway already printed `listening on`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from queue_core.startup import prepare_data_dir
from wirelog.files import PRIVATE_FILE, StartupError

LOCK_FILE = ".strictq.lock"  # in the data dir: "<pid> <command>", flock'ed while the server runs


class StartupLine(StartupError):
    """A start-up fault whose whole message is one sentence (not `<path>: <problem>; <action>`)."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(path, message, "")
        self.message = message

    def __str__(self) -> str:
        return self.message


@contextlib.contextmanager
def data_dir_lock(data_dir: Path, command: str) -> Iterator[None]:
    """Hold `<data-dir>/.strictq.lock` (flock, exclusive) for the block: the first thing a server does.
    Another server on the same data dir is refused with one line naming its pid, before it reads or
    writes anything else there. The lock goes with the process (even on SIGKILL); the file stays."""
    path = data_dir / LOCK_FILE
    try:  # an existing data dir: nothing in it is touched before the lock is held
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    except OSError:
        prepare_data_dir(data_dir)  # created 0700 if missing; one that cannot be written is named
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
        except OSError as exc:
            raise StartupError(
                path, f"cannot open the lock file ({exc.strerror or exc})", "make the data dir writable"
            ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StartupError(
                    path, f"cannot lock it ({exc.strerror or exc})", "check the file system"
                ) from None
            raise _busy(data_dir, fd) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _busy(data_dir: Path, fd: int) -> StartupLine:
    """The holder as its lock file names it (its pid and command; both may still be unwritten)."""
    try:
        pid, _, holder = os.pread(fd, 200, 0).decode(errors="replace").strip().partition(" ")
    except OSError:
        pid, holder = "", ""
    holder = holder if holder in ("serve", "queue-server") else "server"
    who = f" (pid {pid})" if pid.isdigit() else ""
    return StartupLine(
        data_dir,
        f"a strictq {holder} is already running on {data_dir}{who}; stop it first, or give another "
        "--data-dir",
    )


@dataclass(frozen=True, slots=True)
class Port:
    """One port a server will listen on: `label` says whose it is ("the gateway's --port"), `flag` what
    changes it, `make` the Makefile variable that sets the flag for `make run`."""

    port: int
    label: str
    flag: str
    make: str = ""


def check_ports(host: str, ports: Sequence[Port]) -> None:
    """Every non-zero port must be free on `host` (bound once, with SO_REUSEADDR as the servers do, and
    released): otherwise one line naming the port and its flag. Two uses of one port are named too."""
    seen: dict[int, Port] = {}
    for port in ports:
        if not port.port:
            continue
        if not 0 < port.port <= 65535:
            raise StartupLine(
                host, f"{port.label} would be {port.port}: not a port (1-65535); give another {port.flag}"
            )
        if port.port in seen:
            other = seen[port.port]
            raise StartupLine(
                host, f"{other.label} and {port.label} are both port {port.port}: give another {port.flag}"
            )
        seen[port.port] = port
        _probe(host, port)


def _probe(host: str, port: Port) -> None:
    address = f"[{host}]:{port.port}" if ":" in host else f"{host}:{port.port}"
    hint = f" (make run {port.make}=...)" if port.make else ""
    try:
        infos = socket.getaddrinfo(host, port.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupLine(host, f"--host {host}: not an address of this host ({exc.strerror})") from None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(
                    address,
                    f"cannot listen: port {port.port} is in use ({port.label})",
                    f"stop what listens there, or give another {port.flag}{hint}",
                ) from None
            raise StartupError(
                address,
                f"cannot listen ({port.label}: {exc.strerror or exc})",
                f"give another --host or {port.flag}",
            ) from None
