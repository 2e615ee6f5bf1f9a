"""Which ready group a receive gets, for a queue shared by tenants (docs/protections.md, "Fairness").

A queue without tenants or pools never builds a `Scheduler`: its ready groups sit in one heap, oldest
head first (the SQS FIFO rule, claims.py). Setting `tenant_separator`, `worker_pools`, a per-tenant
concurrency cap or a sideline threshold gives the queue a scheduler instead, which keeps, per worker pool,
two lanes of ready groups:

- the **live** lane, served first: tenants take turns (round robin), each tenant's groups oldest head
  first, so a tenant that floods the queue with groups gets one turn in N like everyone else and cannot
  push a quiet tenant's oldest message back behind its backlog;
- the **spillover** lane, served only when the worker finds nothing in the live lane: groups sidelined
  because their tenant sent over `sideline_rate`, or because their head was older than `sideline_age` when
  it came up (the backlog article's "sidelining excess / old traffic"). A group is sidelined whole: all of
  its messages, until it drains, so its order is never split between lanes.

Worker pools are shuffle-sharding (the backlog article, AWS Lambda): each tenant is hashed onto
`pools_per_tenant` of the queue's `worker_pools`, each new group goes to the least loaded of its tenant's
pools, and a worker (hashed onto one pool by its id) takes groups of its own pool, then of pools nobody has
polled for a minute, so a flooding tenant backs up only its own few pools and a pool is never orphaned.

Everything here is a pure function of the calls (no clock, no randomness), so replicas replaying the same
inputs schedule the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from .attributes import QueueAttributes
from .groups import group_hash
from .heap import LazyHeap
from .records import GroupState

ReadyEntry = tuple[int, int, GroupState]  # (head key, tiebreak, group)
POOL_IDLE = 60.0  # a pool nobody polled for this long is served by the other pools' workers
SIDELINE_SCAN_LIMIT = 4096  # old groups one pop moves to the spillover lane before it gives up looking


class ScheduledQueue(Protocol):
    """What the scheduler needs of its queue (queue.QueueState, which owns the scheduler)."""

    attributes: QueueAttributes
    groups: dict[str, GroupState]
    sidelined: int

    def push_ready(self, group: GroupState) -> None: ...


def tenant_of(group: str, separator: str) -> str:
    """The tenant a group belongs to: its name up to the first separator (the whole name without one).
    Without a separator the queue has no tenants: every group is the one tenant "" (oldest first)."""
    if not separator:
        return ""
    head, found, _ = group.partition(separator)
    return head if found else group


def pools_of(tenant: str, pools: int, per_tenant: int) -> tuple[int, ...]:
    """The tenant's shuffle shard: `per_tenant` distinct pools out of `pools`, stable everywhere."""
    wanted = min(per_tenant, pools)
    chosen: list[int] = []
    salt = 0
    while len(chosen) < wanted:
        pool = group_hash(f"{tenant}\x00{salt}") % pools
        salt += 1
        if pool not in chosen:
            chosen.append(pool)
    return tuple(chosen)


def pool_of_worker(worker: str, pools: int) -> int:
    return group_hash(f"worker\x00{worker}") % pools


class TenantTurn:
    """One tenant's ready groups in one lane, oldest head first; `queued`: in the lane's rotation."""

    __slots__ = ("groups", "name", "queued")

    def __init__(self, name: str, is_live: Callable[[ReadyEntry], bool]) -> None:
        self.name = name
        self.groups: LazyHeap[ReadyEntry] = LazyHeap(is_live)
        self.queued = False


class Lane:
    """Ready groups of one pool's live or spillover lane: tenants in rotation, one group per turn."""

    __slots__ = ("_is_live", "rotation", "tenants")

    def __init__(self, is_live: Callable[[ReadyEntry], bool]) -> None:
        self._is_live = is_live
        self.tenants: dict[str, TenantTurn] = {}
        self.rotation: deque[TenantTurn] = deque()

    def push(self, entry: ReadyEntry, tenant: str) -> None:
        turn = self.tenants.get(tenant)
        if turn is None:
            turn = self.tenants[tenant] = TenantTurn(tenant, self._is_live)
        turn.groups.push(entry)
        if not turn.queued:
            turn.queued = True
            self.rotation.append(turn)

    def wake(self, tenant: str) -> None:
        """Back into the rotation: a tenant left out at its concurrency cap has a free slot again."""
        turn = self.tenants.get(tenant)
        if turn is not None and not turn.queued:
            turn.queued = True
            self.rotation.append(turn)

    def pop(self, may_take: Callable[[str], bool]) -> GroupState | None:
        """The next tenant's oldest ready group. A tenant at its cap leaves the rotation until `wake`;
        one with nothing live left is forgotten. Each tenant is looked at once at most."""
        rotation = self.rotation
        for _ in range(len(rotation)):
            turn = rotation.popleft()
            turn.queued = False
            if turn.groups.peek() is None:
                del self.tenants[turn.name]
                continue
            if not may_take(turn.name):
                continue
            entry = turn.groups.pop()
            if entry is None:  # pragma: no cover - peek just found a live entry
                continue
            if turn.groups.peek() is None:
                del self.tenants[turn.name]
            else:
                turn.queued = True
                rotation.append(turn)
            return entry[2]
        return None

    def has_ready(self) -> bool:
        return any(turn.groups.peek() is not None for turn in self.rotation)

    def entries(self) -> Iterator[ReadyEntry]:
        for turn in self.tenants.values():
            yield from turn.groups.live_entries()


