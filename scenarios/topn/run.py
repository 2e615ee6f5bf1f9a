"""The multi-tier top-N run: the tiers' workers against a running `strictq serve`, the stream fed in by the
SDK Producer, optionally one worker stopped mid-stream, until the final tier has the answer.

`run_tiers(system, posts_file, plan)` is what `python -m scenarios.topn` and tests/test_topn.py call; it
returns a `TiersReport` (the answer and what each tier did). The Spark side is `spark.topn.top_hashtags`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scenarios.settings import ScenarioError
from scenarios.system import System
from strictq.sdk import Entry, Producer

from .posts import read_stream
from .state import Checkpoints
from .tiers import Topology
from .workers import Answer, TierStats, TierWorker, WorkerSettings

TIER_NAMES = ("map", "summarise", "aggregate", "final")
FEED_CHUNK = 1000  # posts per send_batch (split by group into requests of up to 100)
Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class StopPlan:
    """Stop worker `index` of `tier` once that tier has handled `after` messages (grace 0: a hard stop,
    running handlers cancelled, everything it held handed back)."""

    tier: str = "summarise"
    index: int = 0
    after: int = 500
    grace: float = 0.0


@dataclass(frozen=True, slots=True)
class Plan:
    topology: Topology = field(default_factory=Topology)
    workers: tuple[int, int, int, int] = (2, 2, 1, 1)  # per tier: fewer at each one
    stop: StopPlan | None = None
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    timeout: float = 300.0

    @property
    def worker_count(self) -> int:
        return sum(self.workers)


@dataclass(frozen=True, slots=True)
class Stopped:
    """The worker stopped mid-stream and what its tier's figures were at that moment."""

    worker: str
    tier: str
    tier_handled: int  # messages its tier had handled when the stop began
    handled: int  # messages it had handled once stopped
    adopted: int  # claims of other workers that had begun from a state it saved (normal churn), before


@dataclass(slots=True)
class TiersReport:
    answer: Answer
    posts: int
    seconds: float
    stats: dict[str, TierStats]
    workers: dict[str, list[str]]  # tier -> worker names
    checkpoint_saves: int = 0
    stopped: Stopped | None = None

    @property
    def top(self) -> list[tuple[str, int]]:
        return [(str(tag), int(count)) for tag, count in self.answer["top"]]

    @property
    def handled_after_stop(self) -> int:
        """Messages the stopped worker handled after its stop (0: it really stopped)."""
        if self.stopped is None:
            return 0
        return self.stats[self.stopped.tier].handled[self.stopped.worker] - self.stopped.handled

    @property
    def taken_over(self) -> int:
        """Claims on the stopped worker's groups, after its stop, that began from the state it had saved."""
        if self.stopped is None:
            return 0
        return self.stats[self.stopped.tier].adopted_from[self.stopped.worker] - self.stopped.adopted


def tier_names(plan: Plan) -> dict[str, list[str]]:
    """Worker credentials worker-1..N handed out tier by tier."""
    names: dict[str, list[str]] = {}
    n = 0
    for tier, count in zip(TIER_NAMES, plan.workers, strict=True):
        names[tier] = [f"worker-{n + i + 1}" for i in range(count)]
        n += count
    return names


async def feed(system: System, topology: Topology, posts_file: Path) -> int:
    """Send every post to its tier-1 (queue, group), numbered per group (k = 1, 2, ...), then each group's
    end marker; the number of posts sent. Any entry not sent stops the run (a duplicate is harmless, a
    gap is not)."""
    numbers: Counter[str] = Counter()
    chunk: list[Entry] = []
    async with Producer(system.config()) as producer:

        async def send(entries: list[Entry]) -> None:
            failed = [r for r in await producer.send_batch(entries) if not r.ok]
            if failed:
                raise ScenarioError(f"{len(failed)} post(s) not sent: {failed[0].status} {failed[0].error}")

        for post in read_stream(posts_file):
            queue, group = topology.source_of(post.author)
            numbers[group] += 1
            chunk.append(
                Entry(queue, {"kind": "post", "id": post.id, "k": numbers[group], "text": post.text}, group)
            )
            if len(chunk) >= FEED_CHUNK:
                await send(chunk)
                chunk = []
        if chunk:
            await send(chunk)
        ends = [
            Entry(queue, {"kind": "end", "posts": numbers[group], "sources": topology.sources}, group)
            for queue, group in topology.sources_all()
        ]
        await send(ends)
    return sum(numbers.values())


