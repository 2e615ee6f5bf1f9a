"""`strictq demo` (and `make demo`): the whole single-machine system, narrated, in a temporary data dir.

It runs the failover scenario (scenarios.failover: `strictq serve` with the gateway over TLS, the queue core
and the egress proxy; a fake payments backend; a producer; three workers of which one turns faulty, is
fenced and restored by a probe; a backend outage that suspends and resumes the queue), then the tools on
what it recorded: `strictq index` (Spark) over the wire log, one message's whole story with `strictq
search`, the top known error cases with `strictq errors`, and `strictq replay` of a changed worker version
with its diff. It ends with a summary and exits 0 only if nothing was lost and no group went out of order.

`--no-spark` leaves out the Spark steps (index, search, errors); `--fast` uses shorter intervals (what
the CI test runs); `--keep` keeps the data directory for poking around.

`--rollout` runs the canary rollouts demo instead (scenarios/rollout_demo.py, issue 18): a bad version
reverted by the live gate, a diverging one reverted by the replay gate, a good one rolled out to 100 %.

`--geo` runs the regions demo instead (scenarios/geo_demo.py, issue 16): three simulated regions, a
producer's partition moved near it by placement with its send latency measured before and after, and
follow-the-sun over a compressed day.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from wirelog.files import private_dir, restrict_umask

DESCRIPTION = __doc__.split("\n\n")[0]
STEP_TIMEOUT = 600.0  # seconds for one tool run (Spark's first start is slow on a busy machine)
SHOWN_LINES = 24  # of a tool's output


def register(commands: Any) -> None:
    """Add `demo` to the strictq subparsers (imports nothing heavy until it runs). strictq's CLI finds
    this through the `strictq.commands` entry point (pyproject.toml): it never imports scenarios."""
    demo = commands.add_parser(
        "demo",
        help="run the whole system on this machine and narrate failure management (make demo)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--geo",
        action="store_true",
        help="the regions demo instead: a producer's partition placed near it, follow-the-sun (scenarios/"
        "geo_demo.py; --fast, --keep and --data-dir apply)",
    )
    demo.add_argument(
        "--rollout",
        action="store_true",
        help="the canary rollouts demo instead: one reverted on failures, one on a replay diff, one "
        "completed (scenarios/rollout_demo.py; --fast, --keep and --data-dir apply)",
    )
    demo.add_argument("--no-spark", action="store_true", help="skip strictq index / search / errors (Spark)")
    demo.add_argument("--no-replay", action="store_true", help="skip strictq replay")
    demo.add_argument("--fast", action="store_true", help="shorter intervals and fewer customers (CI)")
    demo.add_argument("--workers", type=int, default=3, help="SDK workers (default %(default)s, at least 3)")
    demo.add_argument("--data-dir", type=Path, help="where the system keeps its data (default: a temp dir)")
    demo.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.geo:
        from .geo_demo import cmd_geo_demo  # the world of regions: only when asked for

        return cmd_geo_demo(args)
    if args.workers < 3:
        print("strictq: demo: --workers must be at least 3", file=sys.stderr)
        return 2
    created = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="strictq-demo-")) if created else args.data_dir
    restrict_umask()  # the demo's wire log, index and reports: not for other users
    private_dir(data_dir)
    # The narration is the output; the libraries' own logs (e.g. each failed handler's warning) go here.
    logging.basicConfig(
        filename=data_dir / "demo.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    demo = Demo(data_dir, args)
    try:
        code = asyncio.run(demo.run_rollouts() if args.rollout else demo.run())
    except KeyboardInterrupt:
        code = 130
    keep = args.keep or not created or code != 0
    if keep:
        print(f"\nthe demo's data (wire log, index, replay report, logs) is in {data_dir}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    return code


class Demo:
    def __init__(self, data_dir: Path, args: argparse.Namespace) -> None:
        self.data_dir = data_dir
        self.args = args
        self.started = time.monotonic()
        self.sections = 0

    # -- narration ---------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def section(self, title: str) -> None:
        self.sections += 1
        print(f"\n== {self.sections}. {title}", flush=True)

    # -- the story ---------------------------------------------------------------------------------------
    async def run(self) -> int:
        from .failover import Scenario, ScenarioError, Settings

        fast = self.args.fast
        settings = Settings(
            workers=self.args.workers,
            groups=8 if fast else 12,
            round_interval=0.2 if fast else 0.3,
            probe_interval=0.5 if fast else 1.0,
            probe_backoff_max=0.5 if fast else 1.0,
            # The story heals the fenced worker only once its failed orders are done elsewhere, which
            # takes longer on a loaded machine: give it a phase's worth of probes (the demo does not
            # show blacklisting) so a slow phase is not read as a worker that never recovers.
            blacklist_after=60 if fast else 30,
            outage_hold=0.5 if fast else 2.0,
            poll_wait=0.5 if fast else 1.0,
        )
        print(f"strictq demo: failure management on one machine (data in {self.data_dir})", flush=True)
        scenario = Scenario(self.data_dir / "system", settings, self.say, self.section)
        scenario.checkpoint = self.status
        self.scenario = scenario
        try:
            report = await scenario.run()
        except ScenarioError as exc:
            print(f"\nstrictq demo: the scenario stopped: {exc}", flush=True)
            return 1
        if not self.args.no_spark:
            await self.spark()
        if not self.args.no_replay:
            await self.replay()
        self.summary()
        return 0 if report.lost == 0 and report.order_violations == 0 else 1

    async def run_rollouts(self) -> int:
        from .rollout_demo import RolloutDemo

        print(f"strictq demo: canary rollouts on one machine (data in {self.data_dir})", flush=True)
        code = await RolloutDemo(self.data_dir, self.args, self.say, self.section, self.tool).run()
        print(f"total {time.monotonic() - self.started:.0f} s", flush=True)
        return code

    async def status(self, checkpoint: str) -> None:
        """`strictq status` while the system runs (after the fence, and while the queue is suspended)."""
        system = self.scenario.system
        env = {
            **os.environ,
            "STRICTQ_URL": system.url,
            "STRICTQ_CA_FILE": system.ca,
            "STRICTQ_ADMIN_KEY": system.creds.admin,
        }
        await self.tool(["status", "--events", "0"], env=env, within=30)

    async def spark(self) -> None:
        system = self.scenario.system
        wirelog, index = system.wirelog, self.data_dir / "index"
        self.section("the wire log, indexed with Spark")
        await self.tool(["index", "--wirelog", str(wirelog), "--index", str(index)])
        message = self.story_message()
        if message is not None:
            self.section("one message's whole story")
            self.say(
                f"order {message[1]} of {message[0]}: {self.scenario.report.faulty_worker} failed it, "
                "another worker charged it"
            )
            await self.tool(["search", "--index", str(index), "--message-id", message[2]])
        self.section("the top known error cases")
        await self.tool(
            ["errors", "--index", str(index), "--wirelog", str(wirelog), "--top", "3", "--no-events"]
        )

    def story_message(self) -> tuple[str, int, str] | None:
        """A message the faulty worker failed and another worker finished: its story has both."""
        tracker, faulty = self.scenario.tracker, self.scenario.report.faulty_worker
        for key in self.scenario.report.faulty_failed:
            runs = tracker.runs.get(key, [])
            if any(worker != faulty and ok for _, worker, _, ok in runs):
                return key[0], key[1], runs[0][0]
        return None

    async def replay(self) -> None:
        """Replay a few cleanly processed orders against version 2 of the worker (it charges in euros)."""
        tracker, system = self.scenario.tracker, self.scenario.system
        clean: dict[str, list[str]] = {}
        for (group, _n), runs in sorted(tracker.runs.items()):
            if len(runs) == 1 and runs[0][3] and runs[0][2] == 1:
                clean.setdefault(group, []).append(runs[0][0])
        if not clean:
            return
        group, ids = max(clean.items(), key=lambda item: len(item[1]))
        ids = ids[:3]
        self.section("replaying a changed worker version")
        self.say(
            f"version 2 of the worker charges in euros; replaying {len(ids)} recorded orders of {group} "
            "(every call answered from the recording, nothing reaches a backend)"
        )
        worker = shlex.join(
            [
                sys.executable,
                "-m",
                "scenarios.failover",
                "worker",
                "--backend",
                self.scenario.backend.url,
                "--version",
                "2",
            ]
        )
        argv = ["replay", "--wirelog", str(system.wirelog), "--queue", "orders", "--worker", worker]
        for message_id in ids:
            argv += ["--message-id", message_id]
        argv += ["--report", str(self.data_dir / "replay"), "--no-progress", "--timeout", "120"]
        code = await self.tool(argv, expect=(0, 1))
        if code == 1:
            self.say(
                f"the diff says how version 2 differs (HTML: {self.data_dir / 'replay' / 'report.html'})"
            )

    def summary(self) -> None:
        report = self.scenario.report
        self.section("summary")
        print(
            f"sent {report.sent} · acked {report.done} · lost {report.lost} · "
            f"order violations {report.order_violations} · processed twice {report.duplicates}",
            flush=True,
        )
        fence, decision = report.time_to_fence, report.time_to_fence_decision
        if fence is not None and decision is not None:
            print(
                f"{report.faulty_worker}: fenced at the proxy {fence:.2f} s after its first failure "
                f"(decided after {decision:.2f} s); none of its calls reached the backend while fenced "
                f"({report.blocked_while_fenced} refused); a probe restored it",
                flush=True,
            )
        for outage in report.outages:
            if outage.suspended is not None and outage.resumed is not None:
                delivered = (
                    f", delivering again after {outage.first_delivery - outage.recovered:.2f} s"
                    if outage.first_delivery is not None
                    else ""
                )
                print(
                    f"backend outage: queue suspended {outage.suspended - outage.at:.2f} s after it began "
                    f"(nobody fenced), resumed {outage.resumed - outage.recovered:.2f} s after the backend "
                    f"recovered{delivered} (probe interval {self.scenario.settings.probe_interval:g} s)",
                    flush=True,
                )
        print(f"total {time.monotonic() - self.started:.0f} s", flush=True)

    # -- tools -------------------------------------------------------------------------------------------
    async def tool(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        within: float = STEP_TIMEOUT,
        expect: tuple[int, ...] = (0,),
    ) -> int | None:
        """Run `strictq ARGV` as a user would, show the command and the tail of its output."""
        print(f"$ strictq {shlex.join(argv)}", flush=True)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "strictq",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), within)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            print(f"  (stopped after {within:g} s)", flush=True)
            return None
        lines = [line for line in out.decode(errors="replace").splitlines() if _shown(line)]
        for line in lines[:SHOWN_LINES]:
            print(f"  {line}", flush=True)
        if len(lines) > SHOWN_LINES:
            print(f"  ... ({len(lines) - SHOWN_LINES} more lines)", flush=True)
        if proc.returncode not in expect:
            print(f"  (exit status {proc.returncode})", flush=True)
        return proc.returncode


def _shown(line: str) -> bool:
    """Spark's and the JVM's chatter is not part of the story."""
    noise = (
        "WARN ",
        "WARNING: ",
        "FutureWarning",  # pyspark on pandas 3
        "require_minimum_pandas_version",
        "Setting default log level",
        "To adjust logging level",
        "SLF4J",
        "Using Spark's",
    )
    return bool(line.strip()) and not any(marker in line for marker in noise)
