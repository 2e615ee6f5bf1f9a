"""Real JetStream servers for the cluster tests: started in the test's tmp dir on free loopback ports
(cluster.nats_servers picks them, so pytest-xdist workers never collide), stopped even when a test fails.

Import the fixtures a module uses by name (`from cluster_support import nats3`; pytest finds them there):
- `nats3`: a module-scoped 3-server cluster (one set-up for the module's tests, which conftest keeps on
  one xdist worker). A test that kills or stops a server puts it back with `heal(nats3)` in a `finally`.
- `nats1`: a function-scoped single server (R1 streams).
- `running_nats(dir, count)`: the same as a context manager, for a test that needs its own cluster.
- `nats_client(cluster, name)`: an async context manager giving a connected nats-py client.

And for a whole cluster as users start it (tests/test_cluster_cli.py, tests/test_cluster_failover.py):
- `start_cluster(data_dir)`: `strictq cluster up` (3 JetStream servers, 3 queue servers, a gateway), parsed
  into a `Cluster` (its start-up lines, nodes, gateway URL, CA and keys); `sqs_client(cluster, role)`;
- `run(*args)` runs the CLI, `status(cluster)` is `strictq cluster status --json`, `settled(data)`;
- `alive(pid)` (a zombie is not alive), `nats_pids(data_dir)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from kit.process import ROOT, ChildProcess, launch, strictq
from nats.aio.client import Client
from nats.js.api import PubAck
from nats.js.client import JetStreamContext

from access.keys import Credential, KeyRing
from cluster.connect import connect
from cluster.nats_servers import NatsCluster

READY = "strictq: cluster ready"
UP_TIMEOUT = 120.0  # JetStream, three queue servers, rebalancing and the gateway on a busy 2-core machine
CLI_TIMEOUT = 60.0


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


# ------------------------------------------------------------------------- `strictq cluster up`
class Cluster:
    """A running `strictq cluster up`: its process and what its start-up lines say."""

    def __init__(self, process: ChildProcess, data_dir: Path) -> None:
        self.process = process
        self.data_dir = data_dir
        self.lines = process.lines

    def values(self, prefix: str) -> list[str]:
        return [line[len(prefix) :] for line in self.lines if line.startswith(prefix)]

    @property
    def nodes(self) -> dict[str, tuple[int, str]]:
        """name -> (pid, url), from the `strictq: node` lines."""
        found = {}
        for value in self.values("strictq: node "):
            name, _, pid, url = value.split()
            found[name] = (int(pid), url)
        return found

    @property
    def url(self) -> str:
        return self.process.value("strictq: listening on ") or ""

    @property
    def ca(self) -> str:
        return self.process.value("strictq: ca ") or ""

    def credential(self, role: str) -> Credential:
        """The first credential of `role` in the gateway's key file."""
        keys = KeyRing.load(Path(self.process.value("strictq: keys ") or ""))
        return next(c for c in keys.credentials if c.role == role)


def start_cluster(data_dir: Path, *extra: str) -> Cluster:
    """`strictq cluster up --nodes 3 --replicas 3 --port 0 --no-proxy` in `data_dir`, until `cluster ready`
    (its stderr goes to `<data_dir>.log`). Stop it with `cluster.process.stop()`."""
    argv = strictq(
        "cluster", "up", "--nodes", "3", "--replicas", "3", "--port", "0", "--no-proxy",
        "--data-dir", str(data_dir), *extra,
    )  # fmt: skip
    log = data_dir.parent / f"{data_dir.name}-cluster-up.log"
    process: ChildProcess = launch(argv, log, wait_for=(READY,), timeout=UP_TIMEOUT)
    return Cluster(process, data_dir)


def sqs_client(cluster: Cluster, role: str = "admin", *, attempts: int = 5, read_timeout: float = 30) -> Any:
    """boto3's SQS client on the cluster's gateway with the first credential of `role`; `attempts`: boto's
    own tries per call (1: every failure is the caller's to see)."""
    credential = cluster.credential(role)
    return sqs_at(cluster.url, cluster.ca, credential, attempts=attempts, read_timeout=read_timeout)


def sqs_at(url: str, ca: str, credential: Credential, *, attempts: int = 5, read_timeout: float = 30) -> Any:
    """boto3's SQS client on the gateway at `url` (trusting `ca`), signing as `credential`."""
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=credential.id,
        aws_secret_access_key=credential.secret,
        verify=ca,
        config=Config(
            retries={"mode": "standard", "max_attempts": attempts},
            connect_timeout=5,
            read_timeout=read_timeout,
        ),
    )


def run(*args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        strictq(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def status(cluster: Cluster) -> dict[str, Any]:
    """`strictq cluster status --json` of the cluster."""
    data = status_or_none(cluster)
    assert data is not None, "strictq cluster status: JetStream cannot answer now"
    return data


def status_or_none(cluster: Cluster) -> dict[str, Any] | None:
    """`status`, or None when the command says JetStream cannot answer now (one line, exit 1)."""
    done = run("cluster", "status", "--json", "--data-dir", str(cluster.data_dir))
    if done.returncode == 1 and "Traceback" not in done.stderr:
        return None
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def settled(data: dict[str, Any]) -> bool:
    """Every partition served by its owner and no move pending (a `status` answer)."""
    return all(p["serving"] and p["moving_to"] is None for p in data["partitions"])


def nats_pids(data_dir: Path) -> list[int]:
    """The pids the JetStream servers of `cluster up` in `data_dir` wrote (the last start of each)."""
    return [int(path.read_text()) for path in sorted((data_dir / "nats").glob("n*/server.pid"))]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its parent has not reaped it yet
