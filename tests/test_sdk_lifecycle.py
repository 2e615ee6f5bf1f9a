"""The SDK's lifecycle (issue 12, item 4): it declares its capabilities on every poll, stops cleanly on
SIGTERM and Ctrl-C, and backs off (full jitter, bounded, logged once per step) when the egress proxy
refuses its calls or its polls fail.

The stop and proxy tests run the real `strictq serve` (gateway over TLS, queue core with failure
management, egress proxy child; scenarios.failover.System) and real SDK worker processes
(tests/sdk_lifecycle_worker.py) sent real signals. The header and poll-backoff tests run an SDK worker
in-process against a small aiohttp app on 127.0.0.1 standing in for the gateway, which records what it
is sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import ROOT, ChildProcess
from kit import launch, until

from scenarios.failover import QUEUE, Admin, Backend, Settings, System
from strictq.sdk import CAPABILITIES_HEADER, ClientConfig, Entry, Message, Producer, Worker
from strictq.sdk.backoff import Backoff
from wirelog.reader import read_records

WORKER_SCRIPT = Path(__file__).resolve().parent / "sdk_lifecycle_worker.py"
TTL = 60.0  # far beyond every bounded wait below: a redelivery within them is a hand-back, not a lapse
BLOCK_BACKOFF = ("0.05", "30")  # the blocked worker's refusal backoff: 0.05 s doubling (cap out of reach)
BLOCK_WINDOW = 3.0  # how long the blocked worker is watched
WAIT = 20.0  # bounded waits for what should happen at once
TEST_TIMEOUT = 120.0


# ------------------------------------------------------------------------------------------ helpers
class WorkerProcess(ChildProcess):
    """tests/sdk_lifecycle_worker.py as a child process: its stdout lines in a queue, stderr in a file."""

    def lines_until(self, predicate: Callable[[str], bool], within: float = WAIT) -> list[str]:
        """Read stdout lines until one matches (returned with the ones before it); fails after `within`."""
        seen: list[str] = []
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching line within {within:g} s; saw {seen}; log:\n{self.log()}")
            try:
                line = self.stdout.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the worker exited; saw {seen}; log:\n{self.log()}")
            seen.append(line)
            if predicate(line):
                return seen

    def signal_and_wait(self, sig: int, within: float = WAIT) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the worker did not stop within {within:g} s; log:\n{self.log()}") from None


def start_worker(system: System, name: str, tmp_path: Path, mode: str, *extra: str) -> WorkerProcess:
    config = system.config(name)
    env = {
        "PYTHONPATH": str(ROOT),
        "STRICTQ_URL": config.url,
        "STRICTQ_CA_FILE": config.ca_file or "",
        "STRICTQ_WORKER_ID": name,
        "STRICTQ_WORKER_SECRET": config.worker_secret or "",
        "STRICTQ_PROXY_URL": config.proxy_url or "",
        "STRICTQ_PROXY_CA_FILE": config.proxy_ca_file or "",
    }
    argv = [sys.executable, str(WORKER_SCRIPT), "--queue", QUEUE, "--mode", mode, "--ttl", str(TTL), *extra]
    return launch(argv, tmp_path / f"{name}-{mode}.stderr", wait_for=(), env=env, make=WorkerProcess)


def stop_worker(worker: WorkerProcess) -> None:
    if worker.running():
        worker.kill()
    if worker.proc.stdout is not None:
        worker.proc.stdout.close()


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[System]:
    """`strictq serve` with failure management on (fence after 2 failed attempts in 60 s: a claim that
    lapsed or a failure reported on stop would show) and its egress proxy."""
    settings = Settings(workers=3, window=60.0, fence_after=2, probe_interval=30.0, probe_backoff_max=30.0)
    system = System(tmp_path / "system", settings)
    await system.start()
    try:
        yield system
    finally:
        await system.stop()


async def send(system: System, payloads: list[dict[str, Any]], group: str) -> None:
    async with Producer(system.config()) as producer:
        results = await producer.send_batch([Entry(QUEUE, p, group) for p in payloads])
    assert [r.status for r in results] == ["sent"] * len(payloads), results


async def worker_status(admin: Admin, name: str) -> dict[str, Any]:
    status = await admin.status()
    return next((w for w in status["workers"] if w["worker"] == name), {"worker": name, "failures": 0})


def assert_clean_exit(worker: WorkerProcess, code: int, expected: int) -> None:
    log = worker.log_path.read_text(errors="replace")
    assert code == expected, log
    assert "Traceback" not in log, log


# ------------------------------------------------------------------------------------------ stopping
@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
async def test_a_signal_mid_message_hands_it_to_another_worker_at_once(
    system: System, tmp_path: Path, sig: int, expected: int
) -> None:
    """SIGTERM / Ctrl-C while a handler runs: the worker waits its grace period, hands the claim back
    (not_attempted) and exits without a traceback; another worker gets the message right away (the
    claim's ttl is 60 s), nothing counts against the stopped worker, and nobody is fenced."""
    await send(system, [{"group": "g1", "n": 1}, {"group": "g1", "n": 2}], "g1")
    admin = Admin(system)
    first = start_worker(system, "worker-1", tmp_path, "hang", "--grace", "0.5")
    second: WorkerProcess | None = None
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            started = await asyncio.to_thread(first.lines_until, lambda line: line.startswith("started"))
            message_id = started[-1].split()[1]
            second = start_worker(system, "worker-2", tmp_path, "ok")
            code = await asyncio.to_thread(first.signal_and_wait, sig)
            assert_clean_exit(first, code, expected)
            log = first.log_path.read_text()
            assert f"{signal.Signals(sig).name} received: stopping" in log, log
            assert "handed back 2 message(s) of group g1" in log, log

            done = await asyncio.to_thread(
                second.lines_until, lambda line: line.startswith("done") and line.endswith(" 2")
            )
            handled = [line for line in done if line.startswith("done")]
            assert handled[0].split()[1:] == [message_id, "1"], done
            assert [line.split()[2] for line in handled] == ["1", "2"], done  # in group order

            status = await admin.status()
            assert status["operator_fences"] in ([], {}), status
            for name in ("worker-1", "worker-2"):
                state = await worker_status(admin, name)
                assert state.get("failures", 0) == 0 and state.get("state", "healthy") == "healthy", state
            events = [e for e in status["events"] if e["event"] in ("fence", "blacklist")]
            assert events == [], events
    finally:
        await admin.close()
        stop_worker(first)
        if second is not None:
            second.terminate()
            stop_worker(second)


async def test_a_blocked_worker_backs_off_and_stops_cleanly(system: System, tmp_path: Path) -> None:
    """A worker fenced at the proxy (block): each refused call hands its message back and the worker
    waits (full jitter, doubling from 0.05 s) before polling again. Over 3 s it makes a bounded number of
    attempts (an SDK without the backoff made ~20, a new lease each: ~0.15 s per attempt here) and logs
    the backoff once per step; SIGTERM then stops it cleanly, and once unfenced nothing is left fenced
    or counted against it."""
    backend = Backend()
    await backend.start()
    admin = Admin(system)
    worker: WorkerProcess | None = None
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            await admin.call("PUT", "/fences/worker-1", json={"mode": "block", "reason": "test: blocked"})
            await send(system, [{"group": "g1", "n": n} for n in (1, 2, 3)], "g1")
            worker = start_worker(
                system, "worker-1", tmp_path, "charge", "--backend", backend.url, "--backoff", *BLOCK_BACKOFF
            )
            await asyncio.to_thread(worker.lines_until, lambda line: line.startswith("started"))
            begun = time.time()
            await until(lambda: "backing off" in worker.full_log(), WAIT, what="the first refusal's backoff")
            await asyncio.sleep(max(0.0, BLOCK_WINDOW - (time.time() - begun)))  # a bounded watch
            ended = time.time()
            code = await asyncio.to_thread(worker.signal_and_wait, signal.SIGTERM)
            assert_clean_exit(worker, code, 0)
            await admin.call("DELETE", "/fences/worker-1")
            state = await worker_status(admin, "worker-1")
            assert state.get("failures", 0) == 0 and state.get("state", "healthy") == "healthy", state
            status = await admin.status()
            assert status["operator_fences"] in ([], {}), status
            assert [e for e in status["events"] if e["event"] in ("fence", "blacklist")] == []
    finally:
        await admin.close()
        if worker is not None:
            stop_worker(worker)
        await system.stop()  # the proxy flushes its wire log
        await backend.stop()
    assert worker is not None
    assert sum(len(calls) for calls in backend.calls.values()) == 0  # no call reached the backend

    refused = [
        r
        for r in read_records(system.wirelog)
        if r.get("kind") == "http" and r.get("worker") == "worker-1" and r.get("action") == "block"
    ]
    in_window = [r for r in refused if begun <= r["ts"] <= ended]
    leases = {r.get("lease") for r in refused}
    log = worker.log_path.read_text()
    backoff_lines = [line for line in log.splitlines() if "backing off" in line]
    # Full jitter doubling from 0.05 s: ~6 attempts expected in 3 s; 12 is far below the ~20 of no backoff.
    assert 1 <= len(in_window) <= 12, (len(in_window), len(refused))
    assert len(leases) <= 15, leases
    assert 1 <= len(backoff_lines) <= 12, backoff_lines  # once per step: 0.05 s doubling to 30 s
    assert len(backoff_lines) <= len(refused)


# ------------------------------------------------------------------------- a stand-in for the gateway
class FakeGateway:
    """The EmoDB face's poll and results routes, recording every poll's headers. `poll_status` != 200
    makes polls fail; `results=False` answers the results route 404 like a gateway without it."""

    def __init__(self, *, results: bool = True) -> None:
        self.results = results
        self.poll_status = 200
        self.polls: list[dict[str, str]] = []
        self.reported: list[dict[str, Any]] = []
        self.acked: list[str] = []
        self.pending = [
            {"id": f"m{n}", "group": "g", "seq": n, "token": 7, "attempt": 1, "payload": {"n": n}}
            for n in (1, 2)
        ]
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _poll(self, request: web.Request) -> web.Response:
        self.polls.append(dict(request.headers))
        if self.poll_status != 200:
            return web.json_response({"error": {"code": "unavailable"}}, status=self.poll_status)
        items, self.pending = self.pending, []
        return web.json_response(items)

    async def _results(self, request: web.Request) -> web.Response:
        if not self.results:
            return web.json_response({"error": {"code": "no_such_route"}}, status=404)
        body = await request.json()
        self.reported.extend(body["results"])
        return web.json_response({"results": [{"id": r["id"], "status": "ok"} for r in body["results"]]})

    async def _ack(self, request: web.Request) -> web.Response:
        self.acked.extend(await request.json())
        return web.json_response({"success": True})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/queue/1/{queue}/poll", self._poll)
        app.router.add_post("/queue/1/{queue}/results", self._results)
        app.router.add_post("/queue/1/{queue}/ack", self._ack)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def local_config(gateway: FakeGateway) -> ClientConfig:
    return ClientConfig(url=gateway.url, worker_id="worker-1", worker_secret="s3cret-s3cret-s3cret")


async def handle(message: Message) -> None:
    return None


async def test_every_poll_declares_results_probes_and_request_ids() -> None:
    gateway = FakeGateway()
    await gateway.start()
    worker = Worker("orders", handle, config=local_config(gateway), ttl=30.0)
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            task = asyncio.create_task(worker.run())
            await until(
                lambda: len(gateway.reported) == 2 and len(gateway.polls) >= 5, WAIT, what="polls, results"
            )
            worker.stop(1.0)
            await task
    finally:
        await gateway.stop()
    assert [r["outcome"] for r in gateway.reported] == ["succeeded", "succeeded"]
    declared = {p.get(CAPABILITIES_HEADER) for p in gateway.polls}
    assert declared == {"results, probes, request_ids"}, gateway.polls


async def test_without_the_results_route_the_worker_declares_only_request_ids() -> None:
    """An older gateway without the results route: the worker acks instead and, as it reports no
    results, stops declaring failure management (plain EmoDB semantics); `request_ids` changes no
    semantics and stays."""
    gateway = FakeGateway(results=False)
    await gateway.start()
    worker = Worker("orders", handle, config=local_config(gateway), ttl=30.0)
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            task = asyncio.create_task(worker.run())
            await until(lambda: len(gateway.acked) == 2, WAIT, what="acks")
            polls_before = len(gateway.polls)
            await until(lambda: len(gateway.polls) >= polls_before + 2, WAIT, what="polls after the fallback")
            worker.stop(1.0)
            await task
    finally:
        await gateway.stop()
    assert gateway.polls[0].get(CAPABILITIES_HEADER) == "results, probes, request_ids"
    assert [p.get(CAPABILITIES_HEADER) for p in gateway.polls[polls_before:]] == ["request_ids"] * (
        len(gateway.polls) - polls_before
    )


async def test_cancelling_run_hands_back_what_the_worker_holds() -> None:
    """A program that never installed signal handlers (asyncio.run + Ctrl-C cancels its main task): the
    cancelled worker still reports what it held `not_attempted`, in order, before run() ends."""
    gateway = FakeGateway()
    await gateway.start()
    started = asyncio.Event()

    async def hang(message: Message) -> None:
        started.set()
        await asyncio.Event().wait()

    worker = Worker("orders", hang, config=local_config(gateway), ttl=30.0)
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            task = asyncio.create_task(worker.run())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        await gateway.stop()
    outcomes = [(r["id"], r["outcome"]) for r in gateway.reported]
    assert outcomes == [("m1", "not_attempted"), ("m2", "not_attempted")]


async def test_one_signal_stops_every_worker_of_the_loop() -> None:
    """Two workers installed their handlers in one event loop: a SIGTERM stops both (the loop keeps one
    callback per signal), and the handler that was there before is back once both have ended."""
    gateway = FakeGateway()
    await gateway.start()
    before = signal.getsignal(signal.SIGTERM)
    workers = [Worker(q, handle, config=local_config(gateway), ttl=30.0) for q in ("orders", "invoices")]
    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            for worker in workers:
                worker.install_signal_handlers((signal.SIGTERM,))
            tasks = [asyncio.create_task(w.run()) for w in workers]
            await until(lambda: len(gateway.polls) >= 4, WAIT, what="both workers polling")
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.gather(*tasks)
    finally:
        await gateway.stop()
    assert [(w.stop_signal, w.exit_code) for w in workers] == [(signal.SIGTERM, 0)] * 2
    assert signal.getsignal(signal.SIGTERM) == before


async def test_failing_polls_back_off_with_jitter_and_say_so_once_per_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The gateway answers 503 until the backoff has reached its cap and ten more polls failed there: the
    worker says so once per step of the backoff (no line per retry), waits between polls (no hot loop),
    and says once that polls work again."""
    gateway = FakeGateway()
    gateway.poll_status = 503
    await gateway.start()
    worker = Worker("orders", handle, config=local_config(gateway), ttl=30.0, backoff=(0.02, 0.2))
    caplog.set_level(logging.INFO, logger="strictq.sdk")

    def backing_off() -> list[str]:
        return [r.getMessage() for r in caplog.records if "backing off" in r.getMessage()]

    try:
        async with asyncio.timeout(TEST_TIMEOUT):
            task = asyncio.create_task(worker.run())
            # 0.02, 0.04, 0.08, 0.16, then the 0.2 s cap: five steps, one line each
            await until(lambda: len(backing_off()) >= 5, WAIT, what="the backoff to reach its cap")
            at_cap, capped = len(gateway.polls), time.monotonic()
            await until(lambda: len(gateway.polls) >= at_cap + 10, WAIT, what="ten polls at the cap")
            spent = time.monotonic() - capped
            failed = len(gateway.polls)
            gateway.poll_status = 200
            await until(lambda: len(gateway.reported) == 2, WAIT, what="the messages once polls work")
            worker.stop(1.0)
            await task
    finally:
        await gateway.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "strictq.sdk"]
    assert len(backing_off()) == 5, backing_off()  # none more at the cap: one line per step, not per retry
    # Ten waits drawn from [0, 0.2 s] (mean 1 s in all) cannot all be tiny: a hot loop polls ten times in
    # a few milliseconds (without the backoff: 40+ polls in 4 s, each answered at once).
    assert spent >= 0.25, (spent, failed)
    assert len([m for m in messages if "works again" in m]) == 1, messages


def test_backoff_is_full_jitter_doubling_to_the_cap() -> None:
    draws = iter([1.0, 0.5, 0.0, 1.0, 1.0, 1.0, 0.25])
    backoff = Backoff(0.1, 0.5, rand=lambda: next(draws))
    steps = [backoff.fail() for _ in range(6)]
    assert backoff.ceiling == 0.5 and backoff.failures == 6
    assert [(round(d, 3), grew) for d, grew in steps] == [
        (0.1, True),
        (0.1, True),
        (0.0, True),
        (0.5, True),  # 0.8 capped to 0.5: still a step up from 0.4
        (0.5, False),
        (0.5, False),
    ]
    assert backoff.succeed() == 6 and not backoff.active and backoff.ceiling == 0.0
    assert backoff.fail() == (0.025, True)  # reset: from the base again
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)
    config = ClientConfig(url="http://x", worker_id="w", worker_secret="s")
    with pytest.raises(ValueError, match="backoff"):
        Worker("q", handle, config=config, backoff=(1.0, 0.5))
