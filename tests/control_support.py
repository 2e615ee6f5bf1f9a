"""Control-plane fixtures for the guards' tests: an in-test SSE server following docs/control-stream.md,
a real `strictq queue-server` subprocess (the core, its control stream and fence API), admin calls to
fence and unfence, and a way to wait until a proxy has seen a given control event.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from kit.inprocess import InProcessServer, serve_in_process
from kit.process import LISTENING, ChildProcess, launch, strictq
from kit.until import until

from access.keys import KeyRing

KEY = "proxy-secret-0123456789"  # proxy_support.PROXY_CREDENTIAL's secret


def fence(worker: str, mode: str = "block", reason: str = "test") -> dict[str, Any]:
    """A FENCE object of the protocol."""
    return {"worker": worker, "mode": mode, "reason": reason, "since": 1.0, "expires": None}


@dataclass
class FakeControlServer:
    """The server side of the protocol, in memory: fences, floors, a ring of events, live streams."""

    instance: int = 1
    ring_size: int = 10_000
    fences: dict[str, dict[str, Any]] = field(default_factory=dict)
    floors: dict[tuple[str, str], int] = field(default_factory=dict)
    ring: list[tuple[int, str, bytes]] = field(default_factory=list)  # (n, event, data)
    counter: int = 0
    port: int = 0
    # What each connection asked with and got first: (Last-Event-ID header, "snapshot" | "replay").
    connections: list[tuple[str | None, str]] = field(default_factory=list)
    _streams: set[asyncio.Queue[bytes | None]] = field(default_factory=set)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/admin/v1/control"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/admin/v1/control", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if not self.port:
            assert site._server is not None
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for stream in list(self._streams):
            stream.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self) -> None:
        """A new process: the instance is bumped, the ring starts empty, fences and floors persist."""
        await self.stop()
        self.instance += 1
        self.ring.clear()
        self.counter = 0
        await self.start()

    def drop_connections(self) -> None:
        for stream in list(self._streams):
            stream.put_nowait(None)

    def publish(self, event: str, data: dict[str, Any]) -> str:
        if event == "fence":
            self.fences[data["worker"]] = data
        elif event == "unfence":
            self.fences.pop(data["worker"], None)
        elif event == "floor":
            for queue, group, token in data["floors"]:
                self.floors[(queue, group)] = max(token, self.floors.get((queue, group), 0))
        self.counter += 1
        payload = orjson.dumps(data)
        self.ring.append((self.counter, event, payload))
        del self.ring[: -self.ring_size]
        frame = self._frame(f"{self.instance}-{self.counter}", event, payload)
        for stream in self._streams:
            stream.put_nowait(frame)
        return f"{self.instance}-{self.counter}"

    @staticmethod
    def _frame(event_id: str, event: str, data: bytes) -> bytes:
        return b"id: " + event_id.encode() + b"\nevent: " + event.encode() + b"\ndata: " + data + b"\n\n"

    def _catch_up(self, last_event_id: str | None) -> tuple[str, list[bytes]]:
        if last_event_id:
            instance, _, n = last_event_id.partition("-")
            if instance == str(self.instance) and n.isdigit():
                after = int(n)
                oldest = self.ring[0][0] if self.ring else self.counter + 1
                if after >= oldest - 1 and after <= self.counter:
                    frames = [self._frame(f"{self.instance}-{k}", e, d) for k, e, d in self.ring if k > after]
                    return "replay", frames
        snapshot = {
            "instance": self.instance,
            "fences": list(self.fences.values()),
            "floors": [[q, g, t] for (q, g), t in self.floors.items() if t > 0],
        }
        return "snapshot", [
            self._frame(f"{self.instance}-{self.counter}", "snapshot", orjson.dumps(snapshot))
        ]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-BV-API-Key") != KEY:
            return web.json_response({"code": "unauthorized"}, status=401)
        stream: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._streams.add(stream)
        try:
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            last = request.headers.get("Last-Event-ID")
            how, frames = self._catch_up(last)
            self.connections.append((last, how))
            await response.write(b": hello\n\n")
            for frame in frames:
                await response.write(frame)
            synced = orjson.dumps({"instance": self.instance})
            await response.write(self._frame(f"{self.instance}-{self.counter}", "synced", synced))
            while True:
                try:
                    frame = await asyncio.wait_for(stream.get(), timeout=0.5)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if frame is None:
                    break
                await response.write(frame)
            return response
        finally:
            self._streams.discard(stream)


# ------------------------------------------------------------------------------- real queue server
class QueueServer:
    """A `strictq queue-server` subprocess: the core, its control stream and its fence API."""

    def __init__(self, data_dir: Path, keys: Path, port: int = 0) -> None:
        self.data_dir = data_dir
        self.keys = keys
        self.port = port
        self.url = ""
        self.child: ChildProcess | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def control_url(self) -> str:
        return f"{self.url}/admin/v1/control"

    def start(self, timeout: float = 30.0) -> QueueServer:
        """Start (or restart, on the same port once one was bound) and wait for the 'listening' line."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = strictq(
            *("queue-server", "--host", "127.0.0.1", "--port", str(self.port)),
            *("--data-dir", str(self.data_dir), "--keys", str(self.keys), "--partitions", "4"),
        )
        self.child = launch(args, self.log_path, timeout=timeout)
        self.url = self.child.startup[LISTENING].rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait (SIGKILL if it will not stop); `start()` then reuses the port (a core restart)."""
        if self.child is not None and self.child.running():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.terminate(timeout)

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()


@contextlib.contextmanager
def running_queue_server(data_dir: Path, keys: Path) -> Iterator[QueueServer]:
    server = QueueServer(data_dir, keys).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def queue_server_in_process(data_dir: Path, keys: Path) -> AsyncIterator[InProcessServer]:
    """The core with its control stream and fence API as the queue server composes them, served in this
    event loop (kit.inprocess): for tests about a proxy process, where the core's process is not the point
    (the test must be async: the core answers only while the test awaits)."""
    async with serve_in_process(data_dir, keys=KeyRing.load(keys)) as server:
        yield server


Core = QueueServer | InProcessServer  # what the admin helpers below need: `url`, `control_url`


async def admin_call(
    url: str, secret: str, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url + path, json=body, headers={"X-BV-API-Key": secret}) as resp:
            return resp.status, orjson.loads(await resp.read() or b"{}")


async def fence_worker(server: Core, admin_secret: str, worker: str, mode: str) -> dict[str, Any]:
    status, body = await admin_call(
        server.url, admin_secret, "PUT", f"/admin/v1/fences/{worker}", {"mode": mode, "reason": "test"}
    )
    assert status == 200, body
    return body


async def unfence_worker(server: Core, admin_secret: str, worker: str) -> None:
    status, body = await admin_call(server.url, admin_secret, "DELETE", f"/admin/v1/fences/{worker}")
    assert status == 200, body


async def proxy_control(admin_url: str) -> dict[str, Any]:
    """The proxy's view of the control stream, from its admin /metrics."""
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url.rstrip("/") + "/metrics?format=json") as resp:
            return dict((await resp.json())["control"])


