"""Failure management split in two (docs/failure-management.md §3.2), sans-I/O: the gate and its messages.

The *gate* decides who may receive, per partition: the fenced, probing or blacklisted workers, the
suspended queues and the probes to hand out. The *decider* (`queue_core.machine.decider.Decider`, over the
`HealthMonitor`) accounts failures across queues and partitions and decides fences, probes, suspensions
and blacklists, once per deployment.

In one process both halves are the one `HealthMonitor` beside the core (its `poll` is the gate). In a
cluster each partition's `Supervisor` holds a `PartitionGate`: it answers polls from the state the
decider published (`GateChange` values, applied with `apply`) and reports what happened at it
(`GateReport` values: attempts, polls, probe hand-outs and probe results) for the decider, which runs on
whichever node holds its lease (cluster.decider). Both message families are typed values with a JSON
form (`to_json` / `report_from_json`, `change_from_json`): they travel on JetStream.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .effects import AttemptRecorded
from .health import ALLOWED, BLOCKED, PollVerdict, Probe, ProbePurpose

SEEN_EVERY = 1.0  # seconds: a worker's polls of a queue are reported to the decider at most this often


# ---------------------------------------------------------------------------- reports: gate -> decider
@dataclass(frozen=True, slots=True)
class AttemptReport:
    """A counted attempt of a participating worker (the core's `AttemptRecorded`), from `partition`."""

    partition: int
    queue: str
    group: str
    message_id: str
    worker: str
    attempt: int
    outcome: str
    reason: str
    signature: str
    at: float

    def record(self) -> AttemptRecorded:
        return AttemptRecorded(
            self.queue,
            self.group,
            self.message_id,
            self.worker,
            self.attempt,
            self.outcome,
            self.reason,
            self.signature,
            self.at,
        )


@dataclass(frozen=True, slots=True)
class PollReport:
    """`worker` polled `queue` at `partition` (throttled: SEEN_EVERY per worker and queue)."""

    partition: int
    queue: str
    worker: str
    at: float


@dataclass(frozen=True, slots=True)
class ProbeHandedOut:
    partition: int
    probe_id: str
    worker: str
    at: float


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """The result of a probe the gate handed out (`ok`: it passed)."""

    partition: int
    probe_id: str
    worker: str
    ok: bool
    reason: str
    at: float


GateReport = AttemptReport | PollReport | ProbeHandedOut | ProbeReport
_REPORTS: dict[str, type[GateReport]] = {
    "attempt": AttemptReport,
    "poll": PollReport,
    "probe_out": ProbeHandedOut,
    "probe_result": ProbeReport,
}
_REPORT_KINDS = {cls: kind for kind, cls in _REPORTS.items()}


# ---------------------------------------------------------------------------- changes: decider -> gate
@dataclass(frozen=True, slots=True)
class WorkerHeld:
    """`worker` gets no real message (fenced, probing or blacklisted); its claims are released."""

    worker: str


@dataclass(frozen=True, slots=True)
class WorkerFreed:
    worker: str


@dataclass(frozen=True, slots=True)
class QueueHeld:
    """`queue` is suspended: nobody receives from it (`manual`: an operator's)."""

    queue: str
    manual: bool


@dataclass(frozen=True, slots=True)
class QueueFreed:
    queue: str


@dataclass(frozen=True, slots=True)
class ProbeOffered:
    """Hand probe `probe_id` out at `partition` to `worker`'s next poll of `queue` (None: to any worker
    the gate lets through, for a suspended queue)."""

    probe_id: str
    queue: str
    purpose: str
    worker: str | None
    partition: int
    created: float


@dataclass(frozen=True, slots=True)
class ProbeWithdrawn:
    probe_id: str


GateChange = WorkerHeld | WorkerFreed | QueueHeld | QueueFreed | ProbeOffered | ProbeWithdrawn


def report_to_json(report: GateReport) -> dict[str, Any]:
    return {"kind": _REPORT_KINDS[type(report)], **asdict(report)}


def report_from_json(data: Any) -> GateReport | None:
    """The report a JSON object holds; None if it is not one (a newer writer's kind: ignored)."""
    if not isinstance(data, dict):
        return None
    cls = _REPORTS.get(str(data.get("kind")))
    if cls is None:
        return None
    fields = {k: v for k, v in data.items() if k != "kind"}
    try:
        report = cls(**fields)
    except TypeError:
        return None
    at = getattr(report, "at", None)
    if not isinstance(at, int | float) or not math.isfinite(at):
        return None
    return report


# --------------------------------------------------------------------------------------------- gate
@dataclass(slots=True)
class _QueueRow:
    manual: bool


@dataclass(slots=True)
class PartitionGate:
    """The gate of one partition in a cluster: the same answers as `HealthMonitor.poll` from the state
    the decider published, and the reports of what happened here."""

    partition: int
    held: set[str] = field(default_factory=set)
    suspended_queues: dict[str, _QueueRow] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)  # offered here, not yet answered
    _reports: list[GateReport] = field(default_factory=list)
    _seen: dict[tuple[str, str], float] = field(default_factory=dict)

    # The HealthMonitor's lookups the shell and figures use.
    def blocked(self, worker: str) -> bool:
        return worker in self.held

    def suspended(self, queue: str) -> bool:
        return queue in self.suspended_queues

    @property
    def workers(self) -> set[str]:
        return self.held

    def worker_state(self, worker: str) -> str:
        return "fenced" if worker in self.held else "healthy"

    # Inputs from the decider.
    def apply(self, change: GateChange) -> bool:
        """Apply one published change; True when a worker became held (the supervisor frees its claims)."""
        if isinstance(change, WorkerHeld):
            fresh = change.worker not in self.held
            self.held.add(change.worker)
            return fresh
        if isinstance(change, WorkerFreed):
            self.held.discard(change.worker)
        elif isinstance(change, QueueHeld):
            self.suspended_queues[change.queue] = _QueueRow(change.manual)
        elif isinstance(change, QueueFreed):
            self.suspended_queues.pop(change.queue, None)
        elif isinstance(change, ProbeOffered):
            if change.partition == self.partition and change.probe_id not in self.probes:
                purpose: ProbePurpose = (
                    "worker"
                    if change.purpose == "worker"
                    else "check"
                    if change.purpose == "check"
                    else "queue"
                )
                self.probes[change.probe_id] = Probe(
                    change.probe_id, change.queue, purpose, change.created, change.worker
                )
        elif isinstance(change, ProbeWithdrawn):
            self.probes.pop(change.probe_id, None)
        return False

    # Inputs from the supervisor.
    def poll(self, queue: str, worker: str, now: float, *, probes: bool = True) -> PollVerdict:
        suspended = queue in self.suspended_queues
        if not worker:
            return BLOCKED if suspended else ALLOWED
        last = self._seen.get((queue, worker))
        if last is None or now - last >= SEEN_EVERY:
            self._seen[queue, worker] = now
            self._reports.append(PollReport(self.partition, queue, worker, now))
            if len(self._seen) > 10_000:
                self._seen.clear()
        held = worker in self.held
        if probes:
            for probe in self.probes.values():
                if probe.delivered is not None or probe.queue != queue:
                    continue
                mine = probe.worker == worker
                anyone = probe.worker is None and suspended and not held
                if mine or anyone:
                    probe.worker = worker
                    probe.delivered = now
                    self._reports.append(ProbeHandedOut(self.partition, probe.id, worker, now))
                    return PollVerdict(False, probe)
        if suspended or held:
            return BLOCKED
        return ALLOWED

    def attempt(self, record: AttemptRecorded) -> None:
        self._reports.append(
            AttemptReport(
                self.partition,
                record.queue,
                record.group,
                record.message_id,
                record.worker,
                record.attempt,
                record.outcome,
                record.reason,
                record.signature,
                record.at,
            )
        )

    def probe_result(self, worker: str, probe_id: str, ok: bool, reason: str, now: float) -> bool:
        probe = self.probes.get(probe_id)
        if probe is None or probe.delivered is None or probe.worker != worker:
            return False
        del self.probes[probe_id]
        self._reports.append(ProbeReport(self.partition, probe_id, worker, ok, reason, now))
        return True

    def drain_reports(self) -> list[GateReport]:
        reports, self._reports = self._reports, []
        return reports
