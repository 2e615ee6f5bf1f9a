"""The EmoDB face: EmoDB's QueueService REST API under `/queue/1` and DedupQueueService under `/dedupq/1`.

Every REST call of the EmoDB queue page, with EmoDB's shapes: `{"success": true}` for send, _sendbatch,
ack, renew, purge and unclaimall; a list of `{"id", "payload"}` for poll and peek; plain numbers for size
and claimcount; `{"id": <reference>}` for `_move` (EmoDB's QueueResource1 answers a map, and its client
reads `id`) and `{"from", "to", "status": IN_PROGRESS | COMPLETE | ERROR}` for the move status.

Authentication: the credential's secret as `X-BV-API-Key`; a missing or unknown key is 403, as in EmoDB.
Roles: producers send, workers poll/ack/renew, admins do everything (peek, size, claimcount, purge,
unclaimall and moves are admin-only); anything else is 403.

strictq extensions, all optional, so that plain EmoDB clients keep EmoDB's semantics:
- the strict order parameter: `group` query parameter or `X-Strictq-Group` header on send and _sendbatch
  (one group for every message of the request);
- poll answers also carry `group`, `seq`, `token` (the fencing token of the claim) and `queue_ref` (the
  queue reference outbound calls are tagged with, `X-Strictq-Queue`: `NAME`, or `dedupq/NAME` on
  `/dedupq/1`); peek adds `group` and `seq`;
- ack and renew take the token as `X-Strictq-Lease` or `?token=`, and then refuse stale claims with 409
  naming the refused ids. Without a token, ack and renew are best effort (EmoDB: `{"success": true}`
  whatever happened to each id);
- request ids (gateway.request_ids): every answer names its request in `X-Request-Id` (the client's when
  it sent a well-formed one), and error bodies carry it beside `error`. A send's id stays with each
  message it sent; a poll that declares the `request_ids` capability (`X-Strictq-Capabilities`, as the
  SDK does) gets it back as each item's `request_id`. A plain EmoDB client's poll items are as before.
- pipelining (docs/pipelining.md): a send may give its messages' processing-time estimate,
  `X-Strictq-Estimate: processing=<s>, preprocessing=<s>` (kept with each message); a poll declaring the
  `estimates` capability gets each item's `estimate: {"processing", "preprocessing"}` (the message's own,
  else the queue's attributes, else learned from past attempts; queue_core.machine.estimates).

Ending a claim needs proof of holding it (ack, renew, renew ttl=0 = release, results). A `worker`
credential acts only on messages whose newest claim went to that same credential (the core records the
claiming worker): with or without a token (tokens count up, so a token is fencing, not proof); a late ack
of its own expired claim that nobody took since still works, as in EmoDB. It cannot ack a message that
was never delivered, nor one another worker holds: those ids are left untouched (`{"success": true}`
without a token, as EmoDB answers per id; 409 `stale_claim` naming them with a token). An `admin`
credential acks, renews and releases by id as EmoDB allows. `results` need each claim's token (400 naming
`token` otherwise).

Decisions:
- Queues are created implicitly by send (and by `_move`), as in EmoDB. Polls, peeks and counts of a queue
  that does not exist answer `[]` / `0`, and ack, renew, purge and unclaimall of one succeed, as in EmoDB.
  A name outside the credential's tenant or prefixes is 404 on every call (names never leak).
- A name on `/queue/1` and the same name on `/dedupq/1` are different queues, as in EmoDB. Queue-service
  queues are `<tenant>.<name>` inside the core (shared with the SQS face, so a message sent on one face can
  be read on the other); dedup queues are `<tenant>_dedupq.<name>` (kind "dedup"): '_' never occurs in a
  tenant, so no name on any other face reaches them.
- Payloads are stored as compact JSON text (content type application/json), re-serialised from the parsed
  value, so `{"a": 1}` and `{"a":1}` are the same message to a dedup queue; integers of any size keep every
  digit. A polled body stored as text by another face is returned parsed when it is valid JSON, otherwise
  as a JSON string.
- Every error is `{"error": {"code", "message"[, "retriable"][, "details"]}}` with the status the error
  carries (docs/errors.md), rendered by queue_core.http_errors like the internal API's and the admin routes'.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from aiohttp import web

from access.keys import Credential
from access.permissions import Permission, allowed, ends_any_claim, require, visible_name
from protocol import headers
from protocol.errors import StrictqError, error_body
from protocol.headers import WORKER_MAX_BYTES as WORKER_MAX_BYTES_HEADER
from protocol.headers import WORKER_VERSION as WORKER_VERSION_HEADER
from queue_core.backend import QueueBackend
from queue_core.http_errors import client_gone, json_response
from queue_core.http_errors import error_response as render_error
from queue_core.machine import (
    AckOutcome,
    InvalidArgument,
    NotFound,
    QueueError,
    QueueMetrics,
    QueueNotFound,
    SendRequest,
    SendResult,
    error_class,
)
from queue_core.machine.attributes import QueueAttributes
from queue_core.machine.capabilities import HEADER as CAPABILITIES_HEADER
from queue_core.machine.capabilities import parse_header as parse_capabilities
from queue_core.machine.capabilities import with_max_bytes, with_version
from queue_core.machine.estimates import encode_extra as estimate_extra
from queue_core.machine.estimates import parse_header as parse_estimate
from queue_core.machine.text import DECIMAL_RE, INTEGER_RE, check_name
from queue_core.results import outcome_json, parse_results
from queue_core.scope import internal_name

from .app_keys import KEYS, ROUTER
from .deliveries import deliveries_of
from .fleet_control import control_headers
from .limits_http import check_backlog, check_sends
from .request_ids import request_id_of
from .results_log import log_results
from .state_transfer import add_handover_header

log = logging.getLogger("strictq.gateway.emodb")

API_KEY_HEADER = headers.API_KEY
GROUP_HEADER = headers.GROUP
ESTIMATE_HEADER = headers.ESTIMATE
LEASE_HEADER = headers.LEASE
MAX_WAIT = 20.0
DEFAULT_TTL = 30.0
MAX_TTL = 3600.0  # EmoDB: "The ttl may range from 0 seconds to 1 hour."
DEFAULT_LIMIT = 10
MAX_LIMIT = 1000  # EmoDB: "The limit may range from 1 to 1000."
MAX_IDS = 10_000  # ids per ack/renew request
MAX_BATCH_MESSAGES = 10_000  # messages per _sendbatch request (the body cap bounds bytes, this bounds work)
MAX_TOKEN = (1 << 63) - 1
MOVE_STATUS = {"running": "IN_PROGRESS", "done": "COMPLETE", "failed": "ERROR"}
# Headers of this face whose values reach the core or the logs.
CHECKED_HEADERS = (GROUP_HEADER, LEASE_HEADER, ESTIMATE_HEADER)


# ---------------------------------------------------------------------------------- errors, one place
class FaceError(StrictqError):
    """An error of the HTTP layer itself (authentication, media type), with its status and code."""

    status = 400
    code = "bad_request"


class BadApiKey(FaceError):
    status = 403
    code = "invalid_api_key"


class UnsupportedMediaType(FaceError):
    status = 415
    code = "unsupported_media_type"


def error_response(exc: BaseException, request: web.BaseRequest) -> web.Response:
    """Each error carries its status and code (docs/errors.md); the one renderer of queue_core renders it,
    with the request's id beside the error (gateway.request_ids)."""
    return render_error(exc, request, logger=log, request_id=request_id_of(request))


