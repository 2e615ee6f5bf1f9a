"""Admin routes of the process holding the core: the control stream and the fence API, and what every
admin route shares (authentication, scope, JSON errors).

`queue_core.admin_routes.add_admin_routes(app, hub, keys)` mounts them (with the retry and failure-management
routes) on any aiohttp app. Wire contract: docs/control-stream.md. Errors are the one JSON
body `{"error": {"code", "message", ...}}` with the status each error carries (docs/errors.md).

Every route answers within the caller's scope (queue_core.scope): an `admin` or `proxy` key sees its tenant
only, an `operator` key every tenant. The `proxy` role reads the control stream and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from access import permissions
from access.keys import Credential, KeyRing
from access.permissions import READ_ROLES, STREAM_ROLES, WRITE_ROLES, fenceable
from access.tenancy import FACES
from protocol import headers
from protocol.errors import Forbidden, RequestTooLarge, ShuttingDown, Unauthorized

from .backend import QueueBackend
from .control import KEEPALIVE_FRAME, ControlHub, StreamClosed
from .fences import InvalidFence, UnknownWorker
from .http_errors import error_response as render_error
from .http_errors import json_response
from .machine import InvalidArgument, TooLarge
from .scope import Scope

log = logging.getLogger("strictq.admin")
CONTROL = web.AppKey("strictq_control", ControlHub)
ADMIN_KEYS = web.AppKey("strictq_admin_keys", KeyRing)
# True on a core without tenants (the queue server): its untenanted queues and unknown workers are shown
# to every admin of its key file (queue_core.scope); absent: operators only.
UNTENANTED = web.AppKey("strictq_untenanted", bool)
# A credential an outer layer of the app has already authenticated for this request, without a key in its
# headers: the operator's dashboard (gateway.dashboard_session) sets it for a request carrying its session
# cookie and the session's CSRF token. The role check below still applies.
AUTHENTICATED = web.RequestKey("strictq_authenticated", Credential)
MAX_FENCE_BODY = 64 * 1024
SearchGateParts = tuple[Callable[[web.Request, tuple[str, ...]], Scope], Callable[[Exception], web.Response]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# ------------------------------------------------------------------------------------ errors, one place
# Each error carries its status (protocol.errors, docs/errors.md); queue_core.http_errors renders it.
async def json_object_body(request: web.Request, max_bytes: int, hint: str) -> dict[str, Any]:
    """A route's JSON object body (empty: {}); TooLarge past `max_bytes`, InvalidArgument (`hint` says
    what to send) for anything else."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise TooLarge(f"request body over {max_bytes} bytes")
    raw = await request.read()
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(hint)
    return data


def error_response(exc: Exception) -> web.Response:
    return render_error(exc, logger=log)


def errors_as_json(handler: Handler) -> Handler:
    """Every admin route's errors as JSON through `error_response`, the one mapping of this face."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (web.HTTPException, ConnectionError):
            raise
        except Exception as exc:
            return error_response(exc)

    return wrapped


# ----------------------------------------------------------------------------------------------- auth
def authenticate(request: web.Request, roles: tuple[str, ...]) -> Credential:
    """The key-file credential whose secret the request carries, if its role may use this route."""
    secret = request.headers.get(headers.API_KEY)
    if secret is None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        secret = value.strip() if scheme.lower() == "bearer" else None
    credential: Credential | None
    if secret:
        credential = request.app[ADMIN_KEYS].by_secret(secret)
        if credential is None:
            raise Unauthorized("unknown key")
    else:
        credential = request.get(AUTHENTICATED)
        if credential is None:
            raise Unauthorized(
                "send an admin, operator or proxy key in X-BV-API-Key (or Authorization: Bearer)"
            )
    if credential.role not in roles:
        raise Forbidden(f"role {credential.role!r} may not use this route (needs {' or '.join(roles)})")
    return credential


def scope_of(request: web.Request, roles: tuple[str, ...]) -> Scope:
    """The authenticated caller's scope: what it may see and change (queue_core.scope)."""
    credential = authenticate(request, roles)
    return Scope(credential, request.app[ADMIN_KEYS], request.app.get(UNTENANTED, False))


def search_gate(app: web.Application, keys: KeyRing) -> SearchGateParts:
    """The admin routes' check and error rendering for a route mounted from outside the core (spark's
    search): the key ring set on `app` if the admin routes are not mounted there."""
    if ADMIN_KEYS not in app:
        app[ADMIN_KEYS] = keys
    return scope_of, error_response


