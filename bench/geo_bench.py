"""The geography scenario (issue 16): send latency per region before and after placement, follow-the-sun.

On a simulated world (strictq.geo_sim.GeoWorld: eu, us and ap, each with a JetStream server, a queue
server and an edge; the edge -> owner links delayed by user-space relays, 40 ms eu<->us, 90 ms us<->ap,
120 ms eu<->ap one way):

1. One producer per region, each through its own region's edge, each sending to its own group; the groups
   are picked so each region's traffic lands on a different partition (region i -> partition i). Every
   partition is first moved to eu by an operator's move (`strictq cluster move`). Each producer sends
   back to back (one send in flight); p50/p99 of its sends are measured per region.
2. Placement by traffic is turned on (`strictq cluster placement --traffic`, a short hold); the master
   moves each partition to the region its sends come from. The time until every partition is owned in
   its producers' region, and the moves recorded, are reported; then p50/p99 per region again, and the
   ratios.
3. Follow-the-sun: a schedule (00:00=eu, 08:00=us, 16:00=ap) over compressed days while the three
   producers keep sending: the moves made per simulated day, and each region's send latency over the days
   (a region pays the WAN while the sun is elsewhere: that is what a schedule trades).
4. A worker (eu's edge) has polled the queue all along; at the end every acknowledged send must have been
   received (compared message by message: 0 lost) in its group's order (0 order violations).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from scenarios.geo_clients import Consumer, EmoClient, Order, Producer, placement_history, quantile_ms
from strictq.geo_sim import GeoWorld

from .scenarios import Progress, Settings, measured, provenance

ORIGIN = "eu"  # every partition is owned here before placement
SCHEDULE = "00:00=eu,08:00=us,16:00=ap"
TRAFFIC_WINDOW = 5.0  # the edges' --traffic-window
HOLD = 2.0  # placement's --hold for the traffic phase (300 s by default)
COOLDOWN = 60.0  # traffic phase: no partition moves twice while measured
MOVE_WITHIN = 120.0
DRAIN_WITHIN = 90.0
SEND_INTERVAL = 0.02  # between one producer's sends (one in flight at a time)


def run_geo_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    sends = 40 if st.quick else 150  # per region per measurement
    day = 30.0 if st.quick else 40.0
    days = 1 if st.quick else 2
    progress(
        f"geo: 3 simulated regions (GeoWorld), one producer per region; {sends} sends per region before and"
        f" after placement by traffic; follow-the-sun over {days} day(s) of {day:g} s"
    )
    started = time.perf_counter()
    result = asyncio.run(_run(st, progress, sends, day, days))
    result.update(provenance(st, started))
    return result


def _figures(seconds: list[float]) -> dict[str, Any]:
    return {"n": len(seconds), "p50_ms": quantile_ms(seconds, 0.5), "p99_ms": quantile_ms(seconds, 0.99)}


async def _measure(producers: dict[str, Producer], sends: int) -> dict[str, list[float]]:
    """The next `sends` send latencies of every region's producer, measured at the same time."""
    found = await asyncio.gather(*(p.sends(sends, 180.0) for p in producers.values()))
    return dict(zip(producers, found, strict=True))


async def _owner_regions(world: GeoWorld) -> dict[int, str]:
    """partition -> the region of the node serving it ("" none)."""
    view = await world.view()
    regions: dict[int, str] = {}
    for p in view.partitions:
        node = view.node(p.owner) if p.owner is not None and p.serving else None
        regions[p.partition] = node.region if node is not None else ""
    return regions


async def _until(check: Callable[[], Any], within: float, what: str) -> float:
    """Poll `check()` (async, truthy when done) every 0.25 s; the seconds it took. RuntimeError after
    `within` seconds."""
    began = time.monotonic()
    while True:
        with contextlib.suppress(Exception):  # JetStream electing a leader: look again
            if await check():
                return time.monotonic() - began
        if time.monotonic() - began > within:
            raise RuntimeError(f"geo: {what} did not happen within {within:g}s")
        await asyncio.sleep(0.25)


