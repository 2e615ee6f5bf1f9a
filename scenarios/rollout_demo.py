"""`strictq demo --rollout`: canary rollouts on one machine, narrated (docs/rollouts.md).

The failover scenario's system (`strictq serve` with the gateway over TLS, the queue core and the egress
proxy; the fake payments backend; a producer sending orders for many customers, one group each) with two
workers of version 1.0 charging orders through the proxy, recorded in the wire log. Then three rollouts,
each run as a user would, with `strictq rollout start`:

1. version 1.1, a bad deploy (it calls `/v0/charge`, which answers 404): its share of groups fails, the
   live gate sees its failure rate (or its fence) and reverts; its groups go back to 1.0, in order;
2. version 2.0, which charges in euros: before its first step, `strictq replay` runs it against the recorded
   orders of the groups the step would give it; the replay diverges, the rollout reverts before a single
   live order reaches it;
3. version 1.2, a good one: the replay matches, every live step passes its gate, and the rollout completes:
   every group goes to 1.2 and the 1.0 workers take nothing more.

It ends with the events (`strictq status`) and a summary, and exits 0 only if the first two reverted, the
third completed, nothing was lost and no group went out of order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from strictq.sdk import Entry, Message, Producer, Worker

from .backend import Backend
from .settings import BAD_BASE, GOOD_BASE, QUEUE, ScenarioError, Settings
from .system import Admin, System
from .tracking import Tracker
from .workers import charge

Say = Callable[[str], None]
Tool = Callable[..., Coroutine[Any, Any, "int | None"]]


class RolloutDemo:
    """The three rollouts; `tool` runs `strictq ARGV` as the demo's other steps do (scenarios.demo)."""

    def __init__(self, data_dir: Path, args: argparse.Namespace, say: Say, section: Say, tool: Tool) -> None:
        fast = args.fast
        self.settings = Settings(
            workers=5,
            groups=12 if fast else 16,
            round_interval=0.2 if fast else 0.3,
            fence_after=6,
            poll_wait=0.5,
        )
        self.step_seconds = 1.5 if fast else 4.0
        self.data_dir = data_dir
        self.say, self.section, self.tool = say, section, tool
        self.backend = Backend()
        self.system = System(data_dir / "system", self.settings)
        self.tracker = Tracker()
        self.workers: dict[str, tuple[Worker, asyncio.Task[None]]] = {}
        self.outcomes: list[tuple[str, int | None]] = []
        self._stop_producing = asyncio.Event()

    # -- the story -----------------------------------------------------------------------------------
    async def run(self) -> int:
        producer_task: asyncio.Task[None] | None = None
        try:
            self.section("the system: strictq serve, a backend, a producer and version 1.0")
            await self.backend.start()
            await self.system.start()
            self.say(
                f"strictq serve (pid {self.system.pid}) on {self.system.url}, "
                f"egress proxy {self.system.proxy_url}"
            )
            async with Producer(self.system.config()) as producer:
                await self._send_round(producer)
                await self._policies()
                for name in ("worker-1", "worker-2"):
                    self._start(name, "1.0", GOOD_BASE, 1)
                self.say(
                    "worker-1 and worker-2 run version 1.0 (Worker(version='1.0')), charging via the proxy"
                )
                producer_task = asyncio.create_task(self._produce(producer), name="rollout-demo-producer")
                await self._until(lambda: self.tracker.total_done >= 3 * self.settings.groups, "a warm-up")
                self.say(f"warm-up: {self.tracker.total_done} orders charged and recorded in the wire log")

                await self._rollout_bad_deploy()
                await self._rollout_diverging_version()
                await self._rollout_good_version()

                self._stop_producing.set()
                await producer_task
                producer_task = None
                self.section("draining")
                await self._until(lambda: self.tracker.lost == 0, "every order charged", within=60.0)
                self.say(f"all {self.tracker.total_sent} orders charged")
            self.section("the events (strictq status)")
            await self.tool(["status", "--events", "20"], env=self.env(), within=30)
        except ScenarioError as exc:
            print(f"\nstrictq demo: the rollout demo stopped: {exc}", flush=True)
            return 1
        finally:
            self._stop_producing.set()
            if producer_task is not None:
                with contextlib.suppress(Exception):
                    await producer_task
            await asyncio.gather(*(self._stop(name) for name in list(self.workers)))
            await self.system.stop()
            await self.backend.stop()
        return self.summary()

    async def _rollout_bad_deploy(self) -> None:
        self.section("rollout of 1.1: a bad deploy, reverted by the live gate")
        self.say(f"worker-3 will run version 1.1, which calls {BAD_BASE}/charge (404); it starts once the")
        self.say("  rollout has set 1.1's share (at 0 until its first step)")
        code = await self.rollout(
            "1.1", "25,50,100", then=lambda: self._start("worker-3", "1.1", BAD_BASE, 1)
        )
        self.outcomes.append(("1.1", code))
        await self._stop("worker-3")
        self.say("version 1.1 is stopped; its groups are back with 1.0, their failed orders charged there")

    async def _rollout_diverging_version(self) -> None:
        self.section("rollout of 2.0: a changed request, reverted by the replay gate")
        self.say("worker-4 runs version 2.0, which charges in euros; before each step, strictq replay runs")
        self.say(
            "  it against recorded orders of the groups the step would give it (nothing reaches a backend)"
        )
        code = await self.rollout(
            "2.0", "25,100", then=lambda: self._start("worker-4", "2.0", GOOD_BASE, 2), replay_version=2
        )
        self.outcomes.append(("2.0", code))
        await self._stop("worker-4")

    async def _rollout_good_version(self) -> None:
        self.section("rollout of 1.2: replay matches, every step passes, completed")
        self.say("worker-5 runs version 1.2 (same requests as 1.0)")
        code = await self.rollout(
            "1.2", "25,100", then=lambda: self._start("worker-5", "1.2", GOOD_BASE, 1), replay_version=1
        )
        self.outcomes.append(("1.2", code))
        if code == 0:
            mark = len(self.tracker.done_by)
            await self._until(lambda: self.tracker.total_done >= mark + self.settings.groups, "orders on 1.2")
            late = Counter(list(self.tracker.done_by.values())[mark:])
            self.say("since: " + ", ".join(f"{w} {n}" for w, n in sorted(late.items())) + " orders charged")

    async def rollout(
        self, version: str, steps: str, *, then: Callable[[], None], replay_version: int | None = None
    ) -> int | None:
        """`strictq rollout start`, with the version's worker started (`then`) once the rollout has given
        the version its share of nothing: started earlier, it would be one more worker of the fleet."""
        argv = [
            "rollout", "start", QUEUE, "--version", version, "--steps", steps,
            "--step-seconds", f"{self.step_seconds:g}", "--min-attempts", "3", "--poll", "0.2",
            "--step-timeout", "60", "--baseline", "1.0",
        ]  # fmt: skip
        if replay_version is not None:
            worker = shlex.join(
                [sys.executable, "-m", "scenarios.failover", "worker", "--backend", self.backend.url,
                 "--version", str(replay_version)]
            )  # fmt: skip
            argv += ["--replay-worker", worker, "--wirelog", str(self.system.wirelog)]
        run: asyncio.Task[int | None] = asyncio.create_task(
            self.tool(argv, env=self.env(), within=300, expect=(0, 1))
        )
        admin = Admin(self.system)
        try:
            deadline = time.monotonic() + 60
            while not run.done() and time.monotonic() < deadline:
                view = await admin.call("GET", f"/queues/{QUEUE}/routing")
                if ((view.get("routing") or {}).get("canary") or {}).get("version") == version:
                    break
                await asyncio.sleep(0.1)
        finally:
            await admin.close()
        then()
        return await run

    # -- parts ---------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        system = self.system
        return {
            **os.environ,
            "STRICTQ_URL": system.url,
            "STRICTQ_CA_FILE": system.ca,
            "STRICTQ_ADMIN_KEY": system.creds.admin,
        }

    def _start(self, name: str, version: str, base: str, charges_as: int) -> None:
        tracker, backend = self.tracker, self.backend

        async def handle(message: Message) -> None:
            group, n = message.payload["group"], int(message.payload["n"])
            started = tracker.start(group, n, name)
            ok = False
            try:
                await charge(message, backend.url, base, name, charges_as)
                ok = True
            finally:
                tracker.end(group, n, name, started, ok, message)

        worker = Worker(
            QUEUE,
            handle,
            config=self.system.config(name),
            version=version,
            ttl=self.settings.ttl,
            limit=4,
            concurrency=2,
            wait=self.settings.poll_wait,
            grace=2.0,
            retry_backoff=(0.1, 1.0),
        )
        self.workers[name] = (worker, asyncio.create_task(worker.run(), name=f"rollout-demo-{name}"))

    async def _stop(self, name: str) -> None:
        worker, task = self.workers.pop(name)
        worker.stop(2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)

    async def _policies(self) -> None:
        """Failed orders are retried by another worker at once (a bad version must not keep them)."""
        admin = Admin(self.system)
        try:
            policy = {"retry_same_worker": 0, "retry_backoff": 0.2, "retry_backoff_max": 1.0}
            for group in self._groups():
                await admin.set_policy(group, policy)
        finally:
            await admin.close()

    def _groups(self) -> list[str]:
        return [f"customer-{i:02d}" for i in range(1, self.settings.groups + 1)]

    async def _send_round(self, producer: Producer) -> None:
        entries = []
        for group in self._groups():
            n = self.tracker.sent[group]
            entries.append(Entry(QUEUE, {"group": group, "n": n, "amount": 10 + n % 7}, group))
        for result in await producer.send_batch(entries):
            if result.status in ("sent", "unknown"):
                self.tracker.sent[result.entry.group or ""] += 1

    async def _produce(self, producer: Producer) -> None:
        while not self._stop_producing.is_set():
            await self._send_round(producer)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_producing.wait(), self.settings.round_interval)

    async def _until(self, predicate: Callable[[], bool], what: str, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() > deadline:
                raise ScenarioError(
                    f"timed out after {within:g} s waiting for {what} "
                    f"(sent {self.tracker.total_sent}, done {self.tracker.total_done})"
                )
            self.tracker.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.tracker.changed.wait(), 0.25)

    def summary(self) -> int:
        tracker = self.tracker
        self.section("summary")
        expected = [("1.1", 1), ("2.0", 1), ("1.2", 0)]
        words = {0: "completed", 1: "reverted", None: "did not finish"}
        print(
            "rollouts: " + ", ".join(f"{v} {words.get(code, f'exit {code}')}" for v, code in self.outcomes),
            flush=True,
        )
        print(
            f"sent {tracker.total_sent} · charged {tracker.total_done} · lost {tracker.lost} · "
            f"order violations {tracker.order_violations} · charged twice {tracker.duplicates}",
            flush=True,
        )
        ok = self.outcomes == expected and tracker.lost == 0 and tracker.order_violations == 0
        return 0 if ok else 1
