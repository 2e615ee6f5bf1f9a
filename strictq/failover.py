"""The failover scenario: the whole single-machine system, one worker turning faulty, a backend outage.

What `strictq demo` narrates, `tests/test_failure_e2e.py` asserts and `bench/failure_bench.py` times, so
the three exercise one story:

1. `strictq serve` (gateway over TLS, queue core, egress proxy child) runs on free ports in a data
   directory, with failure management's settings sub-second enough to run in seconds; a small fake
   backend (`POST /v1/charge`, `GET /v1/health`) counts the calls that reach it per worker; a producer
   sends orders for many groups (one per group every `round_interval`); N SDK workers, each with its own
   credential, charge them through the proxy.
2. One worker turns faulty (a bad deploy: it calls `/v0`, which the backend does not have): after
   `fence_after` failed attempts it is fenced; its groups finish on the other workers, in order; its
   calls (a canary keeps trying the backend) are blocked at the proxy and never reach the backend.
3. It is healed; a probe (the SDK's `probe` handler) passes and it is unfenced.
4. The backend fails for everyone: one failure signature on several workers is a backend problem, so
   nobody is fenced; probes fail on most workers and the queue is suspended; the backend recovers, a
   probe passes and the queue resumes by itself.
5. Everything sent is processed: none lost, none twice, each group in order, never two handlers of one
   group at once (checked as it happens), and the timings are read back from the wire log.

Module entry point for replay: `python -m strictq.failover worker --backend URL [--version 2]` runs the
scenario's worker alone against STRICTQ_* (the version 2 charges in another currency: a visible diff).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from access.keys import new_secret
from protocol.headers import API_KEY, PROXY_ACTION
from strictq.sdk import ClientConfig, Entry, Message, Producer, Worker
from strictq.sdk.outbound import proxy_authorization, tagged_session

QUEUE = "orders"
TENANT = "dev"
WORKER_HEADER = "X-Demo-Worker"  # who made a call, for the backend's per-worker counts
KIND_HEADER = "X-Demo-Kind"  # order | probe | canary | startup
GOOD_BASE, BAD_BASE = "/v1", "/v0"
START_TIMEOUT = 60.0  # strictq serve, its proxy child and mitmproxy's first start on a busy machine
STOP_TIMEOUT = 20.0
Say = Callable[[str], None]


class ScenarioError(Exception):
    """A phase did not happen within its bounded wait (the message says which and what was seen)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The scenario's shape and failure management's settings (flags of `strictq serve`)."""

    workers: int = 3
    faulty: int = 0  # index of the worker that turns faulty (default: the last one)
    groups: int = 12
    round_interval: float = 0.25  # the producer sends one order per group this often
    work: float = 0.02  # seconds a handler "works" before it charges
    concurrency: int = 2  # groups per worker at once
    ttl: float = 10.0
    # strictq serve --health-window ... (docs/failure-management.md §3)
    window: float = 20.0
    fence_after: int = 4
    probe_interval: float = 1.0
    probe_backoff_max: float = 1.0  # = probe_interval: a suspended queue is probed at a steady pace
    probe_timeout: float = 3.0
    blacklist_after: int = 5
    shared_failure_workers: int = 2
    large_scale_fraction: float = 0.5
    # per-group retry policy (PUT /admin/v1/queues/orders/groups/policy)
    retry_backoff: float = 0.2
    retry_backoff_max: float = 1.0
    outages: int = 1
    outage_hold: float = 1.0  # the backend stays down this long once the queue is suspended
    outage_jitter: float = 0.0  # plus up to this much (random): recovery at any phase of the probe cycle
    canary_interval: float = 0.05
    phase_timeout: float = 30.0
    drain_timeout: float = 45.0

    @property
    def faulty_worker(self) -> str:
        return f"worker-{(self.faulty or self.workers)}"

    def serve_flags(self) -> list[str]:
        return [
            *("--health-window", f"{self.window:g}"),
            *("--fence-after", str(self.fence_after)),
            *("--probe-interval", f"{self.probe_interval:g}"),
            *("--probe-backoff-max", f"{max(self.probe_backoff_max, self.probe_interval):g}"),
            *("--probe-timeout", f"{self.probe_timeout:g}"),
            *("--blacklist-after", str(self.blacklist_after)),
            *("--shared-failure-workers", str(self.shared_failure_workers)),
            *("--large-scale-fraction", f"{self.large_scale_fraction:g}"),
        ]


# ------------------------------------------------------------------------------------------- system
@dataclass(slots=True)
class Credentials:
    admin: str
    producer: str
    proxy: str
    workers: dict[str, str]  # id -> secret


def write_keys(path: Path, workers: int) -> Credentials:
    """A key file (the gateway's TOML) with an admin, a producer, the proxy and `workers` workers."""
    creds = Credentials(
        admin=new_secret(),
        producer=new_secret(),
        proxy=new_secret(),
        workers={f"worker-{i}": new_secret() for i in range(1, workers + 1)},
    )
    entries = [("admin", creds.admin, "admin"), ("producer", creds.producer, "producer")]
    entries += [(wid, secret, "worker") for wid, secret in creds.workers.items()]
    entries.append(("proxy", creds.proxy, "proxy"))
    text = "# strictq failover scenario credentials\n" + "".join(
        f'[[credential]]\nid = "{cid}"\nsecret = "{secret}"\nrole = "{role}"\n'
        f'tenant = "{TENANT}"\nprefixes = [""]\n\n'
        for cid, secret, role in entries
    )
    from wirelog.files import private_dir, write_private

    private_dir(path.parent)
    write_private(path, text)  # 0600 from its creation, never chmod after the secrets are in
    return creds


class System:
    """`strictq serve` as a child process on free ports, its start-up lines parsed (design note)."""

    def __init__(self, data_dir: Path, settings: Settings) -> None:
        self.data_dir = data_dir
        self.settings = settings
        self.creds = write_keys(data_dir / "keys.toml", settings.workers)
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: dict[str, str] = {}
        self._drain: asyncio.Task[None] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return self.lines["listening on"]

    @property
    def ca(self) -> str:
        return self.lines["ca"]

    @property
    def proxy_url(self) -> str:
        return self.lines["proxy on"]

    @property
    def proxy_ca(self) -> str:
        return self.lines["proxy ca"]

    @property
    def wirelog(self) -> Path:
        return self.data_dir / "wirelog"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def config(self, worker: str | None = None) -> ClientConfig:
        return ClientConfig(
            url=self.url,
            ca_file=self.ca,
            api_key=self.creds.producer,
            worker_id=worker,
            worker_secret=self.creds.workers.get(worker or ""),
            proxy_url=self.proxy_url,
            proxy_ca_file=self.proxy_ca,
        )

    async def start(self) -> None:
        argv = [
            *(sys.executable, "-m", "strictq", "serve"),
            *("--host", "127.0.0.1", "--port", "0", "--proxy-port", "0"),
            *("--data-dir", str(self.data_dir), "--keys", str(self.data_dir / "keys.toml")),
            *self.settings.serve_flags(),
        ]
        self._log = await asyncio.to_thread(open, self.data_dir / "serve.log", "ab")  # closed in stop()
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while "client env" not in self.lines:
                    raw = await self.proc.stdout.readline()
                    if not raw:
                        raise ScenarioError(
                            f"strictq serve exited during start-up; see {self.data_dir}/serve.log"
                        )
                    line = raw.decode(errors="replace").strip()
                    for key in ("listening on", "ca", "keys", "proxy on", "proxy ca", "client env"):
                        if line.startswith(f"strictq: {key} "):
                            self.lines[key] = line[len(f"strictq: {key} ") :]
        except TimeoutError:
            raise ScenarioError(f"strictq serve did not start within {START_TIMEOUT:g} s") from None
        self._drain = asyncio.create_task(self._drain_stdout(), name="strictq-serve-stdout")

    async def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while await self.proc.stdout.readline():
            pass

    async def stop(self) -> None:
        """SIGTERM (the proxy child flushes its wire log and stops first), then wait; kill if it hangs."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._drain is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain, 5)
        if self._log is not None:
            self._log.close()
            self._log = None


class Admin:
    """The admin API of the running system: events, status, per-group retry policies."""

    def __init__(self, system: System) -> None:
        import ssl

        context = ssl.create_default_context(cafile=system.ca)
        self.base = system.url + "/admin/v1"
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            headers={API_KEY: system.creds.admin},
            timeout=aiohttp.ClientTimeout(total=15),
        )

    async def close(self) -> None:
        await self.session.close()

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self.session.request(method, self.base + path, **kwargs) as resp:
            body = await resp.read()
            if resp.status >= 400:
                raise ScenarioError(f"{method} {path}: HTTP {resp.status} {body[:300]!r}")
            return orjson.loads(body) if body else None

    async def events(self, since: int) -> list[dict[str, Any]]:
        answer = await self.call("GET", "/events", params={"since": str(since)})
        return list(answer.get("events") or [])

    async def status(self) -> dict[str, Any]:
        return dict(await self.call("GET", "/status"))

    async def set_policy(self, group: str, policy: dict[str, Any]) -> None:
        await self.call("PUT", f"/queues/{QUEUE}/groups/policy", params={"group": group}, json=policy)


class Events:
    """Failure management's events as they happen (GET /admin/v1/events, polled every 50 ms)."""

    def __init__(self, admin: Admin, say: Say) -> None:
        self.admin = admin
        self.say = say
        self.seen: list[dict[str, Any]] = []
        self._last = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll(), name="strictq-failover-events")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self) -> None:
        while True:
            try:
                for event in await self.admin.events(self._last):
                    self._last = max(self._last, int(event.get("n", 0)))
                    self.seen.append(event)
                    self._narrate(event)
                    self._changed.set()
            except (aiohttp.ClientError, TimeoutError, ScenarioError) as exc:
                self.say(f"(events: {exc})")
            await asyncio.sleep(0.05)

    def _narrate(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind in ("probe-passed", "probe-failed", "probe"):
            who = event.get("worker") or "the next poller"
            self.say(f"  event {kind:<13} {who}: {event.get('reason')}")
        elif kind in ("fence", "unfence", "suspend", "resume", "shared-failure", "blacklist", "alert"):
            target = event.get("worker") or event.get("queue") or ""
            self.say(f"  event {kind:<13} {target}: {event.get('reason')}")

    def find(self, event: str, *, after: float = 0.0, **fields: Any) -> dict[str, Any] | None:
        for item in self.seen:
            if item.get("event") == event and float(item.get("at", 0)) >= after:
                if all(item.get(k) == v or str(item.get(k, "")).endswith(f".{v}") for k, v in fields.items()):
                    return item
        return None

    async def wait(self, event: str, within: float, *, after: float = 0.0, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while (found := self.find(event, after=after, **fields)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                recent = [
                    f"{e.get('event')} {e.get('worker') or e.get('queue') or ''}" for e in self.seen[-8:]
                ]
                raise ScenarioError(f"no {event} event {fields or ''} within {within:g} s (latest: {recent})")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
        return found


# ------------------------------------------------------------------------------------------ backend
class Backend:
    """The fake payments backend: `POST /v1/charge`, `GET /v1/health`; 404 elsewhere; 503 while down.
    It remembers when each call reached it, per worker and kind, and the charges per order."""

    def __init__(self) -> None:
        self.down = False
        self.calls: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.charges: Counter[tuple[str, int]] = Counter()
        self.switched: list[tuple[float, bool]] = []  # (when, down)
        self.url = ""
        self._runner: web.AppRunner | None = None

    def set_down(self, down: bool) -> float:
        self.down = down
        now = time.time()
        self.switched.append((now, down))
        return now

    def count(self, worker: str, kinds: Iterable[str] = ("order", "canary"), since: float = 0.0,
              until: float = float("inf")) -> int:  # fmt: skip
        return sum(1 for k in kinds for at in self.calls.get((worker, k), ()) if since <= at <= until)

    async def _handle(self, request: web.Request) -> web.Response:
        worker = request.headers.get(WORKER_HEADER, "-")
        kind = request.headers.get(KIND_HEADER, "-")
        self.calls[(worker, kind)].append(time.time())
        if self.down:
            return web.json_response({"error": "payments backend unavailable"}, status=503)
        if request.method == "GET" and request.path == f"{GOOD_BASE}/health":
            return web.json_response({"ok": True})
        if request.method == "POST" and request.path == f"{GOOD_BASE}/charge":
            order = await request.json()
            self.charges[(str(order["group"]), int(order["n"]))] += 1
            return web.json_response({"charge_id": f"ch-{order['group']}-{order['n']}", "status": "ok"})
        return web.json_response({"error": f"no route {request.method} {request.path}"}, status=404)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# ------------------------------------------------------------------------------------------ tracking
class Tracker:
    """What was sent and processed, per group: order, duplicates and overlaps as they happen.

    Two handlers of one group may run at once for a moment when a claim is taken away (the fenced worker's
    claims are released while its handler still runs): fencing makes that harmless, since the old holder's
    calls are refused by the proxy, so such a handler cannot succeed. What must never happen is two
    *successful* runs of one group overlapping in time: that is an overlap; the harmless kind is counted as
    `superseded`."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = defaultdict(int)  # next order number = orders sent
        self.done: dict[str, list[int]] = defaultdict(list)  # completion order per group
        self.done_by: dict[tuple[str, int], str] = {}
        self.failed_by: dict[str, set[tuple[str, int]]] = defaultdict(set)
        # (group, n) -> every handler run: (message id, worker, attempt, succeeded)
        self.runs: dict[tuple[str, int], list[tuple[str, str, int, bool]]] = defaultdict(list)
        self.running: dict[str, list[tuple[str, int, float]]] = defaultdict(list)  # group -> runs
        self.last_success: dict[str, tuple[float, float, str, int]] = {}  # group -> (start, end, worker, n)
        self.overlaps: list[str] = []
        self.superseded = 0
        self.changed = asyncio.Event()

    def start(self, group: str, n: int, worker: str) -> float:
        started = time.monotonic()
        if self.running[group]:
            self.superseded += 1
        self.running[group].append((worker, n, started))
        return started

    def end(self, group: str, n: int, worker: str, started: float, ok: bool, message: Message) -> None:
        ended = time.monotonic()
        self.runs[(group, n)].append((message.id, worker, message.attempt, ok))
        runs = self.running[group]
        with contextlib.suppress(ValueError):
            runs.remove((worker, n, started))
        if ok:
            last = self.last_success.get(group)
            if last is not None and last[1] > started:
                self.overlaps.append(
                    f"{group}: order {n} on {worker} overlapped order {last[3]} on {last[2]}, both succeeded"
                )
            self.last_success[group] = (started, ended, worker, n)
            self.done[group].append(n)
            self.done_by.setdefault((group, n), worker)
        else:
            self.failed_by[worker].add((group, n))
        self.changed.set()

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_done(self) -> int:
        return sum(len(set(v)) for v in self.done.values())

    @property
    def lost(self) -> int:
        return sum(n - len(set(self.done.get(g, ()))) for g, n in self.sent.items())

    @property
    def duplicates(self) -> int:
        return sum(len(v) - len(set(v)) for v in self.done.values())

    @property
    def order_violations(self) -> int:
        """Groups whose orders were processed out of order (first completions not 0, 1, 2, ...)."""
        bad = 0
        for group, done in self.done.items():
            first = list(dict.fromkeys(done))
            if first != list(range(len(first))) or any(n >= self.sent[group] for n in first):
                bad += 1
        return bad

    def finished_elsewhere(self, worker: str) -> bool:
        return all(
            (by := self.done_by.get(key)) is not None and by != worker
            for key in self.failed_by.get(worker, ())
        )


# ------------------------------------------------------------------------------------------- workers
def order_body(payload: dict[str, Any], version: int) -> dict[str, Any]:
    """What the worker sends to the backend for an order (version 2 charges in euros: a visible diff)."""
    body = {"group": payload["group"], "n": payload["n"], "amount": payload["amount"]}
    if version >= 2:
        body["currency"] = "EUR"
    return body


async def charge(message: Message, backend: str, base: str, worker: str, version: int = 1) -> dict[str, Any]:
    """The scenario's handler body: one charge through the proxy, recorded as a step."""
    if message.history.done("charged"):  # a prior attempt charged: don't charge twice
        result = message.history.result("charged")
        await message.step("charged", result)
        return dict(result or {})
    headers = {WORKER_HEADER: worker, KIND_HEADER: "order"}
    async with message.http.post(
        f"{backend}{base}/charge", json=order_body(message.payload, version), headers=headers
    ) as resp:
        resp.raise_for_status()
        answer = dict(await resp.json())
    await message.step("charged", answer)
    message.fields["amount"] = message.payload.get("amount")
    return answer


async def health_check(http: aiohttp.ClientSession, backend: str, base: str, worker: str, kind: str) -> int:
    headers = {WORKER_HEADER: worker, KIND_HEADER: kind}
    async with http.get(f"{backend}{base}/health", headers=headers) as resp:
        await resp.read()
        if kind == "probe":
            resp.raise_for_status()
        return resp.status


class ScenarioWorker:
    """One SDK worker with its own credential; `base` is what a bad deploy breaks; a canary loop shows
    whether its calls reach the backend."""

    def __init__(
        self, name: str, system: System, backend: Backend, tracker: Tracker, settings: Settings
    ) -> None:
        self.name = name
        self.backend = backend
        self.tracker = tracker
        self.settings = settings
        self.base = GOOD_BASE
        self.config = system.config(name)
        self.worker = Worker(
            QUEUE,
            self.handle,
            probe=self.probe,
            config=self.config,
            ttl=settings.ttl,
            limit=2 * settings.concurrency,
            concurrency=settings.concurrency,
            wait=1.0,
            grace=2.0,
            retry_backoff=(0.1, 1.0),
        )
        self.canary_status: Counter[int] = Counter()
        self.canary_blocked_at: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._canary: asyncio.Task[None] | None = None
        self._connector: aiohttp.TCPConnector | None = None
        self._ops: aiohttp.ClientSession | None = None

    @property
    def faulty(self) -> bool:
        return self.base != GOOD_BASE

    async def handle(self, message: Message) -> None:
        group, n = message.payload["group"], int(message.payload["n"])
        started = self.tracker.start(group, n, self.name)
        ok = False
        try:
            await asyncio.sleep(self.settings.work)
            await charge(message, self.backend.url, self.base, self.name)
            ok = True
        finally:
            self.tracker.end(group, n, self.name, started, ok, message)

    async def probe(self, message: Message) -> None:
        """The probe handler: the same path to the backend as an order, without charging anything."""
        await health_check(message.http, self.backend.url, self.base, self.name, "probe")

    async def start(self) -> None:
        """Check the backend through the proxy (a recorded GET /v1/health answers mimicked probes later),
        then poll."""
        self._connector = aiohttp.TCPConnector(ssl=self.config.outbound_ssl())
        self._ops = tagged_session(
            self._connector,
            proxy_url=self.config.proxy_for(self.name),
            proxy_headers=proxy_authorization(self.name, self.config.worker_secret),
            timeout=aiohttp.ClientTimeout(total=5),
        )
        status = await health_check(self._ops, self.backend.url, GOOD_BASE, self.name, "startup")
        if status != 200:
            raise ScenarioError(
                f"{self.name}: the backend's health check through the proxy answered {status}"
            )
        self._task = asyncio.create_task(self.worker.run(), name=f"scenario-{self.name}")

    def start_canary(self) -> None:
        self._canary = asyncio.create_task(self._canary_loop(), name=f"scenario-canary-{self.name}")

    async def stop_canary(self) -> None:
        if self._canary is not None:
            self._canary.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._canary
            self._canary = None

    async def _canary_loop(self) -> None:
        assert self._ops is not None
        while True:
            try:
                async with self._ops.get(
                    f"{self.backend.url}{GOOD_BASE}/health",
                    headers={WORKER_HEADER: self.name, KIND_HEADER: "canary"},
                ) as resp:
                    await resp.read()
                    self.canary_status[resp.status] += 1
                    if resp.headers.get(PROXY_ACTION) == "block":
                        self.canary_blocked_at.append(time.time())
            except (aiohttp.ClientError, TimeoutError):
                self.canary_status[0] += 1
            await asyncio.sleep(self.settings.canary_interval)

    async def stop(self) -> None:
        await self.stop_canary()
        self.worker.stop()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)
        if self._ops is not None:
            await self._ops.close()
        if self._connector is not None:
            await self._connector.close()


# -------------------------------------------------------------------------------------------- report
@dataclass(slots=True)
class Outage:
    """One backend outage: when it began, was judged shared, suspended the queue, ended, and resumed."""

    at: float
    shared_failure: float | None = None
    suspended: float | None = None
    recovered: float = 0.0
    resumed: float | None = None
    first_delivery: float | None = None  # the first real message delivered after `recovered`


@dataclass(slots=True)
class Report:
    """What happened, with the timings read back from the wire log (float seconds since the epoch)."""

    sent: int = 0
    done: int = 0
    lost: int = 0
    duplicates: int = 0
    order_violations: int = 0
    overlaps: list[str] = field(default_factory=list)
    superseded: int = 0  # handlers still running when their claim was taken away (harmless: fenced)
    workers: int = 0
    faulty_worker: str = ""
    faulty_at: float = 0.0
    first_failure: float | None = None  # the faulty worker's first failed call or attempt
    fence_decided: float | None = None  # the fence event
    fence_effective: float | None = None  # its first call the proxy blocked
    unfenced: float | None = None
    calls_while_fenced: int = 0  # the faulty worker's order/canary calls that reached the backend meanwhile
    blocked_while_fenced: int = 0  # its calls the proxy refused meanwhile
    failed_elsewhere: int = 0  # messages it failed that other workers finished
    faulty_failed: list[tuple[str, int]] = field(default_factory=list)  # (group, order) it failed, faulty
    outages: list[Outage] = field(default_factory=list)
    fences_during_outage: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    duration: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.order_violations == 0 and self.duplicates == 0 and not self.overlaps

    def _span(self, start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else end - start

    @property
    def time_to_fence(self) -> float | None:
        """First failure -> the fence in force at the proxy (its first blocked call)."""
        return self._span(self.first_failure, self.fence_effective)

    @property
    def time_to_fence_decision(self) -> float | None:
        return self._span(self.first_failure, self.fence_decided)

    @property
    def recovery_to_resume(self) -> list[float]:
        return [o.resumed - o.recovered for o in self.outages if o.resumed is not None]

    @property
    def recovery_to_delivery(self) -> list[float]:
        """Backend recovery -> the first real message delivered again (the gateway's delivery record)."""
        return [o.first_delivery - o.recovered for o in self.outages if o.first_delivery is not None]

    def figures(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "acked": self.done,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "order_violations": self.order_violations,
            "overlaps": len(self.overlaps),
            "superseded": self.superseded,
            "workers": self.workers,
            "time_to_fence_s": self.time_to_fence,
            "time_to_fence_decision_s": self.time_to_fence_decision,
            "recovery_to_resume_s": self.recovery_to_resume,
            "recovery_to_delivery_s": self.recovery_to_delivery,
            "outage_to_suspend_s": [o.suspended - o.at for o in self.outages if o.suspended is not None],
            "calls_while_fenced": self.calls_while_fenced,
            "blocked_while_fenced": self.blocked_while_fenced,
            "fences_during_outage": len(self.fences_during_outage),
            "probe_interval_s": self.settings.get("probe_interval"),
            "duration_s": self.duration,
        }


def read_timings(report: Report, wirelog: Path) -> None:
    """Fill the wire-log timings: every time is a record's `ts` (or an event's `at`), none a local guess."""
    from wirelog.reader import read_records

    faulty = report.faulty_worker
    for record in read_records(wirelog):
        kind, ts, worker = record.get("kind"), record.get("ts"), record.get("worker")
        if not isinstance(ts, int | float):
            continue
        if worker == faulty and ts >= report.faulty_at:
            response = record.get("response") or {}
            failed = (
                kind == "http"
                and record.get("action") == "pass"
                and (record.get("error") or (response.get("status") or 0) >= 400)
            ) or (kind == "log" and record.get("outcome") in ("failed", "partial"))
            if failed and (report.first_failure is None or ts < report.first_failure):
                report.first_failure = ts
            if kind == "http" and record.get("action") == "block":
                if report.fence_effective is None or ts < report.fence_effective:
                    report.fence_effective = ts
        if kind == "delivery" and not str(record.get("message_id") or "").startswith("probe-"):
            for outage in report.outages:
                if (
                    outage.recovered
                    and ts >= outage.recovered
                    and (outage.first_delivery is None or ts < outage.first_delivery)
                ):
                    outage.first_delivery = ts


# ------------------------------------------------------------------------------------------ scenario
class Scenario:
    """Runs the story; `say` narrates (the demo prints it, the test keeps it for its failure message)."""

    def __init__(
        self,
        data_dir: Path,
        settings: Settings | None = None,
        say: Say | None = None,
        section: Say | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.settings = settings or Settings()
        self.say: Say = say or (lambda text: None)
        self.section: Say = section or (lambda title: self.say(f"-- {title}"))
        # Called at "fenced" and "suspended" while the system runs (the demo shows `strictq status` there).
        self.checkpoint: Callable[[str], Awaitable[None]] | None = None
        self.system = System(data_dir, self.settings)
        self.backend = Backend()
        self.tracker = Tracker()
        self.report = Report(workers=self.settings.workers, faulty_worker=self.settings.faulty_worker)
        self.report.settings = {
            "probe_interval": self.settings.probe_interval,
            "fence_after": self.settings.fence_after,
            "window": self.settings.window,
        }
        self.workers: list[ScenarioWorker] = []
        self._stop_producing = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None

    async def run(self) -> Report:
        started = time.monotonic()
        admin: Admin | None = None
        events: Events | None = None
        try:
            self.section("the system: strictq serve, a backend, a producer and workers")
            await self.backend.start()
            self.say(f"fake payments backend on {self.backend.url} (POST /v1/charge, GET /v1/health)")
            await self.system.start()
            system = self.system
            self.say(
                f"strictq serve (pid {system.pid}): gateway {system.url} over TLS, queue core in-process"
            )
            self.say(f"  egress proxy {system.proxy_url} (a child process), wire log {system.wirelog}")
            admin = Admin(self.system)
            events = Events(admin, self.say)
            events.start()
            async with Producer(self.system.config()) as producer:
                await self._first_round(producer, admin)
                await self._start_workers()
                self._producer = asyncio.create_task(self._produce(producer), name="scenario-producer")
                await self._warm_up()
                await self._faulty_worker(events)
                await self._outages(events)
                await self._drain()
        finally:
            self._stop_producing.set()
            if self._producer is not None:
                with contextlib.suppress(Exception):
                    await self._producer
            for worker in self.workers:
                await worker.stop()
            if events is not None:
                await events.stop()
                self.report.events = list(events.seen)
            if admin is not None:
                await admin.close()
            await self.system.stop()
            await self.backend.stop()
            self.report.duration = time.monotonic() - started
        self._summarise()
        return self.report

    # -- phases ------------------------------------------------------------------------------------------
    async def _first_round(self, producer: Producer, admin: Admin) -> None:
        await self._send_round(producer)
        settings = self.settings
        # Retry on another worker at once (the narration says so): a faulty worker's failures must not
        # wait for it to come back.
        policy = {
            "retry_same_worker": 0,
            "retry_backoff": settings.retry_backoff,
            "retry_backoff_max": settings.retry_backoff_max,
        }
        for group in self._groups():
            await admin.set_policy(group, policy)
        self.say(
            f"producer: orders for {settings.groups} customers (one group each), a round every "
            f"{settings.round_interval:g} s"
        )
        self.say(
            f"  retry policy per group (admin API): another worker first, backoff "
            f"{settings.retry_backoff:g} s doubling to {settings.retry_backoff_max:g} s"
        )

    async def _start_workers(self) -> None:
        for i in range(1, self.settings.workers + 1):
            worker = ScenarioWorker(f"worker-{i}", self.system, self.backend, self.tracker, self.settings)
            await worker.start()
            self.workers.append(worker)
        self.say(
            f"{len(self.workers)} SDK workers (own credentials), each charging through the proxy: "
            + ", ".join(w.name for w in self.workers)
        )

    async def _warm_up(self) -> None:
        want = 2 * self.settings.groups
        await self._until(
            lambda: self.tracker.total_done >= want, self.settings.phase_timeout, f"{want} orders done"
        )
        per = ", ".join(f"{w} {n}" for w, n in sorted(Counter(self.tracker.done_by.values()).items()))
        self.say(f"warm-up: {self.tracker.total_done} orders charged ({per})")

    async def _faulty_worker(self, events: Events) -> None:
        settings, report = self.settings, self.report
        faulty = next(w for w in self.workers if w.name == settings.faulty_worker)
        self.section(f"a faulty worker: {faulty.name}")
        report.faulty_at = time.time()
        faulty.base = BAD_BASE
        faulty.start_canary()
        self.say(f"{faulty.name} turns faulty: a bad deploy calls {BAD_BASE}/charge, which answers 404")
        self.say(
            f"  (a canary keeps calling the backend as {faulty.name} every {settings.canary_interval:g} s)"
        )
        fence = await events.wait(
            "fence", settings.phase_timeout, after=report.faulty_at - 1, worker=faulty.name
        )
        report.fence_decided = float(fence["at"])
        backend_calls = self.backend.count(faulty.name)
        await self._until(
            lambda: self.tracker.finished_elsewhere(faulty.name),
            settings.phase_timeout,
            f"{faulty.name}'s failed orders done elsewhere",
        )
        report.faulty_failed = sorted(self.tracker.failed_by[faulty.name])
        report.failed_elsewhere = len(report.faulty_failed)
        since = self.backend.count(faulty.name) - backend_calls
        self.say(
            f"{faulty.name} is fenced: the {report.failed_elsewhere} order(s) it failed were charged by "
            "other workers, each group in order"
        )
        self.say(
            f"  its calls stopped reaching the backend: {backend_calls} before the fence, {since} since; "
            f"the proxy refused {len(faulty.canary_blocked_at)}"
        )
        await self._checkpoint("fenced")
        healed_at = time.time()
        faulty.base = GOOD_BASE
        self.say(f"{faulty.name} is healed (the fix is deployed); waiting for a probe to pass")
        unfence = await events.wait(
            "unfence", settings.phase_timeout, after=healed_at - 1, worker=faulty.name
        )
        report.unfenced = float(unfence["at"])
        await faulty.stop_canary()
        report.blocked_while_fenced = len(faulty.canary_blocked_at)
        self.say(f"{faulty.name} is restored and takes orders again")

    async def _outages(self, events: Events) -> None:
        settings, report = self.settings, self.report
        for number in range(1, settings.outages + 1):
            await asyncio.sleep(3 * settings.round_interval)  # a little normal traffic first
            self.section(
                "a backend outage" + (f" ({number} of {settings.outages})" if settings.outages > 1 else "")
            )
            outage = Outage(self.backend.set_down(True))
            report.outages.append(outage)
            self.say("the payments backend fails for everyone (503)")
            suspend = await events.wait("suspend", settings.phase_timeout, after=outage.at - 0.5)
            outage.suspended = float(suspend["at"])
            shared = events.find("shared-failure", after=outage.at - 0.5)
            outage.shared_failure = float(shared["at"]) if shared else None
            hold = settings.outage_hold + random.uniform(0, settings.outage_jitter)
            self.say(
                f"queue suspended: nothing delivered, nothing lost; the backend stays down {hold:.2g} s more"
            )
            await self._checkpoint("suspended")
            await asyncio.sleep(hold)
            outage.recovered = self.backend.set_down(False)
            self.say("the payments backend recovers")
            resume = await events.wait("resume", settings.phase_timeout, after=outage.recovered - 0.5)
            outage.resumed = float(resume["at"])
            fenced = [
                f"{e.get('worker')}: {e.get('reason')}"
                for e in events.seen
                if e.get("event") == "fence" and outage.at - 0.5 <= float(e.get("at", 0)) <= outage.resumed
            ]
            report.fences_during_outage += fenced
            self.say(
                f"the queue resumed by itself {outage.resumed - outage.recovered:.2f} s after the recovery; "
                + ("no worker was fenced for the outage" if not fenced else f"fenced meanwhile: {fenced}")
            )

    async def _drain(self) -> None:
        self.section("draining")
        await asyncio.sleep(3 * self.settings.round_interval)
        self._stop_producing.set()
        if self._producer is not None:
            await self._producer
        sent = self.tracker.total_sent
        await self._until(
            lambda: self.tracker.total_done >= sent, self.settings.drain_timeout, f"all {sent} orders done"
        )
        self.say(f"producer stopped after {sent} orders; all of them are done")

    # -- helpers -----------------------------------------------------------------------------------------
    async def _checkpoint(self, name: str) -> None:
        if self.checkpoint is not None:
            await self.checkpoint(name)

    def _groups(self) -> list[str]:
        return [f"customer-{i:02d}" for i in range(1, self.settings.groups + 1)]

    async def _send_round(self, producer: Producer) -> None:
        entries = []
        for group in self._groups():
            n = self.tracker.sent[group]
            entries.append(Entry(QUEUE, {"group": group, "n": n, "amount": 10 + n % 7}, group))
        for result in await producer.send_batch(entries):
            if result.status in ("sent", "unknown"):  # unknown: maybe sent; counted so a loss would show
                self.tracker.sent[result.entry.group or ""] += 1

    async def _produce(self, producer: Producer) -> None:
        while not self._stop_producing.is_set():
            await self._send_round(producer)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_producing.wait(), self.settings.round_interval)

    async def _until(self, predicate: Callable[[], bool], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ScenarioError(
                    f"timed out after {within:g} s waiting for {what} "
                    f"(sent {self.tracker.total_sent}, done {self.tracker.total_done})"
                )
            self.tracker.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.tracker.changed.wait(), min(left, 0.25))

    def _summarise(self) -> None:
        report, tracker = self.report, self.tracker
        report.sent = tracker.total_sent
        report.done = tracker.total_done
        report.lost = tracker.lost
        report.duplicates = tracker.duplicates
        report.order_violations = tracker.order_violations
        report.overlaps = list(tracker.overlaps)
        report.superseded = tracker.superseded
        if self.system.wirelog.is_dir():
            read_timings(report, self.system.wirelog)
        if report.fence_effective is not None and report.unfenced is not None:  # the backend's own count
            report.calls_while_fenced = self.backend.count(
                report.faulty_worker, since=report.fence_effective, until=report.unfenced
            )


# ------------------------------------------------------------------------------------- replay worker
def worker_main(argv: list[str] | None = None) -> int:
    """`python -m strictq.failover worker`: the scenario's worker alone (STRICTQ_* configure it), for
    `strictq replay`; SIGTERM stops it."""
    parser = argparse.ArgumentParser(
        prog="python -m strictq.failover worker", description=worker_main.__doc__
    )
    parser.add_argument("--backend", required=True, help="the backend's base URL the recording used")
    parser.add_argument("--version", type=int, default=1, help="2: charges in euros (a changed request)")
    parser.add_argument("--queue", default=QUEUE)
    args = parser.parse_args(argv)

    async def main() -> None:
        config = ClientConfig.from_env()
        name = config.worker_id or "worker"

        async def handle(message: Message) -> None:
            await charge(message, args.backend.rstrip("/"), GOOD_BASE, name, args.version)

        worker = Worker(args.queue, handle, config=config, wait=1.0, grace=2.0, retry_backoff=(0.1, 1.0))
        worker.install_signal_handlers()
        await worker.run()

    asyncio.run(main())
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "worker":
        print("usage: python -m strictq.failover worker --backend URL [--version 2]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(worker_main(sys.argv[2:]))
