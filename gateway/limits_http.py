"""Admission of sends at the edge over HTTP: the faces' calls (`check_sends`: the tenant's rate,
gateway.rate_limits; `check_backlog`: the queue's backpressure, gateway.backpressure), and the admin routes
that read and change the per-tenant limits at run time.

- `GET /admin/v1/limits`: an `admin` key sees its tenant's limit and counters, an `operator` key every
  tenant of the key file and the default;
- `PUT /admin/v1/limits/{tenant}` with `{"rate": R, "burst": B}` (burst optional; `{"rate": null}`:
  unlimited) and `DELETE /admin/v1/limits/{tenant}` (back to the default): an `operator` key, or the
  `admin` key of a key file with one tenant (access.permissions.sets_limits): with several tenants a
  tenant's admin must not raise its own limit.

- `GET /admin/v1/queues/{queue}/protections` and `PUT` with any of the queue attributes
  `backpressure_age`, `backpressure_depth` (0 turns a threshold off), `ttl` (0: off) and `on_expiry`
  (`drop` | `dead_letter`), and the fairness settings of a queue shared by tenants (`tenant_separator`,
  `tenant_concurrency`, `group_in_flight`, `worker_pools`, `pools_per_tenant`, `sideline_age`,
  `sideline_rate`): a queue's protections (docs/protections.md), its backlog now, the share of sends
  admitted, the sends this edge refused and the messages expired or sidelined; `admin` (its tenant's
  queues, by their names; `?face=dedupq` for an EmoDB dedup queue) or `operator` (any queue, by its core
  name).

Errors are the one JSON body of the admin routes (queue_core.admin_http).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from access.keys import KeyRing
from access.permissions import READ_ROLES, WRITE_ROLES, sets_limits, spans_tenants, tenants_of
from protocol.errors import Forbidden, RequestTooLarge, StrictqError
from queue_core.admin_http import ADMIN_KEYS, authenticate, errors_as_json
from queue_core.backend import QueueBackend
from queue_core.http_errors import json_response
from queue_core.machine.attributes import SCHEDULING_FIELDS, QueueAttributes
from queue_core.machine.errors import InvalidArgument
from queue_core.scope import internal_name

from .app_keys import BACKPRESSURE, LIMITER, ROUTER
from .backpressure import BackpressureGate, pressure
from .rate_limits import InvalidLimit, TenantLimit, TenantRateLimiter, UnknownTenant

MAX_LIMIT_BODY = 4096


def check_sends(request: web.Request, tenant: str, messages: int) -> None:
    """Admit `messages` sends of `tenant` now, or raise Throttled (rendered by each face)."""
    request.app[LIMITER].check(tenant, messages, time.monotonic())


async def check_backlog(
    request: web.Request, service: QueueBackend, queue: str, visible: str, attributes: QueueAttributes
) -> None:
    """Admit a send to `queue` (the core's name; `visible`: the caller's) or raise BackpressureRefused
    when its backlog is past its thresholds; its metrics are read at most once a second."""
    gate = request.app[BACKPRESSURE]
    now = time.monotonic()
    if gate.wants_metrics(queue, attributes, now):
        gate.update(queue, await service.metrics(queue), now)
    gate.admit(queue, visible, attributes)


def add_limit_routes(app: web.Application, limiter: TenantRateLimiter, keys: KeyRing) -> None:
    app[LIMITER] = limiter
    app[BACKPRESSURE] = BackpressureGate()
    if ADMIN_KEYS not in app:
        app[ADMIN_KEYS] = keys
    app.router.add_get("/admin/v1/limits", list_limits)
    app.router.add_put("/admin/v1/limits/{tenant}", put_limit)
    app.router.add_delete("/admin/v1/limits/{tenant}", delete_limit)
    app.router.add_get("/admin/v1/queues/{queue}/protections", get_protections)
    app.router.add_put("/admin/v1/queues/{queue}/protections", put_protections)


async def _json_body(request: web.Request, invalid: type[StrictqError]) -> Any:
    """The request's small JSON body (None when empty); `invalid` (400) when it is not JSON."""
    if request.content_length is not None and request.content_length > MAX_LIMIT_BODY:
        raise RequestTooLarge(f"request body over {MAX_LIMIT_BODY} bytes")
    raw = await request.read()
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise invalid(f"request body is not valid JSON: {exc}") from None


