"""Clients of a simulated world's edges (strictq.geo_sim) for `strictq demo --geo` and the geo benchmark.

They speak the EmoDB face over HTTPS with aiohttp on the world's own event loop: the world's simulated
links (its relays) run on that loop, so nothing here may block it (no boto3, no subprocess.run).

- `EmoClient(world, region, role)`: one region's edge, one credential of the key file every edge shares;
- `Producer`: sends `{"i": 0}`, `{"i": 1}`, ... to one group, timing each send; a failed send is tried
  again with the same `i` (so a duplicate is possible, a loss is not);
- `Consumer`: polls and acks the whole queue all along, the `i`s of each group in delivery order;
- `Order.of(received, sent)`: lost, out-of-order and duplicate counts of one group.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from cluster.layout import read_layout
from cluster.placement import MoveRecord
from cluster.placement_store import read_placement
from protocol import headers
from strictq.geo_sim import GeoError, GeoWorld

QUEUE = "geo-orders"


class EmoError(RuntimeError):
    """The edge answered an error status."""


class EmoClient:
    """The EmoDB face (`/queue/1`) of one region's edge."""

    def __init__(self, world: GeoWorld, region: str, role: str = "producer", timeout: float = 30.0) -> None:
        self.region = region
        self.url = world.edge_url(region).rstrip("/")
        context = ssl.create_default_context(cafile=str(world.edge_ca(region)))
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=timeout),
            headers={headers.API_KEY: world.credential(role).secret},
        )

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> EmoClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        async with self.session.request(method, f"{self.url}/queue/1/{path}", **kwargs) as response:
            body = await response.read()
            if response.status != 200:
                raise EmoError(f"{method} {path}: {response.status} {body[:200]!r}")
            return await response.json() if body else None

    async def send(self, queue: str, group: str, payload: Any) -> float:
        """One send; the seconds it took, as this client saw it."""
        started = time.perf_counter()
        await self._call("POST", f"{queue}/send", params={"group": group}, json=payload)
        return time.perf_counter() - started

    async def poll(self, queue: str, *, limit: int = 50, ttl: float = 10.0, wait: float = 0.5) -> list[Any]:
        found = await self._call(
            "GET", f"{queue}/poll", params={"limit": limit, "ttl": f"{ttl:g}", "wait": f"{wait:g}"}
        )
        return found if isinstance(found, list) else []

    async def ack(self, queue: str, message_ids: list[str]) -> None:
        """Acknowledge a poll's messages in one call (by id, as a plain EmoDB client does: the edge checks
        that this credential holds them)."""
        if message_ids:
            await self._call("POST", f"{queue}/ack", json=message_ids)


FAILURES = (EmoError, aiohttp.ClientError, TimeoutError, OSError)


@dataclass
class Producer:
    """Sends `{"i": n}` to `group` through `client`, every `interval` seconds, until stopped."""

    client: EmoClient
    group: str
    queue: str = QUEUE
    interval: float = 0.1
    sent: int = 0  # every i below it was acknowledged by the edge
    retries: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (monotonic when done, seconds)
    errors: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"geo-producer-{self.group}")

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                seconds = await self.client.send(self.queue, self.group, {"i": self.sent})
            except FAILURES as exc:
                self.retries += 1  # the same i again: it may have been stored (a duplicate, never a loss)
                self.errors.append(str(exc)[:200])
                await asyncio.sleep(0.2)
                continue
            self.latencies.append((time.monotonic(), seconds))
            self.sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 60.0)

    def median_since(self, since: float) -> float:
        """The median seconds of the sends that ended at `since` (monotonic) or later."""
        return statistics.median(seconds for at, seconds in self.latencies if at >= since)

    async def sends(self, count: int, within: float = 60.0) -> list[float]:
        """The seconds of the next `count` successful sends (waits for them, bounded)."""
        first = len(self.latencies)
        deadline = time.monotonic() + within
        while len(self.latencies) < first + count:
            if time.monotonic() > deadline:
                raise EmoError(
                    f"the producer of {self.group} made {len(self.latencies) - first} of {count} sends in "
                    f"{within:g}s; last errors: {self.errors[-2:]}"
                )
            await asyncio.sleep(0.05)
        return [seconds for _, seconds in self.latencies[first : first + count]]


class Consumer:
    """Polls and acks `queue` from one edge all along; the `i`s of each group in the order delivered."""

    def __init__(self, client: EmoClient, queue: str = QUEUE) -> None:
        self.client = client
        self.queue = queue
        self.received: dict[str, list[int]] = {}
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._got = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"geo-consumer-{client.region}")

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                messages = await self.client.poll(self.queue)
                for message in messages:
                    group = str(message.get("group"))
                    self.received.setdefault(group, []).append(int(message["payload"]["i"]))
                    self._got.set()
                await self.client.ack(self.queue, [str(message["id"]) for message in messages])
            except FAILURES as exc:  # a move under way or the queue not created yet: poll again
                self.errors.append(str(exc)[:200])
                await asyncio.sleep(0.2)

    def missing(self, sent: dict[str, int]) -> int:
        return sum(len(set(range(n)) - set(self.received.get(g, []))) for g, n in sent.items())

    async def received_all(self, sent: dict[str, int], within: float) -> bool:
        """Until every `i` below `sent[group]` of each group has come (or `within` seconds)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while self.missing(sent):
                    self._got.clear()
                    await self._got.wait()
        return not self.missing(sent)

    async def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._task, 60.0)


@dataclass(frozen=True)
class Order:
    lost: int
    out_of_order: int  # messages first delivered after a later message of their group was
    duplicates: int  # deliveries of a message delivered before (a retried send, a redelivery)

    @classmethod
    def of(cls, received: list[int], sent: int) -> Order:
        out_of_order = 0
        highest = -1
        seen: set[int] = set()
        for i in received:
            if i not in seen and i < highest:
                out_of_order += 1
            seen.add(i)
            highest = max(highest, i)
        return cls(
            lost=len(set(range(sent)) - set(received)),
            out_of_order=out_of_order,
            duplicates=len(received) - len(set(received)),
        )

    @classmethod
    def total(cls, orders: Iterable[Order]) -> Order:
        orders = list(orders)
        return cls(
            lost=sum(o.lost for o in orders),
            out_of_order=sum(o.out_of_order for o in orders),
            duplicates=sum(o.duplicates for o in orders),
        )


def quantile_ms(seconds: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of `seconds`, in ms."""
    if not seconds:
        return float("nan")
    ordered = sorted(seconds)
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank] * 1000.0


async def wait_for_owner_region(world: GeoWorld, partition: int, region: str, within: float) -> None:
    """Until `partition` is owned in `region` (bounded); GeoError with `strictq cluster plan`'s view else."""
    deadline = time.monotonic() + within
    found = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # JetStream electing a leader: look again
            found = await world.owner_region(partition)
            if found == region:
                return
        await asyncio.sleep(0.25)
    plan = await world.plan()
    raise GeoError(
        f"partition {partition} not owned in {region} within {within:g}s (now: {found or 'none'}); "
        f"strictq cluster plan:\n{plan}"
    )


async def placement_history(world: GeoWorld) -> tuple[MoveRecord, ...]:
    """The placement moves recorded in the cluster (the master's and `plan --apply`'s), oldest first."""
    assert world.nc is not None, "the world is not started"
    js = world.nc.jetstream()
    layout = await read_layout(js)
    if layout is None:
        raise GeoError("strictq geo: the cluster has no layout yet")
    _, history = await read_placement(js, layout)
    return history
