"""HealthMonitor (queue_core.machine.health) with a fake clock: every policy of docs/failure-management.md §3.

Thresholds, sliding window, precedence (a shared signature fences nobody), probes with backoff,
blacklist and its expiry, the large-scale rule with many synthetic workers, suspension by alert and by
operators, bounded state; then a hypothesis state machine checks invariants over random sequences.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kit.clock import FakeClock as Clock

from access.tenancy import tenant_of as namespace_of
from queue_core.machine.effects import AttemptRecorded
from queue_core.machine.health import (
    Decision,
    HealthMonitor,
    HealthSettings,
    HealthSettingsError,
)

T0 = 1_000_000.0
Q = "t1.orders"
SETTINGS = HealthSettings(
    window=30.0,
    worker_failures=3,
    shared_failure_workers=2,
    probe_interval=1.0,
    probe_backoff_max=4.0,
    probe_failures_to_blacklist=3,
    blacklist_for=30.0,
    large_scale_fraction=0.5,
    probe_timeout=5.0,
)


def failed(
    worker: str, at: float, signature: str = "", queue: str = Q, outcome: str = "failed"
) -> AttemptRecorded:
    return AttemptRecorded(queue, "g", f"m-{at}", worker, 1, outcome, "boom", signature, at)


def events(decisions: list[Decision], *names: str) -> list[Decision]:
    return [d for d in decisions if not names or d.event in names]


def kinds(decisions: list[Decision]) -> list[str]:
    return [d.event for d in decisions if d.event != "probe-cancelled"]


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def monitor() -> HealthMonitor:
    return HealthMonitor(SETTINGS, probe_prefix="7-")


def fence(monitor: HealthMonitor, clock: Clock, worker: str = "w1") -> Decision:
    for _ in range(SETTINGS.worker_failures):
        monitor.attempt(failed(worker, clock.advance(0.1)))
    (decision,) = events(monitor.drain_decisions(), "fence")
    return decision


def run_timers(monitor: HealthMonitor, clock: Clock, until: float) -> list[Decision]:
    """Advance the clock deadline by deadline (never past `until`), firing each; the decisions made."""
    while (deadline := monitor.next_deadline()) is not None and deadline <= until:
        clock.now = max(clock.now, deadline)
        monitor.handle_timer(clock.now)
    clock.now = max(clock.now, until)
    monitor.handle_timer(clock.now)
    return monitor.drain_decisions()


def deliver(monitor: HealthMonitor, clock: Clock, worker: str, queue: str = Q) -> str:
    verdict = monitor.poll(queue, worker, clock.now)
    assert verdict.probe is not None, f"no probe for {worker}"
    assert not verdict.allowed
    return verdict.probe.id


# ------------------------------------------------------------------------------------------ fencing
def test_failures_past_the_threshold_fence_the_worker(monitor: HealthMonitor, clock: Clock) -> None:
    monitor.attempt(failed("w1", clock.advance(1)))
    monitor.attempt(failed("w1", clock.advance(1)))
    assert monitor.worker_state("w1") == "suspect" and not monitor.blocked("w1")
    assert monitor.poll(Q, "w1", clock.now).allowed
    assert monitor.drain_decisions() == []
    monitor.attempt(failed("w1", clock.advance(1)))
    (decision,) = monitor.drain_decisions()
    assert (decision.event, decision.worker, decision.queue, decision.mode) == ("fence", "w1", Q, "block")
    assert decision.reason.startswith("3 failed attempts in 30s")
    assert monitor.blocked("w1") and monitor.worker_state("w1") == "fenced"
    verdict = monitor.poll(Q, "w1", clock.now)
    assert not verdict.allowed and verdict.probe is None  # no probe before probe_interval
    assert monitor.poll(Q, "w2", clock.now).allowed  # the others carry on


def test_the_window_slides(monitor: HealthMonitor, clock: Clock) -> None:
    for _ in range(10):  # 3 failures, but never 3 within 30 s
        monitor.attempt(failed("w1", clock.advance(15.5)))
    assert kinds(monitor.drain_decisions()) == []
    assert monitor.worker_state("w1") == "suspect"


def test_successes_do_not_count_and_suspect_becomes_healthy(monitor: HealthMonitor, clock: Clock) -> None:
    monitor.attempt(failed("w1", clock.advance(1)))
    ok = AttemptRecorded(Q, "g", "m", "w1", 1, "succeeded", "", "", clock.advance(20))
    monitor.attempt(ok)
    assert monitor.worker_state("w1") == "suspect"  # its failure is still in the window
    monitor.attempt(AttemptRecorded(Q, "g", "m", "w1", 1, "succeeded", "", "", clock.advance(20)))
    assert monitor.worker_state("w1") == "healthy"
    assert monitor.drain_decisions() == []


def test_expired_claims_and_partials_count_as_failures(monitor: HealthMonitor, clock: Clock) -> None:
    monitor.attempt(failed("w1", clock.advance(1), outcome="expired"))
    monitor.attempt(failed("w1", clock.advance(1), outcome="partial"))
    monitor.attempt(failed("w1", clock.advance(1), outcome="not_attempted"))  # not a counted outcome
    assert not monitor.blocked("w1")
    monitor.attempt(failed("w1", clock.advance(1)))
    assert monitor.blocked("w1")


def test_fence_mode_comes_from_the_settings(clock: Clock) -> None:
    monitor = HealthMonitor(HealthSettings(window=10, worker_failures=1, fence_mode="mimic"))
    monitor.attempt(failed("w1", clock.now))
    (decision,) = monitor.drain_decisions()
    assert decision.mode == "mimic"


# ------------------------------------------------------------------------------------------- probes
def test_a_passing_probe_restores_the_worker(monitor: HealthMonitor, clock: Clock) -> None:
    fenced_at = fence(monitor, clock).at
    assert monitor.next_deadline() == fenced_at + SETTINGS.probe_interval
    (probe,) = run_timers(monitor, clock, fenced_at + 1)
    assert (probe.event, probe.worker, probe.queue) == ("probe", "w1", Q)
    assert probe.probe_id == "probe-7-1"
    assert monitor.worker_state("w1") == "probing"
    assert monitor.poll("t1.other", "w1", clock.now).probe is None  # probes go to the failing queue
    assert deliver(monitor, clock, "w1") == "probe-7-1"
    assert monitor.poll(Q, "w1", clock.now).probe is None  # delivered once
    assert monitor.probe_result("w1", "probe-7-1", True, "ok", clock.advance(0.5))
    assert kinds(monitor.drain_decisions()) == ["probe-passed", "unfence"]
    assert monitor.worker_state("w1") == "healthy" and monitor.poll(Q, "w1", clock.now).allowed
    # A clean slate: it takes the full threshold again.
    monitor.attempt(failed("w1", clock.advance(0.1)))
    assert not monitor.blocked("w1")


def test_probe_failures_back_off_then_blacklist_until_expiry(monitor: HealthMonitor, clock: Clock) -> None:
    last = fence(monitor, clock).at
    gaps = []
    decisions: list[Decision] = []
    for _ in range(SETTINGS.probe_failures_to_blacklist):
        deadline = monitor.next_deadline()
        assert deadline is not None
        gaps.append(round(deadline - last, 6))
        (probe,) = run_timers(monitor, clock, deadline)
        assert probe.event == "probe"
        probe_id = deliver(monitor, clock, "w1")
        assert monitor.probe_result("w1", probe_id, False, "card declined", clock.now)
        last = clock.now
        decisions = monitor.drain_decisions()
    assert gaps == [1.0, 2.0, 4.0]  # probe_interval, doubling (capped at probe_backoff_max)
    (blacklist,) = events(decisions, "blacklist")
    assert blacklist.expires == clock.now + SETTINGS.blacklist_for
    assert "3 probes failed in a row (last: card declined)" in blacklist.reason
    assert monitor.worker_state("w1") == "blacklisted" and monitor.blocked("w1")
    # Blacklisted: no probes, no messages, until the expiry.
    assert run_timers(monitor, clock, blacklist.expires - 0.01) == []
    assert monitor.poll(Q, "w1", clock.now) == monitor.poll(Q, "w1", clock.now)
    assert not monitor.poll(Q, "w1", clock.now).allowed
    decisions = run_timers(monitor, clock, blacklist.expires)
    assert kinds(decisions) == ["unblacklist", "probe"]
    assert decisions[0].reason == "expired"
    assert monitor.worker_state("w1") == "probing"  # fenced again, probed from scratch
    probe_id = deliver(monitor, clock, "w1")
    monitor.probe_result("w1", probe_id, True, "", clock.now)
    assert kinds(monitor.drain_decisions()) == ["probe-passed", "unfence"]


def test_backoff_is_capped(clock: Clock) -> None:
    monitor = HealthMonitor(
        HealthSettings(
            window=100,
            worker_failures=1,
            probe_interval=1,
            probe_backoff_max=3,
            probe_failures_to_blacklist=10,
        )
    )
    monitor.attempt(failed("w1", clock.now))
    gaps = []
    last = clock.now
    for _ in range(5):
        deadline = monitor.next_deadline()
        assert deadline is not None
        gaps.append(deadline - last)
        run_timers(monitor, clock, deadline)
        monitor.probe_result("w1", deliver(monitor, clock, "w1"), False, "x", clock.now)
        last = clock.now
    assert gaps == [1, 2, 3, 3, 3]


def test_a_probe_without_a_result_times_out_as_a_failure(monitor: HealthMonitor, clock: Clock) -> None:
    fence(monitor, clock)
    run_timers(monitor, clock, clock.now + 1)
    probe_id = deliver(monitor, clock, "w1")
    delivered = clock.now
    decisions = run_timers(monitor, clock, delivered + SETTINGS.probe_timeout)
    (failure,) = events(decisions, "probe-failed")
    assert failure.probe_id == probe_id and "no result within 5s" in failure.reason
    assert not monitor.probe_result("w1", probe_id, True, "late", clock.now)  # too late: ignored
    assert monitor.worker_state("w1") == "fenced"


def test_an_undelivered_probe_waits_for_the_worker(monitor: HealthMonitor, clock: Clock) -> None:
    fence(monitor, clock)
    run_timers(monitor, clock, clock.now + 1)
    assert run_timers(monitor, clock, clock.now + 1000) == []  # nobody polled: nothing times out
    assert deliver(monitor, clock, "w1") == "probe-7-1"


def test_results_of_unknown_or_foreign_probes_are_refused(monitor: HealthMonitor, clock: Clock) -> None:
    fence(monitor, clock)
    run_timers(monitor, clock, clock.now + 1)
    assert not monitor.probe_result("w1", "probe-7-1", True, "", clock.now)  # not delivered yet
    probe_id = deliver(monitor, clock, "w1")
    assert not monitor.probe_result("w2", probe_id, True, "", clock.now)
    assert not monitor.probe_result("w1", "probe-7-99", True, "", clock.now)
    assert monitor.probe_result("w1", probe_id, True, "", clock.now)


# ------------------------------------------------------------------------------------ operators
def test_operator_unfence_and_lift_blacklist(monitor: HealthMonitor, clock: Clock) -> None:
    fence(monitor, clock)
    assert monitor.unfence("w1", "operator", clock.now)
    assert kinds(monitor.drain_decisions()) == ["unfence"]
    assert not monitor.unfence("w1", "operator", clock.now)  # not fenced any more
    assert monitor.next_deadline() is None or monitor.next_deadline() != clock.now + 1  # no probe planned
    fence(monitor, clock)
    for _ in range(SETTINGS.probe_failures_to_blacklist):
        run_timers(monitor, clock, monitor.next_deadline() or clock.now)
        monitor.probe_result("w1", deliver(monitor, clock, "w1"), False, "x", clock.now)
    assert monitor.worker_state("w1") == "blacklisted"
    monitor.drain_decisions()
    assert not monitor.lift_blacklist("w2", "operator", clock.now)
    assert monitor.lift_blacklist("w1", "operator", clock.now)
    assert kinds(run_timers(monitor, clock, clock.now)) == ["unblacklist", "probe"]
    assert monitor.worker_state("w1") == "probing"


def test_adopted_fence_learns_its_queue_from_the_first_poll(monitor: HealthMonitor, clock: Clock) -> None:
    monitor.adopt_fence("w9", "health: 5 failed attempts", T0 - 100, clock.now)
    assert monitor.blocked("w9")
    (probe,) = run_timers(monitor, clock, clock.now + SETTINGS.probe_interval)
    assert probe.queue is None or probe.queue == ""
    verdict = monitor.poll(Q, "w9", clock.now)
    assert verdict.probe is not None and verdict.probe.queue == Q


# ------------------------------------------------------------------------------------ precedence
def test_a_signature_on_several_workers_fences_nobody(monitor: HealthMonitor, clock: Clock) -> None:
    sig = "POST billing/charge 5xx"
    for worker in ("w1", "w2", "w3"):
        monitor.poll(Q, worker, clock.now)
    monitor.attempt(failed("w1", clock.advance(0.1), sig))
    monitor.attempt(failed("w2", clock.advance(0.1), sig))
    decisions = monitor.drain_decisions()
    (shared,) = events(decisions, "shared-failure")
    assert shared.signature == sig and shared.queue == Q and "nobody is fenced" in shared.reason
    # The queue is checked: every recent worker that can take a probe gets one.
    assert sorted(d.worker or "" for d in events(decisions, "probe")) == ["w1", "w2", "w3"]
    for _ in range(20):
        monitor.attempt(failed("w1", clock.advance(0.1), sig))
        monitor.attempt(failed("w2", clock.advance(0.1), sig))
    assert events(monitor.drain_decisions(), "fence") == []
    assert not monitor.blocked("w1") and not monitor.blocked("w2")
    status = monitor.status(clock.now)
    (w1,) = [w for w in status["workers"] if w["worker"] == "w1"]
    assert w1["failures"] == 0 and w1["failures_shared"] > 0
    assert status["queues"][0]["shared_signatures"] == [sig]


def test_own_failures_still_fence_beside_shared_ones(monitor: HealthMonitor, clock: Clock) -> None:
    sig = "POST billing/charge 5xx"
    monitor.attempt(failed("w1", clock.advance(0.1), sig))
    monitor.attempt(failed("w2", clock.advance(0.1), sig))
    monitor.attempt(failed("w1", clock.advance(0.1), sig))
    monitor.attempt(failed("w1", clock.advance(0.1), "NullPointerException"))
    monitor.attempt(failed("w1", clock.advance(0.1), "NullPointerException"))
    assert not monitor.blocked("w1")
    monitor.attempt(failed("w1", clock.advance(0.1), ""))
    assert monitor.blocked("w1")


def test_a_worker_fenced_before_the_signature_was_shared_is_forgiven(
    monitor: HealthMonitor, clock: Clock
) -> None:
    sig = "GET inventory 5xx"
    fenced = [failed("w1", clock.advance(0.1), sig) for _ in range(3)]
    for record in fenced:
        monitor.attempt(record)
    assert monitor.blocked("w1")
    monitor.drain_decisions()
    monitor.attempt(failed("w2", clock.advance(0.1), sig))
    decisions = monitor.drain_decisions()
    assert "unfence" in kinds(decisions)
    (unfence,) = events(decisions, "unfence")
    assert unfence.worker == "w1" and "shared backend problem" in unfence.reason
    assert not monitor.blocked("w1") and not monitor.blocked("w2")


def test_the_shared_judgement_ends_with_the_window(monitor: HealthMonitor, clock: Clock) -> None:
    sig = "timeout db"
    monitor.attempt(failed("w1", clock.advance(0.1), sig))
    monitor.attempt(failed("w2", clock.advance(0.1), sig))
    clock.advance(SETTINGS.window + 1)
    for _ in range(3):  # only w1 now: its own problem
        monitor.attempt(failed("w1", clock.advance(0.1), sig))
    assert monitor.blocked("w1")


# ------------------------------------------------------------------- precedence within one tenant
# Issue 11, item 2: a signature is shared when enough workers *of one tenant* fail with it. Another
# tenant's failures must neither keep a faulty worker from being fenced nor show on this tenant's queue.
A, B = "ta.jobs", "tb.jobs"


def test_another_tenants_failures_do_not_excuse_a_faulty_worker(monitor: HealthMonitor, clock: Clock) -> None:
    sig = "POST billing/charge 5xx"
    monitor.attempt(failed("b1", clock.advance(0.1), sig, queue=B))
    monitor.attempt(failed("b2", clock.advance(0.1), sig, queue=B))
    (shared,) = events(monitor.drain_decisions(), "shared-failure")
    assert shared.queue == B  # tenant B's backend problem, judged within tenant B
    for _ in range(SETTINGS.worker_failures):
        monitor.attempt(failed("a1", clock.advance(0.1), sig, queue=A))
    decisions = monitor.drain_decisions()
    assert [d.worker for d in events(decisions, "fence")] == ["a1"]  # its own failures: fenced
    assert events(decisions, "shared-failure") == []
    assert not monitor.blocked("b1") and not monitor.blocked("b2")
    by_queue = {q["queue"]: q for q in monitor.status(clock.now)["queues"]}
    assert by_queue[A]["shared_signatures"] == []  # B's signature does not show on A's queue
    assert by_queue[B]["shared_signatures"] == [sig]
    (a1,) = [w for w in monitor.status(clock.now)["workers"] if w["worker"] == "a1"]
    assert (a1["failures"], a1["failures_shared"]) == (SETTINGS.worker_failures, 0)


def test_a_fenced_worker_is_not_forgiven_for_another_tenants_failures(
    monitor: HealthMonitor, clock: Clock
) -> None:
    sig = "GET inventory 5xx"
    for _ in range(SETTINGS.worker_failures):
        monitor.attempt(failed("a1", clock.advance(0.1), sig, queue=A))
    assert monitor.blocked("a1")
    monitor.drain_decisions()
    monitor.attempt(failed("b1", clock.advance(0.1), sig, queue=B))  # with a1, two workers: not shared
    monitor.attempt(failed("b2", clock.advance(0.1), sig, queue=B))  # shared in B only
    decisions = monitor.drain_decisions()
    assert [d.queue for d in events(decisions, "shared-failure")] == [B]
    assert events(decisions, "unfence") == [] and monitor.blocked("a1")
    # A second worker of tenant A failing the same way makes it A's shared problem: a1 is forgiven.
    monitor.attempt(failed("a2", clock.advance(0.1), sig, queue=A))
    decisions = monitor.drain_decisions()
    assert [d.queue for d in events(decisions, "shared-failure")] == [A]
    assert [d.worker for d in events(decisions, "unfence")] == ["a1"]


def test_a_tenants_queues_and_dedup_queues_share_its_signatures(monitor: HealthMonitor, clock: Clock) -> None:
    sig = "timeout db"
    monitor.attempt(failed("w1", clock.advance(0.1), sig, queue="t1.orders"))
    monitor.attempt(failed("w2", clock.advance(0.1), sig, queue="t1_dedupq.orders"))
    (shared,) = events(monitor.drain_decisions(), "shared-failure")
    assert shared.queue == "t1_dedupq.orders"
    for _ in range(5):
        monitor.attempt(failed("w1", clock.advance(0.1), sig, queue="t1.orders"))
    assert not monitor.blocked("w1")


def test_untenanted_queues_are_a_namespace_of_their_own(monitor: HealthMonitor, clock: Clock) -> None:
    """Queues of the queue server's internal API (no '.') share signatures among themselves, never with a
    tenant's."""
    sig = "timeout db"
    monitor.attempt(failed("w1", clock.advance(0.1), sig, queue="orders"))
    monitor.attempt(failed("w2", clock.advance(0.1), sig, queue="t1.orders"))
    assert events(monitor.drain_decisions(), "shared-failure") == []
    monitor.attempt(failed("w3", clock.advance(0.1), sig, queue="reports"))
    (shared,) = events(monitor.drain_decisions(), "shared-failure")
    assert shared.queue == "reports"