async def queue_in_path(
    request: web.Request, backend: QueueBackend, roles: tuple[str, ...]
) -> tuple[str, str]:
    """(the caller's name, the core's name) of the `{queue}` in the path (`?face=dedupq` for an EmoDB dedup
    queue), looked up through the port, so every topology answers alike; QueueNotFound (404) for a queue
    that does not exist or is another tenant's."""
    scope = scope_of(request, roles)
    name = request.match_info["queue"]
    return name, await existing_queue(scope, backend, name, request.query.get("face", "queue"))


async def existing_queue(scope: Scope, backend: QueueBackend, name: str, face: str = "queue") -> str:
    """The core's name of the existing queue `name` the caller names, looked up through the port
    (Scope.internal_queue's rules); QueueNotFound (404) otherwise."""
    existing: set[str] = set()
    for candidate in _candidates(scope, name, face):
        existing.update(q for q in await backend.list_queues(candidate) if q == candidate)
    return scope.internal_queue(name, existing, face)


def _candidates(scope: Scope, name: str, face: str) -> list[str]:
    """The core names `Scope.internal_queue` may answer for `name`: what to look up in a backend that
    cannot hand over its whole queue table (a queue server, a cluster); it then decides among them."""
    if face not in FACES:
        return []  # internal_queue refuses the face
    if scope.operator:
        return [name]
    found = [permissions.queue_name(scope.credential, name, face)]
    if scope.untenanted and face == "queue" and "." not in name:
        found.append(name)  # a queue of the queue server's internal API
    return [c for c in dict.fromkeys(found) if c]


def known_worker(scope: Scope, worker: str) -> None:
    """Only a `worker` credential of the caller's own tenant (any tenant: an operator) can be fenced."""
    credential = scope.keys.by_id(worker)
    if credential is None or not fenceable(credential) or not scope.sees_worker(worker):
        raise UnknownWorker(f"no worker credential {worker!r} in the key file")


# ------------------------------------------------------------------------------------------- handlers
@errors_as_json
async def control_stream(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, STREAM_ROLES)
    return await stream_events(request, request.app[CONTROL], None if scope.operator else scope)


async def stream_events(request: web.Request, hub: ControlHub, scope: Scope | None) -> web.StreamResponse:
    """The control stream of `hub` as `scope` sees it (None: everything), resuming after the request's
    Last-Event-ID: the admin route's, and the queue server's internal one its gateway relays."""
    try:
        subscription = hub.subscribe(request.headers.get("Last-Event-ID"), scope)
    except StreamClosed:
        raise ShuttingDown("the server is shutting down; reconnect to the new process") from None
    transport = request.transport
    if transport is not None:
        subscription.abort = transport.abort
    response = web.StreamResponse(headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    response.content_type = "text/event-stream"
    try:
        await response.prepare(request)
        await response.write(subscription.catch_up)
        while True:
            try:
                frame = await subscription.next(hub.keepalive)
            except StreamClosed:
                break
            await response.write(KEEPALIVE_FRAME if frame is None else frame)
    except ConnectionError:
        pass  # the client went away; it resumes with Last-Event-ID
    finally:
        subscription.close()
    return response


@errors_as_json
async def list_fences(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    fences = [fence.to_dict() for fence in request.app[CONTROL].fences() if scope.sees_worker(fence.worker)]
    return json_response({"fences": fences})


@errors_as_json
async def put_fence(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    known_worker(scope, worker)
    if request.content_length is not None and request.content_length > MAX_FENCE_BODY:
        raise RequestTooLarge(f"request body over {MAX_FENCE_BODY} bytes")
    raw = await request.read()
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise InvalidFence(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidFence('send a JSON object: {"mode": "block" | "mimic", "reason": "...", "ttl": 600}')
    hub = request.app[CONTROL]
    try:
        # Types are checked by the hub, in the one place fence input is validated.
        mode: Any = data.get("mode")
        reason: Any = data.get("reason")
        fence = await hub.fence(worker, mode, reason, data.get("ttl"))
    except RuntimeError:
        raise ShuttingDown("the server is shutting down") from None
    return json_response(fence.to_dict())


@errors_as_json
async def delete_fence(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    if not scope.sees_worker(worker):
        raise UnknownWorker(f"no worker credential {worker!r} in the key file")
    # A worker since removed from the key file belongs to no tenant: an operator lifts its fence.
    try:
        await request.app[CONTROL].unfence(worker, "operator")
    except RuntimeError:
        raise ShuttingDown("the server is shutting down") from None
    return json_response({"worker": worker, "unfenced": True})
