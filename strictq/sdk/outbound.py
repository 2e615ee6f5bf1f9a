"""Outbound HTTP for handlers: an aiohttp `ClientSession` that tags each call with the message being
processed, goes through the egress proxy with the worker's credential, and cancels the handler when the
proxy fences the call.

The tags (docs/contracts.md, *Headers*): `X-Strictq-Queue`, `X-Strictq-Message-Id`, `X-Strictq-Group`,
`X-Strictq-Lease` (the claim's fencing token), `X-Strictq-Attempt` and `X-Strictq-Call` (the ordinal of
the call within the attempt, 1, 2, ...), and `X-Strictq-Request-Id` (the id of the request that sent the
message) when the delivery carried one. `X-Strictq-Queue` is the poll item's `queue_ref`, echoed as
the gateway gave it (`orders`, or `dedupq/orders` for an EmoDB dedup queue, whose floors the proxy keeps
apart from the plain queue's); from a gateway without it, the worker's queue name (the plain queue face).
A response the proxy makes itself carries `X-Strictq-Proxy-Action`; on `stale-lease` and `block` the
handler is cancelled (its claim is no longer valid or the worker is fenced) and the call raises
`CallFenced` in the meantime.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
from yarl import URL

from protocol import headers
from protocol.errors import parse_error
from protocol.request_ids import is_request_id
from wirelog.record import ACTION_BLOCK, ACTION_STALE_LEASE

log = logging.getLogger("strictq.sdk")

H_QUEUE = headers.QUEUE
H_MESSAGE_ID = headers.MESSAGE_ID
H_GROUP = headers.GROUP
H_LEASE = headers.LEASE
H_ATTEMPT = headers.ATTEMPT
H_CALL = headers.CALL
H_REQUEST_ID = headers.REQUEST_ID_TAG
H_PROXY_ACTION = headers.PROXY_ACTION
TAG_HEADERS = headers.TAGS
CANCELLING_ACTIONS = frozenset({ACTION_STALE_LEASE, ACTION_BLOCK})


class CallFenced(aiohttp.ClientError):
    """The egress proxy refused a tagged call (`stale-lease` or `block`); the handler is being cancelled."""

    def __init__(self, action: str, code: str | None, status: int) -> None:
        super().__init__(f"egress proxy refused the call: {action} (code {code}, HTTP {status})")
        self.action = action
        self.code = code
        self.status = status


class Tags:
    """One attempt at one message, as outbound calls see it: the tag values, the call counter, and the
    task to cancel when the proxy fences a call."""

    def __init__(
        self,
        queue: str,
        message_id: str,
        group: str,
        token: int | str,
        attempt: int,
        request_id: str | None = None,
    ) -> None:
        self.queue = queue
        self.message_id = message_id
        self.group = group
        self.token = str(token)
        self.attempt = attempt
        self.request_id = request_id  # of the request that sent the message (X-Strictq-Request-Id)
        self.calls = 0
        self.task: asyncio.Task[Any] | None = None
        self.abort_reason: str | None = None
        self.fenced: CallFenced | None = None
        self.last_failed_call: str | None = None  # signature of the attempt's latest failed call

    @classmethod
    def for_item(cls, queue: str, item: Mapping[str, Any], group: str, attempt: int) -> Tags:
        """The tags of an attempt at a polled item: `queue` is the worker's queue name, used when the item
        has no `queue_ref` (an older gateway)."""
        ref = item.get("queue_ref")
        reference = ref if isinstance(ref, str) and ref else queue
        request_id = item.get("request_id")
        return cls(
            reference,
            item["id"],
            group,
            item.get("token", ""),
            attempt,
            request_id if is_request_id(request_id) else None,
        )

    def next_headers(self) -> dict[str, str]:
        self.calls += 1
        tags = {
            H_QUEUE: self.queue,
            H_MESSAGE_ID: self.message_id,
            H_GROUP: self.group,
            H_LEASE: self.token,
            H_ATTEMPT: str(self.attempt),
            H_CALL: str(self.calls),
        }
        if self.request_id is not None:
            tags[H_REQUEST_ID] = self.request_id
        return tags

    def note_failure(self, method: str, url: str, status: int | None, action: str | None) -> None:
        """A tagged call failed (no answer, >= 400, or the proxy answered it): the attempt's signature,
        should the handler fail (strictq.sdk.attempt.failure_signature)."""
        from .attempt import call_signature

        self.last_failed_call = call_signature(method, url, status, action)

    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def abort(self, reason: str) -> None:
        """Cancel the handler (idempotent): its result must not count any more."""
        if self.abort_reason is None:
            self.abort_reason = reason
        if self.task is not None and not self.task.done():
            self.task.cancel(f"strictq: {reason}")


# The attempt whose handler is running in this context (a handler's child tasks inherit it).
CURRENT: contextvars.ContextVar[Tags | None] = contextvars.ContextVar("strictq_current_attempt", default=None)


class TaggingMiddleware:
    """aiohttp client middleware: tags (from the bound attempt, else the current context's), the egress
    proxy with Proxy-Authorization, and the proxy's verdict."""

    def __init__(
        self,
        bound: Tags | None = None,
        *,
        proxy_url: str | None = None,
        proxy_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.bound = bound
        self.proxy = URL(proxy_url) if proxy_url else None
        self.proxy_headers = dict(proxy_headers or {})

    async def __call__(self, req: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        tags = self.bound if self.bound is not None else CURRENT.get()
        if tags is not None:
            if (fenced := tags.fenced) is not None:  # the attempt is over: no further side effects
                raise CallFenced(fenced.action, fenced.code, fenced.status)
            for name, value in tags.next_headers().items():
                req.headers[name] = value
        if self.proxy is not None and req.proxy is None:
            if req.is_ssl():  # HTTPS goes through a CONNECT tunnel: the credential goes on the CONNECT
                req.update_proxy(self.proxy, None, self.proxy_headers)
            else:  # plain HTTP is sent to the proxy in absolute form: the credential rides on the request
                req.update_proxy(self.proxy, None, None)
                req.headers.update(self.proxy_headers)
        try:
            resp = await handler(req)
        except aiohttp.ClientHttpProxyError as exc:  # the proxy answered a CONNECT itself
            action = exc.headers.get(H_PROXY_ACTION) if exc.headers else None
            if tags is not None:
                tags.note_failure(req.method, str(req.url), exc.status, action)
            if tags is not None and action in CANCELLING_ACTIONS:
                raise self._fence(tags, action, None, exc.status) from exc
            raise
        except (aiohttp.ClientError, TimeoutError):
            if tags is not None:
                tags.note_failure(req.method, str(req.url), None, None)
            raise
        action = resp.headers.get(H_PROXY_ACTION)
        if tags is not None and resp.status >= 400:
            tags.note_failure(req.method, str(req.url), resp.status, action)
        if tags is not None and action in CANCELLING_ACTIONS:
            code = None
            try:
                body = orjson.loads(await resp.read())
                if isinstance(body, dict):  # snake case, whichever casing the proxy (old or new) sent
                    code = parse_error(body, default_code="").code or None
            except (orjson.JSONDecodeError, aiohttp.ClientError, UnicodeDecodeError):
                pass
            finally:
                resp.release()
            raise self._fence(tags, action, code, resp.status)
        return resp

    @staticmethod
    def _fence(tags: Tags, action: str, code: str | None, status: int) -> CallFenced:
        error = CallFenced(action, code, status)
        if tags.fenced is None:
            tags.fenced = error
        log.warning(
            "outbound call for message %s (queue %s, group %s, lease %s) refused by the proxy: %s (%s); "
            "cancelling the handler",
            tags.message_id,
            tags.queue,
            tags.group,
            tags.token,
            action,
            code,
        )
        tags.abort(f"proxy answered {action}")
        return error


def proxy_authorization(worker_id: str | None, worker_secret: str | None) -> dict[str, str]:
    if not worker_id or not worker_secret:
        return {}
    return {"Proxy-Authorization": aiohttp.encode_basic_auth(worker_id, worker_secret)}


def tagged_session(
    connector: aiohttp.BaseConnector,
    *,
    bound: Tags | None = None,
    proxy_url: str | None = None,
    proxy_headers: Mapping[str, str] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientSession:
    """A session over a shared connector (not owned: closing the session leaves the pool open)."""
    middleware = TaggingMiddleware(bound, proxy_url=proxy_url, proxy_headers=proxy_headers)
    return aiohttp.ClientSession(
        connector=connector,
        connector_owner=False,
        middlewares=(middleware,),
        timeout=timeout or aiohttp.ClientTimeout(total=60),
    )
