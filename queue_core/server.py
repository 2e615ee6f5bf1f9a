"""`strictq queue-server`: the core behind an internal HTTP API (aiohttp + orjson) for the gateway and tools.

Errors map to HTTP in `error_response`, the one place for this face. Bad input gets a 4xx JSON body
`{"error": {"code", "message", "details"}}`; nothing already accepted is lost and the server keeps going.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gc
import logging
import math
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.keys import write_development_keys
from wirelog import logsafe

from .admin_http import add_admin_routes
from .control import ControlHub
from .failures import FailureManager
from .http_errors import client_gone, json_http_errors
from .http_guard import DEFAULT_LIMITS, ConnectionLimits, GuardedSite
from .machine import (
    AckOutcome,
    AlreadyExists,
    InvalidArgument,
    NotFound,
    NotInFlight,
    PeekItem,
    QueueAttributes,
    QueueError,
    SendRequest,
    SendResult,
    StaleClaim,
    TooLarge,
    Unavailable,
    parse_receipt,
)
from .machine.capabilities import parse_list as parse_capabilities
from .machine.health import HealthSettings
from .machine.text import DECIMAL_RE, INTEGER_RE, check_json, check_name, check_value
from .results import outcome_json, parse_results
from .service import QueueService, Received
from .startup import (
    check_state_files,
    check_store,
    listen_fault,
    load_keys,
    prepare_data_dir,
    start_service,
    warn_loose_modes,
)
from .store import StoreDataError, StoreError

log = logging.getLogger("strictq.server")
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # ten 1 MiB messages in JSON, with room for escaping
MAX_BATCH = 1000
SERVICE_KEY = web.AppKey("service", QueueService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -------------------------------------------------------------------------------- errors, one place
STATUS_BY_ERROR: list[tuple[type[QueueError], int]] = [
    (NotFound, 404),
    (StaleClaim, 409),
    (NotInFlight, 409),
    (AlreadyExists, 409),
    (TooLarge, 413),
    (Unavailable, 503),
    (InvalidArgument, 400),
    (QueueError, 400),
]


def status_of(error: type[QueueError]) -> int:
    return next(code for cls, code in STATUS_BY_ERROR if issubclass(error, cls))


def _all_error_classes(root: type[QueueError]) -> list[type[QueueError]]:
    return [root, *(c for sub in root.__subclasses__() for c in _all_error_classes(sub))]


STATUS_BY_CODE = {cls.code: status_of(cls) for cls in _all_error_classes(QueueError)}


def batch_response(results: list[dict[str, Any]], failed_codes: list[str]) -> web.Response:
    """Batches answer 200 with per-item results when any item succeeded; when none did, the status of the
    first failure (so a single bad message is a plain 4xx), with the same per-item results."""
    if failed_codes and len(failed_codes) == len(results):
        first = next(r for r in results if "error" in r or r.get("status") not in ("ok", "gone"))
        error = first.get("error") or {"code": first["status"], "message": first.get("message", "")}
        return json_response({"error": error, "results": results}, STATUS_BY_CODE.get(failed_codes[0], 400))
    return json_response({"results": results})


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if details:
        error["details"] = details
    return {"error": error}


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(exc: BaseException) -> web.Response:
    if isinstance(exc, QueueError):
        return json_response({"error": exc.to_dict()}, status_of(type(exc)))
    if isinstance(exc, StoreDataError):  # one request's data; the store is fine (queue_core.durability)
        log.error("the store refused a request's data: %s", exc)
        return json_response(error_body("store_refused", "the store refused this request's data"), 500)
    if isinstance(exc, StoreError):
        return json_response(error_body("store_unavailable", str(exc)), 503)
    if isinstance(exc, web.HTTPException):
        code = {413: "request_too_large", 404: "no_such_route", 405: "method_not_allowed"}.get(
            exc.status, "http_error"
        )
        response = json_response(error_body(code, exc.reason or "error"), exc.status)
        if isinstance(exc, web.HTTPMethodNotAllowed):
            response.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
        return response
    log.exception("unexpected error", exc_info=exc)
    return json_response(error_body("internal", "internal error; see the server log"), 500)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error of the handlers as JSON; aiohttp's own (404, 405, 413) go on to `json_http_errors`."""
    try:
        check_request(request)
        return await handler(request)
    except web.HTTPException:
        raise
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
    for name, value in request.query.items():
        check_name(name, "query")
        check_name(value, name)
    for name, value in request.match_info.items():
        check_name(value, name)


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None


