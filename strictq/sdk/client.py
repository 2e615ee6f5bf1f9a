"""A small client of the gateway's EmoDB face (`/queue/1`), shared by the worker and the producer.

One aiohttp `ClientSession` per client, verifying the gateway with `STRICTQ_CA_FILE`; the API key goes
in `X-BV-API-Key`. A worker's polls declare what it takes part in with `X-Strictq-Capabilities`
(`results, probes`: docs/failure-management.md); a poll without it gets plain EmoDB semantics.
Errors are `GatewayError` (with the HTTP status and the face's error body); a 409 on a fenced ack or renew
is `LeaseRefused` (the claim was superseded or is no longer in flight). Two are permanent and name the
setting to fix (strictq.sdk.errors): `AuthRefused` (401/403: the key, named by `key_setting`) and
`TLSFailed` (the gateway's certificate cannot be verified with STRICTQ_CA_FILE, or the scheme is wrong).
Whether a failure is worth retrying is strictq.sdk.retry's decision, not this module's.

The `strictq` CLI's EmoDB calls go through this client too (strictq.edge_client: one client per role key,
its own verification context via `ssl_context`), so the face has one client and one error path; it adds
what only an admin asks (`peek`, `size`, `claimcount`). A transport failure (status 0, `TLSFailed`
included) keeps aiohttp's exception as its `__cause__` or `__context__`, for a caller that explains it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
import orjson

from protocol import headers
from protocol.estimates import Estimate

from .config import ClientConfig
from .errors import (
    AuthRefused,
    GatewayError,
    LeaseRefused,
    MalformedPollItem,
    ResultsUnsupported,
    TLSFailed,
)
from .item import PollItem, parse_poll

__all__ = [
    "API_KEY_HEADER",
    "CAPABILITIES_HEADER",
    "EmoClient",
    "GatewayError",
    "LeaseRefused",
    "MalformedPollItem",
    "PollItem",
    "ResultsUnsupported",
]

API_KEY_HEADER = headers.API_KEY
LEASE_HEADER = headers.LEASE
GROUP_HEADER = headers.GROUP
CAPABILITIES_HEADER = headers.CAPABILITIES
ESTIMATE_HEADER = headers.ESTIMATE
WORKER_VERSION_HEADER = headers.WORKER_VERSION
WORKER_MAX_BYTES_HEADER = headers.WORKER_MAX_BYTES
HANDOVER_HEADER = headers.HANDOVER
REQUEST_ID_HEADER = headers.REQUEST_ID


class EmoClient:
    """`send`, `send_batch`, `poll`, `ack`, `renew`, `release`, `report`, and an admin's `peek`, `size`
    and `claimcount`, against one gateway with one API key."""

    def __init__(
        self,
        config: ClientConfig,
        api_key: str,
        *,
        timeout: float = 30.0,
        prefix: str = "/queue/1",
        key_setting: str = "STRICTQ_API_KEY",
        ssl_context: ssl.SSLContext | bool | None = None,
    ) -> None:
        """`key_setting`: where `api_key` came from, named when the gateway refuses it. `ssl_context`:
        the verification to use instead of `config.gateway_ssl()` (True: the system's CAs)."""
        self.config = config
        self.base = config.url + prefix
        self.key_setting = key_setting
        self._api_key = api_key
        self._ssl = ssl_context
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EmoClient:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        if self._session is None:
            verify = self._ssl if self._ssl is not None else self.config.gateway_ssl() or False
            connector = aiohttp.TCPConnector(ssl=verify)
            session_headers = {API_KEY_HEADER: self._api_key}
            if self.config.region:  # STRICTQ_REGION: the edge of a cluster reads it (gateway.client_region)
                session_headers[headers.REGION] = self.config.region
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=session_headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                json_serialize=lambda value: orjson.dumps(value).decode(),
            )

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        request_timeout: float | None = None,
        answer_headers: dict[str, str] | None = None,
        root: bool = False,
        headers_seen: Callable[[Mapping[str, str]], None] | None = None,
    ) -> Any:
        """`answer_headers`: filled with the strictq headers of a successful answer (`X-Strictq-*`);
        `root`: `path` is below the gateway's URL, not the face's prefix; `headers_seen`: called with
        the answer's headers."""
        if self._session is None:
            raise RuntimeError("EmoClient is not open (use `async with` or open())")
        data = None if body is None else orjson.dumps(body)
        all_headers = dict(headers or {})
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        kwargs: dict[str, Any] = {}
        if request_timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=request_timeout)
        try:
            async with self._session.request(
                method,
                (self.config.url if root else self.base) + path,
                params=params,
                data=data,
                headers=all_headers,
                **kwargs,
            ) as resp:
                raw = await resp.read()
                status = resp.status
                if answer_headers is not None and status < 400:
                    answer_headers.update(
                        (k, v) for k, v in resp.headers.items() if k.lower().startswith("x-strictq-")
                    )
                if headers_seen is not None and status < 400:
                    headers_seen(resp.headers)
        except aiohttp.ClientSSLError as exc:
            raise self._tls_failed(exc) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            sent = not isinstance(exc, aiohttp.ClientConnectorError)  # refused before the request left
            raise GatewayError(f"{method} {path}: {type(exc).__name__}: {exc}", sent=sent) from exc
        try:
            answer = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            answer = raw.decode("utf-8", errors="replace")
        if status >= 400:
            message = f"{method} {path}: HTTP {status}"
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                message += f" {answer['error'].get('code')}: {answer['error'].get('message')}"
            if status in (401, 403):
                raise AuthRefused(
                    f"the gateway at {self.config.url} refuses the key in {self.key_setting} ({message}); "
                    f"check {self.key_setting}",
                    status,
                    answer,
                )
            cls = LeaseRefused if status == 409 else GatewayError
            raise cls(message, status, answer)
        return answer

    def _tls_failed(self, exc: aiohttp.ClientSSLError) -> TLSFailed:
        """The one line a TLS failure deserves: which CA was used, from which setting, and what to do."""
        url = self.config.url
        reason = getattr(exc, "certificate_error", None) or exc.os_error
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            if self.config.ca_file:
                trust = f"STRICTQ_CA_FILE={self.config.ca_file}"
                advice = "is it this gateway's CA? (`strictq serve` writes client.env naming its CA file)"
            else:
                trust = "the system trust store (STRICTQ_CA_FILE is not set)"
                advice = "set STRICTQ_CA_FILE to the gateway's CA file (`strictq serve` writes client.env)"
            return TLSFailed(f"cannot verify the certificate of {url} with {trust}: {reason}; {advice}")
        return TLSFailed(
            f"TLS handshake with {url} failed: {reason}; does the server speak HTTPS on that port? "
            "(STRICTQ_URL: https:// for `strictq serve`, http:// only with --insecure-http)"
        )

    # -- producer side ---------------------------------------------------------------------------------

    async def send(
        self, queue: str, message: Any, *, group: str | None = None, request_id: str | None = None
    ) -> None:
        """`request_id`: the request's `X-Request-Id` (protocol.request_ids); None: the gateway makes one."""
        params = {"group": group} if group is not None else None
        await self._call(
            "POST", f"/{_q(queue)}/send", params=params, body=message, headers=_request_id(request_id)
        )

    async def send_batch(
        self,
        batches: Mapping[str, Sequence[Any]],
        *,
        group: str | None = None,
        request_id: str | None = None,
        estimate: Estimate | None = None,
    ) -> None:
        """EmoDB `_sendbatch`: `{"<queue>": [messages]}`, one group (or none) for the whole request;
        `request_id` as for `send` (every message of the request keeps it); `estimate`: the messages'
        processing-time estimate (`X-Strictq-Estimate`, pipelining), every message's."""
        params = {"group": group} if group is not None else None
        body = {q: list(m) for q, m in batches.items()}
        extra = _request_id(request_id) or {}
        if estimate is not None and estimate.known:
            extra[ESTIMATE_HEADER] = ", ".join(f"{k}={v:g}" for k, v in estimate.to_json().items())
        await self._call("POST", "/_sendbatch", params=params, body=body, headers=extra or None)

    # -- worker side -----------------------------------------------------------------------------------

    async def poll(
        self,
        queue: str,
        *,
        ttl: float | None,
        limit: int,
        wait: float | None = None,
        capabilities: Sequence[str] = (),
        version: str = "",
        handover: list[str] | None = None,
        max_bytes: int = 0,
        headers_seen: Callable[[Mapping[str, str]], None] | None = None,
    ) -> list[PollItem]:
        """Claim up to `limit` messages for `ttl` seconds (None: the queue's default). `capabilities` (e.g.
        `("results", "probes")`) are declared in `X-Strictq-Capabilities`: the worker opts in to failure
        management for this poll. `handover`: filled with the groups the answer asks this worker to
        export the local state of (`X-Strictq-Handover`, for a poll declaring `state`).
        An answer that is not a list of poll items raises `MalformedPollItem` (naming the item and field;
        its `items` are the ones of the answer that could be read, claimed all the same)."""
        params = {"limit": str(limit)} if ttl is None else {"ttl": f"{ttl:g}", "limit": str(limit)}
        headers = {CAPABILITIES_HEADER: ", ".join(capabilities)} if capabilities else {}
        if version:
            headers[WORKER_VERSION_HEADER] = version
        if max_bytes:
            headers[WORKER_MAX_BYTES_HEADER] = str(max_bytes)
        timeout = None
        if wait is not None:
            params["wait"] = f"{wait:g}"
            timeout = self._timeout + wait
        seen: dict[str, str] | None = {} if handover is not None else None
        answer = await self._call(
            "GET",
            f"/{_q(queue)}/poll",
            params=params,
            headers=headers,
            request_timeout=timeout,
            answer_headers=seen,
            headers_seen=headers_seen,
        )
        if handover is not None and seen:
            named = next((v for k, v in seen.items() if k.lower() == HANDOVER_HEADER.lower()), "")
            handover.extend(unquote(part) for part in named.split(",") if part)
        return parse_poll(answer, queue)

    async def put_state(self, queue: str, states: Mapping[str, Any]) -> dict[str, str]:
        """Upload local state of moved groups (state transfer, docs/state-transfer.md): `{group: state}`;
        answers each group's status (`ok`, or `not_requested`), once the gateway has made it durable."""
        answer = await self._call("PUT", f"/{_q(queue)}/state", body=dict(states))
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list):
            raise GatewayError(f"PUT /{queue}/state: unexpected answer {str(answer)[:80]}", 200, answer)
        return {str(r.get("group")): str(r.get("status")) for r in results if isinstance(r, dict)}

    async def heartbeat(self, body: Mapping[str, Any]) -> Any:
        """A fleet heartbeat (`POST /fleet/v1/heartbeat`, docs/fleet.md): the answer's JSON."""
        return await self._call("POST", "/fleet/v1/heartbeat", body=dict(body), root=True)

    async def ack(self, queue: str, ids: Sequence[str], token: int | str | None) -> None:
        await self._call("POST", f"/{_q(queue)}/ack", body=list(ids), headers=_lease(token))

    async def renew(self, queue: str, ids: Sequence[str], token: int | str | None, ttl: float) -> None:
        """Extend-only renew; ttl 0 releases (EmoDB's unclaim).

        A renew that keeps a claim alive must not count a message that is gone (acked by whoever holds
        the group now) as renewed: when the answer lists per-id `results` (the shape of the face's 409
        body), any status but `ok` is a `LeaseRefused`. Today's face answers a bare `{"success": true}`
        for gone messages, which cannot be told apart (reported)."""
        answer = await self._call(
            "POST", f"/{_q(queue)}/renew", params={"ttl": f"{ttl:g}"}, body=list(ids), headers=_lease(token)
        )
        if ttl > 0 and isinstance(answer, dict) and isinstance(answer.get("results"), list):
            bad = [r for r in answer["results"] if isinstance(r, dict) and r.get("status") != "ok"]
            if bad:
                ids_refused = [r.get("id") for r in bad]
                raise LeaseRefused(
                    f"renew in {queue}: {len(bad)} claim(s) not renewed ({bad[0].get('status')})",
                    200,
                    {"error": {"code": bad[0].get("status"), "details": {"ids": ids_refused}}},
                )

    async def release(self, queue: str, ids: Sequence[str], token: int | str | None) -> None:
        await self.renew(queue, ids, token, 0)

    async def report(self, queue: str, results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Attempt results (strictq's extension of the face, docs/failure-management.md §1): one item per
        result, `{"id", "status": "ok" | "gone" | "stale_claim" | "not_in_flight" | "out_of_order", ...}`,
        in the order given. A gateway without the route raises `ResultsUnsupported`."""
        try:
            answer = await self._call("POST", f"/{_q(queue)}/results", body={"results": list(results)})
        except GatewayError as exc:
            if exc.status in (404, 405) and exc.code in (None, "no_such_route", "method_not_allowed"):
                raise ResultsUnsupported(str(exc), exc.status, exc.body) from exc
            raise
        items = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(items, list) or len(items) != len(results):
            raise GatewayError(f"results of {queue}: unexpected answer {answer!r}"[:300], 200, answer)
        return [i if isinstance(i, dict) else {} for i in items]

    # -- admin side (the EmoDB face lets only an admin key peek and count) --------------------------------

    async def peek(self, queue: str, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` messages without claiming them (the face adds `group` and `seq`)."""
        answer = await self._call("GET", f"/{_q(queue)}/peek", params={"limit": str(limit)})
        if not isinstance(answer, list) or not all(isinstance(m, dict) for m in answer):
            got = f"peek of {queue}: expected a list of objects, got {answer!r}"[:300]
            raise GatewayError(got, 200, answer)
        return answer

    async def size(self, queue: str) -> int:
        """Messages in the queue, claimed or not (EmoDB's size)."""
        return _count(await self._call("GET", f"/{_q(queue)}/size"), f"size of {queue}")

    async def claimcount(self, queue: str) -> int:
        """Messages claimed and in flight (EmoDB's claimcount)."""
        return _count(await self._call("GET", f"/{_q(queue)}/claimcount"), f"claimcount of {queue}")


def _q(queue: str) -> str:
    """A queue name as one path segment (`/`, `?`, `%` ... escaped; the face decodes them)."""
    return quote(queue, safe="")


def _count(answer: Any, what: str) -> int:
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise GatewayError(f"{what}: expected a number, got {answer!r}"[:300], 200, answer)
    return answer


def _lease(token: int | str | None) -> dict[str, str]:
    return {} if token is None or token == "" else {LEASE_HEADER: str(token)}


def _request_id(request_id: str | None) -> dict[str, str] | None:
    return {REQUEST_ID_HEADER: request_id} if request_id is not None else None
