"""Snapshots and trimming (cluster.snapshots) on a real 3-server JetStream: an owner's store copied to the
snapshot bucket, the stream purged behind it, and followers that catch up from the snapshot plus the
stream's tail, or refuse a snapshot they cannot use and apply nothing.

The owners here are wired as cluster.node's `_promote` wires them (tests/test_cluster_replication.py says
more): a fresh stream, an epoch marker, a QueueService writing through a ReplicatedLog.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cluster_support import nats3, nats_client
from kit import until
from nats.js.api import ObjectMeta
from nats.js.client import JetStreamContext

from cluster.codec import EpochMarker, encode_frame
from cluster.follower import PartitionFollower, StreamGap
from cluster.layout import ClusterLayout, ensure_streams
from cluster.nats_servers import NatsCluster
from cluster.node import ClusterNode
from cluster.ownership import Assignment, NodeInfo
from cluster.replicated_log import ReplicatedLog, replicated_logs
from cluster.snapshots import (
    EPOCH_HEADER,
    FAR_BEHIND,
    POSITION_HEADER,
    CatchUp,
    SnapshotBucket,
    SnapshotError,
    SnapshotInfo,
    Snapshotter,
    Trimmer,
    copy_store,
    object_name,
    trim_floor,
)
from queue_core.machine import SendRequest
from queue_core.service import QueueService

__all__ = ["nats3"]  # the fixture this module uses (cluster_support)

pytestmark = pytest.mark.xdist_group("cluster")

QUEUE = "orders"
RETRY = 0.1  # a follower's pause between snapshot attempts here
names = itertools.count()


@contextlib.asynccontextmanager
async def partition_stream(nats: NatsCluster) -> AsyncIterator[tuple[JetStreamContext, ClusterLayout]]:
    """A connection and a one-partition layout of its own (a fresh stream and snapshot bucket)."""
    async with nats_client(nats, f"test-snapshots-{next(names)}") as nc:
        js = nc.jetstream()
        layout = ClusterLayout(secrets.token_hex(4), partitions=1, replicas=3)
        await ensure_streams(js, layout)
        yield js, layout


@dataclass
class Owner:
    service: QueueService
    log: ReplicatedLog
    store_path: Path
    epoch: int


async def own(js: JetStreamContext, layout: ClusterLayout, data_dir: Path) -> Owner:
    """Partition 0 of a fresh stream, served from `data_dir` (an epoch marker first, as a promotion)."""
    subject = layout.subject(0)
    headers = {"Nats-Msg-Id": f"m1.{data_dir.name}", "Nats-Expected-Last-Sequence": "0"}
    ack = await js.publish(subject, encode_frame(EpochMarker(1, "a", "inc-a")), timeout=5.0, headers=headers)
    logs: list[ReplicatedLog] = []

    replicated = replicated_logs(
        js,
        subject,
        last_sequence=ack.seq,
        epoch=1,
        on_failed=lambda exc: None,
        made=logs.append,
        retry_seconds=3.0,
    )

    service = QueueService(data_dir, epoch=1, log_factory=replicated)
    await service.start()
    return Owner(service, logs[0], data_dir / "queue.sqlite3", 1)


async def send(owner: Owner, group: str, *bodies: bytes) -> None:
    results = await owner.service.send(QUEUE, [SendRequest(b, group=group) for b in bodies], create=True)
    assert all(hasattr(r, "message_id") for r in results), results


async def traffic(owner: Owner, tag: str, rounds: int = 4) -> None:
    """Sends in three groups (one frame each at least), a receive and an ack: every kind of effect."""
    for n in range(rounds):
        for g in range(3):
            await send(owner, f"g{g}", f"{tag}-{n}-{g}a".encode(), f"{tag}-{n}-{g}b".encode())
    received = await owner.service.receive(QUEUE, limit=2)
    first = received[0].delivery
    await owner.service.ack(QUEUE, [(first.message_id, first.token)])
    await owner.service.settled()


async def contents(service: QueueService) -> list[tuple[str, str, int, int, bool, bytes]]:
    """Everything in the queue in the core's order (receipt order within groups), bodies included."""
    return [
        (item.group, item.message_id, item.seq, item.receive_count, item.claimed, body)
        for item, body, _, _ in await service.peek(QUEUE, 1000)
    ]


