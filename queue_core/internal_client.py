"""The one transport of the internal API, shared by its two clients: the gateway's backend
(queue_core.remote.RemoteQueueService, one per cluster partition too) and the tools' QueueClient
(queue_core.client).

Why one: both used to build paths, bodies and headers by hand, each its own way. Here an operation of the
table (queue_core.operations), bound to its arguments, becomes one HTTP request: the table's method and
path, the JSON body with its content type, the headers every request of this client carries (a cluster
node's X-Strictq-Partition), the query. What an answer means (a typed value or a typed error, a passed-on
refusal, a QueueClientError) stays with each client: their callers expect different errors.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from .internal_auth import InternalSecret
from .operations import Call


@dataclass(frozen=True, slots=True)
class Answer:
    """A server's answer as it came: status, reason phrase and body bytes."""

    status: int
    reason: str
    raw: bytes


class InternalClient:
    """Requests to one queue server (or one cluster node) at `url`: each with `headers` (a partition's),
    on a session the owner makes and closes (queue_core.remote.client_session, QueueClient's own)."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.headers: dict[str, str] = dict(headers or {})
        self._json_headers = {**self.headers, "Content-Type": "application/json"}

    def request(
        self,
        session: aiohttp.ClientSession,
        call: Call[Any],
        *,
        timeout: aiohttp.ClientTimeout | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> Any:
        """The request of `call`, as aiohttp's context manager (a stream reads the response itself)."""
        request = call.request
        return self.send(
            session,
            call.operation.method,
            call.path,
            request.body,
            request.query,
            timeout=timeout,
            extra=extra,
        )

    def send(
        self,
        session: aiohttp.ClientSession,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        *,
        timeout: aiohttp.ClientTimeout | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> Any:
        """Any request (QueueClient.request: a test's own path and body); `request` is this with the
        table's method and path."""
        data = None if body is None else orjson.dumps(body)
        headers = self._json_headers if data is not None else self.headers
        if extra:
            headers = {**headers, **extra}
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return session.request(method, self.url + path, data=data, params=query, headers=headers, **options)

    async def exchange(
        self,
        session: aiohttp.ClientSession,
        call: Call[Any],
        *,
        limit: aiohttp.ClientTimeout | None = None,
    ) -> Answer:
        """`call` sent and its whole answer read (aiohttp's errors raised as they are); `limit`: the
        request's timeouts (None: the session's)."""
        async with self.request(session, call, timeout=limit) as response:
            return Answer(response.status, response.reason or "", await response.read())


def client_session(
    ca_file: str | None = None,
    default_headers: Mapping[str, str] | None = None,
    *,
    secret: InternalSecret | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
) -> aiohttp.ClientSession:
    """A pooled session for the internal API (TLS verified against `ca_file` when given). Every request
    of it carries `secret` (queue_core.internal_auth) and `default_headers`, set here once."""
    ssl_context: ssl.SSLContext | bool = True
    if ca_file:
        ssl_context = ssl.create_default_context(cafile=ca_file)
    headers = dict(default_headers or {})
    if secret is not None:
        headers.update(secret.headers)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context, limit=0),
        timeout=timeout or aiohttp.ClientTimeout(total=None, sock_connect=5.0),
        headers=headers or None,
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
    )
