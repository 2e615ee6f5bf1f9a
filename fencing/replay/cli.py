"""`strictq replay`: registered into the strictq command by `register()`; imports nothing heavy until run.

Exit status: 0 when no replayed message diverged (same), 1 when one did (divergence), 2 when the replay
could not run (bad flags, a directory that is not there, a selection that matches nothing, a worker
command that cannot start or exits before it takes any message, a proxy that does not start), always
with a one-line message and no traceback. CI can tell "the new worker differs" (1) from "nothing was
compared" (2).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencing.replay.run import Runner

DESCRIPTION = """\
Replay recorded traffic against a worker and diff it (the patent's client-software testing with I/O
fencing and mimicry).

Selects recorded message attempts from the wire log (by queue, group, message id, time, outcome), starts
an isolated embedded queue and an egress proxy in replay mode (every outbound call is answered from the
recording: per message and call ordinal first, then by request identity; unanswerable calls get 503 and
count as divergences; nothing leaves the machine), enqueues the selected messages with their original
ids and bodies in their original per-group order, runs the worker command with STRICTQ_URL,
STRICTQ_CA_FILE, STRICTQ_API_KEY, STRICTQ_WORKER_ID, STRICTQ_WORKER_SECRET, STRICTQ_PROXY_URL and
STRICTQ_PROXY_CA_FILE pointing at them, and compares per message: outcome (ack / fail / timeout), the
outbound calls (method, host, path, body hash after redaction and masks) and latency. With
--baseline-worker the old worker is run the same way and the two runs are compared instead.

Writes <report>/report.json (CI), <report>/report.html (self-contained, per-message diffs) and each run's
wire log and worker output under <report>/runs/.

exit status: 0 same (no divergence); 1 divergence; 2 could not run (usage error, or the worker or the
proxy could not start: a worker that exits before it takes any message counts as not started).
"""

EPILOG = """\
example:
  strictq replay --wirelog var/strictq/wirelog --queue orders --since 2026-11-01T00:00:00Z \\
      --worker "python -m myworker" --report out/
  strictq replay --wirelog var/strictq/wirelog --queue orders --outcome failed \\
      --worker "python -m myworker" --baseline-worker "python -m myworker_v1" --mask-json '$.sent_at'
