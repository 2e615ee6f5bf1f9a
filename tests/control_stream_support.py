"""Helpers for the control-stream and fence-API tests: a raw SSE reader over aiohttp (real sockets), and
an in-process core with only the admin routes, for knobs the servers do not expose (keepalive, bounds).

The reader is deliberately independent of `fencing.control_client`: these tests pin the wire protocol of
docs/control-stream.md, not one client's reading of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from access.keys import Credential, KeyRing
from queue_core.admin_routes import add_admin_routes, add_queue_admin_routes
from queue_core.control import ControlHub
from queue_core.machine import SendRequest
from queue_core.service import QueueService

EVENT_TIMEOUT = 10.0  # generous bound for one event to arrive; never a timing assertion


@dataclass
class Event:
    id: str | None
    event: str
    data: Any  # parsed JSON


class StreamEnded(Exception):
    """The server closed the stream."""


class SSEReader:
    """Reads `id:` / `event:` / `data:` fields and dispatches on a blank line; keeps comment lines."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.comments: list[str] = []
        self.last_id: str | None = None

    async def next(self, within: float = EVENT_TIMEOUT) -> Event:
        return await asyncio.wait_for(self._next(), within)

    async def _next(self) -> Event:
        event_id: str | None = None
        name = "message"
        data: list[str] = []
        seen_field = False
        while True:
            raw = await self.response.content.readline()
            if not raw:
                raise StreamEnded()
            line = raw.decode().rstrip("\r\n")
            if not line:
                if seen_field:
                    if event_id is not None:
                        self.last_id = event_id
                    return Event(event_id, name, orjson.loads("\n".join(data)) if data else None)
                continue
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            seen_field = True
            if field == "id":
                event_id = value
            elif field == "event":
                name = value
            elif field == "data":
                data.append(value)

    async def until(self, name: str, within: float = EVENT_TIMEOUT) -> Event:
        """Skip events until one named `name` arrives (bounded)."""

        async def scan() -> Event:
            while True:
                event = await self._next()
                if event.event == name:
                    return event

        return await asyncio.wait_for(scan(), within)

    async def catch_up(self) -> tuple[list[Event], Event]:
        """Everything up to and including `synced`: (events before it, the synced event)."""
        events: list[Event] = []
        while True:
            event = await self.next()
            if event.event == "synced":
                return events, event
            events.append(event)

    async def comment(self, within: float = EVENT_TIMEOUT) -> str:
        """The next comment line (e.g. `keepalive`); an event before it is a test failure."""

        async def read() -> str:
            while True:
                line = (await self.response.content.readline()).decode().rstrip("\r\n")
                if line.startswith(":"):
                    return line[1:].strip()
                assert not line, f"expected a comment, got {line!r}"

        return await asyncio.wait_for(read(), within)

    async def ended(self, within: float = EVENT_TIMEOUT) -> bool:
        """True once the server closes the stream (EOF or connection reset) within `within` seconds."""
        try:
            async with asyncio.timeout(within):
                while True:
                    if not await self.response.content.readline():
                        return True
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError):
            return True


def ssl_for(ca_file: Path | None) -> ssl.SSLContext | bool:
    return ssl.create_default_context(cafile=str(ca_file)) if ca_file else True


@contextlib.asynccontextmanager
async def open_stream(
    url: str, key: str | None, *, last_event_id: str | None = None, ca_file: Path | None = None
) -> AsyncIterator[SSEReader]:
    headers = {"Accept": "text/event-stream"}
    if key is not None:
        headers["X-BV-API-Key"] = key
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    connector = aiohttp.TCPConnector(ssl=ssl_for(ca_file))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async with session.get(url.rstrip("/") + "/admin/v1/control", headers=headers) as response:
            assert response.status == 200, (response.status, await response.text())
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert response.headers["Cache-Control"] == "no-cache"
            yield SSEReader(response)


async def admin_call(
    url: str,
    method: str,
    path: str,
    key: str | None,
    body: Any = None,
    *,
    raw: bytes | None = None,
    ca_file: Path | None = None,
    bearer: bool = False,
) -> tuple[int, Any]:
    headers: dict[str, str] = {}
    if key is not None:
        headers["Authorization" if bearer else "X-BV-API-Key"] = f"Bearer {key}" if bearer else key
    data = raw if raw is not None else (None if body is None else orjson.dumps(body))
    connector = aiohttp.TCPConnector(ssl=ssl_for(ca_file))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.request(method, url.rstrip("/") + path, data=data, headers=headers) as response:
            payload = await response.read()
            assert response.content_type == "application/json", (response.status, payload)
            return response.status, orjson.loads(payload)


def secret_of(keys: KeyRing, key_id: str) -> str:
    credential = keys.by_id(key_id)
    assert credential is not None, key_id
    return credential.secret


def server_keys(data_dir: Path) -> KeyRing:
    """The development key file a `strictq queue-server` wrote into its data directory."""
    return KeyRing.load(data_dir / "keys.toml")


async def claim_groups(service: QueueService, queue: str, groups: list[str]) -> dict[str, int]:
    """Send one message per group, then claim them all concurrently: {group: fencing token}.

    The receives run in one event-loop iteration, so all their floor raises land in one coalescing window.
    """
    await service.send(queue, [SendRequest(body=g.encode(), group=g) for g in groups], create=True)
    batches = await asyncio.gather(*(service.receive(queue, limit=1, ttl=60) for _ in groups))
    tokens = {r.delivery.group: r.delivery.token for batch in batches for r in batch}
    assert sorted(tokens) == sorted(groups), tokens
    return tokens


KEYS = KeyRing(
    [
        Credential("admin", "admin-secret-0123456789", "admin", "dev"),
        Credential("proxy", "proxy-secret-0123456789", "proxy", "dev"),
        Credential("worker-1", "worker-secret-0123456789", "worker", "dev"),
        Credential("worker-2", "worker-secret-9876543210", "worker", "dev"),
    ]
)


@dataclass
class Core:
    url: str
    service: QueueService
    hub: ControlHub
    keys: KeyRing
    runner: web.AppRunner


@contextlib.asynccontextmanager
async def core_with_admin(data_dir: Path, **hub_options: Any) -> AsyncIterator[Core]:
    """A QueueService plus only the admin routes, over plain HTTP on 127.0.0.1 (in this event loop)."""
    service = QueueService(data_dir)
    await service.start()
    hub = ControlHub(service, **hub_options)
    app = web.Application()
    add_admin_routes(app, hub, KEYS, untenanted=True)  # as the queue server mounts them
    add_queue_admin_routes(app, service, KEYS, untenanted=True, hub=hub)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Core(f"http://127.0.0.1:{port}", service, hub, KEYS, runner)
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()
