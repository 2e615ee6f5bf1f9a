"""What the failover scenario sent and processed, per group: order, duplicates and overlaps, checked as
they happen."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict

from strictq.sdk import Message


class Tracker:
    """What was sent and processed, per group: order, duplicates and overlaps as they happen.

    Two handlers of one group may run at once for a moment when a claim is taken away (the fenced worker's
    claims are released while its handler still runs): fencing makes that harmless, since the old holder's
    calls are refused by the proxy, so such a handler cannot succeed. What must never happen is two
    *successful* runs of one group overlapping in time: that is an overlap; the harmless kind is counted as
    `superseded`."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = defaultdict(int)  # next order number = orders sent
        self.done: dict[str, list[int]] = defaultdict(list)  # completion order per group
        self.done_by: dict[tuple[str, int], str] = {}
        self.failed_by: dict[str, set[tuple[str, int]]] = defaultdict(set)
        # (group, n) -> every handler run: (message id, worker, attempt, succeeded)
        self.runs: dict[tuple[str, int], list[tuple[str, str, int, bool]]] = defaultdict(list)
        self.running: dict[str, list[tuple[str, int, float]]] = defaultdict(list)  # group -> runs
        self.last_success: dict[str, tuple[float, float, str, int]] = {}  # group -> (start, end, worker, n)
        self.overlaps: list[str] = []
        self.superseded = 0
        self.changed = asyncio.Event()

    def start(self, group: str, n: int, worker: str) -> float:
        started = time.monotonic()
        if self.running[group]:
            self.superseded += 1
        self.running[group].append((worker, n, started))
        return started

    def end(self, group: str, n: int, worker: str, started: float, ok: bool, message: Message) -> None:
        ended = time.monotonic()
        self.runs[(group, n)].append((message.id, worker, message.attempt, ok))
        runs = self.running[group]
        with contextlib.suppress(ValueError):
            runs.remove((worker, n, started))
        if ok:
            last = self.last_success.get(group)
            if last is not None and last[1] > started:
                self.overlaps.append(
                    f"{group}: order {n} on {worker} overlapped order {last[3]} on {last[2]}, both succeeded"
                )
            self.last_success[group] = (started, ended, worker, n)
            self.done[group].append(n)
            self.done_by.setdefault((group, n), worker)
        else:
            self.failed_by[worker].add((group, n))
        self.changed.set()

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_done(self) -> int:
        return sum(len(set(v)) for v in self.done.values())

    @property
    def lost(self) -> int:
        return sum(n - len(set(self.done.get(g, ()))) for g, n in self.sent.items())

    @property
    def duplicates(self) -> int:
        return sum(len(v) - len(set(v)) for v in self.done.values())

    @property
    def order_violations(self) -> int:
        """Groups whose orders were processed out of order (first completions not 0, 1, 2, ...)."""
        bad = 0
        for group, done in self.done.items():
            first = list(dict.fromkeys(done))
            if first != list(range(len(first))) or any(n >= self.sent[group] for n in first):
                bad += 1
        return bad

    def finished_elsewhere(self, worker: str) -> bool:
        return all(
            (by := self.done_by.get(key)) is not None and by != worker
            for key in self.failed_by.get(worker, ())
        )