async def run_tiers(
    system: System, posts_file: Path, plan: Plan, say: Say = lambda line: None
) -> TiersReport:
    """Run the four tiers over the stream in `posts_file` until the final tier answers (bounded)."""
    names = tier_names(plan)
    if plan.worker_count > len(system.creds.workers):
        raise ScenarioError(f"the plan needs {plan.worker_count} worker credentials")
    checkpoints = Checkpoints(system.data_dir / f"{plan.topology.name}-checkpoints.sqlite3")
    stats = {tier: TierStats() for tier in TIER_NAMES}
    answered: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

    def on_answer(answer: Answer) -> None:
        if not answered.done():
            answered.set_result(answer)

    workers = {
        tier: [
            TierWorker(
                tier,
                name,
                system.config(name),
                plan.topology,
                checkpoints,
                stats[tier],
                settings=plan.settings,
                on_answer=on_answer,
            )
            for name in names[tier]
        ]
        for tier in TIER_NAMES
    }
    everyone = [w for tier in TIER_NAMES for w in workers[tier]]
    started = time.monotonic()
    stopped: Stopped | None = None
    feeding: asyncio.Task[int] | None = None
    try:
        for worker in everyone:
            worker.start()
        say(
            "tiers: "
            + " -> ".join(
                f"{tier} ({len(plan.topology.queues(tier))} queue(s), {len(workers[tier])} worker(s))"
                for tier in TIER_NAMES
            )
        )
        feeding = asyncio.create_task(feed(system, plan.topology, posts_file), name="topn-feed")
        last_line = 0.0
        async with asyncio.timeout(plan.timeout):
            while not answered.done():
                await asyncio.wait([answered], timeout=0.05)
                if feeding.done() and (failed := feeding.exception()) is not None:
                    raise failed
                for worker in everyone:
                    if (error := worker.failed()) is not None:
                        raise ScenarioError(f"{worker.name} ({worker.tier}) stopped: {error}")
                stop = plan.stop
                if stop is not None and stopped is None and stats[stop.tier].total >= stop.after:
                    victim, tier = workers[stop.tier][stop.index], stats[stop.tier]
                    say(
                        f"stopping {victim.name} ({stop.tier}) mid-stream after {tier.total} {stop.tier} "
                        f"message(s), {tier.handled[victim.name]} of them its own (grace {stop.grace:g} s)"
                    )
                    total, adopted = tier.total, tier.adopted_from[victim.name]
                    await victim.stop(stop.grace)  # a handler finishing as the stop began still counts
                    stopped = Stopped(victim.name, stop.tier, total, tier.handled[victim.name], adopted)
                if time.monotonic() - last_line >= 1.0:
                    last_line = time.monotonic()
                    say(progress_line(stats, time.monotonic() - started))
        posts = await feeding
        answer = answered.result()
        say(progress_line(stats, time.monotonic() - started))
    except TimeoutError:
        raise ScenarioError(
            f"no answer from the final tier within {plan.timeout:g} s; {progress_line(stats, plan.timeout)}"
        ) from None
    finally:
        if feeding is not None and not feeding.done():
            feeding.cancel()
            with contextlib.suppress(BaseException):
                await feeding
        await asyncio.gather(*(w.stop(2.0) for w in everyone if not w.stopped), return_exceptions=True)
        saves = checkpoints.saves
        checkpoints.close()
    return TiersReport(
        answer=answer,
        posts=posts,
        seconds=time.monotonic() - started,
        stats=stats,
        workers=names,
        checkpoint_saves=saves,
        stopped=stopped,
    )


def progress_line(stats: dict[str, TierStats], elapsed: float) -> str:
    parts = []
    for tier in TIER_NAMES:
        s = stats[tier]
        extra = f", {s.notes['duplicate']} dup" if s.notes["duplicate"] else ""
        extra += f", {sum(s.adopted.values())} adopted" if s.adopted else ""
        parts.append(f"{tier} {s.total}{extra}")
    return "handled: " + " · ".join(parts)
