"""The core behind an internal HTTP API (aiohttp + orjson) for the gateway and tools: `make_app`, the app
factory; `strictq queue-server` composes the process around it (strictq.queue_server).

Every request but /healthz and /readyz must carry the deployment's internal secret
(queue_core.internal_auth: checked first, before a handler reads anything). Each error carries its HTTP
status (docs/errors.md), rendered by queue_core.http_errors. Bad input gets a 4xx JSON body
`{"error": {"code", "message", "retriable"?, "details"?}}`; nothing already accepted is lost and the
server keeps going.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from protocol.errors import NOT_READY, error_body

from . import figures as figures_wire
from . import wire
from .http_errors import client_gone, json_response
from .http_errors import error_response as render_error
from .internal_auth import InternalSecret, internal_auth
from .machine import (
    AckOutcome,
    InvalidArgument,
    QueueAttributes,
    QueueError,
    SendRequest,
    error_class,
)
from .machine.gauges import TOP_GROUPS
from .machine.text import check_name, check_value
from .operations import add_routes
from .service import QueueService

log = logging.getLogger("strictq.server")
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # ten 1 MiB messages in JSON, with room for escaping
# The service of a request: the one QueueService of this process, or, on a cluster node serving several
# partitions (one QueueService each), the one its X-Strictq-Partition header names; a partition the node
# does not serve now raises NotOwner (421) there (cluster.node).
ServiceSource = Callable[[web.Request], QueueService]
SERVICE_SOURCE_KEY: web.AppKey[ServiceSource] = web.AppKey("service_source")
READY_KEY: web.AppKey[Callable[[], bool]] = web.AppKey("ready")
MAX_TOP = 100  # largest groups per queue a figures request may ask for
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -------------------------------------------------------------------------------- errors, one place
# Each error carries its status (protocol.errors, docs/errors.md); queue_core.http_errors renders it.
def batch_response(results: list[dict[str, Any]], failed_codes: list[str]) -> web.Response:
    """Batches answer 200 with per-item results when any item succeeded; when none did, the status of the
    first failure (so a single bad message is a plain 4xx), with the same per-item results."""
    if failed_codes and len(failed_codes) == len(results):
        first = next(r for r in results if "error" in r or r.get("status") not in ("ok", "gone"))
        error = first.get("error") or {"code": first["status"], "message": first.get("message", "")}
        return json_response({"error": error, "results": results}, error_class(failed_codes[0]).status)
    return json_response({"results": results})


def error_response(exc: BaseException) -> web.Response:
    return render_error(exc, logger=log)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error of the handlers as JSON, aiohttp's own (404, 405, 413) too, as `json_http_errors`
    renders them: one middleware rather than two, as each is a coroutine call on every request."""
    try:
        check_request(request)
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        return render_error(exc, request, logger=log)
    except Exception as exc:
        if client_gone(request, exc):
            raise  # one WARNING line in http_guard, not an error with a traceback
        return error_response(exc)


# ------------------------------------------------------------------------------------ input parsing
def check_request(request: web.Request) -> None:
    """This API's one check of client text outside JSON bodies: query parameters and path segments must
    be valid Unicode without control characters (400 naming the parameter). JSON bodies are parsed by
    orjson, which refuses lone surrogates (400 below); their names, ids and other text fields are checked
    with the same checker (machine.text) where they are read, and again by the core."""
    if request.query_string:
        for name, value in request.query.items():
            check_name(name, "query")
            check_name(value, name)
    for name, value in request.match_info.items():
        checked_segment(value, name)


@functools.lru_cache(maxsize=4096)
def checked_segment(value: str, name: str) -> None:
    """`check_name` of a path segment, remembered when it passes (a raise is not cached): the hot routes
    name the same few queues request after request."""
    check_name(value, name)


