"""`python -m bench.run [--quick] [--only NAME[,NAME]] [--profile]`: run benchmarks, write docs/benchmarks.md.

Scenarios, in order: core, e2e-100, e2e-10k, latency, gw-emodb, gw-sqs, gw-latency (the HTTPS gateway's
EmoDB and SQS faces, and latency at half the EmoDB face's peak), backlog (with restart and RSS), redis, and
with --profile, profile (and py-spy on the gateway in gw-emodb/gw-sqs). `--only e2e` means both e2e
scenarios; `gw` (or `gateway`) the three gateway scenarios; `restart` and `rss` mean backlog.
`cluster` is issue 15's: the gateway over `strictq cluster up` at 1-3 queue servers, R1 and R3, beside the
single-process gateway; failover and planned-move times. `geo` is issue 16's: three simulated regions
(strictq.geo_sim), send latency per region before and after placement by traffic, follow-the-sun moves per
simulated day, messages lost (bench/geo_bench.py). `noisy` is issue 17's: a tenant flooding at 10x its
limit beside a steady one, fairness in a shared queue, the protections' cost (bench/noisy_bench.py).
`rollout` is issue 18's: a rollout step's latency to the canary, group routing's cost
(bench/rollout_bench.py).
`pipeline` is issue 18's: a workload with pre-processing, with and without pipelining
(bench/pipeline_bench.py). `longpoll` is issue 19's: what waiting workers cost, woken one at a time on a
send or an ack against every one woken (bench/long_poll_bench.py).
`--splice` rewrites only the sections of the
scenarios run (e.g. `--only cluster --splice`), keeping the rest of docs/benchmarks.md.
Raw outputs (server logs, profiles, results.json) go to bench/out/ (ignored by git).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from .procstat import machine_facts
from .report import render, splice
from .scenarios import ALIASES, SCENARIOS, Settings
from .servers import export_internal_secret

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes: 100k backlog, 2 s windows")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these scenarios (comma-separated, repeatable): {', '.join([*SCENARIOS, *ALIASES])}",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile the server under load (pyinstrument)"
    )
    parser.add_argument(
        "--duration", type=float, help="measured seconds per load scenario (default 8; quick 2)"
    )
    parser.add_argument("--warmup", type=float, help="warm-up seconds per load scenario (default 2; quick 1)")
    parser.add_argument("--backlog", type=int, help="backlog size (default 1,000,000; quick 100,000)")
    parser.add_argument(
        "--core-messages", type=int, help="messages per core figure (default 200,000; quick 50,000)"
    )
    parser.add_argument(
        "--repeat", type=int, help="closed-loop runs per load figure, median kept (default 3; quick 1)"
    )
    parser.add_argument("--procs", type=int, default=2, help="load generator processes (default %(default)s)")
    parser.add_argument(
        "--producers", type=int, default=8, help="producer tasks per process (default %(default)s)"
    )
    parser.add_argument(
        "--consumers", type=int, default=16, help="consumer tasks per process (default %(default)s)"
    )
    parser.add_argument(
        "--cap", type=int, default=5000, help="sent-but-unacked messages per process (default %(default)s)"
    )
    parser.add_argument(
        "--peak", type=float, help="peak msg/s for the latency scenario when e2e-100 is not run"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "docs" / "benchmarks.md",
        help="report path (default docs/benchmarks.md)",
    )
    parser.add_argument(
        "--splice",
        action="store_true",
        help="write only the sections of the scenarios run now into the existing report, each replacing"
        " the section of the same title; every other section stays as it was",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary data directories")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the figures of scenarios not run now from the previous run's bench/out/results.json"
        " (the report says which ones are older)",
    )
    return parser.parse_args(argv)


def code_version() -> str:
    """The commit measured, and whether the server's code differs from it in the work tree."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("log", "-1", "--format=%h %s")
    if not head:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "queue_core", "strictq", "pyproject.toml")
    return head + (" (+ uncommitted changes to the server code)" if dirty else "")


def selected(only: list[str], profile: bool) -> list[str]:
    if not only:
        return [name for name in SCENARIOS if name != "profile" or profile]
    wanted: set[str] = set()
    for item in only:
        for name in filter(None, (part.strip() for part in item.split(","))):
            if name in ALIASES:
                wanted.update(ALIASES[name])
            elif name in SCENARIOS:
                wanted.add(name)
            else:
                raise SystemExit(
                    f"unknown scenario {name!r}; choose from {', '.join([*SCENARIOS, *ALIASES])}"
                )
    if profile:
        wanted.add("profile")
    return [name for name in SCENARIOS if name in wanted]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = selected(args.only, args.profile)
    started = time.perf_counter()
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="strictq-bench-"))
    export_internal_secret(work_dir)  # the queue servers' and their clients' (bench.servers)
    settings = Settings(
        quick=args.quick,
        duration=args.duration or (2.0 if args.quick else 8.0),
        warmup=args.warmup if args.warmup is not None else (1.0 if args.quick else 2.0),
        backlog=args.backlog or (100_000 if args.quick else 1_000_000),
        core_messages=args.core_messages or (50_000 if args.quick else 200_000),
        procs=args.procs,
        producers=args.producers,
        consumers=args.consumers,
        cap=args.cap,
        work_dir=work_dir,
        out_dir=out_dir,
        profile=args.profile,
        repeat=args.repeat or (1 if args.quick else 3),
        peak=args.peak,
    )

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {line}", flush=True)

    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench.run", *(shlex.quote(a) for a in given)])
    progress(
        f"strictq benchmarks: {', '.join(names)} ({'quick' if args.quick else 'full'}); work dir {work_dir}"
    )
    failures: dict[str, str] = {}
    carried: list[str] = []
    previous = out_dir / "results.json"
    if args.merge and previous.exists():
        earlier = json.loads(previous.read_text()).get("results", {})
        carried = [name for name in earlier if name not in names]
        settings.results.update({name: earlier[name] for name in carried})
        progress(f"merging earlier figures of: {', '.join(carried) or 'nothing'}")
    try:
        for name in names:
            if name in settings.results:  # e.g. latency already ran e2e-100 for its peak
                continue
            try:
                SCENARIOS[name](settings, progress)
            except Exception as exc:  # one broken scenario must not lose the others' figures
                failures[name] = f"{type(exc).__name__}: {exc}"
                progress(f"{name}: FAILED: {failures[name]}")
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    elapsed = time.perf_counter() - started
    plain = {k: v for k, v in asdict(settings).items() if k not in ("results", "work_dir", "out_dir")}
    machine = machine_facts()
    machine["code"] = code_version()
    report = render(settings.results, machine, command, plain, elapsed)
    if carried:
        report = report.replace(
            "## Machine\n",
            f"**Merged run:** the figures of {', '.join(carried)} come from the previous run's results"
            f" (`--merge`); only {', '.join(names)} ran now.\n\n## Machine\n",
            1,
        )
    if failures:
        report += (
            "\n## Failures in this run\n\n" + "\n".join(f"- {k}: {v}" for k, v in failures.items()) + "\n"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.splice and args.output.exists():
        report = splice(args.output.read_text(), report)
    args.output.write_text(report)
    (out_dir / "results.json").write_text(
        json.dumps(
            {"settings": plain, "results": settings.results, "failures": failures}, indent=1, default=str
        )
    )
    progress(f"wrote {args.output} and {out_dir / 'results.json'} ({elapsed:.0f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
