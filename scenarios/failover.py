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

Its parts, one module each: `settings` (the shape, names, ScenarioError), `system` (`strictq serve` as a
child process, the admin API, the events), `backend` (the fake payments backend), `tracking` (what was
sent and processed), `workers` (the SDK workers and their handlers), `report` (what happened, timed from
the wire log). This module runs the story and re-exports what its users need.

Module entry point for replay: `python -m scenarios.failover worker --backend URL [--version 2]` runs the
scenario's worker alone against STRICTQ_* (the version 2 charges in another currency: a visible diff).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from strictq.sdk import Entry, Producer

from .backend import Backend
from .report import Outage, Report, read_timings
from .settings import BAD_BASE, GOOD_BASE, QUEUE, Say, ScenarioError, Settings
from .system import Admin, ClusterSystem, Credentials, Events, System, write_keys
from .tracking import Tracker
from .workers import WORKER_PROG, ScenarioWorker, charge, worker_main

__all__ = [
    "QUEUE",
    "Admin",
    "Backend",
    "Credentials",
    "Events",
    "Outage",
    "Report",
    "Scenario",
    "ScenarioError",
    "ScenarioWorker",
    "Settings",
    "System",
    "Tracker",
    "charge",
    "worker_main",
    "write_keys",
]


class Scenario:
    """Runs the story; `say` narrates (the demo prints it, the test keeps it for its failure message)."""

    def __init__(
        self,
        data_dir: Path,
        settings: Settings | None = None,
        say: Say | None = None,
        section: Say | None = None,
        *,
        cluster: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.settings = settings or Settings()
        self.say: Say = say or (lambda text: None)
        self.section: Say = section or (lambda title: self.say(f"-- {title}"))
        # Called at "fenced" and "suspended" while the system runs (the demo shows `strictq status` there).
        self.checkpoint: Callable[[str], Awaitable[None]] | None = None
        # `cluster`: the same story through a three-node cluster with two edges (scenarios.system).
        self.system = ClusterSystem(data_dir, self.settings) if cluster else System(data_dir, self.settings)
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
            self.say(system.what)
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
            # All at once: each stop waits for its worker's long poll in flight.
            await asyncio.gather(*(worker.stop() for worker in self.workers))
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
            await self._a_round_done("a round of normal traffic before the outage")
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
        await self._a_round_done("a round done after the recovery")
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

    async def _a_round_done(self, what: str) -> None:
        """Wait until one more order per group is done: traffic flows (rather than a fixed pause)."""
        want = self.tracker.total_done + self.settings.groups
        await self._until(lambda: self.tracker.total_done >= want, self.settings.phase_timeout, what)

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
        read_timings(report, [d for d in self.system.wirelogs if d.is_dir()])
        if report.fence_effective is not None and report.unfenced is not None:  # the backend's own count
            report.calls_while_fenced = self.backend.count(
                report.faulty_worker, since=report.fence_effective, until=report.unfenced
            )


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "worker":
        print(f"usage: {WORKER_PROG} --backend URL [--version 2]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(worker_main(sys.argv[2:]))
