"""The noisy-neighbour experiment (issue 17): one tenant floods, the other must not notice.

Two runs, each against a real gateway over HTTPS with the SDK's EmoDB client (strictq.sdk.client):

- `edge_flood`: tenants A and B, each with its own queue, producer and worker, share one gateway and one
  queue core (A's producer runs in a process of its own, as a real tenant's would). B sends at a steady
  rate; its AgeOfFirstAttempt (send to first delivery) is measured alone (the baseline), then while A
  offers `factor` times its per-tenant rate limit, then after A stops (recovery). A's refusals are counted
  by error code (the documented 429 `throttled`); every send of A's that was accepted must reach A's
  worker (nothing accepted is lost).
- `shared_queue`: A and B share one queue, their groups named `a:...` and `b:...`, served by one worker
  of fixed capacity. A drops a backlog of several seconds of work at once while B keeps sending; B's
  AgeOfFirstAttempt is measured with the queue's fairness on (`tenant_separator` ":": tenants take turns)
  and, as the control, with it off (oldest first, where B waits behind A's backlog).

Ages are measured by the clients (one machine, one clock): each body carries its send time, the worker
notes when it first sees it. The test (tests/test_noisy_neighbour.py) and the benchmark (`make bench`,
bench/noisy_bench.py) both run these.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strictq.sdk.client import EmoClient
from strictq.sdk.config import ClientConfig
from strictq.sdk.errors import GatewayError

Progress = Callable[[str], None]
A_GROUPS = 30  # the shared queue's flooding tenant spreads its backlog over this many groups


@dataclass(frozen=True)
class Endpoint:
    """Where the gateway is and how to trust it."""

    url: str
    ca_file: str | None

    def client(self, key: str, timeout: float = 30.0) -> EmoClient:
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        config = ClientConfig(url=self.url, ca_file=self.ca_file)
        return EmoClient(config, key, timeout=timeout, ssl_context=context)


@dataclass(frozen=True)
class TenantKeys:
    producer: str
    worker: str
    queue: str


def quantile(samples: list[float], q: float) -> float:
    """Nearest-rank q-quantile (NaN when empty)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Collected:
    """What a worker saw: first-delivery ages by send phase, and each group's payload numbers in order."""

    ages: dict[str, list[float]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)  # send -> acknowledged
    seen: set[int] = field(default_factory=set)
    groups: dict[str, list[int]] = field(default_factory=dict)  # group -> seqs, in first-delivery order
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (sent at, age) of each message

    def order_violations(self) -> int:
        """Messages first delivered before one their group accepted earlier (by the queue's sequence
        number, the order of receipt: concurrent sends to one group have no order of their own)."""
        return sum(1 for numbers in self.groups.values() for a, b in itertools.pairwise(numbers) if b < a)


async def work(
    endpoint: Endpoint, key: str, queue: str, into: Collected, stop: asyncio.Event, service_time: float = 0.0
) -> None:
    """Poll (long polls), note each message's first delivery, take `service_time` per message, ack."""
    async with endpoint.client(key, timeout=10.0) as client:
        while not stop.is_set():
            try:
                items = await client.poll(queue, ttl=30, limit=10, wait=0.2)
            except GatewayError:
                await asyncio.sleep(0.05)
                continue
            now = time.time()
            for item in items:
                payload = item.payload
                if not isinstance(payload, dict) or "n" not in payload:
                    continue
                number = int(payload["n"])
                if number not in into.seen:
                    sent_at = float(payload["t"])
                    into.ages.setdefault(str(payload.get("phase", "")), []).append(now - sent_at)
                    into.timeline.append((sent_at, now - sent_at))
                    into.groups.setdefault(item.group, []).append(item.seq)
                into.seen.add(number)
            if items:
                if service_time:
                    await asyncio.sleep(service_time * len(items))
                done = time.time()
                for item in items:
                    payload = item.payload
                    if isinstance(payload, dict) and "t" in payload:
                        phase = str(payload.get("phase", ""))
                        into.latencies.setdefault(phase, []).append(done - float(payload["t"]))
                by_token: dict[int | None, list[str]] = {}
                for item in items:
                    by_token.setdefault(item.token, []).append(item.id)
                for token, ids in by_token.items():
                    with contextlib.suppress(GatewayError):
                        await client.ack(queue, ids, token)


@dataclass
class Sender:
    """Numbers its messages; counts what was accepted and, by error code, what was refused."""

    accepted: set[int] = field(default_factory=set)
    refused: Counter[str] = field(default_factory=Counter)
    next_number: int = 0

    async def send(self, client: EmoClient, queue: str, group: str, phase: str, base: int) -> None:
        number = base + self.next_number
        self.next_number += 1
        body = {"n": number, "t": time.time(), "phase": phase}
        try:
            await client.send(queue, body, group=group)
        except GatewayError as exc:
            self.refused[exc.code or f"http_{exc.status}"] += 1
        else:
            self.accepted.add(number)


