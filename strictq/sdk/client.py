"""A small client of the gateway's EmoDB face (`/queue/1`), shared by the worker and the producer.

One aiohttp `ClientSession` per client, verifying the gateway with `STRICTQ_CA_FILE`; the API key goes
in `X-BV-API-Key`. A worker's polls declare what it takes part in with `X-Strictq-Capabilities`
(`results, probes`: docs/failure-management.md); a poll without it gets plain EmoDB semantics.
Errors are `GatewayError` (with the HTTP status and the face's error body); a 409 on a fenced ack or renew
is `LeaseRefused` (the claim was superseded or is no longer in flight).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from protocol import headers

from .config import ClientConfig

API_KEY_HEADER = headers.API_KEY
LEASE_HEADER = headers.LEASE
GROUP_HEADER = headers.GROUP
CAPABILITIES_HEADER = headers.CAPABILITIES


class GatewayError(Exception):
    """The gateway refused a call or could not be reached (status 0)."""

    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def code(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            code = self.body["error"].get("code")
            return code if isinstance(code, str) else None
        return None

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer at all, the store is unavailable, or too many requests."""
        return self.status == 0 or self.status in (429, 502, 503, 504)


class LeaseRefused(GatewayError):
    """A fenced ack/renew was refused (409): the claim's token is stale or the message is not in flight."""

    @property
    def ids(self) -> list[str]:
        if isinstance(self.body, dict):
            details = (self.body.get("error") or {}).get("details") or {}
            ids = details.get("ids")
            if isinstance(ids, list):
                return [i for i in ids if isinstance(i, str)]
        return []


class EmoClient:
    """`send`, `send_batch`, `poll`, `ack`, `renew` and `release` against one gateway."""

    def __init__(
        self, config: ClientConfig, api_key: str, *, timeout: float = 30.0, prefix: str = "/queue/1"
    ) -> None:
        self.config = config
        self.base = config.url + prefix
        self._api_key = api_key
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EmoClient:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.config.gateway_ssl() or False)
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={API_KEY_HEADER: self._api_key},
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
    ) -> Any:
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
                method, self.base + path, params=params, data=data, headers=all_headers, **kwargs
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GatewayError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        try:
            answer = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            answer = raw.decode("utf-8", errors="replace")
        if status >= 400:
            message = f"{method} {path}: HTTP {status}"
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                message += f" {answer['error'].get('code')}: {answer['error'].get('message')}"
            cls = LeaseRefused if status == 409 else GatewayError
            raise cls(message, status, answer)
        return answer

    # -- producer side ---------------------------------------------------------------------------------

    async def send(self, queue: str, message: Any, *, group: str | None = None) -> None:
        params = {"group": group} if group is not None else None
        await self._call("POST", f"/{queue}/send", params=params, body=message)

    async def send_batch(self, batches: Mapping[str, Sequence[Any]], *, group: str | None = None) -> None:
        """EmoDB `_sendbatch`: `{"<queue>": [messages]}`, one group (or none) for the whole request."""
        params = {"group": group} if group is not None else None
        await self._call("POST", "/_sendbatch", params=params, body={q: list(m) for q, m in batches.items()})

    # -- worker side -----------------------------------------------------------------------------------

    async def poll(
        self,
        queue: str,
        *,
        ttl: float,
        limit: int,
        wait: float | None = None,
        capabilities: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """Claim up to `limit` messages for `ttl` seconds. `capabilities` (e.g. `("results", "probes")`) are
        declared in `X-Strictq-Capabilities`: the worker opts in to failure management for this poll."""
        params = {"ttl": f"{ttl:g}", "limit": str(limit)}
        headers = {CAPABILITIES_HEADER: ", ".join(capabilities)} if capabilities else None
        timeout = None
        if wait is not None:
            params["wait"] = f"{wait:g}"
            timeout = self._timeout + wait
        answer = await self._call(
            "GET", f"/{queue}/poll", params=params, headers=headers, request_timeout=timeout
        )
        if not isinstance(answer, list):
            raise GatewayError(
                f"poll of {queue}: expected a JSON list, got {type(answer).__name__}", 200, answer
            )
        return [m for m in answer if isinstance(m, dict) and isinstance(m.get("id"), str)]

    async def ack(self, queue: str, ids: Sequence[str], token: int | str | None) -> None:
        await self._call("POST", f"/{queue}/ack", body=list(ids), headers=_lease(token))

    async def renew(self, queue: str, ids: Sequence[str], token: int | str | None, ttl: float) -> None:
        """Extend-only renew; ttl 0 releases (EmoDB's unclaim).

        A renew that keeps a claim alive must not count a message that is gone (acked by whoever holds
        the group now) as renewed: when the answer lists per-id `results` (the shape of the face's 409
        body), any status but `ok` is a `LeaseRefused`. Today's face answers a bare `{"success": true}`
        for gone messages, which cannot be told apart (reported)."""
        answer = await self._call(
            "POST", f"/{queue}/renew", params={"ttl": f"{ttl:g}"}, body=list(ids), headers=_lease(token)
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
            answer = await self._call("POST", f"/{queue}/results", body={"results": list(results)})
        except GatewayError as exc:
            if exc.status in (404, 405) and exc.code in (None, "no_such_route", "method_not_allowed"):
                raise ResultsUnsupported(str(exc), exc.status, exc.body) from exc
            raise
        items = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(items, list) or len(items) != len(results):
            raise GatewayError(f"results of {queue}: unexpected answer {answer!r}"[:300], 200, answer)
        return [i if isinstance(i, dict) else {} for i in items]


class ResultsUnsupported(GatewayError):
    """The gateway has no results route (an older version): ack and release are all it takes."""


def _lease(token: int | str | None) -> dict[str, str]:
    return {} if token is None or token == "" else {LEASE_HEADER: str(token)}
