"""One supervisor over the queue core and the health monitor (docs/failure-management.md §3), sans-I/O.

Polls, results, timers, alerts and operator commands go through `Supervisor`; each is decided in one
step, with the same explicit `now`:

- a poll records the worker's declaration (`Capabilities`: whether it takes part in failure
  management), asks the monitor whether it may receive (a health fence, a blacklist or a suspended queue
  hold it; a probe goes first) and only then claims from the core. A worker that did not declare
  `results` is never fenced, probed or held by a health fence (only a suspended queue holds it);
- a result for an outstanding probe (looked up in the monitor's probe table, never by the shape of its
  id) goes to the monitor; a garbled one fails the probe; everything else goes to the core;
- the core's counted attempts (`AttemptRecorded`) of participants feed the monitor; a fence it decides
  frees the worker's same-worker retries and releases its claims in the same step, so its groups go to
  other workers in order;
- the monitor's decisions come out as typed effects (below), after the core's effects of the same step;
  the shell (`queue_core.failures.FailureManager` with `queue_core.service.QueueService`) carries them
  out, publishes them as events and makes the durable ones durable through the store's group commit.

Without a monitor (failure management off) the supervisor only records declarations and forwards to the
core. In a cluster's partition it holds a `PartitionGate` (`gate`) instead of a monitor: the gate answers
polls from what the cluster's one decider published (`apply_gate`), and the attempts, polls and probe
results it saw come out as one `GateReported` effect per step, for the node to publish
(docs/failure-management.md §3.2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .capabilities import Capabilities
from .core import QueueCore
from .effects import AttemptRecorded, BlacklistSaved, Effect, SuspensionSaved
from .gate import GateChange, GateReport, PartitionGate
from .health import Decision, HealthMonitor, Probe
from .inputs import AttemptResult, ControlRows
from .records import AckOutcome, Delivery, ReportOutcome


# ------------------------------------------------------------------------------------------- effects
@dataclass(slots=True)
class HealthEffect:
    """A decision of failure management for the shell; `decision` is what it publishes as an event."""

    decision: Decision


@dataclass(slots=True)
class FenceRequested(HealthEffect):
    """Fence `worker` at the egress proxy (its claims and reservations were freed in the same step)."""

    worker: str
    mode: str


@dataclass(slots=True)
class UnfenceRequested(HealthEffect):
    worker: str


@dataclass(slots=True)
class WorkerBlacklisted(HealthEffect):
    worker: str
    until: float


@dataclass(slots=True)
class BlacklistLifted(HealthEffect):
    worker: str


@dataclass(slots=True)
class ProbeIssued(HealthEffect):
    """A probe exists; `probe.worker` is known for a worker's or a check probe (announce it now), None
    for a suspended queue's (announced when delivered: `ProbeDelivered`)."""

    probe: Probe


@dataclass(slots=True)
class ProbeEnded(HealthEffect):
    """A probe passed, failed or is no longer needed: its proxy exemption ends."""

    probe_id: str


@dataclass(slots=True)
class QueueSuspended(HealthEffect):
    queue: str
    manual: bool


@dataclass(slots=True)
class QueueResumed(HealthEffect):
    queue: str


@dataclass(slots=True)
class Noted(HealthEffect):
    """Informational: shared-failure, alert."""


@dataclass(slots=True)
class ProbeDelivered:
    """A poll handed out this probe (not an event): the proxies must know before the worker calls."""

    probe: Probe


@dataclass(slots=True)
class GateReported:
    """What a partition's gate saw in this step (not an event): the node publishes it for the decider."""

    reports: list[GateReport]


SupervisorEffect = HealthEffect | ProbeDelivered | GateReported
WORKER_EFFECTS: dict[str, type[HealthEffect]] = {
    "unfence": UnfenceRequested,
    "unblacklist": BlacklistLifted,
}


@dataclass(slots=True)
class PollResult:
    """What a poll gets: deliveries from the core, or one probe, or nothing (`held`: failure management
    holds this worker or queue, so nothing would come of waiting for messages either)."""

    deliveries: list[Delivery]
    probe: Probe | None = None
    held: bool = False


HELD = PollResult([], held=True)


def _probe_ok(result: AttemptResult) -> bool:
    return result.outcome == "succeeded" and result.error is None


