"""The gate/decider split (queue_core.machine.gate, queue_core.machine.decider), sans-I/O on a fake clock:
two partitions' supervisors with gates, one decider fed by their reports (through their JSON form, as
JetStream carries them). A worker failing on both partitions is fenced once, held at both, probed at one
and restored; a takeover that replays the window decides nothing twice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from queue_core.machine import QueueCore, SendRequest
from queue_core.machine.capabilities import SDK
from queue_core.machine.decider import Decider, ProbeTaken
from queue_core.machine.effects import ClaimsChanged
from queue_core.machine.gate import (
    GateChange,
    GateReport,
    PartitionGate,
    ProbeOffered,
    ProbeWithdrawn,
    QueueFreed,
    QueueHeld,
    WorkerFreed,
    WorkerHeld,
    report_from_json,
    report_to_json,
)
from queue_core.machine.health import HealthSettings
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.supervisor import (
    FenceRequested,
    GateReported,
    HealthEffect,
    ProbeEnded,
    ProbeIssued,
    QueueResumed,
    QueueSuspended,
    Supervisor,
    UnfenceRequested,
)

Q = "t1.jobs"
T0 = 1_000_000.0
SETTINGS = HealthSettings(window=60, worker_failures=3, probe_interval=1, probe_backoff_max=2)


def partition(n: int) -> Supervisor:
    core = QueueCore(opt_in=True)
    core.create_queue(Q, T0, attributes={"retry_backoff": 0.0, "visibility_timeout": 5.0})
    core.drain_effects()
    return Supervisor(core, gate=PartitionGate(n))


def reports(s: Supervisor, now: float) -> list[GateReport]:
    """The step's reports, through JSON as the health stream carries them."""
    out: list[GateReport] = []
    for effect in s.drain_effects(now):
        if isinstance(effect, GateReported):
            for report in effect.reports:
                again = report_from_json(orjson.loads(orjson.dumps(report_to_json(report))))
                assert again == report
                out.append(again)
    return out


def changes(effects: list[HealthEffect], decider: Decider) -> list[GateChange]:
    """What the cluster shell publishes for each typed decision (cluster.decider does the same)."""
    out: list[GateChange] = []
    for e in effects:
        if isinstance(e, FenceRequested):
            out.append(WorkerHeld(e.worker))
        elif isinstance(e, UnfenceRequested):
            out.append(WorkerFreed(e.worker))
        elif isinstance(e, ProbeIssued):
            p = e.probe
            out.append(
                ProbeOffered(p.id, p.queue, p.purpose, p.worker, decider.probe_partition(p), p.created)
            )
        elif isinstance(e, ProbeEnded):
            out.append(ProbeWithdrawn(e.probe_id))
        elif isinstance(e, QueueSuspended):
            out.append(QueueHeld(e.queue, e.manual))
        elif isinstance(e, QueueResumed):
            out.append(QueueFreed(e.queue))
    return out


def apply_all(parts: list[Supervisor], found: Sequence[GateChange], now: float) -> list[Any]:
    effects: list[Any] = []
    for s in parts:
        for change in found:
            s.apply_gate(change, now)
        effects += s.drain_effects(now)
    return effects


def fail_once(s: Supervisor, worker: str, group: str, now: float) -> list[GateReport]:
    s.core.send(Q, [SendRequest(body=b"{}", group=group)], now=now)
    s.drain_effects(now)
    (d,) = s.poll(Q, 1, None, worker, SDK, now).deliveries
    s.report(Q, worker, [AttemptResult(d.message_id, d.token, "failed", "bug", "sig-" + worker)], now)
    return reports(s, now)


def test_failures_on_two_partitions_fence_once_hold_everywhere_and_a_probe_restores() -> None:
    parts = [partition(0), partition(1)]
    decider = Decider(SETTINGS, 2, probe_prefix="d1-")
    effects: list[HealthEffect] = []
    for i, now in enumerate((T0, T0 + 0.1, T0 + 0.2)):
        for report in fail_once(parts[i % 2], "w1", f"g{i}", now):
            effects += decider.feed(report)
    fences = [e for e in effects if isinstance(e, FenceRequested)]
    assert [f.worker for f in fences] == ["w1"]
    # A claim w1 still holds on partition 1 is released when the fence arrives there.
    parts[1].core.send(Q, [SendRequest(body=b"{}", group="held")], now=T0 + 0.3)
    assert parts[1].poll(Q, 1, None, "w1", SDK, T0 + 0.3).deliveries
    parts[1].drain_effects(T0 + 0.3)
    applied = apply_all(parts, changes(effects, decider), T0 + 0.3)
    assert any(isinstance(e, ClaimsChanged) for e in applied)
    assert parts[1].core.queue(Q).in_flight == 0
    for s in parts:  # held at both; a healthy worker gets the groups, in order
        assert not s.poll(Q, 10, None, "w1", SDK, T0 + 0.4).deliveries
        assert s.poll(Q, 10, None, "w2", SDK, T0 + 0.4).deliveries
        reports(s, T0 + 0.4)
    # The probe is offered at one partition only; w1's poll there gets it, the result restores it.
    probe_effects = decider.handle_timer(T0 + 1.3)
    offered = [c for c in changes(probe_effects, decider) if isinstance(c, ProbeOffered)]
    assert len(offered) == 1 and offered[0].worker == "w1"
    apply_all(parts, offered, T0 + 1.3)
    at = parts[offered[0].partition]
    elsewhere = parts[1 - offered[0].partition]
    assert elsewhere.poll(Q, 1, None, "w1", SDK, T0 + 1.4).probe is None
    polled = at.poll(Q, 1, None, "w1", SDK, T0 + 1.4)
    assert polled.probe is not None and polled.probe.id == offered[0].probe_id
    taken = [e for r in reports(at, T0 + 1.4) for e in decider.feed(r)]
    assert any(isinstance(e, ProbeTaken) for e in taken)
    at.report(Q, "w1", [AttemptResult(polled.probe.id, 1, "succeeded")], T0 + 1.5)
    restored = [e for r in reports(at, T0 + 1.5) for e in decider.feed(r)]
    assert [e.worker for e in restored if isinstance(e, UnfenceRequested)] == ["w1"]
    apply_all(parts, changes(restored, decider), T0 + 1.5)
    assert all(not s.gate.blocked("w1") for s in parts if s.gate is not None)


def test_a_takeover_replaying_the_window_decides_nothing_twice() -> None:
    part = partition(0)
    first = Decider(SETTINGS, 1, probe_prefix="d1-")
    seen: list[GateReport] = []
    effects: list[HealthEffect] = []
    for i in range(3):
        got = fail_once(part, "w1", f"g{i}", T0 + i * 0.1)
        seen += got
        effects += [e for r in got for e in first.feed(r)]
    fence = next(e for e in effects if isinstance(e, FenceRequested))
    # The next holder adopts the fence in force and replays the same window: no second fence.
    second = Decider(SETTINGS, 1, probe_prefix="d2-")
    second.adopt(fences=[("w1", fence.decision.reason, fence.decision.at)], now=T0 + 1)
    again = [e for r in seen for e in second.feed(r)]
    assert not [e for e in again if isinstance(e, FenceRequested)]
    # A restored worker's earlier failures are not counted again after a takeover.
    third = Decider(SETTINGS, 1, probe_prefix="d3-")
    third.adopt(restored={"w1": T0 + 0.5}, now=T0 + 1)
    assert not [e for r in seen for e in third.feed(r) if isinstance(e, FenceRequested)]
