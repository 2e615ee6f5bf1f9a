"""The long-poll benchmark (issue 19): what waiting workers cost a queue server, woken one at a time on a
send or an ack (queue_core/long_polls.py) against every waiting receive woken (the design before it, the
peer in the same run).

In-process `QueueService` (real SQLite, durable): N workers long-poll one queue (receive 10, wait 5 s, ack
what came); messages are sent one at a time over 50 groups, each send awaited, which is how a lightly
loaded queue with many idle workers runs. Figures per N: process CPU per message from the first send to the
last ack, and the core polls per message (each a `Supervisor.poll`). Modes alternate per N, the median of
each kept (the machine is shared).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from queue_core.long_polls import LongPolls, MayTake
from queue_core.machine import SendRequest
from queue_core.service import QueueService

from .scenarios import Progress, Settings, measured, provenance

WORKERS = (1, 16, 64, 256)
GROUPS = 50


class WakeEveryone(LongPolls):
    """The peer: a send or an ack wakes every waiting receive, as one `asyncio.Event` per queue did."""

    def wake_one(self, queue: str, may_take: MayTake) -> None:
        self.wake_all(queue)


def run_long_poll_bench(st: Settings, progress: Progress) -> dict[str, Any]:
    started = time.perf_counter()
    messages = 500 if st.quick else 2_000
    repeats = 1 if st.quick else 3
    rows: list[dict[str, Any]] = []
    for workers in WORKERS:
        runs: dict[str, list[tuple[float, float]]] = {"one": [], "every": []}
        for _ in range(repeats):
            for mode in ("one", "every"):
                runs[mode].append(asyncio.run(_measure(workers, messages, mode == "every")))
        row: dict[str, Any] = {"workers": workers}
        for mode, figures in runs.items():
            row[f"{mode}_us"] = statistics.median(cpu for cpu, _ in figures)
            row[f"{mode}_polls"] = statistics.median(polls for _, polls in figures)
        rows.append(row)
        progress(
            f"long polls: {workers} waiting workers: woken one at a time {row['one_us']:.0f} µs CPU/msg"
            f" ({row['one_polls']:.1f} polls/msg), every one woken {row['every_us']:.0f} µs"
            f" ({row['every_polls']:.1f} polls/msg)"
        )
    return {"messages": messages, "groups": GROUPS, "rows": rows, **provenance(st, started)}


async def _measure(workers: int, messages: int, wake_everyone: bool) -> tuple[float, float]:
    """(CPU µs per message, core polls per message) with `workers` long-polling workers."""
    with tempfile.TemporaryDirectory(prefix="strictq-longpoll-") as data:
        service = QueueService(Path(data))
        if wake_everyone:
            service._long_polls = WakeEveryone()  # the peer's wake: set before any receive waits
        await service.start()
        await service.create_queue("q")
        polls = 0
        poll = service.supervisor.poll

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal polls
            polls += 1
            return poll(*args, **kwargs)

        service.supervisor.poll = counted  # type: ignore[method-assign]
        acked = 0
        done = asyncio.Event()

        async def work(name: str) -> None:
            nonlocal acked
            while not done.is_set():
                got = await service.receive("q", 10, 30.0, name, wait=5.0)
                if got:
                    items = [(r.delivery.message_id, r.delivery.token) for r in got]
                    await service.ack("q", items, holder=name)
                    acked += len(got)
                    if acked >= messages:
                        done.set()

        tasks = [asyncio.create_task(work(f"w{i}")) for i in range(workers)]
        for _ in range(500):  # until every worker waits (bounded)
            if service.has_waiters("q") and polls >= workers:
                break
            await asyncio.sleep(0.01)
        polls = 0
        cpu = time.process_time()
        for i in range(messages):
            await service.send("q", [SendRequest(b"m%d" % i, group=f"g{i % GROUPS}")])
        await asyncio.wait_for(done.wait(), 120)
        cpu = time.process_time() - cpu
        service.stop_waiting()
        await asyncio.gather(*tasks)
        await service.close()
        return cpu / messages * 1e6, polls / messages


def long_poll_section(results: dict[str, Any], add: Any) -> None:
    """The report's long-poll section (bench/report.py calls it; nothing when it did not run)."""
    r = results.get("longpoll")
    if not r:
        return
    add("## Long polls: what waiting workers cost (issue 19)\n")
    add(
        measured(r)
        + f". The scenario took {r['seconds']:.0f} s. In-process `QueueService` (real SQLite, durable); N"
        " workers long-poll one queue (receive 10, wait 5 s, ack what came) while"
        f" {r['messages']:,} messages are sent one at a time over {r['groups']} groups: a lightly loaded"
        " queue with idle workers. *One at a time*: a send or an ack wakes the longest-waiting receive that"
        " may take something, which passes the wake on (queue_core/long_polls.py); *every one*: the peer,"
        " every waiting receive woken by every send and ack (the design before issue 19). Process CPU per"
        " message from the first send to the last ack, and core polls per message; modes alternate, the"
        " median of each (bench/long_poll_bench.py).\n"
    )
    add(
        "| waiting workers | CPU µs/msg, one at a time | polls/msg | CPU µs/msg, every one woken | polls/msg"
        " | ratio |\n|---:|---:|---:|---:|---:|---:|"
    )
    for row in r["rows"]:
        add(
            f"| {row['workers']} | {row['one_us']:,.0f} | {row['one_polls']:.1f} | {row['every_us']:,.0f}"
            f" | {row['every_polls']:.1f} | {row['every_us'] / row['one_us']:.2f}x |"
        )
    add(
        "\nWoken one at a time, a worker more costs next to nothing while it waits; woken all at once, each"
        " send and each ack costs a poll per waiting worker. Under a saturating load (the gateway rows above)"
        " the receives rarely wait, and the two designs measured alike there.\n"
    )
