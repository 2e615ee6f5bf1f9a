"""The cluster gateway's backend (cluster/backend.py) over three real `strictq queue-server` processes, one
per partition (a `StaticOwnerMap`): group placement and order, long polls over every partition, acks of
messages it learned and did not, queue-wide fan-out, and the 503 of a partition without a live owner.

Message ids are the sending server's clock (ms) and a counter, so two servers sending in the same
millisecond can give two messages one id (see the report of this part): the tests that ack send to one
partition per millisecond (`one_ms_later`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess, running_servers, start_server
from kit.secret import internal_secret
from kit.until import until

from cluster.backend import ClusterBackend, merge_moves, topped_up
from cluster.owners import StaticOwnerMap
from queue_core.machine import (
    MoveStatus,
    NotFound,
    NotInFlight,
    QueueNotFound,
    SendRequest,
    SendResult,
    Unavailable,
)
from queue_core.machine.groups import partition_of
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.records import Delivery, Received
from queue_core.remote import RemoteQueueService

P = 3
names = itertools.count()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with running_servers(tmp_path_factory.mktemp("cluster"), P) as started:
        yield started


@contextlib.asynccontextmanager
async def cluster(urls: list[str | None], budget: float = 0.5) -> AsyncIterator[ClusterBackend]:
    backend = ClusterBackend(
        StaticOwnerMap(urls), retry_budget=budget, probe_interval=0.1, secret=internal_secret()
    )
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def direct(servers: list[ServerProcess]) -> AsyncIterator[list[RemoteQueueService]]:
    """Each server on its own, without the cluster: what it really holds."""
    remotes = [RemoteQueueService(s.url, secret=internal_secret()) for s in servers]
    for remote in remotes:
        await remote.start()
    try:
        yield remotes
    finally:
        for remote in remotes:
            await remote.close()


def urls_of(servers: list[ServerProcess]) -> list[str | None]:
    return [s.url for s in servers]


def queue_name() -> str:
    return f"cq{next(names)}-{time.time_ns() % 10**9}"


def group_in(partition: int, tag: str) -> str:
    """A group name that hashes to `partition`."""
    return next(g for i in itertools.count() if partition_of(g := f"{tag}{i}", P) == partition)


async def one_ms_later() -> None:
    start = int(time.time() * 1000)
    await until(lambda: int(time.time() * 1000) > start, interval=0.001, what="the next millisecond")


async def send_each(backend: ClusterBackend, queue: str, groups: list[str], count: int) -> list[SendResult]:
    """`count` messages per group, each partition's in their own request and millisecond."""
    sent: list[SendResult] = []
    for partition in range(P):
        mine = [g for g in groups if partition_of(g, P) == partition]
        if not mine:
            continue
        requests = [SendRequest(f"{g}/{i}".encode(), group=g) for i in range(count) for g in mine]
        results = await backend.send(queue, requests)
        assert all(isinstance(r, SendResult) for r in results), results
        sent += [r for r in results if isinstance(r, SendResult)]
        await one_ms_later()
    return sent


# ---------------------------------------------------------------------------------------- placement
async def test_sends_go_to_their_groups_partitions_in_the_callers_order(servers: list[ServerProcess]) -> None:
    queue = queue_name()
    groups = [group_in(p, f"place{p}-") for p in range(P) for _ in range(1)] + [group_in(1, "more-")]
    async with cluster(urls_of(servers)) as backend, direct(servers) as nodes:
        await backend.create_queue(queue)
        assert all([queue in await node.list_queues() for node in nodes])  # create fans out
        requests = [SendRequest(f"{g}#{i}".encode(), group=g) for i in range(3) for g in groups]
        results = await backend.send(queue, requests)
        assert [r.group for r in results if isinstance(r, SendResult)] == [r.group for r in requests]
        for partition, node in enumerate(nodes):
            held = {item[0].group for item in await node.peek(queue, 100)}
            assert held == {g for g in groups if partition_of(g, P) == partition}, (partition, held)
        assert (await backend.metrics(queue)).total == len(requests)
        assert await backend.purge(queue) == len(requests)
        assert [(await node.metrics(queue)).total for node in nodes] == [0] * P


