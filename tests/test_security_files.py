"""Issue 11, items 4 and 7: files are created with their final modes, and start-up faults are one line.

Real processes (`strictq serve`, `strictq queue-server`) on loopback, real files. The "final mode at
creation" tests watch the process's own audit events (sys.addaudithook: every os.open, os.chmod and
os.fchmod) under a umask of 0, so a mode can only come from the os.open call that created the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, ChildProcess
from kit.process import launch

from access.keys import write_development_keys
from gateway.tls import ensure_local_certificates
from queue_core.fences import Fence, FenceRegistry
from queue_core.machine import SendRequest
from queue_core.service import QueueService
from queue_core.store import SqliteStore
from wirelog.files import check_modes, write_private
from wirelog.record import log_record
from wirelog.redaction import load_or_create_key
from wirelog.writer import WireLogWriter

START_TIMEOUT = 60.0
RUN_TIMEOUT = 60.0
STRICTQ = [sys.executable, "-m", "strictq"]


# ------------------------------------------------------------------------------- audit of file calls
_events: list[tuple[str, tuple[Any, ...]]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _events is not None and event in ("open", "os.chmod"):  # os.chmod covers fchmod and lchmod
        _events.append((event, args))


sys.addaudithook(_audit)


@contextlib.contextmanager
def file_calls() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """The os.open / chmod calls made inside the block, with the umask at 0 (nothing to hide behind)."""
    global _events
    events: list[tuple[str, tuple[Any, ...]]] = []
    old = os.umask(0)
    _events = events
    try:
        yield events
    finally:
        _events = None
        os.umask(old)


def chmods(events: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    return [args for event, args in events if event == "os.chmod"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------------------------ the helpers
def test_write_private_gives_the_final_mode_at_creation(tmp_path: Path) -> None:
    target = tmp_path / "secret.txt"
    with file_calls() as events:
        write_private(target, "s3cret\n")
    assert target.read_text() == "s3cret\n" and mode(target) == 0o600
    assert chmods(events) == []  # never chmod after writing: the mode came with O_CREAT
    creates = [args for event, args in events if event == "open" and args[2] & os.O_CREAT]
    assert len(creates) == 1
    path, _, flags = creates[0]
    assert flags & os.O_EXCL  # a fresh file: never an existing one with some other mode
    assert Path(path).parent == tmp_path and Path(path) != target  # written aside, renamed into place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt"]  # no temporary file left
    # Replacing a file an operator left 0644: the new one is 0600 (a new inode, not the old one's mode).
    target.chmod(0o644)
    write_private(target, "rotated\n")
    assert target.read_text() == "rotated\n" and mode(target) == 0o600


def test_the_secret_writers_never_chmod(tmp_path: Path) -> None:
    with file_calls() as events:
        write_development_keys(tmp_path / "data" / "keys.toml")
        tls = ensure_local_certificates(tmp_path / "data" / "tls")
        load_or_create_key(tmp_path / "data")
        registry = FenceRegistry(tmp_path / "data" / "fences.json")
        asyncio.run(registry.put(Fence("worker-1", "block", "test", 1.0)))
        store = SqliteStore(tmp_path / "data" / "queue" / "queue.sqlite3")
        store.open(1.0)
        store.close()
    assert chmods(events) == []
    data = tmp_path / "data"
    assert mode(data) == 0o700 and mode(data / "tls") == 0o700 and mode(data / "queue") == 0o700
    for secret in ("keys.toml", "tls/ca-key.pem", "tls/server-key.pem", "redaction.key", "fences.json"):
        assert mode(data / secret) == 0o600, secret
    assert tls.ca is not None and mode(tls.ca) == 0o644 and mode(tls.cert) == 0o644  # certificates: public
    store_files = sorted((data / "queue").iterdir())
    assert store_files[0].name == "queue.sqlite3"
    assert all(mode(p) == 0o600 for p in store_files), [(p.name, oct(mode(p))) for p in store_files]
    assert not [p for p in data.rglob("*") if p.name.endswith(".tmp")]


def test_wire_log_segments_are_0640_at_most(tmp_path: Path) -> None:
    with file_calls() as events:
        writer = WireLogWriter(tmp_path / "wirelog", "test", compress=True)
        writer.write(log_record(outcome="ok", reason="one line", message_id="m1"))
        writer.flush()
        open_segments = [p for p in (tmp_path / "wirelog").iterdir() if p.name.endswith(".open")]
        assert open_segments and all(mode(p) == 0o640 for p in open_segments)
        writer.close()  # rotates and compresses: the gzip output has the same mode
    assert chmods(events) == []
    segments = [p for p in (tmp_path / "wirelog").iterdir() if ".jsonl" in p.name]
    assert segments, list((tmp_path / "wirelog").iterdir())
    assert all(mode(p) & 0o027 == 0 for p in segments), [(p.name, oct(mode(p))) for p in segments]


def test_check_modes_names_each_loose_file_and_the_chmod(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "queue").mkdir(parents=True)
    (data / "tls").mkdir()
    (data / "wirelog").mkdir()
    data.chmod(0o755)
    loose = {
        "keys.toml": 0o644,
        "queue/queue.sqlite3": 0o644,
        "queue/queue.sqlite3-wal": 0o640,
        "tls/server-key.pem": 0o604,
        "wirelog/gateway.20261122T100000123456Z.000001.jsonl.gz": 0o644,
    }
    fine = {
        "client.env": 0o600,
        "tls/ca.pem": 0o644,
        "wirelog/gateway.20261122T100000123456Z.000002.jsonl": 0o640,
    }
    for name, file_mode in {**loose, **fine}.items():
        (data / name).write_bytes(b"x")
        (data / name).chmod(file_mode)
    warnings = check_modes(data)
    assert len(warnings) == 1 + len(loose), warnings
    assert any(str(data) in w and f"chmod 700 {data}" in w for w in warnings)
    for name in loose:
        wanted = "640" if name.startswith("wirelog/") else "600"
        path = data / name
        assert any(w.startswith(f"{path} ") and f"chmod {wanted} {path}" in w for w in warnings), name
    assert all("\n" not in w for w in warnings)
    data.chmod(0o700)
    for name in loose:
        (data / name).chmod(0o640 if name.startswith("wirelog/") else 0o600)
    assert check_modes(data) == []


# ------------------------------------------------------------------------------- the real processes
def start(argv: list[str], data_dir: Path, until: str, umask: int = 0o022) -> ChildProcess:
    """A server process; waits (bounded) for the stdout line starting with `until`."""
    log_path = data_dir.parent / f"{data_dir.name}.log"
    return launch(argv, log_path, wait_for=(until,), timeout=START_TIMEOUT, umask=umask)


def stop(child: ChildProcess) -> None:
    try:
        assert child.terminate() == 0
    finally:
        if child.running():
            child.kill()


def serve_argv(data_dir: Path, *extra: str) -> list[str]:
    return [*STRICTQ, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), *extra]


def queue_server_argv(data_dir: Path, *extra: str) -> list[str]:
    argv = [*STRICTQ, "queue-server", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir)]
    return [*argv, *extra]


def call(url: str, path: str, key: str, ca: Path, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="GET" if data is None else "POST")
    request.add_header("X-BV-API-Key", key)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, timeout=30, context=context) as answer:
        return json.loads(answer.read() or b"null")


def test_serve_writes_every_file_with_its_final_mode(tmp_path: Path) -> None:
    """A first start under umask 0 (nothing hides a loose mode): data dir 0700, store, -wal, -shm, keys,
    TLS keys, client.env, redaction key and the proxy CA's key 0600, wire-log segments at most 0640."""
    data = tmp_path / "data"
    server = start(serve_argv(data), data, "strictq: client env ", umask=0)
    try:
        url = server.lines[0].split()[-1]  # type: ignore[attr-defined]
        keys = tomllib.loads((data / "keys.toml").read_text())["credential"]
        secret = {c["role"]: c["secret"] for c in reversed(keys)}
        ca = data / "tls" / "ca.pem"
        call(url, "/queue/1/files-q/send", secret["producer"], ca, {"n": 1})
        polled = call(url, "/queue/1/files-q/poll?ttl=30&limit=1", secret["worker"], ca)
        assert len(polled) == 1  # a delivery record for the wire log
        for name in ("queue.sqlite3", "queue.sqlite3-wal", "queue.sqlite3-shm"):
            assert mode(data / "queue" / name) == 0o600, name
    finally:
        stop(server)
    assert mode(data) == 0o700
    for directory in ("queue", "tls", "proxy", "proxy/ca"):
        assert mode(data / directory) == 0o700, directory
    secrets = [
        "keys.toml",
        "client.env",
        "redaction.key",
        "tls/ca-key.pem",
        "tls/server-key.pem",
        "proxy/ca/mitmproxy-ca.pem",
        "queue/queue.sqlite3",
    ]
    for name in secrets:
        assert mode(data / name) == 0o600, name
    segments = [p for p in (data / "wirelog").iterdir() if ".jsonl" in p.name]
    assert segments, list((data / "wirelog").iterdir())
    assert all(mode(p) & 0o027 == 0 for p in segments), [(p.name, oct(mode(p))) for p in segments]
    assert mode(data / "wirelog") & 0o027 == 0
    assert check_modes(data) == []
    assert "WARNING strictq.startup" not in server.log()


