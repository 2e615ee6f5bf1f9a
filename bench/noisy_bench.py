"""The noisy-neighbour benchmark (issue 17): what one tenant's flood costs another, and what the
protections cost everyone.

Each run starts its own `strictq serve` (HTTPS, the queue core in-process) with a key file of two tenants,
A and B, and drives it with the SDK's EmoDB client (scenarios/noisy_neighbour.py):

1. **edge**: B sends steadily alone (baseline), then beside A offering 10x its per-tenant limit (flood),
   then alone again (recovery); B's AgeOfFirstAttempt and send-to-ack latency p50/p99 per phase, A's
   refusals, messages lost. Run twice: with the per-tenant limit (`--tenant-rate`) and without it (the
   same flood admitted whole), so the table shows what the limit buys.
2. **shared queue**: A's backlog of several seconds of work and B's steady trickle in one queue with one
   worker; B's AgeOfFirstAttempt with the queue's fairness on (`tenant_separator`, `group_in_flight` 1)
   and off (oldest first).
3. **cost**: the same closed-loop load (producers sending batches of 10 to one queue, a worker draining
   it) with every protection configured but not engaged (a tenant rate far above the load, backpressure
   thresholds far above the backlog, the queue's fairness on) and with none; msg/s and the ratio.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scenarios.noisy_neighbour import Endpoint, TenantKeys, edge_flood, shared_queue
from strictq.sdk.errors import GatewayError

from .scenarios import Progress, Settings, measured, provenance
from .servers import GatewayServer

A_LIMIT = 100.0  # msg/s: A's (every tenant's) limit in the protected run; A offers 10x
B_RATE = 25.0


def run_noisy_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    seconds = 3.0 if st.quick else 6.0
    result: dict[str, Any] = {"a_limit": A_LIMIT, "b_rate": B_RATE, "phase_seconds": seconds}
    for protected in (True, False):
        flags = ["--tenant-rate", f"{A_LIMIT:g}", "--tenant-burst", f"{A_LIMIT:g}"] if protected else []
        name = "edge_limited" if protected else "edge_unlimited"
        with _gateway(st, name, flags) as (endpoint, keys):
            a, b = _tenants(keys, "flood", "steady")
            figures = asyncio.run(
                edge_flood(endpoint, a, b, a_limit=A_LIMIT, b_rate=B_RATE, seconds=seconds, progress=progress)
            )
        result[name] = _edge_figures(figures)
        progress(f"noisy: {name}: " + _edge_line(result[name]))
    with _gateway(st, "shared", []) as (endpoint, keys):
        a, _ = _tenants(keys, "shared", "shared")
        for fair in (True, False):
            queue = f"shared-{'fair' if fair else 'plain'}"
            asyncio.run(
                _configure(
                    endpoint,
                    a.producer,
                    queue,
                    {"tenant_separator": ":" if fair else "", "group_in_flight": 1 if fair else 0},
                )
            )
            run = asyncio.run(
                shared_queue(
                    endpoint,
                    TenantKeys(a.producer, a.producer, queue),
                    fair=fair,
                    backlog=600 if not st.quick else 300,
                    service_time=0.01,
                    b_rate=10,
                    seconds=seconds,
                    progress=progress,
                )
            )
            key = "shared_fair" if fair else "shared_plain"
            result[key] = {
                "backlog": run.backlog,
                "service_ms": run.service_time * 1000,
                "b_n": len(run.b_ages),
                "b_age_p50_ms": run.age(0.5) * 1000,
                "b_age_p99_ms": run.age(0.99) * 1000,
                "lost": run.lost,
                "order_violations": run.order_violations,
            }
            progress(f"noisy: {key}: B's AgeOfFirstAttempt p50 {run.age(0.5) * 1000:.0f} ms")
    runs: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(1 if st.quick else 3):  # alternating, the median of each: runs drift on a shared box
        for protected in (False, True):
            flags = ["--tenant-rate", "1000000", "--tenant-burst", "1000000"] if protected else []
            which = "on" if protected else "off"
            with _gateway(st, f"cost-{which}", flags) as (endpoint, keys):
                a, _ = _tenants(keys, "load", "load")
                runs[which].append(
                    asyncio.run(_throughput(endpoint, a.producer, protected, 4.0 if st.quick else 8.0))
                )
            progress(f"noisy: closed loop with protections {which}: {runs[which][-1]:.0f} msg/s")
    cost = {which: statistics.median(rates) for which, rates in runs.items()}
    cost["runs"] = len(runs["on"])
    result["cost"] = cost
    result.update(provenance(st, started))
    return result


# ------------------------------------------------------------------------------------------ runs
@contextlib.contextmanager
def _gateway(st: Settings, name: str, flags: list[str]) -> Any:
    work = st.work_dir / f"noisy-{name}"
    work.mkdir(parents=True, exist_ok=True)
    keys = _key_file(work / "keys.toml")
    server = GatewayServer(
        work / "data",
        st.out_dir / f"noisy-{name}.log",
        extra_args=["--no-proxy", "--keys", str(keys), *flags],
    )
    server.start()
    try:
        yield Endpoint(server.url, server.ca or None), server.credentials()
    finally:
        server.stop()


def _key_file(path: Path) -> Path:
    lines = []
    for tenant in ("a", "b"):
        for role in ("admin", "producer", "worker"):
            lines.append(
                f'[[credential]]\nid = "{role}-{tenant}"\nsecret = "{secrets.token_hex(16)}"\n'
                f'role = "{role}"\ntenant = "tenant-{tenant}"\n\n'
            )
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


def _tenants(keys: dict[str, dict[str, str]], a_queue: str, b_queue: str) -> tuple[TenantKeys, TenantKeys]:
    a = TenantKeys(keys["admin-a"]["secret"], keys["worker-a"]["secret"], a_queue)
    b = TenantKeys(keys["producer-b"]["secret"], keys["worker-b"]["secret"], b_queue)
    return a, b


async def _configure(endpoint: Endpoint, admin: str, queue: str, settings: dict[str, Any]) -> None:
    """Create `queue` (one message, purged) and set its protections through the admin route."""
    async with endpoint.client(admin) as client:
        await client.send(queue, {"hello": True})
        session = client._session
        assert session is not None
        url = endpoint.url + f"/admin/v1/queues/{queue}/protections"
        async with session.put(url, json=settings) as answer:
            if answer.status != 200:
                raise RuntimeError(f"noisy: PUT {url}: {answer.status} {await answer.text()}")
        async with session.delete(endpoint.url + f"/queue/1/{queue}") as answer:  # EmoDB's purge
            answer.raise_for_status()


async def _throughput(endpoint: Endpoint, admin: str, protected: bool, seconds: float) -> float:
    """Closed loop: 8 producers sending batches of 10 over 64 groups of 8 tenants, a worker draining;
    messages acknowledged per second."""
    queue = "load"
    settings: dict[str, Any] = (
        {"tenant_separator": ":", "backpressure_age": 3600, "backpressure_depth": 10_000_000, "ttl": 3600}
        if protected
        else {}
    )
    if settings:
        await _configure(endpoint, admin, queue, settings)
    stop = asyncio.Event()
    acked = 0

    async def produce(n: int) -> None:
        async with endpoint.client(admin) as client:
            i = 0
            while not stop.is_set():
                group = f"t{n % 8}:g{i % 8}"
                with contextlib.suppress(GatewayError):
                    await client.send_batch({queue: [{"i": i, "k": k} for k in range(10)]}, group=group)
                i += 1

    async def consume() -> None:
        nonlocal acked
        async with endpoint.client(admin) as client:
            while not stop.is_set():
                with contextlib.suppress(GatewayError):
                    items = await client.poll(queue, ttl=30, limit=100, wait=0.2)
                    by_token: dict[int | None, list[str]] = {}
                    for item in items:
                        by_token.setdefault(item.token, []).append(item.id)
                    for token, ids in by_token.items():
                        await client.ack(queue, ids, token)
                        if began is not None:
                            acked += len(ids)

    began: float | None = None
    async with asyncio.TaskGroup() as tasks:
        for n in range(8):
            tasks.create_task(produce(n))
        for _ in range(2):
            tasks.create_task(consume())
        await asyncio.sleep(1.0)  # warm-up
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        rate = acked / (time.perf_counter() - began)
        stop.set()
    return rate


# ----------------------------------------------------------------------------------------- figures
def _edge_figures(f: Any) -> dict[str, Any]:
    figures = asdict(f)
    del figures["b_ages"], figures["b_latencies"]
    for phase in ("baseline", "flood", "recovery"):
        figures[phase] = {
            "n": len(f.b_ages.get(phase, [])),
            "age_p50_ms": f.age(phase, 0.5) * 1000,
            "age_p99_ms": f.age(phase, 0.99) * 1000,
            "latency_p50_ms": f.latency(phase, 0.5) * 1000,
            "latency_p99_ms": f.latency(phase, 0.99) * 1000,
        }
    return figures


def _edge_line(r: dict[str, Any]) -> str:
    return (
        f"B's AgeOfFirstAttempt p50 {r['baseline']['age_p50_ms']:.1f} ms alone,"
        f" {r['flood']['age_p50_ms']:.1f} ms in the flood; A offered {r['a_offered']},"
        f" {r['a_accepted']} accepted, refused {r['a_refused']},"
        f" lost {r['a_lost'] + r['b_lost']}"
    )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 and a == a and b == b else "-"


def noisy_section(results: dict[str, Any], add: Any) -> None:
    """The report's noisy-neighbour section (bench/report.py calls it; nothing when it did not run)."""
    r = results.get("noisy")
    if not r:
        return
    add("## Noisy neighbour: fairness, limits and their cost (issue 17)\n")
    add(
        measured(r)
        + f". The scenario took {r['seconds']:.0f} s. Each run is its own `strictq serve` (HTTPS, queue core"
        " in-process, no egress proxy) with two tenants; clients are the SDK's EmoDB client"
        " (scenarios/noisy_neighbour.py), on the same machine as the server.\n"
    )
    add(
        f"**At the edge.** B sends {r['b_rate']:g} msg/s to its queue for {r['phase_seconds']:g} s alone"
        f" (baseline), then beside A offering {10 * r['a_limit']:g} msg/s to its own queue (10x a limit of"
        f" {r['a_limit']:g} msg/s), then alone again (recovery). AgeOfFirstAttempt: send to first delivery;"
        " latency: send to acknowledged. *Limited*: `--tenant-rate"
        f" {r['a_limit']:g}`; *unlimited*: the same flood admitted whole.\n"
    )
    add(
        "| run | phase | B's AgeOfFirstAttempt p50 | p99 | B's latency p50 | p99 | p50 vs baseline |\n"
        "|---|---|---|---|---|---|---|"
    )
    for name in ("edge_limited", "edge_unlimited"):
        e = r[name]
        base = e["baseline"]["age_p50_ms"]
        for phase in ("baseline", "flood", "recovery"):
            p = e[phase]
            add(
                f"| {name.split('_')[1]} | {phase} | {p['age_p50_ms']:.1f} ms | {p['age_p99_ms']:.1f} ms |"
                f" {p['latency_p50_ms']:.1f} ms | {p['latency_p99_ms']:.1f} ms |"
                f" {_ratio(p['age_p50_ms'], base)} |"
            )
    lim, unl = r["edge_limited"], r["edge_unlimited"]
    add(
        f"\nLimited: A offered {lim['a_offered']} messages, {lim['a_accepted']} accepted, refused"
        f" {lim['a_refused']} (429 `throttled` with Retry-After); A's accepted messages all delivered"
        f" {lim['a_drain_seconds']:.1f} s after the flood ended; B back within 2x its baseline p99"
        f" {lim['b_recovery_seconds']:.1f} s after it. Unlimited: {unl['a_accepted']} of A's accepted,"
        f" drained {unl['a_drain_seconds']:.1f} s after the flood, B recovered after"
        f" {unl['b_recovery_seconds']:.1f} s. Lost: {lim['a_lost'] + lim['b_lost']} and"
        f" {unl['a_lost'] + unl['b_lost']}; order violations: {lim['order_violations']} and"
        f" {unl['order_violations']}.\n"
    )
    fair, plain = r["shared_fair"], r["shared_plain"]
    add(
        f"**In one shared queue.** A's {fair['backlog']} messages over 30 groups arrive at once; B sends 10"
        f" msg/s for {r['phase_seconds']:g} s; one worker at {fair['service_ms']:g} ms a message. B's"
        f" AgeOfFirstAttempt p50 {fair['b_age_p50_ms']:.0f} ms (p99 {fair['b_age_p99_ms']:.0f} ms) with"
        f' the queue\'s fairness on (`tenant_separator` ":", `group_in_flight` 1), against'
        f" {plain['b_age_p50_ms']:.0f} ms (p99 {plain['b_age_p99_ms']:.0f} ms) oldest first:"
        f" {_ratio(plain['b_age_p50_ms'], fair['b_age_p50_ms'])} shorter."
        f" Lost {fair['lost'] + plain['lost']}, order violations"
        f" {fair['order_violations'] + plain['order_violations']}.\n"
    )
    cost = r["cost"]
    add(
        f"**What the protections cost** (median of {cost['runs']:.0f} alternating runs each)."
        f" A closed loop (8 producers sending batches of 10 over 64 groups of 8"
        f" tenants, 2 workers draining) acknowledged {cost['on']:.0f} msg/s with every protection configured"
        f" but not engaged (a tenant rate of 10^6 msg/s, backpressure thresholds of an hour and 10^7"
        f" messages, a TTL of an hour, fairness on) and {cost['off']:.0f} msg/s with none:"
        f" {_ratio(cost['on'], cost['off'])}.\n"
    )
