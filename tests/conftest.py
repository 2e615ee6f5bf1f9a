"""Shared fixtures for the integration tests: the real `strictq queue-server` process on a free port."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kit.process import LISTENING, ROOT, ChildProcess, launch, strictq

from queue_core.client import QueueClient

__all__ = ["LISTENING", "ROOT", "ChildProcess", "ServerProcess", "running_server", "start_server"]

# The suite's Spark jobs are many and tiny: a JVM that only JIT-compiles with C1 and collects with the
# serial collector starts and finishes them ~20% sooner (the killed-index test: 22 s -> 18 s). Every
# Spark driver the tests start, in process or as `strictq index`, reads it (spark/session.py).
os.environ.setdefault("STRICTQ_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def _internal_secret_for_the_run() -> Path:
    """One internal secret (queue_core.internal_auth) for the whole run, 0600 in a 0700 directory, in
    STRICTQ_INTERNAL_SECRET_FILE before anything starts: every queue server, cluster node and gateway the
    tests start, and every QueueClient, takes it from there (tests/test_internal_auth.py checks the
    refusals without it). Removed when the run ends."""
    import atexit
    import secrets
    import shutil
    import tempfile

    from wirelog.files import write_private

    directory = Path(tempfile.mkdtemp(prefix="strictq-test-secret-"))
    path = write_private(directory / "internal.secret", secrets.token_urlsafe(32) + "\n")
    atexit.register(shutil.rmtree, directory, True)
    return path


INTERNAL_SECRET_FILE = _internal_secret_for_the_run()
os.environ["STRICTQ_INTERNAL_SECRET_FILE"] = str(INTERNAL_SECRET_FILE)


class ServerProcess(ChildProcess):
    """One `strictq queue-server` process."""

    data_dir: Path
    url: str


def start_server(data_dir: Path, *extra_args: str) -> ServerProcess:
    """Start the server on 127.0.0.1, port 0, and wait (bounded) for its 'listening on' line."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = strictq("queue-server", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir))
    log_path = data_dir.parent / f"{data_dir.name}.server.log"
    server = launch([*argv, *extra_args], log_path, make=ServerProcess)
    server.data_dir = data_dir
    server.url = server.startup[LISTENING]
    assert server.url.startswith("http://127.0.0.1:"), server.url
    return server


@contextlib.contextmanager
def running_server(data_dir: Path) -> Iterator[ServerProcess]:
    """A server for the duration of a block: SIGTERM at the end, SIGKILL if it will not stop."""
    proc = start_server(data_dir)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def running_servers(root: Path, count: int) -> Iterator[list[ServerProcess]]:
    """`count` queue servers (`root/node<n>`), one per partition as a cluster's owners would be; every one
    started is stopped at the end, also when a later one fails to start."""
    started: list[ServerProcess] = []
    try:
        for n in range(count):
            started.append(start_server(root / f"node{n}"))
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "data") as proc:
        yield proc


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[QueueClient]:
    async with QueueClient(server.url, timeout=30.0) as c:
        yield c


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`): every test on the session-wide SparkSession runs on one
    worker (one JVM for the run, not one per worker), and the tests of a module sharing a module-scoped
    fixture (a proxy, a `strictq serve`, a recording) run on one worker, so it is set up once."""
    loadgroup = bool(getattr(config.option, "loadgroup", False))  # set on xdist workers only
    for item in items:
        marked = item.get_closest_marker("xdist_group")
        if marked is not None and marked.args:
            group = str(marked.args[0])  # a test's own @pytest.mark.xdist_group("name")
        elif "spark" in getattr(item, "fixturenames", ()):
            group = "spark"
        else:
            info = getattr(item, "_fixtureinfo", None)
            definitions = info.name2fixturedefs.values() if info is not None else ()
            if not any(d[-1].scope == "module" for d in definitions if d):
                continue
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
        if loadgroup:
            _join_group(item, group)
    if loadgroup:
        # Longest first: xdist hands out groups by size, then single tests in this order. The `crash`
        # tests (SIGKILL loops, real Spark processes, 20 s and more each) start at once beside the groups
        # instead of last on one worker while the other has nothing left to do.
        items.sort(key=lambda item: item.get_closest_marker("crash") is None)


def _join_group(item: pytest.Item, group: str) -> None:
    """Put `@group` on the node id, which is what xdist's loadgroup scheduler reads. xdist 3.8 does it by
    setting `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`), so without this every
    test was scheduled alone: two JVMs, module fixtures set up on both workers."""
    if "@" in item.nodeid:
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


# The in-process gateway fixture (real TLS with a trustme CA) for the gateway faces' tests.
from gateway_support import gateway  # noqa: E402, F401
from health_support import health  # noqa: E402, F401  (failure management on: tests/test_failure_management.py)
from spark_support import spark, spark_sample  # noqa: E402, F401  (one session-wide SparkSession)