def test_queue_server_files_and_the_warning_for_looser_ones(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start(queue_server_argv(data), data, "strictq: listening on ", umask=0)
    stop(server)
    assert mode(data) == 0o700
    for name in ("queue.sqlite3", "keys.toml", ".strictq-store"):
        assert mode(data / name) == 0o600, name
    assert "WARNING" not in server.log()
    # An earlier version left them readable: the server starts, and says what to run, one line each.
    data.chmod(0o755)
    (data / "queue.sqlite3").chmod(0o644)
    (data / "keys.toml").chmod(0o644)
    server = start(queue_server_argv(data), data, "strictq: listening on ")
    stop(server)
    warnings = [line for line in server.log().splitlines() if " WARNING " in line]
    for path, wanted in ((data, "700"), (data / "queue.sqlite3", "600"), (data / "keys.toml", "600")):
        assert any(f"{path} (" in w and f"chmod {wanted} {path}" in w for w in warnings), (path, warnings)


# ---------------------------------------------------------------------------------- start-up faults
def run_fault(argv: list[str], preexec: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(preexec or []), *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def assert_one_line_fault(
    result: subprocess.CompletedProcess[str], path: Path | str, *words: str, alone: bool = True
) -> str:
    """Exit code 2, nothing listening, no traceback, one line on stderr naming the file (`alone`: and
    nothing else there; else after the INFO lines of what did start)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "listening" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("strictq:")] == lines[-1:], lines
    if alone:
        assert len(lines) == 1, lines
    lines = lines[-1:]
    assert lines[0].startswith(f"strictq: {path}: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def private_data_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


def make_store(directory: Path, messages: int = 300) -> Path:
    """A real store with messages (the queue core in this process), closed; its files 0600."""

    async def fill() -> None:
        service = QueueService(directory)
        await service.start()
        await service.create_queue("q", {})
        body = b"x" * 3000
        await service.send("q", [SendRequest(body=body, group=f"g{i}") for i in range(messages)])
        await service.close()

    asyncio.run(fill())
    return directory / "queue.sqlite3"


def test_a_store_that_is_not_sqlite_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    store = data / "queue.sqlite3"
    store.write_bytes(os.urandom(8192))
    store.chmod(0o600)
    line = assert_one_line_fault(run_fault(queue_server_argv(data)), store, "not a readable SQLite store")
    assert "backup" in line and "--init" in line


def test_a_truncated_store_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    store = make_store(data)
    size = store.stat().st_size
    assert size > 100_000
    with open(store, "r+b") as handle:
        handle.truncate(size // 2)
    assert_one_line_fault(run_fault(queue_server_argv(data)), store, "not a readable SQLite store")


def _drop_root() -> list[str]:
    """Root ignores directory modes: run the server without the capabilities that let it (setpriv)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only directory cannot be made")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]


def test_a_read_only_data_dir_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    make_store(data, messages=3)
    data.chmod(0o500)
    try:
        result = run_fault(queue_server_argv(data), _drop_root())
    finally:
        data.chmod(0o700)
    assert_one_line_fault(result, data, "cannot write", "--data-dir")


def test_a_corrupt_fences_file_is_one_line(tmp_path: Path) -> None:
    for argv, store_dir in (
        (queue_server_argv, ""),
        (lambda d: serve_argv(d, "--no-proxy", "--insecure-http"), "queue"),
    ):
        data = private_data_dir(tmp_path / f"data-{len(list(tmp_path.iterdir()))}")
        make_store(private_data_dir(data / store_dir) if store_dir else data, messages=3)
        fences = data / "fences.json"
        fences.write_text('{"version": 1, "fences": [')
        assert_one_line_fault(run_fault(argv(data)), fences, "malformed", "remove it")


def test_a_corrupt_suspensions_file_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    make_store(data, messages=3)
    suspended = data / "suspended.json"
    suspended.write_text("not json")
    assert_one_line_fault(run_fault(queue_server_argv(data)), suspended, "not valid JSON")


def test_a_short_redaction_key_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    make_store(private_data_dir(data / "queue"), messages=3)
    key = data / "redaction.key"
    key.write_bytes(b"short")
    key.chmod(0o600)
    result = run_fault(serve_argv(data, "--no-proxy", "--insecure-http"))
    assert_one_line_fault(result, key, "32 bytes", "has 5")
    assert key.read_bytes() == b"short"  # refused, never replaced


def test_an_unusable_tls_key_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    tls = ensure_local_certificates(tmp_path / "tls")
    bad_key = tmp_path / "bad-key.pem"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    argv = serve_argv(data, "--no-proxy", "--tls-cert", str(tls.cert), "--tls-key", str(bad_key))
    assert_one_line_fault(run_fault(argv), bad_key, "cannot load the key")
    missing = tmp_path / "missing-key.pem"
    argv = serve_argv(data, "--no-proxy", "--tls-cert", str(tls.cert), "--tls-key", str(missing))
    assert_one_line_fault(run_fault(argv), missing, "cannot read it")


def test_a_broken_key_file_is_one_line_naming_it(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    keys = data / "keys.toml"
    keys.write_text('[[credential]]\nid = "x"\n')
    assert_one_line_fault(run_fault(queue_server_argv(data)), keys, "credential #1")


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [*STRICTQ, "queue-server", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data)]
        # found when binding, after the store opened (its INFO lines come first)
        assert_one_line_fault(run_fault(argv), f"127.0.0.1:{port}", "cannot listen", alone=False)


# ------------------------------------------------------------------------- an empty or missing store
def test_an_empty_store_is_refused_without_init_and_started_with_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = start(queue_server_argv(data), data, "strictq: listening on ")
    stop(server)
    store = data / "queue.sqlite3"
    store.write_bytes(b"")  # truncated to nothing: its messages are gone
    for leftover in ("queue.sqlite3-wal", "queue.sqlite3-shm"):
        (data / leftover).unlink(missing_ok=True)
    line = assert_one_line_fault(run_fault(queue_server_argv(data)), store, "empty", "--init")
    assert ".strictq-store" in line and "keys.toml" in line  # what shows the earlier run
    assert store.stat().st_size == 0  # nothing was created over it
    server = start(queue_server_argv(data, "--init"), data, "strictq: listening on ")
    stop(server)
    assert store.stat().st_size > 0 and mode(store) == 0o600
    assert "--init: starting with an empty store" in server.log()
    server = start(queue_server_argv(data), data, "strictq: listening on ")  # a store again: no --init
    stop(server)


def test_a_missing_store_of_serve_is_refused_without_init(tmp_path: Path) -> None:
    data = tmp_path / "data"
    argv = serve_argv(data, "--no-proxy", "--insecure-http")
    server = start(argv, data, "strictq: client env ")
    stop(server)
    shutil.rmtree(data / "queue")  # the store directory is gone; the marker, keys, ... are not
    store = data / "queue" / "queue.sqlite3"
    assert_one_line_fault(run_fault(argv), store, "missing", "--init")
    assert not store.exists()
    server = start([*argv, "--init"], data, "strictq: client env ")
    stop(server)
    assert mode(store) == 0o600


def test_a_new_data_dir_needs_no_init_and_an_empty_file_alone_is_a_new_store(tmp_path: Path) -> None:
    data = private_data_dir(tmp_path / "data")
    (data / "queue.sqlite3").write_bytes(b"")  # nothing else here: no earlier run to lose
    server = start(queue_server_argv(data), data, "strictq: listening on ")
    stop(server)
    assert (data / "queue.sqlite3").stat().st_size > 0


def test_init_is_documented() -> None:
    for command in ("serve", "queue-server"):
        result = run_fault([*STRICTQ, command, "--help"])
        assert result.returncode == 0 and "--init" in result.stdout and "empty store" in result.stdout