@pytest.mark.parametrize(
    ("queue", "tenant"),
    [("t1.orders", "t1"), ("t1_dedupq.orders", "t1"), ("orders", None), ("a-b.c.d", "a-b"), ("x_y", None)],
)
def test_namespace_of_a_queue_is_its_tenant(queue: str, tenant: str | None) -> None:
    assert namespace_of(queue) == tenant


# ---------------------------------------------------------------------------------- large-scale
def shared_round(monitor: HealthMonitor, clock: Clock, workers: list[str], sig: str = "POST pay 5xx") -> None:
    for worker in workers:
        monitor.poll(Q, worker, clock.now)
    monitor.attempt(failed(workers[0], clock.advance(0.01), sig))
    monitor.attempt(failed(workers[1], clock.advance(0.01), sig))


@pytest.mark.parametrize(("n", "fraction"), [(100, 0.5), (40, 0.25), (7, 1.0)])
def test_probes_failing_on_a_fraction_of_workers_suspend_the_queue(
    clock: Clock, n: int, fraction: float
) -> None:
    monitor = HealthMonitor(
        HealthSettings(
            window=60, worker_failures=3, probe_interval=1, probe_backoff_max=8, large_scale_fraction=fraction
        )
    )
    workers = [f"w{i:03d}" for i in range(n)]
    shared_round(monitor, clock, workers)
    decisions = monitor.drain_decisions()
    assert len(events(decisions, "probe")) == n
    needed = max(2, -(-int(fraction * n * 1000) // 1000))  # ceil without float noise
    probe_of = {w: deliver(monitor, clock, w) for w in workers}
    for i, worker in enumerate(workers[:needed]):
        monitor.probe_result(worker, probe_of[worker], False, "502 from billing", clock.advance(0.01))
        suspended = monitor.suspended(Q)
        assert suspended == (i + 1 >= needed), (i, needed)
    (suspend,) = events(monitor.drain_decisions(), "suspend")
    assert suspend.queue == Q and f"probes failed on {needed} of {n} recent workers" in suspend.reason
    # Nobody receives from a suspended queue; nobody was fenced for it.
    assert not any(monitor.poll(Q, w, clock.now).allowed for w in workers)
    assert not any(monitor.blocked(w) for w in workers)
    assert monitor.poll("t1.elsewhere", workers[0], clock.now).allowed


def test_passing_check_probes_do_not_suspend(monitor: HealthMonitor, clock: Clock) -> None:
    workers = ["a", "b", "c", "d"]
    shared_round(monitor, clock, workers)
    monitor.drain_decisions()
    probe_of = {w: deliver(monitor, clock, w) for w in workers}
    monitor.probe_result("a", probe_of["a"], False, "x", clock.now)
    for worker in workers[1:]:
        monitor.probe_result(worker, probe_of[worker], True, "", clock.now)
    assert not monitor.suspended(Q)
    assert events(monitor.drain_decisions(), "suspend") == []


def suspend_by_probes(monitor: HealthMonitor, clock: Clock) -> float:
    workers = ["a", "b", "c"]
    shared_round(monitor, clock, workers)
    for worker in workers:
        monitor.probe_result(worker, deliver(monitor, clock, worker), False, "down", clock.now)
    (suspend,) = events(monitor.drain_decisions(), "suspend")
    return suspend.at


def test_a_suspended_queue_is_probed_with_backoff_and_resumes_when_a_probe_passes(
    monitor: HealthMonitor, clock: Clock
) -> None:
    suspended_at = suspend_by_probes(monitor, clock)
    last = suspended_at
    for gap in (1.0, 2.0, 4.0, 4.0):
        deadline = monitor.next_deadline()
        assert deadline is not None and round(deadline - last, 6) == gap
        (probe,) = run_timers(monitor, clock, deadline)
        assert (probe.event, probe.queue, probe.worker) == ("probe", Q, None)
        verdict = monitor.poll(Q, "b", clock.now)  # any worker of the queue takes it
        assert verdict.probe is not None and not verdict.allowed
        assert monitor.poll(Q, "c", clock.now) == monitor.poll(Q, "c", clock.now)  # delivered once
        assert monitor.probe_result("b", verdict.probe.id, False, "still down", clock.now)
        monitor.drain_decisions()
        last = clock.now
    assert monitor.suspended(Q)
    run_timers(monitor, clock, monitor.next_deadline() or clock.now)
    verdict = monitor.poll(Q, "c", clock.now)
    assert verdict.probe is not None
    monitor.probe_result("c", verdict.probe.id, True, "", clock.now)
    (resume,) = events(monitor.drain_decisions(), "resume")
    assert resume.queue == Q and "passed on c" in resume.reason
    assert not monitor.suspended(Q) and monitor.poll(Q, "a", clock.now).allowed


def test_a_fenced_workers_passing_probe_does_not_resume_a_queue(monitor: HealthMonitor, clock: Clock) -> None:
    fence(monitor, clock, "w1")
    monitor.suspend(Q, "maintenance", clock.now)
    monitor.resume(Q, "done", clock.advance(0.1))
    clock.advance(SETTINGS.probe_interval)  # a resumed queue is not re-checked at once
    monitor.drain_decisions()
    suspend_by_probes(monitor, clock)
    run_timers(monitor, clock, clock.now + 1)
    probe_id = deliver(monitor, clock, "w1")  # its own (worker) probe, mimicked by the proxy
    monitor.probe_result("w1", probe_id, True, "", clock.now)
    assert monitor.worker_state("w1") == "healthy" and monitor.suspended(Q)


def test_a_blocked_worker_never_gets_a_queue_probe(monitor: HealthMonitor, clock: Clock) -> None:
    suspend_by_probes(monitor, clock)
    fence(monitor, clock, "w9")
    run_timers(monitor, clock, clock.now + 0.5)
    monitor.drain_decisions()
    verdict = monitor.poll(Q, "w9", clock.now)
    assert verdict.probe is None or verdict.probe.purpose == "worker"


def test_an_alert_for_a_signature_suspends_the_queues_where_it_fails(
    monitor: HealthMonitor, clock: Clock
) -> None:
    monitor.attempt(failed("w1", clock.advance(0.1), "http POST api.payments.example/charge 503"))
    monitor.attempt(failed("w2", clock.advance(0.1), "SELECT timeout", queue="t1.reports"))
    monitor.drain_decisions()
    suspended = monitor.alert(
        "payments-5xx: 12 failures", clock.now, signatures=["http POST api.payments.example/* 5*"]
    )
    assert suspended == [Q]
    decisions = monitor.drain_decisions()
    assert kinds(decisions) == ["alert", "suspend"]
    assert decisions[1].reason == "alert: payments-5xx: 12 failures"
    assert monitor.suspended(Q) and not monitor.suspended("t1.reports")
    # An automatic suspension: probed, and it resumes by itself.
    run_timers(monitor, clock, clock.now + 1)
    verdict = monitor.poll(Q, "w2", clock.now)
    assert verdict.probe is not None
    monitor.probe_result("w2", verdict.probe.id, True, "", clock.now)
    assert not monitor.suspended(Q)


def test_an_alert_naming_a_queue_or_nothing(monitor: HealthMonitor, clock: Clock) -> None:
    assert monitor.alert("db down", clock.now, queue="t1.reports") == ["t1.reports"]
    assert monitor.suspended("t1.reports")
    assert monitor.alert("something else", clock.now, signatures=["nothing matches *"]) == []
    assert kinds(monitor.drain_decisions()) == ["alert", "suspend", "alert"]
    assert monitor.alert("db down again", clock.now, queue="t1.reports") == []  # already suspended


def test_operator_suspension_is_only_lifted_by_an_operator(monitor: HealthMonitor, clock: Clock) -> None:
    monitor.suspend(Q, "backend maintenance", clock.now)
    (suspend,) = monitor.drain_decisions()
    assert (suspend.event, suspend.reason) == ("suspend", "backend maintenance")
    assert monitor.next_deadline() is None  # no probes for a manual suspension
    assert not monitor.poll(Q, "w1", clock.now).allowed
    assert monitor.alert("x", clock.now, queue=Q) == []
    monitor.drain_decisions()
    assert monitor.resume(Q, "operator", clock.now)
    assert kinds(monitor.drain_decisions()) == ["resume"]
    assert not monitor.resume(Q, "operator", clock.now)
    assert monitor.poll(Q, "w1", clock.now).allowed


def test_an_operator_takes_over_an_automatic_suspension(monitor: HealthMonitor, clock: Clock) -> None:
    suspend_by_probes(monitor, clock)
    monitor.suspend(Q, "keep it off", clock.now)
    assert run_timers(monitor, clock, clock.now + 100) == []  # no more probes
    assert monitor.suspended(Q)


# -------------------------------------------------------------------------------------- bounded
def test_state_of_idle_workers_and_queues_is_forgotten(monitor: HealthMonitor, clock: Clock) -> None:
    for i in range(500):
        monitor.attempt(failed(f"w{i}", clock.advance(0.001), queue=f"t1.q{i % 7}"))
    fence(monitor, clock, "stuck")
    monitor.unfence("stuck", "operator", clock.now)
    monitor.drain_decisions()
    run_timers(monitor, clock, clock.now + 3 * SETTINGS.window)
    assert monitor.workers == {} and monitor.queues == {}
    assert monitor.next_deadline() is None


def test_status_reports_workers_and_queues(monitor: HealthMonitor, clock: Clock) -> None:
    fence(monitor, clock, "w1")
    monitor.attempt(failed("w2", clock.advance(0.1)))
    monitor.suspend("t1.other", "maintenance", clock.now)
    status: dict[str, Any] = monitor.status(clock.now)
    by_worker = {w["worker"]: w for w in status["workers"]}
    assert by_worker["w1"]["state"] == "fenced" and by_worker["w1"]["failures"] == 3
    assert by_worker["w1"]["next_probe"] is not None and by_worker["w1"]["reason"].startswith("3 failed")
    assert by_worker["w2"]["state"] == "suspect" and by_worker["w2"]["failures"] == 1
    by_queue = {q["queue"]: q for q in status["queues"]}
    assert by_queue["t1.other"]["suspended"] and by_queue["t1.other"]["manual"]
    assert not by_queue[Q]["suspended"] and by_queue[Q]["recent_workers"] == 2


@pytest.mark.parametrize(
    "changes",
    [
        {"window": 0},
        {"worker_failures": 0},
        {"fence_mode": "drop"},
        {"large_scale_fraction": 1.5},
        {"probe_backoff_max": 0.5, "probe_interval": 1.0},
        {"probe_timeout": float("nan")},
        {"shared_failure_workers": True},
    ],
)
def test_bad_settings_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(HealthSettingsError):
        HealthSettings(**changes).validate()


def test_decisions_become_events() -> None:
    decision = Decision("blacklist", "3 probes failed", 5.0, worker="w1", queue=Q, expires=605.0)
    assert decision.to_event() == {
        "event": "blacklist",
        "reason": "3 probes failed",
        "at": 5.0,
        "worker": "w1",
        "queue": Q,
        "expires": 605.0,
    }


# ------------------------------------------------------------------------------ stateful invariants
WORKERS = ["w1", "w2", "w3", "w4"]
QUEUES = [Q, "t1.other", "t2.orders"]  # two tenants: shared signatures are judged per tenant
SIGNATURES = ["", "", "sig-a", "sig-b"]


class MonitorMachine(RuleBasedStateMachine):
    """Random attempts, polls, probe results, alerts, operator commands and time; after every step:
    blocked workers never get messages, fences follow decisions, a suspended queue delivers nothing, every
    delivered probe is outstanding until answered, and deadlines are never in the past."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(T0)
        self.monitor = HealthMonitor(SETTINGS)
        self.fenced: set[str] = set()  # from the decisions alone
        self.blacklisted: set[str] = set()
        self.suspended: set[str] = set()
        self.delivered: dict[str, str] = {}  # probe id -> worker
        self.signed: list[tuple[float, str, str, str]] = []  # failed attempts: (at, queue, signature, worker)

    def absorb(self) -> None:
        for decision in self.monitor.drain_decisions():
            if decision.event == "fence":
                assert decision.worker not in self.fenced
                self.fenced.add(decision.worker or "")
            elif decision.event == "unfence":
                self.fenced.discard(decision.worker or "")
                self.blacklisted.discard(decision.worker or "")
            elif decision.event == "blacklist":
                self.blacklisted.add(decision.worker or "")
            elif decision.event == "unblacklist":
                self.blacklisted.discard(decision.worker or "")
            elif decision.event == "suspend":
                assert decision.queue not in self.suspended
                self.suspended.add(decision.queue or "")
            elif decision.event == "resume":
                self.suspended.discard(decision.queue or "")
            elif decision.event in ("probe-passed", "probe-failed", "probe-cancelled"):
                self.delivered.pop(decision.probe_id or "", None)

    @rule(
        worker=st.sampled_from(WORKERS),
        queue=st.sampled_from(QUEUES),
        sig=st.sampled_from(SIGNATURES),
        ok=st.booleans(),
    )
    def attempt(self, worker: str, queue: str, sig: str, ok: bool) -> None:
        outcome = "succeeded" if ok else "failed"
        self.monitor.attempt(AttemptRecorded(queue, "g", "m", worker, 1, outcome, "", sig, self.clock.now))
        if not ok and sig:
            self.signed.append((self.clock.now, queue, sig, worker))
        self.absorb()

    @rule(worker=st.sampled_from(WORKERS), queue=st.sampled_from(QUEUES))
    def poll(self, worker: str, queue: str) -> None:
        verdict = self.monitor.poll(queue, worker, self.clock.now)
        if verdict.allowed:
            assert worker not in self.fenced and queue not in self.suspended
        if verdict.probe is not None:
            assert not verdict.allowed and worker not in self.blacklisted
            self.delivered[verdict.probe.id] = worker
        self.absorb()

    @rule(data=st.data(), ok=st.booleans())
    def answer(self, data: st.DataObject, ok: bool) -> None:
        if not self.delivered:
            return
        probe_id = data.draw(st.sampled_from(sorted(self.delivered)))
        worker = self.delivered[probe_id]
        assert self.monitor.probe_result(worker, probe_id, ok, "", self.clock.now)
        self.absorb()

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 3.0, 12.0, 40.0]))
    def wait(self, seconds: float) -> None:
        until = self.clock.now + seconds
        while (deadline := self.monitor.next_deadline()) is not None and deadline <= until:
            self.clock.now = max(self.clock.now, deadline)
            self.monitor.handle_timer(self.clock.now)
            self.absorb()
        self.clock.now = until

    @rule(queue=st.sampled_from(QUEUES), manual=st.booleans())
    def operator_queue(self, queue: str, manual: bool) -> None:
        if manual:
            self.monitor.suspend(queue, "op", self.clock.now)
        else:
            self.monitor.resume(queue, "op", self.clock.now)
        self.absorb()

    @rule(worker=st.sampled_from(WORKERS), lift=st.booleans())
    def operator_worker(self, worker: str, lift: bool) -> None:
        if lift:
            self.monitor.lift_blacklist(worker, "op", self.clock.now)
        else:
            self.monitor.unfence(worker, "op", self.clock.now)
        self.absorb()

    @rule(sig=st.sampled_from(["sig-*", "sig-a"]))
    def alert(self, sig: str) -> None:
        self.monitor.alert("rule fired", self.clock.now, signatures=[sig])
        self.absorb()

    @invariant()
    def agrees_with_the_decisions(self) -> None:
        for worker in WORKERS:
            assert self.monitor.blocked(worker) == (worker in self.fenced), worker
            assert (self.monitor.worker_state(worker) == "blacklisted") == (worker in self.blacklisted)
        for queue in QUEUES:
            assert self.monitor.suspended(queue) == (queue in self.suspended)
        for probe_id in self.delivered:
            assert probe_id in self.monitor.probes

    @invariant()
    def shared_signatures_are_judged_per_tenant(self) -> None:
        """A queue shows a signature as shared exactly when it failed there within the window and on
        `shared_failure_workers` distinct workers of the queue's own tenant."""
        horizon = self.clock.now - SETTINGS.window
        recent = [entry for entry in self.signed if entry[0] >= horizon]
        for entry in self.monitor.status(self.clock.now)["queues"]:
            queue = entry["queue"]
            tenant = namespace_of(queue)
            expected = sorted(
                {
                    sig
                    for _, q, sig, _ in recent
                    if q == queue
                    and len({w for _, q2, s2, w in recent if s2 == sig and namespace_of(q2) == tenant})
                    >= SETTINGS.shared_failure_workers
                }
            )
            assert entry["shared_signatures"] == expected, queue

    @invariant()
    def deadlines_are_not_in_the_past(self) -> None:
        deadline = self.monitor.next_deadline()
        assert deadline is None or deadline >= self.clock.now


TestMonitorMachine = MonitorMachine.TestCase
TestMonitorMachine.settings = hypothesis_settings(max_examples=60, stateful_step_count=60, deadline=None)


def test_anonymous_workers_are_never_fenced_but_suspensions_hold_for_them(
    monitor: HealthMonitor, clock: Clock
) -> None:
    for _ in range(10):
        monitor.attempt(failed("", clock.advance(0.1)))
    assert monitor.drain_decisions() == [] and monitor.poll(Q, "", clock.now).allowed
    monitor.suspend(Q, "maintenance", clock.now)
    assert not monitor.poll(Q, "", clock.now).allowed


def test_a_poller_that_cannot_take_probes_never_gets_one(monitor: HealthMonitor, clock: Clock) -> None:
    """The SQS face polls with probes=False: the probe waits for a poller that can report it."""
    fence(monitor, clock)
    run_timers(monitor, clock, clock.now + SETTINGS.probe_interval)
    verdict = monitor.poll(Q, "w1", clock.now, probes=False)
    assert not verdict.allowed and verdict.probe is None
    assert deliver(monitor, clock, "w1").startswith("probe-")  # still there for the next able poller
