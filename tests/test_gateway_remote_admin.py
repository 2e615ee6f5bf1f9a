"""The admin routes of `strictq serve --queue-server URL`: the gateway serves the queue server's control
stream, fences, failure management, routing and fleet within each caller's scope, checked against the
gateway's own key file (queue_core.control_relay, queue_core.health_view, queue_core.fleet_remote).

Real processes: a `strictq queue-server` and a `strictq serve --queue-server` with its egress proxy child
(which now follows the gateway's stream), a two-tenant key file with an operator, real HTTP backends.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import ServerProcess, start_server
from control_stream_support import admin_call, open_stream
from kit.process import CLIENT_ENV, ROOT, ChildProcess, launch, strictq
from kit.until import until
from proxy_support import Backends, UpstreamCA, WorkerClient, running_backends

from access.keys import Credential, write_keys
from fencing.context import PROXY_ACTION_HEADER

KEYS = [
    Credential("t1-admin", "t1-admin-secret-0123456789", "admin", "t1"),
    Credential("t1-producer", "t1-producer-secret-0123456789", "producer", "t1"),
    Credential("t1-worker", "t1-worker-secret-0123456789", "worker", "t1"),
    Credential("t1-proxy", "t1-proxy-secret-0123456789", "proxy", "t1"),
    Credential("t2-admin", "t2-admin-secret-0123456789", "admin", "t2"),
    Credential("t2-producer", "t2-producer-secret-0123456789", "producer", "t2"),
    Credential("t2-worker", "t2-worker-secret-0123456789", "worker", "t2"),
    Credential("operator-1", "operator-secret-0123456789", "operator", "ops"),
]
SECRET = {c.id: c.secret for c in KEYS}


@dataclass
class Remote:
    """A queue server and the gateway in front of it."""

    server: ServerProcess
    gateway: ChildProcess
    url: str
    ca: Path

    async def call(self, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
        return await admin_call(self.url, method, path, SECRET[key], body, ca_file=self.ca)


def _gateway(base: Path, server_url: str, *extra: str) -> ChildProcess:
    keys = base / "keys.toml"
    if not keys.exists():
        write_keys(keys, KEYS)
    argv = strictq(
        "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(base / "edge"),
        "--keys", str(keys), "--queue-server", server_url, *extra,
    )  # fmt: skip
    return launch(argv, base / "edge.log", wait_for=(CLIENT_ENV,))


@contextlib.contextmanager
def running_remote(base: Path, *extra: str) -> Iterator[Remote]:
    """Both processes for the block; whichever queue server `Remote.server` holds at the end is stopped."""
    server = start_server(base / "queue-server")
    started: Remote | None = None
    try:
        gateway = _gateway(base, server.url, *extra)
        url, ca = gateway.value("strictq: listening on "), gateway.value("strictq: ca ")
        started = Remote(server, gateway, url or "", Path(ca or ""))
        yield started
    finally:
        if started is not None:
            started.gateway.stop()
            server = started.server
        server.stop()


async def stream_status(remote: Remote, key: str) -> int:
    """The status the gateway's control stream answers with (the stream itself is not read)."""
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(remote.ca)))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(
            remote.url + "/admin/v1/control", headers={"X-BV-API-Key": SECRET[key]}
        ) as response:
            if response.status != 200:
                body = await response.json()
                assert body["error"]["code"] == "unavailable", body
            return response.status


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    with running_remote(tmp_path_factory.mktemp("remote-admin")) as started:
        yield started


@pytest.fixture
async def backends(tmp_path: Path) -> AsyncIterator[Backends]:
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    async with running_backends(UpstreamCA(ca, tmp_path / "ca.pem")) as started:
        yield started


async def send(remote: Remote, producer: str, queue: str, group: str) -> None:
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(remote.ca)))
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post(
            f"{remote.url}/queue/1/{queue}/send",
            params={"group": group},
            json={"n": 1},
            headers={"X-BV-API-Key": SECRET[producer]},
        ) as response:
            assert response.status == 200, await response.text()