"""


def register(commands: Any, runner: Runner) -> None:
    """Add `replay` to the strictq subparsers; `runner` carries out each run (strictq.replay_stack)."""
    parser = commands.add_parser(
        "replay",
        help="run a worker version against recorded traffic (no backend is called) and diff it",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_argument_group("recording and selection")
    source.add_argument("--wirelog", type=Path, required=True, metavar="DIR", help="the recording's wire log")
    source.add_argument(
        "--queue", action="append", default=[], metavar="NAME", help="queue name (repeatable)"
    )
    source.add_argument("--group", action="append", default=[], metavar="G", help="group (repeatable)")
    source.add_argument(
        "--message-id", action="append", default=[], metavar="ID", help="message id (repeatable)"
    )
    source.add_argument(
        "--since", metavar="TIME", help="attempts delivered at or after (ISO-8601 or 15m/2h/7d)"
    )
    source.add_argument("--until", metavar="TIME", help="attempts delivered at or before")
    source.add_argument(
        "--outcome",
        choices=("ack", "acked", "fail", "failed", "timeout"),
        help="only messages with an attempt that ended so",
    )
    workers = parser.add_argument_group("workers")
    workers.add_argument("--worker", required=True, metavar="CMD", help="the candidate worker's command line")
    workers.add_argument(
        "--baseline-worker",
        metavar="CMD",
        help="compare with this worker run the same way, not the recording",
    )
    workers.add_argument(
        "--attempts",
        type=int,
        default=1,
        help="processing attempts each message gets (a failed one is retried up to this) "
        "(default: %(default)s)",
    )
    workers.add_argument(
        "--message-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a message may take before it counts as a timeout (default: %(default)s)",
    )
    workers.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds for each whole run (default: %(default)s)",
    )
    workers.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="S",
        help="SIGTERM to SIGKILL for the worker (default: %(default)s)",
    )
    compare = parser.add_argument_group("comparison")
    compare.add_argument(
        "--mask-json",
        action="append",
        default=[],
        metavar="PATH",
        help="JSON path masked in request bodies before matching and comparing, e.g. '$.sent_at', "
        "'$..request_id', '$.items[*].ts' (repeatable)",
    )
    compare.add_argument(
        "--mask-regex",
        action="append",
        default=[],
        metavar="RE",
        help="regex masked in bodies, paths and queries",
    )
    compare.add_argument("--mask-config", type=Path, metavar="FILE", help="masks from a TOML/JSON file")
    compare.add_argument(
        "--max-slowdown",
        type=float,
        metavar="X",
        help="count a message as diverged when the candidate is more than X times slower (default: off)",
    )
    compare.add_argument(
        "--redaction-key-dir",
        type=Path,
        metavar="DIR",
        help="directory of the recording's redaction.key (default: beside --wirelog, where strictq serve "
        "keeps it)",
    )
    compare.add_argument("--redaction", type=Path, metavar="PATH", help="the recording's redaction config")
    output = parser.add_argument_group("output")
    output.add_argument(
        "--report", type=Path, default=Path("replay-report"), metavar="DIR", help="(default: %(default)s)"
    )
    output.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=cmd_replay, replay_runner=runner)


EXIT_SAME, EXIT_DIVERGED, EXIT_COULD_NOT_RUN = 0, 1, 2


def usage(message: str) -> int:
    """One line on stderr; exit 2 (could not run: nothing was compared)."""
    print(f"strictq replay: {message}", file=sys.stderr)
    return EXIT_COULD_NOT_RUN


def cmd_replay(args: argparse.Namespace) -> int:
    from wirelog.files import restrict_umask
    from wirelog.times import TimeParseError, parse_time

    restrict_umask()  # reports and the isolated stack's files hold recorded calls: not for other users

    try:
        worker = _command(args.worker, "--worker")
        baseline = _command(args.baseline_worker, "--baseline-worker") if args.baseline_worker else None
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
    except (ValueError, TimeParseError) as exc:
        return usage(str(exc))
    if since is not None and until is not None and since > until:
        return usage("--since is after --until")
    if not 1 <= args.attempts <= 100:
        return usage("--attempts must be 1-100")
    for flag in ("message_timeout", "timeout", "grace"):
        if not getattr(args, flag) > 0:
            return usage(f"--{flag.replace('_', '-')} must be positive")
    if args.max_slowdown is not None and args.max_slowdown <= 1:
        return usage("--max-slowdown must be above 1")
    if not args.wirelog.is_dir():
        return usage(f"--wirelog {args.wirelog} is not a directory")
    for flag, path in (("--redaction", args.redaction), ("--mask-config", args.mask_config)):
        if path is not None and not path.is_file():
            return usage(f"{flag} {path} is not a file")
    fault = _unwritable(args.report)  # found before a stack starts, not as a traceback at the end
    if fault:
        return usage(f"--report {args.report}: cannot write the report there ({fault})")

    from fencing.replay.masking import MaskConfig, MaskError
    from fencing.replay.session import ReplayOptions, UsageError, run
    from fencing.replay.stories import OUTCOME_ALIASES, Selection

    try:
        masks = MaskConfig.from_dict(
            {"json_paths": args.mask_json, "regexes": args.mask_regex}, source="flags"
        )
        if args.mask_config is not None:
            masks = MaskConfig.load(args.mask_config).merged(masks)
    except MaskError as exc:
        return usage(str(exc))
    options = ReplayOptions(
        wirelog=args.wirelog,
        selection=Selection(
            queues=tuple(args.queue),
            groups=tuple(args.group),
            message_ids=tuple(args.message_id),
            since=since,
            until=until,
            outcome=OUTCOME_ALIASES[args.outcome] if args.outcome else None,
        ),
        worker=worker,
        baseline=baseline,
        report_dir=args.report,
        key_dir=args.redaction_key_dir,
        redaction=args.redaction,
        masks=masks,
        attempts=args.attempts,
        message_timeout=args.message_timeout,
        timeout=args.timeout,
        grace=args.grace,
        max_slowdown=args.max_slowdown,
    )
    import asyncio
    import logging

    from fencing.replay.html import write_html
    from fencing.replay.report import write_json
    from fencing.replay.terminal import ProgressBar, print_summary

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with ProgressBar(enabled=not args.no_progress) as bar:
            report = asyncio.run(run(options, args.replay_runner, bar))
    except UsageError as exc:
        return usage(str(exc))
    except KeyboardInterrupt:
        print("strictq replay: interrupted", file=sys.stderr)
        return 130
    files = {
        "json report": str(write_json(report, args.report / "report.json")),
        "html report": str(write_html(report, args.report / "report.html")),
    }
    print_summary(report, files)
    return report.exit_code


def _unwritable(directory: Path) -> str | None:
    """Why `directory` could not be created and written (its nearest existing ancestor is not a writable
    directory), or None; nothing is created."""
    probe = directory
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def _command(text: str, flag: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if not argv:
        raise ValueError(f"{flag} is empty")
    return argv
