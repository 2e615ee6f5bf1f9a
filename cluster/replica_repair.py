"""Repairing JetStream replicas after a server is lost: the master removes a long-dead replica, so JetStream
places a new one on a spare server (in a zone of its own when the servers have `unique_tag`).

Why the master does it: JetStream (nats-server 2.9.10) keeps a stream's dead replica in its peer set for
good; an R3 stream then runs on two servers and one more failure stops it. `$JS.API.STREAM.PEER.REMOVE`
makes the meta leader put a replacement in its place, chosen under the servers' placement rules
(`unique_tag: "zone:"` from cluster.nats_servers: never two replicas in one zone).

What the repair covers: every stream of this cluster, the partitions' (`SQ_<id>_P<N>`) and the buckets'
(`KV_sq_<id>_*`: the owners bucket holds the assignments, the nodes bucket the heartbeats, the master
bucket the lease; `OBJ_sq_<id>_snapshots`; `KV_strictq_cluster`, the layout record; `KV_strictq_fleet_<id>`,
the worker fleet; `KV_strictq_control_<id>`, the fences and limits of cluster.control_state): a bucket that
loses its quorum stops the cluster as surely as a partition's stream does.

When a replica is removed (`replicas_to_remove`, pure):
- it is down: `offline`, or not heard from by the stream's leader (`active`) for SILENT_AFTER seconds
  (healthy replicas are heard about every second; a replica catching up is heard, so it is not down);
  and it has been down for `repair_after` seconds (REPAIR_AFTER: a server restarting is not replaced);
- the stream has a leader and, without that replica, still a quorum of live peers (one removal per stream
  per check);
- a replacement exists. nats-server 2.9.10 answers a removal without one with "peer remap failed" and
  drops the peer all the same: the stream would shrink to two peers for good (seen on the real server).
  Clients are not told which zone a server is in, so the rule is proven from what they see: a live server
  outside the stream that has been seen holding a replica of some stream together with each of the
  stream's remaining live peers. Under `unique_tag` two servers holding one stream are in different
  zones, so that server is a place JetStream accepts; without `unique_tag` any live server would do and the
  rule is only cautious. A server that holds no replica of anything yet cannot be proven and is not used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import orjson
from nats.js.api import StreamInfo
from nats.js.client import JetStreamContext
from nats.js.errors import APIError

from .layout import LAYOUT_BUCKET, ClusterLayout

log = logging.getLogger("strictq.cluster")

REPAIR_AFTER = 30.0  # seconds a replica must have been down before it is replaced
SILENT_AFTER = 5.0  # not heard from for this long: down (the leader hears a live replica every ~1 s)
CHECK_EVERY = 5.0  # seconds between two looks at the streams
REPORT_EVERY = 60.0  # a replica kept for want of a spare is logged at most this often
REQUEST_TIMEOUT = 2.0
NANOS = 1e9


@dataclass(frozen=True, slots=True)
class Replica:
    """A follower as the stream's leader reports it (`active`: seconds since it was last heard, 0 unknown)."""

    name: str
    current: bool = True
    offline: bool = False
    active: float = 0.0


@dataclass(frozen=True, slots=True)
class StreamPeers:
    """One stream's placement: its leader (None while it has none) and its followers."""

    stream: str
    leader: str | None
    followers: tuple[Replica, ...] = ()
    replicas: int = 3  # configured (num_replicas)

    @property
    def members(self) -> frozenset[str]:
        return frozenset(([self.leader] if self.leader else []) + [r.name for r in self.followers])


@dataclass(frozen=True, slots=True)
class Decision:
    """A down replica and what to do with it: `remove`, or keep it and `why` not."""

    stream: str
    peer: str
    down_for: float
    remove: bool
    why: str = ""


@dataclass
class RepairMemory:
    """What the repair remembers between checks: when each replica was first seen down, and which servers
    were seen holding one stream together (proof, under unique_tag, that their zones differ)."""

    down_since: dict[tuple[str, str], float] = field(default_factory=dict)
    together: set[frozenset[str]] = field(default_factory=set)


