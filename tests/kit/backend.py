"""The one fake backend of the test suite: an aiohttp server on 127.0.0.1 (plain HTTP or HTTPS with a
trustme certificate) that counts accepted sockets and remembers every request it saw, so a test proves
what left the egress proxy (or any client) rather than what the client meant to send."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Callable
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
    `delay=S` waits first; `respond` (a dict) is merged into every JSON answer (e.g. a secret field);
    `answer`, if set, computes the JSON answer from the request instead (a fake with a domain)."""

    url: str = ""  # http(s)://127.0.0.1:PORT
    accepted: int = 0  # sockets accepted (TLS or not), whether or not a request followed
    seen: list[SeenRequest] = field(default_factory=list)
    respond: dict[str, Any] = field(default_factory=dict)
    echo: bool = True  # False: answer without echoing the request (secrets echoed in strings would leak)
    response_headers: dict[str, str] = field(default_factory=dict)
    answer: Callable[[SeenRequest], dict[str, Any]] | None = None
    _server: asyncio.Server | None = None
    _runner: web.ServerRunner | None = None

    @property
    def host_port(self) -> str:
        return self.url.split("://", 1)[1]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        headers = list(request.headers.items())
        seen = SeenRequest(request.method, request.path, request.query_string, headers, body)
        self.seen.append(seen)
        delay = float(request.query.get("delay", "0") or 0)
        if delay:
            await asyncio.sleep(delay)
        status = int(request.query.get("status", "200") or 200)
        answer: dict[str, Any] = {"method": request.method, "path": request.path}
        if self.echo:
            answer.update(query=request.query_string, body=body.decode(errors="replace"))
        answer.update(self.respond)
        if self.answer is not None:
            answer = self.answer(seen)
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


class BackendThread:
    """A Backend on its own thread and event loop, for synchronous tests (a subprocess under test calls
    it while the test blocks): `start()` returns once it listens, `stop()` closes it."""

    def __init__(self, backend: Backend | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.backend = backend if backend is not None else Backend()
        self._ssl = ssl_context
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kit-backend", daemon=True)

    @property
    def url(self) -> str:
        return self.backend.url

    def start(self) -> BackendThread:
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"backend did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        await self.backend.start(self._ssl)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.backend.stop()