async def read_object(request: web.Request) -> dict[str, Any]:
    data = await read_json(request)
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    return data


def number(data: dict[str, Any], name: str, default: float | None) -> float | None:
    value = data.get(name, default)
    if value is None:
        return None
    if isinstance(value, str):  # plain ASCII decimals only: not '٣', '1_0', ' 5', 'nan' or 'inf'
        if not DECIMAL_RE.fullmatch(value):
            raise InvalidArgument(f"{name} must be a number in plain digits", field=name)
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number", field=name)
    return float(value)


def integer(data: dict[str, Any] | Any, name: str, default: int) -> int:
    value = data.get(name, default)
    if isinstance(value, str) and INTEGER_RE.fullmatch(value):  # plain ASCII digits only
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer", field=name)
    return value


def send_request(entry: Any) -> SendRequest:
    if not isinstance(entry, dict):
        raise InvalidArgument("each message must be a JSON object")
    content_type = entry.get("content_type", "text/plain")
    if "json" in entry:
        body = orjson.dumps(entry["json"])
        content_type = entry.get("content_type", "application/json")
    elif "body_b64" in entry:
        try:
            body = base64.b64decode(entry["body_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise InvalidArgument("body_b64 is not valid base64", field="body_b64") from None
        content_type = entry.get("content_type", "application/octet-stream")
    elif isinstance(entry.get("body"), str):
        body = entry["body"].encode()
    else:
        raise InvalidArgument("a message needs 'body' (text), 'body_b64' or 'json'", field="body")
    attributes = entry.get("attributes")
    if attributes is not None and not isinstance(attributes, dict):
        raise InvalidArgument("attributes must be a JSON object", field="attributes")
    delay = number(entry, "delay", None)
    for name in ("group", "dedup_id", "id", "content_type"):
        if name in entry and entry[name] is not None and not isinstance(entry[name], str):
            raise InvalidArgument(f"{name} must be a string", field=name)
        check_name(entry.get(name), name)
    check_json(attributes, "attributes")
    return SendRequest(
        body=body,
        group=entry.get("group"),
        dedup_id=entry.get("dedup_id"),
        message_id=entry.get("id"),
        delay=delay,
        content_type=content_type,
        extra=orjson.dumps(attributes) if attributes else b"",
    )


def claim_items(data: dict[str, Any]) -> list[tuple[str, int | None]]:
    """`receipts` (they carry the fencing token), `ids` with an optional shared `token`, or `items`:
    `[[id, token or null], ...]` (a gateway forwarding a batch whose messages carry different tokens)."""
    items: list[tuple[str, int | None]]
    if "items" in data:
        raw = data["items"]
        if not isinstance(raw, list) or not raw:
            raise InvalidArgument("items must be a non-empty list of [id, token] pairs", field="items")
        items = []
        for entry in raw:
            if (
                not isinstance(entry, list)
                or len(entry) != 2
                or not isinstance(entry[0], str)
                or not (entry[1] is None or (isinstance(entry[1], int) and not isinstance(entry[1], bool)))
            ):
                raise InvalidArgument("each item must be [id, token or null]", field="items")
            items.append((check_name(entry[0], "items"), entry[1]))
    elif "receipts" in data:
        receipts = data["receipts"]
        if not isinstance(receipts, list) or not receipts:
            raise InvalidArgument("receipts must be a non-empty list", field="receipts")
        items = [parse_receipt(r) for r in receipts]
    elif "ids" in data:
        ids = data["ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise InvalidArgument("ids must be a non-empty list of strings", field="ids")
        for message_id in ids:
            check_name(message_id, "ids")
        token = data.get("token")
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)):
            raise InvalidArgument("token must be an integer", field="token")
        items = [(i, token) for i in ids]
    else:
        raise InvalidArgument("give 'receipts' or 'ids'", field="receipts")
    if len(items) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} items per request", field="receipts")
    return items


