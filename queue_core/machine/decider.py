"""The decider of a cluster's failure management (docs/failure-management.md §3.2), sans-I/O.

One `HealthMonitor` for the whole deployment, fed by what every partition's gate reported
(`queue_core.machine.gate`: attempts, polls, probe hand-outs and results) instead of by one core; its
decisions come out as the supervisor's typed effects (`FenceRequested`, `ProbeIssued`, `QueueSuspended`,
...), which the cluster's shell (cluster.decider) writes to the control bucket for every gate and edge.

Taking over after another holder of the role: `adopt` the fences, suspensions and blacklists in force
and when each worker was last restored, then replay the reports of the last window; attempts a restored
worker made before its restore are not counted again, and a worker already fenced is not fenced again, so
nothing is decided twice.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from .gate import AttemptReport, GateReport, PollReport, ProbeHandedOut, ProbeReport
from .health import Decision, HealthMonitor, HealthSettings, Probe
from .supervisor import (
    BlacklistLifted,
    FenceRequested,
    HealthEffect,
    Noted,
    ProbeEnded,
    ProbeIssued,
    QueueResumed,
    QueueSuspended,
    UnfenceRequested,
    WorkerBlacklisted,
)

T = TypeVar("T")


@dataclass(slots=True)
class ProbeTaken(HealthEffect):
    """A gate handed a probe to `worker` (not an event): the proxies must learn whose calls it covers."""

    probe: Probe


class Decider:
    """Inputs: `feed` (gate reports), `handle_timer`, operator commands; outputs: typed effects."""

    def __init__(self, settings: HealthSettings, partitions: int, *, probe_prefix: str = "") -> None:
        self.monitor = HealthMonitor(settings, probe_prefix=probe_prefix)
        self.settings = self.monitor.settings
        self.partitions = max(1, partitions)
        self._where: dict[str, int] = {}  # worker -> the partition of its latest report
        self._restored: dict[str, float] = {}  # worker -> when it was last restored (adopted or decided)
        self._probe_at: dict[str, int] = {}  # outstanding probe -> the partition that hands it out

    # ------------------------------------------------------------------------------------- takeover
    def adopt(
        self,
        *,
        fences: Iterable[tuple[str, str, float]] = (),
        suspensions: Iterable[tuple[str, str, bool]] = (),
        blacklists: Iterable[tuple[str, str, float, float, str]] = (),
        restored: dict[str, float] | None = None,
        now: float,
    ) -> list[HealthEffect]:
        """The state an earlier holder left: (worker, reason, since) fences, (queue, reason, manual)
        suspensions, (worker, reason, since, until, queue) blacklists, restore times by worker."""
        monitor = self.monitor
        self._restored.update(restored or {})
        for worker, reason, since in fences:
            monitor.adopt_fence(worker, reason, since, now)
        for queue, reason, manual in suspensions:
            monitor.suspend(queue, reason, now, manual=manual)
        for worker, reason, since, until, queue in blacklists:
            monitor.adopt_blacklist(worker, reason, since, until, queue, now)
        monitor.drain_decisions()  # what was decided before: published already
        return []

    # --------------------------------------------------------------------------------------- inputs
    def feed(self, report: GateReport) -> list[HealthEffect]:
        monitor = self.monitor
        if isinstance(report, AttemptReport):
            if report.at <= self._restored.get(report.worker, float("-inf")):
                return []  # counted before its restore (a replay after a takeover)
            self._where[report.worker] = report.partition
            monitor.attempt(report.record())
        elif isinstance(report, PollReport):
            self._where.setdefault(report.worker, report.partition)
            monitor.seen(report.queue, report.worker, report.at)
        elif isinstance(report, ProbeHandedOut):
            if monitor.delivered(report.probe_id, report.worker, report.at):
                probe = monitor.probes[report.probe_id]
                note = Decision("probe-delivered", "handed out", report.at, worker=report.worker)
                return [ProbeTaken(note, probe), *self._drain(report.at)]
        elif isinstance(report, ProbeReport):
            monitor.probe_result(report.worker, report.probe_id, report.ok, report.reason, report.at)
        return self._drain(report.at)

    def handle_timer(self, now: float) -> list[HealthEffect]:
        self.monitor.handle_timer(now)
        return self._drain(now)

    def next_deadline(self) -> float | None:
        return self.monitor.next_deadline()

    def command(
        self, operation: Callable[..., T], *args: object, now: float, **kwargs: object
    ) -> tuple[T, list[HealthEffect]]:
        """An operator's command or an alert on the monitor (`suspend`, `resume`, `lift_blacklist`,
        `unfence`, `alert`), with its effects."""
        result = operation(*args, now, **kwargs)
        return result, self._drain(now)

    # -------------------------------------------------------------------------------------- outputs
    def probe_partition(self, probe: Probe) -> int:
        """Where a probe is handed out, fixed when it is issued: the partition its worker was last seen
        at, else one by its id."""
        where = self._probe_at.get(probe.id)
        if where is None:
            if probe.worker is not None and probe.worker in self._where:
                where = self._where[probe.worker] % self.partitions
            else:
                where = zlib.crc32(probe.id.encode()) % self.partitions
            if len(self._probe_at) > 10_000:  # ended probes are dropped with ProbeEnded; bounded anyway
                self._probe_at.clear()
            self._probe_at[probe.id] = where
        return where

    def _drain(self, now: float) -> list[HealthEffect]:
        out: list[HealthEffect] = []
        for decision in self.monitor.drain_decisions():
            out.append(self._typed(decision, now))
        return out

    def _typed(self, decision: Decision, now: float) -> HealthEffect:
        event, worker, queue = decision.event, decision.worker, decision.queue
        if event == "fence" and worker is not None:
            return FenceRequested(decision, worker, decision.mode or "block")
        if event == "unfence" and worker is not None:
            self._restored[worker] = decision.at
            return UnfenceRequested(decision, worker)
        if event == "blacklist" and worker is not None:
            return WorkerBlacklisted(
                decision, worker, decision.expires if decision.expires is not None else now
            )
        if event == "unblacklist" and worker is not None:
            return BlacklistLifted(decision, worker)
        if event == "probe" and decision.probe_id is not None:
            probe = self.monitor.probes.get(decision.probe_id)
            return ProbeIssued(decision, probe) if probe is not None else Noted(decision)
        if event in ("probe-passed", "probe-failed", "probe-cancelled") and decision.probe_id:
            self._probe_at.pop(decision.probe_id, None)
            return ProbeEnded(decision, decision.probe_id)
        if event == "suspend" and queue is not None:
            state = self.monitor.queues.get(queue)
            return QueueSuspended(decision, queue, state.manual if state is not None else True)
        if event == "resume" and queue is not None:
            return QueueResumed(decision, queue)
        return Noted(decision)
