"""Admin routes of a gateway in front of a queue server (`strictq serve --queue-server URL`): the fleet
(`strictq fleet`, `control`, `fleet-policy`), with the same paths, roles, scope and answers as in one
process (queue_core.fleet_http). Failure management's routes are queue_core.health_http's, over the queue
server's state (queue_core.health_view.RemoteHealthView); routing and rollouts are served over the port in
every topology (queue_core.routing_http).

The state is the queue server's (its core and fleet); the gateway authenticates the caller with its own key
file, names its queues and checks its workers (another tenant's: 404, as if they did not exist), asks the
queue server's internal admin operations (queue_core.operations, served by queue_core.admin_internal) by
core names through its one client (`RemoteQueueService.call`), and cuts the answer to the caller's scope
with the same functions as in one process (`scope_fleet`). These routes only read and forward, so they
are a short explicit list of paths and methods rather than a typed port of their own. The queue
server unreachable: 503 `unavailable`; its 4xx passed on with its status and body. The control stream and
the fences are queue_core.control_relay's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES

from . import operations as ops
from .admin_http import errors_as_json, existing_queue, known_worker, queue_in_path, scope_of
from .fleet_http import _body as fleet_body
from .fleet_http import control_targets, no_workers, scope_fleet
from .http_errors import json_response
from .machine import NotFound
from .remote import RemoteQueueService

REMOTE = web.AppKey("strictq_remote_admin", RemoteQueueService)


def _remote(request: web.Request) -> RemoteQueueService:
    return request.app[REMOTE]


# --------------------------------------------------------------------------------------------- fleet
@errors_as_json
async def list_fleet(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    return json_response(scope_fleet(await _remote(request).call(ops.FLEET.bind()), scope))


@errors_as_json
async def fleet_control(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    remote = _remote(request)
    data = await fleet_body(request)
    workers, queue, version = control_targets(data)
    internal: str | None = None
    if workers is not None:
        for worker in workers:
            known_worker(scope, worker)  # another tenant's worker: 404, as if it did not exist
        targets = workers
    else:
        assert queue is not None
        internal = await existing_queue(scope, remote, queue)
        found = await remote.call(ops.FLEET_TARGETS.bind(internal, version))
        targets = [w for w in found["workers"] if scope.sees_worker(w)]
        if not targets:
            raise no_workers(queue, version)
    control = ops.FLEET_CONTROL.bind(data.get("kind"), data.get("args"), targets, data.get("ttl"), internal)
    answer = await remote.call(control)
    shown: list[dict[str, Any]] = [
        {**row, "queue": queue if internal is not None else None} for row in answer["controls"]
    ]
    return json_response({"controls": shown})


@errors_as_json
async def put_policy(request: web.Request) -> web.StreamResponse:
    name, queue = await queue_in_path(request, _remote(request), WRITE_ROLES)
    answer = await _remote(request).call(ops.PUT_FLEET_POLICY.bind(queue, await fleet_body(request)))
    return json_response({"queue": name, "policy": answer["policy"]})


@errors_as_json
async def delete_policy(request: web.Request) -> web.StreamResponse:
    name, queue = await queue_in_path(request, _remote(request), WRITE_ROLES)
    answer = await _remote(request).call(ops.DELETE_FLEET_POLICY.bind(queue))
    if answer.get("deleted") is not True:
        raise NotFound(f"queue {name!r} has no rebalancing policy", queue=name)
    return json_response({"queue": name, "policy": None})


# The whole list: what a gateway in front of a queue server serves of the queue server's admin state.
ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/admin/v1/fleet", list_fleet),
    ("POST", "/admin/v1/fleet/control", fleet_control),
    ("PUT", "/admin/v1/fleet/policies/{queue}", put_policy),
    ("DELETE", "/admin/v1/fleet/policies/{queue}", delete_policy),
)


def add_remote_admin_routes(app: web.Application, remote: RemoteQueueService) -> None:
    """Serve ROUTES from `app`, which already has the admin keys (queue_core.admin_routes)."""
    app[REMOTE] = remote
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
