"""Per-queue state: groups, the id index, the ready heap and counters. Mutated only by `QueueCore`."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from .attributes import QueueAttributes
from .estimates import QueueEstimates
from .groups import partition_of
from .heap import LazyHeap
from .records import GroupState, Handover, Message
from .routing import NO_ROUTING, Router
from .scheduling import Scheduler

MAX_STATE_HOLDERS = 100_000  # groups per queue whose state-keeping holder is remembered
# One tie-breaker for every heap in the machine, so equal keys never compare the objects behind them.
tiebreak = itertools.count()


class QueueState:
    """All messages of one queue, indexed for O(log groups) receive regardless of backlog depth."""

    def __init__(self, qid: int, name: str, attributes: QueueAttributes, created_at: float) -> None:
        self.qid = qid
        self.name = name
        self.attributes = attributes
        self.created_at = created_at
        self.groups: dict[str, GroupState] = {}
        # Groups moving between workers with their local state, by group name (machine.handover).
        self.handovers: dict[str, Handover] = {}
        self.by_id: dict[str, Message] = {}
        # Groups that can be claimed now, keyed by their head's receipt key (SQS FIFO rule 1: oldest first).
        # Entries are lazy: validated when popped, so a group is pushed whenever it may have become ready.
        self.ready: LazyHeap[tuple[int, int, GroupState]] = LazyHeap(self._ready_entry_live)
        self.in_flight = 0
        self.delayed = 0
        self.dedup: dict[str, tuple[str, int, str, float]] = {}  # key -> (message id, seq, group, expires)
        self.dedup_order: deque[tuple[float, str]] = deque()
        # Dedup-queue kind only: content hash -> messages with that content, for collapse at poll time.
        self.content_index: dict[bytes, list[Message]] = {}
        self.content_of: dict[int, bytes] = {}
        self.sent = 0
        self.received = 0
        self.deleted = 0
        self.dead_lettered = 0
        self.expired = 0
        self.age_of_first_attempt = 0.0
        self.empty_receives = 0  # receives (long polls: whole waits) that returned nothing; the shell counts
        # Retry workflow. Groups whose head is reserved for the worker that just failed it wait in that
        # worker's own heap, never in `ready`, so nobody else's receive pays for them.
        self.reserved: dict[str, LazyHeap[tuple[int, int, GroupState]]] = {}
        self.parked: set[str] = set()  # names of groups held by a parked message (checked when read)
        self.policies: dict[str, dict[str, Any]] = {}  # group -> retry policy override
        self.pollers: dict[str, float] = {}  # worker -> last receive, to know whether others are polling
        self.pollers_pruned_at = 0  # size after the last prune (pruned again once it doubles)
        self.sidelined = 0  # groups moved to the spillover lane
        # A queue shared by tenants, split into worker pools or sidelining schedules its ready groups in
        # lanes (scheduling.py); None keeps the one `ready` heap, oldest head first.
        self.scheduler: Scheduler | None = Scheduler(self) if attributes.scheduled else None
        # worker -> the software version it last polled as (X-Strictq-Worker-Version; "" unnamed): group
        # routing's canary share, and what `strictq rollout` takes as the baseline.
        self.worker_versions: dict[str, str] = {}
        self.state_workers: set[str] = set()  # pollers that declared `state` (local state per group)
        self.worker_capacity: dict[str, int] = {}  # worker -> the largest message it takes (none: any)
        # group -> the state-keeping worker that claimed it last, oldest first, bounded (the group may have
        # drained since; its state still lives there): what a routing change hands over. In memory only.
        self.state_holders: dict[str, str] = {}
        # A queue with routing (pins, a canary share) keeps its ready groups in one heap per route.
        self.router: Router | None = self._new_router()
        self.estimates = QueueEstimates()  # learned processing times (estimates.py; not durable)

    def saw_version(self, worker: str, version: str, keeps_state: bool | None = None) -> None:
        """What a poller runs: its version, and (None: not said) whether it keeps local state per group
        (the `state` capability: a routing change moving its groups hands their state over)."""
        if keeps_state is not None:
            if keeps_state:
                self.state_workers.add(worker)
            else:
                self.state_workers.discard(worker)
        versions = self.worker_versions
        if versions.get(worker) == version:
            return
        versions[worker] = version
        if self._prune(versions):
            self.state_workers &= set(versions)

    def saw_capacity(self, worker: str, max_bytes: int) -> None:
        """The largest message `worker` takes (0: any; only limits are kept)."""
        if max_bytes:
            self.worker_capacity[worker] = max_bytes
            self._prune(self.worker_capacity)
        elif self.worker_capacity:
            self.worker_capacity.pop(worker, None)

    def _prune(self, by_worker: dict[str, Any]) -> bool:
        """Forget workers gone quiet (no longer among the pollers) once the map has grown; True: pruned."""
        if len(by_worker) <= 2048 or len(by_worker) <= 2 * len(self.pollers):
            return False
        for name in [w for w in by_worker if w not in self.pollers]:
            del by_worker[name]
        return True

    def held_state(self, group: str, worker: str) -> None:
        """`worker` (which keeps local state) claimed `group`: it holds the group's state now."""
        holders = self.state_holders
        holders.pop(group, None)
        holders[group] = worker
        if len(holders) > MAX_STATE_HOLDERS:
            del holders[next(iter(holders))]

    def _new_router(self) -> Router | None:
        table = self.attributes.routing_table
        return None if table == NO_ROUTING else Router(table, self._ready_entry_live, self.worker_versions)

    def reschedule(self) -> None:
        """The scheduling or routing attributes changed: build the lanes (or routes) anew from the groups,
        or drop them."""
        self.router = self._new_router()
        if self.router is not None:
            self.scheduler = None
            self.ready.clear()
            for group in self.groups.values():
                self.push_ready(group)
        elif self.attributes.scheduled:
            self.scheduler = Scheduler(self)
            self.ready.clear()
            self.scheduler.rebuild()
        else:
            self.scheduler = None
            self.ready.clear()
            for group in self.groups.values():
                self.push_ready(group)

    def has_ready(self, worker: str, version: str | None = None) -> bool:
        """Whether a receive by `worker` (polling as `version`; None: not known, any route counts) may find
        a group now (True may be spurious)."""
        mine = self.reserved.get(worker) if worker and self.reserved else None
        if mine is not None and mine.peek() is not None:
            return True
        if self.router is not None:
            return self.router.has_ready(worker, version)
        if self.scheduler is not None:
            return self.scheduler.has_ready()
        return self.ready.peek() is not None

    def claim_started(self, group: GroupState) -> None:
        if self.scheduler is not None:
            self.scheduler.claim_started(group)

    def push_ready(self, group: GroupState) -> None:
        if group.head_available():
            head = group.messages[0]
            history = head.history
            if history is not None and history.reserved_for:
                heap = self.reserved.get(history.reserved_for)
                if heap is None:
                    heap = self.reserved[history.reserved_for] = LazyHeap(
                        self._reserved_entry_live(history.reserved_for)
                    )
                heap.push((head.key, next(tiebreak), group))
            elif self.router is not None:
                self.router.push((head.key, next(tiebreak), group))
            elif self.scheduler is not None:
                self.scheduler.push((head.key, next(tiebreak), group))
            else:
                self.ready.push((head.key, next(tiebreak), group))

    def pop_ready(self) -> GroupState | None:
        """The group whose available head is the oldest (stale entries are skipped)."""
        entry = self.ready.pop()
        return None if entry is None else entry[2]

    def _ready_entry_live(self, entry: tuple[int, int, GroupState]) -> bool:
        key, _, group = entry
        if not group.head_available():
            return False
        head = group.messages[0]
        return (
            head.key == key
            and (head.history is None or not head.history.reserved_for)
            and self.groups.get(group.name) is group
        )

    def _reserved_entry_live(self, worker: str) -> Callable[[tuple[int, int, GroupState]], bool]:
        def live(entry: tuple[int, int, GroupState]) -> bool:
            key, _, group = entry
            if not group.head_available():
                return False
            head = group.messages[0]
            history = head.history
            return (
                head.key == key
                and history is not None
                and history.reserved_for == worker
                and self.groups.get(group.name) is group
            )

        return live

    def group(self, name: str, partitions: int) -> tuple[GroupState, bool]:
        group = self.groups.get(name)
        if group is not None:
            return group, False
        group = GroupState(name, self, partition_of(name, partitions))
        self.groups[name] = group
        if self.scheduler is not None:
            self.scheduler.place(group)
        return group, True

    def insert(self, message: Message) -> None:
        """Put a message into its group in receipt-key order (appends in the common case)."""
        group = message.group
        messages = group.messages
        if not messages or messages[-1].key < message.key:
            messages.append(message)
        elif message.key < messages[0].key:  # redriven to the head (redrive inserts newest first)
            messages.appendleft(message)
        else:  # moved or redriven: older than messages already there, so find its place
            index = len(messages)
            while index > 0 and messages[index - 1].key > message.key:
                index -= 1
            messages.insert(index, message)
        self.by_id[message.id] = message
        if message.available_at:
            self.delayed += 1
        if self.scheduler is not None:
            self.scheduler.inserted(group)

    def remove(self, message: Message) -> bool:
        """Take a message out entirely; True when its group's claim became empty because of it."""
        group = message.group
        group.messages.remove(message)
        del self.by_id[message.id]
        if message.available_at:
            self.delayed -= 1
            message.available_at = 0.0
        claim_ended = False
        if message.claim_expires:
            message.claim_expires = 0.0
            group.claimed.remove(message)
            self.in_flight -= 1
            claim_ended = not group.claimed
        if self.content_of:
            self._unindex_content(message)
        if self.scheduler is not None:
            self.scheduler.removed(group)
        if not group.messages and self.groups.get(group.name) is group:
            del self.groups[group.name]
        return claim_ended

    def index_content(self, message: Message, digest: bytes) -> None:
        self.content_of[message.key] = digest
        self.content_index.setdefault(digest, []).append(message)

    def _unindex_content(self, message: Message) -> None:
        digest = self.content_of.pop(message.key, None)
        if digest is None:
            return
        same = self.content_index.get(digest)
        if same is not None:
            same.remove(message)
            if not same:
                del self.content_index[digest]

    def expire_dedup(self, now: float) -> None:
        order = self.dedup_order
        while order and order[0][0] <= now:
            expires, key = order.popleft()
            entry = self.dedup.get(key)
            if entry is not None and entry[3] == expires:
                del self.dedup[key]

    def oldest_sent_key(self) -> int | None:
        """Receipt key of the oldest message (O(groups): for metrics, not hot paths)."""
        heads = [g.messages[0].key for g in self.groups.values() if g.messages]
        return min(heads) if heads else None
