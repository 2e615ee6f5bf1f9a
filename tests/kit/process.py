"""The one launcher of the start-up contract every strictq process keeps: it prints
`strictq: listening on <url>` on stdout once it accepts connections, then further `strictq: <what> <value>`
lines (`ca`, `keys`, `proxy ca`, `admin on`, `client env`, ...), and logs to stderr.

`launch` starts a command, drains stdout on a thread, sends stderr to a log file, waits (bounded) for the
start-up lines asked for, and on failure kills the process and raises with the lines seen and the log's
tail. `ChildProcess` stops it with SIGTERM (SIGKILL if it will not stop) or kills it as a crash.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
START_TIMEOUT = 30.0  # importing mitmproxy or pyspark takes seconds on a busy 2-core machine
STOP_TIMEOUT = 10.0
LISTENING = "strictq: listening on "
CA = "strictq: ca "
KEYS = "strictq: keys "
PROXY_CA = "strictq: proxy ca "
ADMIN = "strictq: admin on "
CLIENT_ENV = "strictq: client env "


class ChildProcess:
    """A process a test started: stdout drained by a thread, stderr in a log file, stopped by SIGTERM
    (SIGKILL if it will not stop) or killed as a crash. `lines`: stdout read during start-up;
    `startup[prefix]`: the value after each start-up line's prefix."""

    LOG_TAIL = 4000  # characters of the log a failing test shows
    STOP_TIMEOUT = STOP_TIMEOUT

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.stdout: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.lines: list[str] = []
        self.startup: dict[str, str] = {}
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.stdout.put(raw.decode(errors="replace").rstrip("\n"))
        self.stdout.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """The tail of the stderr log (what a failing test shows)."""
        return self.full_log()[-self.LOG_TAIL :]

    def full_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def value(self, prefix: str) -> str | None:
        """The value of the first start-up line starting with `prefix`, None if none was read."""
        return next((line[len(prefix) :].strip() for line in self.lines if line.startswith(prefix)), None)

    def read_startup(self, wait_for: Sequence[str], timeout: float = START_TIMEOUT) -> None:
        """Read stdout until a line starting with each prefix of `wait_for` has been seen (any order)."""
        missing = set(wait_for)
        deadline = time.monotonic() + timeout
        while missing:
            try:
                line = self.stdout.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.kill()
                command = " ".join(str(a) for a in self.proc.args[2:5])  # type: ignore[index]
                raise RuntimeError(
                    f"{command!r} did not start: no {sorted(missing)} within {timeout}s "
                    f"(stdout {self.lines!r}); log:\n{self.log()}"
                )
            self.lines.append(line)
            for prefix in list(missing):
                if line.startswith(prefix):
                    self.startup[prefix] = line[len(prefix) :].strip()
                    missing.discard(prefix)

    def kill(self) -> int:
        """SIGKILL, as a crash: nothing gets to flush or close."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=self.STOP_TIMEOUT)

    def terminate(self, timeout: float | None = None) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time (and raise). Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=self.STOP_TIMEOUT if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=self.STOP_TIMEOUT)
                raise
        return self.proc.returncode

    def stop(self) -> None:
        """terminate(); a process that will not stop is killed all the same."""
        try:
            self.terminate()
        finally:
            if self.running():
                self.kill()


def strictq(*args: str) -> list[str]:
    """argv of `python -m strictq <args>` with this interpreter."""
    return [sys.executable, "-m", "strictq", *args]


def launch[C: ChildProcess](
    argv: Sequence[str],
    log_path: Path,
    *,
    wait_for: Sequence[str] = (LISTENING,),
    timeout: float = START_TIMEOUT,
    env: Mapping[str, str] | None = None,
    umask: int = -1,
    make: Callable[[subprocess.Popen[bytes], Path], C] = ChildProcess,  # type: ignore[assignment]
) -> C:
    """Start `argv` (cwd: the repository), stderr appended to `log_path`, and wait for the start-up lines
    in `wait_for` (none: return at once). `make` builds the handle (a ChildProcess subclass)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            umask=umask,
        )
    child = make(proc, log_path)
    if wait_for:
        child.read_startup(wait_for, timeout)
    return child


@contextlib.contextmanager
def running[C: ChildProcess](child: C) -> Iterator[C]:
    """A started process for the duration of a block: SIGTERM at the end, SIGKILL if it will not stop."""
    try:
        yield child
    finally:
        child.stop()
