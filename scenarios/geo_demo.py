"""`strictq demo --geo` (`make demo DEMO_ARGS=--geo`): regions, edges and placement on one machine, narrated.

It starts a simulated world (strictq.geo_sim.GeoWorld): three regions, eu, us and ap, each with a
JetStream server, a queue server and an edge, the links between regions delayed in user space (40 ms
eu<->us, 90 ms us<->ap, 120 ms eu<->ap, one way). Then:

1. a producer in us sends to a group whose partition is first moved to eu (`strictq cluster move`): its
   sends are measured (p50/p99), each paying the us<->eu round trip on the edge -> owner link;
2. `strictq cluster plan` shows the move placement would make and why (the latency saved, the risk);
3. placement by traffic is turned on (`strictq cluster placement --traffic`, a short hold); the partition
   moves to us, `strictq cluster status` shows it, and the sends are measured again (the ratio);
4. follow-the-sun over a compressed day (`--schedule 00:00=eu,08:00=us,16:00=ap --day-seconds 30..45`):
   the partitions' owners go eu -> us -> ap -> eu while another producer sends all along;
5. a worker has polled the queue all along: every message of every group came, in order.

It ends with a summary and exits 0 only if nothing was lost and no group went out of order. `--fast`
shortens it (what the CI test runs); `--keep` keeps the data directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from cluster.nats_servers import NatsClusterError
from strictq.geo_sim import GeoError, GeoWorld
from wirelog.files import StartupError, private_dir, restrict_umask

from .geo_clients import (
    Consumer,
    EmoClient,
    EmoError,
    Order,
    Producer,
    placement_history,
    quantile_ms,
    wait_for_owner_region,
)

SHOWN_LINES = 30  # of a command's output
SCHEDULE = "00:00=eu,08:00=us,16:00=ap"
SUN_ROUTE = ["eu", "us", "ap", "eu"]
TICK = 5.0  # seconds between progress lines while waiting
MOVE_WITHIN = 90.0  # the traffic move: reports (1 s), the hold, the move itself
PLAN_WITHIN = 30.0  # until the plan has measured the producer's traffic
DRAIN_WITHIN = 60.0


class DemoFailed(RuntimeError):
    """A step did not happen in time: the message says which and what was seen."""


def cmd_geo_demo(args: argparse.Namespace) -> int:
    """`strictq demo --geo`: the data dir, the log file, then the story."""
    created = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="strictq-demo-geo-")) if created else args.data_dir
    restrict_umask()
    private_dir(data_dir)
    logging.basicConfig(
        filename=data_dir / "demo.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = asyncio.run(GeoDemo(data_dir, fast=args.fast).run())
    except KeyboardInterrupt:
        code = 130
    if args.keep or not created or code != 0:
        print(f"\nthe demo's data (logs of every process) is in {data_dir}", flush=True)
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    return code


class GeoDemo:
    def __init__(self, data_dir: Path, *, fast: bool) -> None:
        self.data_dir = data_dir
        self.fast = fast
        self.sends = 20 if fast else 50  # per latency measurement
        self.day = 30.0 if fast else 45.0  # the compressed day's seconds
        self.window = 3.0  # the edges' traffic window
        self.started = time.monotonic()
        self.sections = 0
        self.world: GeoWorld | None = None

    # -- narration ---------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def section(self, title: str) -> None:
        self.sections += 1
        print(f"\n== {self.sections}. {title}", flush=True)

    @contextlib.asynccontextmanager
    async def ticking(self, what: str) -> AsyncIterator[None]:
        """A progress line every TICK seconds while the block runs."""
        began = time.monotonic()

        async def tick() -> None:
            while True:
                await asyncio.sleep(TICK)
                self.say(f"  ... {what} ({time.monotonic() - began:.0f} s)")

        task = asyncio.create_task(tick())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def cluster(self, *args: str, within: float = 90.0, show: bool = True) -> str:
        """`strictq cluster ARGS` as an operator runs it (the world's --cluster and --nats-credentials are
        added, not shown); its output shown indented. DemoFailed on a non-zero exit."""
        world = self.world
        assert world is not None
        if show:
            print(f"$ strictq cluster {shlex.join(args)}", flush=True)
        done = await world.cli("cluster", *args, *world.cluster_args(), within=within)
        out = (done.stdout + done.stderr).rstrip()
        if show:
            lines = [line for line in out.splitlines() if line.strip()]
            for line in lines[:SHOWN_LINES]:
                print(f"  {line}", flush=True)
            if len(lines) > SHOWN_LINES:
                print(f"  ... ({len(lines) - SHOWN_LINES} more lines)", flush=True)
        if done.returncode != 0:
            raise DemoFailed(f"`strictq cluster {' '.join(args)}` exited {done.returncode}: {out[-300:]}")
        return done.stdout

    # -- the story ---------------------------------------------------------------------------------------
    async def run(self) -> int:
        print(
            f"strictq demo --geo: regions, edges and placement on one machine (data in {self.data_dir})",
            flush=True,
        )
        world = GeoWorld(self.data_dir / "world", traffic_window=self.window)
        self.world = world
        try:
            self.section("the world: three regions on one machine")
            self.say(
                "starting a JetStream server, a queue server and an edge in each of eu, us and ap, and the "
                "simulated links between them"
            )
            async with self.ticking("starting the world"):
                await world.start()
            self.describe(world)
            return await self.story(world)
        except (StartupError, NatsClusterError) as exc:  # no nats-server, or it would not start
            message = " ".join(str(exc).split())
            print(f"strictq: demo --geo: {message}", file=sys.stderr, flush=True)
            return 2
        except (DemoFailed, GeoError, EmoError) as exc:
            print(f"\nstrictq demo --geo: the scenario stopped: {exc}", flush=True)
            return 1
        finally:
            self.say("stopping the world")
            await world.close()

    def describe(self, world: GeoWorld) -> None:
        for region in world.regions:
            self.say(
                f"{region}: queue server {region} at {world.node_url(region)}, edge edge-{region} at "
                f"{world.edge_url(region)}"
            )
        regions = world.regions
        for i, a in enumerate(regions):
            for b in regions[i + 1 :]:
                ms = world.delay(a, b) * 1000
                self.say(
                    f"link {a}<->{b}: {ms:.0f} ms one way, {2 * ms:.0f} ms round trip (relays: edge-{a} -> "
                    f"node {b} at {world.relay_url(a, b)}, edge-{b} -> node {a} at {world.relay_url(b, a)})"
                )
        self.say(
            "simulated: the edge -> owner link only (a delaying TCP relay per pair: this kernel has no "
            "netem); clients reach their own region's edge, and nodes JetStream, over plain loopback"
        )

    async def story(self, world: GeoWorld) -> int:
        await self.cluster("status")
        partition = 0
        group = world.group_in(partition, "orders")
        sun_partition = 1
        sun_group = world.group_in(sun_partition, "sun")

        self.section("a producer in us, its group owned in eu")
        self.say(f"group {group} hashes to partition {partition}; an operator moves it to eu first")
        await self.cluster("move", str(partition), "eu", "--wait", "60", within=120.0)
        async with (
            EmoClient(world, "us") as us_producer,
            EmoClient(world, "eu") as eu_producer,
            EmoClient(world, "us", "worker") as us_worker,
        ):
            producer = Producer(us_producer, group)
            producer.start()
            consumer = Consumer(us_worker)
            sun = Producer(eu_producer, sun_group, interval=0.2)
            producers = [producer, sun]
            try:
                self.say(f"a producer using the us edge sends to {group}; a worker in us polls the queue")
                await producer.sends(3)  # the first send creates the queue in every partition
                before = await producer.sends(self.sends)
                round_trip = 2 * world.delay("us", "eu") * 1000
                self.say(
                    f"{len(before)} sends from us: p50 {quantile_ms(before, 0.5):.0f} ms, p99 "
                    f"{quantile_ms(before, 0.99):.0f} ms: each crosses the us -> eu link and back "
                    f"({round_trip:.0f} ms of simulated round trip)"
                )
                await self.plan(partition)
                await self.traffic_placement(world, partition)

                self.section("the same producer, measured again")
                after = await producer.sends(self.sends)
                b50, b99 = quantile_ms(before, 0.5), quantile_ms(before, 0.99)
                a50, a99 = quantile_ms(after, 0.5), quantile_ms(after, 0.99)
                self.say(
                    f"{len(after)} sends from us: p50 {a50:.0f} ms, p99 {a99:.0f} ms (owned in eu: p50 "
                    f"{b50:.0f} ms, p99 {b99:.0f} ms): {b50 / a50:.1f}x faster at the median"
                )
                latency = (
                    f"send latency from us to {group}: p50 {b50:.0f} ms / p99 {b99:.0f} ms owned in eu, "
                    f"p50 {a50:.0f} ms / p99 {a99:.0f} ms owned in us ({b50 / a50:.1f}x faster; the "
                    f"simulated us<->eu round trip is {round_trip:.0f} ms)"
                )

                sun.start()
                seen, moves = await self.follow_the_sun(world, sun_partition)
            finally:
                with contextlib.suppress(Exception):
                    await world.cli("cluster", "placement", "--off", *world.cluster_args())
                for each in producers:
                    await each.stop()

            self.section("every message, in order")
            sent = {p.group: p.sent for p in producers if p.sent}
            self.say(f"the producers stopped: {sum(sent.values())} sends acknowledged; the worker drains")
            async with self.ticking("the worker draining"):
                await consumer.received_all(sent, DRAIN_WITHIN)
            await consumer.stop()
        orders = {g: Order.of(consumer.received.get(g, []), n) for g, n in sent.items()}
        for g, n in sent.items():
            o = orders[g]
            self.say(
                f"{g}: sent {n}, received {len(consumer.received.get(g, []))}, lost {o.lost}, "
                f"out of order {o.out_of_order}, duplicates {o.duplicates}"
            )
        total = Order.total(orders.values())
        retries = sum(p.retries for p in producers)

        self.section("summary")
        received = sum(len(consumer.received.get(g, [])) for g in sent)
        print(
            f"sent {sum(sent.values())} · received {received} · lost {total.lost} · order violations "
            f"{total.out_of_order} · duplicates {total.duplicates} (sends retried {retries})",
            flush=True,
        )
        print(latency, flush=True)
        print(
            f"follow the sun: partition {sun_partition} owned in {' -> '.join(seen)} over a "
            f"{self.day:g} s day; {moves} moves by the schedule",
            flush=True,
        )
        print(f"total {time.monotonic() - self.started:.0f} s", flush=True)
        return 0 if total.lost == 0 and total.out_of_order == 0 else 1

    async def plan(self, partition: int) -> None:
        self.section("what placement would do: strictq cluster plan")
        self.say(
            "every edge reports each second where each partition's sends come from and its round trip to "
            "every node; the plan weighs them"
        )
        world = self.world
        assert world is not None
        deadline = time.monotonic() + PLAN_WITHIN
        async with self.ticking("waiting for the edges' reports to show the producer"):
            while True:
                done = await world.cli("cluster", "plan", "--json", *world.cluster_args())
                with contextlib.suppress(ValueError):
                    found = json.loads(done.stdout) if done.returncode == 0 else {}
                    if any(p.get("partition") == partition for p in found.get("proposals", [])):
                        break
                if time.monotonic() > deadline:
                    raise DemoFailed(
                        f"no proposal for partition {partition} within {PLAN_WITHIN:g}s: {done.stdout[-300:]}"
                    )
                await asyncio.sleep(1.0)
        await self.cluster("plan")
        self.say(
            f"partition {partition}: its sends come from us, so owned in us they would not cross a link; "
            "STATUS ready means `--apply` (or the master, with placement on) would make it now"
        )

    async def traffic_placement(self, world: GeoWorld, partition: int) -> None:
        self.section("placement by traffic, turned on")
        await self.cluster(
            "placement", "--traffic", "--hold", "2", "--cooldown", "10", "--max-moves-per-hour", "100"
        )
        self.say(
            "the master moves a partition once the same region has been the best for --hold seconds (2 s "
            "here; 300 by default): the old owner drains, the new one opens at the next epoch, so the "
            "group's order holds"
        )
        began = time.monotonic()
        async with self.ticking(f"waiting for partition {partition} to move to us"):
            await wait_for_owner_region(world, partition, "us", MOVE_WITHIN)
        took = time.monotonic() - began
        self.say(f"partition {partition} is owned in us {took:.1f} s after placement was turned on")
        await self.cluster("status")

    async def follow_the_sun(self, world: GeoWorld, partition: int) -> tuple[list[str], int]:
        """The schedule over a compressed day; the owner regions `partition` went through, and how many
        moves the schedule made."""
        self.section("follow the sun over a compressed day")
        self.say(
            f"a producer using the eu edge sends to {world.group_in(partition, 'sun')} (partition "
            f"{partition}) all along"
        )
        since = time.time()
        await self.cluster(
            "placement", "--schedule", SCHEDULE, "--day-seconds", f"{self.day:g}",
            "--hold", "1", "--cooldown", "2", "--max-moves-per-hour", "1000",
        )  # fmt: skip
        policy: dict[str, Any] = json.loads(await self.cluster("placement", "--json", show=False))
        origin = float(policy.get("day_origin", since))  # the compressed day began when it was set
        self.say(
            f"a day is {self.day:g} s now: eu owns every partition from 00:00, us from 08:00, ap from 16:00"
        )
        seen: list[str] = []
        owners: dict[int, str] = {}
        deadline = time.monotonic() + 2 * self.day + 30
        last_tick = time.monotonic()
        while not _route_seen(seen, SUN_ROUTE):
            if time.monotonic() > deadline:
                raise DemoFailed(f"partition {partition}'s owner regions over the day: {seen}")
            with contextlib.suppress(Exception):  # JetStream electing a leader: look again
                view = await world.view()
                for p in view.partitions:
                    node = view.node(p.owner) if p.owner is not None and p.serving else None
                    region = node.region if node is not None else ""
                    if region and owners.get(p.partition) != region:
                        if p.partition in owners:
                            self.say(
                                f"{_clock(time.time(), origin, self.day)} of the day: partition "
                                f"{p.partition} moved {owners[p.partition]} -> {region}"
                            )
                        owners[p.partition] = region
                        if p.partition == partition:
                            seen.append(region)
            if time.monotonic() - last_tick >= TICK:
                last_tick = time.monotonic()
                self.say(f"  ... {_clock(time.time(), origin, self.day)} of the day")
            await asyncio.sleep(0.25)
        history = await placement_history(world)
        moves = sum(1 for record in history if record.at >= since)
        self.say(
            f"partition {partition} went {' -> '.join(seen)}; the schedule made {moves} moves "
            "(every partition follows it)"
        )
        await self.cluster("placement", "--off")
        return seen, moves


def _route_seen(seen: list[str], route: list[str]) -> bool:
    """`route` occurs in `seen` as consecutive owner regions."""
    return any(seen[i : i + len(route)] == route for i in range(len(seen) - len(route) + 1))


def _clock(now: float, origin: float, day: float) -> str:
    """The compressed day's time of day, HH:MM."""
    minutes = int(((now - origin) % day) / day * 24 * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"
