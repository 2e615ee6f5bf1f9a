"""`strictq serve`: the embedded default — the gateway with the queue core in-process, over HTTPS. The one
composition root of the edge: gateway (gateway.app), core (in-process or a `--queue-server`), search over the
wire-log index (spark.admin_endpoint) and the egress proxy child (fencing.child); none of those packages
imports another.

Follows the start-up contract of docs/contracts.md: prints `strictq: listening on <url>`, then
`strictq: ca <path>`, `strictq: keys <path>`, `strictq: proxy on <url>`, `strictq: proxy ca <path>`
and `strictq: client env <path>` once it accepts connections. The egress proxy runs as a child process
(`strictq proxy`, never on this loop: see fencing.child) following this process's control stream;
`--no-proxy` leaves it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import signal
import socket
import ssl
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from access.keys import Credential, KeyFileError, KeyRing, write_development_keys
from access.permissions import tenants_of
from cluster.connect import NatsSettings
from fencing.ca import serve_proxy_dir
from fencing.child import ProxyChild, ProxyStartError, start_proxy_child
from gateway.app import make_gateway_app
from gateway.client_region import Network, RegionResolver, client_region_middleware
from gateway.cluster_figures import ClusterSource
from gateway.deliveries import DeliveryLog
from gateway.rate_limits import TenantLimit, TenantRateLimiter
from gateway.sqs_receipts import ReceiptSigner
from gateway.tls import TlsFiles, ensure_local_certificates, server_context
from protocol import headers
from queue_core.admin_http import search_gate
from queue_core.backend import QueueBackend
from queue_core.control import ControlHub, store_registry
from queue_core.control_relay import RelayHub
from queue_core.failures import FailureManager
from queue_core.fleet import FleetBackend, FleetService
from queue_core.fleet_remote import RemoteFleet
from queue_core.health_view import HealthView, RemoteHealthView
from queue_core.http_guard import DEFAULT_LIMITS, ConnectionLimits, GuardedSite
from queue_core.internal_auth import FILE_NAME as SECRET_FILE_NAME
from queue_core.internal_auth import InternalSecret, missing_secret_line
from queue_core.machine.fleet import FleetSettings
from queue_core.machine.health import HealthSettings
from queue_core.remote import RemoteQueueService
from queue_core.service import QueueService
from queue_core.startup import (
    check_output_file,
    check_state_files,
    check_store,
    check_wirelog_dir,
    listen_fault,
    load_keys,
    prepare_data_dir,
    start_service,
    warn_loose_modes,
)
from spark.admin_endpoint import PageIndex, SearchGate, add_search_route
from strictq.startup_guard import Port, StartupLine, check_ports, data_dir_lock
from wirelog import logsafe
from wirelog.files import StartupError, file_faults, write_private
from wirelog.redaction import load_or_create_key

if TYPE_CHECKING:
    from cluster.traffic import EdgeIdentity, EdgePublisher
    from strictq.cluster_health import EdgeHealth

log = logging.getLogger("strictq.gateway")


def make_edge_app(
    service: QueueBackend,
    keys: KeyRing,
    *,
    index: Path | None = None,
    control: ControlHub | None = None,
    deliveries: DeliveryLog | None = None,
    failures: FailureManager | None = None,
    fleet: FleetBackend | None = None,
    receipt_key: Path | None = None,
    sqs_regions: tuple[str, ...] = (),
    regions: RegionResolver | None = None,
    limiter: TenantRateLimiter | None = None,
    cluster: ClusterSource | None = None,
    health: HealthView | None = None,
    remote: RemoteQueueService | None = None,
) -> web.Application:
    """The gateway's app (gateway.app) with, given `index`, GET /admin/v1/search over the wire-log index
    (spark.admin_endpoint; `strictq index` builds it) mounted beside its faces, and searched by the
    operator's dashboard (gateway.dashboard). `sqs_regions`: the regions
    SQS requests may be signed for (gateway.sqs_regions); empty: any. `regions`: each request's client
    region is set for the backend (gateway.client_region; an edge of a cluster). `health`: failure
    management where it runs elsewhere (a cluster's decider), for its admin routes and the dashboard.
    `remote`: the queue server this gateway fronts (its failure management is served from it:
    queue_core.health_view.RemoteHealthView; its fleet through `fleet`, queue_core.fleet_remote)."""
    if health is None and remote is not None:
        health = RemoteHealthView(remote)
    app = make_gateway_app(
        service,
        keys,
        control=control,
        deliveries=deliveries,
        failures=failures,
        fleet=fleet,
        receipt_key=receipt_key,
        sqs_regions=sqs_regions,
        limiter=limiter,
        story_index=PageIndex(index) if index is not None else None,  # the dashboard's search box
        cluster=cluster,  # an edge of a cluster: its partitions, owners and lag (strictq.cluster_source)
        health=health,
    )
    if index is not None:
        add_search_route(app, index, SearchGate(*search_gate(app, keys)))
    if regions is not None:
        app.middlewares.append(client_region_middleware(regions))
    return app


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str
    port: int
    data_dir: Path
    partitions: int = 64
    keys: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    insecure_http: bool = False
    queue_server: str | None = None  # URL of a `strictq queue-server`; None: the core runs in-process
    proxy: bool = True  # start the egress proxy as a child process
    proxy_port: int | None = None  # default: 8480, or 0 (a free port) when `port` is 0
    upstream_ca: tuple[Path, ...] = ()  # private CAs the proxy trusts for upstream certificates
    index: Path | None = None  # wire-log index for GET /admin/v1/search; default <data-dir>/index
    # Failure management (docs/failure-management.md §3) with the core in-process; None: off.
    health: HealthSettings | None = None
    fleet: FleetSettings | None = None  # the worker fleet's settings (docs/fleet.md); None: the defaults
    init: bool = False  # start with an empty store although the data dir shows an earlier one
    limits: ConnectionLimits = DEFAULT_LIMITS  # head timeout, keep-alive (queue_core.http_guard)
    regions: tuple[str, ...] = ()  # SQS: the regions requests may be signed for; empty: any (--region)
    cluster: NatsSettings | None = None  # a cluster's JetStream servers (--cluster): route to its owners
    # An edge of a cluster (issue 16; only with `cluster`): where its clients are (gateway.client_region)
    # and what it reports of their traffic (cluster.traffic).
    edge_region: str = ""  # the first --region: this edge's own region
    zone: str = ""
    edge_name: str | None = None  # default: edge-<region or any>-<host>-<port>
    client_regions: tuple[tuple[Network, str], ...] = ()  # --client-regions, loaded
    trusted_proxies: tuple[Network, ...] = ()
    trust_region_header: bool = False
    reach: tuple[tuple[str, str], ...] = ()  # (node, URL): reach that queue server there from this edge
    traffic_window: float = 60.0
    tenant_limit: TenantLimit | None = None  # --tenant-rate/--tenant-burst: every tenant's default send rate
    # --internal-secret / STRICTQ_INTERNAL_SECRET_FILE: the queue servers' internal secret, which every call
    # to them carries (queue_core.internal_auth); required with queue_server or cluster.
    internal_secret: Path | None = None
    internal_ca: Path | None = None  # --internal-ca: the CA of the queue servers' TLS (https:// URLs)

    @property
    def core_here(self) -> bool:
        """Whether the queue core runs in this process (not --queue-server, not --cluster)."""
        return self.queue_server is None and self.cluster is None

    def region_resolver(self) -> RegionResolver | None:
        """The client-region rule of an edge of a cluster (gateway.client_region); None otherwise: one
        process has no regions to tell apart."""
        if self.cluster is None:
            return None
        return RegionResolver(
            self.edge_region, self.client_regions, self.trusted_proxies, self.trust_region_header
        )

    def edge_name_for(self, port: int) -> str:
        """--edge-name, or edge-<region or any>-<host>-<port> (the bound port: --port 0 picks one): the
        host name keeps the reports of several edges of one region on one port (behind geo DNS) apart."""
        if self.edge_name:
            return self.edge_name
        host = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname().split(".")[0]).strip("-") or "host"
        prefix = f"edge-{self.edge_region or 'any'}-"
        suffix = f"-{port}"
        return prefix + host[: 64 - len(prefix) - len(suffix)] + suffix


def client_env(
    url: str, ca: Path | None, keys: KeyRing, proxy_url: str | None = None, proxy_ca: Path | None = None
) -> str:
    """Environment for the CLI, the SDK and replay (docs/contracts.md), plus the AWS variables for boto3."""
    producer = _first(keys, "producer") or _first(keys, "admin")
    worker = _first(keys, "worker")
    lines = [f"STRICTQ_URL={url}"]
    if ca is not None:
        lines.append(f"STRICTQ_CA_FILE={ca.resolve()}")
    if producer is not None:
        lines.append(f"STRICTQ_API_KEY={producer.secret}")
    if (admin := _first(keys, "admin")) is not None:
        lines.append(f"STRICTQ_ADMIN_KEY={admin.secret}")  # strictq fence / unfence / fences
    if worker is not None:
        lines += [f"STRICTQ_WORKER_ID={worker.id}", f"STRICTQ_WORKER_SECRET={worker.secret}"]
    if proxy_url is not None:  # workers' outbound calls go through the egress proxy, trusting its CA
        lines.append(f"STRICTQ_PROXY_URL={proxy_url}")
        if proxy_ca is not None:
            lines.append(f"STRICTQ_PROXY_CA_FILE={proxy_ca.resolve()}")
    if producer is not None:
        lines += [
            "# boto3 and the AWS CLI against the SQS face (endpoint: STRICTQ_URL)",
            f"AWS_ACCESS_KEY_ID={producer.id}",
            f"AWS_SECRET_ACCESS_KEY={producer.secret}",
            "AWS_DEFAULT_REGION=us-east-1",
        ]
        if ca is not None:
            lines.append(f"AWS_CA_BUNDLE={ca.resolve()}")
    return "\n".join(lines) + "\n"


def _first(keys: KeyRing, role: str) -> Credential | None:
    return next((c for c in keys.credentials if c.role == role), None)


def prepare(options: ServeOptions) -> tuple[KeyRing, Path, TlsFiles | None, ssl.SSLContext | None]:
    """Every start-up fault the files can cause, found before anything opens or listens, each a
    StartupError naming its file (wirelog.files): the data dir (0700, writable), the key file, a missing or
    empty store (refused unless --init), fences.json, suspended.json, redaction.key, the TLS files. Then
    the files a first start creates, each with its final mode."""
    data_dir = options.data_dir
    prepare_data_dir(data_dir)
    keys_path = options.keys or data_dir / "keys.toml"
    keys = load_keys(keys_path) if options.keys is not None or keys_path.exists() else None
    if options.core_here:
        check_store(data_dir, data_dir / "queue", options.init)
        check_state_files(data_dir, options.health is not None)
    check_wirelog_dir(data_dir / "wirelog")  # the delivery log's, in both modes
    for ca in options.upstream_ca if options.proxy else ():
        if not ca.is_file():
            raise StartupError(ca, "is not a file", "give --upstream-ca the PEM of a backend's CA")
        try:  # the proxy child would bundle it as it is, and fail every upstream handshake, or none
            ssl.create_default_context(cafile=str(ca))
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise StartupError(
                ca, f"is not a PEM CA certificate ({exc})", "give --upstream-ca the PEM of a backend's CA"
            ) from None
    check_output_file(data_dir / "client.env")  # written once the gateway listens
    tls: TlsFiles | None = None
    context: ssl.SSLContext | None = None
    if not options.insecure_http and options.tls_cert is not None and options.tls_key is not None:
        tls = TlsFiles(options.tls_cert, options.tls_key, None)
        context = server_context(tls, options.client_ca)  # the operator's files: checked before any write
    with file_faults(data_dir):
        load_or_create_key(data_dir)  # the delivery log's and the proxy's: a damaged one is refused here
        ReceiptSigner.load(data_dir / "receipt.key")  # the SQS face's: refused before the store opens
        if keys is None:
            keys = write_development_keys(keys_path)
            log.info("wrote development credentials to %s", keys_path)
        if not options.insecure_http and tls is None:
            tls = ensure_local_certificates(data_dir / "tls")
    if tls is not None and context is None:
        context = server_context(tls, options.client_ca)
    warn_loose_modes(data_dir)
    return keys, keys_path, tls, context


def internal_secret(options: ServeOptions) -> InternalSecret | None:
    """The queue servers' internal secret when they run elsewhere (None with the core in this process);
    one start-up line when none is given, naming the flag, the variable and the file to give."""
    if options.core_here:
        return None
    if options.internal_secret is None:
        where = (
            "the file the queue server wrote (its 'strictq: internal secret <path>' line: <its data-dir>/"
            f"{SECRET_FILE_NAME})"
            if options.queue_server is not None
            else f"the cluster's file (`strictq cluster up` writes DIR/{SECRET_FILE_NAME})"
        )
        what = "--queue-server" if options.queue_server is not None else "--cluster"
        raise StartupLine(options.data_dir, missing_secret_line(f"a gateway with {what}", where))
    return InternalSecret.load(options.internal_secret)


async def serve(options: ServeOptions) -> None:
    data_dir = options.data_dir
    secret = internal_secret(options)  # before any file is written: a missing one is the whole answer
    keys, keys_path, tls, context = prepare(options)
    # Operators' per-tenant limits (gateway.rate_limits): a damaged file stops the start before the store.
    limiter = TenantRateLimiter.load(data_dir / "limits.json", options.tenant_limit)
    service: QueueBackend
    fleet: FleetBackend | None = None  # the worker fleet (docs/fleet.md): where the registry is held
    control = None
    publisher = None  # an edge of a cluster's traffic reports (cluster.traffic), started once it listens
    cluster_state: ClusterSource | None = None
    edge_health = None  # failure management at a cluster edge (strictq.cluster_health)
    failures: FailureManager | None = None
    remote: RemoteQueueService | None = None
    if options.cluster is not None:
        edge = await cluster_backend(options.cluster, data_dir, options, limiter, secret)
        service, control, publisher, cluster_state = edge.backend, edge.hub, edge.publisher, edge.source
        fleet, edge_health = edge.fleet, edge.health
    elif options.queue_server is None:
        core = QueueService(data_dir / "queue", partitions=options.partitions)
        await start_service(core, data_dir)
        service = core
        # The core in this process: its control stream and fences (in the store; a legacy
        # <data-dir>/fences.json is migrated into it), failure management and the fleet beside it.
        control = ControlHub(core, store_registry(core, data_dir / "fences.json"))
        if options.health is not None:  # its events go to the wire log beside the gateway's records
            failures = FailureManager(core, control, options.health, wirelog=data_dir / "wirelog")
        fleet = FleetService(core, failures, options.fleet)  # heartbeats and controls (docs/fleet.md)
    else:
        remote = RemoteQueueService(
            options.queue_server,
            partitions=options.partitions,
            secret=secret,
            ca_file=None if options.internal_ca is None else str(options.internal_ca),
        )
        await remote.start()
        if remote.refused is not None:  # the server is there, and says our secret is not its own
            await remote.close()
            raise StartupLine(data_dir, remote.refused)
        service = remote
        fleet = RemoteFleet(remote)  # heartbeats go on to the queue server's fleet
        # The queue server's control stream and fences, relayed: this gateway serves them to its callers
        # and proxies within their scope (queue_core.control_relay).
        control = RelayHub(remote)
    gc.freeze()  # see strictq.queue_server: the restored backlog stays out of collections
    gc.set_threshold(50_000, 20, 100)
    # One `delivery` record per message handed to a worker, beside the proxy's records (same redaction key).
    deliveries = DeliveryLog(data_dir / "wirelog", key_dir=data_dir)
    deliveries.start()
    runner = web.AppRunner(
        make_edge_app(
            service,
            keys,
            control=control,
            index=options.index or data_dir / "index",
            deliveries=deliveries,
            failures=failures,
            fleet=fleet,
            receipt_key=data_dir / "receipt.key",  # SQS receipt handles stay valid across restarts
            sqs_regions=options.regions,
            regions=options.region_resolver(),
            limiter=limiter,
            cluster=cluster_state,
            health=None if edge_health is None else edge_health.view(service),
            remote=remote,
        ),
        access_log=None,
        handle_signals=False,
        **options.limits.handler_args(),
    )
    await runner.setup()
    if edge_health is not None:
        await edge_health.start()
    # A head (and TLS handshake) timeout per connection, memory back after slow readers.
    site = GuardedSite(
        runner, options.host, options.port, limits=options.limits, ssl_context=context, reuse_address=True
    )
    try:
        await site.start()
    except OSError as exc:
        raise listen_fault(options.host, options.port, exc) from None
    host, port = runner.addresses[0][:2]
    scheme = "https" if context is not None else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    if publisher is not None:  # now that its port and URL are known; closed with the backend
        publisher.meter.edge = edge_identity(options, port, url)
        await publisher.start()
    # Handlers first: a SIGTERM right after the `listening` line must still stop cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"strictq: listening on {url}", flush=True)
    if tls is not None and tls.ca is not None:
        print(f"strictq: ca {tls.ca.resolve()}", flush=True)
    print(f"strictq: keys {keys_path.resolve()}", flush=True)
    proxy = None
    if options.proxy:  # after the gateway listens: the proxy follows its control stream
        proxy = await _start_proxy(options, url, tls, keys_path, keys, stop)
        if proxy is None:
            await _shutdown(service, runner, None, deliveries)
            if stop.is_set():  # SIGTERM during start-up: a clean stop
                return
            raise SystemExit(1)
        print(f"strictq: proxy on {proxy.url}", flush=True)
        print(f"strictq: proxy ca {proxy.ca}", flush=True)
    env_path = data_dir / "client.env"
    proxy_env = (proxy.url, proxy.ca) if proxy is not None else (None, None)
    write_private(env_path, client_env(url, tls.ca if tls else None, keys, *proxy_env))  # 0600 at creation
    print(f"strictq: client env {env_path.resolve()}", flush=True)
    cacert = f"--cacert {tls.ca.resolve()} " if tls is not None and tls.ca is not None else ""
    print(
        f"strictq: try  set -a; . {env_path}; set +a; curl -s {cacert}"
        f'-H "{headers.API_KEY}: $STRICTQ_API_KEY"'
        f" -H 'Content-Type: application/json' {url}/queue/1/orders/send --data-binary '{{\"order\": 1}}'",
        flush=True,
    )
    # The operator's dashboard runs in every topology (gateway.dashboard); `cluster up` keeps its last line.
    if options.cluster is None:
        print(f"strictq: dashboard {url}/dashboard (log in with STRICTQ_ADMIN_KEY of {env_path})", flush=True)
    try:
        await stop.wait()
    finally:
        print("strictq: stopping", file=sys.stderr, flush=True)
        await _shutdown(service, runner, proxy, deliveries)


async def _shutdown(
    service: QueueBackend, runner: web.AppRunner, proxy: ProxyChild | None, deliveries: DeliveryLog
) -> None:
    if proxy is not None:  # first: it follows our control stream, and flushes its wire log
        await proxy.stop()
    service.stop_waiting()
    await runner.cleanup()
    await deliveries.close()  # after the last poll has answered: every delivery is recorded
    await service.close()


def proxy_control_credential(keys: KeyRing) -> Credential | None:
    """The credential the embedded proxy reads the control stream as: the key file's first `operator`
    when the file has several tenants (a tenant's proxy key sees only its tenant's fences, so it serves
    only that tenant's workers); otherwise, or without one, the first `proxy` credential (the proxy's
    default). None: the proxy cannot run on this key file."""
    operator = _first(keys, "operator")
    if operator is not None and len(tenants_of(keys.credentials)) > 1:
        return operator
    return _first(keys, "proxy")


def proxy_control_args(keys: KeyRing) -> list[str]:
    """`--control-key-id` for an operator credential (proxy_control_credential); a proxy credential is the
    proxy's default. Several tenants and no operator: the proxy serves one tenant, and this says so."""
    credential = proxy_control_credential(keys)
    if credential is not None and credential.role == "operator":
        return ["--control-key-id", credential.id]
    if len(tenants_of(keys.credentials)) > 1:
        served = credential.tenant if credential is not None else "none"
        print(
            f"strictq: the egress proxy serves tenant {served} only: add an operator credential to the key "
            "file for one proxy that serves every tenant (docs/security.md)",
            file=sys.stderr,
            flush=True,
        )
    return []


async def _start_proxy(
    options: ServeOptions, url: str, tls: TlsFiles | None, keys_path: Path, keys: KeyRing, stop: asyncio.Event
) -> ProxyChild | None:
    """`strictq proxy` as a child: same key file, our control stream (with --queue-server: the queue
    server's, relayed) and CA, wire log and redaction key in our data directory."""
    port, admin_port = proxy_ports(options)
    try:
        return await start_proxy_child(
            host=options.host,
            port=port,
            admin_port=admin_port,
            data_dir=serve_proxy_dir(options.data_dir),
            keys=keys_path,
            control=url,  # with --queue-server too: this gateway relays the queue server's stream
            control_ca=tls.ca if tls is not None else None,
            wirelog=options.data_dir / "wirelog",
            redaction_key_dir=options.data_dir,
            stop=stop,
            extra_args=proxy_control_args(keys),
            upstream_ca=options.upstream_ca,
        )
    except ProxyStartError as exc:
        if not stop.is_set():
            print(f"strictq: the egress proxy did not start: {exc} (--no-proxy: without it)", file=sys.stderr)
        return None


def proxy_ports(options: ServeOptions) -> tuple[int, int]:
    """The egress proxy's port and its admin port (the proxy port + 10; both 0, free ports, with --port 0
    unless --proxy-port is given)."""
    port = options.proxy_port if options.proxy_port is not None else (8480 if options.port else 0)
    return port, port + 10 if port else 0


def listening_ports(options: ServeOptions) -> list[Port]:
    """Every port this serve listens on, with the flag that changes it (checked before anything starts)."""
    ports = [Port(options.port, "the gateway's --port", "--port", "PORT")]
    if options.proxy:
        port, admin = proxy_ports(options)
        ports += [
            Port(port, "the egress proxy's --proxy-port", "--proxy-port", "PROXY_PORT"),
            Port(admin, "the egress proxy's admin port, --proxy-port + 10", "--proxy-port", "PROXY_PORT"),
        ]
    return ports


def without_unusable_proxy(options: ServeOptions) -> ServeOptions:
    """A key file with no credential the proxy can read the control stream with (a `proxy` one, or an
    `operator` one when it has several tenants): the gateway runs without the proxy, and says so in one
    line, rather than printing `listening on` and exiting when the proxy child refuses to start."""
    keys_path = options.keys or options.data_dir / "keys.toml"
    if not options.proxy or not keys_path.exists():  # development keys, written at start, have one
        return options
    try:
        keys = KeyRing.load(keys_path)
    except (KeyFileError, OSError):
        return options  # prepare() names the fault
    if proxy_control_credential(keys) is not None:
        return options
    print(
        f"strictq: {keys_path} has no proxy-role credential: running without the egress proxy (add one "
        "for workers' outbound calls to be fenced and recorded, docs/security.md; --no-proxy to say so)",
        file=sys.stderr,
        flush=True,
    )
    return replace(options, proxy=False)


def edge_identity(options: ServeOptions, port: int, url: str) -> EdgeIdentity:
    """Who this edge is in the cluster's edges bucket: --edge-name (or edge-<region>-<host>-<port>), the first
    --region, --zone, the URL it listens on."""
    from cluster.traffic import EdgeIdentity

    return EdgeIdentity(options.edge_name_for(port), options.edge_region, options.zone, url)


@dataclass(frozen=True, slots=True)
class ClusterEdge:
    """What a cluster edge is composed of: the backend over the partitions' owners, the control state's
    hub, the traffic publisher, the cluster's state for the dashboard, the fleet and, with `--health`,
    failure management's part (the decider's client, the probe bridge, alerts and events)."""

    backend: QueueBackend
    hub: ControlHub
    publisher: EdgePublisher
    source: ClusterSource
    fleet: FleetBackend
    health: EdgeHealth | None


async def cluster_backend(
    settings: NatsSettings,
    data_dir: Path,
    options: ServeOptions | None = None,
    limiter: TenantRateLimiter | None = None,
    secret: InternalSecret | None = None,
) -> ClusterEdge:
    """The gateway of a cluster: every group's operations go to its partition's owner (cluster.backend),
    read from the cluster's KV buckets (cluster.kv_owners), through `options.reach` where given; its
    control stream relays the owners' floors (cluster.floors) and serves the cluster's one set of fences,
    kept in its control bucket (cluster.control_fences; a legacy <data-dir>/fences.json is migrated into
    it), and `limiter`'s per-tenant limits live in the same bucket (strictq.cluster_limits; a legacy
    <data-dir>/limits.json is migrated too). Its sends are measured (cluster.traffic.TrafficMeter over
    `options.traffic_window`) and published by the EdgePublisher returned, which the caller starts once
    it listens (edge_identity needs the port) and the backend's close closes; the cluster's state for
    the edge's dashboard and /metrics (strictq.cluster_source); and the worker fleet, held once for the
    cluster in its fleet bucket (cluster.fleet_kv; the app starts and closes it)."""
    from cluster.backend import ClusterBackend
    from cluster.connect import connect
    from cluster.control_fences import ClusterFenceRegistry
    from cluster.fleet_kv import ClusterFleet
    from cluster.floors import ClusterFloors
    from cluster.kv_owners import KvOwnerMap
    from cluster.layout import LayoutError, read_layout, retrying
    from cluster.replicated_log import APPEND_RETRY_SECONDS
    from cluster.traffic import EdgePublisher, TrafficMeter
    from strictq.cluster_limits import ClusterLimits
    from strictq.cluster_source import KvClusterSource

    options = options or ServeOptions(host="127.0.0.1", port=0, data_dir=data_dir, cluster=settings)
    reach = dict(options.reach)

    try:
        nc = await connect(settings.urls, settings.user, settings.password, name="strictq-gateway")
    except Exception as exc:
        raise StartupLine(
            data_dir, f"cannot reach the cluster's NATS servers {list(settings.urls)}: {exc}"
        ) from None
    js = nc.jetstream()
    layout = await retrying(lambda: read_layout(js), "the cluster's layout")
    if layout is None:
        await nc.close()
        raise StartupLine(
            data_dir,
            "no strictq cluster on these NATS servers yet: start its queue servers first (docs/cluster.md)",
        )
    owners = KvOwnerMap(js, layout)
    await retrying(owners.start, "the cluster's owners")
    floors = ClusterFloors(nc, layout)
    await floors.start()
    meter = TrafficMeter(edge_identity(options, options.port, ""), window=options.traffic_window)
    ca = None if options.internal_ca is None else str(options.internal_ca)
    publisher = EdgePublisher(js, layout, meter, owners, reach=reach, ca_file=ca)
    # The cluster's fences and limits (its control bucket); a damaged legacy file stops the start here.
    fences = ClusterFenceRegistry(js, layout, data_dir / "fences.json")
    limits = None if limiter is None else ClusterLimits(js, layout, limiter, data_dir / "limits.json")
    try:
        await fences.start()
        if limits is not None:
            await limits.start()
    except BaseException as exc:
        for part in (limits, fences, floors, owners):
            if part is not None:
                await part.close()
        await nc.close()
        if isinstance(exc, LayoutError):  # no control bucket: the queue servers make it
            raise StartupLine(data_dir, str(exc)) from None
        raise
    hub = ControlHub(floors, fences)
    health = None
    if options.health is not None:
        from cluster.decider_client import DeciderClient
        from cluster.edge_events import EdgeEvents
        from strictq.cluster_health import AlertRelay, EdgeHealth, ProbeBridge

        bridge = ProbeBridge(fences.mirror, hub)  # backend: set below
        alerts = AlertRelay(data_dir / "wirelog", options.health.window)  # as one process's manager reads
        client = DeciderClient(nc, layout)
        health = EdgeHealth(client, bridge, EdgeEvents(client), alerts)

    async def closed() -> None:
        if health is not None:
            await health.close()
        await publisher.close()  # first: it reads the owner map and deletes its key over `nc`
        await fences.close()
        if limits is not None:
            await limits.close()
        await floors.close()
        await owners.close()
        await nc.close()

    # Not the single queue server's 30 s: an append waits out a stream leader's election (~5-9 s) at most
    # APPEND_RETRY_SECONDS, and a frozen owner should cost a client this long, not half a minute.
    backend = ClusterBackend(
        owners,
        on_close=closed,
        timeout=APPEND_RETRY_SECONDS + 3,
        meter=meter,
        reach=reach,
        secret=secret,
        ca_file=None if options.internal_ca is None else str(options.internal_ca),
    )
    await backend.start()
    refused = backend.refused
    if refused is not None:  # the nodes are there, and say our secret is not the cluster's
        await backend.close()
        raise StartupLine(data_dir, refused)
    if health is not None:
        health.bridge.backend = backend  # a probe of a `probe_safe` queue passes at the proxies
        health.backend = backend
    # The fleet's events: into the cluster's events stream beside the decider's (else only logged).
    fleet = ClusterFleet(
        js, layout, backend, options.fleet, events=None if health is None else health.events.fleet
    )
    source = KvClusterSource(js, layout, tuple(settings.urls))
    return ClusterEdge(backend, hub, publisher, source, fleet, health)


def run(options: ServeOptions) -> None:
    """`strictq serve`: the data dir locked first (another serve on it is refused before anything is
    read), then every port checked, then the server (strictq.startup_guard)."""
    logsafe.install()  # control characters escaped, malformed requests one WARNING line (issue 11)
    import uvloop

    if options.upstream_ca and not options.proxy:
        raise StartupLine(
            options.data_dir, "--upstream-ca is for the egress proxy: drop it, or drop --no-proxy"
        )
    with contextlib.ExitStack() as locks:
        locks.enter_context(data_dir_lock(options.data_dir, "serve"))
        if options.core_here:  # the store's own dir too: a queue-server given it is refused
            locks.enter_context(data_dir_lock(options.data_dir / "queue", "serve"))
        options = without_unusable_proxy(options)
        check_ports(options.host, listening_ports(options))
        uvloop.run(serve(options))
