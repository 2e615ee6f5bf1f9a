"""Admin routes of the worker fleet (docs/fleet.md), beside failure management's:

- `GET /admin/v1/fleet`: workers (queues, version, capabilities, load, state, last heartbeat, stale?) with
  their pending controls, the rebalancing policies and the settings;
- `POST /admin/v1/fleet/control` `{"kind", "args"?, "workers": [...]}` or `{"kind", "args"?, "queue",
  "version"?}`, `"ttl"?`: a control message for each target worker, durable before the answer;
- `PUT /admin/v1/fleet/policies/{queue}` `{"min_active"?, "idle_heartbeats"?, "wake_backlog"?,
  "wake_age"?, "enabled"?}`, `DELETE /admin/v1/fleet/policies/{queue}`: a queue's rebalancing policy.

Scoped like every admin route (queue_core.scope): an `admin` sees and controls its tenant's workers and
queues only (another tenant's worker or queue is 404, as if it did not exist); an `operator` spans
tenants and names queues by their core name. Bad input is 400 naming the field (`details.field`).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES
from protocol.errors import RequestTooLarge

from .admin_http import errors_as_json, existing_queue, known_worker, scope_of
from .fleet import FleetAdmin
from .http_errors import json_response
from .machine import InvalidArgument, NotFound
from .machine.fleet import heartbeat_from_json
from .machine.rebalance import RebalancePolicy
from .operations import add_routes
from .scope import Scope

FLEET = web.AppKey("strictq_fleet", FleetAdmin)
MAX_BODY = 64 * 1024
MAX_TARGETS = 1000


class NoWorkers(NotFound):
    """A control addressed by queue (and version) that no live worker matches."""

    code = "no_workers"


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise RequestTooLarge(f"request body over {MAX_BODY} bytes")
    raw = await request.read()
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise InvalidArgument("send a JSON object", field="body")
    return data


def scope_rows(rows: list[dict[str, Any]], scope: Scope) -> list[dict[str, Any]]:
    """The fleet's rows (every tenant's, core names) cut to `scope`: its tenant's workers, queues named as
    it names them; the one rule, whether the registry is here or in a queue server behind the gateway."""
    shown = []
    for row in rows:
        if not scope.sees_worker(row["worker"]):
            continue
        row["queues"] = [n for n in (scope.queue_name(q) for q in row.get("queues", [])) if n is not None]
        for control in row["pending"]:
            queue = control.get("queue")
            control["queue"] = scope.queue_name(queue) if isinstance(queue, str) else None
        shown.append(row)
    return shown


async def fleet_document(fleet: FleetAdmin) -> dict[str, Any]:
    """`GET /admin/v1/fleet`'s answer for every tenant (core names): rows, policies, settings."""
    view, all_policies = await fleet.registry()
    policies = {queue: policy.to_dict() for queue, policy in sorted(all_policies.items())}
    return {"workers": view, "policies": policies, "settings": fleet.settings.to_dict()}


def scope_fleet(document: dict[str, Any], scope: Scope) -> dict[str, Any]:
    """`fleet_document` as `scope` sees it."""
    policies = {
        name: policy
        for queue, policy in document["policies"].items()
        if (name := scope.queue_name(queue)) is not None
    }
    return {
        "workers": scope_rows(document["workers"], scope),
        "policies": policies,
        "settings": document["settings"],
    }


