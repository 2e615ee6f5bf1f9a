"""The queue server's internal API in the test's own process: the real app factory
(`queue_core.server.make_app`) over a real `QueueService`, served by aiohttp's `TestServer` on a loopback
port. Service-level tests use it instead of a `strictq queue-server` subprocess per test; tests about the
process itself (SIGTERM, SIGKILL, restarts, start-up faults) keep the subprocess (kit.process).

`clock`: the service's clock (a kit.clock.FakeClock to move time by hand); the wall clock by default.
`keys`: a key ring, to mount the admin routes (control stream, fences) and /metrics as the queue server
does; without it, only the internal API.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp.test_utils import TestServer

from access.keys import KeyRing
from queue_core.admin_routes import add_admin_routes, add_queue_admin_routes
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.machine.health import HealthSettings
from queue_core.metrics_export import add_queue_metrics
from queue_core.server import make_app
from queue_core.service import QueueService


@dataclass
class InProcessServer:
    """What a test needs of a server: its URL, its data dir and (in process) the service itself."""

    url: str  # http://127.0.0.1:PORT, no trailing slash
    data_dir: Path
    service: QueueService
    _server: TestServer
    hub: ControlHub | None = None  # with `keys`: the control hub behind the admin routes

    @property
    def control_url(self) -> str:
        """The control stream's URL (with `keys`), as control_support.QueueServer names it."""
        return f"{self.url}/admin/v1/control"

    def running(self) -> bool:
        """Still serving (the in-process twin of ChildProcess.running)."""
        return not self._server.closed

    async def stop_serving(self) -> None:
        """Close its socket (the queue server gone, its store still open until the block ends)."""
        await self._server.close()


@contextlib.asynccontextmanager
async def serve_in_process(
    data_dir: Path,
    *,
    clock: Callable[[], float] = time.time,
    keys: KeyRing | None = None,
    health: HealthSettings | None = None,
) -> AsyncIterator[InProcessServer]:
    """`health` (with `keys`): failure management on, as `strictq queue-server --health` runs it."""
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True, mode=0o700)
    service = QueueService(data_dir, clock=clock)
    await service.start()
    app = make_app(service, secret=None)  # in the test's own process: no secret (tests/test_internal_auth.py)
    hub = None
    if keys is not None:  # as strictq.queue_server composes it
        hub = ControlHub(service)
        failures = FailureManager(service, hub, health) if health is not None else None
        add_admin_routes(app, hub, keys, failures, untenanted=True)
        add_queue_admin_routes(app, service, keys, untenanted=True, failures=failures, hub=hub)
        add_queue_metrics(app, service, hub, keys)
    server = TestServer(app, host="127.0.0.1")
    try:
        await server.start_server()
        yield InProcessServer(str(server.make_url("")).rstrip("/"), data_dir, service, server, hub)
    finally:
        service.stop_waiting()  # long polls answer now, as the process does on SIGTERM
        await server.close()
        await service.close()
