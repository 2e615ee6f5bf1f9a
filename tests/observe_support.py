"""A gateway in front of a queue server (`strictq serve --queue-server`), for the dashboard's and /metrics'
tests of that topology: the queue server's real app on a loopback socket (kit.inprocess, with its admin
routes and /metrics), the real gateway app over TLS in front of it through `RemoteQueueService`, one
aiohttp session trusting the gateway's CA.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import trustme
from aiohttp import web
from kit.inprocess import InProcessServer, serve_in_process
from kit.secret import internal_secret

from access.keys import KeyRing
from gateway.app import make_gateway_app
from queue_core.machine.health import HealthSettings
from queue_core.remote import RemoteQueueService


@dataclass
class RemoteEdge:
    url: str  # the gateway's
    ca_file: Path
    server: InProcessServer  # the queue server behind it
    backend: RemoteQueueService
    keys: KeyRing
    session: aiohttp.ClientSession

    def secret(self, key_id: str) -> str:
        credential = self.keys.by_id(key_id)
        assert credential is not None, key_id
        return credential.secret

    async def call(self, method: str, path: str, key_id: str, body: Any = None, **params: str) -> Any:
        """One call of the gateway with `key_id`'s key; its JSON (the status must be 2xx)."""
        headers = {"X-BV-API-Key": self.secret(key_id)}
        async with self.session.request(
            method, self.url + path, json=body, params=params, headers=headers
        ) as answer:
            text = await answer.text()
            assert answer.status < 300, (answer.status, text)
            return await answer.json() if text else None


@contextlib.asynccontextmanager
async def remote_edge(
    tmp_path: Path, keys: KeyRing, health: HealthSettings | None = None
) -> AsyncIterator[RemoteEdge]:
    """`health`: failure management on at the queue server (`strictq queue-server --health`)."""
    ca = trustme.CA()
    ca_file = tmp_path / "edge-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    async with serve_in_process(tmp_path / "queue-server", keys=keys, health=health) as server:
        backend = RemoteQueueService(server.url, probe_interval=0.2, secret=internal_secret())
        await backend.start()
        runner = web.AppRunner(make_gateway_app(backend, keys), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}"
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file)))
        try:
            async with aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=30),
            ) as session:
                yield RemoteEdge(url, ca_file, server, backend, keys, session)
        finally:
            backend.stop_waiting()
            await runner.cleanup()
            await backend.close()