async def _run(st: Settings, progress: Progress, sends: int, day: float, days: int) -> dict[str, Any]:
    world = GeoWorld(st.work_dir / "geo", traffic_window=TRAFFIC_WINDOW)
    async with contextlib.AsyncExitStack() as stack:
        progress("geo: starting the world (3 JetStream servers, 3 queue servers, 3 edges, 6 relays)")
        await world.start()
        stack.push_async_callback(world.close)
        regions = list(world.regions)
        home = {region: i for i, region in enumerate(regions)}  # region -> the partition it sends to
        groups = {region: world.group_in(home[region], f"{region}-orders") for region in regions}
        for partition in range(world.partitions):
            await world.move(partition, ORIGIN)
        progress(f"geo: every partition owned in {ORIGIN}; producers start")

        producers: dict[str, Producer] = {}
        for region in regions:
            client = await stack.enter_async_context(EmoClient(world, region))
            producers[region] = Producer(client, groups[region], interval=SEND_INTERVAL)
        worker = await stack.enter_async_context(EmoClient(world, ORIGIN, "worker"))
        consumer = Consumer(worker)
        stack.push_async_callback(consumer.stop)  # first, on the way out (stopping twice is harmless)
        for producer in producers.values():
            producer.start()
        try:
            await asyncio.gather(*(p.sends(3) for p in producers.values()))  # the queue is created
            before = await _measure(producers, sends)
            progress(
                "geo: before placement: "
                + ", ".join(f"{r} p50 {quantile_ms(before[r], 0.5):.0f} ms" for r in regions)
            )

            placed_at = time.time()
            await world.set_policy("traffic", hold=HOLD, cooldown=COOLDOWN, max_moves_per_hour=100)

            async def placed() -> bool:
                owners = await _owner_regions(world)
                return all(owners[home[r]] == r for r in regions)

            took = await _until(placed, MOVE_WITHIN, "every partition owned in its producers' region")
            traffic_moves = [r for r in await placement_history(world) if r.at >= placed_at]
            progress(f"geo: placed in {took:.1f} s ({len(traffic_moves)} moves)")
            after = await _measure(producers, sends)
            progress(
                "geo: after placement: "
                + ", ".join(f"{r} p50 {quantile_ms(after[r], 0.5):.0f} ms" for r in regions)
            )

            sun = await _follow_the_sun(world, producers, home, progress, day, days)
        finally:
            with contextlib.suppress(Exception):
                await world.set_policy("off")
            for producer in producers.values():
                await producer.stop()

        sent = {p.group: p.sent for p in producers.values()}
        progress(f"geo: {sum(sent.values())} sends acknowledged; draining")
        await consumer.received_all(sent, DRAIN_WITHIN)
        await consumer.stop()
        orders = {g: Order.of(consumer.received.get(g, []), n) for g, n in sent.items()}
        total = Order.total(orders.values())
        progress(f"geo: lost {total.lost}, order violations {total.out_of_order}")
        return {
            "regions": regions,
            "delays_ms": {f"{a}-{b}": round(s * 1000, 1) for (a, b), s in world.delays.items()},
            "partitions": world.partitions,
            "origin": ORIGIN,
            "groups": groups,
            "home": home,
            "sends": sends,
            "traffic_window": TRAFFIC_WINDOW,
            "hold": HOLD,
            "before": {r: _figures(before[r]) for r in regions},
            "after": {r: _figures(after[r]) for r in regions},
            "placed_s": took,
            "traffic_moves": [
                {"partition": m.partition, "from": m.from_region, "to": m.to_region, "reason": m.reason}
                for m in traffic_moves
            ],
            "sun": sun,
            "sent": sum(sent.values()),
            "received": sum(len(consumer.received.get(g, [])) for g in sent),
            "lost": total.lost,
            "order_violations": total.out_of_order,
            "duplicates": total.duplicates,
            "retries": sum(p.retries for p in producers.values()),
        }
    raise AssertionError("unreachable")  # the exit stack does not swallow exceptions


