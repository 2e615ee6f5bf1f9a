"""The rollout benchmark (issue 18): how long a rollout step takes to reach the canary, and what group
routing costs the core.

1. **Step latency**: a `strictq serve` (HTTPS, queue core in-process) with a backlog of one message in each
   of many groups, and one SDK worker of the new version long-polling (`wait` 1 s). For each step of
   1, 2, 5, 25, 100 %, the admin route `PUT /admin/v1/queues/{q}/rollout` sets the share, and the time is
   taken from the call to the first delivery to the canary of a group the step added (the route's own
   answer time is shown beside it).
2. **Routing's cost in the core**: the sans-I/O core alone (no HTTP), N messages over G groups, each
   received and acknowledged one batch at a time, without routing and with 4 pins and a 50 % canary share;
   microseconds per message and the ratio.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp

from queue_core.machine import QueueCore, SendRequest
from queue_core.machine.routing import in_share
from strictq.sdk import ClientConfig, Message, Worker

from .scenarios import Progress, Settings, measured, provenance
from .servers import GatewayServer

STEPS = (1.0, 2.0, 5.0, 25.0, 100.0)
QUEUE = "rollout"


def run_rollout_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    groups = 2000 if st.quick else 5000
    work = st.work_dir / "rollout"
    work.mkdir(parents=True, exist_ok=True)
    keys = _key_file(work / "keys.toml")
    server = GatewayServer(
        work / "data", st.out_dir / "rollout.log", extra_args=["--no-proxy", "--keys", str(keys)]
    )
    server.start()
    try:
        creds = server.credentials()
        steps = asyncio.run(_step_latency(server.url, server.ca, creds, groups, progress))
    finally:
        server.stop()
    core = _core_cost(100_000 if st.quick else 300_000, 10_000, progress)
    return {"groups": groups, "steps": steps, "core": core, **provenance(st, started)}


def _key_file(path: Path) -> Path:
    lines = [
        f'[[credential]]\nid = "{cid}"\nsecret = "{secrets.token_hex(16)}"\nrole = "{role}"\n'
        'tenant = "bench"\n\n'
        for cid, role in (("admin", "admin"), ("producer", "producer"), ("canary", "worker"))
    ]
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


async def _step_latency(
    url: str, ca: str, creds: dict[str, dict[str, str]], groups: int, progress: Progress
) -> list[dict[str, float]]:
    context: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else False
    admin = {"X-BV-API-Key": creds["admin"]["secret"]}
    producer = {"X-BV-API-Key": creds["producer"]["secret"]}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
        names = [f"g{i}" for i in range(groups)]
        await _send_each(http, url, producer, names)
        await _put_rollout(http, url, admin, 0.0)
        delivered: dict[str, float] = {}
        arrived = asyncio.Event()

        async def handle(message: Message) -> None:
            delivered.setdefault(message.group or "", time.perf_counter())
            arrived.set()

        secret = creds["canary"]["secret"]
        config = ClientConfig(
            url=url, ca_file=ca or None, api_key=secret, worker_id="canary", worker_secret=secret
        )
        worker = Worker(QUEUE, handle, config=config, version="2", wait=1.0, limit=10, concurrency=4, ttl=30)
        task = asyncio.create_task(worker.run())
        out: list[dict[str, float]] = []
        previous = 0.0
        try:
            await asyncio.sleep(1.5)  # the worker is polling (long polls) before the first step
            for percent in STEPS:
                added = {g for g in names if in_share(g, percent) and not in_share(g, previous)}
                sent_at = time.perf_counter()
                await _put_rollout(http, url, admin, percent)
                answered = time.perf_counter() - sent_at
                deadline = time.monotonic() + 30
                first: float | None = None
                while first is None and time.monotonic() < deadline:
                    arrived.clear()
                    hits = [at for g, at in delivered.items() if g in added]
                    if hits:
                        first = min(hits)
                        break
                    try:
                        await asyncio.wait_for(arrived.wait(), 1.0)
                    except TimeoutError:
                        pass
                latency = (first - sent_at) * 1000 if first is not None else float("nan")
                out.append(
                    {
                        "percent": percent,
                        "groups_added": len(added),
                        "first_ms": latency,
                        "put_ms": answered * 1000,
                    }
                )
                progress(
                    f"rollout: step to {percent:g}% ({len(added)} groups added): first delivery"
                    f" {latency:.1f} ms, PUT {answered * 1000:.1f} ms"
                )
                previous = percent
        finally:
            worker.stop(1.0)
            await asyncio.wait_for(task, 15)
    return out


async def _send_each(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], names: list[str]
) -> None:
    semaphore = asyncio.Semaphore(32)

    async def one(group: str) -> None:
        async with (
            semaphore,
            http.post(
                f"{url}/queue/1/{QUEUE}/send", params={"group": group}, json={"group": group}, headers=headers
            ) as r,
        ):
            if r.status != 200:
                raise RuntimeError(f"send to {group}: HTTP {r.status} {await r.text()}")

    await asyncio.gather(*(one(g) for g in names))


async def _put_rollout(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], percent: float
) -> None:
    body = {"version": "2", "percent": percent, "state": "running", "baseline": ["1"], "reason": "bench"}
    async with http.put(f"{url}/admin/v1/queues/{QUEUE}/rollout", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"PUT rollout: HTTP {r.status} {await r.text()}")


def _core_cost(messages: int, groups: int, progress: Progress) -> dict[str, float]:
    out: dict[str, float] = {}
    routing = {
        "pins": [{"name": f"p{i}", "buckets": [i * 100, i * 100 + 100], "workers": ["w"]} for i in range(4)],
        "canary": {"version": "2", "percent": 50},
    }
    for name, attributes in (("plain", None), ("routed", {"routing": routing})):
        core = QueueCore()
        core.create_queue("q", 0.0, attributes)
        requests = [SendRequest(body=b"x", group=f"g{i % groups}") for i in range(messages)]
        for start in range(0, messages, 1000):
            core.send("q", requests[start : start + 1000], 1.0)
        core.drain_effects()
        began = time.perf_counter()
        done = 0
        version = ""
        while done < messages:
            version = "2" if version != "2" else "1"  # the canary and the rest take turns
            got = core.receive("q", 10, 30.0, "w", 2.0, version)
            if not got:
                got = core.receive("q", 10, 30.0, "w", 2.0, "2" if version == "1" else "1")
                if not got:
                    break
            core.ack("q", [(d.message_id, d.token) for d in got], 2.0)
            done += len(got)
            core.drain_effects()
        elapsed = time.perf_counter() - began
        out[f"{name}_us"] = elapsed / max(done, 1) * 1e6
        out[f"{name}_done"] = done
        progress(f"rollout: core receive+ack {name}: {out[f'{name}_us']:.2f} us/message ({done} messages)")
    out["ratio"] = out["routed_us"] / out["plain_us"]
    return out


def rollout_section(results: dict[str, Any], add: Any) -> None:
    """The report's rollout section (bench/report.py calls it; nothing when it did not run)."""
    r = results.get("rollout")
    if not r:
        return
    add("## Rollouts: step latency and routing's cost (issue 18)\n")
    add(measured(r) + f". The scenario took {r['seconds']:.0f} s.\n")
    add(
        "**Step latency.** `strictq serve` (HTTPS, core in-process) with one message in each of"
        f" {r['groups']} groups and one SDK worker of the new version long-polling (1 s). Each step is the"
        " admin route `PUT /admin/v1/queues/{q}/rollout` (what `strictq rollout` calls); *first delivery* is"
        " the time from that call to the canary's first message of a group the step added.\n"
    )
    add("| step | groups added | PUT answered | first delivery |\n|---|---|---|---|")
    for step in r["steps"]:
        add(
            f"| {step['percent']:g}% | {step['groups_added']} | {step['put_ms']:.1f} ms |"
            f" {step['first_ms']:.1f} ms |"
        )
    c = r["core"]
    add(
        f"\n**Routing in the core** (sans-I/O, no HTTP): receive (batches of 10) + ack per message over"
        f" 10,000 groups: {c['plain_us']:.2f} µs without routing, {c['routed_us']:.2f} µs with 4 pins and a"
        f" 50 % canary share (**{c['ratio']:.2f}x**). End to end a message costs about 250 µs of server"
        " time (the queue server section), so routing's share of it is small.\n"
    )