async def test_group_order_holds_through_receive_and_ack(servers: list[ServerProcess]) -> None:
    queue = queue_name()
    groups = [group_in(p, f"order{p}-{k}-") for p in range(P) for k in range(2)]
    async with cluster(urls_of(servers)) as backend:
        await backend.create_queue(queue)
        await send_each(backend, queue, groups, 4)
        seen: dict[str, list[str]] = {g: [] for g in groups}
        for _ in range(50):
            got = await backend.receive(queue, limit=5, worker="w1")
            if not got:
                break
            for item in got:
                seen[item.delivery.group].append(item.body.decode())
            outcomes = await backend.ack(queue, [(r.delivery.message_id, r.delivery.token) for r in got])
            assert [o.status for o in outcomes] == ["ok"] * len(got), outcomes
        assert seen == {g: [f"{g}/{i}" for i in range(4)] for g in groups}
        assert (await backend.metrics(queue)).total == 0


# ---------------------------------------------------------------------------------------- long polls
async def test_a_long_poll_takes_a_message_sent_to_any_partition_during_the_wait(
    servers: list[ServerProcess],
) -> None:
    queue = queue_name()
    async with cluster(urls_of(servers)) as backend:
        await backend.create_queue(queue)
        for partition in range(P):
            group = group_in(partition, "late-")
            polling = asyncio.create_task(backend.receive(queue, limit=10, worker="w", wait=15.0))
            await until(lambda: backend.waiting, what="the long poll to wait")
            await backend.send(queue, [SendRequest(b"late", group=group)])
            got = await polling
            assert [(r.delivery.group, r.body) for r in got] == [(group, b"late")]
            acked = await backend.ack(queue, [(got[0].delivery.message_id, None)])
            assert [o.status for o in acked] == ["ok"]
            await one_ms_later()
        assert await backend.receive(queue, limit=10, worker="w", wait=0.3) == []


async def test_the_wait_endpoint_claims_nothing(servers: list[ServerProcess]) -> None:
    """`POST /v1/queues/{q}/wait`: ready at once when something can be received, false after the wait
    otherwise, 404 for a queue that does not exist; the message stays where it was."""
    queue = queue_name()
    async with direct(servers[:1]) as (node,):
        with pytest.raises(QueueNotFound):
            await node.wait_ready(queue, 0.1)
        await node.create_queue(queue)
        assert await node.wait_ready(queue, 0.1, "w") is False
        await node.send(queue, [SendRequest(b"m", group="g")])
        assert await node.wait_ready(queue, 5.0, "w") is True
        metrics = await node.metrics(queue)
        assert (metrics.visible, metrics.in_flight, metrics.received) == (1, 0, 0)
        await node.receive(queue, worker="w")  # its group is claimed now: nothing more to receive
        assert await node.wait_ready(queue, 0.1, "w") is False
        await node.delete_queue(queue)


# ---------------------------------------------------------------------------------------- claims
async def test_claims_end_whether_the_gateway_learned_it_or_not(servers: list[ServerProcess]) -> None:
    queue = queue_name()
    groups = [group_in(p, f"claims{p}-") for p in range(P)]
    async with cluster(urls_of(servers)) as backend:
        await backend.create_queue(queue)
        await send_each(backend, queue, groups, 2)
        got = await backend.receive(queue, limit=10, worker="w")
        assert len(got) == 2 * P
        items = [(r.delivery.message_id, r.delivery.token) for r in got]
        learned, unknown = items[::2], items[1::2]
        assert [o.status for o in await backend.ack(queue, learned)] == ["ok"] * len(learned)
    async with cluster(urls_of(servers)) as fresh:  # a restarted gateway: it learned nothing
        renewed = await fresh.renew(queue, unknown, 60.0, "set")
        assert [o.status for o in renewed] == ["ok"] * len(unknown), renewed
        outcomes = await fresh.ack(queue, [*unknown, ("00000000000000ff", None)])
        assert [(o.message_id, o.status) for o in outcomes] == [
            *((message_id, "ok") for message_id, _ in unknown),
            ("00000000000000ff", "gone"),
        ]
        assert (await fresh.metrics(queue)).total == 0


async def test_release_and_report_of_unlearned_messages(servers: list[ServerProcess]) -> None:
    queue = queue_name()
    groups = [group_in(p, f"rel{p}-") for p in range(P)]
    async with cluster(urls_of(servers)) as backend:
        await backend.create_queue(queue)
        await send_each(backend, queue, groups, 1)
        got = await backend.receive(queue, limit=10, worker="w")
        assert len(got) == P
    async with cluster(urls_of(servers)) as fresh:
        items = [(r.delivery.message_id, r.delivery.token) for r in got]
        released = await fresh.release(queue, items, holder="w")
        assert [o.status for o in released] == ["ok"] * P, released
        metrics = await fresh.metrics(queue)
        assert (metrics.visible, metrics.in_flight) == (P, 0)