# ----------------------------------------------------------------------------------------------- fences
async def test_a_fence_through_the_gateway_is_on_its_stream_and_its_proxy_enforces_it(
    remote: Remote, backends: Backends
) -> None:
    proxy_url, proxy_ca = (
        remote.gateway.value("strictq: proxy on "),
        remote.gateway.value("strictq: proxy ca "),
    )
    assert proxy_url and proxy_ca, remote.gateway.lines
    target = f"{backends.http.url}/charge"

    async def worker_answer(worker: str) -> tuple[int, str | None]:
        """A worker's outbound call through the proxy: its status and the proxy's action, if any."""
        async with WorkerClient(proxy_url, worker, secret=SECRET[worker], proxy_ca=Path(proxy_ca)) as client:
            reply = await client.call("GET", target)
            return reply.status, reply.headers.get(PROXY_ACTION_HEADER)

    async with open_stream(remote.url, SECRET["t1-proxy"], ca_file=remote.ca) as stream:
        before, synced = await stream.catch_up()
        assert [e.event for e in before] == ["snapshot"] and before[0].data["fences"] == []
        status, fence = await remote.call(
            "PUT", "/admin/v1/fences/t1-worker", "t1-admin", {"mode": "block", "reason": "relay"}
        )
        assert status == 200, fence
        event = await stream.until("fence")
        assert event.data == fence and event.data["worker"] == "t1-worker"
        last = event.id
        # Read your write: the list right after the change has it (the tenant's own list only).
        assert (await remote.call("GET", "/admin/v1/fences", "t1-admin"))[1]["fences"] == [fence]
        assert (await remote.call("GET", "/admin/v1/fences", "t2-admin"))[1]["fences"] == []

        # The gateway's embedded proxy follows the gateway's stream: the fenced worker is cut off.
        async def blocked() -> bool:
            return await worker_answer("t1-worker") == (403, "block")

        await until(blocked, what="the proxy to block the fenced worker")
        assert await worker_answer("t2-worker") == (200, None)  # another tenant's worker is not affected

    # Another tenant's stream never sees the fence; a resume after the last event replays nothing.
    async with open_stream(remote.url, SECRET["t2-admin"], ca_file=remote.ca) as other:
        events, _ = await other.catch_up()
        assert events[0].event == "snapshot" and events[0].data["fences"] == []
    async with open_stream(remote.url, SECRET["t1-proxy"], last_event_id=last, ca_file=remote.ca) as again:
        assert (await again.catch_up())[0] == []
        status, body = await remote.call("DELETE", "/admin/v1/fences/t1-worker", "t1-admin")
        assert (status, body) == (200, {"worker": "t1-worker", "unfenced": True})
        assert (await again.until("unfence")).data["worker"] == "t1-worker"

    async def passes() -> bool:
        return await worker_answer("t1-worker") == (200, None)

    await until(passes, what="the proxy to let the unfenced worker through")
    assert synced.data["instance"] == before[0].data["instance"]


async def test_floors_reach_the_gateways_stream(remote: Remote) -> None:
    """A claim's fencing token, raised in the queue server, is a `floor` event on the gateway's stream for
    the tenant's proxy (what refuses a stale lease)."""
    queue = f"floors-{uuid.uuid4().hex[:6]}"
    await send(remote, "t1-producer", queue, "g1")
    async with open_stream(remote.url, SECRET["t1-proxy"], ca_file=remote.ca) as stream:
        await stream.catch_up()
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(remote.ca)))
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(
                f"{remote.url}/queue/1/{queue}/poll",
                params={"ttl": "30", "limit": "1"},
                headers={"X-BV-API-Key": SECRET["t1-worker"]},
            ) as response:
                items = await response.json()
                assert response.status == 200 and len(items) == 1, items
        event = await stream.until("floor")
        assert [f"t1.{queue}", "g1", items[0]["token"]] in event.data["floors"]


