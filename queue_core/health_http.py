"""Admin routes of failure management (docs/failure-management.md §3), beside the fence API.

- `GET /admin/v1/status`: workers (state, failures in the window, fence, blacklist), queues (suspended,
  parked groups), the latest events, counts and settings;
- `GET /admin/v1/events?since=N&limit=M`: events numbered after N (each event carries its number `n`);
- `POST /admin/v1/queues/{queue}/suspend` `{"reason": "..."}`, `POST /admin/v1/queues/{queue}/resume`;
- `DELETE /admin/v1/blacklist/{worker}`: lift a blacklist early (the worker is probed again);
- `POST /admin/v1/alerts` `{"reason", "queue"?, "signatures"?}`: a known-error-case alert, as the wire
  log's `event: alert` records deliver them.

Every answer is within the caller's scope (queue_core.scope): an admin sees and changes only its tenant's
queues (named as the tenant sees them, `orders`, not `t1.orders`), workers and events, and an alert by
signature suspends only its tenant's queues; an `operator` spans tenants and uses core names. Another
tenant's queue or worker is 404, as if it did not exist. Reads and changes take `admin` or `operator`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES
from protocol.errors import RequestTooLarge, StrictqError

from .admin_http import error_response, scope_of
from .failures import FailureManager
from .fences import MAX_REASON
from .http_errors import json_response
from .machine.text import INTEGER_RE
from .scope import Scope

FAILURES = web.AppKey("strictq_failures", FailureManager)
MAX_BODY = 64 * 1024
MAX_SIGNATURES = 100
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HealthRequestError(StrictqError):
    """A refused request: 400 with a code naming what was wrong (`bad_reason`, `bad_json`, ...)."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NotSuspended(HealthRequestError):
    status = 404
    code = "not_suspended"


class NotBlacklisted(HealthRequestError):
    status = 404
    code = "not_blacklisted"


def _errors_as_json(handler: Handler) -> Handler:
    """Every error of these routes as the one JSON body, with the status it carries (docs/errors.md)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (web.HTTPException, ConnectionError):
            raise
        except Exception as exc:
            return error_response(exc)

    return wrapped


# ------------------------------------------------------------------------------------------- tenancy
def _internal_queue(manager: FailureManager, scope: Scope, name: str) -> str:
    """The core's name of an existing queue the caller names (its tenant's), or 404."""
    return scope.internal_queue(name, manager.service.core.queues)


def scoped_events(scope: Scope, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failure-management events `scope` sees, renamed as it names queues."""
    return [e for e in (scope.event(event) for event in events) if e is not None]


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise RequestTooLarge(f"request body over {MAX_BODY} bytes")
    raw = await request.read()
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HealthRequestError(f"request body is not valid JSON: {exc}", "bad_json") from None
    if not isinstance(data, dict):
        raise HealthRequestError("send a JSON object", "bad_json")
    return data


def _text(data: dict[str, Any], name: str, default: str | None) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_REASON:
        raise HealthRequestError(f"{name} must be 1-{MAX_REASON} characters", f"bad_{name}")
    return value


def _int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not INTEGER_RE.fullmatch(raw):  # plain ASCII digits: int() also takes '٣', '1_0' and ' 5'
        raise HealthRequestError(f"{name} must be an integer in plain digits", f"bad_{name}")
    value = int(raw)
    if value < 0:
        raise HealthRequestError(f"{name} must be >= 0", f"bad_{name}")
    return value


# ------------------------------------------------------------------------------------------ handlers
def scoped_status(manager: FailureManager, scope: Scope, latest: int = 20) -> dict[str, Any]:
    """`GET /admin/v1/status`'s document as the caller sees it (also the operator's dashboard's): its
    tenant's workers, fences, queues (named as it names them), events, counts and probes."""
    return scope_status(manager.status(latest=latest), manager.events(), probe_owners(manager), scope, latest)


def probe_owners(manager: FailureManager) -> list[dict[str, str | None]]:
    """The queue and worker of every probe out (what a scope counts its own probes by)."""
    return [{"queue": probe.queue, "worker": probe.worker} for probe in manager.monitor.probes.values()]