# ---------------------------------------------------------------------------------------- queue-wide
async def test_metrics_are_summed_and_queue_metadata_fans_out(servers: list[ServerProcess]) -> None:
    queue = queue_name()
    groups = [group_in(p, f"metrics{p}-") for p in range(P)]
    async with cluster(urls_of(servers)) as backend, direct(servers) as nodes:
        await backend.create_queue(queue, {"visibility_timeout": 45})
        assert queue in await backend.list_queues("cq")
        await backend.set_attributes(queue, {"visibility_timeout": 50})
        assert [(await node.attributes(queue)).visibility_timeout for node in nodes] == [50] * P
        await send_each(backend, queue, groups, 2)
        await backend.receive(queue, limit=1, worker="w")
        metrics = await backend.metrics(queue)
        parts = [await node.metrics(queue) for node in nodes]
        assert (metrics.total, metrics.in_flight, metrics.groups) == (2 * P, 1, P)
        assert metrics.sent == sum(p.sent for p in parts) == 2 * P
        assert 0 < metrics.oldest_age <= max(p.oldest_age for p in parts)  # the oldest, read just before
        claimed_there = (await nodes[1].metrics(queue)).in_flight
        assert (await backend.group_metrics(queue, groups[1]))["visible"] == 2 - claimed_there
        peeked = await backend.peek(queue, 4)
        assert len(peeked) == 4
        assert [i[0].sent_at for i in peeked] == sorted(i[0].sent_at for i in peeked)
        assert await backend.unclaim_all(queue) == 1
        await backend.delete_queue(queue)
        assert [queue in await node.list_queues() for node in nodes] == [False] * P


# ------------------------------------------------------------------------------------------- moves
async def test_a_move_runs_on_every_partition_under_one_id(servers: list[ServerProcess]) -> None:
    source, destination = queue_name(), queue_name()
    groups = [group_in(p, f"move{p}-") for p in range(P)]
    async with cluster(urls_of(servers)) as backend, direct(servers) as nodes:
        await backend.create_queue(source)
        await send_each(backend, source, groups, 3)
        move = await backend.start_move(source, destination)
        assert move.id.startswith("mv-c") and (move.source, move.destination) == (source, destination)
        assert [(await node.move_status(move.id)).id for node in nodes] == [move.id] * P  # one id on each
        assert (await backend.start_move(source, destination, move.id)).id == move.id  # a retry: the same

        async def done() -> bool:
            return (await backend.move_status(move.id)).state == "done"

        await until(done, what="the move to finish on every partition")
        finished = await backend.move_status(move.id)
        assert (finished.moved, finished.remaining, finished.error) == (3 * P, 0, "")
        for partition, node in enumerate(nodes):  # each group stayed in its partition
            assert (await node.metrics(destination)).total == 3, partition
            assert (await node.metrics(source)).total == 0
        got: list[bytes] = []
        for _ in range(3):  # one message per group at a time: a group is strict
            batch = await backend.receive(destination, limit=10, worker="w")
            await backend.ack(destination, [(r.delivery.message_id, r.delivery.token) for r in batch])
            got += [r.body for r in batch]
        for group in groups:
            wanted = [f"{group}/{i}".encode() for i in range(3)]
            assert [b for b in got if b.decode().split("/")[0] == group] == wanted
        with pytest.raises(NotInFlight):
            await backend.cancel_move(move.id)  # finished everywhere
        with pytest.raises(NotFound):
            await backend.move_status("mv-c0000")
        with pytest.raises(NotFound):
            await backend.move_status("mv-1-1")  # not a cluster's id
        with pytest.raises(QueueNotFound):
            await backend.start_move(queue_name(), destination)


async def test_a_cancelled_move_merges_the_partitions_states(servers: list[ServerProcess]) -> None:
    source, destination = queue_name(), queue_name()
    groups = [group_in(p, f"cancel{p}-") for p in range(P)]
    async with cluster(urls_of(servers)) as backend:
        await backend.create_queue(source)
        await send_each(backend, source, groups, 2)
        held = await backend.receive(source, limit=1, worker="w", ttl=60)  # one group in flight: it waits
        move = await backend.start_move(source, destination)

        async def others_moved() -> bool:
            return (await backend.move_status(move.id)).moved == 2 * (P - 1)

        await until(others_moved, what="every group but the claimed one to move")
        assert (await backend.move_status(move.id)).state == "running"
        cancelled = await backend.cancel_move(move.id)
        assert (cancelled.state, cancelled.moved) == ("cancelled", 2 * (P - 1))
        assert cancelled.finished_at >= cancelled.started_at > 0
        assert (await backend.metrics(source)).total == 2  # the held group stayed
        assert held[0].delivery.group in groups


