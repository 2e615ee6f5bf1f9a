"""The worker fleet end to end (docs/fleet.md): a real `strictq serve` over TLS (failure management on, its
events in `strictq status` and the wire log) and real SDK workers with their own credentials, in this
process. Control messages of every kind are applied and reported (a refused upgrade without a hook, a
failed upgrade hook), drained workers finish their work and take nothing more, rebalancing puts idle
workers to sleep and wakes them on a backlog, pending controls survive a restart of the serve, the admin
routes are scoped to the caller's tenant, bad input is a 400 naming the field, and a plain EmoDB client
sees nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kit.process import ROOT
from kit.until import until
from serve_support import Serve, start_serve

from access.keys import Credential, write_keys
from strictq.sdk import ClientConfig, Message, Producer, Worker
from wirelog.reader import read_records
from wirelog.writer import ENV_SEGMENT_AGE

pytestmark = [pytest.mark.xdist_group("fleet"), pytest.mark.timeout(180)]

CREDENTIALS = [
    Credential("ta-admin", "ta-admin-secret-0123456789", "admin", "ta"),
    Credential("ta-producer", "ta-producer-secret-0123456789", "producer", "ta"),
    *(Credential(f"ta-w{i}", f"ta-w{i}-secret-0123456789", "worker", "ta") for i in range(1, 9)),
    Credential("tb-admin", "tb-admin-secret-0123456789", "admin", "tb"),
    Credential("tb-w1", "tb-w1-secret-0123456789", "worker", "tb"),
    Credential("ops-1", "ops-secret-0123456789", "operator", "ops"),
]
SECRET = {c.id: c.secret for c in CREDENTIALS}
BEAT = 0.2  # the workers' heartbeat interval
WAIT = 20.0  # bounded waits for what should happen within a few heartbeats


# ------------------------------------------------------------------------------------------ plumbing
def serve_with_keys(base: Path) -> Serve:
    keys = base / "keys.toml"
    if not keys.exists():
        write_keys(keys, CREDENTIALS, "the fleet test's tenants")
    return start_serve(base / "data", "--keys", str(keys), tls=True, env={ENV_SEGMENT_AGE: "0.3"})


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    server = serve_with_keys(tmp_path_factory.mktemp("fleet"))
    try:
        yield server
    finally:
        server.stop()


async def call(serve: Serve, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.to_thread(serve.call, method, path, SECRET[key], body)


def config(serve: Serve, worker: str) -> ClientConfig:
    ca = str(serve.ca) if serve.ca is not None else None
    return ClientConfig(url=serve.url, ca_file=ca, worker_id=worker, worker_secret=SECRET[worker])


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop(0.5)
        async with asyncio.timeout(WAIT):
            await task


async def produce(serve: Serve, queue: str, groups: int, per_group: int = 1) -> None:
    ca = str(serve.ca) if serve.ca is not None else None
    producer_config = ClientConfig(url=serve.url, ca_file=ca, api_key=SECRET["ta-producer"])
    async with Producer(producer_config) as producer:
        for g in range(groups):
            for i in range(per_group):
                await producer.send(queue, {"g": g, "i": i}, group=f"g{g}")


def cli(serve: Serve, *args: str, key: str = "ta-admin") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STRICTQ_URL": serve.url,
        "STRICTQ_CA_FILE": str(serve.ca),
        "STRICTQ_ADMIN_KEY": SECRET[key],
    }
    env.pop("STRICTQ_QUEUE_URL", None)
    command = [str(ROOT / ".venv" / "bin" / "python"), "-m", "strictq", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


async def acli(serve: Serve, *args: str, key: str = "ta-admin") -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, serve, *args, key=key)


async def fleet_row(serve: Serve, worker: str, key: str = "ta-admin") -> dict[str, Any]:
    status, view = await call(serve, "GET", "/admin/v1/fleet", key)
    assert status == 200, view
    return next((w for w in view["workers"] if w["worker"] == worker), {})


async def events(serve: Serve, key: str = "ta-admin") -> list[dict[str, Any]]:
    status, answer = await call(serve, "GET", "/admin/v1/events", key)
    assert status == 200, answer
    return list(answer["events"])


async def event_for(serve: Serve, name: str, worker: str, contains: str = "") -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        for event in await events(serve):
            if event["event"] == name and event.get("worker") == worker and contains in event["reason"]:
                return event
        return None

    return await until(found, WAIT, interval=0.1, what=f"event {name} of {worker} ({contains})")


def wirelog_events(serve: Serve) -> list[dict[str, Any]]:
    return [r for r in read_records(serve.data_dir / "wirelog") if r["kind"] == "event"]


def idle_handler() -> Callable[[Message], Awaitable[None]]:
    async def handle(message: Message) -> None:
        return None

    return handle


# --------------------------------------------------------------------------------------------- tests
async def test_every_control_kind_is_applied_or_reported_with_events(serve: Serve) -> None:
    upgrades: list[tuple[str, dict[str, Any]]] = []

    async def upgrade(version: str, args: dict[str, Any]) -> str:
        upgrades.append((version, args))
        if args.get("break"):
            raise RuntimeError("package repository unreachable")
        return version

    hooked = Worker(
        "jobs",
        idle_handler(),
        config=config(serve, "ta-w1"),
        fleet_interval=BEAT,
        upgrade=upgrade,
        version="1.0",
        cpus=3,
        memory_mib=2048,
        max_message_bytes=65536,
        wait=0.2,
    )
    plain = Worker("jobs", idle_handler(), config=config(serve, "ta-w2"), fleet_interval=BEAT, version="1.0")
    await produce(serve, "jobs", 1)  # the queue exists
    root = logging.getLogger()
    level = root.level
    try:
        async with running(hooked), running(plain):
            row = await until(lambda: fleet_row(serve, "ta-w1"), WAIT, interval=0.1, what="ta-w1 registered")
            assert row["version"] == "1.0" and row["queues"] == ["jobs"] and row["state"] == "active"
            assert row["capabilities"] == {"cpus": 3, "memory_mib": 2048, "max_message_bytes": 65536}
            assert set(row["load"]) >= {"in_flight", "concurrency", "polls", "empty_polls"}

            # config through the CLI, applied at run time.
            done = await acli(
                serve, "control", "config", "--worker", "ta-w1", "--set", "concurrency=3", "--set", "wait=0.1"
            )
            assert done.returncode == 0, done.stderr
            assert "ta-w1" in done.stdout and "config" in done.stdout
            await event_for(serve, "control-applied", "ta-w1", "config")
            assert hooked.concurrency == 3 and hooked.wait == 0.1

            # log_level
            done = await acli(serve, "control", "log_level", "--worker", "ta-w2", "--set", "level=debug")
            assert done.returncode == 0, done.stderr
            await event_for(serve, "control-applied", "ta-w2", "log_level")
            assert root.level == logging.DEBUG

            # sleep and wake: polls stop, heartbeats go on
            await acli(serve, "control", "sleep", "--worker", "ta-w2")
            await event_for(serve, "control-applied", "ta-w2", "sleep")
            assert plain.fleet is not None and plain.fleet.state == "sleeping"
            polls, beats = plain.stats.polls, plain.fleet.heartbeats
            await asyncio.sleep(5 * BEAT)
            assert plain.stats.polls <= polls + 1  # at most the poll in flight when it went to sleep
            assert plain.fleet.heartbeats > beats
            assert (await fleet_row(serve, "ta-w2"))["state"] == "sleeping"
            await acli(serve, "control", "wake", "--worker", "ta-w2")
            await event_for(serve, "control-applied", "ta-w2", "wake")
            await until(lambda: plain.stats.polls > polls + 2, WAIT, what="ta-w2 polls again")

            # upgrade: with a hook (applied, the version it reports), a failing hook, and no hook (refused)
            done = await acli(
                serve,
                "control",
                "upgrade",
                "--queue",
                "jobs",
                "--version",
                "1.0",
                "--set",
                "version=2.0",
                "--set",
                'args={"channel": "stable"}',
            )
            assert done.returncode == 0, done.stderr
            await event_for(serve, "control-applied", "ta-w1", "upgrade")
            await event_for(serve, "control-refused", "ta-w2", "no upgrade hook")
            assert upgrades == [("2.0", {"channel": "stable"})]
            assert hooked.version == "2.0" and (await fleet_row(serve, "ta-w1"))["version"] == "2.0"
            await acli(
                serve,
                "control",
                "upgrade",
                "--worker",
                "ta-w1",
                "--set",
                "version=3.0",
                "--set",
                'args={"break": true}',
            )
            await event_for(serve, "control-failed", "ta-w1", "package repository unreachable")
            assert hooked.version == "2.0"
            # --version narrows a queue target: only ta-w2 still runs 1.0
            done = await acli(serve, "control", "wake", "--queue", "jobs", "--version", "1.0", "--json")
            assert done.returncode == 0 and '"ta-w2"' in done.stdout and '"ta-w1"' not in done.stdout

            # strictq fleet lists them
            listed = await acli(serve, "fleet")
            assert listed.returncode == 0, listed.stderr
            assert "ta-w1" in listed.stdout and "2.0" in listed.stdout and "tb-w1" not in listed.stdout
    finally:
        root.setLevel(level)

    # Every outcome is an event in `strictq status` and a wire-log `event` record.
    status = await acli(serve, "status", "--events", "50")
    assert status.returncode == 0, status.stderr
    for name in ("control-applied", "control-refused", "control-failed"):
        assert name in status.stdout
    assert "package repository unreachable" in status.stdout

    def recorded() -> set[str]:
        return {r["event"] for r in wirelog_events(serve) if r.get("worker") in ("ta-w1", "ta-w2")}

    await until(
        lambda: {"control-applied", "control-refused", "control-failed"} <= recorded(),
        WAIT,
        interval=0.2,
        what="the control events in the wire log",
    )
    failed = next(r for r in wirelog_events(serve) if r["event"] == "control-failed")
    assert failed["worker"] == "ta-w1" and failed["tenant"] == "ta" and failed["queue"] == "jobs"


async def test_a_poll_answer_prompts_a_heartbeat_and_plain_clients_see_nothing_new(serve: Serve) -> None:
    slow = Worker("prompt", idle_handler(), config=config(serve, "ta-w3"), fleet_interval=60.0)
    await produce(serve, "prompt", 1)
    async with running(slow):
        await until(lambda: slow.fleet is not None and slow.fleet.heartbeats >= 1, WAIT, what="first beat")
        assert "control" in slow.capabilities
        issued_at = time.monotonic()
        status, answer = await call(
            serve,
            "POST",
            "/admin/v1/fleet/control",
            "ta-admin",
            {"kind": "config", "args": {"limit": 3}, "workers": ["ta-w3"]},
        )
        assert status == 200, answer
        await event_for(serve, "control-applied", "ta-w3", "limit=3")
        # Its interval is a minute: the poll answer's X-Strictq-Control made it beat at once.
        assert time.monotonic() - issued_at < 30 and slow.limit == 3

    # A control waits for ta-w3 (not running now): a plain EmoDB poll of the same worker gets no header
    # and items of EmoDB's shape; declaring `control` gets the header.
    await call(serve, "POST", "/admin/v1/fleet/control", "ta-admin", {"kind": "sleep", "workers": ["ta-w3"]})
    await produce(serve, "prompt", 1)
    ssl_context = serve.ssl_context()
    async with aiohttp.ClientSession() as session:
        url = f"{serve.url}/queue/1/prompt/poll?ttl=1&limit=1"
        async with session.get(url, headers={"X-BV-API-Key": SECRET["ta-w3"]}, ssl=ssl_context) as resp:
            assert resp.status == 200
            assert "X-Strictq-Control" not in resp.headers
            items = await resp.json()
        assert items and "control" not in items[0]
        headers = {"X-BV-API-Key": SECRET["ta-w3"], "X-Strictq-Capabilities": "control"}
        async with session.get(url, headers=headers, ssl=ssl_context) as resp:
            assert resp.status == 200 and resp.headers.get("X-Strictq-Control") == "pending"


async def test_drain_finishes_held_work_and_takes_nothing_more(serve: Serve) -> None:
    release = asyncio.Event()
    handled: list[Any] = []

    async def handle(message: Message) -> None:
        await release.wait()
        handled.append(message.payload)

    worker = Worker(
        "drainq", handle, config=config(serve, "ta-w4"), fleet_interval=BEAT, concurrency=1, limit=1, ttl=30
    )
    await produce(serve, "drainq", 1, per_group=3)
    async with running(worker):
        await until(lambda: worker.stats.received >= 1, WAIT, what="a message held")
        status, _ = await call(
            serve, "POST", "/admin/v1/fleet/control", "ta-admin", {"kind": "drain", "workers": ["ta-w4"]}
        )
        assert status == 200
        await until(
            lambda: worker.fleet is not None and worker.fleet.state == "draining", WAIT, what="draining"
        )
        assert (await fleet_row(serve, "ta-w4"))["desired"] == "draining"
        release.set()
        await event_for(serve, "control-applied", "ta-w4", "drained")
        received = worker.stats.received
        await asyncio.sleep(5 * BEAT)
        assert worker.stats.received == received  # nothing more taken
        row = await fleet_row(serve, "ta-w4")
        assert row["state"] == "drained" and row["desired"] == "drained"
    assert handled[0] == {"g": 0, "i": 0} and worker.stats.acked >= 1
    status, size = await call(serve, "GET", "/queue/1/drainq/size", "ta-admin")
    assert status == 200 and size == 3 - worker.stats.acked  # the rest stayed in the queue


async def test_a_drained_workers_groups_go_on_elsewhere_with_their_local_state(serve: Serve) -> None:
    """Drain + state transfer: the drained worker uploads the local state of the groups it held (it polls
    no more, so its polls cannot ask it to), and the worker that takes the group over continues from it."""
    counts: list[tuple[str, int, int]] = []

    def counter(name: str) -> Callable[[Message], Awaitable[None]]:
        async def handle(message: Message) -> None:
            message.state["count"] = message.state.get("count", 0) + 1
            counts.append((name, message.payload["i"], message.state["count"]))

        return handle

    donor = Worker(
        "stateq",
        counter("ta-w7"),
        config=config(serve, "ta-w7"),
        fleet_interval=BEAT,
        state_limit=4096,
        ttl=30,
    )
    heir = Worker(
        "stateq",
        counter("ta-w8"),
        config=config(serve, "ta-w8"),
        fleet_interval=BEAT,
        state_limit=4096,
        ttl=30,
    )
    async with running(donor):
        await produce(serve, "stateq", 1, per_group=3)
        await until(lambda: len(counts) == 3, WAIT, what="the donor's three messages")
        status, _ = await call(
            serve, "POST", "/admin/v1/fleet/control", "ta-admin", {"kind": "drain", "workers": ["ta-w7"]}
        )
        assert status == 200
        await event_for(serve, "control-applied", "ta-w7", "drained")
        # Its state left with a poll's export request or with the drain's own upload, whichever came first.
        assert donor.local_state is not None and donor.local_state.groups == {}
        async with running(heir):
            ca = str(serve.ca) if serve.ca is not None else None
            async with Producer(ClientConfig(url=serve.url, ca_file=ca, api_key=SECRET["ta-producer"])) as p:
                for i in range(3, 5):
                    await p.send("stateq", {"g": 0, "i": i}, group="g0")
            await until(lambda: len(counts) == 5, WAIT, what="the heir's two messages")
    assert counts == [
        ("ta-w7", 0, 1), ("ta-w7", 1, 2), ("ta-w7", 2, 3), ("ta-w8", 3, 4), ("ta-w8", 4, 5)
    ]  # fmt: skip


async def test_rebalancing_sleeps_surplus_idle_workers_and_wakes_them_on_backlog(serve: Serve) -> None:
    handled: list[Any] = []

    async def handle(message: Message) -> None:  # slow, one at a time: a backlog builds up behind it
        await asyncio.sleep(0.1)
        handled.append(message.payload)

    await produce(serve, "rebal", 1)
    async with contextlib.AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                running(
                    Worker(
                        "rebal",
                        handle,
                        config=config(serve, f"ta-w{i}"),
                        fleet_interval=BEAT,
                        limit=1,
                        concurrency=1,
                    )
                )
            )
            for i in (1, 2, 5)
        ]
        await until(lambda: len(handled) == 1, WAIT, what="the first message")
        done = await acli(
            serve,
            "fleet-policy",
            "rebal",
            "--min-active",
            "1",
            "--idle-heartbeats",
            "2",
            "--wake-backlog",
            "2",
        )
        assert done.returncode == 0, done.stderr
        assert "min_active=1" in done.stdout

        def asleep() -> list[Worker]:
            return [w for w in workers if w.fleet is not None and w.fleet.state == "sleeping"]

        await until(lambda: len(asleep()) == 2, WAIT, interval=0.1, what="two workers asleep")
        sleepers = {w.worker_id for w in asleep()}
        for worker in sleepers:
            await event_for(serve, "sleep", worker, "backlog empty")
        await asyncio.sleep(5 * BEAT)
        assert len(asleep()) == 2  # min_active stays awake, the sleepers stay asleep
        polled = {w.worker_id: w.stats.polls for w in workers}

        await produce(serve, "rebal", 20)  # a backlog: the sleepers are woken
        for worker in sleepers:
            await event_for(serve, "wake", worker, "backlog")
            await event_for(serve, "control-applied", worker, "active: polling again")
        # Each sleeper polled again (once the backlog is gone, rebalancing may put them back to sleep).
        for woken in (w for w in workers if w.worker_id in sleepers):
            await until(lambda w=woken: w.stats.polls > polled[w.worker_id], WAIT, what="polls after wake")
        await until(lambda: len(handled) == 21, WAIT, what="the backlog processed")
        listed = await acli(serve, "fleet")
        assert "rebal: " in listed.stdout and "min_active=1" in listed.stdout
        done = await acli(serve, "fleet-policy", "rebal", "--off")
        assert done.returncode == 0 and "no rebalancing policy" in done.stdout
    status = await acli(serve, "status", "--events", "100")
    assert " sleep " in status.stdout and " wake " in status.stdout


async def test_admin_routes_are_scoped_to_the_tenant(serve: Serve) -> None:
    worker = Worker("scoped", idle_handler(), config=config(serve, "ta-w6"), fleet_interval=BEAT)
    await produce(serve, "scoped", 1)
    async with running(worker):
        await until(lambda: fleet_row(serve, "ta-w6"), WAIT, interval=0.1, what="ta-w6 registered")
        status, view = await call(serve, "GET", "/admin/v1/fleet", "tb-admin")
        assert status == 200 and all(not w["worker"].startswith("ta-") for w in view["workers"])
        for body in ({"kind": "sleep", "workers": ["ta-w6"]}, {"kind": "sleep", "queue": "scoped"}):
            status, answer = await call(serve, "POST", "/admin/v1/fleet/control", "tb-admin", body)
            assert status == 404, answer
        status, answer = await call(serve, "PUT", "/admin/v1/fleet/policies/scoped", "tb-admin", {})
        assert status == 404, answer
        refused = await acli(serve, "control", "sleep", "--worker", "ta-w6", key="tb-admin")
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "404" in refused.stderr
        # The operator sees every tenant, with core names.
        row = await fleet_row(serve, "ta-w6", key="ops-1")
        assert row["queues"] == ["ta.scoped"]
        assert worker.fleet is not None and worker.fleet.state == "active"


async def test_bad_input_is_a_400_naming_the_field(serve: Serve) -> None:
    await produce(serve, "bad", 1)
    cases = [
        ({"kind": "reboot", "workers": ["ta-w1"]}, "kind"),
        ({"kind": "config", "args": {"colour": "red"}, "workers": ["ta-w1"]}, "args.colour"),
        ({"kind": "config", "args": {"concurrency": -1}, "workers": ["ta-w1"]}, "args.concurrency"),
        ({"kind": "sleep", "workers": ["ta-w1"], "queue": "bad"}, "workers"),
        ({"kind": "sleep", "workers": "ta-w1"}, "workers"),
        ({"kind": "sleep", "workers": ["ta-w1"], "ttl": -5}, "ttl"),
        ({"kind": "sleep", "workers": ["ta-w1"], "colour": 1}, "colour"),
    ]
    for body, field in cases:
        status, answer = await call(serve, "POST", "/admin/v1/fleet/control", "ta-admin", body)
        assert status == 400, (body, answer)
        assert answer["error"]["details"]["field"] == field, answer
    status, answer = await call(serve, "PUT", "/admin/v1/fleet/policies/bad", "ta-admin", {"min_active": "x"})
    assert status == 400 and answer["error"]["details"]["field"] == "min_active"
    for body, field in (({"interval": "fast"}, "interval"), ({"load": {"in_flight": -1}}, "load.in_flight")):
        status, answer = await call(serve, "POST", "/fleet/v1/heartbeat", "ta-w1", body)
        assert status == 400 and answer["error"]["details"]["field"] == field, answer
    status, answer = await call(serve, "POST", "/fleet/v1/heartbeat", "ta-admin", {"queues": ["nope"]})
    assert status in (200, 404), answer  # an admin may consume; a heartbeat names its tenant's queues
    status, answer = await call(serve, "POST", "/fleet/v1/heartbeat", "ta-producer", {})
    assert status == 403, answer
    usage = await acli(serve, "control", "sleep", "--worker", "ta-w1", "--set", "novalue")
    assert usage.returncode == 2 and "KEY=VALUE" in usage.stderr


async def test_pending_controls_survive_a_restart_of_the_serve(tmp_path: Path) -> None:
    base = tmp_path / "restart"
    base.mkdir()
    first = serve_with_keys(base)
    try:
        await produce(first, "durable", 1)
        status, answer = await call(
            first,
            "POST",
            "/admin/v1/fleet/control",
            "ta-admin",
            {"kind": "config", "args": {"concurrency": 5}, "workers": ["ta-w1"]},
        )
        assert status == 200, answer
        control_id = answer["controls"][0]["id"]
    finally:
        first.stop()
    second = serve_with_keys(base)
    try:
        row = await fleet_row(second, "ta-w1")
        assert [c["id"] for c in row["pending"]] == [control_id]
        worker = Worker("durable", idle_handler(), config=config(second, "ta-w1"), fleet_interval=BEAT)
        async with running(worker):
            await event_for(second, "control-applied", "ta-w1", control_id)
            assert worker.concurrency == 5
        assert (await fleet_row(second, "ta-w1"))["pending"] == []
    finally:
        second.stop()


async def test_heartbeats_reach_a_separate_queue_server(tmp_path: Path) -> None:
    """`strictq serve --queue-server URL`: the gateway forwards heartbeats to the queue server, whose
    registry, controls and events serve them (its admin routes, the same key file)."""
    import json
    import urllib.request

    from conftest import start_server

    keys = tmp_path / "keys.toml"
    write_keys(keys, CREDENTIALS, "the fleet test's tenants")
    server = start_server(tmp_path / "queue", "--keys", str(keys))
    try:
        gateway = start_serve(tmp_path / "edge", "--keys", str(keys), "--queue-server", server.url, tls=True)
        try:

            def admin(method: str, path: str, body: Any = None) -> tuple[int, Any]:
                data = None if body is None else json.dumps(body).encode()
                request = urllib.request.Request(server.url + path, data=data, method=method)
                request.add_header("X-BV-API-Key", SECRET["ta-admin"])
                request.add_header("Content-Type", "application/json")
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        return answer.status, json.loads(answer.read())
                except urllib.error.HTTPError as exc:
                    return exc.code, json.loads(exc.read())

            await produce(gateway, "remote", 1)
            worker = Worker("remote", idle_handler(), config=config(gateway, "ta-w1"), fleet_interval=BEAT)
            async with running(worker):

                async def registered() -> bool:
                    status, view = await asyncio.to_thread(admin, "GET", "/admin/v1/fleet")
                    return status == 200 and any(w["worker"] == "ta-w1" for w in view["workers"])

                await until(registered, WAIT, interval=0.1, what="ta-w1 in the queue server's fleet")
                body = {"kind": "config", "args": {"limit": 2}, "queue": "remote"}
                status, answer = await asyncio.to_thread(admin, "POST", "/admin/v1/fleet/control", body)
                assert status == 200 and [c["worker"] for c in answer["controls"]] == ["ta-w1"], answer
                await until(lambda: worker.limit == 2, WAIT, what="the control applied through the gateway")

                async def applied() -> bool:
                    status, found = await asyncio.to_thread(admin, "GET", "/admin/v1/events")
                    return status == 200 and any(e["event"] == "control-applied" for e in found["events"])

                await until(applied, WAIT, interval=0.1, what="the event on the queue server")
        finally:
            gateway.stop()
    finally:
        server.stop()
