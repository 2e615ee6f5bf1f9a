"""Shared fixtures for the integration tests: the real `strictq queue-server` process on a free port."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from queue_core.client import QueueClient

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
LISTENING = "strictq: listening on "


class ChildProcess:
    """A server process a test started: stdout drained by a thread, stderr in a log file, stopped by
    SIGTERM (SIGKILL if it will not stop) or killed as a crash."""

    LOG_TAIL = 4000  # characters of the log a failing test shows
    STOP_TIMEOUT = STOP_TIMEOUT

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path
        self.stdout: queue.SimpleQueue[str | None] = queue.SimpleQueue()
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
        try:
            return self.log_path.read_text(errors="replace")[-self.LOG_TAIL :]
        except OSError:
            return ""

    def kill(self) -> int:
        """SIGKILL, as a crash: nothing gets to flush or close."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=self.STOP_TIMEOUT)

    def terminate(self, timeout: float | None = None) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=self.STOP_TIMEOUT if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(timeout=self.STOP_TIMEOUT)
                raise
        return self.proc.returncode


class ServerProcess(ChildProcess):
    """One `strictq queue-server` process."""

    def __init__(self, data_dir: Path, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        super().__init__(proc, log_path)
        self.data_dir = data_dir
        self.url = ""


def start_server(data_dir: Path, *extra_args: str) -> ServerProcess:
    """Start the server on 127.0.0.1, port 0, and wait (at most 10 s) for its 'listening on' line."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"{data_dir.name}.server.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "strictq", "queue-server"),
                *("--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir)),
                *extra_args,
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    server = ServerProcess(data_dir, proc, log_path)
    try:
        line = server.stdout.get(timeout=START_TIMEOUT)
    except queue.Empty:
        line = None
    if line is None or not line.startswith(LISTENING):
        server.kill()
        raise RuntimeError(f"server did not start (first line {line!r}); log:\n{server.log()}")
    server.url = line[len(LISTENING) :].strip()
    assert server.url.startswith("http://127.0.0.1:"), server.url
    return server


@contextlib.contextmanager
def running_server(data_dir: Path) -> Iterator[ServerProcess]:
    """A server for the duration of a block: SIGTERM at the end, SIGKILL if it will not stop."""
    proc = start_server(data_dir)
    try:
        yield proc
    finally:
        try:
            proc.terminate()
        finally:
            if proc.running():
                proc.kill()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "data") as proc:
        yield proc


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[QueueClient]:
    async with QueueClient(server.url, timeout=30.0) as c:
        yield c


# The in-process gateway fixture (real TLS with a trustme CA) for the gateway faces' tests.
from gateway_support import gateway  # noqa: E402, F401
from health_support import health  # noqa: E402, F401  (failure management on: tests/test_failure_management.py)
from spark_support import spark, spark_sample  # noqa: E402, F401  (one session-wide SparkSession)