SUCCESS = orjson.dumps({"success": True})


def success() -> web.Response:
    return web.Response(body=SUCCESS, content_type="application/json")


# ---------------------------------------------------------------------------------------- faces
@dataclass(frozen=True, slots=True)
class Face:
    """One of the two services: its URL prefix, the queue kind it creates and its namespace in the core."""

    prefix: str
    kind: Literal["queue", "dedup"]
    namespace: str  # the tenant's namespace in the core (access.tenancy): "queue" (shared with SQS), "dedupq"

    def internal(self, credential: Credential, name: str) -> str:
        """The core's name for `name`; QueueNotFound (404) when the credential may not use the name."""
        return internal_name(credential, name, self.namespace)  # the name rules, tenant and prefixes

    def visible(self, credential: Credential, internal: str) -> str | None:
        return visible_name(credential, internal, self.namespace)

    @property
    def create_attributes(self) -> dict[str, Any]:
        return {"kind": "dedup"} if self.kind == "dedup" else {}

    @property
    def log_name(self) -> str:
        """The face as delivery records name it."""
        return "dedupq" if self.kind == "dedup" else "emodb"

    def reference(self, name: str) -> str:
        """The poll item's `queue_ref`, which the SDK echoes as `X-Strictq-Queue` so the egress proxy finds
        the right group floor: `NAME` on the queue face, `dedupq/NAME` here (fencing.context); never the
        tenant, which the proxy takes from the worker's credential."""
        return f"dedupq/{name}" if self.kind == "dedup" else name