# ---------------------------------------------------------------------------------------- output
def body_fields(body: bytes, content_type: str, extra: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {"content_type": content_type}
    try:
        out["body"] = body.decode()
    except UnicodeDecodeError:
        out["body_b64"] = base64.b64encode(body).decode()
    if extra:
        out["attributes"] = orjson.loads(extra)
    return out


def received_json(item: Received) -> dict[str, Any]:
    d = item.delivery
    return {
        "id": d.message_id,
        "group": d.group,
        "seq": d.seq,
        "token": d.token,
        "receipt": d.receipt,
        "receive_count": d.receive_count,
        "sent_at": d.sent_at,
        "first_receive_at": d.first_receive_at,
        "claim_expires": d.claim_expires,
        "origin": d.origin,
        **body_fields(item.body, item.content_type, item.extra),
        **({"probe": True} if item.probe else {}),  # failure management's dummy message
        **({"history": d.history} if d.history else {}),  # prior failed attempts' log data
    }


def peek_json(item: PeekItem, body: bytes, content_type: str, extra: bytes) -> dict[str, Any]:
    return {
        "id": item.message_id,
        "group": item.group,
        "seq": item.seq,
        "sent_at": item.sent_at,
        "receive_count": item.receive_count,
        "claimed": item.claimed,
        **body_fields(body, content_type, extra),
    }


def send_result_json(result: SendResult | QueueError) -> dict[str, Any]:
    if isinstance(result, QueueError):
        return {"error": result.to_dict()}
    return {
        "id": result.message_id,
        "group": result.group,
        "seq": result.seq,
        "partition": result.partition,
        "duplicate": result.duplicate,
    }


def outcomes_response(outcomes: list[AckOutcome]) -> web.Response:
    results = [
        {"id": o.message_id, "status": o.status, **({"message": o.message} if o.message else {})}
        for o in outcomes
    ]
    return batch_response(results, [o.status for o in outcomes if o.status not in ("ok", "gone")])


# -------------------------------------------------------------------------------------- handlers
def service_of(request: web.Request) -> QueueService:
    return request.app[SERVICE_KEY]


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    service = service_of(request)
    if service.healthy:
        return json_response({"ready": True})
    return json_response({"ready": False, **error_body("not_ready", "store not open or failed")}, 503)


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
    return json_response({"queue": name, "attributes": attributes.to_dict()})


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
    return json_response(
        {
            "queue": name,
            "attributes": attributes.to_dict(),
            "metrics": metrics.to_dict(),
            "created_at": created_at,
        }
    )


async def patch_queue(request: web.Request) -> web.Response:
    name = request.match_info["queue"]
    changes = await read_attributes(request, None)
    return queue_json(name, await service_of(request).set_attributes(name, changes))


async def delete_queue(request: web.Request) -> web.Response:
    await service_of(request).delete_queue(request.match_info["queue"])
    return json_response({"deleted": True})


async def send(request: web.Request) -> web.Response:
    data = await read_object(request)
    entries = data.get("messages")
    if not isinstance(entries, list) or not entries:
        raise InvalidArgument("messages must be a non-empty list", field="messages")
    if len(entries) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} messages per request", field="messages")
    requests: list[SendRequest | QueueError] = []
    for entry in entries:
        try:
            requests.append(send_request(entry))
        except QueueError as exc:
            requests.append(exc)
    good = [r for r in requests if isinstance(r, SendRequest)]
    results = iter(
        await service_of(request).send(request.match_info["queue"], good, create=bool(data.get("create")))
    )
    merged = [r if isinstance(r, QueueError) else next(results) for r in requests]
    return batch_response(
        [send_result_json(r) for r in merged], [r.code for r in merged if isinstance(r, QueueError)]
    )


async def receive(request: web.Request) -> web.Response:
    data = await read_object(request)
    worker = data.get("worker", "")
    if not isinstance(worker, str) or len(worker) > 128:
        raise InvalidArgument("worker must be a string of at most 128 characters", field="worker")
    check_name(worker, "worker")
    received = await service_of(request).receive(
        request.match_info["queue"],
        limit=integer(data, "limit", 10),
        ttl=number(data, "ttl", None),
        worker=worker,
        wait=number(data, "wait", 0.0) or 0.0,
        probes=data.get("probes", True) is not False,  # false: the caller cannot hand out probes (SQS)
        # What the poller declared (machine.capabilities); none: plain queue semantics.
        capabilities=parse_capabilities(data.get("capabilities")),
    )
    return json_response({"messages": [received_json(r) for r in received]})


