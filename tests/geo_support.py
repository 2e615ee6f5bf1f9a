"""The simulated regions of issue 16 for tests: a `GeoWorld` (strictq.geo_sim) and EmoDB-face clients that
run on the world's event loop (the relays run there: nothing here blocks it).

Import the fixture by name (`from geo_support import geo_world`): one world per module (its start-up is
JetStream, three queue servers and three edges), on a module-scoped event loop, so the module's tests
carry `pytestmark = pytest.mark.asyncio(loop_scope="module")`.

- `EmoClient(world, region, role)`: the EmoDB face of the region's edge (`send` returns the call's
  seconds, `poll`, `ack`);
- `Producer`: sends `{"i": n}` to one group in a loop, recording each send's latency; a failed send is
  tried again with the same `i` (so a duplicate is possible, a loss is not);
- `drain(...)`: polls and acks one group until every `i` sent has been received (bounded);
- `Order.of(received, sent)`: lost, out-of-order and duplicate counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from strictq.geo_sim import GeoWorld

TRAFFIC_WINDOW = 2.0  # the edges' traffic window: placement sees a change of producers within seconds
QUEUE = "geo-orders"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def geo_world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GeoWorld]:
    async with GeoWorld(tmp_path_factory.mktemp("geo") / "world", traffic_window=TRAFFIC_WINDOW) as world:
        try:
            yield world
        finally:
            with contextlib.suppress(Exception):
                await world.set_policy("off")


class EmoError(AssertionError):
    """The edge answered an error status."""


class EmoClient:
    """The EmoDB face (`/queue/1`) of one region's edge, with one credential of the shared key file."""

    def __init__(self, world: GeoWorld, region: str, role: str = "producer", timeout: float = 30.0) -> None:
        self.url = world.edge_url(region).rstrip("/")
        self.key = world.credential(role).secret
        context = ssl.create_default_context(cafile=str(world.edge_ca(region)))
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=timeout),
            headers={"X-BV-API-Key": self.key},
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
                raise EmoError(f"{method} {path}: {response.status} {body[:300]!r}")
            return await response.json() if body else None

    async def send(self, queue: str, group: str, payload: Any) -> float:
        """One send; the seconds it took as this client saw it."""
        started = time.perf_counter()
        await self._call("POST", f"{queue}/send", params={"group": group}, json=payload)
        return time.perf_counter() - started

    async def poll(self, queue: str, *, limit: int = 10, ttl: float = 30.0, wait: float = 1.0) -> list[Any]:
        found = await self._call(
            "GET", f"{queue}/poll", params={"limit": limit, "ttl": f"{ttl:g}", "wait": f"{wait:g}"}
        )
        assert isinstance(found, list)
        return found

    async def ack(self, queue: str, message_id: str, token: int) -> None:
        await self._call("POST", f"{queue}/ack", params={"token": str(token)}, json=[message_id])


@dataclass
class Producer:
    """Sends `{"i": 0}`, `{"i": 1}`, ... to `group`, every `interval` seconds, until stopped."""

    client: EmoClient
    group: str
    queue: str = QUEUE
    interval: float = 0.1
    sent: int = 0  # messages acknowledged by the edge: i in range(sent) were all sent
    retries: int = 0
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (when, seconds)
    errors: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"producer-{self.group}")

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                seconds = await self.client.send(self.queue, self.group, {"i": self.sent})
            except (EmoError, aiohttp.ClientError, TimeoutError) as exc:
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
        return statistics.median(s for t, s in self.latencies if t >= since)


async def drain(
    client: EmoClient, group: str, sent: int, *, queue: str = QUEUE, within: float = 60.0
) -> list[int]:
    """Poll and ack until every `i` below `sent` of `group` has been received (or `within` runs out); the
    `i`s in the order they were delivered (duplicates included)."""
    received: list[int] = []
    deadline = time.monotonic() + within
    while set(range(sent)) - set(received) and time.monotonic() < deadline:
        for message in await client.poll(queue, limit=10, wait=1.0):
            if message.get("group") == group:
                received.append(int(message["payload"]["i"]))
            await client.ack(queue, message["id"], int(message["token"]))
    return received


@dataclass(frozen=True)
class Order:
    lost: int
    out_of_order: int  # deliveries of an i below one delivered before it (excluding exact repeats)
    duplicates: int

    @classmethod
    def of(cls, received: list[int], sent: int) -> Order:
        out_of_order = 0
        highest = -1
        for i in received:
            if i < highest:
                out_of_order += 1
            highest = max(highest, i)
        return cls(
            lost=len(set(range(sent)) - set(received)),
            out_of_order=out_of_order,
            duplicates=len(received) - len(set(received)),
        )


async def wait_for_owner_region(world: GeoWorld, partition: int, region: str, within: float) -> None:
    """Until `partition` is served in `region` (bounded)."""
    deadline = time.monotonic() + within
    found = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # JetStream electing a leader: look again
            found = await world.owner_region(partition)
            if found == region:
                return
        await asyncio.sleep(0.25)
    plan = await world.plan()
    raise AssertionError(
        f"partition {partition} not served in {region} within {within:g}s (now: {found!r}); "
        f"`strictq cluster plan`:\n{plan}"
    )


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
