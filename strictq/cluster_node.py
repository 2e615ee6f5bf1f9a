"""`strictq queue-server --cluster NATS --node NAME`: one queue server of a cluster (cluster.node).

Start-up contract, as for a single queue server: `strictq: listening on <url>` once the internal API
accepts connections (every call but /healthz and /readyz carrying the cluster's internal secret:
queue_core.internal_auth), then `strictq: node <name> pid <pid> <url>`; stops cleanly on SIGTERM (its
heartbeat then expires and the master gives its partitions to a standby).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry

from access.keys import KeyRing, write_development_keys
from cluster.connect import NatsSettings, connect
from cluster.layout import LayoutError, ensure_layout
from cluster.node import ClusterNode
from queue_core.admin_http import UNTENANTED
from queue_core.http_guard import DEFAULT_LIMITS, ConnectionLimits, GuardedSite
from queue_core.internal_auth import ENV, FILE_NAME, FLAG, InternalSecret
from queue_core.machine.health import HealthSettings
from queue_core.metrics_export import CoreCollector
from queue_core.metrics_http import Collector, add_metrics_route
from queue_core.server import make_app
from queue_core.startup import listen_fault, load_keys, prepare_data_dir
from strictq.queue_server import internal_tls
from strictq.startup_guard import Port, StartupLine, check_ports, data_dir_lock
from wirelog import logsafe

log = logging.getLogger("strictq.cluster")


@dataclass(frozen=True, slots=True)
class NodeOptions:
    host: str
    port: int
    data_dir: Path
    name: str
    nats: NatsSettings
    core_partitions: int
    cluster_partitions: int  # used only when this node creates the cluster's layout
    replicas: int
    limits: ConnectionLimits = DEFAULT_LIMITS
    advertise: str | None = None  # the URL gateways reach this node at (default: the bound address)
    region: str = ""
    zone: str = ""
    keys: Path | None = None  # the key file /metrics authenticates with (default: <data-dir>/keys.toml)
    health: HealthSettings | None = None  # failure management's gates and decider (None: --no-health)
    # The cluster's internal secret (--internal-secret / STRICTQ_INTERNAL_SECRET_FILE): one file for every
    # node and edge; required (a node's own would not be its edges').
    secret_file: Path | None = None
    tls: tuple[Path, Path] | None = None  # --tls-cert/--tls-key: the internal API over TLS (https:// URL)


def node_secret(options: NodeOptions) -> InternalSecret:
    """The cluster's internal secret; a node given none refuses to start, naming the flag and the file
    `strictq cluster up` writes (each node making its own would leave the edges unable to call any)."""
    if options.secret_file is None:
        raise StartupLine(
            options.data_dir,
            f"a cluster node needs the cluster's internal secret: give {FLAG} FILE or set {ENV} (the same "
            f"file for every node and edge; `strictq cluster up` writes DIR/{FILE_NAME}; docs/cluster.md)",
        )
    return InternalSecret.load(options.secret_file)


async def serve_node(options: NodeOptions) -> None:
    prepare_data_dir(options.data_dir)
    secret = node_secret(options)
    context = internal_tls(options.tls)
    try:
        nc = await connect(options.nats.urls, options.nats.user, options.nats.password, name=options.name)
    except Exception as exc:
        raise StartupLine(
            options.data_dir, f"cannot reach the NATS servers {', '.join(options.nats.urls)}: {exc}"
        ) from None
    try:
        try:
            layout = await ensure_layout(
                nc.jetstream(),
                options.cluster_partitions,
                options.replicas,
                cluster_id=options.nats.cluster_id,
            )
        except LayoutError as exc:
            raise StartupLine(options.data_dir, str(exc)) from None
        node = ClusterNode(
            options.name,
            options.data_dir,
            nc,
            layout,
            core_partitions=options.core_partitions,
            region=options.region,
            zone=options.zone,
            health=options.health,
        )
        app = make_app(None, source=node.service_for, ready=node.is_ready, secret=secret)
        add_node_metrics(app, node, node_keys(options))
        runner = web.AppRunner(app, access_log=None, handle_signals=False, **options.limits.handler_args())
        await runner.setup()
        site = GuardedSite(
            runner, options.host, options.port, limits=options.limits, ssl_context=context, reuse_address=True
        )
        try:
            await site.start()
        except OSError as exc:
            raise listen_fault(options.host, options.port, exc) from None
        host, port = runner.addresses[0][:2]
        scheme = "https" if context is not None else "http"
        node.url = options.advertise or f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await node.start()
        except LayoutError as exc:
            await runner.cleanup()
            raise StartupLine(options.data_dir, str(exc)) from None
        print(f"strictq: listening on {node.url}", flush=True)
        print(f"strictq: node {options.name} pid {os.getpid()} {node.url}", flush=True)
        try:
            await stop.wait()
        finally:
            print("strictq: stopping", file=sys.stderr, flush=True)
            await node.close()
            await runner.cleanup()
    finally:
        await nc.close()


def node_keys(options: NodeOptions) -> KeyRing:
    """--keys, or <data-dir>/keys.toml (written with development credentials when missing, as a single
    queue server does); `cluster up` gives every node its gateway's key file."""
    path = options.keys or options.data_dir / "keys.toml"
    if options.keys is not None or path.exists():
        return load_keys(path)
    return write_development_keys(path)


def add_node_metrics(app: web.Application, node: ClusterNode, keys: KeyRing) -> None:
    """GET /metrics of the node: the figures of the partitions it serves (per queue, and per partition),
    scoped per key as on a single queue server (its queues of no tenant: every admin's), on the internal
    API's app, so whatever authenticates that app's routes authenticates it too."""

    async def read() -> Collector:
        return CoreCollector(await node.figures(), None, keys)

    app[UNTENANTED] = True
    add_metrics_route(app, CollectorRegistry(), keys, [read])


def run_node(options: NodeOptions) -> None:
    logsafe.install()
    with data_dir_lock(options.data_dir, "queue-server"):
        check_ports(options.host, [Port(options.port, "the internal API's --port", "--port")])
        uvloop.run(serve_node(options))
