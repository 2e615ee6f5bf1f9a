"""A partition replicated on a real JetStream stream (three nats-servers): the owner's ReplicatedLog, a
standby's PartitionFollower, the epoch marker that fences a deposed owner at the storage, and two
ClusterNodes handing partitions over.

The owners here are wired as cluster.node's `_promote` wires them: a follower catches the store up to the
stream's end, the epoch marker goes on with Nats-Expected-Last-Sequence, then the store opens as a
QueueService at that epoch writing through a ReplicatedLog that starts after the marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cluster_support import heal, nats3, nats_client
from kit import until
from kit.process import launch
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from cluster.codec import CodecError, EffectsFrame, EpochMarker, encode_frame
from cluster.follower import PartitionFollower
from cluster.layout import ClusterLayout, LayoutError, ensure_layout, ensure_streams
from cluster.nats_servers import NatsCluster
from cluster.node import ClusterNode
from cluster.replicated_log import Deposed, ReplicatedLog, replicated_logs
from cluster.snapshots import copy_store, install
from queue_core.machine import SendRequest, SendResult, Unavailable
from queue_core.machine.groups import partition_of
from queue_core.machine.state import TOKEN_SHIFT
from queue_core.service import QueueService
from queue_core.store import SqliteStore

__all__ = ["nats3"]  # the fixture this module uses (cluster_support)

pytestmark = pytest.mark.xdist_group("cluster")

QUEUE = "orders"
names = itertools.count()


@contextlib.asynccontextmanager
async def partition_stream(
    nats: NatsCluster,
) -> AsyncIterator[tuple[Client, JetStreamContext, ClusterLayout]]:
    """A connection and a one-partition layout of its own (a fresh stream) for one test."""
    async with nats_client(nats, f"test-replication-{next(names)}") as nc:
        js = nc.jetstream()
        layout = ClusterLayout(secrets.token_hex(4), partitions=1, replicas=3)
        await ensure_streams(js, layout)
        yield nc, js, layout


@dataclass
class Owner:
    name: str
    service: QueueService
    epoch: int
    marker: int  # the stream sequence of its epoch marker
    logs: list[ReplicatedLog] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    @property
    def log(self) -> ReplicatedLog:
        return self.logs[0]


async def last_seq(js: JetStreamContext, layout: ClusterLayout) -> int:
    return int((await js.stream_info(layout.stream(0))).state.last_seq)


async def promote(js: JetStreamContext, layout: ClusterLayout, data_dir: Path, name: str) -> Owner:
    """Take partition 0 as ClusterNode._promote does."""
    subject = layout.subject(0)
    follower = PartitionFollower(data_dir / "queue.sqlite3", js, subject)
    await follower.start()
    try:
        last = await last_seq(js, layout)
        assert await follower.caught_up(last, 15.0), f"{name} did not catch up to {last}"
        epoch = follower.epoch + 1
        marker = encode_frame(EpochMarker(epoch, name, "inc-" + name))
        headers = {"Nats-Msg-Id": f"m{epoch}.{name}", "Nats-Expected-Last-Sequence": str(last)}
        ack = await js.publish(subject, marker, timeout=5.0, headers=headers)
        assert await follower.caught_up(ack.seq, 15.0), f"{name} did not apply its own marker"
        assert follower.epoch == epoch
    finally:
        await follower.stop()
    logs: list[ReplicatedLog] = []
    failures: list[BaseException] = []

    replicated = replicated_logs(
        js,
        subject,
        last_sequence=ack.seq,
        epoch=epoch,
        on_failed=failures.append,
        made=logs.append,
        retry_seconds=3.0,
    )

    service = QueueService(data_dir, epoch=epoch, log_factory=replicated)
    await service.start()
    return Owner(name, service, epoch, ack.seq, logs, failures)


async def send(service: QueueService, group: str, *bodies: bytes) -> list[SendResult]:
    results = await service.send(QUEUE, [SendRequest(body, group=group) for body in bodies], create=True)
    assert all(isinstance(r, SendResult) for r in results), results
    return [r for r in results if isinstance(r, SendResult)]


async def contents(service: QueueService) -> list[tuple[str, str, int, int, bool, bytes]]:
    """Everything in the queue, in the core's order (receipt order within groups), bodies included."""
    return [
        (item.group, item.message_id, item.seq, item.receive_count, item.claimed, body)
        for item, body, _, _ in await service.peek(QUEUE, 1000)
    ]