def test_the_admin_commands_work_against_the_gateway(remote: Remote) -> None:
    """`strictq fence`, `fences`, `unfence`, `status` and `fleet` with the gateway's client settings (no
    STRICTQ_QUEUE_URL), as against one process."""
    env = {
        **os.environ,
        "STRICTQ_URL": remote.url,
        "STRICTQ_CA_FILE": str(remote.ca),
        "STRICTQ_ADMIN_KEY": SECRET["t1-admin"],
    }
    env.pop("STRICTQ_QUEUE_URL", None)

    def cli(*args: str) -> str:
        done = subprocess.run(
            strictq(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    cli("fence", "t1-worker", "--mode", "mimic", "--reason", "cli", "--ttl", "30m")
    assert [json.loads(line)["worker"] for line in cli("fences", "--json").splitlines()] == ["t1-worker"]
    cli("unfence", "t1-worker")
    assert cli("fences", "--json").strip() == ""
    assert "workers" in json.loads(cli("status", "--json"))
    assert "workers" in json.loads(cli("fleet", "--json"))


# ---------------------------------------------------------------------------------------------- tenancy
async def test_a_tenants_admin_key_sees_and_changes_only_its_own_state(remote: Remote) -> None:
    queue = f"orders-{uuid.uuid4().hex[:6]}"
    await send(remote, "t1-producer", queue, "g1")
    # Fences and blacklists of another tenant's worker: 404, as if it did not exist.
    fence = {"mode": "block", "reason": "not mine"}
    status, body = await remote.call("PUT", "/admin/v1/fences/t1-worker", "t2-admin", fence)
    assert (status, body["error"]["code"]) == (404, "unknown_worker")
    status, body = await remote.call("DELETE", "/admin/v1/blacklist/t1-worker", "t2-admin")
    assert (status, body["error"]["code"]) == (404, "not_blacklisted")
    # Suspend and resume: the tenant's own queue by its name; the other tenant's is not there for it.
    status, body = await remote.call("POST", f"/admin/v1/queues/{queue}/suspend", "t2-admin", {"reason": "x"})
    assert (status, body["error"]["code"]) == (404, "queue_not_found")
    status, body = await remote.call("POST", f"/admin/v1/queues/{queue}/suspend", "t1-admin", {"reason": "x"})
    assert (status, body) == (200, {"queue": queue, "suspended": True, "reason": "x"})
    status, mine = await remote.call("GET", "/admin/v1/status", "t1-admin")
    assert status == 200, mine
    assert [q["queue"] for q in mine["queues"] if q["suspended"]] == [queue]
    assert any(e.get("queue") == queue for e in mine["events"])
    status, theirs = await remote.call("GET", "/admin/v1/status", "t2-admin")
    assert status == 200 and theirs["queues"] == [] and theirs["events"] == [], theirs
    status, events = await remote.call("GET", "/admin/v1/events", "t2-admin")
    assert status == 200 and events["events"] == [], events
    status, everything = await remote.call("GET", "/admin/v1/status", "operator-1")  # an operator: core names
    assert f"t1.{queue}" in [q["queue"] for q in everything["queues"]]
    assert (await remote.call("POST", f"/admin/v1/queues/{queue}/resume", "t1-admin", {}))[0] == 200
    status, body = await remote.call("POST", f"/admin/v1/queues/{queue}/resume", "t1-admin", {})
    assert (status, body["error"]["code"]) == (404, "not_suspended")
    assert queue in body["error"]["message"] and "t1." not in body["error"]["message"]
    # Routing: read back by the tenant; the queue server's 400 naming the field passed on.
    pin = {"pins": [{"name": "vip", "prefix": "vip:", "workers": ["t1-worker"]}]}
    status, body = await remote.call("PUT", f"/admin/v1/queues/{queue}/routing", "t1-admin", pin)
    assert status == 200 and body["queue"] == queue and body["routing"]["pins"][0]["name"] == "vip", body
    status, body = await remote.call("GET", f"/admin/v1/queues/{queue}/routing", "t2-admin")
    assert (status, body["error"]["code"]) == (404, "queue_not_found")
    status, body = await remote.call("PUT", f"/admin/v1/queues/{queue}/routing", "t1-admin", {"pins": 7})
    assert status == 400 and body["error"]["code"], body
    # The fleet: a heartbeat through the gateway; each tenant lists its own workers only.
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(remote.ca)))
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post(
            f"{remote.url}/fleet/v1/heartbeat",
            json={"queues": [queue], "version": "1"},
            headers={"X-BV-API-Key": SECRET["t1-worker"]},
        ) as response:
            assert response.status == 200, await response.text()
    status, fleet = await remote.call("GET", "/admin/v1/fleet", "t1-admin")
    assert status == 200 and [w["worker"] for w in fleet["workers"]] == ["t1-worker"], fleet
    assert fleet["workers"][0]["queues"] == [queue]
    status, fleet = await remote.call("GET", "/admin/v1/fleet", "t2-admin")
    assert status == 200 and fleet["workers"] == [], fleet
    control = {"kind": "log_level", "args": {"level": "debug"}, "workers": ["t1-worker"]}
    status, body = await remote.call("POST", "/admin/v1/fleet/control", "t2-admin", control)
    assert (status, body["error"]["code"]) == (404, "unknown_worker")
    status, body = await remote.call("POST", "/admin/v1/fleet/control", "t1-admin", control)
    assert status == 200 and [c["worker"] for c in body["controls"]] == ["t1-worker"], body


