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

These handlers are the only ones, in every topology: they read and change failure management through its
port (queue_core.health_view.HealthView), whether it runs in this process, in the queue server behind
`--queue-server` or as a cluster's decider; the edge mounts them with the view its root composed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES
from protocol.errors import RequestTooLarge, StrictqError

from .admin_http import errors_as_json, scope_of
from .fences import MAX_REASON
from .health_view import Alert, HealthView, scoped_events
from .http_errors import json_response
from .machine.text import INTEGER_RE

HEALTH: web.AppKey[HealthView] = web.AppKey("strictq_health")
MAX_BODY = 64 * 1024
MAX_SIGNATURES = 100


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
def _view(request: web.Request) -> HealthView:
    return request.app[HEALTH]


def _face(request: web.Request) -> str:
    return request.query.get("face", "queue")  # `dedupq`: an EmoDB dedup queue, as the other admin routes


@errors_as_json
async def status(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    return json_response(await _view(request).status(scope, _int_query(request, "events", 20)))


@errors_as_json
async def events(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    limit = _int_query(request, "limit", 1000)
    page = await _view(request).events(_int_query(request, "since", 0))
    # Scoped before the limit: another tenant's busy hour must not push this tenant's events out.
    shown = scoped_events(scope, page.events)
    return json_response({"events": shown[-limit:] if limit > 0 else [], "last": page.last})


@errors_as_json
async def suspend(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    view = _view(request)
    name = request.match_info["queue"]
    queue = await view.queue(scope, name, _face(request))
    reason = _text(await _body(request), "reason", None)
    await view.suspend(queue, f"operator: {reason}")
    return json_response({"queue": name, "suspended": True, "reason": reason})


@errors_as_json
async def resume(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    view = _view(request)
    name = request.match_info["queue"]
    queue = await view.queue(scope, name, _face(request))
    reason = _text(await _body(request), "reason", "operator")
    if not await view.resume(queue, reason):
        raise NotSuspended(f"queue {name!r} is not suspended")
    return json_response({"queue": name, "resumed": True})


@errors_as_json
async def lift_blacklist(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    if not scope.sees_worker(worker) or not await _view(request).lift_blacklist(worker):
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
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


@errors_as_json
async def alert(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    view = _view(request)
    asked = alert_request(await _body(request))
    queue = None if asked.queue is None else await view.queue(scope, asked.queue, "queue")
    # A tenant's alert by signature suspends only the tenant's queues (an operator's: any tenant's).
    suspended = await view.alert(scope, Alert(asked.reason, queue, asked.signatures))
    names = [n for n in (scope.queue_name(q) for q in suspended) if n is not None]
    return json_response({"suspended": names})


# ------------------------------------------------------------------------------------------ mounting
def add_health_routes(app: web.Application, view: HealthView) -> None:
    """Serve the routes above from `app` (which already has the admin keys) over `view`: failure
    management wherever it runs (its life is its owner's: the manager's is tied to the app by
    queue_core.admin_routes)."""
    app[HEALTH] = view
    app.router.add_get("/admin/v1/status", status)
    app.router.add_get("/admin/v1/events", events)
    app.router.add_post("/admin/v1/queues/{queue}/suspend", suspend)
    app.router.add_post("/admin/v1/queues/{queue}/resume", resume)
    app.router.add_delete("/admin/v1/blacklist/{worker}", lift_blacklist)
    app.router.add_post("/admin/v1/alerts", alert)