async def stored(data_dir: Path) -> list[tuple[str, str, int, int, bool, bytes]]:
    """The contents of the store in `data_dir`, opened as a plain queue server would."""
    service = QueueService(data_dir)
    await service.start()
    try:
        return await contents(service)
    finally:
        await service.close()


async def first_seq(js: JetStreamContext, layout: ClusterLayout) -> int:
    return int((await js.stream_info(layout.stream(0))).state.first_seq)


def heartbeat(name: str, position: int, serving: bool = False) -> NodeInfo:
    return NodeInfo(name, f"inc-{name}", "", 0, {0: position}, frozenset({0}) if serving else frozenset())


ASSIGNED = Assignment(0, "a", "inc-a", 1, 0.0)


def snapshotter(js: JetStreamContext, layout: ClusterLayout, owner: Owner) -> Snapshotter:
    return Snapshotter(SnapshotBucket(js, layout), lambda: {0: (owner.store_path, owner.log.last_sequence)})


def catch_up(js: JetStreamContext, layout: ClusterLayout) -> CatchUp:
    return CatchUp(js, layout, 0, retry_seconds=RETRY)


# ------------------------------------------------------------------------------------------- tests
async def test_a_new_follower_catches_up_from_the_snapshot_and_the_tail(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with partition_stream(nats3) as (js, layout):
        owner = await own(js, layout, tmp_path / "owner")
        try:
            await traffic(owner, "before")
            snapshot = await snapshotter(js, layout, owner).take(0, owner.store_path)
            assert snapshot.position == owner.log.last_sequence and snapshot.epoch == owner.epoch
            assert not (tmp_path / "owner" / "snapshot-out.sqlite3").exists()  # the local copy is gone
            await traffic(owner, "after")
            last = owner.log.last_sequence
            trimmer = Trimmer(js, layout)
            kept = await trimmer.trim(0, {"a": heartbeat("a", last, serving=True)}, ASSIGNED)
            assert kept == snapshot.position + 1 == await first_seq(js, layout)

            follower = PartitionFollower(
                tmp_path / "new" / "queue.sqlite3", js, layout.subject(0), catch_up(js, layout)
            )
            await follower.start()
            try:
                assert await follower.caught_up(last, 15.0), follower.failed
                assert follower.restored == SnapshotInfo(0, snapshot.position, owner.epoch, snapshot.size)
                assert follower.frames == last - snapshot.position  # the tail only, from the stream
                assert follower.epoch == owner.epoch  # the snapshot's: a standby's open keeps it (KEEP_EPOCH)
            finally:
                await follower.stop()
            assert not (tmp_path / "new" / "snapshot-in.sqlite3").exists()
            expected = await contents(owner.service)
        finally:
            await owner.service.close()
        assert len(expected) == 2 * 4 * 3 * 2 - 2
        assert await stored(tmp_path / "new") == expected  # same messages, same order in every group
        for group in ("g0", "g1", "g2"):
            bodies = [body for g, *_, body in expected if g == group]
            assert bodies[0].startswith(b"before") and bodies[-1].startswith(b"after")


async def test_a_follower_still_inside_the_stream_follows_it_and_keeps_its_store(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with partition_stream(nats3) as (js, layout):
        owner = await own(js, layout, tmp_path / "owner")
        path = tmp_path / "standby" / "queue.sqlite3"
        try:
            await traffic(owner, "one")
            follower = PartitionFollower(path, js, layout.subject(0), catch_up(js, layout))
            await follower.start()
            assert await follower.caught_up(owner.log.last_sequence, 15.0), follower.failed
            await follower.stop()
            behind = follower.position

            await traffic(owner, "two")
            snapshot = await snapshotter(js, layout, owner).take(0, owner.store_path)
            await traffic(owner, "three")
            last = owner.log.last_sequence
            nodes = {"a": heartbeat("a", last, serving=True), "b": heartbeat("b", behind)}
            # The master keeps what the live standby still needs, although the snapshot is further on.
            assert await Trimmer(js, layout).trim(0, nodes, ASSIGNED) == behind + 1 < snapshot.position + 1

            again = PartitionFollower(path, js, layout.subject(0), catch_up(js, layout))
            await again.start()
            try:
                assert await again.caught_up(last, 15.0), again.failed
                assert again.restored is None  # from its own store and the stream, not the snapshot
                assert again.frames == last - behind
            finally:
                await again.stop()
            expected = await contents(owner.service)
        finally:
            await owner.service.close()
        assert await stored(path.parent) == expected


async def test_a_snapshot_that_is_missing_corrupt_or_too_old_is_refused_and_nothing_is_applied(
    nats3: NatsCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="strictq.cluster")
    async with partition_stream(nats3) as (js, layout):
        owner = await own(js, layout, tmp_path / "owner")
        path = tmp_path / "new" / "queue.sqlite3"
        follower = PartitionFollower(path, js, layout.subject(0), catch_up(js, layout))
        try:
            await traffic(owner, "early")
            early = tmp_path / "early.sqlite3"
            old_position, old_epoch = await asyncio.to_thread(copy_store, owner.store_path, early)
            await traffic(owner, "late")
            last = owner.log.last_sequence
            await js.purge_stream(layout.stream(0), seq=last)  # trimmed with no snapshot (by hand)

            await follower.start()
            await until(lambda: follower.failed is not None, what="the follower finds no snapshot")
            assert isinstance(follower.failed, SnapshotError)
            assert "has no snapshot" in str(follower.failed)

            bucket = await js.object_store(layout.snapshots_bucket)
            garbage = b"not a SQLite store " * 512
            headers = {POSITION_HEADER: ["1"], EPOCH_HEADER: ["1"]}  # its record: an old one
            await bucket.put(object_name(0), garbage, meta=ObjectMeta(headers=headers))
            await until(
                lambda: "not a readable store" in str(follower.failed), what="the corrupt one refused"
            )

            await SnapshotBucket(js, layout).upload(0, early, old_position, old_epoch)  # a valid but old one
            await until(lambda: "reaches stream position" in str(follower.failed), what="the old one refused")
            assert f"reaches stream position {old_position}" in str(follower.failed)

            # Nothing was applied meanwhile, and the store was never replaced.
            assert (follower.position, follower.frames, follower.restored) == (0, 0, None)
            assert not (path.parent / "snapshot-in.sqlite3").exists()
            assert not await follower.caught_up(last, 0.5)
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1, errors  # said once, not at every attempt
            assert layout.subject(0) in errors[0] and "applying nothing" in errors[0]

            snapshot = await snapshotter(js, layout, owner).take(0, owner.store_path)  # a usable one
            await until(lambda: follower.restored is not None, what="the follower restores the new one")
            assert await follower.caught_up(last, 15.0), follower.failed
            assert follower.failed is None and follower.restored is not None
            assert follower.restored.position == snapshot.position == last
            expected = await contents(owner.service)
        finally:
            await follower.stop()
            await owner.service.close()
        assert await stored(path.parent) == expected


async def test_a_follower_without_a_way_to_the_snapshot_stops_at_a_gap(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with partition_stream(nats3) as (js, layout):
        owner = await own(js, layout, tmp_path / "owner")
        path = tmp_path / "standby" / "queue.sqlite3"
        follower = PartitionFollower(path, js, layout.subject(0))
        try:
            await traffic(owner, "x")
            await js.purge_stream(layout.stream(0), seq=owner.log.last_sequence - 2)
            await follower.start()
            await until(lambda: follower.failed is not None, what="the follower meets the gap")
            assert isinstance(follower.failed, StreamGap)
            assert f"at frame {owner.log.last_sequence - 2} after this store's 0" in str(follower.failed)
            assert follower.position == 0 and follower.frames == 0
        finally:
            await follower.stop()
            await owner.service.close()


def test_the_trim_floor_never_passes_the_snapshot_nor_a_live_follower() -> None:
    assert trim_floor(None, 100, [100], first_seq=1) == 0  # no snapshot: nothing goes
    assert trim_floor(40, None, [], first_seq=1) == 0  # no owner serving it: nothing goes
    assert trim_floor(40, 100, [100, 90], first_seq=1) == 40  # never past the snapshot
    assert trim_floor(40, 100, [100, 20], first_seq=1) == 20  # nor past a follower still in the stream
    assert trim_floor(40, 100, [0], first_seq=1) == 0  # a new node following from the start
    assert trim_floor(40, 100, [5], first_seq=11) == 40  # one already past help needs the snapshot anyway
    owner = FAR_BEHIND + 100
    assert trim_floor(200, owner, [99], first_seq=1) == 200  # so far behind the snapshot is quicker for it
    assert trim_floor(200, owner, [100], first_seq=1) == 100  # within reach of its owner: kept for it


async def test_the_master_trims_up_to_the_snapshot_and_no_further(nats3: NatsCluster, tmp_path: Path) -> None:
    async with partition_stream(nats3) as (js, layout):
        owner = await own(js, layout, tmp_path / "owner")
        try:
            await traffic(owner, "a")
            last = owner.log.last_sequence
            trimmer = Trimmer(js, layout)
            nodes = {"a": heartbeat("a", last, serving=True)}
            assert await trimmer.trim(0, nodes, ASSIGNED) == 1  # no snapshot yet: nothing purged
            snapshot = await snapshotter(js, layout, owner).take(0, owner.store_path)
            await traffic(owner, "b")
            last = owner.log.last_sequence
            nodes = {"a": heartbeat("a", last, serving=True), "b": heartbeat("b", last)}
            not_serving = {"a": heartbeat("a", last), "b": heartbeat("b", last)}
            assert await trimmer.trim(0, not_serving, ASSIGNED) == 1  # nobody serves it: left alone
            other = Assignment(0, "a", "inc-another", 1, 0.0)
            assert await trimmer.trim(0, nodes, other) == 1  # an owner of another incarnation: the same
            for _ in range(2):  # a second round changes nothing
                assert await trimmer.trim(0, nodes, ASSIGNED) == snapshot.position + 1
            state = (await js.stream_info(layout.stream(0))).state
            assert (state.first_seq, state.last_seq) == (snapshot.position + 1, last)
        finally:
            await owner.service.close()


# ------------------------------------------------------------------------------------ ClusterNodes
def serving(node: ClusterNode) -> set[int]:
    return {p for p, slot in node.slots.items() if slot.service is not None and slot.service.healthy}


async def test_a_new_node_joins_from_the_snapshot_its_owner_took_after_the_master_trimmed(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with nats_client(nats3, "node-a") as nc_a, nats_client(nats3, "node-b") as nc_b:
        layout = ClusterLayout(secrets.token_hex(4), partitions=1, replicas=3)
        a = ClusterNode("a", tmp_path / "a", nc_a, layout, url="http://a")
        b = ClusterNode("b", tmp_path / "b", nc_b, layout, url="http://b")
        a.snapshots.every, a.snapshots.interval = 6, 0.1
        try:
            await a.start()
            assert a.master is not None
            a.master.trimmer.interval = 0.2
            await until(lambda: serving(a) == {0}, within=20.0, what="node a serves the partition")
            service = a.slots[0].service
            assert service is not None
            for n in range(12):
                sent = await service.send(
                    QUEUE, [SendRequest(f"m{n}".encode(), group=f"g{n % 3}")], create=True
                )
                assert all(hasattr(r, "message_id") for r in sent), sent
            await service.settled()
            js = nc_a.jetstream()
            await until(lambda: a.snapshots.taken, what="the owner takes a snapshot")

            async def trimmed() -> bool:
                return await first_seq(js, layout) > 1

            await until(trimmed, within=15.0, what="the master trims the stream")
            await b.start()
            follower = b.slots[0].follower
            assert follower is not None
            await until(lambda: follower.restored is not None, within=20.0, what="b restores the snapshot")
            log = a.slots[0].log
            assert log is not None
            assert await follower.caught_up(log.last_sequence, 15.0), follower.failed
            assert (
                follower.restored is not None
                and follower.restored.position >= await first_seq(js, layout) - 1
            )
            expected = await contents(service)
        finally:
            await b.close()
            await a.close()
        assert len(expected) == 12
        assert await stored(tmp_path / "b" / "p0") == expected
