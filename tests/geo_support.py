"""The simulated regions of issue 16 for tests: a `GeoWorld` (strictq.geo_sim) and EmoDB-face clients that
run on the world's event loop (the relays run there: nothing here blocks it).

Import the fixture by name (`from geo_support import geo_world`): one world per module (its start-up is
JetStream, three queue servers and three edges), on a module-scoped event loop, so the module's tests
carry `pytestmark = pytest.mark.asyncio(loop_scope="module")`.

The clients are the demo's and the benchmark's (scenarios.geo_clients): `EmoClient(world, region, role)`
(the EmoDB face of the region's edge; `send` returns the call's seconds), `Producer` (sends `{"i": n}` to
one group in a loop, a failed send tried again with the same `i`: a duplicate is possible, a loss is not),
`Consumer` and `Order.of(received, sent)` (lost, out-of-order and duplicate counts). Here: the fixture,
`drain(...)` (polls and acks one group until every `i` sent has been received, bounded) and
`wait_for_owner_region`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from scenarios.geo_clients import (
    QUEUE,
    Consumer,
    EmoClient,
    EmoError,
    Order,
    Producer,
    wait_for_owner_region,
)
from strictq.geo_sim import GeoWorld

TRAFFIC_WINDOW = 2.0  # the edges' traffic window: placement sees a change of producers within seconds
__all__ = [
    "QUEUE",
    "Consumer",
    "EmoClient",
    "EmoError",
    "Order",
    "Producer",
    "drain",
    "geo_world",
    "wait_for_owner_region",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def geo_world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GeoWorld]:
    async with GeoWorld(tmp_path_factory.mktemp("geo") / "world", traffic_window=TRAFFIC_WINDOW) as world:
        try:
            yield world
        finally:
            with contextlib.suppress(Exception):
                await world.set_policy("off")


async def drain(
    client: EmoClient, group: str, sent: int, *, queue: str = QUEUE, within: float = 60.0
) -> list[int]:
    """Poll and ack until every `i` below `sent` of `group` has been received (or `within` runs out); the
    `i`s in the order they were delivered (duplicates included)."""
    received: list[int] = []
    deadline = time.monotonic() + within
    while set(range(sent)) - set(received) and time.monotonic() < deadline:
        messages = await client.poll(queue, limit=10, wait=1.0)
        for message in messages:
            if message.get("group") == group:
                received.append(int(message["payload"]["i"]))
        await client.ack(queue, [str(m["id"]) for m in messages])
    return received


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