def _tenant(request: web.Request) -> str:
    """The path's tenant, which must be one the key file serves (404 otherwise), if the caller may change
    limits (403 otherwise)."""
    credential = authenticate(request, WRITE_ROLES)
    if not sets_limits(credential, request.app[ADMIN_KEYS].credentials):
        raise Forbidden(
            f"credential {credential.id!r} (role {credential.role}) may not change send limits: an operator "
            "key may (a tenant's admin may only where the key file serves that one tenant)"
        )
    tenant = request.match_info["tenant"]
    if tenant not in tenants_of(request.app[ADMIN_KEYS].credentials):
        raise UnknownTenant(f"no tenant {tenant!r} in the key file")
    return tenant


@errors_as_json
async def list_limits(request: web.Request) -> web.StreamResponse:
    credential = authenticate(request, READ_ROLES)
    limiter = request.app[LIMITER]
    if spans_tenants(credential):
        tenants = sorted(tenants_of(request.app[ADMIN_KEYS].credentials) | set(limiter.overrides))
    else:
        tenants = [credential.tenant]
    default = None if limiter.default is None else limiter.default.to_dict()
    return json_response({"default": default, "tenants": [limiter.describe(t) for t in tenants]})


@errors_as_json
async def put_limit(request: web.Request) -> web.StreamResponse:
    tenant = _tenant(request)
    data = await _json_body(request, InvalidLimit)
    if not isinstance(data, dict) or "rate" not in data or set(data) - {"rate", "burst"}:
        example = '{"rate": <messages/s>, "burst": <messages>} or {"rate": null}'
        raise InvalidLimit(f"send a JSON object: {example}")
    limiter = request.app[LIMITER]
    if data["rate"] is None:
        if data.get("burst") is not None:
            raise InvalidLimit('an unlimited tenant ({"rate": null}) has no burst')
        await limiter.update(tenant, None)
    else:
        await limiter.update(tenant, TenantLimit.parse(data["rate"], data.get("burst")))
    return json_response(limiter.describe(tenant))


@errors_as_json
async def delete_limit(request: web.Request) -> web.StreamResponse:
    tenant = _tenant(request)
    limiter = request.app[LIMITER]
    await limiter.reset(tenant)
    return json_response(limiter.describe(tenant))


def _queue(request: web.Request) -> tuple[str, str, QueueBackend]:
    """(the caller's name, the core's name, the backend holding it) of the path's queue; another tenant's
    queue is 404 like one that does not exist."""
    credential = authenticate(request, WRITE_ROLES)
    name = request.match_info["queue"]
    internal = (
        name
        if spans_tenants(credential)
        else internal_name(credential, name, request.query.get("face", "queue"))
    )
    return name, internal, request.app[ROUTER].for_queue(internal)


PROTECTIONS = ("backpressure_age", "backpressure_depth", "ttl", "on_expiry", *SCHEDULING_FIELDS)


async def _protections(
    request: web.Request, name: str, internal: str, service: QueueBackend
) -> dict[str, Any]:
    attributes = await service.attributes(internal)
    metrics = await service.metrics(internal)
    push = pressure(attributes, metrics)
    return {
        "queue": name,
        **{setting: getattr(attributes, setting) for setting in PROTECTIONS},
        "dead_letter_queue": attributes.dead_letter_queue,
        "oldest_age": round(metrics.oldest_age, 3),
        "messages": metrics.total,
        "admitted_share": round(push.share, 3),
        "why": push.reason,
        "refused": request.app[BACKPRESSURE].refused(internal),
        "expired": metrics.expired,
        "sidelined": metrics.sidelined,
    }


@errors_as_json
async def get_protections(request: web.Request) -> web.StreamResponse:
    name, internal, service = _queue(request)
    return json_response(await _protections(request, name, internal, service))


@errors_as_json
async def put_protections(request: web.Request) -> web.StreamResponse:
    name, internal, service = _queue(request)
    data = await _json_body(request, InvalidArgument)
    if not isinstance(data, dict) or not data or set(data) - set(PROTECTIONS):
        raise InvalidArgument(f"send a JSON object of any of: {', '.join(PROTECTIONS)}")
    await service.set_attributes(internal, data)  # validated by the core, in the one place
    request.app[BACKPRESSURE].forget(internal)  # new thresholds apply to the next send
    return json_response(await _protections(request, name, internal, service))
