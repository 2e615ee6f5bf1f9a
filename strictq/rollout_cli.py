"""`strictq routing` and `strictq rollout`: pin group ranges to workers, and roll a new worker version out
over a growing share of groups, gated by failure management's figures and by a replay of recorded traffic
(docs/rollouts.md). Talks to queue_core.routing_http.

`strictq rollout start` is the controller: it runs in the foreground and narrates, one step at a time. The
state it leaves (the canary share, the rollout record) is the queue's, so `strictq rollout status` reads it
from anywhere and a controller that died mid-way is followed by `strictq rollout revert` or a new start.

Cheap to import (stdlib only at the top), like strictq.admin_cli, whose admin-key plumbing it shares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .admin_cli import (
    ENV_HELP,
    UsageError,
    _common,
    _json_flag,
    _print_json,
    _quote,
    _run,
    admin_key,
    print_line,
)

ROUTING_HELP = (
    "A pin sends the groups it matches (a name prefix such as 'acme:', and/or a range LO:HI of the "
    "group's hash bucket out of 10000) only to its workers (API key ids); an --exclusive pin's workers take "
    "nothing else (a sensitive tenant's dedicated workers). The first matching pin wins. A canary share "
    "(set by `strictq rollout`) sends that percentage of groups only to workers polling as its version. "
)
ROLLOUT_HELP = (
    "Each step gives the new version's workers (Worker(version=...), polling with X-Strictq-Worker-Version) "
    "a share of the groups, a stable hash of each group, so raising the share only adds groups. A step is "
    "gated by failure management: a fenced canary worker, or a canary failure rate more than "
    "--max-failure-increase above the other versions', reverts at once; the step is passed once it ran "
    "--step-seconds with at least --min-attempts canary attempts. With --replay-worker, before each step the "
    "new version is replayed against the recorded traffic (--wirelog) of the groups the step adds (`strictq "
    "replay`), and a divergence rate over --max-divergence reverts. A revert sets the share to 0 (the new "
    "version's workers take nothing); a completed rollout leaves it at 100 (only the new version takes "
    "groups). Every step is an event in `strictq status` and the wire log. "
)


def register(commands: Any) -> None:
    """Add `strictq routing QUEUE` and `strictq rollout {start,status,revert}`."""
    routing = commands.add_parser(
        "routing",
        help="show or change a queue's group routing: pins of group ranges to workers",
        description="Show QUEUE's routing (pins, canary share) and, per worker version, the attempts that "
        "succeeded and failed since it last changed; with --pin/--unpin/--clear, change it first. "
        + ROUTING_HELP
        + ENV_HELP,
    )
    routing.add_argument("queue", metavar="QUEUE")
    routing.add_argument("--pin", metavar="NAME", help="add (or replace) the pin NAME")
    routing.add_argument("--workers", metavar="W1,W2", help="the pin's workers (API key ids)")
    routing.add_argument("--prefix", metavar="PREFIX", help="the pin takes groups whose name starts so")
    routing.add_argument(
        "--buckets", metavar="LO:HI", help="the pin takes groups hashed into [LO, HI) of 10000"
    )
    routing.add_argument("--exclusive", action="store_true", help="the pin's workers take nothing else")
    routing.add_argument("--unpin", metavar="NAME", help="remove the pin NAME")
    routing.add_argument("--clear", action="store_true", help="remove every pin and the canary share")
    _json_flag(routing, "the server's answer as JSON instead of lines")
    _common(routing)
    routing.set_defaults(handler=cmd_routing)

    rollout = commands.add_parser(
        "rollout",
        help="roll a worker version out over a growing share of groups, gated, reverting on failure",
        description="Canary rollouts (the patent's 1% of messages, then 2%). " + ROLLOUT_HELP + ENV_HELP,
    )
    actions = rollout.add_subparsers(dest="rollout_action", metavar="{start,status,revert}", required=True)
    start = actions.add_parser("start", help="run a rollout in the foreground, step by step")
    start.add_argument("queue", metavar="QUEUE")
    start.add_argument(
        "--version", required=True, metavar="V", help="the new version (what its workers poll as)"
    )
    start.add_argument(
        "--steps", default="1,2,5,25,100", metavar="P1,P2,...", help="percent of groups per step"
    )
    start.add_argument("--step-seconds", type=float, default=60.0, metavar="S", help="each step's duration")
    start.add_argument(
        "--min-attempts", type=int, default=10, metavar="N", help="canary attempts to judge a step"
    )
    start.add_argument(
        "--max-failure-increase",
        type=float,
        default=0.05,
        metavar="RATE",
        help="revert when the canary's failure rate exceeds the others' by more (default 0.05)",
    )
    start.add_argument("--replay-worker", metavar="CMD", help="the new version's worker command, for replay")
    start.add_argument("--wirelog", metavar="DIR", help="the recorded traffic replay uses")
    start.add_argument(
        "--replay-sample",
        type=int,
        default=40,
        metavar="N",
        help="recorded messages replayed per step, the newest cleanly processed ones (default 40)",
    )
    start.add_argument(
        "--max-divergence",
        type=float,
        default=0.0,
        metavar="RATE",
        help="diverging replayed messages tolerated",
    )
    start.add_argument(
        "--baseline",
        metavar="V1,V2",
        help="the versions the other groups go to (default: those polling now; '' names unversioned workers)",
    )
    start.add_argument("--poll", type=float, default=1.0, metavar="S", help="how often figures are read")
    start.add_argument(
        "--step-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="revert a step not passed by then (0: never)",
    )
    _common(start)
    start.set_defaults(handler=cmd_rollout_start)
    status = actions.add_parser("status", help="the queue's rollout: version, step, state, figures")
    status.add_argument("queue", metavar="QUEUE")
    _json_flag(status, "the server's answer as JSON instead of lines")
    _common(status)
    status.set_defaults(handler=cmd_rollout_status)
    revert = actions.add_parser("revert", help="revert the queue's rollout now (its version takes nothing)")
    revert.add_argument("queue", metavar="QUEUE")
    revert.add_argument("--reason", default="operator", help="why (in the event)")
    _common(revert)
    revert.set_defaults(handler=cmd_rollout_revert)


# ------------------------------------------------------------------------------------------- routing
def cmd_routing(args: argparse.Namespace) -> int:
    path = f"/admin/v1/queues/{_quote(args.queue)}/routing"
    changing = args.pin or args.unpin or args.clear

    def body() -> dict[str, Any]:
        current = _get(args, path)["routing"]
        return _changed(args, current)

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
            return
        for line in describe(result):
            print_line(line)

    return _run(args, "PUT" if changing else "GET", path, body if changing else None, show)


def _changed(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any]:
    if args.clear:
        return {}
    pins = [p for p in current.get("pins", []) if p.get("name") not in (args.pin, args.unpin)]
    if args.unpin and len(pins) == len(current.get("pins", [])):
        raise UsageError(f"--unpin {args.unpin}: no such pin")
    if args.pin:
        if not args.workers:
            raise UsageError("--pin needs --workers W1,W2")
        if not args.prefix and not args.buckets:
            raise UsageError("--pin needs --prefix and/or --buckets LO:HI")
        pin: dict[str, Any] = {"name": args.pin, "workers": [w for w in args.workers.split(",") if w]}
        if args.prefix:
            pin["prefix"] = args.prefix
        if args.buckets:
            lo, _, hi = args.buckets.partition(":")
            if not (lo.isdigit() and hi.isdigit()):
                raise UsageError(f"--buckets {args.buckets}: give LO:HI, two whole numbers")
            pin["buckets"] = [int(lo), int(hi)]
        if args.exclusive:
            pin["exclusive"] = True
        pins.append(pin)
    out = dict(current)
    out["pins"] = pins
    return out


def describe(result: dict[str, Any]) -> list[str]:
    routing = result.get("routing") or {}
    lines = [
        f"{result.get('queue')}: " + ("no routing (every worker takes every group)" if not routing else "")
    ]
    for pin in routing.get("pins", []):
        what = " and ".join(
            part
            for part in (
                f"prefix {pin['prefix']!r}" if pin.get("prefix") else "",
                f"buckets [{pin['buckets'][0]}, {pin['buckets'][1]})" if pin.get("buckets") else "",
            )
            if part
        )
        only = ", exclusive" if pin.get("exclusive") else ""
        lines.append(f"pin {pin['name']}: {what} -> {', '.join(pin['workers'])}{only}")
    canary = routing.get("canary")
    if canary:
        lines.append(f"canary: {canary['percent']:g}% of groups -> version {canary['version']}")
    rollout = result.get("rollout")
    if rollout:
        lines.append(
            f"rollout of {rollout.get('version')}: {rollout.get('state')} at {rollout.get('percent', 0):g}%"
            + (f" ({rollout['reason']})" if rollout.get("reason") else "")
        )
    for version, tally in (result.get("versions") or {}).items():
        lines.append(
            f"version {version or '(none)'}: {tally.get('workers', 0)} workers, {tally.get('succeeded', 0)} "
            f"succeeded, {tally.get('failed', 0)} failed, {tally.get('fenced', 0)} fenced"
        )
    return lines


# ------------------------------------------------------------------------------------------- rollout
def cmd_rollout_status(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            for line in describe(result):
                print_line(line)

    return _run(args, "GET", f"/admin/v1/queues/{_quote(args.queue)}/routing", None, show)


def cmd_rollout_revert(args: argparse.Namespace) -> int:
    path = f"/admin/v1/queues/{_quote(args.queue)}/routing"

    def body() -> dict[str, Any]:
        rollout = _get(args, path).get("rollout") or {}
        if not rollout.get("version"):
            raise UsageError(f"{args.queue} has no rollout to revert")
        return {**rollout, "state": "reverted", "percent": 0, "reason": args.reason}

    return _run(
        args,
        "PUT",
        f"/admin/v1/queues/{_quote(args.queue)}/rollout",
        body,
        lambda result: print_line(f"{args.queue}: rollout of {result['rollout']['version']} reverted"),
    )


def parse_steps(text: str) -> list[float]:
    try:
        steps = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--steps {text}: give percentages such as 1,2,5,25,100") from None
    if not steps or any(not 0 < s <= 100 for s in steps) or steps != sorted(steps):
        raise UsageError(f"--steps {text}: rising percentages, each in (0, 100]")
    return steps


def cmd_rollout_start(args: argparse.Namespace) -> int:
    try:
        steps = parse_steps(args.steps)
        if bool(args.replay_worker) != bool(args.wirelog):
            raise UsageError("--replay-worker and --wirelog go together")
        if args.min_attempts < 0 or args.step_seconds < 0 or args.poll <= 0 or args.replay_sample < 1:
            raise UsageError(
                "--min-attempts and --step-seconds must be 0 or more, --poll and --replay-sample positive"
            )
        admin_key(args)
    except UsageError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    from .cli_endpoint import CliError

    try:
        return asyncio.run(RolloutController(args, steps).run())
    except CliError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return exc.exit_code


class RolloutController:
    """One rollout, step by step: set the share, watch the gate, replay, promote or revert."""

    def __init__(self, args: argparse.Namespace, steps: list[float]) -> None:
        self.args = args
        self.steps = steps
        self.routing_path = f"/admin/v1/queues/{_quote(args.queue)}/routing"
        self.rollout_path = f"/admin/v1/queues/{_quote(args.queue)}/rollout"
        self.baseline: list[str] = []

    async def call(self, method: str, path: str, data: Any = None) -> Any:
        return await _call(self.args, method, path, data)

    async def put(self, state: str, percent: float, step: int, reason: str) -> None:
        record = {
            "version": self.args.version,
            "baseline": self.baseline,
            "steps": self.steps,
            "step": step,
            "percent": percent,
            "state": state,
            "reason": reason,
        }
        await self.call("PUT", self.rollout_path, record)

    async def run(self) -> int:
        from fencing.replay.canary import failure_gate

        args = self.args
        version = args.version
        if args.baseline is not None:
            self.baseline = [v.strip() for v in args.baseline.split(",")]
        else:
            seen = (await self.call("GET", self.routing_path)).get("versions") or {}
            self.baseline = sorted(v for v, tally in seen.items() if v != version and tally.get("workers"))
        shown = ", ".join(v or "(unversioned)" for v in self.baseline) or "any other version"
        await self.put("running", 0, -1, "preparing: the new version takes nothing until its first step")
        print_line(f"rollout of {version} on {args.queue}: the other groups stay with {shown}")
        for index, percent in enumerate(self.steps):
            previous = self.steps[index - 1] if index else 0.0
            if args.replay_worker:
                workers = (await self.call("GET", self.routing_path)).get("workers") or {}
                diverged = self.replay_gate(previous, percent, workers)
                if diverged is not None:
                    await self.put("reverted", 0, index, diverged)
                    print_line(f"step {index + 1}/{len(self.steps)} {percent:g}%: REVERTED: {diverged}")
                    return 1
            await self.put("running", percent, index, f"step {index + 1} of {len(self.steps)}")
            print_line(f"step {index + 1}/{len(self.steps)}: {percent:g}% of groups -> {version}")
            started = time.monotonic()
            while True:
                await asyncio.sleep(args.poll)
                elapsed = time.monotonic() - started
                canary, rest = self.sides(await self.call("GET", self.routing_path))
                verdict = failure_gate(
                    canary,
                    rest,
                    elapsed=elapsed,
                    duration=args.step_seconds,
                    min_attempts=args.min_attempts,
                    max_increase=args.max_failure_increase,
                )
                if verdict.decision == "rollback":
                    await self.put("reverted", 0, index, verdict.reason)
                    print_line(f"step {index + 1}/{len(self.steps)} {percent:g}%: REVERTED: {verdict.reason}")
                    return 1
                if verdict.decision == "promote":
                    print_line(
                        f"  passed: {canary.attempts} canary attempts, {canary.failure_rate:.1%} failed "
                        f"(others {rest.failure_rate:.1%}) in {elapsed:.1f} s"
                    )
                    break
                if args.step_timeout and elapsed > args.step_timeout:
                    reason = f"step not passed in {args.step_timeout:g} s: {verdict.reason}"
                    await self.put("reverted", 0, index, reason)
                    print_line(f"step {index + 1}/{len(self.steps)} {percent:g}%: REVERTED: {reason}")
                    return 1
        await self.put("completed", 100, len(self.steps) - 1, "every step passed")
        print_line(f"rollout of {version} completed: every group goes to {version}")
        return 0

    def sides(self, view: dict[str, Any]) -> tuple[Any, Any]:
        from fencing.replay.canary import Tally

        canary = Tally()
        rest = Tally()
        for version, tally in (view.get("versions") or {}).items():
            side = Tally(
                int(tally.get("succeeded", 0)), int(tally.get("failed", 0)), int(tally.get("fenced", 0))
            )
            if version == self.args.version:
                canary = side
            else:
                rest = Tally(
                    rest.succeeded + side.succeeded, rest.failed + side.failed, rest.fenced + side.fenced
                )
        return canary, rest

    def replay_gate(self, previous: float, percent: float, workers: dict[str, str]) -> str | None:
        """Replay the new version against recorded traffic of the groups this step adds; the reason to
        revert, or None. No recorded message to replay: nothing to judge, the live gate decides."""
        args = self.args
        baseline_workers = {w for w, v in workers.items() if v in self.baseline and v != args.version}
        message_ids, groups = recorded_sample(
            Path(args.wirelog), args.queue, previous, percent, baseline_workers, args.replay_sample
        )
        if not message_ids:
            print_line(
                f"  replay: no cleanly processed recorded message in the {previous:g}-{percent:g}% share"
            )
            return None
        report = Path(tempfile.mkdtemp(prefix="strictq-rollout-replay-"))
        command = [
            sys.executable, "-m", "strictq", "replay", "--wirelog", args.wirelog, "--queue", args.queue,
            "--worker", args.replay_worker, "--report", str(report), "--no-progress",
            *[part for m in message_ids for part in ("--message-id", m)],
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        summary_file = report / "report.json"
        if done.returncode == 2 or not summary_file.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"replay could not run: {tail[0]} (report: {report})"
        summary = json.loads(summary_file.read_text())["summary"]
        replayed = int(summary.get("replayed", 0))
        diverged = int(summary.get("diverged", 0))
        rate = diverged / replayed if replayed else 0.0
        print_line(
            f"  replay of {replayed} recorded message(s) of {groups} group(s):"
            f" {diverged} diverged ({rate:.1%})"
        )
        if rate > args.max_divergence:
            return f"replay diverged on {diverged} of {replayed} messages ({rate:.1%}); report: {report}"
        shutil.rmtree(report, ignore_errors=True)
        return None


def recorded_sample(
    wirelog: Path, queue: str, previous: float, percent: float, workers: set[str], limit: int
) -> tuple[list[str], int]:
    """The newest `limit` recorded messages of the groups in (previous, percent] % of the share that were
    processed cleanly (delivered once, succeeded) by one of `workers` (any worker when empty): what the
    old version did, for the new one to be compared with. Returns (message ids, groups they span)."""
    from fencing.replay.canary import in_canary
    from wirelog.reader import RecordFilter, read_records

    delivered: dict[str, tuple[int, str, str, float]] = {}  # message id -> (deliveries, worker, group, ts)
    succeeded: set[str] = set()
    for record in read_records(wirelog, where=RecordFilter(queue=queue)):
        message_id, group = record.get("message_id"), record.get("group")
        if not isinstance(message_id, str) or not isinstance(group, str):
            continue
        if record.get("kind") == "delivery":
            count = delivered.get(message_id, (0, "", "", 0.0))[0]
            delivered[message_id] = (
                count + 1,
                str(record.get("worker") or ""),
                group,
                float(record.get("ts") or 0),
            )
        elif record.get("kind") == "log" and record.get("outcome") == "succeeded":
            succeeded.add(message_id)
    clean = [
        (ts, message_id, group)
        for message_id, (count, worker, group, ts) in delivered.items()
        if count == 1
        and message_id in succeeded
        and (not workers or worker in workers)
        and in_canary(group, percent)
        and not in_canary(group, previous)
    ]
    chosen = sorted(clean, reverse=True)[:limit]
    return [message_id for _, message_id, _ in chosen], len({group for _, _, group in chosen})


async def _call(args: argparse.Namespace, method: str, path: str, data: Any = None) -> Any:
    """One admin call with the command's endpoint and admin key (admin_cli's plumbing)."""
    from .admin_cli import admin_call
    from .cli_endpoint import endpoint

    return await admin_call(
        endpoint(getattr(args, "queue_server", None)), admin_key(args), method, path, data
    )


def _get(args: argparse.Namespace, path: str) -> dict[str, Any]:
    result: dict[str, Any] = asyncio.run(_call(args, "GET", path))
    return result