@errors_as_json
async def list_fleet(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    return json_response(scope_fleet(await fleet_document(request.app[FLEET]), scope))


def control_targets(data: dict[str, Any]) -> tuple[list[str] | None, str | None, str | None]:
    """A control request's targets, checked: (worker ids, or None) or (None, the queue as the caller names
    it, a version or None); InvalidArgument naming the field otherwise."""
    for name in data:
        if name not in ("kind", "args", "workers", "queue", "version", "ttl"):
            raise InvalidArgument(f"unknown field {str(name)[:40]!r}", field=str(name)[:40])
    workers, queue = data.get("workers"), data.get("queue")
    if (workers is None) == (queue is None):
        raise InvalidArgument("name the targets: either `workers` (ids) or `queue`", field="workers")
    version = data.get("version")
    if version is not None and (not isinstance(version, str) or not version):
        raise InvalidArgument("version must be a non-empty string", field="version")
    if workers is not None:
        if version is not None:
            raise InvalidArgument("version narrows a `queue` target only", field="version")
        if (
            not isinstance(workers, list)
            or not workers
            or len(workers) > MAX_TARGETS
            or not all(isinstance(w, str) and w for w in workers)
        ):
            raise InvalidArgument(f"workers must be a list of 1-{MAX_TARGETS} worker ids", field="workers")
        return list(dict.fromkeys(workers)), None, None
    if not isinstance(queue, str) or not queue:
        raise InvalidArgument("queue must be a queue name", field="queue")
    return None, queue, version


def no_workers(queue: str, version: str | None) -> NoWorkers:
    what = f"queue {queue!r}" + (f" at version {version!r}" if version else "")
    return NoWorkers(f"no live worker of {what} is known", queue=queue)


@errors_as_json
async def control(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    fleet = request.app[FLEET]
    data = await _body(request)
    workers, queue, version = control_targets(data)
    internal: str | None = None
    if workers is not None:
        for worker in workers:
            known_worker(scope, worker)  # another tenant's worker: 404, as if it did not exist
        targets = workers
    else:
        assert queue is not None
        internal = await existing_queue(scope, fleet.backend, queue)
        targets = [w for w in await fleet.live_targets(internal, version) if scope.sees_worker(w)]
        if not targets:
            raise no_workers(queue, version)
    kind: Any = data.get("kind")  # checked, with args and ttl, in one place (machine.fleet.check_control)
    ttl: Any = data.get("ttl")
    issued = await fleet.issue(kind, data.get("args"), targets, ttl=ttl, queue=internal)
    shown = []
    for item in issued:
        row = item.to_dict()
        row["queue"] = queue if internal is not None else None
        shown.append(row)
    return json_response({"controls": shown})


@errors_as_json
async def put_policy(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    fleet = request.app[FLEET]
    name = request.match_info["queue"]
    queue = await existing_queue(scope, fleet.backend, name)
    policy = RebalancePolicy.from_dict(await _body(request))
    await fleet.set_policy(queue, policy)
    return json_response({"queue": name, "policy": policy.to_dict()})


@errors_as_json
async def delete_policy(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    fleet = request.app[FLEET]
    name = request.match_info["queue"]
    queue = await existing_queue(scope, fleet.backend, name)
    if queue not in (await fleet.registry())[1]:
        raise NotFound(f"queue {name!r} has no rebalancing policy", queue=name)
    await fleet.set_policy(queue, None)
    return json_response({"queue": name, "policy": None})


@errors_as_json
async def internal_heartbeat(request: web.Request) -> web.StreamResponse:
    """The queue server's internal API (no authentication, like the rest of it): a heartbeat a gateway
    forwards (queue_core.fleet_remote), `worker` and queues by their core names."""
    data = await _body(request)
    worker = data.pop("worker", None)
    if not isinstance(worker, str) or not worker:
        raise InvalidArgument("worker must be the worker's id", field="worker")
    answer = await request.app[FLEET].heartbeat(heartbeat_from_json(worker, data, _core_name))
    return json_response(answer.to_wire())


def _core_name(name: str) -> str:
    return name


def add_internal_heartbeat_route(app: web.Application) -> None:
    """The `fleet_heartbeat` operation on the queue server's internal API (after `add_fleet_routes`)."""
    add_routes(app, {"fleet_heartbeat": internal_heartbeat})


def add_fleet_routes(app: web.Application, fleet: FleetAdmin) -> None:
    """Serve the routes above from `app` (which already has the admin keys); the fleet lives as long as
    the app."""
    app[FLEET] = fleet
    app.router.add_get("/admin/v1/fleet", list_fleet)
    app.router.add_post("/admin/v1/fleet/control", control)
    app.router.add_put("/admin/v1/fleet/policies/{queue}", put_policy)
    app.router.add_delete("/admin/v1/fleet/policies/{queue}", delete_policy)

    async def start(app: web.Application) -> None:
        await fleet.start()

    async def close(app: web.Application) -> None:
        await fleet.close()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
