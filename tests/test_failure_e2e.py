"""Failure management end to end (issue 7's scenario): the real `strictq serve` (gateway over TLS, queue
core, egress proxy child) with sub-second health settings, five SDK workers with their own credentials
from the key file, a fake backend counting the calls that reach it per worker (scenarios.failover).

One worker turns faulty: it is fenced after the threshold, its later calls never reach the backend, its
groups finish on the other workers in order, and a probe restores it once it is healed. Then the backend
fails for everyone: the queue is suspended (nobody fenced for it) and resumes by itself when the backend
recovers. Nothing is lost, nothing processed twice, no group runs two successful handlers at once, and
the timings come from the wire log's records (reported, never asserted against a clock).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from scenarios.failover import Report, Scenario, Settings

SCENARIO_TIMEOUT = 120.0  # bounded: every phase has its own bounded wait; the whole runs in ~6 s


async def test_a_faulty_worker_is_fenced_and_a_backend_outage_suspends_the_queue(tmp_path: Path) -> None:
    settings = Settings(
        workers=5,
        groups=12,
        probe_interval=0.5,
        probe_backoff_max=0.5,
        probe_timeout=3.0,
        fence_after=4,
        window=20.0,
        outage_hold=0.7,
        poll_wait=0.5,  # the workers' long poll: the stop at the end waits for the one in flight
    )
    story: list[str] = []
    scenario = Scenario(tmp_path / "system", settings, story.append)
    async with asyncio.timeout(SCENARIO_TIMEOUT):
        report = await scenario.run()
    context = "\n".join(story)
    check_delivery(report, scenario, context)
    check_fence(report, scenario, context)
    check_outage(report, context)
    print(f"failover figures: {report.figures()}")


def check_delivery(report: Report, scenario: Scenario, context: str) -> None:
    """Nothing lost or duplicated, every group in order, never two successful handlers of one group at once;
    the backend charged every order exactly once."""
    # At least the rounds the scenario waits for: two to warm up, one before the outage, one after it.
    assert report.workers == 5 and report.sent >= 4 * scenario.settings.groups, context
    assert (report.lost, report.duplicates, report.order_violations) == (0, 0, 0), context
    assert report.overlaps == [], report.overlaps
    assert report.done == report.sent
    charges = scenario.backend.charges
    assert len(charges) == report.sent and set(charges.values()) == {1}, [
        k for k, v in charges.items() if v != 1
    ]


def check_fence(report: Report, scenario: Scenario, context: str) -> None:
    """The faulty worker was fenced, its calls stopped at the proxy (the backend's count for it did not
    move while the proxy refused its canary), its failed orders were finished by others, and it was
    unfenced after a probe passed."""
    faulty = report.faulty_worker
    events = report.events
    fence = next(e for e in events if e["event"] == "fence" and e.get("worker") == faulty)
    assert f"{scenario.settings.fence_after} failed attempts" in fence["reason"], fence
    assert report.first_failure is not None and report.fence_effective is not None, context
    assert report.first_failure <= report.fence_decided <= report.fence_effective  # type: ignore[operator]
    assert report.blocked_while_fenced > 0, context  # its calls kept coming, refused at the proxy...
    assert report.calls_while_fenced == 0, context  # ...and none reached the backend
    assert report.failed_elsewhere > 0, context
    # Fenced workers are probed; the restoring probe passed before the unfence.
    probe_pass = next(
        e
        for e in events
        if e["event"] == "probe-passed" and e.get("worker") == faulty and e["at"] >= report.fence_decided
    )
    unfence = next(e for e in events if e["event"] == "unfence" and e.get("worker") == faulty)
    assert probe_pass["at"] <= unfence["at"] == report.unfenced
    assert report.unfenced > report.fence_decided  # type: ignore[operator]


def check_outage(report: Report, context: str) -> None:
    """The backend outage: a shared failure (nobody fenced), the queue suspended, resumed by a probe."""
    [outage] = report.outages
    assert outage.shared_failure is not None and outage.suspended is not None, context
    assert outage.at <= outage.shared_failure <= outage.suspended < outage.recovered, context
    assert outage.resumed is not None and outage.resumed >= outage.recovered, context
    assert report.fences_during_outage == [], report.fences_during_outage
    resume = next(e for e in report.events if e["event"] == "resume")
    assert "passed" in resume["reason"], resume  # a probe resumed it, not an operator
    assert outage.first_delivery is not None and outage.first_delivery >= outage.resumed - 0.05, context
