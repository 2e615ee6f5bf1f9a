"""The three topologies a user can run, each started as a user starts it, behind one `Edge` handle.

- `inprocess`: `strictq serve` (the queue core in the gateway's process);
- `remote`: `strictq queue-server` plus `strictq serve --queue-server URL`;
- `cluster`: `strictq cluster up` (three JetStream servers, three queue servers R3, a gateway).

A conformance test takes the module-scoped `edge` fixture of tests/test_conformance.py, parametrized over
these, and talks to `edge.url` over TLS with real clients (boto3, aiohttp, the CLI) only: a feature passes
when it behaves alike in all three. Each starter stops everything it started, however the block ends.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_support import sqs_at, start_cluster
from conftest import start_server
from kit.process import ROOT, ChildProcess, launch, strictq

from access.keys import Credential, KeyRing

TOPOLOGIES = ("inprocess", "remote", "cluster")
CLIENT_ENV = "strictq: client env "
CLI_TIMEOUT = 60.0


@dataclass
class Edge:
    """A running topology as its clients see it: the gateway's URL, CA, key file and client env."""

    kind: str
    url: str
    ca: str
    keys_path: Path
    env_path: Path
    data_dir: Path
    processes: list[ChildProcess] = field(default_factory=list)

    @property
    def keys(self) -> KeyRing:
        return KeyRing.load(self.keys_path)

    def credential(self, role: str, index: int = 0) -> Credential:
        """The `index`-th credential of `role` in the gateway's key file."""
        return [c for c in self.keys.credentials if c.role == role][index]

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)

    def headers(self, role: str = "admin", index: int = 0) -> dict[str, str]:
        return {"X-BV-API-Key": self.credential(role, index).secret}

    def sqs(self, role: str = "producer") -> Any:
        return sqs_at(self.url, self.ca, self.credential(role))

    def client_env(self) -> dict[str, str]:
        """The variables of the client env file `strictq serve` wrote (what a user sources)."""
        found = {}
        for line in self.env_path.read_text().splitlines():
            if line and not line.startswith("#") and "=" in line:
                name, _, value = line.partition("=")
                found[name] = value
        return found

    def cli(self, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """`strictq ARGS` as a user runs it after sourcing the client env."""
        env = {**os.environ, **self.client_env()}
        env.pop("STRICTQ_QUEUE_URL", None)
        return subprocess.run(
            strictq(*args),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


def _serve(data_dir: Path, *extra: str) -> ChildProcess:
    argv = strictq(
        "serve", "--host", "127.0.0.1", "--port", "0", "--no-proxy", "--data-dir", str(data_dir), *extra
    )  # fmt: skip
    return launch(argv, data_dir.parent / f"{data_dir.name}.serve.log", wait_for=(CLIENT_ENV,))


def _edge_of(kind: str, gateway: ChildProcess, data_dir: Path, processes: list[ChildProcess]) -> Edge:
    return Edge(
        kind=kind,
        url=gateway.value("strictq: listening on ") or "",
        ca=gateway.value("strictq: ca ") or "",
        keys_path=Path(gateway.value("strictq: keys ") or ""),
        env_path=Path(gateway.value(CLIENT_ENV) or ""),
        data_dir=data_dir,
        processes=processes,
    )


@contextlib.contextmanager
def running_edge(kind: str, base: Path) -> Iterator[Edge]:
    """Topology `kind` started in `base` for the block; every process it started stopped at the end."""
    processes: list[ChildProcess] = []
    try:
        if kind == "inprocess":
            gateway = _serve(base / "serve")
            processes.append(gateway)
            yield _edge_of(kind, gateway, base / "serve", processes)
        elif kind == "remote":
            server = start_server(base / "queue-server")
            processes.append(server)
            gateway = _serve(base / "edge", "--queue-server", server.url)
            processes.append(gateway)
            yield _edge_of(kind, gateway, base / "edge", processes)
        elif kind == "cluster":
            cluster = start_cluster(base / "cluster")
            processes.append(cluster.process)
            gateway_dir = base / "cluster" / "gateway"
            edge = _edge_of(kind, cluster.process, gateway_dir, processes)
            edge.env_path = Path(cluster.process.value(CLIENT_ENV) or gateway_dir / "client.env")
            yield edge
        else:
            raise ValueError(f"no topology {kind!r} (one of {', '.join(TOPOLOGIES)})")
    finally:
        for process in reversed(processes):
            process.stop()
