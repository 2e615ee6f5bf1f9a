"""`python -m scenarios.topn`: the multi-tier top-N hashtags example, end to end, checked against Spark.

Generates a seeded stream of posts into a file, starts its own `strictq serve` (gateway over TLS, queue
core, egress proxy) in a temporary data directory, runs the four tiers of SDK workers over strict queues
(map -> summarise -> aggregate -> final), prints progress and the top N, then computes the same top N with
a Spark job (local mode) over the raw stream file and says whether they agree. `--stop-worker` stops a
summarise worker mid-stream (a hard stop: its running handlers are cancelled); its groups go to the
other summarise worker with their saved state, and the answer must still be exact.

Exit status: 0 the tiers' answer equals Spark's, 1 it does not (or the run failed), 2 usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from scenarios.settings import ScenarioError, Settings
from scenarios.system import System
from wirelog.files import private_dir, restrict_umask

from .posts import StreamSpec, generate, write_stream
from .run import Plan, StopPlan, TiersReport, run_tiers
from .tiers import Topology

PROG = "python -m scenarios.topn"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--posts", type=_positive, default=20_000, help="posts in the stream (default %(default)s)"
    )
    p.add_argument("--top", type=_positive, default=10, help="N of the top N (default %(default)s)")
    p.add_argument("--seed", type=int, default=18, help="the stream's random seed (default %(default)s)")
    p.add_argument(
        "--vocabulary", type=_positive, default=400, help="distinct tags to draw from (default %(default)s)"
    )
    p.add_argument(
        "--stop-worker",
        action="store_true",
        help="stop a summarise worker mid-stream (once its tier handled a third as many messages as "
        "there are posts); the other one takes its groups",
    )
    p.add_argument(
        "--no-spark", action="store_true", help="skip the Spark check (exit 0 if the tiers answered)"
    )
    p.add_argument(
        "--timeout", type=_seconds, default=600.0, help="seconds to wait for the answer (default %(default)s)"
    )
    p.add_argument(
        "--data-dir", type=Path, help="where the stream, serve and checkpoints go (default: a temp dir)"
    )
    p.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    created = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="strictq-topn-")) if created else args.data_dir
    restrict_umask()
    private_dir(data_dir)
    logging.basicConfig(
        filename=data_dir / "topn.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = asyncio.run(Run(data_dir, args).run())
    except KeyboardInterrupt:
        code = 130
    _close_log()
    if args.keep or not created or code != 0:
        print(f"the run's data (posts, serve log, checkpoints) is in {data_dir}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    return code


def _close_log() -> None:
    """Close the log file before its directory may go: py4j logs from its finalisers at exit."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()


class Run:
    def __init__(self, data_dir: Path, args: argparse.Namespace) -> None:
        self.data_dir = data_dir
        self.args = args
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    async def run(self) -> int:
        args = self.args
        posts_file = self.data_dir / "posts.jsonl"
        spec = StreamSpec(posts=args.posts, vocabulary=args.vocabulary, seed=args.seed)
        count = write_stream(posts_file, generate(spec))
        self.say(f"stream: {count} posts over {spec.vocabulary} tags (seed {spec.seed}) in {posts_file}")
        topology = Topology(top=args.top)
        stop = StopPlan(after=max(1, args.posts // 3)) if args.stop_worker else None
        plan = Plan(topology=topology, stop=stop, timeout=args.timeout)
        system = System(self.data_dir / "system", Settings(workers=plan.worker_count))
        try:
            await system.start()
            self.say(f"strictq serve (pid {system.pid}) on {system.url}")
            report = await run_tiers(system, posts_file, plan, self.say)
        except ScenarioError as exc:
            print(f"{PROG}: the run stopped: {exc}", file=sys.stderr)
            return 1
        finally:
            await system.stop()
        self.show(report)
        if args.no_spark:
            return 0
        return await asyncio.to_thread(self.check, posts_file, report)

    def show(self, report: TiersReport) -> None:
        answer = report.answer
        self.say(
            f"the tiers' answer after {report.seconds:.1f} s: {answer['tags']} distinct tags, "
            f"{answer['mentions']} mentions in {report.posts} posts; {report.checkpoint_saves} checkpoints"
        )
        if report.stopped is not None:
            self.say(
                f"{report.stopped.worker} was stopped mid-stream; afterwards {report.taken_over} claim(s) "
                "on its groups began from the state it had saved"
            )
        for rank, (tag, count) in enumerate(report.top, 1):
            print(f"  {rank:3d}  #{tag:<20} {count}")

    def check(self, posts_file: Path, report: TiersReport) -> int:
        from spark.session import build_session
        from spark.topn import top_hashtags

        self.say("Spark (local mode): the same top N over the raw stream file")
        spark = build_session(app_name="strictq-topn")
        try:
            expected = top_hashtags(spark, posts_file, self.args.top)
        finally:
            spark.stop()
        ours = (report.top, int(report.answer["tags"]), int(report.answer["mentions"]))
        theirs = (expected.top, expected.tags, expected.mentions)
        if ours == theirs:
            self.say(
                f"agree: the tiers' top {self.args.top} equals Spark's "
                f"({expected.tags} tags, {expected.mentions} mentions)"
            )
            return 0
        self.say(f"DISAGREE: tiers {ours}\n  spark {theirs}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
