"""The gateway's view of a cluster: one `QueueBackend` over the partitions' current owners.

Each cluster partition is a complete queue server state (every queue, the groups that hash to it) served
by one node at a time; `OwnerMap` says which (cluster/owners.py). Group operations go to the group's
partition; queue-wide ones fan out to every partition and merge; long polls wait on every partition at
once (`POST .../wait`, which claims nothing) and then receive. A partition that has no owner, whose owner
answers 421 `not_owner` or cannot be reached is retried (after re-reading the map) for `retry_budget`
seconds, then answered 503 `unavailable` naming the partition. A request that may have been applied (the
connection broke after it was sent) is retried only when doing it twice is harmless (reads, receive,
renew, release, queue metadata); send, ack, report and purge answer 503 at once and the client retries,
as with SQS.

Issue 16: every send is timed and recorded per partition under the caller's trusted client region
(cluster.geo, cluster.traffic: what placement weighs); `reach` rewrites a node's URL as this gateway must
reach it; a receive pass offers the caller's region's partitions first.

A move between queues runs on every partition at once under one id (a group's messages stay in one
partition whatever the queue); its status is the partitions' merged. The retry workflow's operations go to
the group's partition; the queue's parked groups are every partition's, merged.

How each operation is served (by group, by message, fan-out, any partition) is written once in the
internal API's table (queue_core.operations, `Serving`); tests/test_operations_table.py holds this module to
it by counting the requests it sends per partition (`calls`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp

from queue_core.backend import DedupReach
from queue_core.figures import Figures, PartitionFigures, merge_held, merge_queues
from queue_core.internal_auth import InternalSecret
from queue_core.machine import (
    AckOutcome,
    GroupPolicy,
    InvalidArgument,
    MoveStatus,
    NotFound,
    NotInFlight,
    NotOwner,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    QueueNotFound,
    Redriven,
    SendRequest,
    SendResult,
    Unavailable,
)
from queue_core.machine.capabilities import PLAIN, Capabilities
from queue_core.machine.core import RenewMode
from queue_core.machine.gauges import TOP_GROUPS
from queue_core.machine.groups import AUTO_GROUP_PREFIX, partition_of
from queue_core.machine.handover import MAX_GROUPS_PER_CALL, HandoverPolicy, check_states
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.moves import CLUSTER_MOVE_PREFIX
from queue_core.machine.routing import VersionFigures
from queue_core.remote import (
    PROBE_INTERVAL,
    CredentialRefused,
    RemoteQueueService,
    Unreachable,
    client_session,
)
from queue_core.service import MAX_WAIT, Received

from .geo import client_region
from .owners import OwnerMap
from .traffic import TrafficMeter

log = logging.getLogger("strictq.cluster.backend")
T = TypeVar("T")
Operation = Callable[[RemoteQueueService], Awaitable[T]]

MAX_LEARNED = 100_000  # message id -> partition, learned from sends and receives (LRU)
RETRY_PAUSE = 0.5  # at most this long between two tries of a partition without a (reachable) owner
RETRY_AFTER = 1.0  # the Retry-After of the 503 once the budget is spent
FIGURES_DEADLINE = 5.0  # seconds one partition's figures may take (dashboard, /metrics)
WATCH_INTERVAL = 1.0  # how often the owner watch looks for owners it has no client for yet
SPURIOUS_PAUSE = (0.02, 0.5)  # a wait that woke for nothing: pause before waiting again (doubling)


class NoOwner(Unreachable):
    """The owner map names no owner for the partition now (a failover in progress)."""


class ClusterBackend:
    """A `QueueBackend` over a cluster's partitions: one `RemoteQueueService` per (owner URL, partition),
    made when first needed, all on one connection pool."""

    def __init__(
        self,
        owners: OwnerMap,
        *,
        ca_file: str | None = None,
        retry_budget: float = 10.0,
        timeout: float = 30.0,
        probe_interval: float = PROBE_INTERVAL,
        on_close: Callable[[], Awaitable[object]] | None = None,
        meter: TrafficMeter | None = None,
        reach: Mapping[str, str] | None = None,
        secret: InternalSecret | None = None,
    ) -> None:
        """`on_close`: what else to close with it, last (the gateway's NATS connection). `meter`: where
        each send is recorded (partition, client region, latency: cluster.traffic). `reach`: node name ->
        the URL this gateway reaches that node at, instead of the one it announces (NAT, private links,
        the WAN simulation's relays). `secret`: the cluster's internal secret, which the one session sends on
        every call to every node (queue_core.internal_auth)."""
        self.owners = owners
        self.meter = meter
        self.reach: dict[str, str] = dict(reach or {})
        self._on_close = on_close
        self.partitions = owners.partitions
        # Each partition deduplicates its own sends: two groups of different partitions are never compared.
        self.dedup_reach: DedupReach = "partition"
        self.retry_budget = retry_budget
        self._ca_file = ca_file
        self._secret = secret
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._session: aiohttp.ClientSession | None = None
        self._remotes: dict[tuple[str, int], RemoteQueueService] = {}
        self._starting: set[asyncio.Task[None]] = set()
        self._learned: OrderedDict[str, int] = OrderedDict()
        self._rotor = 0
        self._stopping = False
        self._stop: asyncio.Event | None = None
        self._watch: asyncio.Task[None] | None = None
        self.waiting = 0  # long polls waiting on the partitions now (tests look instead of sleeping)

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._session = client_session(self._ca_file, self._secret)
        self._stop = asyncio.Event()
        self._stopping = False
        self._ensure_remotes()
        if self._starting:
            await asyncio.gather(*list(self._starting), return_exceptions=True)
        self._watch = asyncio.create_task(self._watch_owners(), name="strictq-cluster-owner-watch")

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The pooled session of the internal API (None before `start`): the edge's prober shares it."""
        return self._session

    @property
    def refused(self) -> str | None:
        """Why a node refuses this edge's internal secret (its last probe's answer), None if none does."""
        return next((r.refused for r in self._remotes.values() if r.refused is not None), None)

    @property
    def healthy(self) -> bool:
        """Every partition has an owner, and its owner's last probe answered ready."""
        if self._stopping or self._session is None:
            return False
        for partition in range(self.partitions):
            url = self._owner_url(partition)
            remote = None if url is None else self._remotes.get(_key(url, partition))
            if remote is None or not remote.healthy:
                return False
        return True

    def stop_waiting(self) -> None:
        """Shutting down: long polls in flight end now with what they have (nothing)."""
        self._stopping = True
        if self._stop is not None:
            self._stop.set()
        for remote in self._remotes.values():
            remote.stop_waiting()

    async def close(self) -> None:
        self.stop_waiting()
        tasks = [*self._starting, *([self._watch] if self._watch is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watch = None
        await asyncio.gather(*(remote.close() for remote in self._remotes.values()), return_exceptions=True)
        self._remotes.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            await on_close()

    async def _watch_owners(self) -> None:
        """Make a client (and start its readiness probe) for each new owner, so `healthy` sees it."""
        while True:
            await self.owners.changed(WATCH_INTERVAL)
            self._ensure_remotes()

    def _ensure_remotes(self) -> None:
        for partition in range(self.partitions):
            url = self._owner_url(partition)
            if url is not None:
                self._remote(url, partition)

    def _remote(self, url: str, partition: int) -> RemoteQueueService:
        key = _key(url, partition)
        remote = self._remotes.get(key)
        if remote is None:
            if self._session is None:
                raise Unavailable("the cluster gateway's client is not started")
            remote = RemoteQueueService(
                key[0],
                partition=partition,
                session=self._session,
                ca_file=self._ca_file,
                timeout=self._timeout,
                probe_interval=self._probe_interval,
            )
            self._remotes[key] = remote
            task = asyncio.create_task(remote.start(), name=f"strictq-cluster-p{partition}-start")
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
        return remote

    def calls(self) -> dict[int, Counter[str]]:
        """Requests sent so far, by partition and by operation of the internal API's table: how this
        backend spread its calls over the partitions, which tests hold to each operation's `serving`
        (queue_core.operations)."""
        found: dict[int, Counter[str]] = {}
        for (_, partition), remote in self._remotes.items():
            found.setdefault(partition, Counter()).update(remote.calls)
        return found

    # ---------------------------------------------------------------------------------- plumbing
    def _owner_url(self, partition: int) -> str | None:
        """Where this gateway reaches the partition's owner: `reach[node]` when given, else the URL the
        owner announces (None: no owner now). Every call, wait and probe goes here."""
        url = self.owners.owner_url(partition)
        if url is None or not self.reach:
            return url
        node = self.owners.owner_node(partition)
        return self.reach.get(node, url) if node is not None else url

    async def _once(self, partition: int, operation: Operation[T]) -> T:
        """One try on the partition's current owner (NoOwner if it has none)."""
        url = self._owner_url(partition)
        if url is None:
            raise NoOwner(f"cluster partition {partition} has no owner now", partition=partition)
        return await operation(self._remote(url, partition))

    async def _call(self, partition: int, operation: Operation[T], *, safe: bool = True) -> T:
        """`operation` on the partition's owner, tried again after re-reading the owner map while the
        partition has no owner, its node says it is not the owner or cannot be reached, for up to
        `retry_budget` seconds. `safe`: doing it twice is harmless, so a request that may have reached
        the node (the connection broke after sending) is tried again too."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.retry_budget
        while True:
            try:
                return await self._once(partition, operation)
            except (NotOwner, Unreachable) as exc:
                why = exc.message
            except CredentialRefused as exc:  # not applied, and no retry can help: at once
                raise _unavailable(partition, exc.message) from None
            except Unavailable as exc:
                if not safe:
                    raise _unavailable(
                        partition, f"{exc.message} (the request may have been applied: retry it)"
                    ) from None
                why = exc.message
            remaining = give_up - loop.time()
            if remaining <= 0 or self._stopping:
                raise _unavailable(partition, why)
            await self.owners.refresh()
            await self.owners.changed(min(remaining, RETRY_PAUSE))

    async def _every(self, operation: Operation[T], *, safe: bool = True) -> list[T | BaseException]:
        """`operation` on every partition at once; each one's result or error, by partition."""
        return await asyncio.gather(
            *(self._call(p, operation, safe=safe) for p in range(self.partitions)), return_exceptions=True
        )

    async def _all(self, operation: Operation[T], *, safe: bool = True) -> list[T]:
        """`operation` on every partition; the first error (by partition) once every one has ended."""
        results = await self._every(operation, safe=safe)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]

    async def _any(self, operation: Operation[T]) -> T:
        """A read every partition can answer (queue metadata): the first partition that answers, those
        owned in this edge's own region first (the faces read a queue's attributes before each send: that
        read must not cross the WAN when a near owner can answer it)."""
        here = self.meter.edge.region if self.meter is not None else ""
        order = list(range(self.partitions))
        if here:
            order.sort(key=lambda p: self.owners.owner_region(p) != here)  # stable: near first, in order
        for partition in order:
            if self._owner_url(partition) is None:
                continue
            try:
                return await self._once(partition, operation)
            except (NotOwner, Unavailable):
                continue
        return await self._call(0, operation)

    def _learn(self, message_id: str, partition: int) -> None:
        learned = self._learned
        learned[message_id] = partition
        learned.move_to_end(message_id)
        if len(learned) > MAX_LEARNED:
            learned.popitem(last=False)

    def _send_partition(self, request: SendRequest) -> int:
        """A group's partition; a message without a group goes by its dedup id or, failing that, its body,
        so that identical messages meet in one partition (SQS dedup ids, EmoDB dedup queues)."""
        if request.group is not None:
            return partition_of(request.group, self.partitions)
        seed = request.dedup_id.encode() if request.dedup_id is not None else bytes(request.body)
        return int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") % self.partitions

    # ------------------------------------------------------------------------------------ queues
    async def create_queue(self, name: str, attributes: dict[str, Any] | None = None) -> QueueAttributes:
        # Idempotent: a retry after a partial failure creates it where it is missing.
        wanted = {**(attributes or {}), "dedup_scope": _dedup_scope(attributes or {})}
        return (await self._all(lambda r: r.create_queue(name, wanted)))[0]

    async def set_attributes(self, name: str, changes: dict[str, Any]) -> QueueAttributes:
        if "dedup_scope" in changes:
            _dedup_scope(changes)
        return (await self._all(lambda r: r.set_attributes(name, changes)))[0]

    async def delete_queue(self, name: str) -> None:
        results = await self._every(lambda r: r.delete_queue(name))
        errors = [r for r in results if isinstance(r, BaseException)]
        others = [e for e in errors if not isinstance(e, QueueNotFound)]
        if others:
            raise others[0]
        if errors and len(errors) == len(results):
            raise errors[0]
        # Missing in some partitions only: the retry of a delete that failed half-way.

    async def list_queues(self, prefix: str = "") -> list[str]:
        return await self._any(lambda r: r.list_queues(prefix))

    async def attributes(self, name: str) -> QueueAttributes:
        return await self._any(lambda r: r.attributes(name))

    async def created_at(self, name: str) -> float:
        return await self._any(lambda r: r.created_at(name))

    async def metrics(self, name: str) -> QueueMetrics:
        return merge_metrics(await self._all(lambda r: r.metrics(name)))

    async def group_metrics(self, name: str, group: str) -> dict[str, Any]:
        if not group.startswith(AUTO_GROUP_PREFIX):
            return await self._call(
                partition_of(group, self.partitions), lambda r: r.group_metrics(name, group)
            )
        # A group the core named for a message sent without one: its partition is not in its name.
        found = await self._all(lambda r: r.group_metrics(name, group))
        return next(
            (m for m in found if m.get("visible") or m.get("in_flight") or m.get("delayed")), found[0]
        )

    async def figures(self, top: int = TOP_GROUPS) -> Figures:
        """Every partition's figures at once (one try each, at most FIGURES_DEADLINE seconds: a scrape
        answers with what it has), summed per queue (queue_core.figures.merge_queues), and kept per
        partition with the owner node that answered; the partitions that did not answer are `missing`."""

        async def one(partition: int) -> tuple[PartitionFigures, Figures]:
            node = self.owners.owner_node(partition) or ""
            found = await self._once(partition, lambda r: r.figures(top, deadline=FIGURES_DEADLINE))
            if not found.ready:
                raise NotOwner(f"partition {partition} is not ready", partition=partition)
            return PartitionFigures(partition, node, found.queues), found

        answers = await asyncio.gather(*(one(p) for p in range(self.partitions)), return_exceptions=True)
        parts: list[tuple[PartitionFigures, Figures]] = []
        missing: list[int] = []
        for partition, answer in enumerate(answers):
            if isinstance(answer, tuple):
                parts.append(answer)
            elif isinstance(answer, Exception):
                log.debug("figures of partition %d: %s", partition, answer)
                missing.append(partition)
            else:
                raise answer
        return Figures(
            max((f.at for _, f in parts), default=time.time()),
            merge_queues((p.queues for p, _ in parts), top),
            merge_held(f.held for _, f in parts),
            ready=bool(parts),
            partitions=tuple(p for p, _ in parts),
            missing=tuple(missing),
        )

    # -------------------------------------------------------------------------------- messages
    async def send(
        self, queue: str, requests: Sequence[SendRequest], *, create: bool = False
    ) -> list[SendResult | QueueError]:
        plan: dict[int, list[int]] = {}
        for index, request in enumerate(requests):
            plan.setdefault(self._send_partition(request), []).append(index)

        def sending(indexes: list[int]) -> Operation[list[SendResult | QueueError]]:
            return lambda r: r.send(queue, [requests[i] for i in indexes], create=create)

        answers = await asyncio.gather(
            *(self._timed_send(p, len(indexes), sending(indexes)) for p, indexes in plan.items()),
            return_exceptions=True,
        )
        _raise_if_all_failed(answers)
        results: list[SendResult | QueueError | None] = [None] * len(requests)
        for (partition, indexes), answer in zip(plan.items(), answers, strict=True):
            for position, index in enumerate(indexes):
                if isinstance(answer, BaseException):
                    results[index] = _as_queue_error(answer)
                    continue
                result = answer[position]
                if isinstance(result, SendResult):
                    self._learn(result.message_id, partition)
                results[index] = result
        return [r for r in results if r is not None]

    async def _timed_send(
        self, partition: int, messages: int, operation: Operation[list[SendResult | QueueError]]
    ) -> list[SendResult | QueueError]:
        """A send call to the partition, recorded in the meter: its client region (only a trusted one:
        a client's own claim must not move other tenants' partitions) and how long it took."""
        if self.meter is None:
            return await self._call(partition, operation, safe=False)
        caller = client_region()
        region = caller.region if caller is not None and caller.trusted else ""
        loop = asyncio.get_running_loop()
        started = loop.time()
        seconds: float | None = None
        try:
            answer = await self._call(partition, operation, safe=False)
            seconds = loop.time() - started
            return answer
        finally:
            owner = self.owners.owner_node(partition) or ""
            self.meter.record_send(partition, region, messages, seconds, owner=owner)

    async def receive(
        self,
        queue: str,
        limit: int = 10,
        ttl: float | None = None,
        worker: str = "",
        wait: float = 0.0,
        probes: bool = True,
        capabilities: Capabilities = PLAIN,
    ) -> list[Received]:
        """Non-waiting passes over the partitions (from a rotating start, for fairness) until `limit`
        messages are found; with nothing and `wait`, wait on every partition at once, then pass again."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + min(max(wait, 0.0), MAX_WAIT)
        give_up = now + self.retry_budget
        pause = 0.0
        while True:
            got, failed = await self._receive_pass(queue, limit, ttl, worker, probes, capabilities)
            if got or self._stopping:
                return got
            if capabilities.state and self._exporting(queue, worker):
                return got  # a donor's poll answers at once when it has state to upload (as one core's)
            if failed:
                await self.owners.refresh()
            if len(failed) == self.partitions:  # nobody answered: retried as any call is
                remaining = give_up - loop.time()
                if remaining <= 0:
                    raise _unavailable(failed[0][0], failed[0][1].message)
                await self.owners.changed(min(remaining, RETRY_PAUSE))
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            if pause:  # the last wait woke for nothing we could take (another consumer was first, ...)
                await self._sleep(min(pause, remaining))
                remaining = deadline - loop.time()
                if remaining <= 0 or self._stopping:
                    return []
            if not await self._wait_any(queue, worker, remaining):
                return []
            pause = min(max(2 * pause, SPURIOUS_PAUSE[0]), SPURIOUS_PAUSE[1])

    async def _receive_pass(
        self,
        queue: str,
        limit: int,
        ttl: float | None,
        worker: str,
        probes: bool,
        capabilities: Capabilities,
    ) -> tuple[list[Received], list[tuple[int, QueueError]]]:
        """One receive without waiting; what came, and the partitions that could not answer (no owner,
        moved, unreachable) with why.

        Fairness across partitions: each partition schedules its own groups (tenant turns, oldest head
        first), but a receive that took everything from the first partition it asked would put a quiet
        tenant whose group hashes elsewhere behind the whole flood of the others. So a receive of at least
        one message per partition asks every partition at once for its share of `limit`, interleaves the
        answers (each partition's own order kept, so each group's too), then tops up from the partitions
        that had more. A smaller receive takes from the partitions one after another from a rotating start:
        a partition's turn comes at least once in every `partitions` receives (docs/cluster.md)."""
        start = self._rotor
        self._rotor = (start + 1) % self.partitions
        order = self._pass_order(start)
        failed: list[tuple[int, QueueError]] = []
        answers: dict[int, list[Received]] = {}
        if limit >= len(order) > 1:
            base, extra = divmod(limit, len(order))
            shares = {partition: base + (1 if i < extra else 0) for i, partition in enumerate(order)}
            results = await asyncio.gather(
                *(self._take(partition, queue, share, ttl, worker, probes, capabilities)
                  for partition, share in shares.items()),
                return_exceptions=True,
            )  # fmt: skip
            for partition, result in zip(shares, results, strict=True):
                if isinstance(result, NotOwner | Unavailable):
                    failed.append((partition, result))
                elif isinstance(result, BaseException):
                    raise result
                else:
                    answers[partition] = result
            got = _interleaved([answers[p] for p in order if p in answers])
            more = [p for p in order if p in answers and len(answers[p]) == shares[p]]
        else:
            got, more = [], order
        for partition in more:
            if len(got) >= limit:
                break
            try:
                want = limit - len(got)
                topped = await self._take(partition, queue, want, ttl, worker, probes, capabilities)
            except (NotOwner, Unavailable) as exc:
                if partition not in answers:
                    failed.append((partition, exc))
                continue
            got = topped_up(got, topped)
        return got, failed

    async def _take(
        self,
        partition: int,
        queue: str,
        want: int,
        ttl: float | None,
        worker: str,
        probes: bool,
        capabilities: Capabilities,
    ) -> list[Received]:
        """One non-waiting receive of up to `want` messages on the partition's owner."""

        def receiving(r: RemoteQueueService) -> Awaitable[list[Received]]:
            return r.receive(queue, want, ttl, worker, 0.0, probes, capabilities)

        items = await self._once(partition, receiving)
        for item in items:
            self._learn(item.delivery.message_id, partition)
        return items

    def _pass_order(self, start: int) -> list[int]:
        """The partitions from `start` on, those owned in the caller's region first (any answer, a claimed
        one too: it orders only this caller's own polling), so a worker near a partition's owner takes its
        messages before a worker far away does."""
        order = [(start + step) % self.partitions for step in range(self.partitions)]
        caller = client_region()
        if caller is None or not caller.region:
            return order
        near = [p for p in order if self.owners.owner_region(p) == caller.region]
        return near + [p for p in order if p not in near] if near else order

    async def _wait_any(self, queue: str, worker: str, wait: float) -> bool:
        """Wait on every partition at once until one may have something (True), the owner map changes
        (True: look again), the wait ends or the gateway stops (False).

        A partition whose wait ends early without news (its owner stepped down and closed the service
        the wait was on, the node could not be reached, or it answered no before the time was up) is
        waited on again after RETRY_PAUSE, at whichever node owns it then: an owner that stepped down
        and took the partition up again (its stream refused an append during a leader's election) has
        the same URL, so the owner map does not change, and without a new wait on it a message sent
        there would wake nobody until this wait ended, and the receive would answer empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        tasks: dict[asyncio.Task[Any], int] = {}

        def wait_on(partition: int, after: float = 0.0) -> None:
            url = self._owner_url(partition)
            left = deadline - loop.time() - after
            if url is None or left <= 0:
                return
            remote = self._remote(url, partition)
            tasks[asyncio.ensure_future(self._wait_one(remote, queue, worker, left, after))] = partition

        for partition in range(self.partitions):
            wait_on(partition)
        changed = asyncio.ensure_future(self.owners.changed(wait))
        stopped = asyncio.ensure_future(self._stop_event().wait())
        pending: set[asyncio.Task[Any]] = {*tasks, changed, stopped}
        every = set(pending)
        self.waiting += 1
        try:
            while pending:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                done, pending = await asyncio.wait(
                    pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    return False
                for task in done:
                    if task is stopped:
                        return False
                    if task is changed:
                        return True
                    error = task.exception()
                    if error is None and task.result():
                        return True
                    if isinstance(error, QueueError) and not isinstance(error, NotOwner | Unavailable):
                        return True  # no such queue (deleted meanwhile): the pass answers it
                    if error is not None and not isinstance(error, QueueError):
                        raise error
                    # that partition's wait ended early, empty or failed: wait on it again, a bit later
                    before = set(tasks)
                    wait_on(tasks[task], RETRY_PAUSE)
                    fresh = set(tasks) - before
                    pending |= fresh
                    every |= fresh
            return False
        finally:
            self.waiting -= 1
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            for task in every:  # several may have ended together: read every outcome (no "never retrieved")
                if task.done() and not task.cancelled():
                    task.exception()

    async def _wait_one(
        self, remote: RemoteQueueService, queue: str, worker: str, wait: float, after: float
    ) -> bool:
        """One partition's wait (`wait_ready`), `after` seconds from now (a wait taken up again)."""
        if after:
            await self._sleep(after)
            if self._stopping:
                return False
        return await remote.wait_ready(queue, wait, worker)

    def _stop_event(self) -> asyncio.Event:
        if self._stop is None:
            self._stop = asyncio.Event()
        return self._stop

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop_event().wait(), seconds)
        except TimeoutError:
            pass

    # ------------------------------------------------------------------------------------ claims
    async def _by_message(
        self,
        message_ids: Sequence[str],
        call: Callable[[RemoteQueueService, list[int]], Awaitable[list[AckOutcome]]],
        *,
        safe: bool,
        guess: bool = True,
    ) -> list[AckOutcome]:
        """Per-message calls: each message goes to the partition it was learned in, or whose key class its
        id shows (ids the core made are `key:016x` with key = partition mod P); one neither learned nor
        readable (a client's own id) goes to every partition, and its outcome is the one that is not
        `gone` (only its own partition knows it). A guess answered `gone` is asked of every partition
        (a client's id may look like the core's). Outcomes in the caller's order."""
        plan: dict[int, list[int]] = {}
        unknown: list[int] = []
        guessed: list[int] = []
        for index, message_id in enumerate(message_ids):
            partition = self._learned.get(message_id)
            if (
                partition is None
                and guess
                and (partition := _partition_of_id(message_id, self.partitions)) is not None
            ):
                guessed.append(index)
            if partition is None:
                unknown.append(index)
            else:
                plan.setdefault(partition, []).append(index)
        if unknown:
            for partition in range(self.partitions):
                plan[partition] = sorted([*plan.get(partition, []), *unknown])

        def calling(indexes: list[int]) -> Operation[list[AckOutcome]]:
            return lambda r: call(r, indexes)

        answers = await asyncio.gather(
            *(self._call(p, calling(indexes), safe=safe) for p, indexes in plan.items()),
            return_exceptions=True,
        )
        _raise_if_all_failed(answers)
        for answer in answers:  # a refusal of the request itself (a bad field): as one server answers it
            if isinstance(answer, QueueError) and not isinstance(answer, Unavailable | QueueNotFound):
                raise answer
        found: list[list[tuple[int, AckOutcome]]] = [[] for _ in message_ids]
        for (partition, indexes), answer in zip(plan.items(), answers, strict=True):
            for position, index in enumerate(indexes):
                if isinstance(answer, QueueNotFound):
                    continue  # the queue is missing there: so is the message
                if isinstance(answer, BaseException):
                    error = _as_queue_error(answer)
                    found[index].append(
                        (partition, AckOutcome(message_ids[index], error.code, error.message))
                    )
                else:
                    found[index].append((partition, answer[position]))
        outcomes: list[AckOutcome] = []
        for index, candidates in enumerate(found):
            outcome = _merge_outcome(message_ids[index], candidates)
            outcomes.append(outcome[1])
            if outcome[0] is not None and outcome[1].status not in ("gone", "unavailable"):
                self._learn(message_ids[index], outcome[0])
        missed = [index for index in guessed if outcomes[index].status == "gone"]
        if missed:
            again = await self._by_message(
                [message_ids[index] for index in missed],
                lambda r, indexes: call(r, [missed[i] for i in indexes]),
                safe=safe,
                guess=False,
            )
            for index, answered in zip(missed, again, strict=True):
                outcomes[index] = answered
        return outcomes

    async def ack(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        outcomes = await self._by_message(
            [i[0] for i in items], lambda r, idx: r.ack(queue, [items[i] for i in idx], holder), safe=False
        )
        for outcome in outcomes:
            if outcome.status in ("ok", "gone"):
                self._learned.pop(outcome.message_id, None)
        return outcomes

    async def renew(
        self,
        queue: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]:
        return await self._by_message(
            [i[0] for i in items],
            lambda r, idx: r.renew(queue, [items[i] for i in idx], ttl, mode, holder),
            safe=True,
        )

    async def release(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        return await self._by_message(
            [i[0] for i in items], lambda r, idx: r.release(queue, [items[i] for i in idx], holder), safe=True
        )

    async def report(
        self, queue: str, worker: str, results: Sequence[AttemptResult], holder: str | None = None
    ) -> list[AckOutcome]:
        return await self._by_message(
            [r.message_id for r in results],
            lambda r, idx: r.report(queue, worker, [results[i] for i in idx], holder),
            safe=False,
        )

    async def unclaim_all(self, queue: str) -> int:
        return sum(await self._all(lambda r: r.unclaim_all(queue)))

    async def purge(self, queue: str) -> int:
        return sum(await self._all(lambda r: r.purge(queue), safe=False))

    async def peek(self, queue: str, limit: int = 10) -> list[tuple[PeekItem, bytes, str, bytes]]:
        found = [item for items in await self._all(lambda r: r.peek(queue, limit)) for item in items]
        found.sort(key=lambda item: (item[0].sent_at, item[0].key))
        return found[:limit]

    # ------------------------------------------------------------------------------------ moves
    async def start_move(self, source: str, destination: str, move_id: str | None = None) -> MoveStatus:
        """One move over every partition (a group's messages stay in its partition whatever the queue),
        under one id every partition runs it by: any edge answers its status. Safe to repeat: a partition
        that has the id answers the move it started. If a partition refuses, those that started cancel."""
        move_id = move_id or CLUSTER_MOVE_PREFIX + secrets.token_hex(8)
        results = await self._every(lambda r: r.start_move(source, destination, move_id))
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            started = [p for p, r in enumerate(results) if not isinstance(r, BaseException)]
            await asyncio.gather(
                *(self._call(p, lambda r: r.cancel_move(move_id)) for p in started), return_exceptions=True
            )
            raise _first_error(errors)
        return merge_moves(move_id, [r for r in results if isinstance(r, MoveStatus)], [])

    async def move_status(self, move_id: str) -> MoveStatus:
        """Every partition's part, merged (merge_moves); a partition that no longer knows the move (its
        owner changed: moves live in the owner's memory, as in one process across a restart) fails it."""
        if not move_id.startswith(CLUSTER_MOVE_PREFIX):
            raise NotFound(f"no move {move_id!r}", reference=move_id)
        results = await self._every(lambda r: r.move_status(move_id))
        parts = [r for r in results if isinstance(r, MoveStatus)]
        lost = [p for p, r in enumerate(results) if isinstance(r, NotFound)]
        others = [r for r in results if isinstance(r, BaseException) and not isinstance(r, NotFound)]
        if others:
            raise _first_error(others)
        if not parts:
            raise _first_error([r for r in results if isinstance(r, BaseException)])
        return merge_moves(move_id, parts, lost)

    async def cancel_move(self, move_id: str) -> MoveStatus:
        """Cancel the move on every partition still running it; NotInFlight when none was."""
        if not move_id.startswith(CLUSTER_MOVE_PREFIX):
            raise NotFound(f"no move {move_id!r}", reference=move_id)
        results = await self._every(lambda r: r.cancel_move(move_id))
        if not any(isinstance(r, MoveStatus) for r in results):
            errors = [r for r in results if isinstance(r, BaseException)]
            refused = [e for e in errors if isinstance(e, NotInFlight)]
            raise _first_error(refused or errors)
        return await self.move_status(move_id)

    # ------------------------------------------------------------------------------------ handovers
    def _plan_groups(self, groups: Sequence[str]) -> dict[int, list[str]]:
        """Named groups by partition; a group the core named (no partition in its name) on every one."""
        plan: dict[int, list[str]] = {}
        for group in groups:
            targets = (
                range(self.partitions)
                if group.startswith(AUTO_GROUP_PREFIX)
                else [partition_of(group, self.partitions)]
            )
            for partition in targets:
                plan.setdefault(partition, []).append(group)
        return plan

    async def hand_over(
        self, queue: str, groups: Sequence[str] | None, from_worker: str, policy: HandoverPolicy | None = None
    ) -> tuple[list[str], list[str]]:
        """Named groups on their partitions, None (every group of the donor) on every partition; marked and
        already moving in the caller's order (None: sorted)."""
        if groups is None:
            parts = await self._all(lambda r: r.hand_over(queue, None, from_worker, policy))
            return sorted({g for p in parts for g in p[0]}), sorted({g for p in parts for g in p[1]})
        if len(groups) > MAX_GROUPS_PER_CALL:  # as one core refuses it (each partition sees only its share)
            raise InvalidArgument(f"at most {MAX_GROUPS_PER_CALL} groups per call", field="groups")
        plan = self._plan_groups(groups)

        def marking(names: list[str]) -> Operation[tuple[list[str], list[str]]]:
            return lambda r: r.hand_over(queue, names, from_worker, policy)

        answers = await asyncio.gather(*(self._call(p, marking(names)) for p, names in plan.items()))
        marked = {g for answer in answers for g in answer[0]}
        already = {g for answer in answers for g in answer[1]} - marked
        order = list(dict.fromkeys(groups))
        return [g for g in order if g in marked], [g for g in order if g in already]

    async def release_handover(self, queue: str, groups: Sequence[str]) -> list[str]:
        if len(groups) > MAX_GROUPS_PER_CALL:
            raise InvalidArgument(f"at most {MAX_GROUPS_PER_CALL} groups per call", field="groups")
        plan = self._plan_groups(groups)

        def releasing(names: list[str]) -> Operation[list[str]]:
            return lambda r: r.release_handover(queue, names)

        answers = await asyncio.gather(*(self._call(p, releasing(names)) for p, names in plan.items()))
        released = {g for answer in answers for g in answer}
        return [g for g in dict.fromkeys(groups) if g in released]

    async def handovers(self, queue: str) -> list[dict[str, Any]]:
        """Every partition's groups in handover, by group name."""
        rows = [row for rows in await self._all(lambda r: r.handovers(queue)) for row in rows]
        return sorted(rows, key=lambda row: str(row.get("group", "")))

    async def version_figures(self, queue: str, recent: float) -> VersionFigures:
        """Every partition's (each counts its own pollers and attempts), merged."""
        return VersionFigures.merged(await self._all(lambda r: r.version_figures(queue, recent)))

    def _exporting(self, queue: str, worker: str) -> bool:
        return any(remote.has_exports(queue, worker) for remote in self._remotes.values())

    def export_requests(self, queue: str, worker: str) -> list[str]:
        """What the partitions the last poll asked named for `worker` to upload (each partition names
        its own groups; one not asked by that poll names them on a later one)."""
        named = (g for remote in self._remotes.values() for g in remote.export_requests(queue, worker))
        return list(dict.fromkeys(named))

    async def put_state(self, queue: str, worker: str, states: dict[str, Any]) -> dict[str, str]:
        """The whole upload checked first (as one core checks it), then each group on its partition; a
        group the core named, on every partition, `ok` where one took it."""
        check_states(states)

        def uploading(names: list[str]) -> Operation[dict[str, str]]:
            return lambda r: r.put_state(queue, worker, {name: states[name] for name in names})

        plan = self._plan_groups(list(states))
        answers = await asyncio.gather(*(self._call(p, uploading(names)) for p, names in plan.items()))
        taken = {g for answer in answers for g, status in answer.items() if status == "ok"}
        return {g: "ok" if g in taken else "not_requested" for g in states}

    # ---------------------------------------------------------------------------- the retry workflow
    async def _by_group(self, group: str, operation: Operation[T], known: Callable[[T], bool]) -> T:
        """`operation` on the group's partition. A group the core named (a message sent without one) does
        not show its cluster partition: every partition is asked and the answer of one that `known`s the
        group is taken (one that does not have it answers NotFound, a default or nothing)."""
        if not group.startswith(AUTO_GROUP_PREFIX):
            return await self._call(partition_of(group, self.partitions), operation)
        results = await self._every(operation)
        answers = [r for r in results if not isinstance(r, BaseException)]
        if not answers:
            errors = [r for r in results if isinstance(r, BaseException)]
            raise _first_error([e for e in errors if not isinstance(e, NotFound)] or errors)
        return next((a for a in answers if known(a)), answers[0])

    async def release_group(self, queue: str, group: str) -> int:
        return await self._by_group(group, lambda r: r.release_group(queue, group), lambda n: True)

    async def redrive_group(self, queue: str, group: str) -> Redriven:
        return await self._by_group(group, lambda r: r.redrive_group(queue, group), lambda d: True)

    async def parked_groups(self, queue: str) -> list[str]:
        """Every partition's parked groups, one sorted list (each group is parked in one partition)."""
        return sorted({g for groups in await self._all(lambda r: r.parked_groups(queue)) for g in groups})

    async def group_policy(self, queue: str, group: str) -> GroupPolicy:
        return await self._by_group(group, lambda r: r.group_policy(queue, group), lambda p: bool(p.override))

    async def set_group_policy(self, queue: str, group: str, override: dict[str, Any] | None) -> GroupPolicy:
        return await self._by_group(
            group, lambda r: r.set_group_policy(queue, group, override), lambda p: True
        )

    async def group_log(self, queue: str, group: str, limit: int = 50) -> list[dict[str, Any]]:
        return await self._by_group(group, lambda r: r.group_log(queue, group, limit), bool)


# ---------------------------------------------------------------------------------------- merging
def merge_metrics(parts: Sequence[QueueMetrics]) -> QueueMetrics:
    """A queue's metrics over its partitions: counts summed, ages the oldest."""
    first = parts[0]
    summed = {
        name: sum(getattr(p, name) for p in parts)
        for name in ("visible", "in_flight", "delayed", "total", "groups", "sent", "received", "deleted")
    }
    return dataclasses.replace(
        first,
        **summed,
        dead_lettered=sum(p.dead_lettered for p in parts),
        expired=sum(p.expired for p in parts),
        oldest_age=max(p.oldest_age for p in parts),
        age_of_first_attempt=max(p.age_of_first_attempt for p in parts),
    )


def merge_moves(move_id: str, parts: Sequence[MoveStatus], lost: Sequence[int]) -> MoveStatus:
    """One move over the partitions: running while any part runs, then failed if any part failed (or a
    partition lost it: `lost`), cancelled if any was cancelled, else done; counts summed."""
    states = {part.state for part in parts}
    failures = [part.error for part in parts if part.state == "failed" and part.error]
    failures += [f"partition {p} lost the move (its owner changed); start it again" for p in lost]
    if "running" in states:
        state = "running"
    elif "failed" in states or lost:
        state = "failed"
    elif "cancelled" in states:
        state = "cancelled"
    else:
        state = "done"
    first = parts[0]
    return MoveStatus(
        id=move_id,
        source=first.source,
        destination=first.destination,
        moved=sum(part.moved for part in parts),
        remaining=sum(part.remaining for part in parts),
        state=state,
        error="; ".join(dict.fromkeys(failures)),
        started_at=min(part.started_at for part in parts),
        finished_at=0.0 if state == "running" else max(part.finished_at for part in parts),
    )


def _first_error(errors: Sequence[BaseException]) -> BaseException:
    """The error to raise for a fan-out: a cancellation or other non-queue error first."""
    return next((e for e in errors if not isinstance(e, Exception)), errors[0])


def _merge_outcome(
    message_id: str, candidates: list[tuple[int, AckOutcome]]
) -> tuple[int | None, AckOutcome]:
    """The outcome of a message asked of several partitions: `ok` first, then any other answer of the
    partition that knows it, then a partition's failure (it may be the one that knows it), else `gone`."""
    for wanted in (
        lambda o: o.status == "ok",
        lambda o: o.status not in ("gone", "unavailable"),
        lambda o: o.status == "unavailable",
    ):
        for partition, outcome in candidates:
            if wanted(outcome):
                return partition, outcome
    if candidates:
        return candidates[0]
    return None, AckOutcome(message_id, "gone", "no such message (already deleted?)")


def _raise_if_all_failed(answers: Sequence[object]) -> None:
    """Every partition's call failed: the request failed as a whole (as with one server)."""
    errors = [a for a in answers if isinstance(a, BaseException)]
    for error in errors:
        if not isinstance(error, Exception):
            raise error  # cancellation and the like
    if errors and len(errors) == len(answers):
        raise errors[0]


def _as_queue_error(error: BaseException) -> QueueError:
    if isinstance(error, QueueError):
        return error
    raise error


def _unavailable(partition: int, why: str) -> Unavailable:
    error = Unavailable(f"cluster partition {partition} is unavailable: {why}", partition=partition)
    error.retry_after = RETRY_AFTER
    return error


def _key(url: str, partition: int) -> tuple[str, int]:
    return url.rstrip("/"), partition


def topped_up(got: list[Received], more: list[Received]) -> list[Received]:
    """`got` and then `more`, one copy of each message: a message claimed again by the later take (its
    first claim ran out in between) keeps its place with the newer claim, whose receipt is the one that
    holds. One answer never holds a message twice (a client would see its group go backwards)."""
    if not got:
        return more
    places = {item.delivery.message_id: index for index, item in enumerate(got)}
    out = list(got)
    for item in more:
        index = places.get(item.delivery.message_id)
        if index is None:
            places[item.delivery.message_id] = len(out)
            out.append(item)
        else:
            out[index] = item
    return out


def _interleaved(answers: list[list[Received]]) -> list[Received]:
    """The partitions' answers taken one item of each in turn; each answer's own order is kept."""
    out: list[Received] = []
    for row in itertools.zip_longest(*answers):
        out.extend(item for item in row if item is not None)
    return out


def _dedup_scope(attributes: dict[str, Any]) -> str:
    """A cluster's queues deduplicate per group: each partition holds its own groups' deduplication ids and
    never sees another partition's, so a queue-wide scope could not be kept (SQS high-throughput FIFO's
    `DeduplicationScope=messageGroup`, which the SQS face then reports). Asking for the queue-wide scope is
    refused rather than quietly weakened."""
    scope = attributes.get("dedup_scope", "group")
    if scope == "queue":
        raise InvalidArgument(
            "a cluster deduplicates per message group (DeduplicationScope messageGroup): each partition "
            "keeps its own groups' deduplication ids; leave the scope out or ask for the group scope",
            field="dedup_scope",
        )
    return str(scope)


def _partition_of_id(message_id: str, partitions: int) -> int | None:
    """The partition whose key class a core-made id (`key:016x`, queue_core.machine.records) shows."""
    if len(message_id) != 16:
        return None
    try:
        return int(message_id, 16) % partitions
    except ValueError:
        return None
