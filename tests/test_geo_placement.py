"""Issue 16's scenarios on three simulated regions (strictq.geo_sim): real JetStream servers, a queue server
and an edge per region, the inter-region links delayed by user-space relays (eu<->us 40 ms, us<->ap 90 ms,
eu<->ap 120 ms one way).

- A producer in us sends to a group whose partition is owned in eu: every send pays the eu<->us round
  trip on the edge -> owner link. Placement by traffic moves the partition to us: the sends get faster by
  about that round trip, and the group's messages arrive complete and in order across the move.
- Follow-the-sun over a compressed day: a schedule moves a partition eu -> us -> ap -> eu while a producer
  sends and a worker consumes all along: nothing lost, nothing out of order.

The group is chosen in partition 0 on purpose: the faces read the queue's attributes on one partition's
owner before each send (cluster.backend `_any` asks the partitions owned in the edge's region first, then
the rest in order, partition 0 first), so with every partition in eu and the group's partition being
partition 0, every send before the move touches one owner only and its latency is that owner's link.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from geo_support import (
    Consumer,
    EmoClient,
    Order,
    Producer,
    drain,
    geo_world,
    wait_for_owner_region,
)

from strictq.geo_sim import GeoWorld, one_way, parse_delays

pytestmark = [pytest.mark.xdist_group("geo")]
# The world's tests share its event loop (the relays run on it); its start (9 processes) counts toward the
# first one's time.
ON_THE_WORLD = pytest.mark.asyncio(loop_scope="module")
WORLD_TIMEOUT = pytest.mark.timeout(300)
__all__ = ["geo_world"]  # the fixture, imported by name

SENDS = 15  # sends per latency measurement (their median)
MOVE_WITHIN = 60.0


async def sends_after(producer: Producer, count: int, within: float = 60.0) -> float:
    """Until the producer has made `count` more successful sends (bounded); when they began."""
    began = time.monotonic()
    target = producer.sent + count
    deadline = began + within
    while producer.sent < target:
        assert time.monotonic() < deadline, f"the producer made {producer.sent} sends: {producer.errors[-3:]}"
        await asyncio.sleep(0.05)
    return began


@ON_THE_WORLD
@WORLD_TIMEOUT
async def test_traffic_placement_moves_the_partition_to_its_producers_region(geo_world: GeoWorld) -> None:
    world = geo_world
    partition = 0
    group = world.group_in(partition, "orders")
    await world.move(partition, "eu")
    assert await world.owner_region(partition) == "eu"
    relay = world.relay("us", "eu")
    through_relay = relay.stats.bytes_up

    async with EmoClient(world, "us") as sending, EmoClient(world, "us", "worker") as working:
        producer = Producer(sending, group)
        producer.start()
        try:
            await sends_after(producer, 3)  # the first send creates the queue on every partition
            before_since = await sends_after(producer, SENDS)
            before = producer.median_since(before_since)
            assert relay.stats.bytes_up > through_relay, "the us edge did not reach eu through its relay"

            await world.set_policy("traffic", hold=1, cooldown=2, max_moves_per_hour=100)
            await wait_for_owner_region(world, partition, "us", MOVE_WITHIN)
            after_since = await sends_after(producer, SENDS)
            after = producer.median_since(after_since)
        finally:
            await producer.stop()
            await world.set_policy("off")

        round_trip = 2 * world.delay("eu", "us")
        print(f"median send from us: {before * 1000:.0f} ms owned in eu, {after * 1000:.0f} ms owned in us")
        assert before - after >= 0.5 * round_trip, (
            f"median send {before * 1000:.0f} ms while owned in eu, {after * 1000:.0f} ms in us: "
            f"expected a drop of about {round_trip * 1000:.0f} ms"
        )
        received = await drain(working, group, producer.sent)
    order = Order.of(received, producer.sent)
    assert order.lost == 0, f"{order.lost} of {producer.sent} lost"
    assert order.out_of_order == 0, f"order of {group} broken: {received}"
    assert order.duplicates <= producer.retries


@ON_THE_WORLD
@WORLD_TIMEOUT
async def test_follow_the_sun_moves_a_partition_round_the_world(geo_world: GeoWorld) -> None:
    world = geo_world
    partition = 1
    group = world.group_in(partition, "sun")
    day = 30.0  # a compressed day: eu from 00:00, us from 08:00, ap from 16:00 (10 s each)
    async with (
        EmoClient(world, "us") as sending,
        EmoClient(world, "eu", "worker") as working,
    ):
        producer = Producer(sending, group)
        producer.start()
        consumer = Consumer(working)
        seen: list[str] = []
        try:
            await sends_after(producer, 3)
            await world.set_policy(
                "schedule",
                schedule="00:00=eu,08:00=us,16:00=ap",
                day_seconds=day,
                hold=1,
                cooldown=2,
                max_moves_per_hour=1000,
            )
            deadline = time.monotonic() + 2 * day + 30
            while not _in_order(seen, ["eu", "us", "ap", "eu"]):
                assert time.monotonic() < deadline, f"owner regions of partition {partition}: {seen}"
                with contextlib.suppress(Exception):  # JetStream electing a leader: look again
                    region = await world.owner_region(partition)
                    if region and (not seen or seen[-1] != region):
                        seen.append(region)
                await asyncio.sleep(0.25)
        finally:
            await world.set_policy("off")
            await producer.stop()
        await consumer.received_all({group: producer.sent}, within=60.0)
        await consumer.stop()
    received = consumer.received.get(group, [])
    order = Order.of(received, producer.sent)
    print(f"owner regions {seen}; {producer.sent} sent, {len(received)} received, {order}")
    assert producer.sent > 50, f"the producer made only {producer.sent} sends: {producer.errors[-3:]}"
    assert order.lost == 0, f"{order.lost} of {producer.sent} lost (consumer errors {consumer.errors[-3:]})"
    assert order.out_of_order == 0, f"order of {group} broken: {received}"
    assert order.duplicates <= producer.retries


def _in_order(seen: list[str], wanted: list[str]) -> bool:
    """`wanted` occurs in `seen` as consecutive owner regions."""
    return any(seen[i : i + len(wanted)] == wanted for i in range(len(seen) - len(wanted) + 1))


def test_delays_parse_in_ms_or_seconds_and_name_a_bad_item() -> None:
    delays = parse_delays("eu-us=40ms, us-ap=0.09s,eu-ap=0.12")
    assert delays == {("eu", "us"): 0.04, ("us", "ap"): 0.09, ("eu", "ap"): 0.12}
    assert one_way(delays, "us", "eu") == 0.04 and one_way(delays, "ap", "ap") == 0.0
    for bad, named in (("eu-us=fast", "'eu-us=fast'"), ("eu-eu=1ms", "itself"), ("eu=4ms", "'eu=4ms'")):
        with pytest.raises(ValueError, match=named):
            parse_delays(bad)


def test_a_world_needs_a_delay_for_every_pair_of_regions(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="between regions us and ap"):
        GeoWorld(tmp_path, regions=("eu", "us", "ap"), delays={("eu", "us"): 0.04, ("eu", "ap"): 0.1})
