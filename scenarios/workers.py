"""The failover scenario's SDK workers: the handler that charges an order through the egress proxy, the
probe handler, the in-scenario worker (its `base` is what a bad deploy breaks; a canary shows whether its
calls reach the backend), and the worker alone for `strictq replay`
(`python -m scenarios.failover worker`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import aiohttp

from protocol.headers import PROXY_ACTION
from strictq.sdk import ClientConfig, Message, Worker
from strictq.sdk.outbound import proxy_authorization, tagged_session

from .backend import Backend
from .settings import GOOD_BASE, KIND_HEADER, QUEUE, WORKER_HEADER, ScenarioError, Settings
from .system import System
from .tracking import Tracker

WORKER_PROG = "python -m scenarios.failover worker"  # the replay worker's command line


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
            wait=settings.poll_wait,
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


def worker_main(argv: list[str] | None = None) -> int:
    """`python -m scenarios.failover worker`: the scenario's worker alone (STRICTQ_* configure it), for
    `strictq replay`; SIGTERM stops it."""
    parser = argparse.ArgumentParser(prog=WORKER_PROG, description=worker_main.__doc__)
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