async def paced(rate: float, seconds: float, action: Callable[[int], Any], in_flight: int = 64) -> None:
    """Start `action(i)` at `rate` per second for `seconds`, at most `in_flight` at once (an open loop
    that does not slow down when the server does, up to that bound)."""
    gate = asyncio.Semaphore(in_flight)
    started = time.perf_counter()
    count = int(rate * seconds)

    async def one(i: int) -> None:
        try:
            await action(i)
        finally:
            gate.release()

    async with asyncio.TaskGroup() as tasks:
        for i in range(count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await gate.acquire()
            tasks.create_task(one(i))


async def drained(collected: Collected, accepted: set[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if accepted <= collected.seen:
            return True
        await asyncio.sleep(0.05)
    return accepted <= collected.seen


# ----------------------------------------------------------------------------------- the edge flood
@dataclass
class EdgeFlood:
    a_limit: float
    factor: float
    b_rate: float
    seconds: float
    b_ages: dict[str, list[float]]  # phase -> ages (s): baseline, flood, recovery
    b_latencies: dict[str, list[float]]
    a_offered: int
    a_accepted: int
    a_refused: dict[str, int]
    a_lost: int
    b_lost: int
    order_violations: int
    a_seconds: float  # how long A's flood ran (its process's clock)
    a_drain_seconds: float  # from the flood's end until A's worker had every accepted message
    b_recovery_seconds: float  # from the flood's end until B's ages stayed within 2x its baseline p99

    def age(self, phase: str, q: float = 0.5) -> float:
        return quantile(self.b_ages.get(phase, []), q)

    def latency(self, phase: str, q: float = 0.5) -> float:
        return quantile(self.b_latencies.get(phase, []), q)


async def edge_flood(
    endpoint: Endpoint,
    a: TenantKeys,
    b: TenantKeys,
    *,
    a_limit: float,
    factor: float = 10.0,
    b_rate: float = 40.0,
    seconds: float = 3.0,
    progress: Progress = lambda line: None,
) -> EdgeFlood:
    """B alone, then A offering `factor` x `a_limit` msg/s beside B, then B alone again."""
    stop = asyncio.Event()
    got_a, got_b = Collected(), Collected()
    sent_a, sent_b = Sender(), Sender()
    async with (
        endpoint.client(b.producer) as producer_b,
        asyncio.TaskGroup() as workers,
    ):
        workers.create_task(work(endpoint, a.worker, a.queue, got_a, stop))
        workers.create_task(work(endpoint, b.worker, b.queue, got_b, stop))
        try:

            async def b_sends(phase: str) -> None:
                await paced(
                    b_rate, seconds, lambda i: sent_b.send(producer_b, b.queue, f"b-{i % 8}", phase, 0)
                )

            progress(f"noisy neighbour: B alone at {b_rate:g} msg/s for {seconds:g} s (baseline)")
            await b_sends("baseline")
            offered = a_limit * factor
            progress(
                f"noisy neighbour: A offers {offered:g} msg/s ({factor:g}x its limit of {a_limit:g}) beside B"
            )
            async with asyncio.TaskGroup() as load:
                load.create_task(b_sends("flood"))
                flood = load.create_task(_flood_process(endpoint, a, offered, seconds))
            sent_a.accepted, sent_a.refused, sent_a.next_number, flood_seconds = flood.result()
            flood_ended = time.monotonic()
            flood_ended_at = time.time()
            progress("noisy neighbour: B alone again (recovery)")

            async def a_drain_time() -> float:
                """Seconds from the flood's end until A's worker had every accepted message."""
                done = await drained(got_a, sent_a.accepted, 60.0)
                return time.monotonic() - flood_ended if done else math.nan

            a_timing = asyncio.create_task(a_drain_time())
            await b_sends("recovery")
            a_drain = await a_timing
            await drained(got_b, sent_b.accepted, 30.0)
        finally:
            stop.set()
    return EdgeFlood(
        a_limit=a_limit,
        factor=factor,
        b_rate=b_rate,
        seconds=seconds,
        b_ages=got_b.ages,
        b_latencies=got_b.latencies,
        a_offered=sent_a.next_number,
        a_accepted=len(sent_a.accepted),
        a_refused=dict(sent_a.refused),
        a_lost=len(sent_a.accepted - got_a.seen),
        b_lost=len(sent_b.accepted - got_b.seen),
        order_violations=got_a.order_violations() + got_b.order_violations(),
        a_seconds=flood_seconds,
        a_drain_seconds=a_drain,
        b_recovery_seconds=_recovery(got_b, flood_ended_at),
    )


def _recovery(got: Collected, flood_ended_at: float) -> float:
    """Seconds after the flood's end until every later B message waited at most 2x the baseline p99
    (0 when none waited longer after it ended: B never noticed)."""
    bound = 2 * max(quantile(got.ages.get("baseline", []), 0.99), 0.001)
    late = [sent_at for sent_at, age in got.timeline if sent_at >= flood_ended_at and age > bound]
    return max(late) - flood_ended_at if late else 0.0


async def _flood_process(
    endpoint: Endpoint, a: TenantKeys, rate: float, seconds: float
) -> tuple[set[int], Counter[str], int, float]:
    """A's flood from a process of its own: in this one, its hundreds of requests in flight would hold up
    B's clients on the same event loop, and B would seem to wait for the server when it waits for us."""
    job = {"url": endpoint.url, "ca": endpoint.ca_file, "key": a.producer, "queue": a.queue}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scenarios.noisy_neighbour",
        f"{rate:g}",
        f"{seconds:g}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate(json.dumps(job).encode())
    if process.returncode != 0:
        raise RuntimeError(f"noisy neighbour: the flood process exited with {process.returncode}")
    found = json.loads(out)
    accepted, refused = set(found["accepted"]), Counter(found["refused"])
    return accepted, refused, int(found["offered"]), float(found["seconds"])


async def _flood(job: dict[str, Any], rate: float, seconds: float) -> dict[str, Any]:
    endpoint = Endpoint(job["url"], job["ca"])
    sender = Sender()
    started = time.perf_counter()
    async with endpoint.client(job["key"]) as client:
        await paced(
            rate,
            seconds,
            lambda i: sender.send(client, job["queue"], f"a-{i % 32}", "flood", 1_000_000),
            in_flight=256,
        )
    return {
        "accepted": sorted(sender.accepted),
        "refused": dict(sender.refused),
        "offered": sender.next_number,
        "seconds": time.perf_counter() - started,
    }


if __name__ == "__main__":  # the flood process: `python -m scenarios.noisy_neighbour RATE SECONDS` < job
    print(json.dumps(asyncio.run(_flood(json.load(sys.stdin), float(sys.argv[1]), float(sys.argv[2])))))


# ---------------------------------------------------------------------------------- the shared queue
@dataclass
class SharedQueue:
    fair: bool
    backlog: int
    service_time: float
    b_ages: list[float]
    lost: int
    order_violations: int
    seconds: float  # until every message was delivered

    def age(self, q: float = 0.5) -> float:
        return quantile(self.b_ages, q)


async def shared_queue(
    endpoint: Endpoint,
    keys: TenantKeys,
    *,
    fair: bool,
    backlog: int = 300,
    service_time: float = 0.01,
    b_rate: float = 10.0,
    seconds: float = 2.0,
    progress: Progress = lambda line: None,
) -> SharedQueue:
    """A's `backlog` messages (over A_GROUPS groups) arrive at once; B sends `b_rate` msg/s for `seconds`; one
    worker takes `service_time` per message. The queue must exist; `fair` sets its `tenant_separator`."""
    stop = asyncio.Event()
    got = Collected()
    sender = Sender()
    started = time.monotonic()
    async with endpoint.client(keys.producer) as producer:
        count = backlog // A_GROUPS
        for g in range(A_GROUPS):  # `_sendbatch` names one group per request: one request per group
            numbers = [9_000_000 + g * 1000 + i for i in range(count)]
            sent_at = time.time()
            batch = [{"n": n, "t": sent_at, "phase": "a"} for n in numbers]
            await producer.send_batch({keys.queue: batch}, group=f"a:{g}")
            sender.accepted.update(numbers)
        progress(
            f"shared queue ({'fair' if fair else 'oldest first'}): A's {backlog} messages queued;"
            f" B sends {b_rate:g} msg/s for {seconds:g} s; one worker at {service_time * 1000:g} ms each"
        )
        async with asyncio.TaskGroup() as tasks:
            worker = tasks.create_task(work(endpoint, keys.worker, keys.queue, got, stop, service_time))
            try:
                await paced(
                    b_rate, seconds, lambda i: sender.send(producer, keys.queue, f"b:{i % 4}", "b", 0)
                )
                await drained(got, sender.accepted, 120.0)
            finally:
                stop.set()
            await worker
    return SharedQueue(
        fair=fair,
        backlog=backlog,
        service_time=service_time,
        b_ages=got.ages.get("b", []),
        lost=len(sender.accepted - got.seen),
        order_violations=got.order_violations(),
        seconds=time.monotonic() - started,
    )