def is_down(replica: Replica) -> bool:
    return replica.offline or replica.active >= SILENT_AFTER


def pairs(streams: Iterable[StreamPeers]) -> set[frozenset[str]]:
    """Every two servers holding replicas of one stream."""
    found: set[frozenset[str]] = set()
    for stream in streams:
        members = sorted(stream.members)
        found.update(frozenset((a, b)) for i, a in enumerate(members) for b in members[i + 1 :])
    return found


def live_servers(streams: Iterable[StreamPeers]) -> set[str]:
    """Servers seen alive now: leading a stream, or a follower that is not down."""
    live: set[str] = set()
    for stream in streams:
        if stream.leader:
            live.add(stream.leader)
        live.update(replica.name for replica in stream.followers if not is_down(replica))
    return live


def replicas_to_remove(
    streams: Sequence[StreamPeers],
    memory: RepairMemory,
    now: float,
    repair_after: float = REPAIR_AFTER,
) -> list[Decision]:
    """A decision for every down replica of `streams` (updating `memory`): remove it when it has been down
    `repair_after` seconds, the stream keeps a quorum without it, and a spare server provably fits."""
    memory.together |= pairs(streams)
    live = live_servers(streams)
    decisions: list[Decision] = []
    seen_down: set[tuple[str, str]] = set()
    for stream in streams:
        down = [r for r in stream.followers if is_down(r)]
        for replica in down:
            key = (stream.stream, replica.name)
            seen_down.add(key)
            heard = now - replica.active if replica.active else now
            since = min(memory.down_since.setdefault(key, heard), heard)
            memory.down_since[key] = since
        removed = False
        for replica in down:
            since = memory.down_since[(stream.stream, replica.name)]
            decisions.append(_decide(stream, replica, now - since, down, live, memory, repair_after, removed))
            removed = removed or decisions[-1].remove
    for key in set(memory.down_since) - seen_down:  # back, or no longer a peer
        del memory.down_since[key]
    return decisions


def _decide(
    stream: StreamPeers,
    replica: Replica,
    down_for: float,
    down: Sequence[Replica],
    live: set[str],
    memory: RepairMemory,
    repair_after: float,
    removed: bool,
) -> Decision:
    def keep(why: str) -> Decision:
        return Decision(stream.stream, replica.name, down_for, False, why)

    if down_for < repair_after:
        return keep(f"down {down_for:.0f} s, replaced after {repair_after:g} s")
    if removed:
        return keep("one replica of a stream is replaced at a time")
    if stream.leader is None:
        return keep("the stream has no leader")
    remaining = stream.members - {r.name for r in down}
    quorum = stream.replicas // 2 + 1
    if len(remaining) < quorum:
        return keep(f"{len(remaining)} live peer(s), below the quorum of {quorum}")
    spares = sorted(
        server
        for server in live - stream.members
        if all(frozenset((server, peer)) in memory.together for peer in remaining)
    )
    if not spares:
        return keep("no spare server known to be in another zone than the stream's live peers")
    return Decision(stream.stream, replica.name, down_for, True, f"a spare exists ({', '.join(spares)})")


def peers_of(info: StreamInfo) -> StreamPeers | None:
    """A StreamInfo's placement; None for a stream without cluster information (a single server)."""
    cluster = info.cluster
    if cluster is None:
        return None
    followers = tuple(
        Replica(
            name=str(peer.name),
            current=bool(peer.current),
            offline=bool(peer.offline),
            active=(peer.active or 0) / NANOS,
        )
        for peer in cluster.replicas or []
        if peer.name
    )
    replicas = info.config.num_replicas or 1
    return StreamPeers(info.config.name or "", cluster.leader or None, followers, replicas)


