"""Failure management's two latencies, measured in the failover scenario (scenarios.failover), issue 7:

- *time to fence*: from a worker's first failure (its first failed call or attempt in the wire log) to the
  fence taking effect at the egress proxy (the first call of that worker the proxy refused, `block` in
  the wire log; a canary keeps calling as that worker every 50 ms, so the proxy's first refusal is seen
  within that much). Target: under 2 s. It includes `fence_after` failed attempts (the docs' default 5).
- *recovery to delivery*: from the backend's recovery (the fake backend's own clock, switched by the
  scenario) to the first real message delivered again (the gateway's `delivery` record), through a
  suspended queue's steady probes. Target: under one probe interval. Each scenario run has several outages
  held a random extra 0-1 probe interval, so recoveries land at every phase of the probe cycle.

`strictq serve` runs with the documented defaults except `probe_interval` = `probe_backoff_max` = 1 s (a
steady probe cycle) and a sub-second-friendly window; 5 workers, 12 groups, real TLS, proxy and SDK. The
same scenario then runs through a three-node cluster (`strictq cluster up`, R3) with two edges
(scenarios.system.ClusterSystem): failure management's gates in the partitions, its decider on one queue
server, the faulty worker on the second edge and the proxy on the first, so a fence crosses the cluster.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scenarios.failover import Settings

FENCE_TARGET_S = 2.0
PROBE_INTERVAL_S = 1.0


def run_failover_bench(work_dir: Path, quick: bool, progress: Any) -> dict[str, Any]:
    from scenarios.failover import Settings  # at run time: importing the bench stays light

    runs = 1 if quick else 3
    settings = Settings(
        workers=5,
        groups=12,
        fence_after=5,
        window=60.0,
        probe_interval=PROBE_INTERVAL_S,
        probe_backoff_max=PROBE_INTERVAL_S,
        probe_timeout=5.0,
        outages=3 if quick else 5,
        outage_hold=0.5,
        outage_jitter=PROBE_INTERVAL_S,
    )
    figures: list[dict[str, Any]] = []
    sdk_log = logging.getLogger("strictq.sdk")  # each failed handler's warning is the scenario, not news
    level = sdk_log.level
    sdk_log.setLevel(logging.ERROR)
    clustered: list[dict[str, Any]] = []
    try:
        for run in range(1, runs + 1):
            figures.append(_one_run(work_dir, run, runs, settings, progress, cluster=False))
        for run in range(1, runs + 1):
            clustered.append(_one_run(work_dir, run, runs, settings, progress, cluster=True))
    finally:
        sdk_log.setLevel(level)
    summary = _summary(figures, settings, runs)
    summary["cluster"] = _summary(clustered, settings, runs)
    return summary


def _one_run(
    work_dir: Path, run: int, runs: int, settings: Settings, progress: Any, *, cluster: bool
) -> dict[str, Any]:
    from scenarios.failover import Scenario

    where = "a 3-node cluster, 2 edges" if cluster else "one process"
    progress(f"  failover run {run}/{runs} ({where}): {settings.workers} workers, {settings.outages} outages")
    name = f"failover-cluster-{run}" if cluster else f"failover-{run}"
    report = asyncio.run(Scenario(work_dir / name, settings, cluster=cluster).run())
    fence = report.time_to_fence
    delivery = ", ".join(f"{d:.2f}" for d in report.recovery_to_delivery)
    fenced = "not measured" if fence is None else f"{fence:.2f} s"
    progress(
        f"    time to fence {fenced}; recovery -> delivery {delivery} s; sent {report.sent}, lost"
        f" {report.lost}, order violations {report.order_violations}"
    )
    return report.figures()


def _summary(figures: list[dict[str, Any]], settings: Settings, runs: int) -> dict[str, Any]:
    fences = [f["time_to_fence_s"] for f in figures if f["time_to_fence_s"] is not None]
    decisions = [f["time_to_fence_decision_s"] for f in figures if f["time_to_fence_decision_s"] is not None]
    deliveries = [d for f in figures for d in f["recovery_to_delivery_s"]]
    resumes = [d for f in figures for d in f["recovery_to_resume_s"]]
    suspends = [d for f in figures for d in f["outage_to_suspend_s"]]
    return {
        "settings": {
            "workers": settings.workers,
            "fence_after": settings.fence_after,
            "probe_interval_s": settings.probe_interval,
            "runs": runs,
            "outages_per_run": settings.outages,
        },
        "time_to_fence_s": _stats(fences),
        "time_to_fence_decision_s": _stats(decisions),
        "recovery_to_delivery_s": _stats(deliveries),
        "recovery_to_resume_s": _stats(resumes),
        "outage_to_suspend_s": _stats(suspends),
        "sent": sum(f["sent"] for f in figures),
        "lost": sum(f["lost"] for f in figures),
        "duplicates": sum(f["duplicates"] for f in figures),
        "order_violations": sum(f["order_violations"] for f in figures),
        "fences_during_outage": sum(f["fences_during_outage"] for f in figures),
        "runs": figures,
    }


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "max": max(values),
        "min": min(values),
        "values": [round(v, 4) for v in values],
    }


def failover_section(results: dict[str, Any], add: Any) -> None:
    """The report's section (bench/report.py calls it; nothing when the scenario did not run)."""
    r = results.get("failover")
    if not r:
        return
    s = r["settings"]
    add("## Failure management: time to fence, recovery to delivery\n")
    add(
        "The failover scenario (`scenarios.failover`, what `strictq demo` narrates and"
        f" `tests/test_failure_e2e.py` asserts) against `strictq serve`: {s['workers']} SDK workers through"
        f" the egress proxy, fence after {s['fence_after']} failed attempts, probe interval"
        f" {s['probe_interval_s']:g} s (steady), {s['runs']} run(s) of {s['outages_per_run']} backend"
        " outages each, recovering at a random point of the probe cycle. Every time is a wire-log record's"
        " timestamp (the first failed call, the proxy's first `block`, the gateway's first delivery after the"
        " backend's recovery).\n"
    )
    c = r.get("cluster") or {}
    add(
        "Side by side: one process (`strictq serve`) and a three-node cluster (`strictq cluster up`, R3) with"
        " two edges, the faulty worker on the second edge, the egress proxy on the first (the fence is"
        " decided on a queue server and reaches that proxy through the cluster's control bucket).\n"
    )
    add("| figure | one process: median | max | cluster: median | max | n | target | status |")
    add("| --- | --- | --- | --- | --- | --- | --- | --- |")
    interval = float(s["probe_interval_s"])
    rows = [
        ("first failure → fence in force at the proxy", "time_to_fence_s", f"< {FENCE_TARGET_S:g} s",
         FENCE_TARGET_S),
        ("first failure → fence decided (event)", "time_to_fence_decision_s", "", None),
        ("outage → queue suspended", "outage_to_suspend_s", "", None),
        ("backend recovery → queue resumed (event)", "recovery_to_resume_s", "", None),
        ("backend recovery → first message delivered", "recovery_to_delivery_s",
         f"< {interval:g} s (one probe interval)", interval),
    ]  # fmt: skip
    for label, key, target, bound in rows:
        one, many = r[key], c.get(key, {})
        cells = []
        for stats in (one, many):
            if stats.get("n"):
                cells += [f"{stats['median']:.2f} s", f"{stats['max']:.2f} s"]
            else:
                cells += ["—", "—"]
        counts = f"{one.get('n', 0)} / {many.get('n', 0)}"
        add(f"| {label} | {' | '.join(cells)} | {counts} | {target} | {_status([one, many], bound)} |")
    add(
        f"\nOne process: {r['sent']:,} sent, {r['lost']} lost, {r['duplicates']} processed twice,"
        f" {r['order_violations']} groups out of order; {r['fences_during_outage']} workers fenced for a"
        " backend outage. Recovery → delivery is bounded by the probe cycle: the first probe after the"
        " recovery resumes the queue, so it is up to one probe interval (plus a poll) and half of one on"
        " average.\n"
    )
    if c:
        add(
            f"Cluster: {c['sent']:,} sent, {c['lost']} lost, {c['duplicates']} processed twice,"
            f" {c['order_violations']} groups out of order; {c['fences_during_outage']} workers fenced for a"
            " backend outage.\n"
        )


def _status(parts: list[dict[str, Any]], bound: float | None) -> str:
    """`met` when every topology's max is under `bound`, else the worst of them."""
    measured = [p for p in parts if p.get("n")]
    if not measured:
        return "—"
    if bound is None:
        return "reported"
    if all(p["max"] < bound for p in measured):
        return "met"
    if all(p["median"] < bound for p in measured):
        return "met at the median (max over)"
    return "missed"
