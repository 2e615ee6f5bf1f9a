"""The edge application: one aiohttp app with the SQS JSON face at `POST /` and the EmoDB face under
`/queue/1` and `/dedupq/1`, in front of the queue core (in-process by default), with the admin routes,
/metrics and the operator's dashboard (gateway.dashboard), both reading the queues through the backend
port whatever the topology. The search route over the wire-log index is spark's: the composition root
(strictq.serve) mounts it beside these and hands the dashboard the index."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from access.keys import KeyRing
from protocol.errors import NOT_READY, error_body
from queue_core.admin_routes import add_admin_routes, add_queue_admin_routes
from queue_core.backend import QueueBackend
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.fleet import FleetBackend
from queue_core.fleet_http import add_fleet_routes
from queue_core.health_view import HealthView, LocalHealthView
from queue_core.http_errors import json_http_errors
from queue_core.metrics_export import core_source
from queue_core.metrics_http import add_metrics_route

from . import emodb, sqs
from .admission_metrics import AdmissionCollector
from .app_keys import BACKPRESSURE, KEYS, MAX_EDGE_BODY, ROUTER, SERVICE
from .cluster_figures import ClusterSource, cluster_metrics
from .dashboard import StoryIndex, add_dashboard
from .deliveries import DELIVERIES, DeliveryLog
from .estimates_http import add_estimate_routes
from .fleet_face import add_heartbeat_route
from .limits_http import add_limit_routes
from .rate_limits import TenantRateLimiter
from .request_ids import add_request_ids
from .request_metrics import RequestCounter
from .routing import PartitionRouter


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready while the core can make writes durable: 503 once its durable log failed (a disk error; one
    request's bad data never fails it, see queue_core.durability) or while a remote one is unreachable.
    /healthz stays liveness: the process answers."""
    if request.app[SERVICE].healthy:
        return web.json_response({"ready": True})
    message = "the queue store is not open, has failed, or is unreachable"
    return web.json_response({"ready": False, **error_body(NOT_READY, message, retriable=True)}, status=503)


def make_gateway_app(
    service: QueueBackend,
    keys: KeyRing,
    *,
    control: ControlHub | None = None,
    deliveries: DeliveryLog | None = None,
    failures: FailureManager | None = None,
    receipt_key: Path | None = None,
    sqs_regions: Collection[str] | None = None,
    limiter: TenantRateLimiter | None = None,
    story_index: StoryIndex | None = None,
    fleet: FleetBackend | None = None,
    cluster: ClusterSource | None = None,
    health: HealthView | None = None,
) -> web.Application:
    """`deliveries`: write a wire-log record per message handed to a worker (gateway.deliveries).
    `receipt_key`: the file of the SQS receipt-handle key (gateway.sqs_receipts); None: in memory.
    `sqs_regions`: the regions SQS requests may be signed for (gateway.sqs_regions); None: any.
    `limiter`: per-tenant send rates (gateway.rate_limits); None: unlimited, not kept on disk.
    `story_index`: the wire-log index the operator's dashboard searches (gateway.dashboard); None: none.
    `fleet`: the worker fleet (queue_core.fleet): heartbeats, controls, rebalancing where the core runs;
    in front of a queue server, `RemoteFleet` forwards the heartbeats to it (queue_core.fleet_remote); in a
    cluster, `ClusterFleet` keeps the registry in the cluster's fleet bucket (cluster.fleet_kv).
    `cluster`: a cluster's state (partitions, owners, lag) for the dashboard and /metrics of its edge.
    `health`: failure management where it runs elsewhere (a queue server's, a cluster's decider:
    queue_core.health_view), for its admin routes and the dashboard; with `failures` here, read from it."""
    requests = RequestCounter()  # outermost: it counts the status the client gets
    app = web.Application(client_max_size=MAX_EDGE_BODY, middlewares=[requests.middleware, json_http_errors])
    add_request_ids(app)  # every answer names its request's id (X-Request-Id; SQS: x-amzn-RequestId)
    app[SERVICE] = service
    app[KEYS] = keys
    if deliveries is not None:
        app[DELIVERIES] = deliveries
    app[ROUTER] = PartitionRouter(service, service.partitions)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    sqs.add_routes(app, receipt_key, sqs_regions)  # the faces register their own routes
    emodb.add_routes(app)
    limiter = limiter if limiter is not None else TenantRateLimiter()
    add_limit_routes(app, limiter, keys)
    add_estimate_routes(app)  # pipelining: a queue's processing-time estimates
    # /metrics (queue_core.metrics_http): this app's registry, and the queues' series read through the port
    # at each scrape (summed over the partitions of a cluster, which adds its own series).
    registry = CollectorRegistry()
    registry.register(requests)
    registry.register(AdmissionCollector(limiter, app[BACKPRESSURE]))
    # The control stream and fences of the hub the root composed: the core's beside it in one process
    # (with failure management's routes and hooks when `failures` runs here), a cluster edge's over the
    # control bucket, or a queue server's relayed (queue_core.control_relay). None: no admin routes.
    hub = control if control is not None else failures.hub if failures is not None else None
    if health is None and failures is not None:
        health = LocalHealthView(failures)
    if hub is not None:  # failure management's routes over `health`, wherever it runs
        add_admin_routes(app, hub, keys, failures, health=health)
    # The retry workflow, handovers and group routing, over the port: in every topology.
    add_queue_admin_routes(app, service, keys, failures=failures, hub=hub, health=health)
    fleet_admin = fleet.admin() if fleet is not None else None
    if fleet_admin is not None:  # the fleet's admin routes where this edge holds the registry (docs/fleet.md)
        add_fleet_routes(app, fleet_admin)
    sources = [core_source(service, hub, keys)]
    if cluster is not None:
        sources.append(cluster_metrics(cluster))
    add_dashboard(app, service, hub, keys, health, story_index, cluster=cluster)  # GET /dashboard
    if fleet is not None:  # POST /fleet/v1/heartbeat (gateway.fleet_face)
        add_heartbeat_route(app, fleet)
    add_metrics_route(app, registry, keys, sources)
    return app
