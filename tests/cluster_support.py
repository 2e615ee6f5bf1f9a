"""Real JetStream servers for the cluster tests: started in the test's tmp dir on free loopback ports
(cluster.nats_servers picks them, so pytest-xdist workers never collide), stopped even when a test fails.

Import the fixtures a module uses by name (`from cluster_support import nats3`; pytest finds them there):
- `nats3`: a module-scoped 3-server cluster (one set-up for the module's tests, which conftest keeps on
  one xdist worker). A test that kills or stops a server puts it back with `heal(nats3)` in a `finally`.
- `nats1`: a function-scoped single server (R1 streams).
- `running_nats(dir, count)`: the same as a context manager, for a test that needs its own cluster.
- `nats_client(cluster, name)`: an async context manager giving a connected nats-py client.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.api import PubAck
from nats.js.client import JetStreamContext

from cluster.connect import connect
from cluster.nats_servers import NatsCluster


@contextlib.contextmanager
def running_nats(data_dir: Path, count: int = 1) -> Iterator[NatsCluster]:
    """`count` JetStream servers in `data_dir` for the block; every one stopped at the end, however it ends
    (a failed start stops what it started itself)."""
    cluster = NatsCluster(data_dir, count)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def nats3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with running_nats(tmp_path_factory.mktemp("nats3"), 3) as cluster:
        yield cluster


@pytest.fixture
def nats1(tmp_path: Path) -> Iterator[NatsCluster]:
    with running_nats(tmp_path / "nats1", 1) as cluster:
        yield cluster


def heal(cluster: NatsCluster) -> None:
    """Start every server of `cluster` that is not running (SIGCONT a stopped one) and wait until all are
    back in the JetStream meta group: the next test of the module gets a whole cluster."""
    for i in range(cluster.count):
        if cluster.pid(i) is not None:
            cluster.kill(i, signal.SIGCONT)  # harmless on a running one
    cluster.start(timeout=30.0)  # starts the missing ones; waits for health and the meta group


@contextlib.asynccontextmanager
async def nats_client(cluster: NatsCluster, name: str = "test") -> AsyncIterator[Client]:
    client = await connect(cluster.client_urls, *cluster.credentials, name=name)
    try:
        yield client
    finally:
        await client.close()


async def publish_acked(
    js: JetStreamContext, subject: str, payload: bytes, *, within: float = 15.0, msg_id: str | None = None
) -> PubAck:
    """Publish until JetStream acknowledges (bounded): across a server's death or a leader election a
    publish may time out or find no responders, and is retried (with `msg_id`, deduplicated)."""
    deadline = time.monotonic() + within
    headers = {"Nats-Msg-Id": msg_id} if msg_id is not None else None
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return await js.publish(subject, payload, timeout=1.0, headers=headers)
        except Exception as exc:  # nats' timeouts, no responders, not-leader errors: all transient here
            last = exc
            await asyncio.sleep(0.05)
    raise AssertionError(f"no acknowledgement for {subject} within {within}s (last error {last!r})")
