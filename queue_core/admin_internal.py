"""The queue server's admin state for the gateway in front of it (`strictq serve --queue-server URL`), on
its internal API: the whole control stream, the fences, failure management and the fleet, every tenant's,
by core names (routing has its own routes over the port: queue_core.routing_http).

No key file here, as for the rest of the internal API: the gateway authenticates its callers with its own
key ring and cuts every answer to their scope (queue_core.health_view, queue_core.fleet_remote), with
the same rules as the admin routes in one process. The worker ids are the gateway's key file's, so
nothing here checks them against the queue server's. The gateway's one client for all of it is
queue_core.remote.RemoteQueueService.

The operations (their methods and paths: queue_core.operations, the table's admin part): `control` (the
control stream, unscoped: docs/control-stream.md, what the gateway relays); `fences`, `put_fence`,
`delete_fence`; `failures` (the status document, every event and the probes out: who they are for),
`suspend`, `resume`, `unblacklist`, `alert` (`resumed`, `lifted`: whether there was one); `fleet`,
`fleet_targets`, `fleet_control`, `put_fleet_policy`, `delete_fleet_policy`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .admin_http import json_object_body, stream_events
from .control import ControlHub
from .failures import FailureManager
from .fleet import FleetService
from .fleet_http import fleet_document
from .health_view import Alert, LocalHealthView, probe_owners, tenant_reach
from .http_errors import json_response
from .machine import InvalidArgument, NotFound, QueueNotFound
from .machine.rebalance import RebalancePolicy
from .machine.text import INTEGER_RE
from .operations import Handler, add_routes

EDGE_EVENT_PREFIX = "rollout-"  # the events a gateway decides and failure management publishes
MAX_EVENT_NAME = 64

HUB = web.AppKey("strictq_internal_hub", ControlHub)
MANAGER = web.AppKey("strictq_internal_failures", FailureManager)
FLEET_SERVICE = web.AppKey("strictq_internal_fleet", FleetService)
MAX_BODY = 64 * 1024
HINT = "send a JSON object"


class NoFailureManagement(NotFound):
    """The queue server runs without failure management (`--no-health`): nothing of it to serve."""

    code = "no_failure_management"


async def _body(request: web.Request) -> dict[str, Any]:
    return await json_object_body(request, MAX_BODY, HINT)


def _text(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must be a non-empty string", field=name)
    return value


def _manager(request: web.Request) -> FailureManager:
    manager = request.app.get(MANAGER)
    if manager is None:
        raise NoFailureManagement("this queue server runs without failure management (--no-health)")
    return manager


def _queue(manager: FailureManager, name: str) -> str:
    if name not in manager.service.core.queues:
        raise QueueNotFound(f"queue {name!r} does not exist", queue=name)
    return name


# ------------------------------------------------------------------------------------------- control
async def control(request: web.Request) -> web.StreamResponse:
    return await stream_events(request, request.app[HUB], None)


async def fences(request: web.Request) -> web.StreamResponse:
    return json_response({"fences": [fence.to_dict() for fence in request.app[HUB].fences()]})


async def put_fence(request: web.Request) -> web.StreamResponse:
    data = await _body(request)
    mode: Any = data.get("mode")
    reason: Any = data.get("reason")
    fence = await request.app[HUB].fence(request.match_info["worker"], mode, reason, data.get("ttl"))
    return json_response(fence.to_dict())


async def delete_fence(request: web.Request) -> web.StreamResponse:
    reason = request.query.get("reason", "operator")
    fence = await request.app[HUB].unfence(request.match_info["worker"], reason)
    return json_response(fence.to_dict())


# -------------------------------------------------------------------------------- failure management
async def failures(request: web.Request) -> web.StreamResponse:
    """The status document (`events`: its latest), the events after `since` and the probes out."""
    manager = _manager(request)
    latest, since = request.query.get("events", "20"), request.query.get("since", "0")
    view = manager.status(latest=int(latest) if INTEGER_RE.fullmatch(latest) else 20)
    events = manager.events(int(since) if INTEGER_RE.fullmatch(since) else 0)
    body = {"view": view, "events": events, "probes": probe_owners(manager), "last": manager.last_event}
    return json_response(body)


async def suspend(request: web.Request) -> web.StreamResponse:
    manager = _manager(request)
    data = await _body(request)
    await LocalHealthView(manager).suspend(_queue(manager, _text(data, "queue")), _text(data, "reason"))
    return json_response({"suspended": True})


async def resume(request: web.Request) -> web.StreamResponse:
    manager = _manager(request)
    data = await _body(request)
    view = LocalHealthView(manager)
    resumed = await view.resume(_queue(manager, _text(data, "queue")), _text(data, "reason"))
    return json_response({"resumed": resumed})  # False: it was not suspended (the gateway names the queue)


async def unblacklist(request: web.Request) -> web.StreamResponse:
    manager = _manager(request)
    worker = _text(await _body(request), "worker")
    return json_response({"lifted": await LocalHealthView(manager).lift_blacklist(worker)})


async def alert(request: web.Request) -> web.StreamResponse:
    """An alert the gateway checked: `queue` (a core name) or `signatures`, `tenant` the caller's (None:
    an operator's), `prefixes` the caller's queue prefixes within its tenant (None: every queue)."""
    manager = _manager(request)
    data = await _body(request)
    queue = data.get("queue")
    if queue is not None:
        queue = _queue(manager, _text(data, "queue"))
    tenant, prefixes = data.get("tenant"), data.get("prefixes")
    if tenant is not None and not isinstance(tenant, str):
        raise InvalidArgument("tenant must be a string", field="tenant")
    if prefixes is not None and not (
        isinstance(prefixes, list) and all(isinstance(p, str) for p in prefixes)
    ):
        raise InvalidArgument("prefixes must be a list of strings", field="prefixes")

    def within(name: str) -> bool:
        return tenant_reach(tenant, prefixes, name)

    signatures = [str(s) for s in data.get("signatures") or []]
    asked = Alert(_text(data, "reason"), queue, signatures)
    view = LocalHealthView(manager)
    suspended = await view.alert_within(asked, None if tenant is None else within, tenant)
    return json_response({"suspended": suspended})


# --------------------------------------------------------------------------------------------- fleet
async def record_event(request: web.Request) -> web.StreamResponse:
    """An event the gateway decided (a rollout's step: queue_core.routing_http), published beside failure
    management's own; only the kinds an edge decides, so the caller cannot pass for the monitor."""
    manager = _manager(request)
    data = await _body(request)
    event, reason, queue = _text(data, "event"), _text(data, "reason"), _text(data, "queue")
    if not event.startswith(EDGE_EVENT_PREFIX) or len(event) > MAX_EVENT_NAME:
        raise InvalidArgument(f"an edge records only {EDGE_EVENT_PREFIX}* events", field="event")
    await LocalHealthView(manager).record(event, reason, _queue(manager, queue))
    return json_response({"recorded": True})


async def fleet(request: web.Request) -> web.StreamResponse:
    return json_response(await fleet_document(request.app[FLEET_SERVICE]))


async def fleet_targets(request: web.Request) -> web.StreamResponse:
    data = await _body(request)
    version = data.get("version")
    targets = request.app[FLEET_SERVICE].targets(
        _text(data, "queue"), version if isinstance(version, str) else None
    )
    return json_response({"workers": targets})


async def fleet_control(request: web.Request) -> web.StreamResponse:
    """Controls for `workers` the gateway checked; `queue`: the core queue they were addressed by."""
    data = await _body(request)
    workers = data.get("workers")
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise InvalidArgument("workers must be a list of worker ids", field="workers")
    queue = data.get("queue")
    kind: Any = data.get("kind")
    ttl: Any = data.get("ttl")
    issued = await request.app[FLEET_SERVICE].issue(
        kind, data.get("args"), workers, ttl=ttl, queue=queue if isinstance(queue, str) else None
    )
    return json_response({"controls": [item.to_dict() for item in issued]})


async def put_policy(request: web.Request) -> web.StreamResponse:
    policy = RebalancePolicy.from_dict(await _body(request))
    await request.app[FLEET_SERVICE].set_policy(request.match_info["queue"], policy)
    return json_response({"policy": policy.to_dict()})


async def delete_policy(request: web.Request) -> web.StreamResponse:
    service = request.app[FLEET_SERVICE]
    queue = request.match_info["queue"]
    if queue not in service.fleet.policies:
        return json_response({"deleted": False})  # the gateway names the queue as its caller does
    await service.set_policy(queue, None)
    return json_response({"deleted": True})


# The handlers of the admin state's operations (queue_core.operations: their methods and paths).
HANDLERS: dict[str, Handler] = {
    "control": control,
    "fences": fences,
    "put_fence": put_fence,
    "delete_fence": delete_fence,
    "failures": failures,
    "suspend": suspend,
    "resume": resume,
    "unblacklist": unblacklist,
    "alert": alert,
    "record_event": record_event,
    "fleet": fleet,
    "fleet_targets": fleet_targets,
    "fleet_control": fleet_control,
    "put_fleet_policy": put_policy,
    "delete_fleet_policy": delete_policy,
}


def add_internal_admin_routes(
    app: web.Application, hub: ControlHub, manager: FailureManager | None, fleet_service: FleetService
) -> None:
    """Serve the routes above from the queue server's internal app (whose middleware renders errors as
    JSON); the hub, the manager and the fleet are started and closed by their admin routes' mounting."""
    app[HUB] = hub
    if manager is not None:
        app[MANAGER] = manager
    app[FLEET_SERVICE] = fleet_service
    add_routes(app, HANDLERS)
