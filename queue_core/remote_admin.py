"""Admin routes of a gateway in front of a queue server (`strictq serve --queue-server URL`): failure
management (`strictq status`, `suspend`, `resume`, `unblacklist`, alerts, events) and the fleet (`strictq
fleet`, `control`, `fleet-policy`), with the same paths, roles, scope and answers as in one process
(queue_core.health_http, fleet_http). Routing and rollouts are served over the port in every topology
(queue_core.routing_http).

The state is the queue server's (its failure manager, core and fleet); the gateway authenticates the caller
with its own key file, names its queues and checks its workers (another tenant's: 404, as if they did not
exist), asks the queue server's internal admin operations (queue_core.operations, served by
queue_core.admin_internal) by core names through its one client (`RemoteQueueService.call`), and cuts the
answer to the caller's scope with the same functions as in one process (`scope_status`, `scope_fleet`).
These routes only read and forward, so they are a short explicit list of paths and methods rather than a
typed port of their own. The queue server unreachable: 503 `unavailable`; its 4xx passed on with its
status and body. The control stream and the fences are queue_core.control_relay's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES

from . import operations as ops
from .admin_http import errors_as_json, existing_queue, known_worker, queue_in_path, scope_of
from .fleet_http import _body as fleet_body
from .fleet_http import control_targets, no_workers, scope_fleet
from .health_http import (
    NotBlacklisted,
    NotSuspended,
    _body,
    _int_query,
    _text,
    alert_request,
    scope_status,
    scoped_events,
)
from .health_view import ErrorCases
from .http_errors import json_response
from .machine import NotFound
from .remote import RemoteQueueService
from .scope import Scope

REMOTE = web.AppKey("strictq_remote_admin", RemoteQueueService)


def _remote(request: web.Request) -> RemoteQueueService:
    return request.app[REMOTE]


# -------------------------------------------------------------------------------- failure management
class RemoteHealthView:
    """Failure management in the queue server behind this gateway, for the dashboard (queue_core.
    health_view): its status through the same internal route the status route reads, cut to the caller."""

    def __init__(self, remote: RemoteQueueService) -> None:
        self.remote = remote

    async def status(self, scope: Scope, latest: int) -> dict[str, Any]:
        state = await self.remote.call(ops.FAILURES.bind(latest))
        return scope_status(state["view"], state["events"], state["probes"], scope, latest)

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        return None  # the queue server's tally stays there; the index's error cases are shown instead


@errors_as_json
async def status(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    latest = _int_query(request, "events", 20)
    state = await _remote(request).call(ops.FAILURES.bind(latest))
    return json_response(scope_status(state["view"], state["events"], state["probes"], scope, latest))


@errors_as_json
async def events(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    limit = _int_query(request, "limit", 1000)
    since = _int_query(request, "since", 0)
    state = await _remote(request).call(ops.FAILURES.bind(0, since))
    shown = scoped_events(scope, state["events"])  # scoped before the limit, as in one process
    return json_response({"events": shown[-limit:] if limit > 0 else [], "last": state["last"]})


@errors_as_json
async def suspend(request: web.Request) -> web.StreamResponse:
    name, queue = await queue_in_path(request, _remote(request), WRITE_ROLES)
    reason = _text(await _body(request), "reason", None)
    await _remote(request).call(ops.SUSPEND.bind(queue, f"operator: {reason}"))
    return json_response({"queue": name, "suspended": True, "reason": reason})


@errors_as_json
async def resume(request: web.Request) -> web.StreamResponse:
    name, queue = await queue_in_path(request, _remote(request), WRITE_ROLES)
    reason = _text(await _body(request), "reason", "operator")
    answer = await _remote(request).call(ops.RESUME.bind(queue, reason))
    if answer.get("resumed") is not True:
        raise NotSuspended(f"queue {name!r} is not suspended")
    return json_response({"queue": name, "resumed": True})


@errors_as_json
async def lift_blacklist(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    if not scope.sees_worker(worker):
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
    answer = await _remote(request).call(ops.UNBLACKLIST.bind(worker))
    if answer.get("lifted") is not True:
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
    return json_response({"worker": worker, "lifted": True})


@errors_as_json
async def alert(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    remote = _remote(request)
    asked = alert_request(await _body(request))
    reason, signatures = asked.reason, asked.signatures
    queue = None if asked.queue is None else await existing_queue(scope, remote, asked.queue)
    # A tenant's alert by signature suspends only the tenant's queues within its prefixes.
    body = {
        "reason": reason,
        "queue": queue,
        "signatures": signatures,
        "tenant": scope.tenant,
        "prefixes": None if scope.operator else list(scope.credential.prefixes),
    }
    answer = await remote.call(ops.ALERT.bind(body))
    names = [n for n in (scope.queue_name(q) for q in answer["suspended"]) if n is not None]
    return json_response({"suspended": names})


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
    ("GET", "/admin/v1/status", status),
    ("GET", "/admin/v1/events", events),
    ("POST", "/admin/v1/queues/{queue}/suspend", suspend),
    ("POST", "/admin/v1/queues/{queue}/resume", resume),
    ("DELETE", "/admin/v1/blacklist/{worker}", lift_blacklist),
    ("POST", "/admin/v1/alerts", alert),
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
