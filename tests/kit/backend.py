"""The one fake backend of the test suite: an aiohttp server on 127.0.0.1 (plain HTTP or HTTPS with a
trustme certificate) that counts accepted sockets and remembers every request it saw, so a test proves
what left the egress proxy (or any client) rather than what the client meant to send."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from strictq.sdk.outbound import TAG_HEADERS


@dataclass
class SeenRequest:
    """What a backend received: the proof of what left the proxy."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), None)

    @property
    def tag_headers(self) -> list[str]:
        tags = {t.lower() for t in TAG_HEADERS}
        return [k for k, _ in self.headers if k.lower() in tags]


@dataclass
class Backend:
    """One aiohttp server. Any path answers JSON echoing the request; query `status=N` sets the status,
    `delay=S` waits first; `respond` (a dict) is merged into every JSON answer (e.g. a secret field)."""

    url: str = ""  # http(s)://127.0.0.1:PORT
    accepted: int = 0  # sockets accepted (TLS or not), whether or not a request followed
    seen: list[SeenRequest] = field(default_factory=list)
    respond: dict[str, Any] = field(default_factory=dict)
    echo: bool = True  # False: answer without echoing the request (secrets echoed in strings would leak)
    response_headers: dict[str, str] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _runner: web.ServerRunner | None = None

    @property
    def host_port(self) -> str:
        return self.url.split("://", 1)[1]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        headers = list(request.headers.items())
        self.seen.append(SeenRequest(request.method, request.path, request.query_string, headers, body))
        delay = float(request.query.get("delay", "0") or 0)
        if delay:
            await asyncio.sleep(delay)
        status = int(request.query.get("status", "200") or 200)
        answer: dict[str, Any] = {"method": request.method, "path": request.path}
        if self.echo:
            answer.update(query=request.query_string, body=body.decode(errors="replace"))
        answer.update(self.respond)
        return web.Response(
            status=status,
            body=orjson.dumps(answer),
            content_type="application/json",
            headers=self.response_headers,
        )

    async def start(self, ssl_context: ssl.SSLContext | None) -> None:
        self._runner = web.ServerRunner(web.Server(self._handle, access_log=None), handle_signals=False)
        await self._runner.setup()
        protocol_factory = self._runner.server
        assert protocol_factory is not None

        def counting_factory() -> asyncio.Protocol:
            self.accepted += 1
            return protocol_factory()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(counting_factory, "127.0.0.1", 0, ssl=ssl_context)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    def reset(self) -> None:
        self.accepted = 0
        self.seen.clear()
