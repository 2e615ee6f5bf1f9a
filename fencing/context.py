"""What the addons know about one outbound call, shared through `flow.metadata`.

The addons run in a fixed order (see `fencing.addons.ordered_addons`): auth sets the worker, tagging
parses the `X-Strictq-*` tags, the guards (fence, lease guard) may answer the call themselves through
`refuse()`, and capture writes one wire-log record from this context whatever happened. Keeping it one
small dataclass is what lets each addon stay ignorant of the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from mitmproxy import http

from access.tenancy import DEFAULT_FACE, FACES, core_name
from protocol import headers
from wirelog.record import ACTION_PASS

METADATA_KEY = "strictq"
PROXY_ACTION_HEADER = headers.PROXY_ACTION

# The actions (wirelog.record.ACTIONS: the wire log's `action` field and X-Strictq-Proxy-Action, listed in
# docs/contracts.md) are not error codes: their spelling is a contract with SDKs and stored wire logs, so
# `stale-lease` stays; the `code` of a refusal's body (and of its wire-log record) is snake_case like every
# error code (protocol.errors, docs/errors.md).

# The faces a queue reference (`X-Strictq-Queue`, the poll item's `queue_ref`) may name: the tenant's
# namespaces in the core (access.tenancy): `t1.orders` is the queue face's (shared by `/queue/1` and SQS),
# `t1_dedupq.orders` EmoDB's dedup queue. A reference without a face: the plain queue face, as tags were
# before faces.


class BadQueueReference(ValueError):
    """The message says what is wrong with an `X-Strictq-Queue` value."""


def parse_queue_ref(text: str) -> tuple[str, str]:
    """(face, name) of a queue reference: `NAME` (the queue face) or `FACE/NAME` (`queue` or `dedupq`).

    It never names a tenant: the proxy takes the tenant from the worker's credential, so a reference can
    only ever point into the worker's own tenant (`dedupq/t2_dedupq.x` is the queue `t2_dedupq.x` of the
    worker's tenant's dedup face, which no gateway name reaches)."""
    face, slash, name = text.partition("/")
    if not slash:
        return DEFAULT_FACE, text
    if face not in FACES:
        raise BadQueueReference(
            f"unknown face {face[:40]!r} (a queue reference is NAME or FACE/NAME, FACE one of "
            f"{', '.join(FACES)})"
        )
    if not name or "/" in name:
        raise BadQueueReference("a queue reference is NAME or FACE/NAME, with one non-empty NAME")
    return face, name


@dataclass(slots=True)
class CallContext:
    """One call through the proxy. Fields stay None until the addon responsible fills them."""

    started: float  # time.time() when the request headers arrived
    worker: str | None = None  # authenticated worker id (Proxy-Authorization)
    tenant: str | None = None  # the worker credential's tenant
    # The tags, as the SDK sent them (queue is the name the worker sees, without tenant; face the face of
    # the X-Strictq-Queue reference, `queue` or `dedupq`, None without the tag).
    queue: str | None = None
    face: str | None = None
    message_id: str | None = None
    group: str | None = None
    lease: int | None = None
    attempt: int | None = None
    call: int | None = None
    request_id: str | None = None  # the id of the request that sent the message (X-Strictq-Request-Id)
    tagged: bool = False
    # What the proxy did: "pass" unless a guard answered the call itself.
    action: str = ACTION_PASS
    code: str | None = None  # machine-readable reason when the proxy answered itself
    replayed_from: str | None = None  # wire-log record id a mimicked response came from
    error: str | None = None  # upstream or proxy error text
    # How mimicry and replay recognise "the same request": method, host, path, query and body sha256,
    # all after redaction (set by the redact addon, before the guards run).
    request_identity: tuple[str, str, str, str, str] | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # The redacted views the wire log gets (schema v1 `request` / `response` objects), built by the
    # redact addon; nothing else in the proxy writes request or response content to disk.
    request_view: dict[str, Any] | None = None
    response_view: dict[str, Any] | None = None
    log_level: str = "full"  # the endpoint's level: full | headers-omitted | metadata | on-failure
    recorded: bool = False  # capture wrote this call's record (a flow can reach two final hooks)

    @property
    def internal_queue(self) -> str | None:
        """The core's name for the tagged queue (`<tenant>.<name>`, `<tenant>_dedupq.<name>`), the scope of
        fencing tokens. The tenant is always the worker credential's, never the tag's."""
        if self.queue is None or self.tenant is None:
            return None
        return core_name(self.tenant, self.queue, self.face or DEFAULT_FACE)

    @property
    def queue_ref(self) -> str | None:
        """The tagged queue as the worker names it: `orders`, `dedupq/orders`."""
        if self.queue is None:
            return None
        face = self.face or DEFAULT_FACE
        return self.queue if face == DEFAULT_FACE else f"{face}/{self.queue}"


def context_of(flow: http.HTTPFlow) -> CallContext | None:
    value = flow.metadata.get(METADATA_KEY)
    return value if isinstance(value, CallContext) else None


def ensure_context(flow: http.HTTPFlow) -> CallContext:
    """The flow's context, created on first use (by the first addon that sees the call: auth)."""
    value = flow.metadata.get(METADATA_KEY)
    if isinstance(value, CallContext):
        return value
    ctx = CallContext(started=time.time())
    flow.metadata[METADATA_KEY] = ctx
    return ctx


def refuse(
    flow: http.HTTPFlow,
    ctx: CallContext,
    *,
    status: int,
    action: str,
    code: str,
    message: str,
    extra_headers: dict[str, str] | None = None,
    announce: bool = True,
) -> None:
    """Answer the call from the proxy itself: the request never reaches the backend.

    Setting `flow.response` in `requestheaders`/`request` is what stops mitmproxy from connecting
    upstream (with the lazy connection strategy no upstream socket is opened at all). `announce=False`
    for refusals that are not a verdict on the worker's claim (400 malformed tags, 407): the wire log
    records them as `block` with the code, but no X-Strictq-Proxy-Action header tells the SDK to cancel.
    """
    ctx.action = action
    ctx.code = code
    body = orjson.dumps({"code": code, "action": action, "message": message})
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    if announce:
        headers[PROXY_ACTION_HEADER] = action
    flow.response = http.Response.make(status, body, headers)