def holder_of(data: dict[str, Any]) -> str | None:
    """`holder`: the worker on whose behalf a gateway ends or extends claims; the core then refuses claims
    that went to another worker. Absent: an operator's call (this internal API is for trusted callers:
    the gateway, which authenticates workers, and tools)."""
    holder = data.get("holder")
    if holder is not None and (not isinstance(holder, str) or not 0 < len(holder) <= 128):
        raise InvalidArgument("holder must be a string of 1-128 characters", field="holder")
    return holder


async def ack(request: web.Request) -> web.Response:
    data = await read_object(request)
    items = claim_items(data)
    outcomes = await service_of(request).ack(request.match_info["queue"], items, holder_of(data))
    return outcomes_response(outcomes)


async def results(request: web.Request) -> web.Response:
    """Attempt results (docs/failure-management.md §1); always 200 with per-item statuses. Every result
    needs its claim's token (400 naming `token` otherwise)."""
    data = await read_object(request)
    worker = data.get("worker", "")
    if not isinstance(worker, str) or len(worker) > 128:
        raise InvalidArgument("worker must be a string of at most 128 characters", field="worker")
    check_name(worker, "worker")
    holder = holder_of(data)
    parsed = parse_results(data)
    outcomes = await service_of(request).report(request.match_info["queue"], worker, parsed, holder)
    return json_response({"results": [outcome_json(o) for o in outcomes]})


async def renew(request: web.Request) -> web.Response:
    data = await read_object(request)
    items = claim_items(data)
    ttl = number(data, "ttl", 30.0)
    assert ttl is not None
    mode = data.get("mode", "extend")
    if mode not in ("extend", "set"):
        raise InvalidArgument("mode must be 'extend' or 'set'", field="mode")
    outcomes = await service_of(request).renew(request.match_info["queue"], items, ttl, mode, holder_of(data))
    return outcomes_response(outcomes)


async def release(request: web.Request) -> web.Response:
    data = await read_object(request)
    items = claim_items(data)
    outcomes = await service_of(request).release(request.match_info["queue"], items, holder_of(data))
    return outcomes_response(outcomes)


async def unclaim_all(request: web.Request) -> web.Response:
    return json_response({"released": await service_of(request).unclaim_all(request.match_info["queue"])})


async def purge(request: web.Request) -> web.Response:
    return json_response({"purged": await service_of(request).purge(request.match_info["queue"])})


async def peek(request: web.Request) -> web.Response:
    limit = integer(request.query, "limit", 10)
    items = await service_of(request).peek(request.match_info["queue"], limit)
    return json_response({"messages": [peek_json(*item) for item in items]})


async def size(request: web.Request) -> web.Response:
    # Counts are kept exactly in O(1), so EmoDB's `limit` (exact up to, estimate beyond) is always exact.
    integer(request.query, "limit", 0)
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


async def start_move(request: web.Request) -> web.Response:
    data = await read_object(request)
    source, destination = data.get("from"), data.get("to")
    if not isinstance(source, str) or not isinstance(destination, str):
        raise InvalidArgument("give 'from' and 'to' queue names", field="from")
    move = await service_of(request).start_move(source, destination)
    return json_response(move.to_dict())


async def move_status(request: web.Request) -> web.Response:
    return json_response((await service_of(request).move_status(request.match_info["move"])).to_dict())


async def cancel_move(request: web.Request) -> web.Response:
    return json_response((await service_of(request).cancel_move(request.match_info["move"])).to_dict())


