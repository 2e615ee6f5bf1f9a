"""A queue server in a cluster: owner of some partitions, standby of the others, maybe the master.

Per partition a node is in one of two states: *following* (a `PartitionFollower` applies the stream to its
local store) or *serving* (a `QueueService` over the same store, writing through a `ReplicatedLog`). It
moves between them only on the owners bucket's word (cluster.master writes it):

- assigned to this node (same incarnation): catch up to the stream's end, append an epoch marker with the
  expected-last-sequence check (a deposed owner's later appends then fail), open the store as a service at
  that epoch, serve;
- assigned elsewhere, or the stream refused an append, or a planned move's target has caught up: stop
  serving (requests in flight fail with a retriable 503; everything answered is on the stream), follow.

It tells the cluster it is alive, where its internal API is and how far it has applied each partition in
a heartbeat (cluster.ownership.NodeInfo) every HEARTBEAT seconds, and watches the others' (cluster.liveness:
a silent node whose API refuses connections is dead, for the master and for the master's lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError

from protocol.headers import PARTITION as PARTITION_HEADER
from queue_core.figures import Figures, PartitionFigures, merge_held, merge_queues
from queue_core.machine import InvalidArgument, NotOwner
from queue_core.machine.gauges import TOP_GROUPS
from queue_core.machine.groups import DEFAULT_PARTITIONS
from queue_core.machine.health import HealthSettings
from queue_core.service import QueueService

from .codec import EpochMarker, encode_frame
from .decider import DeciderRole
from .floors import FloorPublisher
from .follower import PartitionFollower
from .health_gates import NodeGates
from .kv_mirror import KvMirror
from .layout import ClusterLayout, LayoutError, ensure_streams, retrying
from .liveness import Liveness
from .master import MasterRole, live_nodes, read_assignments, read_moves
from .ownership import NodeInfo, RecordError
from .replicated_log import WRONG_LAST_SEQUENCE, ReplicatedLog, replicated_logs
from .snapshots import CatchUp, SnapshotBucket, Snapshotter

log = logging.getLogger("strictq.cluster")
# Four beats a second: a late one is noticed (cluster.liveness.SUSPECT_AFTER) within half a second of a
# death; silence alone still takes NODE_TTL (ten beats) to count.
HEARTBEAT = 0.25
CATCH_UP_SECONDS = 15.0
MOVE_LAG = 64  # frames: a planned move's owner steps down once the target is this close
FOLLOWER_CHECK = 5.0  # seconds between looks for a standby copy that stopped following


@dataclass
class Slot:
    partition: int
    follower: PartitionFollower | None = None
    service: QueueService | None = None
    log: ReplicatedLog | None = None
    epoch: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: bool = False
    position: int = 0  # the last stream position known applied here (heartbeats report it mid-promotion)


class ClusterNode:
    def __init__(
        self,
        name: str,
        data_dir: Path,
        nc: NatsClient,
        layout: ClusterLayout,
        url: str = "",
        core_partitions: int = DEFAULT_PARTITIONS,
        clock: Callable[[], float] = time.time,
        region: str = "",
        zone: str = "",
        health: HealthSettings | None = None,
    ) -> None:
        self.name = name
        # Failure management (docs/failure-management.md §3.2): a gate per served partition, and the
        # decider's role, held by one node of the cluster at a time. None: off (--no-health).
        self.health = health
        self.control: KvMirror | None = None
        self.gates: NodeGates | None = None
        self.decider: DeciderRole | None = None
        self.incarnation = secrets.token_hex(6)
        self.region, self.zone = region, zone  # reported in heartbeats and `cluster status`
        self.data_dir = data_dir
        self.url = url
        self.layout = layout
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream()
        self._core_partitions = core_partitions
        self._clock = clock
        self.slots = {p: Slot(p) for p in range(layout.partitions)}
        self._tasks: list[asyncio.Task[None]] = []
        self._transitions: set[asyncio.Task[None]] = set()
        self.nodes: KvMirror | None = None
        self.owners: KvMirror | None = None
        self.master: MasterRole | None = None
        self.liveness: Liveness | None = None
        self.floors = FloorPublisher(nc, layout, self._current_floors)
        # The partitions it serves are copied to the snapshot bucket now and then (cluster.snapshots).
        self.snapshots = Snapshotter(SnapshotBucket(self._js, layout), self._serving_stores)
        self.started_at = clock()
        self.ready = False

    # ---------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await ensure_streams(self._js, self.layout)
        self.nodes = await KvMirror.open(self._js, self.layout.nodes_bucket, "nodes")
        self.owners = await KvMirror.open(self._js, self.layout.owners_bucket, "owners")
        await retrying(self.nodes.start, "watching the nodes")
        await retrying(self.owners.start, "watching the owners")
        await retrying(self._refuse_a_live_namesake, "checking the node's name")
        for slot in self.slots.values():
            follower = slot.follower = self._follower(slot.partition)
            await retrying(follower.start, f"following partition {slot.partition}")
            check = functools.partial(self._refuse_store_ahead, slot.partition, follower)
            await retrying(check, "checking the stores")
        await retrying(self._heartbeat_once, "the first heartbeat")
        await self.floors.start()
        self.liveness = Liveness(self.nodes, self._on_dead)
        self.master = MasterRole(
            self._js,
            self.layout,
            self.name,
            self.nodes,
            self.owners,
            self._clock,
            liveness=self.liveness,
            incarnation=self.incarnation,
        )
        if self.health is not None:
            self.control = await KvMirror.open(self._js, self.layout.control_bucket, "control")
            await retrying(self.control.start, "watching the control bucket")
            self.gates = NodeGates(self._js, self.layout, self.control)
            await self.gates.start()
            self.decider = DeciderRole(
                self._nc, self.layout, self.name, self.control, self.health, self._clock
            )
            self._tasks.append(asyncio.create_task(self.decider.run(), name="strictq-decider"))
        self._tasks += [
            asyncio.create_task(self._heartbeat_forever(), name="strictq-heartbeat"),
            asyncio.create_task(self._reconcile_forever(), name="strictq-reconcile"),
            asyncio.create_task(self.master.run(), name="strictq-master"),
            asyncio.create_task(self.liveness.run(), name="strictq-liveness"),
            asyncio.create_task(self._watch_followers(), name="strictq-follower-watch"),
            asyncio.create_task(self.snapshots.run(), name="strictq-snapshots"),
        ]
        self.ready = True

    async def close(self) -> None:
        """Stop serving and following; the node's heartbeat expires and the master moves its partitions."""
        self.ready = False
        for task in [*self._tasks, *self._transitions]:
            task.cancel()
        for task in [*self._tasks, *self._transitions]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for slot in self.slots.values():
            if slot.service is not None:
                slot.service.stop_waiting()
                await slot.service.close()
                slot.service = None
            if slot.follower is not None:
                await slot.follower.stop()
                slot.follower = None
        if self.gates is not None:
            await self.gates.close()
        for mirror in (self.nodes, self.owners, self.control):
            if mirror is not None:
                await mirror.stop()
        await self.floors.close()

    def _current_floors(self) -> Iterator[tuple[str, str, int]]:
        for slot in self.slots.values():
            if slot.service is not None:
                yield from slot.service.floors()

    # ------------------------------------------------------------------------------ the internal API
    def service_for(self, request: web.Request) -> QueueService:
        """queue_core.server's ServiceSource: the partition's service, or 421 not_owner."""
        raw = request.headers.get(PARTITION_HEADER)
        header = PARTITION_HEADER
        if raw is None:
            raise InvalidArgument(f"a cluster node needs the {header} header", field=header)
        try:
            partition = int(raw)
        except ValueError:
            raise InvalidArgument(f"{header} must be a partition number", field=header) from None
        slot = self.slots.get(partition)
        if slot is None:
            raise InvalidArgument(
                f"partition {partition} does not exist (0-{self.layout.partitions - 1})",
                field=PARTITION_HEADER,
            )
        service = slot.service
        if service is None or not service.healthy:
            raise NotOwner(f"node {self.name} does not serve partition {partition} now", partition=partition)
        return service

    def is_ready(self) -> bool:
        return self.ready

    async def figures(self, top: int = TOP_GROUPS) -> Figures:
        """The figures of the partitions this node serves now (its own /metrics), summed per queue and
        kept per partition (queue_core.figures)."""
        parts: list[tuple[PartitionFigures, Figures]] = []
        for partition, slot in sorted(self.slots.items()):
            service = slot.service
            if service is None or not service.healthy:
                continue
            found = await service.figures(top)
            if found.ready:
                parts.append((PartitionFigures(partition, self.name, found.queues), found))
        return Figures(
            max((f.at for _, f in parts), default=self._clock()),
            merge_queues((p.queues for p, _ in parts), top),
            merge_held(f.held for _, f in parts),
            ready=self.ready,
            partitions=tuple(p for p, _ in parts),
        )

    # ---------------------------------------------------------------------------------- heartbeat
    def info(self) -> NodeInfo:
        applied: dict[int, int] = {}
        serving: set[int] = set()
        for partition, slot in self.slots.items():
            if slot.service is not None and slot.log is not None and slot.log.failed is None:
                slot.position = slot.log.last_sequence
                serving.add(partition)
            elif slot.follower is not None:
                slot.position = max(slot.position, slot.follower.position)
            applied[partition] = slot.position
        return NodeInfo(
            self.name,
            self.incarnation,
            self.url,
            os.getpid(),
            applied,
            frozenset(serving),
            started_at=self.started_at,
            region=self.region,
            zone=self.zone,
        )

    async def _heartbeat_once(self) -> None:
        assert self.nodes is not None, "the node's mirrors start before its first heartbeat"
        await self.nodes.bucket.put(self.name, self.info().to_json())

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self._heartbeat_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("heartbeat of %s failed: %s", self.name, exc)

    # ------------------------------------------------------------------------------ ownership changes
    async def _reconcile_forever(self) -> None:
        assert self.owners is not None
        while True:
            try:
                self._reconcile()
            except Exception:
                log.exception("reconciling partitions")
            await self.owners.changed(0.2)

    def _reconcile(self) -> None:
        assert self.owners is not None and self.nodes is not None
        assignments, _ = read_assignments(self.owners)
        moves = read_moves(self.owners)
        nodes = live_nodes(self.nodes, liveness=self.liveness)
        for partition, slot in self.slots.items():
            if slot.busy:
                continue
            assignment = assignments.get(partition)
            mine = (
                assignment is not None
                and assignment.node == self.name
                and assignment.incarnation == self.incarnation
            )
            target = moves.get(partition)
            leaving = target is not None and target != self.name and target in nodes
            if slot.service is None:
                if mine and assignment is not None and not leaving:  # a handed-over partition stays down
                    self._transition(slot, self._promote(slot, assignment.epoch))
                elif slot.follower is not None and not slot.follower.running:
                    self._transition(slot, self._refollow(slot))
                continue
            failed = slot.log is None or slot.log.failed is not None
            moved_away = not mine or (assignment is not None and assignment.epoch != slot.epoch)
            handing_over = False
            if leaving and target is not None and slot.log is not None:
                lag = slot.log.last_sequence - nodes[target].applied.get(partition, 0)
                handing_over = lag <= MOVE_LAG
            if failed or moved_away or handing_over:
                why = (
                    "its stream refused an append"
                    if failed
                    else "it moved"
                    if moved_away
                    else "a planned move"
                )
                self._transition(slot, self._step_down(slot, why))

    def _transition(self, slot: Slot, work: object) -> None:
        slot.busy = True

        async def run() -> None:
            try:
                async with slot.lock:
                    await work  # type: ignore[misc]
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("partition %d: transition failed", slot.partition)
            finally:
                slot.busy = False

        task = asyncio.create_task(run(), name=f"strictq-partition-{slot.partition}")
        self._transitions.add(task)
        task.add_done_callback(self._transitions.discard)

    def _still_assigned(self, partition: int, epoch: int) -> bool:
        """The owners bucket still gives `partition` to this process at `epoch` (a promotion whose catch-up
        outlasted the master's grace must not fence the owner assigned since)."""
        if self.owners is None:
            return False
        assignment = read_assignments(self.owners)[0].get(partition)
        return (
            assignment is not None
            and assignment.node == self.name
            and assignment.incarnation == self.incarnation
            and assignment.epoch == epoch
        )

    async def _refuse_a_live_namesake(self) -> None:
        """Another live process heart-beating under this node's name (two queue servers started with the
        same --node, or the host name as default) would take partitions from each other for ever: refuse
        to start while its heartbeat still moves. A record left by a process that just died stops moving,
        and expires with the bucket's TTL."""
        assert self.nodes is not None
        bucket = self.nodes.bucket
        try:
            first = await bucket.get(self.name)
        except KeyNotFoundError:
            return
        await asyncio.sleep(HEARTBEAT * 2.5)
        try:
            second = await bucket.get(self.name)
        except KeyNotFoundError:
            return
        if second.revision != first.revision and second.value:
            try:
                other = NodeInfo.from_json(second.value)
                where = f"pid {other.pid}, {other.url}"
            except RecordError:
                where = "unreadable record"
            raise LayoutError(
                f"a queue server named {self.name!r} is already running in this cluster ({where}): "
                "give this one another --node name"
            )

    async def _refuse_store_ahead(self, partition: int, follower: PartitionFollower) -> None:
        """A store holding frames its stream does not: the stream lost acknowledged writes (JetStream does
        not fsync each one; a whole single-machine cluster lost power) or belongs to another cluster. This
        node must never promote from it, so it does not start (docs/cluster.md, "Guarantees")."""
        last = (await self._js.stream_info(self.layout.stream(partition))).state.last_seq
        if (ahead := self._ahead_of_stream(partition, follower.position, last)) is not None:
            await follower.stop()
            raise ahead

    def _ahead_of_stream(self, partition: int, position: int, last: int) -> LayoutError | None:
        """The refusal for a store at `position` when its partition's stream ends at `last` (None: fine)."""
        if position <= last:
            return None
        path = self._store_path(partition)
        return LayoutError(
            f"{path} has applied partition {partition}'s stream up to {position}, but the stream ends at "
            f"{last}: the stream lost writes this store has. Do not promote from it: after checking it, "
            f"move the partition directory {path.parent} aside (the node catches up from the snapshot)"
        )

    def _follower(self, partition: int) -> PartitionFollower:
        catch_up = CatchUp(self._js, self.layout, partition)  # when the stream was trimmed past the store
        return PartitionFollower(
            self._store_path(partition), self._js, self.layout.subject(partition), catch_up
        )

    def _serving_stores(self) -> dict[int, tuple[Path, int]]:
        """The Snapshotter's view: each partition served now, its store and its last commit's position."""
        return {
            partition: (self._store_path(partition), slot.log.last_sequence)
            for partition, slot in self.slots.items()
            if slot.service is not None and slot.log is not None and slot.log.failed is None
        }

    def _store_path(self, partition: int) -> Path:
        return self.data_dir / f"p{partition}" / "queue.sqlite3"

    async def _promote(self, slot: Slot, assigned_epoch: int) -> None:
        partition = slot.partition
        follower = slot.follower
        if follower is None:
            follower = slot.follower = self._follower(partition)
        if not follower.running:  # a step-down while JetStream was unreachable left it stopped
            await follower.stop()
            await retrying(follower.start, f"following partition {partition}", within=CATCH_UP_SECONDS)
        started = time.monotonic()
        stream, subject = self.layout.stream(partition), self.layout.subject(partition)
        marker_at = 0
        epoch = 0
        for _ in range(20):
            last = (await self._js.stream_info(stream)).state.last_seq
            if (ahead := self._ahead_of_stream(partition, follower.position, last)) is not None:
                raise ahead  # the stream lost frames this store has: never promote from it
            if not await follower.caught_up(last, CATCH_UP_SECONDS):
                raise RuntimeError(f"could not apply partition {partition}'s stream up to {last}")
            if not self._still_assigned(partition, assigned_epoch):
                log.info("partition %d was assigned elsewhere during the catch-up: not promoting", partition)
                return
            # Above every earlier owner's epoch (their markers are applied) and the master's number.
            epoch = max(follower.epoch + 1, assigned_epoch)
            marker = encode_frame(EpochMarker(epoch, self.name, self.incarnation))
            headers = {
                "Nats-Msg-Id": f"m{epoch}.{self.incarnation}",
                "Nats-Expected-Last-Sequence": str(last),
            }
            try:
                ack = await self._js.publish(subject, marker, timeout=5.0, headers=headers)
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    continue  # the old owner appended meanwhile: apply that too, then try again
                raise
            marker_at = ack.seq
            break
        if not marker_at:
            raise RuntimeError(f"partition {partition}: the stream kept moving; not promoted")
        if not await follower.caught_up(marker_at, CATCH_UP_SECONDS):
            raise RuntimeError(f"partition {partition}: own marker not applied")
        await follower.stop()
        slot.follower = None

        def made(log: ReplicatedLog) -> None:
            slot.log = log

        replicated = replicated_logs(
            self._js,
            subject,
            last_sequence=marker_at,
            epoch=epoch,
            on_failed=lambda exc: self._wake_reconcile(),
            made=made,
        )

        service = QueueService(
            self._store_path(partition).parent,
            partitions=self._core_partitions,
            clock=self._clock,
            epoch=epoch,
            log_factory=replicated,
            key_space=(partition, self.layout.partitions),
        )
        if self.gates is not None:
            self.gates.attach(partition, service)
        try:
            await service.start()
        except BaseException:
            if self.gates is not None:
                self.gates.detach(partition)
            slot.log = None
            slot.follower = self._follower(partition)
            await slot.follower.start()
            raise
        slot.service = service
        slot.epoch = assigned_epoch
        if self.gates is not None:
            self.gates.started(partition)
        # Gateways' control streams learn this partition's floors from here on (cluster.floors).
        service.floor_listeners.append(self.floors.on_floor)
        self.floors.publish_all(service.floors())
        log.info(
            "%s serves partition %d at epoch %d (stream at %d; promoted in %.2fs)",
            self.name,
            partition,
            epoch,
            marker_at,
            time.monotonic() - started,
        )
        with contextlib.suppress(Exception):  # the next beat tells it anyway
            await self._heartbeat_once()

    async def _step_down(self, slot: Slot, why: str) -> None:
        service = slot.service
        if service is not None:
            log.warning("%s stops serving partition %d: %s", self.name, slot.partition, why)
            slot.service = None
            if self.gates is not None:
                self.gates.detach(slot.partition)
            service.stop_waiting()
            await service.close()
        slot.log = None
        follower = slot.follower = self._follower(slot.partition)
        with contextlib.suppress(Exception):
            await self._heartbeat_once()
        # JetStream may be unreachable now (that may be why this node stepped down): keep trying; a
        # promotion starts it too.
        await retrying(follower.start, f"following partition {slot.partition}", within=3600.0)

    async def _watch_followers(self) -> None:
        """A standby copy that is behind its stream and has not moved for two looks in a row is followed
        anew: a consumer that stopped delivering (after a JetStream outage) must not leave this node
        stale for good, or a planned move to it never finishes."""
        seen: dict[int, int] = {}
        while True:
            await asyncio.sleep(FOLLOWER_CHECK)
            for partition, slot in self.slots.items():
                follower = slot.follower
                if slot.busy or slot.service is not None or follower is None or not follower.running:
                    seen.pop(partition, None)
                    continue
                try:
                    last = (await self._js.stream_info(self.layout.stream(partition))).state.last_seq
                except Exception:  # JetStream unreachable: nothing to judge now
                    continue
                stalled = follower.position < last and seen.get(partition) == follower.position
                seen[partition] = follower.position
                if stalled and not slot.busy and slot.follower is follower:
                    log.warning(
                        "partition %d: following stalled at %d (stream at %d); following again",
                        partition,
                        follower.position,
                        last,
                    )
                    seen.pop(partition, None)
                    self._transition(slot, self._refollow(slot))

    async def _refollow(self, slot: Slot) -> None:
        """A standby copy whose following stopped (JetStream unreachable, a frame it could not apply):
        start again from the store's position, after a pause so a lasting fault is not a busy loop."""
        follower = slot.follower
        if follower is None:
            return
        if follower.failed is not None:
            log.warning("partition %d: following again after: %s", slot.partition, follower.failed)
        await asyncio.sleep(1.0)
        await follower.stop()
        slot.follower = self._follower(slot.partition)
        await slot.follower.start()

    def _on_dead(self, node: str) -> None:
        """A node was proven dead (cluster.liveness): the master decides now, a lease it held is taken."""
        if self.master is not None:
            self.master.wake()
        self._wake_reconcile()

    def _wake_reconcile(self) -> None:
        if self.owners is not None:
            self.owners.poke()
