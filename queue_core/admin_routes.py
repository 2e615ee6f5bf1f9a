"""Mounting the admin routes: the control stream and fences (queue_core.admin_http), failure management
(queue_core.health_http), on any aiohttp app (the queue server's, the gateway's); and, with
`add_queue_admin_routes`, the queue's own: the retry workflow (queue_core.retry_http) and handovers
(queue_core.handover_http), over the port (queue_core.backend), so every gateway serves them whatever its
backend.

`add_admin_routes` ties the hub's life to the app's: started on start-up, streams ended on shutdown (an open
SSE response must not hold a SIGTERM up), closed on cleanup. The route modules import `admin_http` for
what they share; only this module imports them all, so none imports another's routes back.
"""

from __future__ import annotations

from aiohttp import web

from access.keys import KeyRing

from .admin_http import ADMIN_KEYS, CONTROL, UNTENANTED, control_stream, delete_fence, list_fences, put_fence
from .backend import QueueBackend
from .control import ControlHub
from .failures import FailureManager
from .handover_http import add_handover_routes
from .health_http import add_health_routes
from .health_view import HealthView, LocalHealthView
from .retry_http import add_retry_routes
from .routing_http import RoutingHooks, add_routing_routes


def add_admin_routes(
    app: web.Application,
    hub: ControlHub,
    keys: KeyRing,
    failures: FailureManager | None = None,
    *,
    untenanted: bool = False,
    health: HealthView | None = None,
) -> None:
    """Serve /admin/v1/control and /admin/v1/fences from `app`, with the hub living as long as it; with
    `failures` (its hub must be `hub`: failure management beside the core, started and closed with the
    app) or `health` (where it runs elsewhere: a queue server's, a cluster's decider), failure
    management's routes too (queue_core.health_http). `untenanted`: the core has no tenants (the queue
    server), see UNTENANTED."""
    app[CONTROL] = hub
    app[ADMIN_KEYS] = keys
    app[UNTENANTED] = untenanted
    app.router.add_get("/admin/v1/control", control_stream)
    app.router.add_get("/admin/v1/fences", list_fences)
    app.router.add_put("/admin/v1/fences/{worker}", put_fence)
    app.router.add_delete("/admin/v1/fences/{worker}", delete_fence)
    if health is None and failures is not None:
        health = LocalHealthView(failures)
    if health is not None:
        add_health_routes(app, health)

    async def start(app: web.Application) -> None:
        await hub.start()
        if failures is not None:
            await failures.start()

    async def end_streams(app: web.Application) -> None:
        await hub.shutdown_streams()

    async def close(app: web.Application) -> None:
        if failures is not None:
            await failures.close()
        await hub.close()

    app.on_startup.append(start)
    app.on_shutdown.append(end_streams)
    app.on_cleanup.append(close)


def add_queue_admin_routes(
    app: web.Application,
    backend: QueueBackend,
    keys: KeyRing,
    *,
    untenanted: bool = False,
    failures: FailureManager | None = None,
    hub: ControlHub | None = None,
    health: HealthView | None = None,
) -> None:
    """Serve the retry workflow's routes (release, redrive, group policies, the group log, parked groups),
    the handover routes (queue_core.handover_http) and group routing's (queue_core.routing_http) from
    `app` over `backend`: the same routes in process, in front of a queue server and of a cluster. `keys`
    authenticate them (the same ring as `add_admin_routes`'); `untenanted`: see UNTENANTED. `failures`
    (where failure management runs beside the core) or else `hub` tell routing which workers are fenced;
    `health` (failure management wherever it runs) takes the rollouts' events."""
    app[ADMIN_KEYS] = keys
    app[UNTENANTED] = untenanted or app.get(UNTENANTED, False)
    add_retry_routes(app, backend)
    add_handover_routes(app, backend)  # moving groups between workers with their local state
    # Pins and rollouts (docs/rollouts.md).
    add_routing_routes(app, backend, routing_hooks(failures, hub, health))


def routing_hooks(
    failures: FailureManager | None, hub: ControlHub | None, health: HealthView | None
) -> RoutingHooks:
    """Who is blocked: failure management's view where it runs here, else the hub's fences (a fenced
    worker takes nothing wherever it polls). The rollouts' events go to failure management's events
    wherever it runs (`health`: here, the queue server's, the cluster's decider); none without it."""
    if health is None and failures is not None:
        health = LocalHealthView(failures)
    record = None if health is None else health.record
    if failures is not None:
        manager = failures
        return RoutingHooks(lambda worker: manager.monitor.blocked(worker), record)
    if hub is not None:
        fences = hub.registry
        return RoutingHooks(lambda worker: fences.get(worker) is not None, record)
    return RoutingHooks(lambda worker: False, record)