def cluster_streams(layout: ClusterLayout, names: Iterable[str]) -> list[str]:
    """The streams of this cluster among `names`: partitions, buckets (the fleet's and the control state
    among them), the snapshots, the layout record, failure management's health and events streams."""
    prefixes = (f"SQ_{layout.id}_P", f"KV_sq_{layout.id}_", f"OBJ_sq_{layout.id}_")
    exact = (
        f"KV_{LAYOUT_BUCKET}",
        f"KV_{layout.fleet_bucket}",
        f"KV_{layout.control_bucket}",
        layout.health_stream,
        layout.events_stream,
    )
    return sorted(n for n in names if n.startswith(prefixes) or n in exact)


class ReplicaRepair:
    """The master's replica repair: `tick(now)` on quiet ticks starts a check in the background every
    `every` seconds (listing the streams can take seconds while a server is dead: the master's failover
    decisions never wait for it); `close()` cancels one under way."""

    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        *,
        repair_after: float = REPAIR_AFTER,
        every: float = CHECK_EVERY,
    ) -> None:
        self._js = js
        self.layout = layout
        self.repair_after = repair_after
        self.every = every
        self.memory = RepairMemory()
        self.removed: list[Decision] = []  # what this master removed (for tests and logs)
        self._next = 0.0
        self._reported: dict[tuple[str, str], float] = {}
        self._task: asyncio.Task[None] | None = None

    async def tick(self, now: float | None = None) -> None:
        """Start a check if `every` seconds have passed since the last one began and none is under way."""
        now = time.monotonic() if now is None else now
        if now < self._next or (self._task is not None and not self._task.done()):
            return
        self._next = now + self.every
        self._task = asyncio.create_task(self._check_logged(now), name="replica-repair")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _check_logged(self, now: float) -> None:
        try:
            await self.check(now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logged, never raised: the master's other work goes on
            log.warning("replica repair: %s", exc)

    async def check(self, now: float) -> list[Decision]:
        """One look at every stream of the cluster, and the removals it calls for; the decisions."""
        streams = [peers for info in await self.stream_infos() if (peers := peers_of(info)) is not None]
        decisions = replicas_to_remove(streams, self.memory, now, self.repair_after)
        for decision in decisions:
            if decision.remove:
                try:
                    await self.remove_peer(decision.stream, decision.peer)
                except APIError as exc:  # already replaced (a second look raced the first), or refused
                    log.warning(
                        "stream %s: removing the replica on %s: %s", decision.stream, decision.peer, exc
                    )
                    continue
                self.removed.append(decision)
                log.warning(
                    "stream %s: replica on %s down %.0f s: removed, JetStream places a new one (%s)",
                    decision.stream,
                    decision.peer,
                    decision.down_for,
                    decision.why,
                )
            elif decision.down_for >= self.repair_after:
                key = (decision.stream, decision.peer)
                if now - self._reported.get(key, -REPORT_EVERY) >= REPORT_EVERY:
                    self._reported[key] = now
                    log.warning(
                        "stream %s: replica on %s down %.0f s, kept: %s",
                        decision.stream,
                        decision.peer,
                        decision.down_for,
                        decision.why,
                    )
        return decisions

    async def stream_infos(self) -> list[StreamInfo]:
        """Every stream of this cluster (STREAM.LIST, page by page: one request per 256 streams). Once
        each: while a server is dead a page can leave out a stream whose leader did not answer in time
        (seen on 2.9.10), so the next page can repeat one; a stream left out is looked at next time."""
        infos: dict[str, StreamInfo] = {}
        offset = 0
        while page := await self._js.streams_info(offset=offset):
            offset += len(page)
            for info in page:
                infos.setdefault(info.config.name or "", info)
        return [infos[name] for name in cluster_streams(self.layout, infos)]

    async def remove_peer(self, stream: str, peer: str) -> None:
        """`$JS.API.STREAM.PEER.REMOVE.<stream>` (nats-py has no method for it); APIError on refusal."""
        subject = f"{self._js._prefix}.STREAM.PEER.REMOVE.{stream}"
        await self._js._api_request(subject, orjson.dumps({"peer": peer}), timeout=REQUEST_TIMEOUT)