def event_number(event_id: str | None) -> tuple[int, int]:
    if not event_id:
        return (-1, -1)
    instance, _, n = event_id.partition("-")
    return (int(instance), int(n))


async def wait_proxy_saw(admin_url: str, event_id: str | None, within: float = 10.0) -> dict[str, Any]:
    """Until the proxy has processed the control event `event_id` (or a later one) and is synchronised."""
    target = event_number(event_id)

    async def reached() -> dict[str, Any] | None:
        control = await proxy_control(admin_url)
        return control if control["synced"] and event_number(control["last_event_id"]) >= target else None

    return await until(reached, within, what=f"the proxy to reach control event {event_id}")


async def proxy_caught_up(
    server: Core, admin_url: str, predicate: Callable[[Any], bool], within: float = 15.0
) -> None:
    """Until the core's stream satisfies `predicate(state)` for our own subscriber, and then until the
    proxy has processed that same event: waits on event ids, never on time."""
    from fencing.control_client import ControlClient

    observer = ControlClient(server.control_url, KEY, reconnect_min=0.05, reconnect_max=0.3)
    observer.start()
    try:
        await until(lambda: observer.state.synced and predicate(observer.state), within, what="control event")
        await wait_proxy_saw(admin_url, observer.state.last_event_id, within)
    finally:
        await observer.stop()