# ------------------------------------------------------------------------------ the retry workflow
def test_merged_move_states() -> None:
    """merge_moves: running while any part runs; then failed (a part failed, or a partition lost the move),
    cancelled, done; counts summed, the earliest start and the latest finish."""

    def part(state: str, moved: int, remaining: int = 0, error: str = "", at: float = 1.0) -> MoveStatus:
        finished = at + 1 if state != "running" else 0.0
        return MoveStatus("mv-cx", "a", "b", moved, remaining, state, error, at, finished)

    running = merge_moves("mv-cx", [part("done", 2), part("running", 1, 3, at=0.5)], [])
    assert (running.state, running.moved, running.remaining, running.started_at, running.finished_at) == (
        "running", 3, 3, 0.5, 0.0,
    )  # fmt: skip
    failed = merge_moves("mv-cx", [part("done", 2, at=3.0), part("failed", 1, error="queue deleted")], [])
    assert (failed.state, failed.error, failed.finished_at) == ("failed", "queue deleted", 4.0)
    lost = merge_moves("mv-cx", [part("done", 2), part("done", 1)], [2])
    assert lost.state == "failed" and "partition 2 lost the move" in lost.error
    assert merge_moves("mv-cx", [part("cancelled", 1), part("done", 2)], []).state == "cancelled"
    assert merge_moves("mv-cx", [part("done", 1), part("done", 2)], []).state == "done"


