"""Admin routes of the retry workflow (docs/failure-management.md §2), beside the fence API.

- `POST /admin/v1/queues/{queue}/groups/release?group=G`: a parked group goes on (fresh retry budget);
- `POST /admin/v1/queues/{queue}/groups/redrive?group=G`: its dead-lettered messages back at the head of
  the group, in order, and released if parked;
- `GET|PUT|DELETE /admin/v1/queues/{queue}/groups/policy?group=G`: the group's retry policy override
  (PUT body: `{"max_attempts": 3, "on_exhausted": "dead_letter_message", ...}`, replacing the override);
- `GET /admin/v1/queues/{queue}/groups/log?group=G&limit=N`: the group's stored log data, newest first;
- `GET /admin/v1/queues/{queue}/parked`: the queue's parked groups.

Queues are named as the admin's tenant sees them (`orders`; `?face=dedupq` for an EmoDB dedup queue), by
their core name on a queue server used without tenants, and by their core name (`t1.orders`) for an
`operator`; another tenant's queue is 404 (queue_core.scope). The group rides in the query: group ids may
hold '/', '?' or '#'. Reads and changes take the `admin` or `operator` role. Errors are mapped to HTTP by
`admin_http.error_response`, the one place for the admin routes.

The routes depend on the port only (queue_core.backend): the same routes answer in process, in front of a
queue server (`--queue-server`) and in front of a cluster (which serves each by the group's partition).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES

from .admin_http import errors_as_json, json_object_body, queue_in_path
from .backend import QueueBackend
from .http_errors import json_response
from .machine import GroupPolicy, InvalidArgument
from .machine.text import INTEGER_RE

RETRY_BACKEND = web.AppKey("strictq_retry_backend", QueueBackend)
MAX_BODY = 16 * 1024


async def _queue(request: web.Request, roles: tuple[str, ...]) -> tuple[str, str]:
    """(the caller's name, the core's name) of the queue in the path; QueueNotFound (404) for others'."""
    return await queue_in_path(request, request.app[RETRY_BACKEND], roles)


def _group(request: web.Request) -> str:
    group = request.query.get("group")
    if not group:
        raise InvalidArgument("give the group as ?group=", field="group")
    return group


async def _body(request: web.Request) -> dict[str, Any]:
    return await json_object_body(request, MAX_BODY, "send a JSON object of retry policy fields")


@errors_as_json
async def release_group(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, WRITE_ROLES)
    group = _group(request)
    released = await request.app[RETRY_BACKEND].release_group(queue, group)
    return json_response({"queue": name, "group": group, "released": released})


@errors_as_json
async def redrive_group(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, WRITE_ROLES)
    group = _group(request)
    redriven = await request.app[RETRY_BACKEND].redrive_group(queue, group)
    return json_response(
        {"queue": name, "group": group, "restored": redriven.restored, "released": redriven.released}
    )


def _policy_response(name: str, group: str, policy: GroupPolicy) -> web.Response:
    return json_response({"queue": name, "group": group, **policy.to_dict()})


@errors_as_json
async def get_policy(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, READ_ROLES)
    group = _group(request)
    return _policy_response(name, group, await request.app[RETRY_BACKEND].group_policy(queue, group))


@errors_as_json
async def put_policy(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, WRITE_ROLES)
    group = _group(request)
    override = await _body(request)
    if not override:
        raise InvalidArgument("send the override's fields (DELETE removes the override)")
    policy = await request.app[RETRY_BACKEND].set_group_policy(queue, group, override)
    return _policy_response(name, group, policy)


@errors_as_json
async def delete_policy(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, WRITE_ROLES)
    group = _group(request)
    policy = await request.app[RETRY_BACKEND].set_group_policy(queue, group, None)
    return _policy_response(name, group, policy)


@errors_as_json
async def group_log(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, READ_ROLES)
    group = _group(request)
    raw = request.query.get("limit", "50")
    if not INTEGER_RE.fullmatch(raw):  # ASCII digits: `isdigit` also takes '²', which int() refuses
        raise InvalidArgument("limit must be an integer from 1 to 1000", field="limit")
    attempts = await request.app[RETRY_BACKEND].group_log(queue, group, int(raw))
    return json_response({"queue": name, "group": group, "attempts": attempts})


@errors_as_json
async def parked(request: web.Request) -> web.StreamResponse:
    name, queue = await _queue(request, READ_ROLES)
    return json_response({"queue": name, "groups": await request.app[RETRY_BACKEND].parked_groups(queue)})


def add_retry_routes(app: web.Application, backend: QueueBackend) -> None:
    """Mounted by `admin_routes.add_queue_admin_routes` (the app's key ring authenticates them)."""
    app[RETRY_BACKEND] = backend
    base = "/admin/v1/queues/{queue}"
    app.router.add_post(base + "/groups/release", release_group)
    app.router.add_post(base + "/groups/redrive", redrive_group)
    app.router.add_get(base + "/groups/policy", get_policy)
    app.router.add_put(base + "/groups/policy", put_policy)
    app.router.add_delete(base + "/groups/policy", delete_policy)
    app.router.add_get(base + "/groups/log", group_log)
    app.router.add_get(base + "/parked", parked)
