"""Tagging addon: which message a call is made for. The SDK adds `X-Strictq-Queue`, `-Message-Id`,
`-Group`, `-Lease` (the claim's fencing token), `-Attempt` and `-Call` (the ordinal within the attempt,
counted by the SDK, never by the proxy) to every outbound call of a handler, and `-Request-Id` (the id
of the request that sent the message, protocol.request_ids) when its delivery carried one; capture
writes it into the call's record as `request_id`. It fences nothing: a malformed one is a malformed tag
all the same (400), so a record never holds a request id the gateway would not have given.

`X-Strictq-Queue` is a queue reference, the poll item's `queue_ref` echoed: `NAME` for the queue face
(`/queue/1`, shared with SQS; what every SDK sent before faces) or `dedupq/NAME` for an EmoDB dedup queue
(`queue/NAME` is accepted too). It never carries a tenant: the floor looked up is that of the worker
credential's tenant (`CallContext.internal_queue`). An unknown face is a malformed tag.

- The tags are parsed into the `CallContext`; a call without any tag is "untagged" and passes (it is
  still logged, with null message fields).
- Malformed tags (non-numeric lease/attempt/call, oversized or empty values, a repeated tag, a partial
  set without a message id, a lease without its queue and group) get 400 with a JSON body; the call is
  recorded and never reaches the backend.
- The tags are stripped before the call leaves (option `strictq_keep_tags` keeps them).
"""

from __future__ import annotations

from mitmproxy import http
from mitmproxy.addonmanager import Loader

from fencing.context import BadQueueReference, CallContext, ensure_context, parse_queue_ref, refuse
from fencing.runtime import ProxyRuntime
from protocol import errors, headers
from protocol.request_ids import RULE as REQUEST_ID_RULE
from protocol.request_ids import is_request_id
from wirelog.record import ACTION_BLOCK

PREFIX = headers.TAG_PREFIX.lower().encode()
HEADER_NAMES = {
    "queue": headers.QUEUE,
    "message_id": headers.MESSAGE_ID,
    "group": headers.GROUP,
    "lease": headers.LEASE,
    "attempt": headers.ATTEMPT,
    "call": headers.CALL,
    "request_id": headers.REQUEST_ID_TAG,  # optional: only when the delivery carried one
}
TAGS: dict[bytes, str] = {name.lower().encode(): field for field, name in HEADER_NAMES.items()}
NUMERIC = frozenset({"lease", "attempt", "call"})
MAX_LEASE = 2**64 - 1  # fencing tokens are 64-bit
MAX_COUNT = 2**31 - 1  # attempts and call ordinals


class MalformedTags(ValueError):
    """The message says what is wrong (it goes into the 400 body and the wire log)."""


class Tagging:
    def __init__(self, runtime: ProxyRuntime) -> None:
        self.runtime = runtime
        self.keep_tags = False
        self.max_bytes = 256

    def load(self, loader: Loader) -> None:
        add = loader.add_option
        add(
            "strictq_keep_tags",
            bool,
            False,
            "Forward the X-Strictq-* tags upstream instead of stripping them.",
        )
        add("strictq_tag_max_bytes", int, 256, "Longest accepted X-Strictq-* tag value, in bytes.")

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if "strictq_keep_tags" in updated:
            self.keep_tags = ctx.options.strictq_keep_tags
        if "strictq_tag_max_bytes" in updated:
            self.max_bytes = max(1, ctx.options.strictq_tag_max_bytes)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        headers = flow.request.headers
        fields = headers.fields
        # One pass over the raw header fields; almost every header fails the cheap length/prefix test.
        found: list[tuple[bytes, bytes]] | None = None
        for name, value in fields:
            if len(name) > 10 and name[:10].lower() == PREFIX:
                lower = name.lower()
                if lower in TAGS:
                    if found is None:
                        found = []
                    found.append((lower, value))
        if found is None:
            return
        if not self.keep_tags:
            headers.fields = tuple(f for f in fields if f[0].lower() not in TAGS)
        ctx = ensure_context(flow)
        try:
            parse_into(ctx, found, self.max_bytes)
        except MalformedTags as exc:
            self.runtime.count("tagging.malformed")
            if flow.response is None:  # an earlier refusal (407) stands
                refuse(
                    flow,
                    ctx,
                    status=400,
                    action=ACTION_BLOCK,
                    code=errors.MALFORMED_TAGS,
                    message=str(exc),
                    announce=False,
                )


def parse_into(ctx: CallContext, found: list[tuple[bytes, bytes]], max_bytes: int) -> None:
    """Set the context's tag fields from (lowercase name, raw value) pairs; raise MalformedTags.

    Fields that parse are set even when another one is malformed, so the refusal's record still says
    which message it was about."""
    seen: set[str] = set()
    problems: list[str] = []
    for name, raw in found:
        field = TAGS[name]
        header = HEADER_NAMES[field]
        if field in seen:
            problems.append(f"{header} is repeated")
            continue
        seen.add(field)
        if len(raw) > max_bytes:
            problems.append(f"{header} is longer than {max_bytes} bytes")
            continue
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            problems.append(f"{header} is not UTF-8")
            continue
        if not text:
            problems.append(f"{header} is empty")
            continue
        if field in NUMERIC:
            limit = MAX_LEASE if field == "lease" else MAX_COUNT
            if not (text.isascii() and text.isdigit()) or int(text) > limit:
                problems.append(f"{header} must be a decimal integer (0-{limit})")
                continue
            setattr(ctx, field, int(text))
        elif field == "queue":
            try:
                ctx.face, ctx.queue = parse_queue_ref(text)
            except BadQueueReference as exc:
                problems.append(f"{header}: {exc}")
                continue
        elif field == "request_id":
            if not is_request_id(text):
                problems.append(f"{header} must be {REQUEST_ID_RULE}")
                continue
            ctx.request_id = text
        else:
            setattr(ctx, field, text)
    ctx.tagged = True
    if "message_id" not in seen:
        problems.append("X-Strictq-Message-Id is missing (a partial tag set)")
    if "lease" in seen and not {"queue", "group"} <= seen:
        problems.append("X-Strictq-Lease needs X-Strictq-Queue and X-Strictq-Group")
    if problems:
        raise MalformedTags("malformed X-Strictq-* tags: " + "; ".join(problems))