async def test_a_long_poll_waits_again_on_a_partition_whose_wait_ended_early(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    """Issue 28: a partition's wait that ends early (here its owner dies and comes back at the same URL;
    in a cluster, an owner that steps down and takes the partition up again) is waited on again, so a
    message sent there meanwhile reaches the long poll instead of it answering empty at its end."""
    queue = queue_name()
    extra = start_server(tmp_path / "extra")
    port = extra.url.rsplit(":", 1)[1]
    try:
        async with cluster([servers[0].url, servers[1].url, extra.url], budget=10.0) as backend:
            await backend.create_queue(queue)
            await until(lambda: backend.healthy, what="every partition ready")
            polling = asyncio.ensure_future(backend.receive(queue, worker="w", wait=20.0))
            await until(lambda: backend.waiting == 1, what="the long poll waiting on every partition")
            extra.kill()
            extra = start_server(tmp_path / "extra", "--port", port)  # the same node, the same URL
            group = group_in(2, "back-")
            await backend.send(queue, [SendRequest(b"after", group=group)])
            assert [r.body for r in await polling] == [b"after"]
    finally:
        extra.stop()


def test_a_top_up_keeps_one_copy_of_a_message_with_its_newer_claim() -> None:
    """topped_up: a message the top-up claimed again (its first claim ran out in between, issue 28) keeps
    its place in the answer with the newer claim; the answer never holds it twice."""

    def item(message_id: str, seq: int, token: int) -> Received:
        delivery = Delivery(seq, message_id, "g", seq, token, f"{token}:{message_id}", 1, 0.0, 0.0, 9.0)
        return Received(delivery, b"", "", b"")

    got = [item("a", 1, 5), item("b", 2, 5), item("x", 7, 4)]
    answer = topped_up(got, [item("a", 1, 6), item("b", 2, 6), item("c", 3, 6)])
    assert [(r.delivery.message_id, r.delivery.token) for r in answer] == [
        ("a", 6), ("b", 6), ("x", 4), ("c", 6),
    ]  # fmt: skip
    assert topped_up([], got) == got


async def test_a_group_the_core_named_is_found_on_its_partition(servers: list[ServerProcess]) -> None:
    """Messages sent without a group get one the core names (`~auto.`), which does not show the cluster
    partition: the retry workflow asks every partition and takes the one that has the group."""
    queue = queue_name()
    async with cluster(urls_of(servers)) as backend:
        await backend.create_queue(queue, {"retry_backoff": 0, "max_attempts": 1})
        await backend.send(queue, [SendRequest(b"loose")])
        (item,) = await backend.receive(queue, limit=1, worker="w")
        group = item.delivery.group
        assert group.startswith("~auto.")
        failed = [AttemptResult(item.delivery.message_id, item.delivery.token, "failed", reason="x")]
        assert [o.status for o in await backend.report(queue, "w", failed)] == ["ok"]
        assert await backend.parked_groups(queue) == [group]
        assert [a["reason"] for a in await backend.group_log(queue, group)] == ["x"]
        assert (await backend.group_policy(queue, group)).effective.max_attempts == 1
        assert await backend.release_group(queue, group) == 1
        assert await backend.parked_groups(queue) == []
        with pytest.raises(NotFound):
            await backend.release_group(queue, "~auto.0.nothing-here")


async def test_the_retry_workflow_goes_to_each_groups_partition(servers: list[ServerProcess]) -> None:
    queue = queue_name()
    groups = [group_in(p, f"retry{p}-") for p in range(P)]
    async with cluster(urls_of(servers)) as backend, direct(servers) as nodes:
        await backend.create_queue(queue, {"retry_backoff": 0})
        policy = await backend.set_group_policy(queue, groups[1], {"max_attempts": 1})
        assert policy.override == {"max_attempts": 1} and policy.effective.max_attempts == 1
        assert [(await node.group_policy(queue, groups[1])).override for node in nodes] == [
            {"max_attempts": 1} if partition_of(groups[1], P) == p else {} for p in range(P)
        ]
        await backend.set_group_policy(queue, groups[0], {"max_attempts": 1})
        await send_each(backend, queue, groups, 1)
        got = await backend.receive(queue, limit=10, worker="w")
        results = [
            AttemptResult(r.delivery.message_id, r.delivery.token, "failed", reason="down")
            for r in got
            if r.delivery.group in groups[:2]
        ]
        assert [o.status for o in await backend.report(queue, "w", results)] == ["ok", "ok"]
        assert await backend.parked_groups(queue) == sorted(groups[:2])  # merged over the partitions
        log = await backend.group_log(queue, groups[0])
        assert [(a["outcome"], a["reason"]) for a in log] == [("failed", "down")]
        assert await backend.release_group(queue, groups[0]) == 1
        assert await backend.parked_groups(queue) == [groups[1]]
        redriven = await backend.redrive_group(queue, groups[1])
        assert (redriven.restored, redriven.released) == (0, 1)
        assert await backend.parked_groups(queue) == []
        cleared = await backend.set_group_policy(queue, groups[1], None)
        assert cleared.override == {} and cleared.effective.max_attempts == 0
        with pytest.raises(NotFound):
            await backend.release_group(queue, "no-such-group")


# ---------------------------------------------------------------------------------------- no owner
async def test_a_partition_without_owner_answers_unavailable_after_the_budget(
    servers: list[ServerProcess],
) -> None:
    queue = queue_name()
    async with cluster(urls_of(servers)) as setup:
        await setup.create_queue(queue)
    urls = urls_of(servers)
    owners = StaticOwnerMap([urls[0], None, urls[2]])
    backend = ClusterBackend(owners, retry_budget=0.5, probe_interval=0.1, secret=internal_secret())
    await backend.start()
    try:
        assert not backend.healthy
        orphan, fine = group_in(1, "orphan-"), group_in(0, "fine-")
        with pytest.raises(Unavailable, match="partition 1") as raised:
            await backend.send(queue, [SendRequest(b"x", group=orphan)])
        assert raised.value.retry_after
        assert [type(r) for r in await backend.send(queue, [SendRequest(b"y", group=fine)])] == [SendResult]
        # The other partitions still serve receives.
        assert [r.body for r in await backend.receive(queue, worker="w")] == [b"y"]
        # An owner that appears while a request waits for one: the request goes through.
        backend.retry_budget = 10.0
        waiting = asyncio.create_task(backend.send(queue, [SendRequest(b"z", group=orphan)]))
        await asyncio.sleep(0)
        owners.set(1, urls[1])
        assert [type(r) for r in await waiting] == [SendResult]
        await until(lambda: backend.healthy, what="every partition owned and ready")
    finally:
        await backend.close()


@pytest.mark.crash
async def test_a_killed_owner_fails_its_partition_only(servers: list[ServerProcess], tmp_path: Path) -> None:
    queue = queue_name()
    extra = start_server(tmp_path / "extra")
    try:
        urls = [servers[0].url, servers[1].url, extra.url]
        async with cluster(urls) as backend:
            await backend.create_queue(queue)
            doomed, alive = group_in(2, "doomed-"), group_in(0, "alive-")
            await backend.send(queue, [SendRequest(b"before", group=doomed)])
            await until(lambda: backend.healthy, what="every partition ready")
            extra.kill()
            with pytest.raises(Unavailable, match="partition 2"):
                await backend.send(queue, [SendRequest(b"after", group=doomed)])
            await backend.send(queue, [SendRequest(b"alive", group=alive)])
            assert [r.body for r in await backend.receive(queue, worker="w")] == [b"alive"]
            await until(lambda: not backend.healthy, what="the dead owner noticed")
    finally:
        extra.stop()