def scope_status(
    view: dict[str, Any],
    events: list[dict[str, Any]],
    probes: list[dict[str, str | None]],
    scope: Scope,
    latest: int = 20,
) -> dict[str, Any]:
    """The status document `view` (FailureManager.status, every tenant's) cut to `scope`, with the tenant's
    own latest events and counts out of `events` (all of them) and its probes out of `probes`: the one
    rule, whether the manager runs in this process or in a queue server behind the gateway."""
    if scope.operator:
        return view
    view["workers"] = [w for w in view["workers"] if scope.sees_worker(w["worker"])]
    view["operator_fences"] = [f for f in view["operator_fences"] if scope.sees_worker(f["worker"])]
    queues = []
    for queue in view["queues"]:
        name = scope.queue_name(queue["queue"])
        if name is not None:
            queues.append({**queue, "queue": name})
    view["queues"] = queues
    for worker in view["workers"]:
        worker["queue"] = scope.queue_name(worker["queue"]) if worker["queue"] else None
    # The tenant's own events, counts and probes only: the server-wide ones tell of other tenants.
    mine = scoped_events(scope, events)
    view["events"] = mine[-latest:] if latest > 0 else []
    view["counts"] = dict(Counter(e["event"] for e in mine))
    view["probes"] = sum(
        1
        for probe in probes
        if isinstance(queue := probe.get("queue"), str)
        and scope.sees_queue(queue)
        and ((worker := probe.get("worker")) is None or scope.sees_worker(worker))
    )
    return view


@_errors_as_json
async def status(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    return json_response(scoped_status(request.app[FAILURES], scope, _int_query(request, "events", 20)))


@_errors_as_json
async def events(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    manager = request.app[FAILURES]
    limit = _int_query(request, "limit", 1000)
    # Scoped before the limit: another tenant's busy hour must not push this tenant's events out.
    shown = scoped_events(scope, manager.events(_int_query(request, "since", 0)))
    return json_response({"events": shown[-limit:] if limit > 0 else [], "last": manager.last_event})


@_errors_as_json
async def suspend(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    queue = _internal_queue(manager, scope, name)
    reason = _text(await _body(request), "reason", None)
    manager.suspend(queue, f"operator: {reason}")
    await manager.settled()  # in the store before the answer
    return json_response({"queue": name, "suspended": True, "reason": reason})


@_errors_as_json
async def resume(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    queue = _internal_queue(manager, scope, name)
    reason = _text(await _body(request), "reason", "operator")
    if not manager.resume(queue, reason):
        raise NotSuspended(f"queue {name!r} is not suspended")
    await manager.settled()
    return json_response({"queue": name, "resumed": True})


@_errors_as_json
async def lift_blacklist(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    if not scope.sees_worker(worker):
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
    if not request.app[FAILURES].lift_blacklist(worker, "operator"):
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
    await request.app[FAILURES].settled()
    return json_response({"worker": worker, "lifted": True})


@dataclass(frozen=True, slots=True)
class AlertRequest:
    """`POST /admin/v1/alerts`' body, checked: the reason, the queue (as the caller named it) or None,
    the signatures (exact or glob)."""

    reason: str
    queue: str | None
    signatures: list[str]


def alert_request(data: dict[str, Any]) -> AlertRequest:
    """The one check of an alert's body, wherever failure management runs (here, behind a queue server,
    a cluster's decider): HealthRequestError naming what is wrong."""
    reason = _text(data, "reason", None)
    queue = data.get("queue")
    if queue is not None and not isinstance(queue, str):
        raise HealthRequestError("queue must be a queue name", "bad_queue")
    signatures = data.get("signatures", [])
    if (
        not isinstance(signatures, list)
        or len(signatures) > MAX_SIGNATURES
        or not all(isinstance(s, str) and s for s in signatures)
    ):
        raise HealthRequestError(f"signatures must be up to {MAX_SIGNATURES} strings", "bad_signatures")
    if queue is None and not signatures:
        raise HealthRequestError("name a queue or give signatures (exact or glob)", "bad_alert")
    return AlertRequest(reason, queue, list(signatures))


@_errors_as_json
async def alert(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    asked = alert_request(await _body(request))
    reason, signatures = asked.reason, asked.signatures
    queue = None if asked.queue is None else _internal_queue(manager, scope, asked.queue)
    # A tenant's alert by signature suspends only the tenant's queues (an operator's: any tenant's).
    within = None if scope.operator else scope.sees_queue
    suspended = manager.alert(reason, queue=queue, signatures=signatures, within=within, tenant=scope.tenant)
    names = [n for n in (scope.queue_name(q) for q in suspended) if n is not None]
    await manager.settled()
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
