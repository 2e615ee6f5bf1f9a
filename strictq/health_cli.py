"""Failure management on the command line: the settings flags of `strictq serve` / `strictq queue-server`,
and `strictq status`, `strictq suspend`, `strictq resume`, `strictq unblacklist` (docs/failure-management.md).

Cheap to import (argparse only), like strictq.admin_cli, whose request plumbing (`_run`, `admin_call`:
the admin key, the refusal line) these commands share.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from .admin_cli import (
    ENV_HELP,
    UsageError,
    _common,
    _json_flag,
    _print_json,
    _quote,
    _run,
    parse_ttl,
    print_line,
)

# flag -> (HealthSettings field, type, help); defaults are HealthSettings' own (docs/failure-management.md)
SETTINGS_FLAGS: dict[str, tuple[str, str, str]] = {
    "--health-window": ("window", "seconds", "sliding window of failure accounting (default 60)"),
    "--fence-after": ("worker_failures", "count", "failed attempts in the window that fence a worker (5)"),
    "--fence-mode": ("fence_mode", "mode", "how the proxy fences: block or mimic (block)"),
    "--shared-failure-workers": (
        "shared_failure_workers",
        "count",
        "workers one failure signature must fail on to count as a backend problem: nobody fenced (2)",
    ),
    "--probe-interval": ("probe_interval", "seconds", "first pause before a probe, doubling (5)"),
    "--probe-backoff-max": ("probe_backoff_max", "seconds", "longest pause between probes (60)"),
    "--probe-timeout": ("probe_timeout", "seconds", "a delivered probe without a result fails after (30)"),
    "--blacklist-after": (
        "probe_failures_to_blacklist",
        "count",
        "failed probes in a row that blacklist a fenced worker (3)",
    ),
    "--blacklist-for": ("blacklist_for", "seconds", "how long a blacklist lasts (600)"),
    "--large-scale-fraction": (
        "large_scale_fraction",
        "fraction",
        "share of a queue's recent workers whose probes must fail to suspend it (0.5)",
    ),
}


def _seconds(text: str) -> float:
    try:
        return parse_ttl(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("--ttl", "duration")) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be in (0, 1]")
    return value


TYPES: dict[str, Any] = {"seconds": _seconds, "count": _count, "fraction": _fraction, "mode": str}


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """The failure-management flags (times: seconds, sub-second values allowed, or 30s / 5m / 1h)."""
    group = parser.add_argument_group(
        "failure management",
        "per-worker failure accounting, fencing, probes and large-scale suspension "
        "(docs/failure-management.md §3); times in seconds (0.2, 30s, 5m)",
    )
    group.add_argument(
        "--no-health",
        dest="health",
        action="store_false",
        help="no failure management: nobody is fenced or suspended automatically",
    )
    for flag, (field, kind, text) in SETTINGS_FLAGS.items():
        extra: dict[str, Any] = {"choices": ("block", "mimic")} if kind == "mode" else {}
        group.add_argument(
            flag, dest=f"health_{field}", type=TYPES[kind], metavar=kind.upper(), help=text, **extra
        )


def settings_argv(args: argparse.Namespace) -> list[str]:
    """The failure-management flags given, as command-line arguments again (`cluster up` hands them to
    every queue server, where the decider and the gates run)."""
    if not getattr(args, "health", True):
        return ["--no-health"]
    argv: list[str] = []
    for flag, (field, _, _) in SETTINGS_FLAGS.items():
        value = getattr(args, f"health_{field}", None)
        if value is not None:
            argv += [flag, str(value)]
    return argv


def settings_from_args(args: argparse.Namespace) -> Any:
    """HealthSettings from the flags (None with --no-health); raises ValueError on inconsistent values."""
    if not getattr(args, "health", True):
        return None
    from queue_core.machine.health import HealthSettings

    given = {
        field: getattr(args, f"health_{field}")
        for field, _, _ in SETTINGS_FLAGS.values()
        if getattr(args, f"health_{field}", None) is not None
    }
    return HealthSettings(**given).validate()


# ------------------------------------------------------------------------------------------ commands
def register(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        help="failure management: workers, queues and the latest events",
        description="Show every worker failure management knows (state, failures in the window, fence, "
        "blacklist), queues (suspended?, parked groups) and the latest events. " + ENV_HELP,
    )
    status.add_argument("--json", action="store_true", help="the whole status as one JSON object")
    status.add_argument("--events", type=int, default=10, help="latest events to show (default %(default)s)")
    _common(status)
    status.set_defaults(handler=cmd_status)

    suspend = commands.add_parser(
        "suspend",
        help="stop all deliveries from a queue until resumed",
        description="Suspend QUEUE: nobody receives from it (messages and their order are kept) until "
        "`strictq resume`; probes do not lift an operator's suspension. " + ENV_HELP,
    )
    suspend.add_argument("queue", metavar="QUEUE")
    suspend.add_argument("--reason", required=True, help="why (shown in events and status)")
    _json_flag(suspend, "the server's answer as JSON instead of a table")
    _common(suspend)
    suspend.set_defaults(handler=cmd_suspend)

    resume = commands.add_parser(
        "resume",
        help="resume a suspended queue",
        description="Resume QUEUE, whether an operator or a large-scale event suspended it. " + ENV_HELP,
    )
    resume.add_argument("queue", metavar="QUEUE")
    resume.add_argument("--reason", default="operator", help="why (default: %(default)s)")
    _json_flag(resume, "the server's answer as JSON instead of a line")
    _common(resume)
    resume.set_defaults(handler=cmd_resume)

    unblacklist = commands.add_parser(
        "unblacklist",
        help="lift a worker's blacklist early",
        description="Lift WORKER's blacklist: it stays fenced and is probed again; a passing probe "
        "restores it (`strictq unfence` restores it at once). " + ENV_HELP,
    )
    unblacklist.add_argument("worker", metavar="WORKER")
    _json_flag(unblacklist, "the server's answer as JSON instead of a line")
    _common(unblacklist)
    unblacklist.set_defaults(handler=cmd_unblacklist)


def cmd_status(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            sys.stdout.write(format_status(result))

    return _run(args, "GET", f"/admin/v1/status?events={max(args.events, 0)}", None, show)


def cmd_suspend(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
            return
        answer = result if isinstance(result, dict) else {}
        row = (str(answer.get("queue", args.queue)), "suspended", str(answer.get("reason", args.reason)))
        for line in _table([("QUEUE", "STATE", "REASON"), row]):
            print_line(line.removeprefix("  "))

    path = f"/admin/v1/queues/{_quote(args.queue)}/suspend"
    return _run(args, "POST", path, lambda: {"reason": args.reason}, show)


def cmd_resume(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            queue = result.get("queue", args.queue) if isinstance(result, dict) else args.queue
            print_line(f"{queue}: resumed")

    path = f"/admin/v1/queues/{_quote(args.queue)}/resume"
    return _run(args, "POST", path, lambda: {"reason": args.reason}, show)


def cmd_unblacklist(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            worker = result.get("worker", args.worker) if isinstance(result, dict) else args.worker
            print_line(f"{worker}: blacklist lifted (still fenced, probed again)")

    return _run(args, "DELETE", f"/admin/v1/blacklist/{_quote(args.worker)}", None, show)


# ------------------------------------------------------------------------------------------- output
def format_status(status: dict[str, Any]) -> str:
    """The human-readable `strictq status`: three small tables."""
    now = status.get("now") or time.time()
    lines = ["WORKERS"]
    workers = status.get("workers") or []
    if not workers:
        lines.append("  (none with failures, fences or probes)")
    else:
        rows: list[tuple[str, ...]] = [("WORKER", "STATE", "FAILURES", "QUEUE", "UNTIL", "REASON")]
        for w in workers:
            if w.get("blacklisted_until") is not None:
                when = f"{max(w['blacklisted_until'] - now, 0):.1f}s left"
            elif w.get("next_probe") is not None:
                when = f"probe in {max(w['next_probe'] - now, 0):.1f}s"
            else:
                when = "probe out" if w.get("probe") else "-"
            failures = str(w.get("failures", 0)) + (
                f" (+{w['failures_shared']} shared)" if w.get("failures_shared") else ""
            )
            rows.append(
                (w["worker"], w["state"], failures, w.get("queue") or "-", when, w.get("reason") or "")
            )
        lines.extend(_table(rows))
    fences = status.get("operator_fences") or []
    if fences:
        lines.append("")
        lines.append("OPERATOR FENCES (proxy only: these workers still receive messages)")
        lines.extend(
            _table([("WORKER", "MODE", "REASON")] + [(f["worker"], f["mode"], f["reason"]) for f in fences])
        )
    lines.append("")
    lines.append("QUEUES")
    queues = status.get("queues") or []
    if not queues:
        lines.append("  (none known to failure management)")
    else:
        rows = [("QUEUE", "STATE", "WORKERS", "PARKED", "REASON")]
        for q in queues:
            state = (
                "suspended" + (" (operator)" if q.get("manual") else "") if q.get("suspended") else "active"
            )
            rows.append(
                (
                    q["queue"],
                    state,
                    str(q.get("recent_workers", 0)),
                    str(q.get("parked_groups", 0)),
                    q.get("reason") or "",
                )
            )
        lines.extend(_table(rows))
    events = status.get("events") or []
    lines.append("")
    lines.append("LATEST EVENTS")
    if not events:
        lines.append("  (none)")
    for e in events:
        who = " ".join(f"{k}={e[k]}" for k in ("worker", "queue", "group", "probe_id") if e.get(k))
        lines.append(f"  {_clock(e.get('at'))}  {e['event']:<14} {who}  {e.get('reason', '')}".rstrip())
    from wirelog.logsafe import escape_controls  # reasons and names are client text: no terminal escapes

    return "\n".join(escape_controls(line) for line in lines) + "\n"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]


def _clock(at: Any) -> str:
    """An event's epoch time as ISO 8601 in UTC with milliseconds (`2026-05-01T12:00:00.250Z`)."""
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"
