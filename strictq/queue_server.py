"""`strictq queue-server`: the queue core's process. Composes the internal API's app (queue_core.server),
the store, the admin routes (control stream, fences, retry workflow, failure management) and the key file,
and follows the start-up contract: `strictq: listening on <url>`, `strictq: keys <path>`, `strictq: internal
secret <path>` (the file every caller of the internal API needs: queue_core.internal_auth), then serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import ssl
import sys
from pathlib import Path

import uvloop
from aiohttp import web

from access.keys import KeyRing, write_development_keys
from queue_core.admin_internal import add_internal_admin_routes
from queue_core.admin_routes import add_admin_routes, add_queue_admin_routes
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.fleet import FleetService
from queue_core.fleet_http import add_fleet_routes, add_internal_heartbeat_route
from queue_core.http_guard import DEFAULT_LIMITS, ConnectionLimits, GuardedSite
from queue_core.internal_auth import FILE_NAME, InternalSecret
from queue_core.machine.fleet import FleetSettings
from queue_core.machine.health import HealthSettings
from queue_core.metrics_export import add_queue_metrics
from queue_core.server import make_app
from queue_core.service import QueueService
from queue_core.startup import (
    check_state_files,
    check_store,
    listen_fault,
    load_keys,
    prepare_data_dir,
    start_service,
    warn_loose_modes,
)
from strictq.startup_guard import Port, check_ports, data_dir_lock
from wirelog import logsafe


async def serve(
    host: str,
    port: int,
    data_dir: Path,
    partitions: int,
    keys: Path | None = None,
    health: HealthSettings | None = None,
    init: bool = False,
    limits: ConnectionLimits = DEFAULT_LIMITS,
    fleet: FleetSettings | None = None,
    secret_file: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> None:
    # Start-up faults first, each a StartupError naming its file (queue_core.startup): the data dir
    # (0700, writable), the key file, a missing or empty store (refused unless `init`), fences.json.
    prepare_data_dir(data_dir)
    # The admin routes (control stream, fences) authenticate with the key file; a missing default one is
    # created with development credentials, as `strictq serve` does.
    keys_path = keys or data_dir / "keys.toml"
    key_ring = load_keys(keys_path) if keys or keys_path.exists() else None
    # The internal API's credential (queue_core.internal_auth): --internal-secret or its variable, else
    # <data-dir>/internal.secret (written 0600 on the first start). A file open to other users is refused.
    secret_path = secret_file or data_dir / FILE_NAME
    secret = InternalSecret.load(secret_path) if secret_file is not None else None
    # --tls-cert/--tls-key: the internal API over TLS (the secret must not cross a network in clear).
    context = internal_tls(tls)
    check_store(data_dir, data_dir, init)
    check_state_files(data_dir, health is not None)
    if secret is None:
        secret, _ = InternalSecret.ensure(secret_path)
    warn_loose_modes(data_dir)
    if key_ring is None:
        key_ring = write_development_keys(keys_path)
    service = QueueService(data_dir, partitions=partitions)
    await start_service(service, data_dir)
    # The restored backlog lives as long as the process: keep it out of every future collection, and
    # collect young objects less often (requests allocate many short-lived ones; queue records form few
    # cycles). Measured: the collector took ~7% of the loop under load with the defaults.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    app = compose_app(service, secret, key_ring, data_dir, health, fleet)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **limits.handler_args())
    await runner.setup()
    # A head timeout per connection, memory back after slow readers (queue_core.http_guard).
    site = GuardedSite(runner, host, port, limits=limits, ssl_context=context, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        raise listen_fault(host, port, exc) from None
    # Handlers first: a SIGTERM right after the `listening` line must still stop cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    bound_host, bound_port = runner.addresses[0][:2]
    url = f"{'https' if context else 'http'}://{_url_host(bound_host)}:{bound_port}"
    print(f"strictq: listening on {url}", flush=True)
    print(f"strictq: keys {keys_path.resolve()}", flush=True)
    print(f"strictq: internal secret {secret_path.resolve()}", flush=True)
    command = sys.argv[0] if Path(sys.argv[0]).name == "strictq" else "strictq"  # e.g. .venv/bin/strictq
    print(
        f"strictq: try  STRICTQ_QUEUE_URL={url} STRICTQ_INTERNAL_SECRET_FILE={secret_path.resolve()} "
        f"{command} send orders --group customer-1 '{{\"order\": 1}}'",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        print("strictq: stopping", file=sys.stderr, flush=True)
        service.stop_waiting()  # long polls answer now instead of holding the shutdown for up to 20 s
        await runner.cleanup()
        await service.close()


def compose_app(
    service: QueueService,
    secret: InternalSecret,
    key_ring: KeyRing,
    data_dir: Path,
    health: HealthSettings | None,
    fleet: FleetSettings | None,
) -> web.Application:
    """The queue server's one app: the internal API (its operations: queue_core.operations) and the
    admin routes the key file authenticates (/admin/..., /metrics); tests list its routes from here."""
    app = make_app(service, secret=secret)
    hub = ControlHub(service)  # fences in the store (a legacy <data-dir>/fences.json is migrated)
    # Failure management (docs/failure-management.md §3); its events go to <data-dir>/wirelog.
    failures = (
        FailureManager(service, hub, health, wirelog=data_dir / "wirelog") if health is not None else None
    )
    # Its internal API has no tenants: untenanted queues and workers are every admin's (queue_core.scope).
    add_admin_routes(app, hub, key_ring, failures, untenanted=True)
    # The retry workflow, handovers and group routing.
    add_queue_admin_routes(app, service, key_ring, untenanted=True, failures=failures, hub=hub)
    # The worker fleet (docs/fleet.md): its admin routes, and the heartbeats gateways forward.
    fleet_service = FleetService(service, failures, fleet)
    add_fleet_routes(app, fleet_service)
    add_internal_heartbeat_route(app)
    # The same state for the gateway in front (`strictq serve --queue-server`), which serves the admin
    # routes to its callers within their scope (queue_core.admin_internal, queue_core.health_view,
    # queue_core.fleet_remote).
    add_internal_admin_routes(app, hub, failures, fleet_service)
    add_queue_metrics(app, service, hub, key_ring)  # GET /metrics, scoped per key
    return app


def internal_tls(files: tuple[Path, Path] | None) -> ssl.SSLContext | None:
    """The internal API's TLS context from --tls-cert/--tls-key (faults named: gateway.tls), or None."""
    if files is None:
        return None
    from gateway.tls import TlsFiles, server_context  # cryptography: imported only when TLS is asked for

    return server_context(TlsFiles(files[0], files[1], None))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(
    host: str,
    port: int,
    data_dir: Path,
    partitions: int,
    keys: Path | None = None,
    health: HealthSettings | None = None,
    init: bool = False,
    limits: ConnectionLimits = DEFAULT_LIMITS,
    fleet: FleetSettings | None = None,
    secret_file: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> None:
    logsafe.install()  # control characters escaped, malformed requests one WARNING line (issue 11)
    # The data dir locked first (another server on it is refused before its store is touched), then the
    # port checked (strictq.startup_guard).
    with data_dir_lock(data_dir, "queue-server"):
        check_ports(host, [Port(port, "the internal API's --port", "--port")])
        # uvloop is pinned, as for `strictq serve`; an ImportError raised while serving is a fault to
        # report, not a reason to start the server a second time on plain asyncio.
        uvloop.run(
            serve(host, port, data_dir, partitions, keys, health, init, limits, fleet, secret_file, tls)
        )
