"""A worker of one tier: an SDK `Worker` per queue of the tier, one `GroupStates`, emits by `Producer`.

Per delivered message (strictq.sdk runs a group's messages one at a time, in order):
1. the claim: if the local state of the message's group was not made under this claim's fencing token
   (a group new to this worker, or one it had lost and got back), the latest saved state is imported
   first (`Checkpoints`: what the previous holder saved; nothing saved: a fresh state);
2. the tier's step (scenarios/topn/tiers.py) on a copy of the group's state;
3. its emits go to the next tier's queues (all must be sent, else the attempt fails and is redelivered);
4. the new state is committed locally and saved under the claim's token (refused: a newer claim holds the
   group, this attempt fails);
5. the handler returns and the SDK acks.
A redelivery after 3 or after 4 is harmless: the emits are keyed and the steps skip what they counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strictq.sdk import AttemptFailed, ClientConfig, Entry, Message, Producer, Worker

from .state import Checkpoints, GroupStates
from .tiers import TIERS, Emit, Topology

Answer = dict[str, Any]


@dataclass(slots=True)
class TierStats:
    """What one tier's workers did (read by the progress line and the checks)."""

    handled: Counter[str] = field(default_factory=Counter)  # per worker
    notes: Counter[str] = field(default_factory=Counter)  # counted, duplicate, end, ...
    emitted: int = 0
    adopted: Counter[str] = field(default_factory=Counter)  # worker -> groups it took over with state
    adopted_from: Counter[str] = field(default_factory=Counter)  # worker whose saved state was taken over
    stale: int = 0  # attempts refused because a newer claim held the group

    @property
    def total(self) -> int:
        return sum(self.handled.values())


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    ttl: float = 10.0
    limit: int = 16
    concurrency: int = 16
    wait: float = 0.5  # the long poll (a stop waits for the poll in flight)
    grace: float = 2.0
    report_results: bool | None = None  # None: attempt results go to failure management (the default)


class TierWorker:
    """One worker of `tier` named `name` (its credential), polling every queue of the tier."""

    def __init__(
        self,
        tier: str,
        name: str,
        config: ClientConfig,
        topology: Topology,
        checkpoints: Checkpoints,
        stats: TierStats,
        *,
        settings: WorkerSettings = WorkerSettings(),
        on_answer: Callable[[Answer], None] = lambda answer: None,
    ) -> None:
        self.tier = tier
        self.name = name
        self.topology = topology
        self.checkpoints = checkpoints
        self.stats = stats
        self.on_answer = on_answer
        self.states = GroupStates(tier)
        self._step = TIERS[tier]
        self._held: dict[str, int] = {}  # group -> the claim token its local state is valid for
        self._producer = Producer(config)
        self.workers = [
            Worker(
                queue,
                self.handle,
                probe=self.probe,
                config=config,
                ttl=settings.ttl,
                limit=settings.limit,
                concurrency=settings.concurrency,
                wait=settings.wait,
                grace=settings.grace,
                retry_backoff=(0.05, 0.5),
                report_results=settings.report_results,
            )
            for queue in topology.queues(tier)
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self.stopped = False

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(worker.run(), name=f"topn-{self.name}-{worker.queue}")
            for worker in self.workers
        ]

    async def stop(self, grace: float | None = None) -> None:
        """Stop polling; running handlers get `grace` seconds (0: cancelled now), the rest goes back."""
        self.stopped = True
        for worker in self.workers:
            worker.stop(grace)
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        await self._producer.close()

    def failed(self) -> BaseException | None:
        """The error a worker of this tier stopped with (a credential refused, ...), if one did."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def probe(self, message: Message) -> None:
        """Failure management's probe: the tier's path is healthy when the worker polls at all."""

    async def handle(self, message: Message) -> None:
        group, token = message.group, int(message.token or 0)
        self._claim(group, token)
        before = self.states.get(group)
        step = self._step(self.topology, self.states.get(group), group, dict(message.payload))
        if step.emits:
            await self._send(step.emits)
        if step.state != before:
            self.states.put(group, step.state)
            if not self.checkpoints.save(self.tier, group, token, self.name, self.states.export([group])):
                self._held.pop(group, None)
                self.stats.stale += 1
                raise AttemptFailed("stale claim: a newer claim on the group saved its state")
        self.stats.handled[self.name] += 1
        self.stats.notes[step.note] += 1
        self.stats.emitted += len(step.emits)
        if step.result is not None:
            self.on_answer(step.result)

    def _claim(self, group: str, token: int) -> None:
        """Make the local state of `group` the latest saved one when this claim is new to it."""
        if self._held.get(group) == token:
            return
        saved = self.checkpoints.load(self.tier, group)
        if saved is not None and saved.token > token:
            self.stats.stale += 1
            raise AttemptFailed("stale claim: the group was claimed again since")
        self.states.drop([group])
        if saved is not None:
            self.states.import_(saved.blob)
            if saved.worker != self.name:
                self.stats.adopted[self.name] += 1
                self.stats.adopted_from[saved.worker] += 1
        self._held[group] = token

    async def _send(self, emits: list[Emit]) -> None:
        results = await self._producer.send_batch([Entry(e.queue, e.payload, e.group) for e in emits])
        failed = [r for r in results if not r.ok]
        if failed:  # resent on the redelivery: the emits are keyed, a copy that did arrive is harmless
            first = failed[0]
            raise AttemptFailed(f"{len(failed)} emit(s) not sent: {first.status} {first.error}")
