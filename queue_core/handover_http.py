"""Admin routes of state transfer (docs/state-transfer.md), beside the retry workflow's:

- `POST /admin/v1/queues/{queue}/handover` `{"from": "<worker>", "groups": ["g1", ...] | "all"[, "policy":
  "proceed" | "wait"]}`: move the groups away from the worker, with their local state (QueueCore.hand_over);
  answers `{"queue", "from", "groups": [marked], "already": [already moving]}`;
- `POST /admin/v1/queues/{queue}/handover/release` `{"groups": [...]}`: let held groups go on without their
  state (the `wait` policy's way out); answers `{"queue", "released": [...]}`;
- `GET /admin/v1/queues/{queue}/handover`: the groups in handover now (phase, donor, deadline, state size),
  by group name.

Queues are named as for the retry routes (queue_core.scope: the admin's tenant, `?face=dedupq`, an
operator's core names); another tenant's queue is 404. Changes take the `admin` or `operator` role, reads
those or the read roles. Errors: `admin_http.error_response`, the one mapping of the admin routes. Like the
retry routes, they depend on the port only (queue_core.backend), so every gateway serves them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES

from .admin_http import errors_as_json, json_object_body, queue_in_path
from .backend import QueueBackend
from .http_errors import json_response
from .machine import InvalidArgument

HANDOVER_SERVICE = web.AppKey("strictq_handover_backend", QueueBackend)
MAX_BODY = 256 * 1024  # up to 1000 group names


async def _body(request: web.Request) -> dict[str, Any]:
    return await json_object_body(
        request, MAX_BODY, 'send a JSON object, e.g. {"from": "worker-1", "groups": ["g1"]}'
    )


async def _queue(request: web.Request, roles: tuple[str, ...]) -> tuple[str, str]:
    return await queue_in_path(request, request.app[HANDOVER_SERVICE], roles)


def _groups(data: dict[str, Any], all_allowed: bool) -> list[str] | None:
    groups = data.get("groups")
    if all_allowed and groups == "all":
        return None
    if not isinstance(groups, list) or not groups or not all(isinstance(g, str) and g for g in groups):
        hint = ' or "all"' if all_allowed else ""
        raise InvalidArgument(f"groups must be a non-empty list of group names{hint}", field="groups")
    return groups


@errors_as_json
async def start_handover(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, WRITE_ROLES)
    data = await _body(request)
    donor = data.get("from")
    if not isinstance(donor, str) or not donor:
        raise InvalidArgument("from must name the worker the groups move away from", field="from")
    policy = data.get("policy")
    groups = _groups(data, all_allowed=True)
    if policy not in (None, "proceed", "wait"):
        raise InvalidArgument("policy must be 'proceed' or 'wait'", field="policy")
    marked, already = await request.app[HANDOVER_SERVICE].hand_over(
        queue, groups, donor, "wait" if policy == "wait" else "proceed" if policy else None
    )
    return json_response({"queue": name, "from": donor, "groups": marked, "already": already})


@errors_as_json
async def release_handover(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, WRITE_ROLES)
    groups = _groups(await _body(request), all_allowed=False)
    assert groups is not None
    released = await request.app[HANDOVER_SERVICE].release_handover(queue, groups)
    return json_response({"queue": name, "released": released})


@errors_as_json
async def list_handovers(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, READ_ROLES)
    rows = await request.app[HANDOVER_SERVICE].handovers(queue)
    rows.sort(key=lambda row: str(row.get("group", "")))  # by group: one order in every topology
    return json_response({"queue": name, "handovers": rows})


def add_handover_routes(app: web.Application, service: QueueBackend) -> None:
    """Mounted by `admin_routes.add_queue_admin_routes` with the retry routes, over the port."""
    app[HANDOVER_SERVICE] = service
    base = "/admin/v1/queues/{queue}/handover"
    app.router.add_post(base, start_handover)
    app.router.add_post(base + "/release", release_handover)
    app.router.add_get(base, list_handovers)
