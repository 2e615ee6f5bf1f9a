"""A queue's processing-time estimates over HTTP (pipelining, docs/pipelining.md).

- `GET /admin/v1/queues/{queue}/estimates` and `PUT` with `processing_estimate` and/or
  `preprocessing_estimate` (seconds, 0 to 43200; 0: not given, the queue learns them from its workers'
  attempt results): what deliveries to workers declaring the `estimates` capability carry when the
  message has no estimate of its own (queue_core.machine.estimates). Roles and scoping as the protections
  route's (gateway.limits_http): `admin` (its tenant's queues, by their names; `?face=dedupq` for an EmoDB
  dedup queue) or `operator` (any queue, by its core name). A bad value is 400 naming the attribute.

Errors are the one JSON body of the admin routes (queue_core.admin_http).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from queue_core.admin_http import errors_as_json
from queue_core.backend import QueueBackend
from queue_core.http_errors import json_response
from queue_core.machine.errors import InvalidArgument

from .limits_http import _json_body, _queue

ESTIMATES = ("processing_estimate", "preprocessing_estimate")


def add_estimate_routes(app: web.Application) -> None:
    """After gateway.limits_http.add_limit_routes (it installs the admin keys these routes check)."""
    app.router.add_get("/admin/v1/queues/{queue}/estimates", get_estimates)
    app.router.add_put("/admin/v1/queues/{queue}/estimates", put_estimates)


async def _estimates(name: str, internal: str, service: QueueBackend) -> dict[str, Any]:
    attributes = await service.attributes(internal)
    return {"queue": name, **{setting: getattr(attributes, setting) for setting in ESTIMATES}}


@errors_as_json
async def get_estimates(request: web.Request) -> web.StreamResponse:
    name, internal, service = _queue(request)
    return json_response(await _estimates(name, internal, service))


@errors_as_json
async def put_estimates(request: web.Request) -> web.StreamResponse:
    name, internal, service = _queue(request)
    data = await _json_body(request, InvalidArgument)
    if not isinstance(data, dict) or not data or set(data) - set(ESTIMATES):
        raise InvalidArgument(f"send a JSON object of any of: {', '.join(ESTIMATES)} (seconds)")
    await service.set_attributes(internal, data)  # validated by the core, in the one place
    return json_response(await _estimates(name, internal, service))