async def _follow_the_sun(
    world: GeoWorld,
    producers: dict[str, Producer],
    home: dict[str, int],
    progress: Progress,
    day: float,
    days: int,
) -> dict[str, Any]:
    """The schedule over `days` compressed days: moves per day, owner regions seen, latency per region,
    and the share of the time each region's partition was owned in that region (looked at every 0.25 s)."""
    await world.set_policy("off")  # traffic placement stops; the schedule starts its day when set
    began = time.time()
    policy = await world.set_policy(
        "schedule", schedule=SCHEDULE, day_seconds=day, hold=1, cooldown=2, max_moves_per_hour=1000
    )
    origin = float(policy.get("day_origin", began))
    marks = {r: len(p.latencies) for r, p in producers.items()}
    routes: dict[int, list[str]] = {}
    looks = 0
    near = dict.fromkeys(producers, 0)
    end = origin + days * day
    last = 0.0
    while time.time() < end:
        with contextlib.suppress(Exception):  # JetStream electing a leader: look again
            owners = await _owner_regions(world)
            for partition, region in owners.items():
                route = routes.setdefault(partition, [])
                if region and (not route or route[-1] != region):
                    route.append(region)
            looks += 1
            for region in producers:
                near[region] += owners.get(home[region]) == region
        if time.monotonic() - last >= 10.0:
            last = time.monotonic()
            progress(f"geo: follow-the-sun day {int((time.time() - origin) // day) + 1} of {days}")
        await asyncio.sleep(0.25)
    history = [r for r in await placement_history(world) if r.at >= began]
    per_day = [0] * days
    for record in history:
        index = int((record.at - origin) // day)
        if 0 <= index < days:
            per_day[index] += 1
    latencies = {r: [s for _, s in p.latencies[marks[r] :]] for r, p in producers.items()}
    progress(f"geo: follow-the-sun moves per day {per_day}")
    return {
        "schedule": SCHEDULE,
        "day_seconds": day,
        "days": days,
        "moves_per_day": per_day,
        "routes": {str(p): route for p, route in sorted(routes.items())},
        "latency": {r: _figures(s) for r, s in latencies.items()},
        "near_share": {r: near[r] / looks if looks else 0.0 for r in producers},
    }


# ---------------------------------------------------------------------------------------- report
def geo_section(results: dict[str, Any], add: Callable[[str], None]) -> None:
    """The report's geography section (bench/report.py calls it; nothing when the scenario did not run).
    It carries its own machine, code and command line: `--splice` may put it beside older sections."""
    r = results.get("geo")
    if not r:
        return
    regions = r["regions"]
    delays = ", ".join(f"{pair.replace('-', '<->')} {ms:g} ms" for pair, ms in r["delays_ms"].items())
    add("## Regions and placement (simulated WAN, `strictq.geo_sim`)\n")
    add(measured(r) + f". The scenario took {r['seconds']:.0f} s.\n")
    add(
        f"A `GeoWorld` on loopback: regions {', '.join(regions)}, each with a JetStream server, a queue"
        f" server and an edge (`strictq serve --cluster ... --region R --reach ...`); {r['partitions']}"
        f" partitions at R3. Simulated one-way delays (user-space relays on the edge -> owner links only;"
        f" clients reach their own region's edge over loopback): {delays}. One producer per region, through"
        f" its region's edge, the EmoDB face over HTTPS, one send in flight, each region's group in its own"
        f" partition ({', '.join(f'{reg} -> partition {p}' for reg, p in r['home'].items())}). Every"
        f" partition is first moved to {r['origin']}; then `strictq cluster placement --traffic --hold"
        f" {r['hold']:g}` (edges' traffic window {r['traffic_window']:g} s). {r['sends']} sends per region"
        " per figure; p99 is the nearest-rank 99th percentile of those sends. Each EmoDB send is two calls"
        " from the edge to an owner: the face's read of the queue's attributes (any partition's owner can"
        " answer it; the edge asks one in its own region first) and the send to the group's partition; with"
        " every partition in the far region both cross the link, so *before* is about two round trips.\n"
    )
    add("### Send latency per region, before and after placement by traffic\n")
    add(
        f"| producer's region | one-way delay to {r['origin']} | p50 before | p99 before | p50 after |"
        " p99 after | p50 ratio | p99 ratio |\n|---|---|---|---|---|---|---|---|"
    )
    for reg in regions:
        b, a = r["before"][reg], r["after"][reg]
        pair = r["delays_ms"].get(f"{reg}-{r['origin']}", r["delays_ms"].get(f"{r['origin']}-{reg}", 0))
        add(
            f"| {reg} | {pair:g} ms | {b['p50_ms']:.1f} ms | {b['p99_ms']:.1f} ms | {a['p50_ms']:.1f} ms"
            f" | {a['p99_ms']:.1f} ms | {_ratio(b['p50_ms'], a['p50_ms'])}"
            f" | {_ratio(b['p99_ms'], a['p99_ms'])} |"
        )
    moves = "; ".join(
        f"partition {mv['partition']} {mv['from']} -> {mv['to']} ({mv['reason']})"
        for mv in r["traffic_moves"]
    )
    add(
        f"\nRatio = before / after. Every partition was owned in its producers' region {r['placed_s']:.1f} s"
        f" after placement was turned on (the reports every second, the {r['hold']:g} s hold, the planned"
        f" moves); {len(r['traffic_moves'])} moves: {moves or 'none'}.\n"
    )
    sun = r["sun"]
    add(f"### Follow-the-sun ({sun['schedule']}, a {sun['day_seconds']:g} s day, {sun['days']} day(s))\n")
    routes = "; ".join(f"partition {p}: {' -> '.join(route)}" for p, route in sun["routes"].items())
    add(
        f"Moves per simulated day: {', '.join(str(n) for n in sun['moves_per_day'])} (a whole day moves each"
        f" partition at each of the schedule's steps; on the first day the 00:00 step moves only the"
        f" partitions not yet in its region). Owner regions seen: {routes}.\n"
    )
    add("| producer's region | time its partition was owned in its region | sends | p50 | p99 |")
    add("|---|---|---|---|---|")
    for reg in regions:
        f = sun["latency"][reg]
        share = sun["near_share"][reg]
        add(f"| {reg} | {share:.0%} | {f['n']:,} | {f['p50_ms']:.1f} ms | {f['p99_ms']:.1f} ms |")
    add(
        "\nWith the schedule every partition follows the sun, so each region's producer is near its"
        " partition's owner for about a third of the day and pays the WAN for the rest: a schedule follows"
        " an expected peak, placement by traffic the measured one. The producers send one at a time, so"
        " while near they make many more sends than while far: p50 and p99 are over sends (the near"
        " ones dominate the count), the time share is over the day.\n"
    )
    add(
        f"Messages: {r['sent']:,} sends acknowledged, {r['received']:,} received by a worker polling all"
        " along"
        f" (compared message by message); **lost {r['lost']}**, **order violations {r['order_violations']}**,"
        f" duplicates {r['duplicates']} (sends retried {r['retries']}).\n"
    )


def _ratio(before: float, after: float) -> str:
    return f"{before / after:.1f}x" if after > 0 else "—"