class Supervisor:
    """Owns the core and (with failure management on) the health monitor."""

    def __init__(
        self, core: QueueCore, monitor: HealthMonitor | None = None, gate: PartitionGate | None = None
    ) -> None:
        self.core = core
        self.monitor = monitor
        self.gate = gate  # a cluster partition's gate (then `monitor` stays None: the decider is elsewhere)
        self._delivered: list[SupervisorEffect] = []  # probes handed out since the last drain

    # ---------------------------------------------------------------------------------------- polls
    def poll(
        self,
        queue: str,
        limit: int,
        ttl: float | None,
        worker: str,
        capabilities: Capabilities,
        now: float,
        *,
        probes: bool = True,
    ) -> PollResult:
        """One poll: the declaration, the gate, then the core's receive. `probes`: whether the face can
        hand out probe items at all (the SQS face cannot)."""
        core = self.core
        core.queue(queue)  # QueueNotFound before anything is recorded
        if worker:
            core.declare(worker, capabilities.participates, now)
            core.saw_version(queue, worker, capabilities.version, capabilities.state)  # fenced ones too
        monitor = self.monitor if self.monitor is not None else self.gate
        if monitor is not None:
            # A plain poller is nobody to failure management: only a suspended queue holds it.
            who = worker if capabilities.participates else ""
            verdict = monitor.poll(queue, who, now, probes=probes and capabilities.takes_probes)
            if verdict.probe is not None:
                self._delivered.append(ProbeDelivered(verdict.probe))
                return PollResult([], verdict.probe)
            if not verdict.allowed:
                return HELD
        return PollResult(
            core.receive(
                queue,
                limit,
                ttl,
                worker,
                now=now,
                version=capabilities.version,
                max_bytes=capabilities.max_bytes,
            )
        )

    # -------------------------------------------------------------------------------------- results
    def is_probe(self, message_id: str) -> bool:
        if self.gate is not None:
            return message_id in self.gate.probes
        return self.monitor is not None and message_id in self.monitor.probes

    def report(
        self,
        queue: str,
        worker: str,
        results: Sequence[AttemptResult],
        now: float,
        holder: str | None = None,
    ) -> list[AckOutcome]:
        """Results: those for outstanding probes go to the monitor (a garbled one fails the probe), the
        rest to the core. A garbled result for a real message refuses the request (its error), as
        before anything is applied."""
        probes: list[tuple[int, AttemptResult]] = []
        real: list[tuple[int, AttemptResult]] = []
        for index, result in enumerate(results):
            (probes if self.is_probe(result.message_id) else real).append((index, result))
        for _, result in real:
            if result.error is not None:
                raise result.error
        outcomes: list[AckOutcome | None] = [None] * len(results)
        monitor = self.monitor if self.monitor is not None else self.gate
        for index, result in probes:
            assert monitor is not None
            ok = _probe_ok(result)
            why = result.reason or ("ok" if ok else result.outcome)
            if result.error is not None:
                why = f"unreadable probe result: {result.error.message}"
            taken = monitor.probe_result(worker, result.message_id, ok, why, now)
            if taken:
                outcomes[index] = ReportOutcome(result.message_id, "ok")
            else:  # another worker's probe, or one no longer out: like a message that does not exist
                outcomes[index] = ReportOutcome(result.message_id, "gone", "no such message")
        if real or not results:
            applied = iter(self.core.report(queue, worker, [r for _, r in real], now, holder=holder))
            outcomes = [o if o is not None else next(applied) for o in outcomes]
        return [o for o in outcomes if o is not None]

    # -------------------------------------------------------------------------- operators and alerts
    def suspend(self, queue: str, reason: str, now: float, *, manual: bool = True) -> None:
        self.core.queue(queue)
        self._monitor().suspend(queue, reason, now, manual=manual)

    def resume(self, queue: str, reason: str, now: float) -> bool:
        return self._monitor().resume(queue, reason, now)

    def lift_blacklist(self, worker: str, reason: str, now: float) -> bool:
        return self._monitor().lift_blacklist(worker, reason, now)

    def unfence(self, worker: str, reason: str, now: float) -> bool:
        return self._monitor().unfence(worker, reason, now)

    def alert(
        self,
        reason: str,
        now: float,
        *,
        queue: str | None = None,
        signatures: Iterable[str] = (),
        within: Callable[[str], bool] | None = None,
    ) -> list[str]:
        return self._monitor().alert(reason, now, queue=queue, signatures=signatures, within=within)

    def _monitor(self) -> HealthMonitor:
        if self.monitor is None:
            raise RuntimeError("failure management is off")
        return self.monitor

    def apply_gate(self, change: GateChange, now: float) -> None:
        """A change the cluster's decider published: a worker it holds loses its claims and same-worker
        retries here, in this step (its groups go on with other workers, in order)."""
        if self.gate is not None and self.gate.apply(change):
            worker = getattr(change, "worker", "")
            if worker:
                self._free(worker, now)

    # ----------------------------------------------------------------------------------------- time
    def next_deadline(self) -> float | None:
        deadlines = [self.core.next_deadline()]
        if self.monitor is not None:
            deadlines.append(self.monitor.next_deadline())
        present = [d for d in deadlines if d is not None]
        return min(present) if present else None

    def handle_timer(self, now: float) -> None:
        self.core.handle_timer(now)
        if self.monitor is not None:
            self.monitor.handle_timer(now)

    # -------------------------------------------------------------------------------------- effects
    def drain_effects(self, now: float) -> list[Effect | SupervisorEffect]:
        """The core's effects of this step, then the decisions they led to, as typed effects (a fence's
        release of claims adds core effects, which are fed back until nothing more follows)."""
        out: list[Effect | SupervisorEffect] = []
        if self._delivered:
            out.extend(self._delivered)
            self._delivered = []
        monitor = self.monitor
        pending: list[Effect] = self.core.drain_effects()
        gate = self.gate
        if gate is not None:
            for effect in pending:
                out.append(effect)
                if isinstance(effect, AttemptRecorded) and self.core.participates(effect.worker):
                    gate.attempt(effect)
            reports = gate.drain_reports()
            if reports:
                out.append(GateReported(reports))
            return out
        while True:
            for effect in pending:
                out.append(effect)
                if (
                    monitor is not None
                    and isinstance(effect, AttemptRecorded)
                    and self.core.participates(effect.worker)
                ):
                    monitor.attempt(effect)
            if monitor is None:
                return out
            decisions = monitor.drain_decisions()
            if not decisions:
                return out
            for decision in decisions:
                out.extend(self._typed(decision, now))
            pending = self.core.drain_effects()

    def _typed(self, decision: Decision, now: float) -> list[Effect | SupervisorEffect]:
        event, worker, queue = decision.event, decision.worker, decision.queue
        if event == "fence" and worker is not None:
            self._free(worker, now)
            return [FenceRequested(decision, worker, decision.mode or "block")]
        if event == "unfence" and worker is not None:
            return [UnfenceRequested(decision, worker)]
        if event == "blacklist" and worker is not None:
            until = decision.expires if decision.expires is not None else now
            state = {"reason": decision.reason, "since": decision.at, "until": until, "queue": queue or ""}
            return [BlacklistSaved(worker, state), WorkerBlacklisted(decision, worker, until)]
        if event == "unblacklist" and worker is not None:
            return [BlacklistSaved(worker, None), BlacklistLifted(decision, worker)]
        if event == "probe" and decision.probe_id is not None:
            assert self.monitor is not None
            probe = self.monitor.probes.get(decision.probe_id)
            if probe is not None:
                return [ProbeIssued(decision, probe)]
            return [Noted(decision)]
        if event in ("probe-passed", "probe-failed", "probe-cancelled") and decision.probe_id:
            return [ProbeEnded(decision, decision.probe_id)]
        if event == "suspend" and queue is not None:
            assert self.monitor is not None
            manual = self.monitor.queues[queue].manual if queue in self.monitor.queues else True
            state = {"reason": decision.reason, "manual": manual, "since": decision.at}
            return [SuspensionSaved(queue, state), QueueSuspended(decision, queue, manual)]
        if event == "resume" and queue is not None:
            return [SuspensionSaved(queue, None), QueueResumed(decision, queue)]
        return [Noted(decision)]

    def _free(self, worker: str, now: float) -> None:
        """A fenced worker's same-worker retries go to everyone, and its claims are released (not
        counted), in every queue: its groups go on with other workers, in order."""
        core = self.core
        core.forget_reservations(worker, now)
        for state in list(core.queues.values()):
            items: list[tuple[str, int | None]] = [
                (message.id, group.floor)
                for group in state.groups.values()
                if group.claimed and group.claim_worker == worker
                for message in group.claimed
            ]
            if items:
                core.release(state.name, items, now=now)

    # --------------------------------------------------------------------------------------- restore
    def restore(self, saved: ControlRows, now: float) -> None:
        """After a restart: the suspensions and blacklists the store kept."""
        monitor = self.monitor
        if monitor is None:
            return
        for queue, state in saved.suspensions.items():
            if queue in self.core.queues:
                reason = str(state.get("reason") or "restored")
                monitor.suspend(queue, reason, now, manual=state.get("manual") is not False)
        for worker, state in saved.blacklists.items():
            until = state.get("until")
            monitor.adopt_blacklist(
                worker,
                str(state.get("reason") or "restored"),
                float(state.get("since") or now),
                float(until) if isinstance(until, int | float) else now,
                str(state.get("queue") or ""),
                now,
            )
