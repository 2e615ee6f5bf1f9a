"""Admin routes of the process holding the core: the control stream and the fence API.

`add_admin_routes(app, hub, keys)` mounts them on any aiohttp app (the queue server's, the gateway's) and
ties the hub's life to the app's: started on start-up, streams ended on shutdown (an open SSE response
must not hold a SIGTERM up), closed on cleanup. Wire contract: docs/control-stream.md. Errors are JSON
`{"code", "message"}`, mapped to HTTP status in `error_response`, the one place for these routes.

Every route answers within the caller's scope (queue_core.scope): an `admin` or `proxy` key sees its tenant
only, an `operator` key every tenant. The `proxy` role reads the control stream and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from gateway.keys import Credential, KeyRing

from .control import KEEPALIVE_FRAME, ControlHub, StreamClosed
from .fences import FenceError, InvalidFence, NotFenced, UnknownWorker
from .machine import LimitExceeded, NotFound, QueueError, TooLarge, Unavailable
from .scope import Scope
from .store import StoreError

if TYPE_CHECKING:
    from .failures import FailureManager

log = logging.getLogger("strictq.admin")
CONTROL = web.AppKey("strictq_control", ControlHub)
ADMIN_KEYS = web.AppKey("strictq_admin_keys", KeyRing)
# True on a core without tenants (the queue server): its untenanted queues and unknown workers are shown
# to every admin of its key file (queue_core.scope); absent: operators only.
UNTENANTED = web.AppKey("strictq_untenanted", bool)
MAX_FENCE_BODY = 64 * 1024
STREAM_ROLES = ("proxy", "admin", "operator")  # the proxy needs the stream (fences, floors, probes) only
READ_ROLES = ("admin", "operator")
WRITE_ROLES = ("admin", "operator")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Unauthorized(Exception):
    code = "unauthorized"


class Forbidden(Exception):
    code = "forbidden"


class ShuttingDown(Exception):
    code = "shutting-down"


# ------------------------------------------------------------------------------------ errors, one place
STATUS_BY_ERROR: tuple[tuple[type[Exception], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (UnknownWorker, 404),
    (NotFenced, 404),
    (InvalidFence, 400),
    (FenceError, 400),
    (ShuttingDown, 503),
    # The core's errors, for the routes that call it (queue_core.retry_http).
    (NotFound, 404),
    (TooLarge, 413),
    (LimitExceeded, 429),
    (Unavailable, 503),
    (StoreError, 503),
    (QueueError, 400),
)


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(exc: Exception) -> web.Response:
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return json_response({"code": getattr(exc, "code", "error"), "message": str(exc)}, status)
    log.exception("unexpected error in an admin route", exc_info=exc)
    return json_response({"code": "internal", "message": "internal error; see the server log"}, 500)


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
    secret = request.headers.get("X-BV-API-Key")
    if secret is None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        secret = value.strip() if scheme.lower() == "bearer" else None
    if not secret:
        raise Unauthorized("send an admin, operator or proxy key in X-BV-API-Key (or Authorization: Bearer)")
    credential = request.app[ADMIN_KEYS].by_secret(secret)
    if credential is None:
        raise Unauthorized("unknown key")
    if credential.role not in roles:
        raise Forbidden(f"role {credential.role!r} may not use this route (needs {' or '.join(roles)})")
    return credential


def scope_of(request: web.Request, roles: tuple[str, ...]) -> Scope:
    """The authenticated caller's scope: what it may see and change (queue_core.scope)."""
    credential = authenticate(request, roles)
    return Scope(credential, request.app[ADMIN_KEYS], request.app.get(UNTENANTED, False))


def known_worker(scope: Scope, worker: str) -> None:
    """Only a `worker` credential of the caller's own tenant (any tenant: an operator) can be fenced."""
    credential = scope.keys.by_id(worker)
    if credential is None or credential.role != "worker" or not scope.sees_worker(worker):
        raise UnknownWorker(f"no worker credential {worker!r} in the key file")


# ------------------------------------------------------------------------------------------- handlers
@errors_as_json
async def control_stream(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, STREAM_ROLES)
    hub = request.app[CONTROL]
    try:
        subscription = hub.subscribe(request.headers.get("Last-Event-ID"), None if scope.operator else scope)
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
        raise InvalidFence(f"request body over {MAX_FENCE_BODY} bytes")
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


# ------------------------------------------------------------------------------------------- mounting
def add_admin_routes(
    app: web.Application,
    hub: ControlHub,
    keys: KeyRing,
    failures: FailureManager | None = None,
    *,
    untenanted: bool = False,
) -> None:
    """Serve /admin/v1/control and /admin/v1/fences from `app`, with the hub living as long as it; with
    `failures` (its hub must be `hub`), failure management's routes too (queue_core.health_http).
    `untenanted`: the core has no tenants (the queue server), see UNTENANTED."""
    app[CONTROL] = hub
    app[ADMIN_KEYS] = keys
    app[UNTENANTED] = untenanted
    app.router.add_get("/admin/v1/control", control_stream)
    app.router.add_get("/admin/v1/fences", list_fences)
    app.router.add_put("/admin/v1/fences/{worker}", put_fence)
    app.router.add_delete("/admin/v1/fences/{worker}", delete_fence)
    from .retry_http import add_retry_routes  # it imports this module

    add_retry_routes(app, hub.service)  # release, redrive and policies of groups (the retry workflow)
    if failures is not None:
        from .health_http import add_health_routes

        add_health_routes(app, failures)

    async def start(app: web.Application) -> None:
        await hub.start()
        if failures is not None:
            await failures.start()

    async def end_streams(app: web.Application) -> None:
        await hub.shutdown_streams()

    async def close(app: web.Application) -> None:
        if failures is not None:
            await failures.close()
        await hub.close()

    app.on_startup.append(start)
    app.on_shutdown.append(end_streams)
    app.on_cleanup.append(close)
