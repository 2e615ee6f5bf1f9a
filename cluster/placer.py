"""The master's placement loop: every PLACEMENT_EVERY seconds, the policy and the edges' reports through
cluster.placement.propose into planned moves.

It keeps live copies (KvMirror) of the placement bucket (policy, history) and the edges bucket (one
report per edge), opened the first time this node acts as master. Each unblocked proposal becomes a
`move-p<N>` request in the owners bucket (`{"node", "by": "placement", "why"}`, created only if no move
of that partition is asked for already), which cluster.ownership.plan carries out as any planned move
(the old owner drains, the new one opens at the next epoch: per-group order holds), and a MoveRecord in
the history (compare-and-set), which the budget and the cooldown count, whichever master comes next.
The region each partition leans toward (the hold) lives in memory only: a new master starts over, and
so does a master that did not tick for a while (it lost the lease and got it back).

The master runs it in the background (`kick`): opening the buckets and recording the history may wait
seconds on JetStream, and the master's loop must renew its 2.5 s lease meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import orjson
from nats.js.client import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from .kv_mirror import KvMirror
from .layout import EDGE_TTL, ClusterLayout
from .ownership import Assignment, NodeInfo, RecordError
from .placement import MoveRecord, PlacementPolicy, PlacementState, PolicyError, propose, trim_history
from .placement_store import HISTORY_KEY, POLICY_KEY, history_of, policy_of, record_moves
from .traffic import EdgeReport, demand, latency

log = logging.getLogger("strictq.cluster")
PLACEMENT_EVERY = 1.0
OPEN_RETRY = 5.0  # after a failed attempt to watch the buckets
COMPLAIN_EVERY = 60.0  # an unreadable policy or a failing tick is logged at most this often
# Until the policy is heard, rebalancing waits (it could undo placement) this long after the first attempt
# to watch the buckets, then goes on without placement.
OPEN_GRACE = 30.0


def move_request(node: str, why: str) -> bytes:
    return orjson.dumps({"node": node, "by": "placement", "why": why})


class Placer:
    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        owners: KvMirror,
        clock: Callable[[], float] = time.time,
        every: float = PLACEMENT_EVERY,
    ) -> None:
        self._js = js
        self._every = every
        self._layout = layout
        self._owners = owners
        self._clock = clock
        self.placement: KvMirror | None = None
        self.edges: KvMirror | None = None
        self._opened_at = -OPEN_RETRY
        self._first_open: float | None = None  # when this placer first tried to watch the buckets
        self._placed_at = -every
        self._ticked_at: float | None = None  # when the last tick ran: a long gap starts the holds over
        self._task: asyncio.Task[list[MoveRecord]] | None = None
        self._complained: dict[str, float] = {}
        self._leaning: dict[int, tuple[str, float]] = {}
        self._made: tuple[MoveRecord, ...] = ()  # this master's own records (the mirror may lag a write)

    async def open(self) -> bool:
        """Watch the two buckets (once; retried every OPEN_RETRY seconds after a failure): True when
        watching."""
        if self.placement is not None and self.edges is not None:
            return True
        now = time.monotonic()
        if now - self._opened_at < OPEN_RETRY:
            return False
        self._opened_at = now
        if self._first_open is None:
            self._first_open = now
        mirrors: list[KvMirror] = []
        try:
            for bucket, name in (
                (self._layout.placement_bucket, "placement"),
                (self._layout.edges_bucket, "edges"),
            ):
                mirror = await KvMirror.open(self._js, bucket, name)
                mirrors.append(mirror)
                await mirror.start(within=3.0)
        except Exception as exc:
            log.warning("placement: cannot watch its buckets yet (%r); trying again", exc)
            for mirror in mirrors:
                await mirror.stop()
            return False
        self.placement, self.edges = mirrors
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for mirror in (self.placement, self.edges):
            if mirror is not None:
                await mirror.stop()
        self.placement = self.edges = None

    def policy(self) -> PlacementPolicy:
        """The policy as last heard; off when there is none, it is unreadable or not watched yet."""
        entry = None if self.placement is None else self.placement.entries.get(POLICY_KEY)
        try:
            return policy_of(None if entry is None else entry.value)
        except PolicyError as exc:
            self._complain("policy", "placement: the policy is unreadable (%s): placement is off", exc)
            return PlacementPolicy()

    def holds_rebalance(self) -> bool:
        """Rebalancing evens out ownership by count, which would undo placement: not while it is on, nor
        while the policy is not heard yet (for OPEN_GRACE seconds; then the buckets are taken as missing)."""
        if self.placement is None:
            return self._first_open is None or time.monotonic() - self._first_open < OPEN_GRACE
        return self.policy().mode != "off"

    def reports(self) -> list[EdgeReport]:
        reports: list[EdgeReport] = []
        if self.edges is None:
            return reports
        for key, entry in self.edges.fresh(EDGE_TTL).items():
            try:
                reports.append(EdgeReport.from_json(entry.value))
            except RecordError as exc:
                self._complain(f"edge {key}", "placement: ignoring the report of edge %s: %s", key, exc)
        return reports

    def history(self) -> tuple[MoveRecord, ...]:
        entry = None if self.placement is None else self.placement.entries.get(HISTORY_KEY)
        heard = history_of(None if entry is None else entry.value)
        return tuple(sorted({*heard, *self._made}, key=lambda record: record.at))

    def kick(
        self, assignments: Mapping[int, Assignment], nodes: Mapping[str, NodeInfo], moves: Mapping[int, str]
    ) -> None:
        """`tick` in the background, unless one is under way: the master's loop never waits on it."""
        if self._task is None or self._task.done():
            work = self.tick(dict(assignments), dict(nodes), dict(moves))
            self._task = asyncio.create_task(work, name="placer")

    async def tick(
        self, assignments: Mapping[int, Assignment], nodes: Mapping[str, NodeInfo], moves: Mapping[int, str]
    ) -> list[MoveRecord]:
        """At most every `every` seconds: the moves placement wants, asked for and recorded.
        Returns the moves made (never raises: a failure is logged, at most once a minute)."""
        now = time.monotonic()
        if now - self._placed_at < self._every:
            return []
        self._placed_at = now
        try:
            return await self._tick(assignments, nodes, moves)
        except Exception as exc:
            self._complain("tick", "placement: %r", exc)
            return []

    async def _tick(
        self, assignments: Mapping[int, Assignment], nodes: Mapping[str, NodeInfo], moves: Mapping[int, str]
    ) -> list[MoveRecord]:
        if not await self.open():
            return []
        now = time.monotonic()
        if self._ticked_at is not None and now - self._ticked_at > 3 * max(self._every, 1.0):
            self._leaning = {}  # not master for a while: the holds start over
        self._ticked_at = now
        policy = self.policy()
        if policy.mode == "off":
            self._leaning = {}
            return []
        reports = self.reports()
        at = self._clock()
        proposals, state = propose(
            partitions=self._layout.partitions,
            assignments=assignments,
            nodes=nodes,
            demand=demand(reports),
            latency=latency(reports),
            policy=policy,
            state=PlacementState(self._leaning, self.history()),
            now=at,
            pending_moves=moves,
        )
        self._leaning = state.leaning
        made: list[MoveRecord] = []
        for proposal in proposals:
            if proposal.blocked:
                continue
            key = f"move-p{proposal.partition}"
            try:
                await self._owners.bucket.create(key, move_request(proposal.to_node, proposal.reason))
            except KeyWrongLastSequenceError:
                continue  # another move of it was asked for first: that one goes on
            log.info(
                "placement: partition %d moves from %s (%s) to %s (%s): %s; %s",
                proposal.partition,
                proposal.from_node,
                proposal.from_region or "?",
                proposal.to_node,
                proposal.to_region,
                proposal.reason,
                proposal.risk,
            )
            made.append(MoveRecord.of(proposal, at, "placement"))
        if made:
            self._made = trim_history((*self._made, *made), at)
            assert self.placement is not None
            try:
                await record_moves(self._js, self._layout, made, now=at, bucket=self.placement.bucket)
            except Exception as exc:  # the moves stand; this master still counts them (self._made)
                self._complain("history", "placement: recording its moves failed: %r", exc)
            self._owners.poke()  # the master looks at the new move requests now
        return made

    def _complain(self, what: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._complained.get(what, -COMPLAIN_EVERY) >= COMPLAIN_EVERY:
            self._complained[what] = now
            log.warning(message, *args)
