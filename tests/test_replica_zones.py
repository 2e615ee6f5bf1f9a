"""Zone-distinct JetStream replicas and their repair after a server is lost (issue 16: "replica placement
never puts two replicas of a partition in one zone when the cluster has several; the master repairs
placement after failures"): the decision rule with plain values, the servers' configs, and real
nats-server 2.9.10 processes on loopback, really killed."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from cluster_support import nats_client, publish_acked
from kit import until

from cluster.layout import TRANSIENT, ClusterLayout, ensure_layout, ensure_streams
from cluster.nats_servers import NatsCluster
from cluster.replica_repair import (
    Decision,
    RepairMemory,
    Replica,
    ReplicaRepair,
    StreamPeers,
    cluster_streams,
    is_down,
    peers_of,
    replicas_to_remove,
)

real_servers = pytest.mark.xdist_group("replicas")


# ------------------------------------------------------------------------------ the decision rule
def alive(name: str) -> Replica:
    return Replica(name, current=True, active=0.4)


def dead(name: str, silent: float) -> Replica:
    return Replica(name, current=False, active=silent)


def four_servers(victim_silent: float) -> list[StreamPeers]:
    """n1..n4, each pair seen together somewhere; n3 dead for `victim_silent` seconds."""
    return [
        StreamPeers("P0", "n1", (alive("n2"), dead("n3", victim_silent))),
        StreamPeers("P1", "n4", (alive("n1"), alive("n2"))),
        StreamPeers("P2", "n2", (alive("n4"), dead("n3", victim_silent))),
    ]


def removed(decisions: Sequence[Decision]) -> list[tuple[str, str]]:
    return [(d.stream, d.peer) for d in decisions if d.remove]


def test_a_replica_down_long_enough_is_removed_when_a_spare_fits() -> None:
    decisions = replicas_to_remove(four_servers(40.0), RepairMemory(), now=1000.0, repair_after=30.0)
    assert removed(decisions) == [("P0", "n3"), ("P2", "n3")]
    assert all(d.down_for == pytest.approx(40.0) for d in decisions)
    assert "n4" in decisions[0].why  # P0's spare: n4, seen with n1 and n2


def test_a_replica_down_briefly_is_kept_and_its_downtime_is_remembered() -> None:
    memory = RepairMemory()
    first = replicas_to_remove(four_servers(5.0), memory, now=1000.0, repair_after=30.0)
    assert removed(first) == [] and {d.peer for d in first} == {"n3"}
    assert "down 5 s" in first[0].why
    # `active` keeps growing while it stays dead: 26 s later it has been down 31 s
    later = replicas_to_remove(four_servers(31.0), memory, now=1026.0, repair_after=30.0)
    assert removed(later) == [("P0", "n3"), ("P2", "n3")]


def test_an_offline_replica_counts_from_when_it_was_first_seen_offline() -> None:
    memory = RepairMemory()
    streams = [
        StreamPeers("P0", "n1", (alive("n2"), Replica("n3", offline=True))),
        StreamPeers("P1", "n4", (alive("n1"), alive("n2"))),
    ]
    assert removed(replicas_to_remove(streams, memory, now=100.0, repair_after=30.0)) == []
    assert removed(replicas_to_remove(streams, memory, now=129.0, repair_after=30.0)) == []
    assert removed(replicas_to_remove(streams, memory, now=131.0, repair_after=30.0)) == [("P0", "n3")]


def test_a_replica_that_comes_back_is_forgotten() -> None:
    memory = RepairMemory()
    replicas_to_remove(four_servers(10.0), memory, now=1000.0)
    assert memory.down_since
    back = [StreamPeers("P0", "n1", (alive("n2"), alive("n3")))]
    assert replicas_to_remove(back, memory, now=1001.0) == [] and not memory.down_since


def test_a_replica_catching_up_is_not_down() -> None:
    # a just-placed replica: not current, never heard (active 0), lagging: it is working, not dead
    streams = [StreamPeers("P0", "n1", (alive("n2"), Replica("n4", current=False, active=0.0)))]
    assert replicas_to_remove(streams, RepairMemory(), now=5000.0, repair_after=1.0) == []


def test_without_a_spare_server_nothing_is_removed() -> None:
    # three servers, all in the stream: 2.9.10 would drop the peer anyway and shrink the stream for good
    streams = [
        StreamPeers("P0", "n1", (alive("n2"), dead("n3", 600.0))),
        StreamPeers("KV_sq_x_owners", "n2", (alive("n1"), dead("n3", 600.0))),
    ]
    decisions = replicas_to_remove(streams, RepairMemory(), now=1000.0, repair_after=30.0)
    assert removed(decisions) == [] and len(decisions) == 2
    assert all("no spare server" in d.why for d in decisions)


def test_a_spare_never_seen_beside_a_remaining_peer_may_share_its_zone() -> None:
    # zones a, a, b, c under unique_tag: n1 and n2 (zone a) never hold one stream together. n3 (zone b)
    # dies; n1 is a live server outside P0, but it would be a second replica in zone a: JetStream would
    # refuse ("peer remap failed") and shrink the stream.
    streams = [
        StreamPeers("P0", "n2", (alive("n4"), dead("n3", 100.0))),
        StreamPeers("P1", "n1", (alive("n4"), dead("n3", 100.0))),
    ]
    decisions = replicas_to_remove(streams, RepairMemory(), now=1000.0, repair_after=30.0)
    assert removed(decisions) == []
    assert {d.stream for d in decisions} == {"P0", "P1"}


def test_pairs_seen_earlier_count_as_proof() -> None:
    memory = RepairMemory()
    before = [StreamPeers("P9", "n4", (alive("n1"), alive("n2")))]  # seen once, then P9 gone
    replicas_to_remove(before, memory, now=0.0)
    streams = [StreamPeers("P0", "n1", (alive("n2"), dead("n3", 60.0))), StreamPeers("P1", "n4", ())]
    assert removed(replicas_to_remove(streams, memory, now=100.0, repair_after=30.0)) == [("P0", "n3")]


def test_no_quorum_no_leader_and_one_removal_at_a_time() -> None:
    spare_proof = StreamPeers("X", "n4", (alive("n5"), alive("n1"), alive("n2"), alive("n3")))
    no_quorum = StreamPeers("P0", "n1", (dead("n2", 99.0), dead("n3", 99.0)))
    decisions = replicas_to_remove([spare_proof, no_quorum], RepairMemory(), now=500.0, repair_after=30.0)
    assert removed(decisions) == []
    assert all("below the quorum" in d.why for d in decisions)

    leaderless = StreamPeers("P1", None, (alive("n1"), dead("n3", 99.0)))
    (decision,) = replicas_to_remove([spare_proof, leaderless], RepairMemory(), now=500.0)
    assert not decision.remove and "no leader" in decision.why

    r5 = StreamPeers("P2", "n1", (alive("n2"), alive("n3"), dead("n4", 99.0), dead("n5", 99.0)), 5)
    proof = StreamPeers("Y", "n6", (alive("n1"), alive("n2"), alive("n3")))
    decisions = replicas_to_remove([r5, proof], RepairMemory(), now=500.0, repair_after=30.0)
    assert removed(decisions) == [("P2", "n4")]
    assert "one replica" in decisions[1].why


def test_the_repair_covers_the_partitions_and_the_buckets_of_its_cluster_only() -> None:
    layout = ClusterLayout("ab12cd34", 2, 3)
    names = [
        "SQ_ab12cd34_P0", "SQ_ab12cd34_P1", "KV_sq_ab12cd34_owners", "KV_sq_ab12cd34_nodes",
        "OBJ_sq_ab12cd34_snapshots", "KV_strictq_cluster", "SQ_ffffffff_P0", "KV_sq_ffffffff_owners",
        "ORDERS", "KV_strictq_fleet_ab12cd34", "KV_strictq_fleet_ffffffff",
        "KV_strictq_control_ab12cd34", "KV_strictq_control_ffffffff", "SQ_ab12cd34_HEALTH",
        "SQ_ab12cd34_EVENTS",
    ]  # fmt: skip
    assert cluster_streams(layout, names) == [
        "KV_sq_ab12cd34_nodes", "KV_sq_ab12cd34_owners", "KV_strictq_cluster", "KV_strictq_control_ab12cd34",
        "KV_strictq_fleet_ab12cd34", "OBJ_sq_ab12cd34_snapshots", "SQ_ab12cd34_EVENTS", "SQ_ab12cd34_HEALTH",
        "SQ_ab12cd34_P0", "SQ_ab12cd34_P1",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------- the configs
def test_zones_and_regions_become_server_tags_and_three_zones_a_unique_tag(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path, 4, zones=["eu-1", "eu-2", "us-1", "us-1"], regions=["eu", "eu", "us", ""])
    cluster.ports  # noqa: B018 -- writes the configs without starting anything
    first = cluster.config_path(0).read_text()
    assert 'server_tags: ["zone:eu-1", "region:eu"]' in first
    assert 'server_tags: ["zone:us-1"]' in cluster.config_path(3).read_text()
    assert 'unique_tag: "zone:"' in first
    assert first.index("unique_tag") < first.index("authorization")  # inside the jetstream block
    assert cluster.zone_distinct


def test_fewer_than_three_zones_get_tags_but_no_unique_tag(tmp_path: Path) -> None:
    plain = NatsCluster(tmp_path / "plain", 3)
    two = NatsCluster(tmp_path / "two", 3, zones=["zone-a", "zone-a", "zone-b"])
    plain.ports, two.ports  # noqa: B018
    assert "server_tags" not in plain.config_path(0).read_text()
    assert 'server_tags: ["zone:zone-a"]' in two.config_path(0).read_text()
    assert not two.zone_distinct and "unique_tag" not in two.config_path(0).read_text()


@pytest.mark.parametrize(
    ("zones", "message"),
    [(["a", "b"], r"one zone per JetStream server \(3\)"), (["a", "b c", "d"], "'b c' is not a zone")],
)
def test_bad_zones_are_refused_naming_the_problem(tmp_path: Path, zones: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NatsCluster(tmp_path, 3, zones=zones)


# ------------------------------------------------------------------------------- real servers
@contextlib.contextmanager
def zoned_nats(data_dir: Path, zones: Sequence[str]) -> Iterator[NatsCluster]:
    cluster = NatsCluster(data_dir, len(zones), zones=zones)
    try:
        cluster.start(timeout=60.0)
        yield cluster
    finally:
        cluster.stop()


async def placements(repair: ReplicaRepair) -> dict[str, StreamPeers]:
    found = {}
    for info in await repair.stream_infos():
        peers = peers_of(info)
        assert peers is not None
        found[peers.stream] = peers
    return found


async def every_placement(repair: ReplicaRepair, count: int) -> dict[str, StreamPeers]:
    """`placements` once all `count` streams are listed: while a server is dead, a stream whose leader did
    not answer in time is left out of a listing (ReplicaRepair.stream_infos) until it has a leader again."""

    async def listed() -> dict[str, StreamPeers]:
        try:
            found = await placements(repair)
        except TRANSIENT:
            return {}
        return found if len(found) == count else {}

    return await until(listed, within=30.0, interval=0.2, what=f"all {count} streams listed")


def zones_of(peers: StreamPeers, cluster: NatsCluster) -> list[str]:
    return sorted(cluster.zones[cluster.names.index(name)] for name in peers.members)


@real_servers
async def test_replicas_sit_in_distinct_zones_and_a_killed_one_is_replaced_in_another(tmp_path: Path) -> None:
    zones = ["zone-a", "zone-b", "zone-c", "zone-d"]
    with zoned_nats(tmp_path / "nats", zones) as cluster:
        async with nats_client(cluster, "test-replicas") as nc:
            js = nc.jetstream()
            layout = await ensure_layout(js, 3, 3)
            await ensure_streams(js, layout)
            repair = ReplicaRepair(js, layout, repair_after=1.0, every=0.2)
            before = await placements(repair)
            # 3 partitions, 8 buckets (the fleet's, the control state, the decider's lease among them), the
            # snapshots, the layout record, the health and events streams
            assert len(before) == 3 + 12
            for peers in before.values():
                assert len(set(zones_of(peers, cluster))) == 3, peers

            stream = layout.stream(0)
            await publish_acked(js, layout.subject(0), b"kept", msg_id=uuid.uuid4().hex)
            victim = before[stream].leader  # the stream's leader: a new one is elected, then repaired
            assert victim is not None
            cluster.kill(cluster.names.index(victim))
            holding = {name for name, peers in before.items() if victim in peers.members}

            async def repaired() -> bool:
                try:  # the victim may have been the meta leader: JetStream answers again after an election
                    await repair.check(time.monotonic())
                    now = await placements(repair)
                except TRANSIENT:
                    return False
                # A stream whose leader did not answer in time is left out of the listing (stream_infos):
                # not known to be repaired yet, looked at again.
                return all(
                    name in now
                    and victim not in now[name].members
                    and len(now[name].members) == 3
                    and len(set(zones_of(now[name], cluster))) == 3
                    and all(r.current and not is_down(r) for r in now[name].followers)
                    for name in holding
                )

            await until(repaired, within=90.0, interval=0.5, what=f"replicas on {victim} replaced")
            assert {(d.stream, d.peer) for d in repair.removed} == {(name, victim) for name in holding}
            info = await js.stream_info(stream)
            assert info.state.messages == 1  # the new replica copied the stream; nothing lost


@real_servers
async def test_three_servers_in_two_zones_get_r3_streams_and_no_replica_is_dropped(tmp_path: Path) -> None:
    with zoned_nats(tmp_path / "nats", ["zone-a", "zone-a", "zone-b"]) as cluster:
        assert "unique_tag" not in cluster.config_path(0).read_text()
        async with nats_client(cluster, "test-replicas-2z") as nc:
            js = nc.jetstream()
            layout = await ensure_layout(js, 2, 3)
            await ensure_streams(js, layout)
            repair = ReplicaRepair(js, layout, repair_after=1.0, every=0.2)
            streams = await placements(repair)
            assert all(len(peers.members) == 3 for peers in streams.values())
            victim = streams[layout.stream(0)].followers[0].name
            cluster.kill(cluster.names.index(victim))

            async def refused() -> list[Decision]:
                try:
                    decisions = await repair.check(time.monotonic())
                except TRANSIENT:
                    return []
                mine = [d for d in decisions if d.stream == layout.stream(0) and d.peer == victim]
                return [d for d in mine if d.down_for >= 1.0]

            (decision,) = await until(refused, within=60.0, interval=0.5, what=f"{victim} judged down")
            assert not decision.remove and "no spare server" in decision.why
            assert repair.removed == []
            kept = await every_placement(repair, len(streams))
            assert victim in kept[layout.stream(0)].members  # R3 kept, not shrunk


@real_servers
async def test_a_lone_zone_lost_is_not_refilled_from_a_zone_already_used(tmp_path: Path) -> None:
    # zones a, a, b, c: unique_tag keeps the two zone-a servers apart in every stream; when zone b's only
    # server dies, the spare zone-a server does not fit and nothing is removed (2.9.10 would shrink it)
    with zoned_nats(tmp_path / "nats", ["zone-a", "zone-a", "zone-b", "zone-c"]) as cluster:
        async with nats_client(cluster, "test-replicas-3z") as nc:
            js = nc.jetstream()
            layout = await ensure_layout(js, 4, 3)
            await ensure_streams(js, layout)
            repair = ReplicaRepair(js, layout, repair_after=1.0, every=0.2)
            streams = await placements(repair)
            for peers in streams.values():
                assert zones_of(peers, cluster) == ["zone-a", "zone-b", "zone-c"], peers
            cluster.kill(cluster.names.index("n3"))  # zone-b's only server: in every stream

            async def judged() -> list[Decision]:
                try:
                    decisions = await repair.check(time.monotonic())
                except TRANSIENT:
                    return []
                return [d for d in decisions if d.down_for >= 1.0]

            decisions = await until(judged, within=60.0, interval=0.5, what="n3 judged down")
            assert decisions and not any(d.remove for d in decisions)
            assert all("no spare server" in d.why for d in decisions)
            assert all(len(p.members) == 3 for p in (await every_placement(repair, len(streams))).values())
