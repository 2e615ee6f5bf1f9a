"""The proxy side of the control stream (`fencing.control_client`, `fencing.addons.control`).

Against a small in-test SSE server that follows docs/control-stream.md to the letter (snapshot or
replay by `Last-Event-ID`, then `synced`, then live events; ids `<instance>-<n>`; a restart bumps the
instance), so the client's behaviour is pinned independently of the core's server. Waits are on
conditions with deadlines, never fixed sleeps standing in for "long enough".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from fencing.control_client import ControlClient, ControlState, FenceInfo

KEY = "proxy-secret-0123456789"


async def until(predicate: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def fence(worker: str, mode: str = "block", reason: str = "test") -> dict[str, Any]:
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


@pytest.fixture
async def server() -> AsyncIterator[FakeControlServer]:
    srv = FakeControlServer()
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@contextlib.asynccontextmanager
async def client_for(
    srv: FakeControlServer, *, key: str = KEY, state: ControlState | None = None
) -> AsyncIterator[ControlClient]:
    client = ControlClient(srv.url, key, state=state, reconnect_min=0.05, reconnect_max=0.2)
    client.start()
    try:
        yield client
    finally:
        await client.stop()


async def test_snapshot_then_synced(server: FakeControlServer) -> None:
    server.publish("fence", fence("worker-1", "mimic"))
    server.publish("floor", {"floors": [["t1.orders", "g1", 30], ["t1.orders", "g2", 7]]})
    async with client_for(server) as client:
        await until(lambda: client.state.synced, what="synced")
        state = client.state
        assert state.fences == {"worker-1": FenceInfo("worker-1", "mimic", "test", 1.0, None)}
        assert state.floor("t1.orders", "g1") == 30 and state.floor("t1.orders", "g2") == 7
        assert state.floor("t1.orders", "nope") == 0
        assert state.last_event_id == "1-2" and state.instance == 1
        assert server.connections == [(None, "snapshot")]


async def test_incremental_events_and_listeners(server: FakeControlServer) -> None:
    heard: list[tuple[str, str, str | None]] = []
    state = ControlState()
    state.add_listener(lambda kind, worker, f: heard.append((kind, worker, f.mode if f else None)))
    async with client_for(server, state=state):
        await until(lambda: state.synced, what="synced")
        server.publish("fence", fence("worker-2", "block"))
        server.publish("floor", {"floors": [["t1.orders", "g1", 5]]})
        server.publish("floor", {"floors": [["t1.orders", "g1", 3]]})  # replayed/older: never lowers
        last = server.publish("unfence", {"worker": "worker-2", "reason": "operator"})
        await until(lambda: state.last_event_id == last, what="all events")
        assert heard == [("fence", "worker-2", "block"), ("unfence", "worker-2", None)]
        assert state.fences == {} and state.floor("t1.orders", "g1") == 5
        assert state.synced


async def test_resume_with_last_event_id_replays_missed_events(server: FakeControlServer) -> None:
    async with client_for(server) as client:
        state = client.state
        await until(lambda: state.synced, what="synced")
        server.publish("floor", {"floors": [["t1.q", "g", 1]]})
        await until(lambda: state.last_event_id == "1-1", what="first event")
        # The connection drops; events happen before the client is back.
        server.drop_connections()
        server.publish("fence", fence("worker-3"))
        last = server.publish("floor", {"floors": [["t1.q", "g", 9]]})
        await until(lambda: len(server.connections) == 2 and state.last_event_id == last, what="resume")
        await until(lambda: state.synced, what="resynced")
        assert server.connections[1] == ("1-1", "replay")  # resumed, no snapshot needed
        assert "worker-3" in state.fences and state.floor("t1.q", "g") == 9
        assert client.snapshots == 1


async def test_unsynced_while_disconnected_and_resync_after_server_restart(
    server: FakeControlServer,
) -> None:
    heard: list[tuple[str, str]] = []
    state = ControlState()
    state.add_listener(lambda kind, worker, f: heard.append((kind, worker)))
    server.publish("fence", fence("worker-1"))
    server.publish("floor", {"floors": [["t1.q", "g", 50]]})
    async with client_for(server, state=state) as client:
        await until(lambda: state.synced, what="synced")
        await server.stop()
        await until(lambda: not state.synced, what="unsynced once the stream is gone")
        assert state.fences.keys() == {"worker-1"}  # known fences stay applied while unsynced
        # While the core is down its state changes (say, restored from disk without the fence).
        server.fences.clear()
        server.floors[("t1.q", "g")] = 40  # a lower floor in a snapshot never lowers ours
        server.instance += 1
        server.ring.clear()
        server.counter = 0
        await server.start()
        await until(lambda: state.synced, what="resynchronised after restart")
        assert server.connections[-1] == ("1-2", "snapshot")  # other instance: a snapshot
        assert state.fences == {} and ("unfence", "worker-1") in heard
        assert state.floor("t1.q", "g") == 50
        assert state.instance == 2 and state.last_event_id == "2-0"
        assert client.snapshots == 2


async def test_too_far_behind_gets_a_snapshot(server: FakeControlServer) -> None:
    server.ring_size = 2
    async with client_for(server) as client:
        state = client.state
        await until(lambda: state.synced, what="synced")
        server.drop_connections()
        for token in range(1, 6):
            server.publish("floor", {"floors": [["t1.q", "g", token]]})
        await until(lambda: len(server.connections) >= 2 and state.synced, what="resync")
        assert server.connections[1] == ("1-0", "snapshot")
        assert state.floor("t1.q", "g") == 5


async def test_wrong_key_never_syncs_and_keeps_retrying(server: FakeControlServer) -> None:
    async with client_for(server, key="wrong-secret-0123456789") as client:
        await until(lambda: client.last_error is not None and "401" in client.last_error, what="401")
        assert not client.state.synced
        assert server.connections == []


async def test_stop_is_clean_and_leaves_state_unsynced(server: FakeControlServer) -> None:
    client = ControlClient(server.url, KEY, reconnect_min=0.05)
    task = client.start()
    await until(lambda: client.state.synced, what="synced")
    await client.stop()
    assert task.done() and not client.state.synced
    await until(lambda: not server._streams, what="server saw the disconnect")


def test_floors_are_bounded_and_merged_with_max() -> None:
    state = ControlState(max_floors=3)
    state.raise_floors([["q", "a", 1], ["q", "b", 2], ["q", "c", 3]])
    state.raise_floor("q", "a", 10)  # raised: now the most recent
    state.raise_floor("q", "d", 4)  # over the bound: the least recently raised (b) is forgotten
    assert dict(state.floors) == {("q", "c"): 3, ("q", "a"): 10, ("q", "d"): 4}
    state.raise_floor("q", "a", 5)
    assert state.floor("q", "a") == 10
    with pytest.raises(ValueError):
        state.raise_floors([["q", "a"]])


def test_snapshot_replaces_fences_and_notifies_only_changes() -> None:
    state = ControlState()
    heard: list[tuple[str, str]] = []
    state.add_listener(lambda kind, worker, f: heard.append((kind, worker)))
    a, b = FenceInfo("a", "block", "r", 1.0, None), FenceInfo("b", "mimic", "r", 1.0, None)
    state.replace_fences([a, b])
    state.replace_fences([a, FenceInfo("b", "block", "r", 2.0, None)])
    state.replace_fences([])
    assert heard == [("fence", "a"), ("fence", "b"), ("fence", "b"), ("unfence", "a"), ("unfence", "b")]