def parse_json(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None


async def read_object(request: web.Request) -> dict[str, Any]:
    # One coroutine between the handler and the body (parsing is plain code): every await level costs
    # a frame on each of the hot routes' requests.
    data = parse_json(await request.read())
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    return data


# ---------------------------------------------------------------------------------------- output
def outcomes_response(outcomes: list[AckOutcome]) -> web.Response:
    results = [wire.encode_outcome(o) for o in outcomes]
    return batch_response(results, [o.status for o in outcomes if o.status not in ("ok", "gone")])


# -------------------------------------------------------------------------------------- handlers
def service_of(request: web.Request) -> QueueService:
    return request.app[SERVICE_SOURCE_KEY](request)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[READY_KEY]():
        return json_response({"ready": True})
    not_ready = error_body(NOT_READY, "store not open or failed", retriable=True)
    return json_response({"ready": False, **not_ready}, 503)


async def list_queues(request: web.Request) -> web.Response:
    return json_response({"queues": await service_of(request).list_queues(request.query.get("prefix", ""))})


async def read_attributes(request: web.Request, default: dict[str, Any] | None) -> dict[str, Any]:
    attributes = (await read_object(request)).get("attributes", default)
    if not isinstance(attributes, dict):
        raise InvalidArgument("attributes must be a JSON object", field="attributes")
    labels = attributes.get("labels")
    if isinstance(labels, dict):  # label names are names; values may span lines (SQS policies), no NUL/ESC
        for key, value in labels.items():
            check_name(key, "labels")
            check_value(value, "labels", label=key)
    return attributes


def queue_json(name: str, attributes: QueueAttributes) -> web.Response:
    return json_response(wire.encode_queue(name, attributes))


async def put_queue(request: web.Request) -> web.Response:
    name = request.match_info["queue"]
    attributes = await read_attributes(request, {})
    return queue_json(name, await service_of(request).create_queue(name, attributes))


async def get_queue(request: web.Request) -> web.Response:
    service = service_of(request)
    name = request.match_info["queue"]
    attributes = await service.attributes(name)
    metrics = await service.metrics(name)
    created_at = await service.created_at(name)
    return json_response(wire.encode_queue_info(wire.QueueInfo(name, attributes, metrics, created_at)))


async def patch_queue(request: web.Request) -> web.Response:
    name = request.match_info["queue"]
    changes = await read_attributes(request, None)
    return queue_json(name, await service_of(request).set_attributes(name, changes))


async def delete_queue(request: web.Request) -> web.Response:
    await service_of(request).delete_queue(request.match_info["queue"])
    return json_response({"deleted": True})


async def send(request: web.Request) -> web.Response:
    requests, create = wire.decode_send(await read_object(request))
    good = [r for r in requests if isinstance(r, SendRequest)]
    results = iter(await service_of(request).send(request.match_info["queue"], good, create=create))
    merged = [r if isinstance(r, QueueError) else next(results) for r in requests]
    return batch_response(
        [wire.encode_send_result(r) for r in merged], [r.code for r in merged if isinstance(r, QueueError)]
    )


async def receive(request: web.Request) -> web.Response:
    polled = wire.decode_receive(await read_object(request))
    received = await service_of(request).receive(
        request.match_info["queue"],
        limit=polled.limit,
        ttl=polled.ttl,
        worker=polled.worker,
        wait=polled.wait,
        probes=polled.probes,
        capabilities=polled.capabilities,
    )
    answer: dict[str, Any] = {"messages": [wire.encode_received(r) for r in received]}
    if polled.capabilities.state and polled.worker:  # state transfer: what this donor should upload now
        exports = service_of(request).export_requests(request.match_info["queue"], polled.worker)
        if exports:
            answer["exports"] = exports
    return json_response(answer)


async def wait_ready(request: web.Request) -> web.Response:
    """A cluster gateway's long poll of one partition: `{"ready": true}` once the queue may have something
    to receive (at once if it has), `false` after `timeout` seconds; it claims nothing."""
    data = await read_object(request)
    timeout = wire.number(data, "timeout", 0.0)
    assert timeout is not None
    if timeout < 0:
        raise InvalidArgument("timeout must not be negative", field="timeout")
    worker = wire.worker_of(data)
    ready = await service_of(request).wait_ready(request.match_info["queue"], timeout, worker)
    return json_response({"ready": ready})


async def ack(request: web.Request) -> web.Response:
    data = await read_object(request)
    items = wire.decode_claims(data)
    outcomes = await service_of(request).ack(request.match_info["queue"], items, wire.holder_of(data))
    return outcomes_response(outcomes)


async def results(request: web.Request) -> web.Response:
    """Attempt results (docs/failure-management.md §1); always 200 with per-item statuses. Every result
    needs its claim's token (400 naming `token` otherwise)."""
    worker, parsed, holder = wire.decode_report(await read_object(request))
    outcomes = await service_of(request).report(request.match_info["queue"], worker, parsed, holder)
    return json_response({"results": [wire.encode_outcome(o) for o in outcomes]})


async def renew(request: web.Request) -> web.Response:
    data = await read_object(request)
    items = wire.decode_claims(data)
    ttl = wire.number(data, "ttl", 30.0)
    assert ttl is not None
    mode = data.get("mode", "extend")
    if mode not in ("extend", "set"):
        raise InvalidArgument("mode must be 'extend' or 'set'", field="mode")
    holder = wire.holder_of(data)
    outcomes = await service_of(request).renew(request.match_info["queue"], items, ttl, mode, holder)
    return outcomes_response(outcomes)


async def release(request: web.Request) -> web.Response:
    data = await read_object(request)
    items = wire.decode_claims(data)
    outcomes = await service_of(request).release(request.match_info["queue"], items, wire.holder_of(data))
    return outcomes_response(outcomes)


async def unclaim_all(request: web.Request) -> web.Response:
    return json_response({"released": await service_of(request).unclaim_all(request.match_info["queue"])})


async def purge(request: web.Request) -> web.Response:
    return json_response({"purged": await service_of(request).purge(request.match_info["queue"])})


async def peek(request: web.Request) -> web.Response:
    limit = wire.integer(request.query, "limit", 10)
    items = await service_of(request).peek(request.match_info["queue"], limit)
    return json_response({"messages": [wire.encode_peek(*item) for item in items]})


async def size(request: web.Request) -> web.Response:
    # Counts are kept exactly in O(1), so EmoDB's `limit` (exact up to, estimate beyond) is always exact.
    wire.integer(request.query, "limit", 0)
    metrics = await service_of(request).metrics(request.match_info["queue"])
    return json_response({"size": metrics.total, "exact": True})


async def claimcount(request: web.Request) -> web.Response:
    metrics = await service_of(request).metrics(request.match_info["queue"])
    return json_response({"claimcount": metrics.in_flight})


async def group_info(request: web.Request) -> web.Response:
    # The group rides in the query: group ids may hold '/', '?' or '#', which a path segment cannot.
    name = request.query.get("name")
    if not name:
        raise InvalidArgument("give the group as ?name=", field="name")
    return json_response(await service_of(request).group_metrics(request.match_info["queue"], name))


async def figures(request: web.Request) -> web.Response:
    """Every queue's figures (queue_core.figures) for a gateway's dashboard and /metrics; a cluster
    node's: the one partition of its X-Strictq-Partition header."""
    top = wire.integer(request.query, "top", TOP_GROUPS)
    if not 0 <= top <= MAX_TOP:
        raise InvalidArgument(f"top must be 0-{MAX_TOP}", field="top")
    return json_response(figures_wire.encode(await service_of(request).figures(top)))


async def start_move(request: web.Request) -> web.Response:
    source, destination, move_id = wire.decode_move_request(await read_object(request))
    return json_response(wire.encode_move(await service_of(request).start_move(source, destination, move_id)))


# ---------------------------------------------- the retry workflow (the port's, queue_core.backend)
def group_of(request: web.Request) -> str:
    """The group rides in the query (`?group=`): group ids may hold '/', '?' or '#'."""
    group = request.query.get("group")
    if not group:
        raise InvalidArgument("give the group as ?group=", field="group")
    return group


async def release_group(request: web.Request) -> web.Response:
    released = await service_of(request).release_group(request.match_info["queue"], group_of(request))
    return json_response({"released": released})


async def redrive_group(request: web.Request) -> web.Response:
    redriven = await service_of(request).redrive_group(request.match_info["queue"], group_of(request))
    return json_response(wire.encode_redriven(redriven))


async def parked_groups(request: web.Request) -> web.Response:
    return json_response({"groups": await service_of(request).parked_groups(request.match_info["queue"])})


async def get_group_policy(request: web.Request) -> web.Response:
    policy = await service_of(request).group_policy(request.match_info["queue"], group_of(request))
    return json_response(policy.to_dict())


async def put_group_policy(request: web.Request) -> web.Response:
    group = group_of(request)
    override = wire.decode_override(await read_object(request))
    policy = await service_of(request).set_group_policy(request.match_info["queue"], group, override)
    return json_response(policy.to_dict())


async def group_log(request: web.Request) -> web.Response:
    limit = wire.integer(request.query, "limit", 50)
    attempts = await service_of(request).group_log(request.match_info["queue"], group_of(request), limit)
    return json_response({"attempts": attempts})


async def move_status(request: web.Request) -> web.Response:
    return json_response(wire.encode_move(await service_of(request).move_status(request.match_info["move"])))


async def cancel_move(request: web.Request) -> web.Response:
    return json_response(wire.encode_move(await service_of(request).cancel_move(request.match_info["move"])))


# ------------------------------------------------------ handovers of groups (docs/state-transfer.md)
def groups_of(data: dict[str, Any], none_allowed: bool) -> list[str] | None:
    groups = data.get("groups")
    if none_allowed and groups is None:
        return None
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise InvalidArgument("groups must be a list of group names", field="groups")
    return groups


async def hand_over(request: web.Request) -> web.Response:
    """`{"from": worker, "groups": [...] | null, "policy": null | "proceed" | "wait"}` (the core checks
    the names and the policy): `{"groups": marked, "already": already moving}`."""
    data = await read_object(request)
    donor, policy = data.get("from"), data.get("policy")
    if not isinstance(donor, str):
        raise InvalidArgument("from must name the worker the groups move away from", field="from")
    if policy not in (None, "proceed", "wait"):
        raise InvalidArgument("policy must be 'proceed' or 'wait'", field="policy")
    groups = groups_of(data, none_allowed=True)
    marked, already = await service_of(request).hand_over(request.match_info["queue"], groups, donor, policy)
    return json_response({"groups": marked, "already": already})


async def release_handover(request: web.Request) -> web.Response:
    groups = groups_of(await read_object(request), none_allowed=False)
    assert groups is not None
    released = await service_of(request).release_handover(request.match_info["queue"], groups)
    return json_response({"released": released})


async def list_handovers(request: web.Request) -> web.Response:
    return json_response({"handovers": await service_of(request).handovers(request.match_info["queue"])})


async def version_figures(request: web.Request) -> web.Response:
    """Group routing's figures of the queue (`?recent=SECONDS`, default 30): what a rollout compares."""
    try:
        recent = float(request.query.get("recent", "30"))
    except ValueError:
        recent = -1.0
    if not 0 <= recent <= 86_400:
        raise InvalidArgument("recent must be 0-86400 seconds", field="recent")
    figures = await service_of(request).version_figures(request.match_info["queue"], recent)
    return json_response(figures.to_json())


async def put_state(request: web.Request) -> web.Response:
    """A donor's upload (`{"worker": ..., "states": {"<group>": {...}}}`): each group's status, once
    durable."""
    data = await read_object(request)
    worker, states = data.get("worker"), data.get("states")
    if not isinstance(worker, str) or not worker:
        raise InvalidArgument("worker must be a non-empty string", field="worker")
    if not isinstance(states, dict):
        raise InvalidArgument('states must be a JSON object: {"<group>": {<state>}, ...}', field="states")
    outcomes = await service_of(request).put_state(request.match_info["queue"], worker, states)
    return json_response({"results": outcomes})


# The handlers of the internal API's data plane, by operation (queue_core.operations: methods and paths).
HANDLERS: dict[str, Handler] = {
    "healthz": healthz,
    "readyz": readyz,
    "list_queues": list_queues,
    "create_queue": put_queue,
    "get_queue": get_queue,
    "set_attributes": patch_queue,
    "delete_queue": delete_queue,
    "send": send,
    "receive": receive,
    "wait_ready": wait_ready,
    "ack": ack,
    "report": results,
    "renew": renew,
    "release": release,
    "unclaim_all": unclaim_all,
    "purge": purge,
    "peek": peek,
    "size": size,
    "claim_count": claimcount,
    "group_metrics": group_info,
    "figures": figures,
    "release_group": release_group,
    "redrive_group": redrive_group,
    "group_policy": get_group_policy,
    "set_group_policy": put_group_policy,
    "group_log": group_log,
    "parked_groups": parked_groups,
    "hand_over": hand_over,
    "release_handover": release_handover,
    "handovers": list_handovers,
    "put_state": put_state,
    "version_figures": version_figures,
    "start_move": start_move,
    "move_status": move_status,
    "cancel_move": cancel_move,
}


def make_app(
    service: QueueService | None,
    source: ServiceSource | None = None,
    ready: Callable[[], bool] | None = None,
    *,
    secret: InternalSecret | None,
) -> web.Application:
    """`service`: the one this process serves; or a cluster node's `source` (see above) and `ready`.
    `secret`: what every request must carry (queue_core.internal_auth; checked first, before anything
    reads the request); None only for apps a test serves inside its own process."""
    middlewares: list[Middleware] = [errors_as_json]
    if secret is not None:
        middlewares.insert(0, internal_auth(secret))
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=middlewares)
    if service is not None:
        app[SERVICE_SOURCE_KEY] = lambda request: service
        app[READY_KEY] = lambda: service.healthy
    else:
        assert source is not None and ready is not None, "a node's app needs its source and readiness"
        app[SERVICE_SOURCE_KEY] = source
        app[READY_KEY] = ready
    add_routes(app, HANDLERS)
    return app
