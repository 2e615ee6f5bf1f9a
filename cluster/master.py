"""The master role: one node at a time, by a lease in KV, assigns partitions (cluster.ownership.plan).

Any node can take the role: it creates the `master` key of the lease bucket (TTL cluster.layout.MASTER_TTL)
and renews it with compare-and-set on its revision; when the holder dies, the key expires and another
node's create succeeds, or sooner: a holder proven dead (cluster.liveness) is replaced by compare-and-set
on the revision it last wrote, by the first live node by name (so a holder that renewed meanwhile keeps the
lease). Nodes proven dead are not live for the assignments either. Every write of an assignment is
compare-and-set on the revision the master read, so two masters (one paused past its lease) cannot both
move a partition: the later write fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import orjson
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from .kv_mirror import KvMirror
from .layout import MASTER_TTL, NODE_TTL, ClusterLayout, retrying
from .liveness import Liveness
from .ownership import Assignment, NodeInfo, RecordError, plan, rebalance
from .placer import Placer
from .replica_repair import ReplicaRepair
from .snapshots import Trimmer

log = logging.getLogger("strictq.cluster")
MASTER_KEY = "master"
TICK = 0.2
# A planned move the target never catches up with (or that never finishes) is dropped after this long,
# so it cannot hold rebalancing back for good.
MOVE_TIMEOUT = 60.0
OPERATOR_QUIET = 300.0
DEAF_AFTER = 1.5
MOVE_REPORT = 5.0  # no heartbeat from anyone for this long: the master, not the nodes, lost contact


def assignment_key(partition: int) -> str:
    return f"p{partition}"


def move_key(partition: int) -> str:
    return f"move-p{partition}"


def read_assignments(owners: KvMirror) -> tuple[dict[int, Assignment], dict[int, int]]:
    """Assignments by partition, and their KV revisions."""
    assignments: dict[int, Assignment] = {}
    revisions: dict[int, int] = {}
    for key, entry in owners.entries.items():
        if not key.startswith("p"):
            continue
        try:
            assignment = Assignment.from_json(entry.value)
        except RecordError as exc:
            log.warning("ignoring owner record %s: %s", key, exc)
            continue
        assignments[assignment.partition] = assignment
        revisions[assignment.partition] = entry.revision
    return assignments, revisions


def read_moves(owners: KvMirror) -> dict[int, str]:
    moves: dict[int, str] = {}
    for key, entry in owners.entries.items():
        if key.startswith("move-p"):
            with contextlib.suppress(ValueError, orjson.JSONDecodeError):
                moves[int(key[len("move-p") :])] = str(orjson.loads(entry.value)["node"])
    return moves


def live_nodes(
    nodes: KvMirror, max_age: float = NODE_TTL, liveness: Liveness | None = None
) -> dict[str, NodeInfo]:
    """The nodes heart-beating within `max_age` seconds, less those `liveness` proved dead."""
    live: dict[str, NodeInfo] = {}
    for key, entry in nodes.fresh(max_age).items():
        try:
            info = NodeInfo.from_json(entry.value)
        except RecordError as exc:
            log.warning("ignoring node record %s: %s", key, exc)
            continue
        if liveness is None or not liveness.is_dead(info.node, info.incarnation):
            live[key] = info
    return live


class MasterRole:
    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        me: str,
        nodes: KvMirror,
        owners: KvMirror,
        clock: Callable[[], float] = time.time,
        liveness: Liveness | None = None,
        incarnation: str = "",
    ) -> None:
        self._js = js
        self._layout = layout
        self._me = me
        self._nodes = nodes
        self._owners = owners
        self._clock = clock
        self.liveness = liveness
        self._incarnation = incarnation
        self._woken = asyncio.Event()  # a node was proven dead: look at the lease now
        self.is_master = False
        self._deaf_until = 0.0
        self._operator_moved_at = -OPERATOR_QUIET
        self._moves_reported_at = 0.0
        self.trimmer = Trimmer(js, layout)  # the streams are purged behind their snapshots
        self.placer = Placer(js, layout, owners, clock)  # partitions moved toward their producers
        self.replicas = ReplicaRepair(js, layout)  # dead JetStream replicas replaced (zone-distinct)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self.placer.close()
            await self.replicas.close()

    async def _run(self) -> None:
        lease = await retrying(
            lambda: self._js.key_value(self._layout.master_bucket), "the master lease", 3600.0
        )
        revision = 0
        value = orjson.dumps({"node": self._me, "incarnation": self._incarnation})
        while True:
            try:
                if revision:
                    revision = await lease.update(MASTER_KEY, value, last=revision)
                else:
                    revision = await self._take(lease, value)
                    log.info("%s is the master", self._me)
                self.is_master = True
            except KeyWrongLastSequenceError:
                if self.is_master:
                    log.warning("%s lost the master lease", self._me)
                revision = 0
                self.is_master = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("master lease: %s", exc)
                revision = 0
                self.is_master = False
            if self.is_master:
                deadline = time.monotonic() + MASTER_TTL / 3
                while time.monotonic() < deadline:
                    try:
                        await self._decide()
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("master: deciding assignments")
                    await self._owners.changed(TICK)
            else:
                with contextlib.suppress(TimeoutError):  # a wake during the try above counts too
                    await asyncio.wait_for(self._woken.wait(), MASTER_TTL / 3)
                self._woken.clear()

    def wake(self) -> None:
        """A node was proven dead (cluster.liveness): if it held the lease, take it now."""
        self._woken.set()

    async def _take(self, lease: KeyValue, value: bytes) -> int:
        """The lease's new revision: created if free, or taken over from a holder proven dead with
        compare-and-set on its last revision; KeyWrongLastSequenceError while a live holder has it."""
        try:
            return await lease.create(MASTER_KEY, value)
        except KeyWrongLastSequenceError:
            if self.liveness is None:
                raise
            try:
                entry = await lease.get(MASTER_KEY)
                holder = orjson.loads(entry.value or b"{}")
                node, incarnation = str(holder["node"]), str(holder.get("incarnation", ""))
            except (KeyNotFoundError, orjson.JSONDecodeError, KeyError, TypeError):
                raise KeyWrongLastSequenceError() from None
            if not incarnation or not self.liveness.is_dead(node, incarnation):
                raise
            # One taker, the first live node by name, so two nodes do not race for it (an R3 bucket on
            # nats-server 2.9.10 may accept both compare-and-sets; see docs/cluster.md). The others wait
            # for the lease's TTL, or for that node's own takeover.
            if self._me != min(live_nodes(self._nodes, liveness=self.liveness), default=self._me):
                raise
            revision = await lease.update(MASTER_KEY, value, last=entry.revision)
            log.warning("%s takes the master lease from %s, which is dead", self._me, node)
            return revision

    def _hearing(self) -> bool:
        """Whether heartbeats reach this master now. While the nodes bucket has no leader (a NATS server
        died) none lands, from anyone: that is the master going deaf, not every node dying, so it decides
        nothing then, and after heartbeats resume it waits NODE_TTL before judging anyone gone."""
        now = time.monotonic()
        newest = max((entry.heard_at for entry in self._nodes.entries.values()), default=0.0)
        if now - newest > DEAF_AFTER:
            if now >= self._deaf_until:
                log.warning(
                    "master %s hears no heartbeat from any node: deciding nothing until it does", self._me
                )
            self._deaf_until = now + NODE_TTL
            return False
        return now >= self._deaf_until

    def _explain_waiting_moves(
        self,
        moves: dict[int, str],
        assignments: dict[int, Assignment],
        nodes: dict[str, NodeInfo],
        changes: list[Assignment],
    ) -> None:
        """Every MOVE_REPORT seconds, one line per planned move still waiting, saying on what."""
        now = time.monotonic()
        if now - self._moves_reported_at < MOVE_REPORT:
            return
        moving = {change.partition for change in changes}
        for partition, target in moves.items():
            current = assignments.get(partition)
            if partition in moving or current is None or current.node == target:
                continue
            self._moves_reported_at = now
            owner = nodes.get(current.node)
            log.info(
                "partition %d waits to move to %s: %s applied %d, owner %s %s, applied %d",
                partition,
                target,
                target,
                nodes[target].applied.get(partition, 0) if target in nodes else -1,
                current.node,
                "serving" if owner is not None and partition in owner.serving else "not serving",
                owner.applied.get(partition, 0) if owner is not None else -1,
            )

    async def _decide(self) -> None:
        if not self._hearing():
            return
        assignments, revisions = read_assignments(self._owners)
        moves = read_moves(self._owners)
        nodes = live_nodes(self._nodes, liveness=self.liveness)
        owners = self._owners.bucket  # the mirror's handle: no JetStream request per tick
        for partition, target in list(moves.items()):  # done, pointless or stuck: forget it
            current = assignments.get(partition)
            entry = self._owners.entries.get(move_key(partition))
            stuck = entry is not None and time.monotonic() - entry.heard_at > MOVE_TIMEOUT
            if (current is not None and current.node == target) or target not in nodes or stuck:
                if target not in nodes or stuck:
                    log.warning(
                        "dropping the move of partition %d to %s: %s",
                        partition,
                        target,
                        "it did not finish in time" if stuck else "that node is not alive",
                    )
                with contextlib.suppress(KeyNotFoundError):
                    await owners.delete(move_key(partition))
                del moves[partition]
        if any(
            _by_operator(entry.value)
            for key, entry in self._owners.entries.items()
            if key.startswith("move-p")
        ):
            self._operator_moved_at = time.monotonic()
        changes = plan(self._layout.partitions, assignments, nodes, self._clock(), moves)
        self._explain_waiting_moves(moves, assignments, nodes, changes)
        # Rebalancing waits a while after an operator's `cluster move`, which would otherwise be undone,
        # and does not run while placement (cluster.placer) is on: evening out by count would undo it.
        quiet = not changes and time.monotonic() - self._operator_moved_at > OPERATOR_QUIET
        if quiet and not self.placer.holds_rebalance():
            for partition, target in rebalance(self._layout.partitions, assignments, nodes, moves).items():
                request = orjson.dumps({"node": target, "by": "rebalance"})
                with contextlib.suppress(KeyWrongLastSequenceError):
                    await owners.create(move_key(partition), request)
                    log.info("rebalancing: partition %d moves to %s", partition, target)
        for change in changes:
            try:
                if change.partition in revisions:
                    await owners.update(
                        assignment_key(change.partition), change.to_json(), last=revisions[change.partition]
                    )
                else:
                    await owners.create(assignment_key(change.partition), change.to_json())
            except KeyWrongLastSequenceError:
                # Changed since this copy was read (or the copy is behind): read it again, decide next tick.
                log.info(
                    "partition %d: its assignment changed under the master; reading it again",
                    change.partition,
                )
                await self._owners.refresh(assignment_key(change.partition))
                continue
            log.info("partition %d -> %s (epoch %d): %s", *_described(change))
            if change.reason == "moved":
                with contextlib.suppress(KeyNotFoundError):
                    await owners.delete(move_key(change.partition))
        if not changes:  # on a quiet tick, at most every TRIM_SECONDS (cluster.snapshots)
            await self.trimmer.tick(nodes, assignments)
        if not changes:  # at most every PLACEMENT_EVERY, in the background; never raises (cluster.placer)
            self.placer.kick(assignments, nodes, moves)
        if not changes:  # at most every CHECK_EVERY, in the background; never raises (cluster.replica_repair)
            await self.replicas.tick(time.monotonic())


def _described(change: Assignment) -> tuple[int, str, int, str]:
    return change.partition, change.node, change.epoch, change.reason


def _by_operator(raw: bytes) -> bool:
    """`strictq cluster move` ("operator") or `strictq cluster plan --apply` ("plan"): rebalancing waits."""
    try:
        return bool(orjson.loads(raw).get("by") in ("operator", "plan"))
    except (orjson.JSONDecodeError, AttributeError):
        return False
