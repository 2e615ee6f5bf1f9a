"""The proxy side of the control stream (`fencing.control_client`, `fencing.addons.control`).

Against a small in-test SSE server that follows docs/control-stream.md to the letter (snapshot or
replay by `Last-Event-ID`, then `synced`, then live events; ids `<instance>-<n>`; a restart bumps the
instance), so the client's behaviour is pinned independently of the core's server. Waits are on
conditions with deadlines, never fixed sleeps standing in for "long enough".
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from control_support import (
    KEY,
    FakeControlServer,
    QueueServer,
    event_number,
    fence,
    fence_worker,
    unfence_worker,
    until,
)
from proxy_support import credential, write_keys

from fencing.control_client import ControlClient, ControlState, FenceInfo
from queue_core.client import QueueClient


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


# ---------------------------------------------------------------------------- against the real core
async def test_against_a_real_queue_server_fences_floors_and_restart(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.toml")
    admin = credential("admin-1").secret
    server = QueueServer(tmp_path / "core", keys).start()
    try:
        async with client_for_url(server.control_url) as client:
            state = client.state
            await until(lambda: state.synced, what="synced with the core")
            # A claim raises the group's floor: the proxy learns the claim's own token.
            async with QueueClient(server.url) as core:
                await core.send_one("t1.orders", "hello", group="g1")
                (message,) = await core.receive("t1.orders", limit=1, worker="worker-1")
            await until(lambda: state.floor("t1.orders", "g1") == message["token"], what="floor event")
            await fence_worker(server, admin, "worker-1", "mimic")
            await until(lambda: "worker-1" in state.fences, what="fence event")
            assert state.fences["worker-1"].mode == "mimic"
            before = state.last_event_id
            # The core restarts on the same port: the proxy notices, fails closed, resynchronises.
            server.stop()
            await until(lambda: not state.synced, what="unsynced while the core is down")
            server.start()
            await until(lambda: state.synced and state.last_event_id != before, what="resync")
            assert event_number(state.last_event_id)[0] > event_number(before)[0]  # a new instance
            assert state.fences["worker-1"].mode == "mimic"  # fences are durable in the core
            assert state.floor("t1.orders", "g1") == message["token"]
            await unfence_worker(server, admin, "worker-1")
            await until(lambda: "worker-1" not in state.fences, what="unfence event")
            assert client.snapshots == 2
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def client_for_url(url: str) -> AsyncIterator[ControlClient]:
    client = ControlClient(url, KEY, reconnect_min=0.05, reconnect_max=0.3)
    client.start()
    try:
        yield client
    finally:
        await client.stop()