async def opened(data_dir: Path) -> QueueService:
    """A standby's store opened on its own, as a plain queue server would."""
    service = QueueService(data_dir)
    await service.start()
    return service


# ------------------------------------------------------------------------------------------- tests
async def test_a_follower_holds_what_the_owner_answered_in_the_same_order(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with partition_stream(nats3) as (_, js, layout):
        owner = await promote(js, layout, tmp_path / "owner", "a")
        follower = PartitionFollower(tmp_path / "standby" / "queue.sqlite3", js, layout.subject(0))
        await follower.start()
        try:
            # Concurrent sends: several commits batched into frames while an append is in flight.
            await asyncio.gather(
                *(
                    send(owner.service, f"g{g}", *(f"g{g}-{i}-{n}".encode() for n in range(3)))
                    for i in range(8)
                    for g in range(3)
                )
            )
            received = await owner.service.receive(QUEUE, limit=5)
            assert len(received) == 5
            first = received[0].delivery
            outcomes = await owner.service.ack(QUEUE, [(first.message_id, first.token)])
            assert [o.status for o in outcomes] == ["ok"], outcomes
            await owner.service.settled()
            expected = await contents(owner.service)
            assert len(expected) == 3 * 8 * 3 - 1
            assert owner.log.failed is None and owner.log.frames >= 2
            assert await last_seq(js, layout) == owner.log.last_sequence == owner.marker + owner.log.frames

            assert await follower.caught_up(owner.log.last_sequence, 15.0), follower.failed
            assert follower.failed is None
        finally:
            await follower.stop()
            await owner.service.close()
        standby = await opened(tmp_path / "standby")
        try:
            assert await contents(standby) == expected
            for group in ("g0", "g1", "g2"):  # and in send order within each group
                bodies = [body for g, *_, body in expected if g == group]
                assert bodies == sorted(bodies, key=lambda b: tuple(int(x) for x in b.split(b"-")[1:]))
            metrics = await standby.metrics(QUEUE)
            assert (metrics.total, metrics.in_flight) == (71, 4)
        finally:
            await standby.close()


async def test_a_second_owner_fences_the_first_at_the_stream(nats3: NatsCluster, tmp_path: Path) -> None:
    async with partition_stream(nats3) as (_, js, layout):
        first = await promote(js, layout, tmp_path / "a", "a")
        second: Owner | None = None
        try:
            sent = await send(first.service, "g1", b"one", b"two")
            sent += await send(first.service, "g2", b"three")
            claimed = await first.service.receive(QUEUE, limit=10)
            assert {r.delivery.group for r in claimed} == {"g1", "g2"}
            first_tokens = [r.delivery.token for r in claimed]
            assert all(token >> TOKEN_SHIFT == first.epoch for token in first_tokens)
            await first.service.settled()

            second = await promote(js, layout, tmp_path / "b", "b")
            assert second.epoch > first.epoch
            assert second.marker == first.log.last_sequence + 1

            # The deposed owner does not know yet; its next write is refused by JetStream itself.
            with pytest.raises(Unavailable) as refused:
                await send(first.service, "g3", b"lost")
            assert refused.value.status == 503 and refused.value.retriable
            assert isinstance(first.log.failed, Deposed)
            assert [type(f) for f in first.failures] == [Deposed]
            assert not first.service.healthy
            with pytest.raises(Unavailable):  # and every later one, at once
                await send(first.service, "g4", b"later")
            assert await last_seq(js, layout) == second.marker  # nothing of it landed

            # The new owner has everything the first one answered, and only that.
            ids = {item[1] for item in await contents(second.service)}
            assert ids == {r.message_id for r in sent}
            await send(second.service, "g5", b"five")
            (fresh,) = await second.service.receive(QUEUE, limit=10)
            assert fresh.delivery.group == "g5"
            assert fresh.delivery.token >> TOKEN_SHIFT == second.epoch
            assert fresh.delivery.token > max(first_tokens)
            assert second.log.failed is None and await last_seq(js, layout) == second.log.last_sequence
        finally:
            await first.service.close()
            if second is not None:
                await second.service.close()


async def test_a_claim_that_runs_out_while_its_append_waits_is_not_handed_out(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """Issue 28's stalled consumers: a receive's claim counts its visibility timeout from when the core
    made it, but the answer waits for the stream's quorum, which a leader's election holds for seconds.
    A claim that ran out meanwhile must not be handed out (its message is visible again: another receive,
    or the gateway's next pass of the same one, takes it under a newer token, and one answer held a message
    twice, its group going backwards). Here every nats-server is paused until the claim has run out."""
    async with partition_stream(nats3) as (_, js, layout):
        owner = await promote(js, layout, tmp_path / "owner", "a")
        try:
            await send(owner.service, "g", b"one", b"two")
            await owner.service.settled()
            for i in range(nats3.count):
                nats3.kill(i, signal.SIGSTOP)
            try:
                receiving = asyncio.ensure_future(owner.service.receive(QUEUE, limit=10, ttl=0.3))

                async def ran_out() -> bool:  # the claim made, then expired, its append still waiting
                    metrics = await owner.service.metrics(QUEUE)
                    return metrics.in_flight == 0 and metrics.total == 2 and owner.log.frames == 1

                await until(lambda: owner.service.core.queue(QUEUE).received == 2, within=5.0)
                await until(ran_out, within=5.0, what="the claim ran out while its append waited")
                assert not receiving.done()
            finally:
                for i in range(nats3.count):
                    nats3.kill(i, signal.SIGCONT)
            assert await receiving == []  # nothing handed out under a claim that no longer holds
            again = await owner.service.receive(QUEUE, limit=10, ttl=30)
            assert [r.body for r in again] == [b"one", b"two"]
            outcomes = await owner.service.ack(
                QUEUE, [(r.delivery.message_id, r.delivery.token) for r in again]
            )
            assert [o.status for o in outcomes] == ["ok", "ok"], outcomes
            assert owner.failures == []
        finally:
            await owner.service.close()
            heal(nats3)


async def test_a_restarted_follower_resumes_after_its_recorded_position(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with partition_stream(nats3) as (_, js, layout):
        owner = await promote(js, layout, tmp_path / "owner", "a")
        path = tmp_path / "standby" / "queue.sqlite3"
        try:
            follower = PartitionFollower(path, js, layout.subject(0))
            await follower.start()
            for n in range(5):
                await send(owner.service, f"g{n % 2}", f"before-{n}".encode())
            assert await follower.caught_up(owner.log.last_sequence, 15.0), follower.failed
            stopped_at = follower.position
            await follower.stop()
            for n in range(5):
                await send(owner.service, f"g{n % 2}", f"after-{n}".encode())

            again = PartitionFollower(path, js, layout.subject(0))
            await again.start()
            try:
                assert again.position == stopped_at  # from its own store
                assert await again.caught_up(owner.log.last_sequence, 15.0), again.failed
                assert again.failed is None
                assert again.frames == owner.log.last_sequence - stopped_at  # only what it lacked
            finally:
                await again.stop()
            expected = await contents(owner.service)
        finally:
            await owner.service.close()
        standby = await opened(path.parent)
        try:
            assert await contents(standby) == expected
            assert (await standby.metrics(QUEUE)).total == 10
        finally:
            await standby.close()


async def test_a_frame_that_cannot_be_decoded_stops_the_follower(nats3: NatsCluster, tmp_path: Path) -> None:
    async with partition_stream(nats3) as (_, js, layout):
        subject = layout.subject(0)
        owner = await promote(js, layout, tmp_path / "owner", "a")
        path = tmp_path / "standby" / "queue.sqlite3"
        follower = PartitionFollower(path, js, subject)
        try:
            await follower.start()
            await send(owner.service, "g", b"fine")
            good = owner.log.last_sequence
            assert await follower.caught_up(good, 15.0)
            garbage = b"\x93\x01\x00\x91\x92\x7f\x01"  # [1, 0, [[127, 1]]]: an effect of type 127
            bad = (await js.publish(subject, garbage, timeout=5.0)).seq
            after = (await js.publish(subject, encode_frame(EffectsFrame(())), timeout=5.0)).seq
            await until(lambda: follower.failed is not None, what="the follower stops")
            assert isinstance(follower.failed, CodecError)
            error = str(follower.failed)
            assert f"frame {bad} of {subject}" in error and "unknown effect type 127" in error
            assert follower.position == good
            assert not await follower.caught_up(after, 5.0)  # at once: it failed

            async def unfollowed() -> bool:
                return (await js.stream_info(layout.stream(0))).state.consumer_count == 0

            # It lets go of its subscription (nothing keeps buffering the stream, no heartbeat task recreates
            # the consumer): the server drops the consumer once nobody listens.
            await until(unfollowed, within=20.0, interval=0.5, what="the consumer is gone")
            await follower.stop()

            again = PartitionFollower(path, js, subject)  # a restart meets the same frame: never skipped
            await again.start()
            try:
                assert again.position == good
                await until(lambda: again.failed is not None, what="the restarted follower stops")
                assert f"frame {bad} of" in str(again.failed) and again.position == good
            finally:
                await again.stop()
        finally:
            await follower.stop()
            await owner.service.close()


# ------------------------------------------------------------------------------------ ClusterNodes
def group_in(partition: int, partitions: int, tag: str) -> str:
    return next(g for i in itertools.count() if partition_of(g := f"{tag}{i}", partitions) == partition)


def serving(node: ClusterNode) -> set[int]:
    return {p for p, slot in node.slots.items() if slot.service is not None and slot.service.healthy}


async def test_two_nodes_share_the_partitions_and_the_survivor_takes_them_all(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    async with nats_client(nats3, "node-a") as nc_a, nats_client(nats3, "node-b") as nc_b:
        layout = await ensure_layout(nc_a.jetstream(), partitions=2, replicas=3)
        assert layout.partitions == 2
        a = ClusterNode("a", tmp_path / "a", nc_a, layout, url="http://a")
        b = ClusterNode("b", tmp_path / "b", nc_b, layout, url="http://b")
        closed: list[ClusterNode] = []
        try:
            await a.start()
            await until(lambda: serving(a) == {0, 1}, within=20.0, what="node a serves both partitions")
            await b.start()
            await until(lambda: serving(a) and serving(b), within=30.0, what="the partitions are shared")
            await until(lambda: serving(a) | serving(b) == {0, 1}, within=20.0, what="both partitions served")
            assert not serving(a) & serving(b)

            sent: dict[int, set[str]] = {}
            for partition in (0, 1):
                owner = a if partition in serving(a) else b
                service = owner.slots[partition].service
                assert service is not None
                group = group_in(partition, layout.partitions, "grp")
                sent[partition] = {r.message_id for r in await send(service, group, b"x", b"y")}

            leaving = a if serving(a) else b
            survivor = b if leaving is a else a
            started = time.monotonic()
            await leaving.close()
            closed.append(leaving)
            await until(lambda: serving(survivor) == {0, 1}, within=30.0, what="the survivor serves both")
            assert time.monotonic() - started < 30.0
            for partition in (0, 1):
                service = survivor.slots[partition].service
                assert service is not None
                assert {item[1] for item in await contents(service)} == sent[partition]
        finally:
            for node in (a, b):
                if node not in closed:
                    await node.close()


async def test_a_store_ahead_of_its_stream_keeps_the_node_from_starting(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """A store that applied frames the stream no longer has (the stream lost acknowledged writes, e.g. a
    one-machine cluster lost power: JetStream does not fsync each write) must never be promoted from."""
    async with nats_client(nats3, "node-ahead") as nc:
        layout = ClusterLayout(secrets.token_hex(4), 1, 3)
        await ensure_streams(nc.jetstream(), layout)
        store = SqliteStore(tmp_path / "p0" / "queue.sqlite3")
        store.open(time.time())
        store.apply([], position=7)  # the stream is empty: it ends at 0
        store.close()
        node = ClusterNode("ahead", tmp_path, nc, layout)
        with pytest.raises(LayoutError, match="stream ends at 0"):
            await node.start()
        await node.close()


async def test_a_second_node_with_a_live_nodes_name_is_refused(nats3: NatsCluster, tmp_path: Path) -> None:
    """Two processes under one --node name would take the partitions from each other for ever."""
    async with nats_client(nats3, "twin-1") as nc1, nats_client(nats3, "twin-2") as nc2:
        layout = ClusterLayout(secrets.token_hex(4), 1, 3)
        await ensure_streams(nc1.jetstream(), layout)
        first = ClusterNode("twin", tmp_path / "1", nc1, layout, url="http://one")
        second = ClusterNode("twin", tmp_path / "2", nc2, layout, url="http://two")
        try:
            await first.start()
            with pytest.raises(LayoutError, match="already running in this cluster"):
                await second.start()
        finally:
            await second.close()
            await first.close()


WORKER = Path(__file__).with_name("cluster_owner_worker.py")
KEEP_COPY_AT = 50  # acknowledged sends before the test copies the owner's store (the "older" copy)
KILL_AT = 150  # acknowledged sends before the SIGKILL


def stored_ids(store_path: Path) -> set[str]:
    """The message ids in a (closed) partition store, read as a plain SQLite file."""
    db = sqlite3.connect(f"{store_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return {message_id for (message_id,) in db.execute("SELECT id FROM messages")}
    finally:
        db.close()


async def test_an_owner_killed_right_after_acknowledging_loses_nothing(
    nats3: NatsCluster, tmp_path: Path
) -> None:
    """docs/cluster.md, "Guarantees": an owner commits to its own store without an fsync, because the
    partition's stream is the durable record. A real owner process is SIGKILLed right after acknowledging
    sends; its store is then replaced by a copy taken earlier (what a power loss may leave of a store
    written without fsync: a shorter prefix of the stream), and a node restarted on that data dir serves
    every acknowledged send, in order, caught up from the stream."""
    async with nats_client(nats3, "sigkill-test") as nc:
        js = nc.jetstream()
        layout = ClusterLayout(secrets.token_hex(4), 1, 3)
        await ensure_streams(js, layout)
        data_dir = tmp_path / "owner"
        store_path = data_dir / "p0" / "queue.sqlite3"
        user, password = nats3.credentials
        argv = [sys.executable, str(WORKER), "--urls", ",".join(nats3.client_urls), "--user", user,
                "--layout", layout.id, "--data-dir", str(data_dir), "--name", "doomed"]  # fmt: skip
        child = launch(
            argv,
            tmp_path / "owner.log",
            wait_for=("serving",),
            timeout=60.0,
            env={"STRICTQ_TEST_NATS_PASSWORD": password},
        )
        acked: list[str] = []
        older = tmp_path / "older.sqlite3"
        try:
            while len(acked) < KILL_AT:
                line = await asyncio.to_thread(child.stdout.get, True, 30.0)
                assert line is not None, f"the owner stopped early; log:\n{child.log()}"
                if line.startswith("acked "):
                    acked.append(line.split()[2])
                if len(acked) == KEEP_COPY_AT:
                    await asyncio.to_thread(copy_store, store_path, older)
        finally:
            child.kill()  # SIGKILL right after the last acknowledgement read
        assert set(acked) <= stored_ids(store_path), "SIGKILL lost commits the kernel had"
        assert not set(acked) <= stored_ids(older), "the older copy must lack acknowledged sends"

        install(older, store_path)
        node = ClusterNode("restarted", data_dir, nc, layout, url="http://restarted")
        try:
            await node.start()
            await until(lambda: serving(node) == {0}, within=30.0, what="the restarted node serves")
            service = node.slots[0].service
            assert service is not None
            found = [item[1] for item in await contents(service)]
            assert [m for m in found if m in set(acked)] == acked  # all of them, in the order sent
        finally:
            await node.close()


async def test_only_a_clusters_stores_skip_the_fsync_per_commit(nats3: NatsCluster, tmp_path: Path) -> None:
    """The owner's and a standby's store commit with synchronous=NORMAL (the stream is the durable
    record); a queue server on its own keeps FULL (SQLite's PRAGMA values: 1 NORMAL, 2 FULL)."""

    def synchronous(service: QueueService) -> int:
        return int(service._store.db.execute("PRAGMA synchronous").fetchone()[0])

    async with partition_stream(nats3) as (_, js, layout):
        owner = await promote(js, layout, tmp_path / "owner", "a")
        follower = PartitionFollower(tmp_path / "standby" / "queue.sqlite3", js, layout.subject(0))
        await follower.start()
        try:
            assert synchronous(owner.service) == 1
            assert follower._store is not None
            assert follower._store.db.execute("PRAGMA synchronous").fetchone()[0] == 1
        finally:
            await follower.stop()
            await owner.service.close()
    alone = await opened(tmp_path / "alone")
    try:
        assert synchronous(alone) == 2
    finally:
        await alone.close()
