"""An in-process gateway with failure management on (fast settings), over real TLS on 127.0.0.1, plus a
real control-stream client following it, and plain EmoDB calls (no SDK) for producers, workers and admins.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from kit.until import until as until  # the kit's, re-exported for the failure-management tests

from access.keys import Credential, KeyRing
from fencing.control_client import ControlClient, ControlState
from gateway.app import make_gateway_app
from gateway.dashboard import StoryIndex
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.machine.health import HealthSettings
from queue_core.service import QueueService

CREDENTIALS = [
    Credential("admin-1", "admin-secret-0123456789", "admin", "t1"),
    Credential("producer-1", "producer-secret-0123456789", "producer", "t1"),
    Credential("worker-1", "worker-secret-0123456789", "worker", "t1"),
    Credential("worker-2", "worker-secret-9876543210", "worker", "t1"),
    Credential("worker-3", "worker-secret-5555555555", "worker", "t1"),
    Credential("other-1", "other-secret-0123456789", "admin", "t2"),
]
# Seconds, small so a scenario takes well under a second of waiting; the window is wide enough that
# nothing in a test slides out of it.
SETTINGS = HealthSettings(
    window=60.0,
    worker_failures=3,
    shared_failure_workers=2,
    probe_interval=0.2,
    probe_backoff_max=0.4,
    probe_failures_to_blacklist=2,
    blacklist_for=60.0,
    probe_timeout=30.0,
    large_scale_fraction=0.5,
)
QUEUE = "jobs"
TIMEOUT = 15.0
CAPABILITIES_HEADER = "X-Strictq-Capabilities"
SDK_CAPABILITIES = "results, probes"  # what the SDK declares on every poll


@dataclass
class Health:
    url: str
    ca_file: Path
    wirelog: Path
    service: QueueService
    hub: ControlHub
    manager: FailureManager
    keys: KeyRing
    session: aiohttp.ClientSession
    control: ControlState
    stream_events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def secret(self, key_id: str) -> str:
        credential = self.keys.by_id(key_id)
        assert credential is not None
        return credential.secret

    async def call(
        self,
        method: str,
        path: str,
        key_id: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"X-BV-API-Key": self.secret(key_id), "Content-Type": "application/json", **(headers or {})}
        async with self.session.request(
            method, self.url + path, data=data, params=params, headers=headers
        ) as r:
            return r.status, json.loads(await r.text())  # stdlib json keeps big tokens exact

    async def ok(self, method: str, path: str, key_id: str, body: Any = None, **kw: Any) -> Any:
        status, data = await self.call(method, path, key_id, body, **kw)
        assert status == 200, (method, path, status, data)
        return data

    async def send(self, group: str, message: Any, queue: str = QUEUE) -> None:
        await self.ok("POST", f"/queue/1/{queue}/send", "producer-1", message, params={"group": group})

    async def poll(
        self,
        worker: str,
        *,
        limit: int = 10,
        wait: float = 0.0,
        queue: str = QUEUE,
        ttl: float = 30.0,
        capabilities: str | None = SDK_CAPABILITIES,
    ) -> list[Any]:
        """A poll as the SDK makes it (declaring `results, probes`: it takes part in failure management);
        `capabilities=None`: as a plain EmoDB client (no declaration)."""
        params = {"limit": str(limit), "ttl": f"{ttl:g}", "wait": str(wait)}
        headers = {} if capabilities is None else {CAPABILITIES_HEADER: capabilities}
        items: list[Any] = await self.ok(
            "GET", f"/queue/1/{queue}/poll", worker, params=params, headers=headers
        )
        return items

    async def report(self, worker: str, results: list[dict[str, Any]], queue: str = QUEUE) -> list[Any]:
        answer = await self.ok("POST", f"/queue/1/{queue}/results", worker, {"results": results})
        out: list[Any] = answer["results"]
        return out

    async def fail(self, worker: str, item: dict[str, Any], reason: str, signature: str = "") -> None:
        result = {"id": item["id"], "token": item["token"], "outcome": "failed", "reason": reason}
        if signature:
            result["signature"] = signature
        (outcome,) = await self.report(worker, [result])
        assert outcome["status"] == "ok", outcome

    async def succeed(self, worker: str, item: dict[str, Any]) -> None:
        (outcome,) = await self.report(
            worker, [{"id": item["id"], "token": item["token"], "outcome": "succeeded"}]
        )
        assert outcome["status"] == "ok", outcome

    async def probe(self, worker: str, within: float = TIMEOUT) -> dict[str, Any]:
        """Poll until the worker is handed a probe (it must get nothing else meanwhile)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            items = await self.poll(worker, wait=0.5)
            assert all(i.get("probe") for i in items), f"{worker} got real messages: {items}"
            if items:
                (item,) = items
                return item
        raise AssertionError(f"no probe for {worker} within {within}s")

    async def status(self, key_id: str = "admin-1") -> Any:
        return await self.ok("GET", "/admin/v1/status", key_id)

    async def events(self, since: int = 0, key_id: str = "admin-1") -> list[Any]:
        answer = await self.ok("GET", "/admin/v1/events", key_id, params={"since": str(since)})
        out: list[Any] = answer["events"]
        return out

    def event_names(self) -> list[str]:
        return [e["event"] for e in self.manager.events()]


@pytest.fixture
async def health(tmp_path: Path) -> AsyncIterator[Health]:
    async with running_health(tmp_path) as h:
        yield h


@contextlib.asynccontextmanager
async def running_health(
    tmp_path: Path,
    settings: HealthSettings = SETTINGS,
    keys: KeyRing | None = None,
    story_index: StoryIndex | None = None,
) -> AsyncIterator[Health]:
    """The gateway with failure management on, a control-stream client synchronised with it; `keys`:
    another key file than CREDENTIALS' (it must hold admin-1); `story_index`: the wire-log index the
    dashboard searches (spark.admin_endpoint.PageIndex)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    service = QueueService(tmp_path / "queue")
    await service.start()
    await service.create_queue(f"t1.{QUEUE}", {"retry_backoff": 0.0})  # retries at once: quick scenarios
    hub = ControlHub(service)
    wirelog = tmp_path / "wirelog"
    manager = FailureManager(service, hub, settings, wirelog=wirelog, alert_poll=0.05)
    keys = keys or KeyRing(list(CREDENTIALS))
    app = make_gateway_app(service, keys, failures=manager, story_index=story_index)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    client = ControlClient(url + "/admin/v1/control", "admin-secret-0123456789", ca_file=str(ca_file))
    client.start()
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file)))
    stream_events: list[tuple[str, dict[str, Any]]] = []
    hub.event_listeners.append(lambda event, data: stream_events.append((event, dict(data))))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        try:
            await asyncio.wait_for(client.state.wait_synced(), TIMEOUT)
            yield Health(
                url, ca_file, wirelog, service, hub, manager, keys, session, client.state, stream_events
            )
        finally:
            await client.stop()
            service.stop_waiting()
            await runner.cleanup()
            await service.close()
