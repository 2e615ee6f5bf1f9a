"""In-process benchmark of the sans-I/O core: send, receive and ack rates at batch 1 and batch 10.

Every operation is followed by `drain_effects()`, as the shell does, and reads the wall clock for `now`
(the shell's `clock()`), so the figures are the core's own cost with no I/O. Each operation is timed on
its own, so receive and ack can be interleaved (a strict queue hands a group to one claimant at a time,
so receiving without acking would run dry) yet reported separately.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from queue_core.machine import QueueCore, SendRequest

BODY = b"x" * 256


@dataclass
class CoreFigure:
    name: str
    batch: int
    groups: int
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else float("nan")

    @property
    def us_per_message(self) -> float:
        return 1e6 * self.seconds / self.messages if self.messages else float("nan")


def _requests(count: int, groups: int, batch: int) -> list[list[SendRequest]]:
    names = [f"g{i}" for i in range(groups)]
    return [
        [SendRequest(BODY, group=names[(start + i) % groups]) for i in range(batch)]
        for start in range(0, count, batch)
    ]


def bench_send(count: int, groups: int, batch: int) -> tuple[CoreFigure, QueueCore]:
    core = QueueCore()
    core.create_queue("bench", time.time())
    core.drain_effects()
    batches = _requests(count, groups, batch)
    clock = time.perf_counter
    wall = time.time
    spent = 0.0
    for requests in batches:
        started = clock()
        core.send("bench", requests, wall())
        core.drain_effects()
        spent += clock() - started
    return CoreFigure("send", batch, groups, count, spent), core


def bench_receive_ack(core: QueueCore, count: int, batch: int, groups: int) -> tuple[CoreFigure, CoreFigure]:
    """Receive `batch`, ack what came, repeat until `count` messages went through; time each side."""
    clock = time.perf_counter
    wall = time.time
    received = acked = 0
    receive_time = ack_time = 0.0
    while received < count:
        started = clock()
        deliveries = core.receive("bench", batch, 30.0, "w", wall())
        core.drain_effects()
        middle = clock()
        receive_time += middle - started
        if not deliveries:
            break
        received += len(deliveries)
        started = clock()
        outcomes = core.ack("bench", [(d.message_id, d.token) for d in deliveries], wall())
        core.drain_effects()
        ack_time += clock() - started
        acked += sum(1 for o in outcomes if o.status == "ok")
    if acked != received:
        raise RuntimeError(f"core bench: acked {acked} of {received}")
    return (
        CoreFigure("receive", batch, groups, received, receive_time),
        CoreFigure("ack", batch, groups, acked, ack_time),
    )


def run_core(count: int, groups: int = 100, progress=print) -> list[CoreFigure]:
    figures: list[CoreFigure] = []
    for batch in (1, 10):
        gc.collect()
        send, core = bench_send(count, groups, batch)
        receive, ack = bench_receive_ack(core, count, batch, groups)
        figures += [send, receive, ack]
        for f in (send, receive, ack):
            progress(
                f"  core {f.name:<7} batch {batch:>2}: {f.rate:>10,.0f} msg/s ({f.us_per_message:.2f} us/msg)"
            )
    # One full cycle with many groups: the extra cost of spreading a batch over distinct groups.
    for many in (groups, 10_000):
        gc.collect()
        send, core = bench_send(count, many, 10)
        receive, ack = bench_receive_ack(core, count, 10, many)
        cycle = CoreFigure("cycle", 10, many, count, send.seconds + receive.seconds + ack.seconds)
        figures.append(cycle)
        progress(
            f"  core send+receive+ack batch 10, {many:,} groups: {cycle.rate:>10,.0f} msg/s"
            f" ({cycle.us_per_message:.2f} us/msg)"
        )
    return figures
