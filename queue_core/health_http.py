"""Admin routes of failure management (docs/failure-management.md §3), beside the fence API.

- `GET /admin/v1/status`: workers (state, failures in the window, fence, blacklist), queues (suspended,
  parked groups), the latest events, counts and settings;
- `GET /admin/v1/events?since=N&limit=M`: events numbered after N (each event carries its number `n`);
- `POST /admin/v1/queues/{queue}/suspend` `{"reason": "..."}`, `POST /admin/v1/queues/{queue}/resume`;
- `DELETE /admin/v1/blacklist/{worker}`: lift a blacklist early (the worker is probed again);
- `POST /admin/v1/alerts` `{"reason", "queue"?, "signatures"?}`: a known-error-case alert, as the wire
  log's `event: alert` records deliver them.

Queues are named as the admin's tenant sees them (`orders`, not `t1.orders`), and an admin sees only its
tenant's queues and workers (workers the key file does not know are shown to every admin). Reads accept
the `proxy` and `admin` roles, changes `admin` only, as for fences.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.keys import Credential, KeyRing

from .admin_http import ADMIN_KEYS, READ_ROLES, WRITE_ROLES, authenticate, error_response, json_response
from .failures import FailureManager
from .fences import MAX_REASON
from .machine import QueueNotFound

FAILURES = web.AppKey("strictq_failures", FailureManager)
MAX_BODY = 64 * 1024
MAX_SIGNATURES = 100
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HealthRequestError(Exception):
    """A refused request; `status` and `code` go into the JSON answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _errors_as_json(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (web.HTTPException, ConnectionError):
            raise
        except HealthRequestError as exc:
            return json_response({"code": exc.code, "message": str(exc)}, exc.status)
        except QueueNotFound as exc:
            return json_response({"code": "unknown-queue", "message": str(exc)}, 404)
        except Exception as exc:
            return error_response(exc)

    return wrapped


# ------------------------------------------------------------------------------------------- tenancy
def _internal_queue(manager: FailureManager, admin: Credential, name: str) -> str:
    """The core's name of a queue the admin names (its tenant's), or 404."""
    from gateway.tenancy import internal_name

    queues = manager.service.core.queues
    internal = internal_name(admin, name)
    if internal not in queues and "." not in name and name in queues:
        return name  # a queue of the internal API used without tenants (no tenant's name has no '.')
    return internal


def _visible_queue(admin: Credential, name: Any) -> str | None:
    """The admin's name for a core queue, or None when it is another tenant's."""
    if not isinstance(name, str):
        return None
    tenant, dot, rest = name.partition(".")
    if not dot:
        return name
    return rest if tenant == admin.tenant else None


def _visible_worker(keys: KeyRing, admin: Credential, worker: Any) -> bool:
    if not isinstance(worker, str):
        return True
    credential = keys.by_id(worker)
    return credential is None or credential.tenant == admin.tenant


def _visible_event(keys: KeyRing, admin: Credential, event: dict[str, Any]) -> dict[str, Any] | None:
    shown = dict(event)
    if "queue" in event:
        queue = _visible_queue(admin, event["queue"])
        if queue is None:
            return None
        shown["queue"] = queue
    if not _visible_worker(keys, admin, event.get("worker")):
        return None
    return shown


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise HealthRequestError(400, "too-large", f"request body over {MAX_BODY} bytes")
    raw = await request.read()
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HealthRequestError(400, "bad-json", f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HealthRequestError(400, "bad-json", "send a JSON object")
    return data


def _text(data: dict[str, Any], name: str, default: str | None) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_REASON:
        raise HealthRequestError(400, f"bad-{name}", f"{name} must be 1-{MAX_REASON} characters")
    return value


def _int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HealthRequestError(400, f"bad-{name}", f"{name} must be an integer") from None
    if value < 0:
        raise HealthRequestError(400, f"bad-{name}", f"{name} must be >= 0")
    return value


# ------------------------------------------------------------------------------------------ handlers
@_errors_as_json
async def status(request: web.Request) -> web.StreamResponse:
    admin = authenticate(request, READ_ROLES)
    keys = request.app[ADMIN_KEYS]
    view = request.app[FAILURES].status(latest=_int_query(request, "events", 20))
    view["workers"] = [w for w in view["workers"] if _visible_worker(keys, admin, w["worker"])]
    view["operator_fences"] = [
        f for f in view["operator_fences"] if _visible_worker(keys, admin, f["worker"])
    ]
    queues = []
    for queue in view["queues"]:
        name = _visible_queue(admin, queue["queue"])
        if name is not None:
            queues.append({**queue, "queue": name})
    view["queues"] = queues
    for worker in view["workers"]:
        worker["queue"] = _visible_queue(admin, worker["queue"]) if worker["queue"] else None
    view["events"] = [e for e in (_visible_event(keys, admin, e) for e in view["events"]) if e is not None]
    return json_response(view)


@_errors_as_json
async def events(request: web.Request) -> web.StreamResponse:
    admin = authenticate(request, READ_ROLES)
    keys = request.app[ADMIN_KEYS]
    manager = request.app[FAILURES]
    found = manager.events(_int_query(request, "since", 0), _int_query(request, "limit", 1000))
    shown = [e for e in (_visible_event(keys, admin, e) for e in found) if e is not None]
    return json_response({"events": shown, "last": manager.last_event})


@_errors_as_json
async def suspend(request: web.Request) -> web.StreamResponse:
    admin = authenticate(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    queue = _internal_queue(manager, admin, name)
    reason = _text(await _body(request), "reason", None)
    manager.suspend(queue, f"operator: {reason}")
    return json_response({"queue": name, "suspended": True, "reason": reason})


@_errors_as_json
async def resume(request: web.Request) -> web.StreamResponse:
    admin = authenticate(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    queue = _internal_queue(manager, admin, name)
    reason = _text(await _body(request), "reason", "operator")
    if not manager.resume(queue, reason):
        raise HealthRequestError(404, "not-suspended", f"queue {name!r} is not suspended")
    return json_response({"queue": name, "resumed": True})


@_errors_as_json
async def lift_blacklist(request: web.Request) -> web.StreamResponse:
    admin = authenticate(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    if not _visible_worker(request.app[ADMIN_KEYS], admin, worker):
        raise HealthRequestError(404, "not-blacklisted", f"worker {worker!r} is not blacklisted")
    if not request.app[FAILURES].lift_blacklist(worker, "operator"):
        raise HealthRequestError(404, "not-blacklisted", f"worker {worker!r} is not blacklisted")
    return json_response({"worker": worker, "lifted": True})


@_errors_as_json
async def alert(request: web.Request) -> web.StreamResponse:
    admin = authenticate(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    data = await _body(request)
    reason = _text(data, "reason", None)
    queue = data.get("queue")
    if queue is not None:
        if not isinstance(queue, str):
            raise HealthRequestError(400, "bad-queue", "queue must be a queue name")
        queue = _internal_queue(manager, admin, queue)
        if queue not in manager.service.core.queues:
            raise QueueNotFound(f"queue {data['queue']!r} does not exist", queue=data["queue"])
    signatures = data.get("signatures", [])
    if (
        not isinstance(signatures, list)
        or len(signatures) > MAX_SIGNATURES
        or not all(isinstance(s, str) and s for s in signatures)
    ):
        raise HealthRequestError(400, "bad-signatures", f"signatures must be up to {MAX_SIGNATURES} strings")
    if queue is None and not signatures:
        raise HealthRequestError(400, "bad-alert", "name a queue or give signatures (exact or glob)")
    suspended = manager.alert(reason, queue=queue, signatures=signatures)
    names = [n for n in (_visible_queue(admin, q) for q in suspended) if n is not None]
    return json_response({"suspended": names})


# ------------------------------------------------------------------------------------------ mounting
def add_health_routes(app: web.Application, manager: FailureManager) -> None:
    """Serve the routes above from `app` (which already has the admin keys); the manager lives as long
    as the app: started after the control hub, closed before it."""
    app[FAILURES] = manager
    app.router.add_get("/admin/v1/status", status)
    app.router.add_get("/admin/v1/events", events)
    app.router.add_post("/admin/v1/queues/{queue}/suspend", suspend)
    app.router.add_post("/admin/v1/queues/{queue}/resume", resume)
    app.router.add_delete("/admin/v1/blacklist/{worker}", lift_blacklist)
    app.router.add_post("/admin/v1/alerts", alert)