QUEUE_FACE = Face("/queue/1", "queue", "queue")
DEDUP_FACE = Face("/dedupq/1", "dedup", "dedupq")
FACES = (QUEUE_FACE, DEDUP_FACE)


@dataclass(slots=True)
class Call:
    request: web.Request
    face: Face
    credential: Credential

    def queue(self, name: str | None = None) -> str:
        return self.face.internal(self.credential, self.request.match_info["queue"] if name is None else name)

    def service_for_queue(self, queue: str) -> QueueBackend:
        return self.request.app[ROUTER].for_queue(queue)

    def service_for_send(self, queue: str, group: str | None) -> QueueBackend:
        router = self.request.app[ROUTER]
        return router.for_queue(queue) if group is None else router.for_group(group)


Handler = Callable[[Call], Awaitable[web.StreamResponse]]


def authenticate(request: web.Request) -> Credential:
    secret = request.headers.get(API_KEY_HEADER)
    if not secret:
        raise BadApiKey(f"missing API key: send it as the {API_KEY_HEADER} header")
    credential = request.app[KEYS].by_secret(secret)
    if credential is None:
        raise BadApiKey("unknown API key")
    return credential


def endpoint(
    face: Face, role: Permission, action: str, handler: Handler
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Authenticate, check the role, run the handler; every failure becomes a JSON error response."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            credential = authenticate(request)
            require(credential, allowed(credential, role), action)
            check_request(request)
            return await handler(Call(request, face, credential))
        except Exception as exc:
            if client_gone(request, exc):
                raise  # one WARNING line in queue_core.http_guard, not an error with a traceback
            return error_response(exc, request)

    return handle


# --------------------------------------------------------------------------------------- JSON in/out
def check_request(request: web.Request) -> None:
    """The face's one check of client text outside JSON bodies: query parameters, the path's queue name
    and the strictq headers must be valid Unicode without control characters (400 naming the parameter;
    `?group=poison%0A` included). JSON bodies are checked where they are read (`read_json`, `read_ids`,
    `send_batch`, queue_core.results), message payloads excepted: they are stored as JSON bytes."""
    for name, value in request.query.items():
        check_name(name, "query")
        check_name(value, name)
    for name, value in request.match_info.items():
        check_name(value, name)
    for header in CHECKED_HEADERS:
        sent = request.headers.get(header)
        if sent is not None:
            check_name(sent, header)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> Any:
    """Strict JSON (RFC 8259; no NaN/Infinity), integers of any size kept exactly; InvalidArgument if not."""
    try:
        return json.loads(raw.decode("utf-8-sig"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from None


def canonical_json(value: Any) -> bytes:
    """Compact JSON text of a parsed value: the stored body of an EmoDB message."""
    try:
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escape (valid JSON text, not valid UTF-8)
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")
    except ValueError:
        raise InvalidArgument("numbers in a message must be finite") from None
    except RecursionError:
        raise InvalidArgument("message nests too deeply") from None


def is_json_text(body: bytes) -> bool:
    try:
        orjson.loads(body)  # fast and strict, but refuses numbers beyond a double; then ask the stdlib
        return True
    except orjson.JSONDecodeError:
        pass
    try:
        json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
        return True
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False


def payload(body: bytes) -> Any:
    """A stored body as an EmoDB payload: the JSON text as it is when valid, otherwise a JSON string."""
    if is_json_text(body):
        return orjson.Fragment(body)
    return body.decode("utf-8", errors="replace")


async def read_json(request: web.Request) -> Any:
    content_type = request.headers.get("Content-Type")
    if content_type is not None:
        mime = content_type.split(";", 1)[0].strip().lower()
        if mime != "application/json" and not mime.endswith("+json"):
            raise UnsupportedMediaType(f"Content-Type must be application/json, not {mime!r}")
    raw = await request.read()  # raises HTTPRequestEntityTooLarge beyond the edge's body cap
    if not raw.strip():
        raise InvalidArgument("request body is empty: it must be JSON")
    return parse_json(raw)


async def read_ids(request: web.Request) -> list[str]:
    ids = await read_json(request)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument("the body must be a JSON list of message ids (strings)")
    if len(ids) > MAX_IDS:
        raise InvalidArgument(f"at most {MAX_IDS} message ids per request", count=len(ids))
    for index, message_id in enumerate(ids):  # echoed in answers and delivery records
        check_name(message_id, "ids", index=index)
    return ids


def query_number(request: web.Request, name: str, default: float, low: float, high: float) -> float:
    return _query(request, name, default, low, high, float, "a number")


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    return _query(request, name, default, low, high, int, "an integer")


def _query[N: (int, float)](
    request: web.Request, name: str, default: N, low: N, high: N, parse: Callable[[str], N], kind: str
) -> N:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    pattern = INTEGER_RE if parse is int else DECIMAL_RE
    if not pattern.fullmatch(raw):  # plain ASCII digits: no '٣', '1_0', ' 5', '1e3', 'nan' or 'inf'
        raise InvalidArgument(f"{name} must be {kind} in plain digits, got {raw[:40]!r}", field=name)
    try:
        value = parse(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be {kind}, got {raw[:40]!r}", field=name) from None
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be between {low:g} and {high:g}, got {raw[:40]!r}", field=name)
    return value


def one_of(request: web.Request, query: str, header: str) -> str | None:
    """An extension parameter given as a query parameter or a header (both: they must agree)."""
    from_query, from_header = request.query.get(query), request.headers.get(header)
    if from_query is not None and from_header is not None and from_query != from_header:
        raise InvalidArgument(f"?{query}= and {header} disagree", field=query)
    return from_query if from_query is not None else from_header


def group_of(request: web.Request) -> str | None:
    group = one_of(request, "group", GROUP_HEADER)
    if group == "":
        raise InvalidArgument("group must not be empty", field="group")
    return group  # the core validates the characters and the length


def token_of(request: web.Request) -> int | None:
    raw = one_of(request, "token", LEASE_HEADER)
    if raw is None:
        return None
    if not INTEGER_RE.fullmatch(raw) or not 0 < int(raw) <= MAX_TOKEN:
        raise InvalidArgument(f"the lease token must be a positive integer, got {raw[:40]!r}", field="token")
    return int(raw)


def ttl_of(request: web.Request) -> float:
    return query_number(request, "ttl", DEFAULT_TTL, 0.0, MAX_TTL)


# ------------------------------------------------------------------------------------------ sending
async def ensure_queue(call: Call, service: QueueBackend, queue: str) -> QueueAttributes:
    """EmoDB queues exist implicitly; dedup queues must be created with their kind before the first send."""
    try:
        return await service.attributes(queue)
    except QueueNotFound:
        return await service.create_queue(queue, call.face.create_attributes)


async def send_all(call: Call, batches: dict[str, list[SendRequest]], group: str | None) -> None:
    """Send each queue's messages; the first failed message is the request's error (EmoDB: not atomic).
    Admission first, for every queue of the request, so a refusal leaves nothing sent: each queue's
    backpressure (gateway.backpressure), then the tenant's rate (gateway.rate_limits)."""
    targets: list[tuple[str, list[SendRequest], QueueBackend]] = []
    for queue, requests in batches.items():
        if not requests:
            continue
        service = call.service_for_send(queue, group)
        attributes = await ensure_queue(call, service, queue)
        shown = call.face.visible(call.credential, queue) or queue
        await check_backlog(call.request, service, queue, shown, attributes)
        targets.append((queue, requests, service))
    check_sends(call.request, call.credential.tenant, sum(len(requests) for _, requests, _ in targets))
    failures: list[tuple[str, int, QueueError]] = []
    for queue, requests, service in targets:
        results: list[SendResult | QueueError] = await service.send(queue, requests, create=True)
        failures.extend((queue, i, r) for i, r in enumerate(results) if isinstance(r, QueueError))
    if failures:
        queue, index, first = failures[0]
        visible = call.face.visible(call.credential, queue)
        first.details = {**first.details, "queue": visible, "index": index, "failed": len(failures)}
        raise first


def send_request(
    message: Any, group: str | None, request_id: str | None = None, extra: bytes = b""
) -> SendRequest:
    """`request_id`: the sending request's (gateway.request_ids), kept with the message; `extra`: the
    producer's estimate (`extra_of`), kept with it too."""
    return SendRequest(
        body=canonical_json(message),
        group=group,
        content_type="application/json",
        request_id=request_id,
        extra=extra,
    )


def extra_of(request: web.Request) -> bytes:
    """The extension header `X-Strictq-Estimate` as the messages' extra bytes (b"": none given)."""
    raw = request.headers.get(ESTIMATE_HEADER)
    return b"" if raw is None or not raw.strip() else estimate_extra(parse_estimate(raw))


async def send(call: Call) -> web.StreamResponse:
    queue = call.queue()
    group = group_of(call.request)
    extra = extra_of(call.request)
    message = await read_json(call.request)
    await send_all(call, {queue: [send_request(message, group, request_id_of(call.request), extra)]}, group)
    return success()


async def send_batch(call: Call) -> web.StreamResponse:
    group = group_of(call.request)
    extra = extra_of(call.request)  # one estimate for every message of the request, as the group
    data = await read_json(call.request)
    if not isinstance(data, dict):
        raise InvalidArgument('the body must be a JSON object: {"<queue>": [<message>, ...], ...}')
    batches: dict[str, list[SendRequest]] = {}
    count = 0
    request_id = request_id_of(call.request)  # one for every message of the request
    for name, messages in data.items():  # every name and message is checked before anything is sent
        check_name(name, "queue")  # before it is echoed in any error (the payloads are stored as bytes)
        if not isinstance(messages, list):
            raise InvalidArgument(f"the messages of queue {name!r} must be a JSON list", queue=name)
        count += len(messages)
        if count > MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"at most {MAX_BATCH_MESSAGES} messages per request")
        batches.setdefault(call.queue(name), []).extend(
            send_request(m, group, request_id, extra) for m in messages
        )
    await send_all(call, batches, group)
    return success()


# ----------------------------------------------------------------------------------------- claims
async def poll(call: Call) -> web.StreamResponse:
    queue = call.queue()
    ttl = ttl_of(call.request)
    limit = query_int(call.request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    # Extension: `wait` long-polls up to 20 s for messages (EmoDB polls return at once).
    wait = query_number(call.request, "wait", 0.0, 0.0, MAX_WAIT)
    # Extension: the SDK's opt-in to failure management (`X-Strictq-Capabilities: results, probes`); a
    # plain EmoDB client declares nothing and keeps EmoDB's semantics (docs/failure-management.md).
    capabilities = parse_capabilities(call.request.headers.getall(CAPABILITIES_HEADER, []))
    # Extension: the version the worker runs (the SDK's `Worker(version=...)`), for group routing.
    version = call.request.headers.get(WORKER_VERSION_HEADER)
    capabilities = with_version(capabilities, version, WORKER_VERSION_HEADER)
    max_bytes = call.request.headers.get(WORKER_MAX_BYTES_HEADER)
    capabilities = with_max_bytes(capabilities, max_bytes, WORKER_MAX_BYTES_HEADER)
    try:
        received = await call.service_for_queue(queue).receive(
            queue, limit=limit, ttl=ttl, worker=call.credential.id, wait=wait, capabilities=capabilities
        )
    except QueueNotFound:
        received = []  # EmoDB: a queue nobody sent to is an empty queue
    if received and (deliveries := deliveries_of(call.request)) is not None:
        deliveries.delivered(call.credential, call.face.log_name, call.request.match_info["queue"], received)
    request_ids = capabilities.request_ids  # opt-in: a plain EmoDB client's items stay as they were
    response = json_response(
        [
            {
                "id": r.delivery.message_id,
                "payload": payload(r.body),
                "group": r.delivery.group,
                "seq": r.delivery.seq,
                "token": r.delivery.token,
                "attempt": r.delivery.receive_count,
                "queue_ref": call.face.reference(call.request.match_info["queue"]),  # for X-Strictq-Queue
                **({"probe": True} if r.probe else {}),  # failure management's dummy message
                **({"history": r.delivery.history} if r.delivery.history else {}),  # prior attempts
                **({"request_id": r.request_id} if request_ids and r.request_id else {}),  # the send's
                **({"state": r.state} if capabilities.state and r.state is not None else {}),  # moved
                **({"estimate": r.estimate.to_json()} if r.estimate is not None else {}),  # pipelining
            }
            for r in received
        ]
    )
    if capabilities.state:  # opt-in: the groups whose local state this worker should upload now
        add_handover_header(response, call.service_for_queue(queue), queue, call.credential.id)
    # Opt-in (`control`): fleet controls wait for this worker, so it heartbeats now (gateway.fleet_face).
    response.headers.update(control_headers(call.request, call.credential.id, capabilities.control))
    return response


def refused(
    call: Call, outcomes: list[AckOutcome], token: int | None, gone_is_lost: bool = False
) -> web.StreamResponse:
    """EmoDB's success, unless a fenced call (with a token) was refused for some ids: 409 naming them.

    A fenced renew of a message that is gone is refused too: the lease it would keep alive no longer exists
    (someone acked it), so the worker holding it must stop; a fenced ack of a gone message stays a no-op."""
    accepted = ("ok",) if gone_is_lost else ("ok", "gone")
    bad = [o for o in outcomes if o.status not in accepted]
    if token is None or not bad:
        return success()
    first = bad[0]
    ids = list(dict.fromkeys(o.message_id for o in bad))
    body = error_body(
        first.status,
        f"{len(ids)} of the {len(outcomes)} claims were refused: {first.message}",
        ids=ids,
        token=token,
    )
    body["results"] = [{"id": o.message_id, "status": o.status} for o in outcomes]
    body["request_id"] = request_id_of(call.request)
    status = error_class(first.status).status  # gone, stale_claim: 409
    return json_response(body, status)


def holder_of(credential: Credential) -> str | None:
    """Whose claims the caller may end or extend: a worker only the claims that went to it (the core
    checks, with or without a token: tokens count up, so a token alone proves nothing); an admin any
    claim, by id, as EmoDB allows."""
    return None if ends_any_claim(credential) else credential.id


async def ack(call: Call) -> web.StreamResponse:
    queue = call.queue()
    token = token_of(call.request)
    ids = await read_ids(call.request)
    if not ids:
        return success()
    items = [(i, token) for i in ids]
    try:
        outcomes = await call.service_for_queue(queue).ack(queue, items, holder_of(call.credential))
    except QueueNotFound:
        return success()  # EmoDB: acknowledging in a queue that does not exist is a no-op
    _log_ended(call, "ack", items, outcomes)
    return refused(call, outcomes, token)


async def renew(call: Call) -> web.StreamResponse:
    queue = call.queue()
    token = token_of(call.request)
    ttl = ttl_of(call.request)
    ids = await read_ids(call.request)
    if not ids:
        return success()
    items = [(i, token) for i in ids]
    try:
        outcomes = await call.service_for_queue(queue).renew(
            queue, items, ttl, "extend", holder_of(call.credential)
        )
    except QueueNotFound:
        return success()
    if ttl == 0:  # EmoDB's unclaim: the worker hands the claim back
        _log_ended(call, "release", items, outcomes)
    return refused(call, outcomes, token, gone_is_lost=True)


def _log_ended(
    call: Call, event: str, items: list[tuple[str, int | None]], outcomes: list[AckOutcome]
) -> None:
    """Delivery log: the claims an ack or an unclaim (renew ttl 0) ended."""
    deliveries = deliveries_of(call.request)
    if deliveries is not None:
        deliveries.ended(
            call.credential, call.face.log_name, call.request.match_info["queue"], event, items, outcomes
        )


async def results(call: Call) -> web.StreamResponse:
    """strictq extension: the worker's attempt results (docs/failure-management.md §1), per-item
    statuses; each result also becomes a wire-log `log` record. Every result needs its claim's token
    (400 naming `token`), and a worker reports only on claims that went to it (`stale_claim` otherwise)."""
    queue = call.queue()
    parsed = parse_results(await read_json(call.request))
    credential = call.credential
    try:
        outcomes = await call.service_for_queue(queue).report(
            queue, credential.id, parsed, holder_of(credential)
        )
    except QueueNotFound:  # EmoDB: a queue nobody sent to is an empty queue
        outcomes = [AckOutcome(r.message_id, "gone", "no such message (already deleted?)") for r in parsed]
    name = call.request.match_info["queue"]
    log_results(call.request, call.credential, call.face.log_name, name, parsed, outcomes)
    return json_response({"results": [outcome_json(o) for o in outcomes]})


async def put_state(call: Call) -> web.StreamResponse:
    """strictq extension (state transfer, docs/state-transfer.md): the donor's local state of the groups its
    poll answers named (`X-Strictq-Handover`), `{"<group>": {<state>}, ...}`; answered once durable with
    each group's status (`ok`, or `not_requested`: no handover of it from this worker awaits state)."""
    queue = call.queue()
    states = await read_json(call.request)
    if not isinstance(states, dict):
        raise InvalidArgument('the body must be a JSON object: {"<group>": {<state>}, ...}', field="body")
    try:
        outcomes = await call.service_for_queue(queue).put_state(queue, call.credential.id, states)
    except QueueNotFound:  # a queue nobody sent to has no handover either
        outcomes = {group: "not_requested" for group in states}
    return json_response({"results": [{"group": g, "status": status} for g, status in outcomes.items()]})


# -------------------------------------------------------------------------------------- admin calls
async def peek(call: Call) -> web.StreamResponse:
    queue = call.queue()
    limit = query_int(call.request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    try:
        items = await call.service_for_queue(queue).peek(queue, limit)
    except QueueNotFound:
        items = []
    return json_response(
        [
            {"id": item.message_id, "payload": payload(body), "group": item.group, "seq": item.seq}
            for item, body, _content_type, _extra in items
        ]
    )


async def size(call: Call) -> web.StreamResponse:
    # EmoDB's limit: exact up to it, estimated beyond. The core counts exactly in O(1), so it is checked
    # and otherwise has no effect.
    query_int(call.request, "limit", 0, 0, MAX_TOKEN)
    metrics = await _metrics(call)
    return json_response(metrics.total if metrics else 0)


async def claimcount(call: Call) -> web.StreamResponse:
    metrics = await _metrics(call)
    return json_response(metrics.in_flight if metrics else 0)


async def _metrics(call: Call) -> QueueMetrics | None:
    """The queue's counts, or None for a queue nobody sent to (EmoDB: an empty queue)."""
    queue = call.queue()
    try:
        return await call.service_for_queue(queue).metrics(queue)
    except QueueNotFound:
        return None


async def purge(call: Call) -> web.StreamResponse:
    queue = call.queue()
    try:
        await call.service_for_queue(queue).purge(queue)
    except QueueNotFound:
        pass
    return success()


async def unclaim_all(call: Call) -> web.StreamResponse:
    queue = call.queue()
    try:
        await call.service_for_queue(queue).unclaim_all(queue)
    except QueueNotFound:
        pass
    return success()


async def start_move(call: Call) -> web.StreamResponse:
    names = {}
    for param in ("from", "to"):
        value = call.request.query.get(param)
        if not value:
            raise InvalidArgument(f"{param} is required", field=param)
        names[param] = call.queue(value)
    source, destination = names["from"], names["to"]
    if source == destination:
        raise InvalidArgument("cannot move a queue to itself", field="to")
    service = call.service_for_queue(source)
    await ensure_queue(call, service, source)  # moving a queue nobody sent to: done at once
    await ensure_queue(call, service, destination)  # of this face's kind (the core would make "queue")
    move = await service.start_move(source, destination)
    return json_response({"id": move.id})


async def move_status(call: Call) -> web.StreamResponse:
    reference = call.request.match_info["reference"]
    move = await call.request.app[ROUTER].for_queue("").move_status(reference)
    source = call.face.visible(call.credential, move.source)
    destination = call.face.visible(call.credential, move.destination)
    if source is None or destination is None:  # another tenant's (or the other service's) move
        raise NotFound(f"no move {reference!r}", reference=reference)
    body: dict[str, Any] = {
        "id": move.id,
        "from": source,
        "to": destination,
        "status": MOVE_STATUS.get(move.state, "ERROR"),
        "moved": move.moved,
        "remaining": move.remaining,
    }
    if move.error:
        body["error"] = move.error
    return json_response(body)


# ---------------------------------------------------------------------------------- unknown routes
CATCH_ALL: set[str] = set()  # canonical paths of the faces' catch-all resources


async def no_such_route(request: web.Request) -> web.StreamResponse:
    """Anything under a face's prefix no route takes: 405 when the path exists for other methods, else 404."""
    methods: set[str] = set()
    for resource in request.app.router.resources():
        if resource.canonical in CATCH_ALL:
            continue
        match, allowed_methods = await resource.resolve(request)
        if match is None:
            methods |= allowed_methods
    if methods:
        return error_response(web.HTTPMethodNotAllowed(request.method, methods), request)
    return error_response(web.HTTPNotFound(reason=f"no such route: {request.method} {request.path}"), request)


# ------------------------------------------------------------------------------------------- routes
ROUTES: list[tuple[str, str, Permission, str, Handler]] = [
    # (method, path below the prefix, role, action for the 403 message, handler); specific paths first.
    ("POST", "/_sendbatch", "send", "send messages", send_batch),
    ("POST", "/_move", "admin", "move queues", start_move),
    ("GET", "/_move/{reference}", "admin", "read move status", move_status),
    ("POST", "/{queue}/send", "send", "send messages", send),
    ("GET", "/{queue}/poll", "consume", "poll", poll),
    ("POST", "/{queue}/ack", "consume", "acknowledge claims", ack),
    ("POST", "/{queue}/renew", "consume", "renew claims", renew),
    ("POST", "/{queue}/results", "consume", "report attempt results", results),
    ("PUT", "/{queue}/state", "consume", "upload local state", put_state),
    ("GET", "/{queue}/peek", "admin", "peek", peek),
    ("GET", "/{queue}/size", "admin", "count messages", size),
    ("GET", "/{queue}/claimcount", "admin", "count claims", claimcount),
    ("DELETE", "/{queue}", "admin", "purge queues", purge),
    ("POST", "/{queue}/unclaimall", "admin", "unclaim all messages", unclaim_all),
]


def add_routes(app: web.Application) -> None:
    for face in FACES:
        for method, path, role, action, handler in ROUTES:
            app.router.add_route(method, face.prefix + path, endpoint(face, role, action, handler))
        for path in (face.prefix, face.prefix + "/{tail:.*}"):
            resource = app.router.add_route("*", path, no_such_route).resource
            assert resource is not None  # a route added by path always belongs to a resource
            CATCH_ALL.add(resource.canonical)
