"""Proof of a node's death (cluster/liveness.py) over a real nats-server and real sockets: a node whose
heartbeats stop and whose API refuses connections is dead for the master (and its lease is taken at
once); a silent node whose socket still accepts (paused, as by SIGSTOP) or whose URL was never reached is
not, however long it stays silent; a newer heartbeat clears the mark."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator

import orjson
import pytest
from cluster_support import nats1, nats_client
from kit.until import until

from cluster.kv_mirror import KvMirror, MirroredEntry
from cluster.layout import NODE_TTL, ClusterLayout, ensure_streams
from cluster.liveness import Liveness, Target, refused
from cluster.master import MASTER_KEY, MasterRole, live_nodes
from cluster.nats_servers import NatsCluster
from cluster.node import HEARTBEAT
from cluster.ownership import NodeInfo

__all__ = ["nats1"]  # the fixture, used by name
pytestmark = pytest.mark.xdist_group("cluster")


class Beating:
    """A pretend node's heartbeat: its record put every HEARTBEAT seconds until stopped."""

    def __init__(self, mirror: KvMirror, name: str, url: str) -> None:
        self.info = NodeInfo(name, secrets.token_hex(6), url, 1, {}, frozenset())
        self._mirror = mirror
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> None:
        await self._mirror.bucket.put(self.info.node, self.info.to_json())

    def start(self) -> None:
        async def forever() -> None:
            while True:
                await self.beat()
                await asyncio.sleep(HEARTBEAT)

        self._task = asyncio.create_task(forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@contextlib.asynccontextmanager
async def layout_on(nats: NatsCluster) -> AsyncIterator[tuple[ClusterLayout, KvMirror, KvMirror]]:
    """A fresh one-partition cluster layout's buckets on `nats`, with the nodes and owners mirrored."""
    async with nats_client(nats, "test-liveness") as nc:
        js = nc.jetstream()
        layout = ClusterLayout(secrets.token_hex(4), partitions=1, replicas=1)
        await ensure_streams(js, layout)
        nodes = await KvMirror.open(js, layout.nodes_bucket, "nodes")
        owners = await KvMirror.open(js, layout.owners_bucket, "owners")
        await nodes.start()
        await owners.start()
        try:
            yield layout, nodes, owners
        finally:
            await nodes.stop()
            await owners.stop()


async def api() -> tuple[asyncio.Server, str]:
    """A listening 'internal API' (it accepts and closes) and its URL."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


class Probes:
    """The real probe, its answers kept (a test waits on them instead of sleeping)."""

    def __init__(self) -> None:
        self.answers: list[bool | None] = []

    async def __call__(self, where: Target) -> bool | None:
        answer = await refused(where)
        self.answers.append(answer)
        return answer


async def watched(nodes: KvMirror, probes: Probes, dead: list[str]) -> tuple[Liveness, asyncio.Task[None]]:
    liveness = Liveness(nodes, dead.append, probes)
    return liveness, asyncio.create_task(liveness.run())


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_killed_node_is_dead_and_a_newer_heartbeat_revives_it(nats1: NatsCluster) -> None:
    async with layout_on(nats1) as (_, nodes, _owners):
        server, url = await api()
        node = Beating(nodes, "a", url)
        node.start()
        dead: list[str] = []
        liveness, task = await watched(nodes, Probes(), dead)
        try:
            await until(lambda: liveness.reached("a", node.info.incarnation), what="a reached once")
            await node.stop()
            server.close()  # what a SIGKILL does to its listening socket
            await server.wait_closed()
            await until(lambda: dead == ["a"], what="a proven dead")
            assert liveness.is_dead("a", node.info.incarnation)
            assert "a" not in live_nodes(nodes, 3600.0, liveness)
            assert "a" in live_nodes(nodes, 3600.0)  # its record is still there: only the proof counts
            # A restarted watch delivers the last heartbeat again (same revision): no news, still dead.
            last = nodes.entries["a"]
            nodes.entries["a"] = MirroredEntry(last.value, last.revision, time.monotonic())
            liveness.look()
            assert liveness.is_dead("a", node.info.incarnation) and dead == ["a"]
            await node.beat()  # the same incarnation heard again: the refusal was wrong
            await until(lambda: not liveness.is_dead("a", node.info.incarnation), what="a revived")
            assert "a" in live_nodes(nodes, 3600.0, liveness)
        finally:
            await stopped(task)
            await node.stop()


async def test_a_paused_or_never_reached_node_is_only_silent(nats1: NatsCluster) -> None:
    async with layout_on(nats1) as (_, nodes, _owners):
        paused = socket.socket()  # listens but never accepts: the kernel still completes handshakes
        paused.bind(("127.0.0.1", 0))
        paused.listen(64)
        nowhere = socket.socket()  # a port nothing listens on, from the start
        nowhere.bind(("127.0.0.1", 0))
        stopped_node = Beating(nodes, "stopped", f"http://127.0.0.1:{paused.getsockname()[1]}")
        unknown = Beating(nodes, "unknown", f"http://127.0.0.1:{nowhere.getsockname()[1]}")
        probes = Probes()
        dead: list[str] = []
        for node in (stopped_node, unknown):
            node.start()
        liveness, task = await watched(nodes, probes, dead)
        try:
            await until(lambda: liveness.reached("stopped", stopped_node.info.incarnation), what="reached")
            await until(lambda: True in probes.answers, what="the unknown URL refused")
            for node in (stopped_node, unknown):
                await node.stop()
            await until(lambda: not nodes.fresh(NODE_TTL), NODE_TTL * 4, what="both silent past NODE_TTL")
            assert probes.answers.count(False) >= 2, "the paused node was probed while silent"
            assert dead == [] and liveness.is_dead("stopped", stopped_node.info.incarnation) is False
            assert not liveness.is_dead("unknown", unknown.info.incarnation)
        finally:
            await stopped(task)
            for node in (stopped_node, unknown):
                await node.stop()
            paused.close()
            nowhere.close()


async def test_the_lease_of_a_dead_master_is_taken_at_once(
    nats1: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder's lease is kept renewed here even after its death (so it never expires by its TTL): the
    other node takes it by compare-and-set on the proof alone."""
    caplog.set_level(logging.INFO, "strictq.cluster")
    async with (
        layout_on(nats1) as (layout, nodes, owners),
        nats_client(nats1, "test-liveness-lease") as nc,
    ):
        js = nc.jetstream()
        lease = await js.key_value(layout.master_bucket)
        server, url = await api()
        holder, other = Beating(nodes, "a", url), Beating(nodes, "b", "")
        holder.start()
        other.start()
        held = {
            "revision": await lease.create(
                MASTER_KEY, orjson.dumps({"node": "a", "incarnation": holder.info.incarnation})
            )
        }

        async def renew() -> None:  # a's lease, renewed until someone else has it
            value = orjson.dumps({"node": "a", "incarnation": holder.info.incarnation})
            while True:
                await asyncio.sleep(0.3)
                try:
                    held["revision"] = await lease.update(MASTER_KEY, value, last=held["revision"])
                except Exception:
                    return

        renewing = asyncio.create_task(renew())
        liveness = Liveness(nodes, lambda node: role.wake())
        role = MasterRole(
            js, layout, "b", nodes, owners, liveness=liveness, incarnation=other.info.incarnation
        )
        tasks = [asyncio.create_task(liveness.run()), asyncio.create_task(role.run())]
        try:
            await until(lambda: liveness.reached("a", holder.info.incarnation), what="a reached once")
            assert not role.is_master
            await holder.stop()
            server.close()
            await server.wait_closed()
            await until(lambda: role.is_master, NODE_TTL * 4, what="b the master")
            assert "b takes the master lease from a, which is dead" in caplog.text
            entry = await lease.get(MASTER_KEY)
            assert orjson.loads(entry.value or b"{}")["node"] == "b"
        finally:
            for task in [*tasks, renewing]:
                await stopped(task)
            for node in (holder, other):
                await node.stop()


def test_the_probe_answers_alike_on_uvloop_and_asyncio() -> None:
    """Nodes run on uvloop, the tests above on asyncio's loop: the probe must prove the same on both (a
    connect option only one loop knows once made every probe of a node an error, and no death proven)."""
    import uvloop

    async def probe() -> tuple[bool | None, bool | None]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        live = await refused(Target("n", "i", "127.0.0.1", port))
        server.close()
        await server.wait_closed()
        return live, await refused(Target("n", "i", "127.0.0.1", port))

    for run in (asyncio.run, uvloop.run):
        assert run(probe()) == (False, True), run
