"""The running system of the failover scenario: `strictq serve` as a child process on free ports (its
start-up lines parsed), the key file it reads, its admin API and failure management's events as they
happen; or the same system as a cluster (`ClusterSystem`: `strictq cluster up` and a second edge)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from access.keys import new_secret
from protocol.headers import API_KEY
from strictq.sdk import ClientConfig
from wirelog.files import private_dir, write_private

from .settings import QUEUE, TENANT, Say, ScenarioError, Settings

START_TIMEOUT = 60.0  # strictq serve, its proxy child and mitmproxy's first start on a busy machine
STOP_TIMEOUT = 20.0
CLUSTER_START_TIMEOUT = 180.0  # three queue servers, three nats-servers, two edges, on a busy machine


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
    private_dir(path.parent)
    write_private(path, text)  # 0600 from its creation, never chmod after the secrets are in
    return creds


class System:
    """`strictq serve` as a child process on free ports, its start-up lines parsed (docs/contracts.md)."""

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
    def wirelogs(self) -> list[Path]:
        """Every wire log the system writes (the gateway's and its proxy's; a cluster's edges' each)."""
        return [self.wirelog]

    @property
    def what(self) -> str:
        return f"strictq serve (pid {self.pid}): gateway {self.url} over TLS, queue core in-process"

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
        await self._start_serve()

    async def _start_serve(self) -> None:
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


class ClusterSystem(System):
    """The system as a cluster: `strictq cluster up` (three queue servers, R3, failure management's gates
    in every partition and its decider on one node; its gateway with the egress proxy) and a second edge
    (`strictq serve --cluster`, the edges' NATS login and the cluster's internal secret). Workers alternate
    between the edges, the faulty one on the second: its fence is decided on a queue server and must reach
    the first edge's proxy through the control bucket (docs/cluster.md)."""

    def __init__(self, data_dir: Path, settings: Settings) -> None:
        super().__init__(data_dir, settings)
        self.edge2: dict[str, str] = {}
        self._edge2: asyncio.subprocess.Process | None = None
        self._edge2_log: Any = None

    @property
    def gateway_dir(self) -> Path:
        return self.data_dir / "gateway"

    @property
    def wirelog(self) -> Path:
        return self.gateway_dir / "wirelog"

    @property
    def wirelogs(self) -> list[Path]:
        return [self.wirelog, self.data_dir / "edge2" / "wirelog"]

    @property
    def what(self) -> str:
        return (
            f"strictq cluster up (pid {self.pid}): 3 queue servers (R3), edges {self.url} and "
            f"{self.edge2.get('listening on', '?')}"
        )

    def on_second_edge(self, worker: str | None) -> bool:
        if worker is None or not worker.startswith("worker-"):
            return False
        return (self.settings.workers - int(worker.removeprefix("worker-"))) % 2 == 0

    def config(self, worker: str | None = None) -> ClientConfig:
        config = super().config(worker)
        if self.on_second_edge(worker):
            return dataclasses.replace(config, url=self.edge2["listening on"], ca_file=self.edge2["ca"])
        return config

    async def start(self) -> None:
        keys = self.gateway_dir / "keys.toml"  # `cluster up`'s gateway and every node read this one
        private_dir(self.gateway_dir)
        write_private(keys, (self.data_dir / "keys.toml").read_text())
        argv = [
            *(sys.executable, "-m", "strictq", "cluster", "up", "--nodes", "3", "--replicas", "3"),
            *("--data-dir", str(self.data_dir), "--port", "0"),
            *self.settings.serve_flags(),
        ]
        self.proc, self._log = await self._spawn(argv, self.data_dir / "cluster-up.log")
        lines = await self._read_lines(self.proc, "strictq: cluster ready", "strictq cluster up")
        self.lines.update(_values(lines, ("listening on", "ca", "proxy on", "proxy ca", "client env")))
        self._drain = asyncio.create_task(self._drain_stdout(), name="strictq-cluster-stdout")
        nats = [line.removeprefix("strictq: nats ") for line in lines if line.startswith("strictq: nats ")]
        argv = [
            *(sys.executable, "-m", "strictq", "serve", "--cluster", ",".join(nats)),
            *("--nats-credentials", str(self.data_dir / "nats" / "gateway.credentials")),
            *("--internal-secret", str(self.data_dir / "internal.secret")),
            *("--host", "127.0.0.1", "--port", "0", "--no-proxy", "--keys", str(keys)),
            *("--data-dir", str(self.data_dir / "edge2")),
            *self.settings.serve_flags(),
        ]
        self._edge2, self._edge2_log = await self._spawn(argv, self.data_dir / "edge2.log")
        lines = await self._read_lines(self._edge2, "strictq: client env ", "the second edge")
        self.edge2.update(_values(lines, ("listening on", "ca", "client env")))

    async def _spawn(self, argv: list[str], log: Path) -> tuple[asyncio.subprocess.Process, Any]:
        handle = await asyncio.to_thread(open, log, "ab")  # closed in stop()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=handle,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        return proc, handle

    async def _read_lines(self, proc: asyncio.subprocess.Process, last: str, what: str) -> list[str]:
        """Its start-up lines, up to the one starting with `last` (a ScenarioError if it exits first)."""
        assert proc.stdout is not None
        lines: list[str] = []
        try:
            async with asyncio.timeout(CLUSTER_START_TIMEOUT):
                while not (lines and lines[-1].startswith(last)):
                    raw = await proc.stdout.readline()
                    if not raw:
                        raise ScenarioError(f"{what} exited during start-up; see the logs in {self.data_dir}")
                    lines.append(raw.decode(errors="replace").strip())
        except TimeoutError:
            raise ScenarioError(f"{what} did not start within {CLUSTER_START_TIMEOUT:g} s") from None
        return lines

    async def stop(self) -> None:
        edge2 = self._edge2
        if edge2 is not None and edge2.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                edge2.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(edge2.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    edge2.kill()
                await edge2.wait()
        if self._edge2_log is not None:
            self._edge2_log.close()
            self._edge2_log = None
        await super().stop()


def _values(lines: list[str], keys: tuple[str, ...]) -> dict[str, str]:
    """`strictq: <key> <value>` start-up lines as {key: value} (the first of each key)."""
    found: dict[str, str] = {}
    for line in lines:
        for key in keys:
            if line.startswith(f"strictq: {key} "):
                found.setdefault(key, line[len(f"strictq: {key} ") :])
    return found


class Admin:
    """The admin API of the running system: events, status, per-group retry policies."""

    def __init__(self, system: System) -> None:
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