def make_app(service: QueueService) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[json_http_errors, errors_as_json])
    app[SERVICE_KEY] = service
    q = "/v1/queues/{queue}"
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/v1/queues", list_queues),
            web.put(q, put_queue),
            web.get(q, get_queue),
            web.patch(q, patch_queue),
            web.delete(q, delete_queue),
            web.post(q + "/send", send),
            web.post(q + "/receive", receive),
            web.post(q + "/ack", ack),
            web.post(q + "/results", results),
            web.post(q + "/renew", renew),
            web.post(q + "/release", release),
            web.post(q + "/unclaimall", unclaim_all),
            web.post(q + "/purge", purge),
            web.get(q + "/peek", peek),
            web.get(q + "/size", size),
            web.get(q + "/claimcount", claimcount),
            web.get(q + "/group", group_info),
            web.post("/v1/moves", start_move),
            web.get("/v1/moves/{move}", move_status),
            web.post("/v1/moves/{move}/cancel", cancel_move),
        ]
    )
    return app


# ------------------------------------------------------------------------------------- the process
async def serve(
    host: str,
    port: int,
    data_dir: Path,
    partitions: int,
    keys: Path | None = None,
    health: HealthSettings | None = None,
    init: bool = False,
    limits: ConnectionLimits = DEFAULT_LIMITS,
) -> None:
    # Start-up faults first, each a StartupError naming its file (queue_core.startup): the data dir
    # (0700, writable), the key file, a missing or empty store (refused unless `init`), fences.json.
    prepare_data_dir(data_dir)
    # The admin routes (control stream, fences) authenticate with the key file; a missing default one is
    # created with development credentials, as `strictq serve` does.
    keys_path = keys or data_dir / "keys.toml"
    key_ring = load_keys(keys_path) if keys or keys_path.exists() else None
    check_store(data_dir, data_dir, init)
    check_state_files(data_dir, health is not None)
    warn_loose_modes(data_dir)
    if key_ring is None:
        key_ring = write_development_keys(keys_path)
    service = QueueService(data_dir, partitions=partitions)
    await start_service(service, data_dir)
    # The restored backlog lives as long as the process: keep it out of every future collection, and
    # collect young objects less often (requests allocate many short-lived ones; queue records form few
    # cycles). Measured: the collector took ~7% of the loop under load with the defaults.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    app = make_app(service)
    hub = ControlHub(service)  # fences in the store (a legacy <data-dir>/fences.json is migrated)
    # Failure management (docs/failure-management.md §3); its events go to <data-dir>/wirelog.
    failures = (
        FailureManager(service, hub, health, wirelog=data_dir / "wirelog") if health is not None else None
    )
    # Its internal API has no tenants: untenanted queues and workers are every admin's (queue_core.scope).
    add_admin_routes(app, hub, key_ring, failures, untenanted=True)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, **limits.handler_args())
    await runner.setup()
    # A head timeout per connection, memory back after slow readers (queue_core.http_guard).
    site = GuardedSite(runner, host, port, limits=limits, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        raise listen_fault(host, port, exc) from None
    # Handlers first: a SIGTERM right after the `listening` line must still stop cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    bound_host, bound_port = runner.addresses[0][:2]
    url = f"http://{_url_host(bound_host)}:{bound_port}"
    print(f"strictq: listening on {url}", flush=True)
    print(f"strictq: keys {keys_path.resolve()}", flush=True)
    command = sys.argv[0] if Path(sys.argv[0]).name == "strictq" else "strictq"  # e.g. .venv/bin/strictq
    print(
        f"strictq: try  STRICTQ_URL={url} {command} send orders --group customer-1 '{{\"order\": 1}}'",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        print("strictq: stopping", file=sys.stderr, flush=True)
        service.stop_waiting()  # long polls answer now instead of holding the shutdown for up to 20 s
        await runner.cleanup()
        await service.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(
    host: str,
    port: int,
    data_dir: Path,
    partitions: int,
    keys: Path | None = None,
    health: HealthSettings | None = None,
    init: bool = False,
    limits: ConnectionLimits = DEFAULT_LIMITS,
) -> None:
    logsafe.install()  # control characters escaped, malformed requests one WARNING line (issue 11)
    try:
        import uvloop

        uvloop.run(serve(host, port, data_dir, partitions, keys, health, init, limits))
    except ImportError:  # uvloop is pinned, but the server still runs on plain asyncio without it
        asyncio.run(serve(host, port, data_dir, partitions, keys, health, init, limits))