# ----------------------------------------------------------------------------------------- queue server down
async def test_queue_server_down_is_503_json_and_the_gateway_keeps_running(tmp_path: Path) -> None:
    with running_remote(tmp_path, "--no-proxy") as remote:
        port = remote.server.url.rsplit(":", 1)[1]
        status, body = await remote.call(
            "PUT", "/admin/v1/fences/t1-worker", "t1-admin", {"mode": "mimic", "reason": "before"}
        )
        assert status == 200, body
        remote.server.stop()
        for method, path, payload in (
            ("GET", "/admin/v1/status", None),
            ("PUT", "/admin/v1/fences/t2-worker", {"mode": "block", "reason": "down"}),
            ("GET", "/admin/v1/fleet", None),
            ("GET", "/admin/v1/queues/orders/routing", None),
        ):
            status, body = await remote.call(method, path, "operator-1", payload)
            assert (status, body["error"]["code"]) == (503, "unavailable"), (path, body)

        async def refused() -> bool:  # once the relay has noticed: new streams are refused, in JSON
            return await stream_status(remote, "operator-1") == 503

        await until(refused, what="the control stream to answer 503")
        assert (await remote.call("GET", "/admin/v1/fences", "t1-admin"))[0] == 200  # the last known
        # The queue server back on its port: the relay resumes by itself, the fence kept.
        remote.server = start_server(remote.server.data_dir, "--port", port)

        async def streaming() -> bool:
            return await stream_status(remote, "operator-1") == 200

        await until(streaming, what="the relay to resume")
        async with open_stream(remote.url, SECRET["t1-admin"], ca_file=remote.ca) as stream:
            events, _ = await stream.catch_up()
        assert [f["worker"] for f in events[0].data["fences"]] == ["t1-worker"]
        status, body = await remote.call("GET", "/admin/v1/status", "t1-admin")
        assert status == 200, body


def test_the_relays_event_reader_takes_the_stream_in_any_pieces() -> None:
    """The relay reads the queue server's stream as bytes arrive: split anywhere, keepalives between,
    a line far over aiohttp's line limit (a snapshot of many floors) in one piece."""
    from queue_core.remote import _EventParser

    floors = [[f"t1.q{n}", f"g{n}", n + 1] for n in range(5000)]
    snapshot = json.dumps({"instance": 3, "fences": [], "floors": floors}).encode()
    wire = (
        b"id: 3-7\nevent: snapshot\ndata: " + snapshot + b"\n\n"
        b": keepalive\n\n"
        b'id: 3-7\r\nevent: synced\r\ndata: {"instance": 3}\r\n\r\n'
        b'id: 3-8\nevent: fence\ndata: {"worker": "w"}\n\n'
    )
    for size in (1, 7, len(wire)):
        parser = _EventParser()
        events = [e for at in range(0, len(wire), size) for e in parser.feed(wire[at : at + size])]
        assert [(i, name) for i, name, _ in events] == [
            ("3-7", "snapshot"),
            ("3-7", "synced"),
            ("3-8", "fence"),
        ]
        assert json.loads(events[0][2])["floors"] == floors
