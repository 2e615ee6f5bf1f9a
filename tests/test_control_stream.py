"""The control stream (docs/control-stream.md) against a real `strictq queue-server`, the in-process
gateway, and an in-process core for the knobs the servers do not expose. Real sockets throughout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from conftest import ServerProcess, running_server, start_server
from control_stream_support import (
    Core,
    admin_call,
    claim_groups,
    core_with_admin,
    open_stream,
    secret_of,
    server_keys,
)
from gateway_support import Gateway
from store_support import STORE_FILE, stored_fences

from queue_core.client import QueueClient
from queue_core.machine.effects import FloorRaised

QUEUE = "dev.orders"


async def send_and_claim(url: str, groups: list[str]) -> dict[str, int]:
    """One message per group through the internal API, then one receive claiming all of them."""
    async with QueueClient(url, timeout=30) as client:
        await client.send(QUEUE, [{"body": g, "group": g} for g in groups])
        messages = await client.receive(QUEUE, limit=len(groups), ttl=300, worker="worker-1")
    tokens = {m["group"]: m["token"] for m in messages}
    assert sorted(tokens) == sorted(groups)
    return tokens


def floors_of(events_data: list[dict[str, object]]) -> dict[tuple[str, str], int]:
    merged: dict[tuple[str, str], int] = {}
    for data in events_data:
        for queue, group, token in data["floors"]:  # type: ignore[attr-defined]
            merged[(queue, group)] = max(merged.get((queue, group), 0), token)
    return merged


# ------------------------------------------------------------------------------- queue-server process
async def test_snapshot_synced_then_coalesced_floors_and_fences(server: ServerProcess) -> None:
    keys = server_keys(server.data_dir)
    async with open_stream(server.url, secret_of(keys, "proxy")) as stream:
        before, synced = await stream.catch_up()
        assert [e.event for e in before] == ["snapshot"]
        snapshot = before[0]
        instance = snapshot.data["instance"]
        assert instance >= 1 and snapshot.data == {"instance": instance, "fences": [], "floors": []}
        assert snapshot.id == synced.id == f"{instance}-0"
        assert synced.data == {"instance": instance}

        # One receive claims three groups: their raises arrive as one coalesced floor event.
        tokens = await send_and_claim(server.url, ["g1", "g2", "g3"])
        floor = await stream.next()
        assert floor.event == "floor" and floor.id == f"{instance}-1"
        assert sorted(map(tuple, floor.data["floors"])) == sorted((QUEUE, g, t) for g, t in tokens.items())

        status, fence = await _fence(server.url, keys, "worker-2", "block", "stuck in a loop")
        assert status == 200
        event = await stream.next()
        assert (event.event, event.id, event.data) == ("fence", f"{instance}-2", fence)
        assert fence["worker"] == "worker-2" and fence["mode"] == "block" and fence["expires"] is None

        status, _ = await _unfence(server.url, keys, "worker-2")
        assert status == 200
        event = await stream.next()
        assert (event.event, event.data) == ("unfence", {"worker": "worker-2", "reason": "operator"})


async def test_snapshot_holds_current_fences_and_floors(server: ServerProcess) -> None:
    keys = server_keys(server.data_dir)
    tokens = await send_and_claim(server.url, ["a", "b"])
    status, fence = await _fence(server.url, keys, "worker-1", "mimic", "replaying", ttl=3600)
    assert status == 200 and fence["expires"] == fence["since"] + 3600
    async with open_stream(server.url, secret_of(keys, "admin")) as stream:
        (snapshot,), synced = await stream.catch_up()
    assert snapshot.event == "snapshot"
    assert snapshot.data["fences"] == [fence]
    assert sorted(map(tuple, snapshot.data["floors"])) == sorted((QUEUE, g, t) for g, t in tokens.items())
    instance, _, n = str(snapshot.id).partition("-")
    assert int(instance) == snapshot.data["instance"] and int(n) >= 2  # a floor event and a fence so far
    assert synced.id == snapshot.id  # synced carries the id of the last event the client has


async def test_resume_replays_only_what_followed(server: ServerProcess) -> None:
    keys = server_keys(server.data_dir)
    proxy = secret_of(keys, "proxy")
    async with open_stream(server.url, proxy) as stream:
        _, synced = await stream.catch_up()
        last_id = synced.id
    await _fence(server.url, keys, "worker-1", "block", "first")
    await _fence(server.url, keys, "worker-1", "mimic", "replaced")  # a re-fence is a new event
    await _unfence(server.url, keys, "worker-1")
    tokens = await send_and_claim(server.url, ["r1"])
    async with open_stream(server.url, proxy, last_event_id=last_id) as stream:
        # The floor event may trail the claim by up to one interval: wait for it, then resume.
        await stream.until("floor")
    async with open_stream(server.url, proxy, last_event_id=last_id) as stream:
        replayed, synced = await stream.catch_up()
    assert [e.event for e in replayed] == ["fence", "fence", "unfence", "floor"]
    assert [e.data["mode"] for e in replayed[:2]] == ["block", "mimic"]
    assert replayed[3].data == {"floors": [[QUEUE, "r1", tokens["r1"]]]}
    instance = int(last_id.split("-")[0])
    n0 = int(last_id.split("-")[1])
    assert [e.id for e in replayed] == [f"{instance}-{n0 + i}" for i in range(1, 5)]
    assert synced.id == replayed[-1].id

    # Up to date: nothing replayed, straight to synced. Unknown or future ids: a snapshot.
    async with open_stream(server.url, proxy, last_event_id=synced.id) as stream:
        assert (await stream.catch_up())[0] == []
    for bogus in (f"{instance}-999", "garbage", f"{instance + 5}-1"):
        async with open_stream(server.url, proxy, last_event_id=bogus) as stream:
            assert [e.event for e in (await stream.catch_up())[0]] == ["snapshot"]


async def test_restart_gives_snapshot_and_fences_survive(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(data_dir) as first:
        keys = server_keys(data_dir)
        proxy = secret_of(keys, "proxy")
        tokens = await send_and_claim(first.url, ["kept"])  # claimed, not acked: the group survives
        _, fence = await _fence(first.url, keys, "worker-1", "block", "durable")
        async with open_stream(first.url, proxy) as stream:
            _, synced = await stream.catch_up()
        old_id = synced.id
    assert stored_fences(data_dir / STORE_FILE) == [fence]  # in the store, no JSON file beside it
    assert not (data_dir / "fences.json").exists()
    with running_server(data_dir) as second:
        async with open_stream(second.url, proxy, last_event_id=old_id) as stream:
            (snapshot,), _ = await stream.catch_up()
        assert snapshot.event == "snapshot"
        assert snapshot.data["instance"] > int(old_id.split("-")[0])  # a new epoch: ids never collide
        assert snapshot.data["fences"] == [fence]
        assert [QUEUE, "kept", tokens["kept"]] in snapshot.data["floors"]
        status, listed = await _call(second.url, keys, "GET", "/admin/v1/fences")
        assert status == 200 and listed == {"fences": [fence]}


async def test_fence_expiry_sends_unfence_expired(server: ServerProcess) -> None:
    keys = server_keys(server.data_dir)
    async with open_stream(server.url, secret_of(keys, "proxy")) as stream:
        await stream.catch_up()
        status, _ = await _fence(server.url, keys, "worker-3", "block", "short", ttl=0.3)
        assert status == 200
        assert (await stream.next()).event == "fence"
        event = await stream.next()  # bounded wait, no timing assertion
        assert (event.event, event.data) == ("unfence", {"worker": "worker-3", "reason": "expired"})
    assert (await _call(server.url, keys, "GET", "/admin/v1/fences")) == (200, {"fences": []})


async def test_fence_that_expired_while_down_is_lifted_at_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(data_dir) as first:
        keys = server_keys(data_dir)
        _, fence = await _fence(first.url, keys, "worker-1", "block", "brief", ttl=0.5)
        _, kept = await _fence(first.url, keys, "worker-2", "mimic", "long", ttl=3600)
        # Stop before it expires (SIGKILL: not even a clean shutdown gets to lift it).
        first.kill()
    await asyncio.sleep(max(0.0, float(fence["expires"]) - time.time()) + 0.05)  # let it expire while down
    with running_server(data_dir) as second:
        async with open_stream(second.url, secret_of(keys, "proxy")) as stream:
            (snapshot,), _ = await stream.catch_up()
        assert snapshot.data["fences"] == [kept]


async def test_sigterm_with_open_stream_exits_promptly(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        keys = server_keys(server.data_dir)
        async with open_stream(server.url, secret_of(keys, "proxy")) as stream:
            await stream.catch_up()
            started = time.monotonic()
            server.proc.send_signal(15)
            assert await stream.ended(within=10.0)
            code = await asyncio.to_thread(server.proc.wait, 10.0)
            elapsed = time.monotonic() - started
        assert code == 0, server.log()
        assert elapsed < 10.0  # bounded: without the shutdown hook aiohttp would wait 60 s for the stream
    finally:
        if server.running():
            server.kill()


async def test_auth_on_the_queue_server(server: ServerProcess) -> None:
    keys = server_keys(server.data_dir)
    status, body = await _call(server.url, None, "GET", "/admin/v1/fences")
    assert status == 401 and body["error"]["code"] == "unauthorized" and body["error"]["message"]
    for role_id in ("producer", "worker-1"):
        status, body = await _call(server.url, keys, "GET", "/admin/v1/fences", as_id=role_id)
        assert (status, body["error"]["code"]) == (403, "forbidden")
    # The proxy key reads the control stream only (docs/control-stream.md, "Scope"): not the fence API.
    status, body = await _call(server.url, keys, "GET", "/admin/v1/fences", as_id="proxy")
    assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body = await _call(
        server.url, keys, "PUT", "/admin/v1/fences/worker-1", {"mode": "block", "reason": "x"}, as_id="proxy"
    )
    assert (status, body["error"]["code"]) == (403, "forbidden")


# ---------------------------------------------------------------------------------- in-process gateway
async def test_gateway_serves_the_stream_with_coalesced_floors(gateway: Gateway) -> None:
    admin = gateway.credential("admin-1").secret
    async with open_stream(gateway.url, admin, ca_file=gateway.ca_file) as stream:
        (snapshot,), _ = await stream.catch_up()
        assert snapshot.data["instance"] == gateway.service.core.epoch
        groups = [f"g{i}" for i in range(20)]
        tokens = await claim_groups(gateway.service, "t1.jobs", groups)
        floor = await stream.next()
        assert floor.event == "floor"
        # Twenty claims in one coalescing window: one event, one entry per group, the claim's token each.
        assert floors_of([floor.data]) == {("t1.jobs", g): t for g, t in tokens.items()}
        assert len(floor.data["floors"]) == len(groups)


async def test_gateway_stream_auth(gateway: Gateway) -> None:
    url, ca = gateway.url, gateway.ca_file
    status, body = await admin_call(url, "GET", "/admin/v1/control", None, ca_file=ca)
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    status, body = await admin_call(url, "GET", "/admin/v1/control", "not-a-key-at-all", ca_file=ca)
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    for key_id in ("producer-1", "worker-1"):
        status, body = await admin_call(
            url, "GET", "/admin/v1/control", gateway.credential(key_id).secret, ca_file=ca
        )
        assert (status, body["error"]["code"]) == (403, "forbidden")
    # Authorization: Bearer works as well as X-BV-API-Key.
    status, body = await admin_call(
        url, "GET", "/admin/v1/fences", gateway.credential("admin-1").secret, ca_file=ca, bearer=True
    )
    assert (status, body) == (200, {"fences": []})


# ---------------------------------------------------------------------------------- in-process core
async def test_listener_coalesces_to_the_highest_token(tmp_path: Path) -> None:
    async with core_with_admin(tmp_path / "core", floor_interval=0.05) as core:
        async with open_stream(core.url, secret_of(core.keys, "proxy")) as stream:
            await stream.catch_up()
            # As the service calls its floor listeners within one claim batch: out of order on purpose.
            for token in (5, 9, 7):
                for listener in core.service.floor_listeners:
                    listener(FloorRaised("dev.q", "g", token))
            for listener in core.service.floor_listeners:
                listener(FloorRaised("dev.q", "h", 3))
            event = await stream.next()
            assert event.event == "floor"
            assert event.data == {"floors": [["dev.q", "g", 9], ["dev.q", "h", 3]]}
            # Claims after a flush land in a later event (at most one event per interval).
            tokens = await claim_groups(core.service, "dev.q", ["g"])
            event = await stream.next()
            assert event.data == {"floors": [["dev.q", "g", tokens["g"]]]}


async def test_keepalive_comments(tmp_path: Path) -> None:
    async with core_with_admin(tmp_path / "core", keepalive=0.1) as core:
        async with open_stream(core.url, secret_of(core.keys, "proxy")) as stream:
            await stream.catch_up()
            assert await stream.comment() == "keepalive"
            assert await stream.comment() == "keepalive"


async def test_subscriber_that_falls_behind_is_cut_off_and_resumes(tmp_path: Path) -> None:
    async with core_with_admin(tmp_path / "core", subscriber_limit=5) as core:
        proxy = secret_of(core.keys, "proxy")
        async with open_stream(core.url, proxy) as stream:
            _, synced = await stream.catch_up()
            # Twenty events in one go, faster than any handler can write them: the subscriber overflows.
            for i in range(20):
                core.hub._emit("unfence", {"worker": f"w{i}", "reason": "test"})
            assert await stream.ended()
        assert core.hub.subscribers == 0
        # The ring still has everything that followed: a resume replays it instead of a snapshot.
        async with open_stream(core.url, proxy, last_event_id=synced.id) as stream:
            replayed, _ = await stream.catch_up()
        assert [e.data["worker"] for e in replayed] == [f"w{i}" for i in range(20)]


# Every event below is one frame of the same size: `id: 1-N`, `event: unfence`, a 31-byte data line.
FRAME_BYTES = len(b"id: 1-1\nevent: unfence\n" + b'data: {"worker":"w0","reason":"test"}\n\n')


@pytest.mark.parametrize("bound", [{"buffer": 3}, {"buffer_bytes": 3 * FRAME_BYTES + FRAME_BYTES // 2}])
async def test_resume_beyond_the_ring_gets_a_snapshot(tmp_path: Path, bound: dict[str, int]) -> None:
    async with core_with_admin(tmp_path / "core", **bound) as core:
        assert core.hub.instance == 1  # fresh store: ids are `1-N`, as FRAME_BYTES assumes
        proxy = secret_of(core.keys, "proxy")
        start_id = core.hub.last_event_id
        for i in range(5):
            core.hub._emit("unfence", {"worker": f"w{i}", "reason": "test"})
        async with open_stream(core.url, proxy, last_event_id=start_id) as stream:
            assert [e.event for e in (await stream.catch_up())[0]] == ["snapshot"]
        async with open_stream(core.url, proxy, last_event_id=f"{core.hub.instance}-2") as stream:
            replayed, _ = await stream.catch_up()
        assert [e.data["worker"] for e in replayed] == ["w2", "w3", "w4"]


async def test_python_api_fences_from_inside_the_process(tmp_path: Path) -> None:
    async with core_with_admin(tmp_path / "core") as core:
        await _python_api(core)


async def _python_api(core: Core) -> None:
    async with open_stream(core.url, secret_of(core.keys, "proxy")) as stream:
        await stream.catch_up()
        fence = await core.hub.fence("worker-1", "mimic", "failure manager: poison message", ttl=60)
        assert fence.expires is not None and fence.expires == fence.since + 60
        event = await stream.next()
        assert (event.event, event.data) == ("fence", fence.to_dict())
        assert [f.worker for f in core.hub.fences()] == ["worker-1"]
        lifted = await core.hub.unfence("worker-1", "recovered")
        assert lifted == fence
        event = await stream.next()
        assert event.data == {"worker": "worker-1", "reason": "recovered"}


# ------------------------------------------------------------------------------------------- helpers
async def _call(
    url: str, keys: object, method: str, path: str, body: object = None, *, as_id: str = "admin"
) -> tuple[int, dict[str, object]]:
    key = None if keys is None else secret_of(keys, as_id)  # type: ignore[arg-type]
    return await admin_call(url, method, path, key, body)


async def _fence(
    url: str, keys: object, worker: str, mode: str, reason: str, ttl: float | None = None
) -> tuple[int, dict[str, object]]:
    body: dict[str, object] = {"mode": mode, "reason": reason}
    if ttl is not None:
        body["ttl"] = ttl
    return await _call(url, keys, "PUT", f"/admin/v1/fences/{worker}", body)


async def _unfence(url: str, keys: object, worker: str) -> tuple[int, dict[str, object]]:
    return await _call(url, keys, "DELETE", f"/admin/v1/fences/{worker}")
