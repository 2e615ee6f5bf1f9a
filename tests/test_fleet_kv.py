"""The cluster's fleet registry (cluster/fleet_kv.py) with two edges' `ClusterFleet`s in this process over
three real JetStream servers (R3 bucket): what one writes the other reads, and what both do at once
happens once. The whole product through two real edges is tests/test_fleet_cluster.py.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cluster_support import nats3, nats_client  # noqa: F401 -- the module's JetStream servers
from kit.until import until

from cluster.fleet_kv import ClusterFleet, record_from_json, record_to_json, worker_key
from cluster.layout import ClusterLayout
from cluster.nats_servers import NatsCluster
from queue_core.machine.fleet import ControlAck, FleetEvent, Heartbeat, Load

pytestmark = [pytest.mark.xdist_group("cluster"), pytest.mark.timeout(120)]


class Edges:
    def __init__(self, one: ClusterFleet, two: ClusterFleet, events: list[FleetEvent]) -> None:
        self.one, self.two, self.events = one, two, events


@pytest.fixture
async def edges(nats3: NatsCluster) -> AsyncIterator[Edges]:  # noqa: F811
    layout = ClusterLayout(secrets.token_hex(4), 1, 3)  # a fresh bucket per test
    events: list[FleetEvent] = []
    async with nats_client(nats3, "edge-1") as nc1, nats_client(nats3, "edge-2") as nc2:
        # Never asked for a backlog: these tests set no rebalancing policy.
        backend: Any = None
        one = ClusterFleet(nc1.jetstream(), layout, backend, events=events.append, tick=0.05)
        two = ClusterFleet(nc2.jetstream(), layout, backend, events=events.append, tick=0.05)
        await one.start()
        await two.start()
        try:
            yield Edges(one, two, events)
        finally:
            await one.close()
            await two.close()


def beat(worker: str, *acks: ControlAck, polls: int = 0) -> Heartbeat:
    return Heartbeat(worker, ("t.orders",), "1.0", load=Load(polls=polls), interval=5.0, acks=acks)


async def test_a_record_round_trips_with_its_controls(edges: Edges) -> None:
    await edges.one.heartbeat(beat("w1"))
    (control,) = await edges.two.issue("config", {"limit": 2}, ["w1"])
    answer = await edges.one.heartbeat(beat("w1"))
    assert [c.id for c in answer.controls] == [control.id]
    raw = edges.one.mirror.entries[worker_key("w1")].value
    record = record_from_json(raw)
    assert record_to_json(record) == raw and record.controls[0].delivered == 1
    assert record.entry is not None and record.entry.heartbeats == 2


async def test_an_expired_control_is_expired_once_by_two_edges(edges: Edges) -> None:
    await edges.one.heartbeat(beat("w2"))
    (control,) = await edges.one.issue("sleep", None, ["w2"], ttl=0.3)

    def expired() -> list[FleetEvent]:
        return [e for e in edges.events if e.event == "control-expired" and control.id in e.reason]

    await until(expired, 10, what="the expiry")
    # Gone from the bucket, as both edges read it: no tick of either can expire it again (an expiry in
    # flight meanwhile finds the bucket changed and replays on the record without it).
    for edge in (edges.one, edges.two):
        assert await edge.mirror.caught_up(5.0)
        record = record_from_json(edge.mirror.entries[worker_key("w2")].value)
        assert record.controls == [] and record.entry is not None
        assert record.entry.desired == "active"  # the sleep never applied
    assert len(expired()) == 1


async def test_controls_issued_at_both_edges_during_heartbeats_are_all_kept(edges: Edges) -> None:
    await edges.one.heartbeat(beat("w3"))
    work = [edges.one.heartbeat(beat("w3", polls=n)) for n in range(10)]
    work += [edges.two.heartbeat(beat("w3", polls=n)) for n in range(10)]
    work += [edges.one.issue("log_level", {"level": "DEBUG"}, ["w3"]) for _ in range(5)]
    work += [edges.two.issue("log_level", {"level": "INFO"}, ["w3"]) for _ in range(5)]
    results = await asyncio.gather(*work)
    issued = {c.id for result in results if isinstance(result, list) for c in result}
    assert len(issued) == 10
    answer = await edges.two.heartbeat(beat("w3"))
    assert {c.id for c in answer.controls} == issued
    acks = tuple(ControlAck(i, "applied") for i in sorted(issued))
    await asyncio.gather(edges.one.heartbeat(beat("w3", *acks)), edges.two.heartbeat(beat("w3", *acks)))
    applied = [e for e in edges.events if e.event == "control-applied" and e.worker == "w3"]
    assert len(applied) == 10  # each acknowledgement taken once, at whichever edge won
    view, _ = await edges.one.registry()
    (row,) = [r for r in view if r["worker"] == "w3"]
    assert row["heartbeats"] == 1 + 20 + 1 + 2 and row["pending"] == []
