"""Processes the benchmark starts and always stops: the queue server and a Redis peer."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .procstat import rss_bytes

LISTENING = "strictq: listening on "
RESTORED = re.compile(r"restored in ([0-9.]+)s")


def export_internal_secret(work_dir: Path) -> Path:
    """One internal secret (queue_core.internal_auth) for the benchmark's run, in
    STRICTQ_INTERNAL_SECRET_FILE before any server starts: every queue server takes it from there, every
    client of the internal API sends it (`internal_headers`)."""
    from queue_core.internal_auth import ENV, InternalSecret

    path = work_dir / "internal.secret"
    InternalSecret.ensure(path)
    os.environ[ENV] = str(path)
    return path


def internal_headers() -> dict[str, str]:
    """`X-Strictq-Internal` with the run's secret (none exported: no header)."""
    from queue_core.internal_auth import load_secret

    secret = load_secret(None)
    return {} if secret is None else secret.headers


def strictq_command() -> list[str]:
    """The installed `strictq` script next to this interpreter (what `make run` uses)."""
    script = Path(sys.executable).parent / "strictq"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from strictq.cli import main; sys.exit(main())"]


class QueueServer:
    """`strictq queue-server --port 0` on loopback; start() returns once it printed its URL."""

    SUBCOMMAND = "queue-server"
    READY = LISTENING  # start() returns once a line starting with this was printed

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        profile_to: Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.log_path = log_path
        self.profile_to = profile_to
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.startup_seconds = 0.0  # process start -> the `listening` line
        self._lines: list[str] = []
        self._listening = threading.Event()
        self._log_file = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> QueueServer:
        command = [
            *strictq_command(),
            *self.SUBCOMMAND.split(),  # e.g. "cluster up"
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            str(self.data_dir),
            *self.extra_args,
        ]
        if self.profile_to is not None:
            # pyinstrument runs the same script; it samples the main thread (the event loop) only.
            command = [
                sys.executable,
                "-m",
                "pyinstrument",
                "--outfile",  # the renderer follows the extension (.pyisession: re-render later)
                str(self.profile_to),
                *command,
            ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("w")
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            bufsize=1,
            start_new_session=True,  # a Ctrl-C of the benchmark does not hit the server mid-measurement
        )
        threading.Thread(target=self._read_stdout, args=(started,), daemon=True).start()
        if not self._listening.wait(timeout):
            self.stop()
            raise RuntimeError(f"queue server did not start within {timeout}s; see {self.log_path}")
        if not self.url:
            self.stop()
            raise RuntimeError(f"queue server exited during start-up; see {self.log_path}")
        return self

    def _read_stdout(self, started: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(LISTENING) and not self.url:
                self.startup_seconds = time.perf_counter() - started
                self.url = line[len(LISTENING) :].strip()
            self._lines.append(line)
            if line.startswith(self.READY) and self.url:
                self._listening.set()
        self._listening.set()  # EOF: exited (start() notices the missing URL)

    def restored_seconds(self) -> float | None:
        """The server's own figure: `store open: ... restored in X s` (logged before it listens)."""
        match = RESTORED.search(self.log_path.read_text())
        return float(match.group(1)) if match else None

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the server commits what is queued and exits), SIGKILL if it hangs."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return proc.returncode


class GatewayServer(QueueServer):
    """`strictq serve --port 0`: the HTTPS gateway (SQS and EmoDB faces) with the queue core in-process.

    start() returns once it printed its `client env` line; then `ca` (the CA to trust), `keys` (the
    development key file it wrote) and the credentials read from it are known.
    """

    SUBCOMMAND = "serve"
    READY = "strictq: client env "

    def printed(self, prefix: str) -> str:
        """The rest of the first stdout line starting with `strictq: <prefix> `."""
        head = f"strictq: {prefix} "
        return next((line[len(head) :].strip() for line in self._lines if line.startswith(head)), "")

    @property
    def ca(self) -> str:
        return self.printed("ca")

    def credentials(self) -> dict[str, dict[str, str]]:
        """id -> {"secret", "role", "tenant"} from the key file the gateway wrote."""
        import tomllib

        data = tomllib.loads(Path(self.printed("keys")).read_text())
        return {
            c["id"]: {"secret": c["secret"], "role": c["role"], "tenant": c["tenant"]}
            for c in data.get("credential", [])
        }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Our own `redis-server` on a free loopback port, AOF with fsync on every write, in a temp dir."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""

    @staticmethod
    def binary() -> str | None:
        return shutil.which("redis-server")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> RedisServer:
        binary = self.binary()
        if binary is None:
            raise RuntimeError("redis-server not found: apt-get update && apt-get install -y redis-server")
        self.version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = (self.work_dir / "redis.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.work_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
                "--logfile",
                "",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.work_dir / 'redis.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer PING")

    def stop(self, timeout: float = 30.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