class Scheduler:
    """The ready groups of a queue with tenants, pools or sidelining; see the module docstring."""

    def __init__(self, queue: ScheduledQueue) -> None:
        attrs = queue.attributes
        self.queue = queue
        self.separator = attrs.tenant_separator
        self.pools = max(1, attrs.worker_pools)
        self.per_tenant = max(1, attrs.pools_per_tenant)
        self.concurrency = attrs.tenant_concurrency
        self.sideline_age = attrs.sideline_age
        self.sideline_rate = attrs.sideline_rate
        self.live = [Lane(self._live_check(pool, False)) for pool in range(self.pools)]
        self.spill = [Lane(self._live_check(pool, True)) for pool in range(self.pools)]
        self.load = [0] * self.pools  # messages per pool: a new group goes to its tenant's least loaded
        self.pool_seen = [float("-inf")] * self.pools  # when a worker of the pool last polled
        self.claimed: dict[str, set[GroupState]] = {}  # tenant -> its groups with a claim (the cap)
        self.claimed_pruned_at = 0
        self.capped: set[str] = set()  # tenants left out of rotations at their cap
        self.buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at): sideline_rate
        self.buckets_pruned_at = 0

    # ------------------------------------------------------------------------------- placement
    def tenant(self, group: GroupState) -> str:
        return tenant_of(group.name, self.separator)

    def place(self, group: GroupState) -> None:
        """A new group's pool: the least loaded of its tenant's shard (ties: the shard's order)."""
        if self.pools == 1:
            group.pool = 0
            return
        shard = pools_of(self.tenant(group), self.pools, self.per_tenant)
        group.pool = min(shard, key=lambda pool: self.load[pool])

    def inserted(self, group: GroupState) -> None:
        if group.pool < 0:
            self.place(group)
        self.load[group.pool] += 1

    def removed(self, group: GroupState) -> None:
        if group.pool >= 0:
            self.load[group.pool] -= 1

    # ----------------------------------------------------------------------------- ready groups
    def push(self, entry: ReadyEntry) -> None:
        group = entry[2]
        if group.pool < 0:
            self.place(group)
        lanes = self.spill if group.sidelined else self.live
        lanes[group.pool].push(entry, self.tenant(group))

    def claim_ended(self, group: GroupState) -> None:
        """A claim of the group's tenant ended: a tenant left out at its cap takes turns again."""
        if not self.capped:
            return
        tenant = self.tenant(group)
        if tenant in self.capped:
            self.capped.discard(tenant)
            for lane in (*self.live, *self.spill):
                lane.wake(tenant)

    def claim_started(self, group: GroupState) -> None:
        if not self.concurrency:
            return
        self.claimed.setdefault(self.tenant(group), set()).add(group)
        if len(self.claimed) > 1024 and len(self.claimed) > 2 * self.claimed_pruned_at:
            # Tenants whose claims all ended since (never near their cap, so never pruned by may_take).
            for tenant in [t for t, groups in self.claimed.items() if not any(g.claimed for g in groups)]:
                del self.claimed[tenant]
            self.claimed_pruned_at = len(self.claimed)

    def may_take(self, tenant: str) -> bool:
        """Under the tenant's concurrency cap. Groups whose claim ended since are dropped here, lazily
        (claims end in many places; their count only matters when the cap is near)."""
        if not self.concurrency:
            return True
        groups = self.claimed.get(tenant)
        if groups is None or len(groups) < self.concurrency:
            return True
        live = {g for g in groups if g.claimed and g.queue.groups.get(g.name) is g}
        if live:
            self.claimed[tenant] = live
        else:
            del self.claimed[tenant]
        if len(live) < self.concurrency:
            return True
        self.capped.add(tenant)
        return False

    def pop(self, worker: str, now: float) -> GroupState | None:
        """The group `worker` gets next: live lanes of its pool and of idle pools, then spillover."""
        own = pool_of_worker(worker, self.pools) if self.pools > 1 else 0
        self.pool_seen[own] = now
        pools = [own, *(p for p in range(self.pools) if p != own and now - self.pool_seen[p] > POOL_IDLE)]
        for attempt in range(2):
            for pool in pools:
                group = self._pop_live(self.live[pool], now)
                if group is not None:
                    return group
            for pool in pools:
                group = self.spill[pool].pop(self.may_take)
                if group is not None:
                    return group
            if attempt or not self._wake_freed():
                break
        return None

    def _wake_freed(self) -> bool:
        """Tenants left out at their cap whose claims ended on a path that did not say so (a group
        dead-lettered whole while claimed, say): back into the rotations. Only when a receive found
        nothing, so a missed wake-up costs one empty pass, never a tenant's starvation."""
        freed = [tenant for tenant in list(self.capped) if self.may_take(tenant)]
        for tenant in freed:
            self.capped.discard(tenant)
            for lane in (*self.live, *self.spill):
                lane.wake(tenant)
        return bool(freed)

    def _pop_live(self, lane: Lane, now: float) -> GroupState | None:
        """The live lane's next group, sidelining whole groups whose head is too old on the way."""
        for _ in range(SIDELINE_SCAN_LIMIT):
            group = lane.pop(self.may_take)
            if group is None or not self.sideline_age:
                return group
            if group.messages[0].sent_at >= now - self.sideline_age:
                return group
            self.sideline(group)
            self.queue.push_ready(group)
        return None

    def has_ready(self) -> bool:
        """Whether any lane may hold a ready group (a long poll's early answer; may be spuriously True
        for a tenant at its cap)."""
        return any(lane.has_ready() for lane in (*self.live, *self.spill))

    # -------------------------------------------------------------------------------- sidelining
    def sideline(self, group: GroupState) -> None:
        if not group.sidelined:
            group.sidelined = True
            self.queue.sidelined += 1

    def sent(self, group: GroupState, now: float) -> bool:
        """A message was accepted into `group`: over its tenant's `sideline_rate`, the group is
        sidelined (a token bucket of one second's worth of sends per tenant). True: sidelined now."""
        rate = self.sideline_rate
        if not rate or group.sidelined:
            return False
        sidelined = False
        tenant = self.tenant(group)
        burst = max(1.0, rate)
        tokens, at = self.buckets.get(tenant, (burst, now))
        tokens = min(burst, tokens + (now - at) * rate)
        if tokens >= 1.0:
            self.buckets[tenant] = (tokens - 1.0, now)
        else:
            self.buckets[tenant] = (tokens, now)
            self.sideline(group)
            sidelined = True
        if len(self.buckets) > 1024 and len(self.buckets) > 2 * self.buckets_pruned_at:
            # Buckets that are full again by now say nothing a fresh bucket would not.
            full = [t for t, (k, at) in self.buckets.items() if k + (now - at) * rate >= burst]
            for name in full:
                del self.buckets[name]
            self.buckets_pruned_at = len(self.buckets)
        return sidelined

    # ---------------------------------------------------------------------------------- upkeep
    def clear(self) -> None:
        for lane in (*self.live, *self.spill):
            lane.tenants.clear()
            lane.rotation.clear()
        self.load = [0] * self.pools
        self.claimed.clear()
        self.capped.clear()

    def rebuild(self) -> None:
        """Every group placed and pushed anew (the queue's scheduling attributes changed, or it was
        restored): pools reassigned, loads recounted, claims registered."""
        self.clear()
        for group in self.queue.groups.values():
            group.pool = -1
            self.place(group)
            self.load[group.pool] += len(group.messages)
            if group.claimed:
                self.claim_started(group)
            self.queue.push_ready(group)

    def _live_check(self, pool: int, spill: bool) -> Callable[[ReadyEntry], bool]:
        queue = self.queue

        def live(entry: ReadyEntry) -> bool:
            key, _, group = entry
            if not group.head_available() or group.pool != pool or group.sidelined != spill:
                return False
            head = group.messages[0]
            return (
                head.key == key
                and (head.history is None or not head.history.reserved_for)
                and queue.groups.get(group.name) is group
            )

        return live

    def lanes_view(self) -> dict[str, int]:
        """Ready groups per lane kind (O(ready groups): inspection only)."""
        return {
            "live": len({id(entry[2]) for lane in self.live for entry in lane.entries()}),
            "spillover": len({id(entry[2]) for lane in self.spill for entry in lane.entries()}),
        }
