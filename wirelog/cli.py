"""`strictq wirelog tail|grep`: read the wire log from the command line, streaming over segments.

Only argparse and the stdlib are imported at module level: `strictq` builds its parser on every run,
and the reader (orjson) is imported when a wirelog command actually runs. Never mitmproxy, aiohttp or
pyspark. Exit codes: 0 records printed (grep: at least one matched), 1 grep matched nothing, 2 usage
error (bad time, bad status, missing directory).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path("var/strictq/wirelog")
ENV_DIR = "STRICTQ_WIRELOG_DIR"
FOLLOW_POLL_SECONDS = 0.5

_TIME_HELP = "ISO-8601 (2026-11-22T10:00:00Z; no zone means UTC) or relative: 15m, 2h, 7d (ago)"


class UsageError(Exception):
    """Bad input on the command line: exit 2 with the message, no traceback."""


def default_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def register(commands: Any) -> None:
    """Add `wirelog tail` and `wirelog grep` to strictq's subcommands (an argparse subparsers action)."""
    wirelog = commands.add_parser(
        "wirelog",
        help="read the wire log (tail, grep)",
        description="Read wire-log segments (gzip and open ones) in time order. The directory defaults "
        f"to ${ENV_DIR}, else {DEFAULT_DIR}. Skipped lines (torn tails, unknown versions) are reported on "
        "stderr.",
    )
    wirelog.set_defaults(handler=lambda _args: _usage(wirelog))
    sub = wirelog.add_subparsers(title="wirelog commands", metavar="COMMAND")

    tail = sub.add_parser(
        "tail",
        help="print the last records (and follow new ones)",
        description="Print the last N records by time, across every writer (gateway, core, proxy); with "
        "--follow keep printing records as they are written, across segment rotation and compression. Stop "
        "with Ctrl-C.",
    )
    _common_arguments(tail)
    tail.add_argument("-n", "--lines", type=int, default=10, help="how many records (default %(default)s)")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new records")
    tail.set_defaults(handler=cmd_tail)

    grep = sub.add_parser(
        "grep",
        help="print the records matching all given filters",
        description="Stream over every segment and print the records matching ALL given filters, in time "
        "order (each writer's segments in order, the writers merged by time). Exit status 0 if any record "
        "matched, 1 if none, 2 on a usage error.",
    )
    _common_arguments(grep)
    grep.add_argument("--closed-only", action="store_true", help="skip segments still being written")
    grep.set_defaults(handler=cmd_grep)


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=None, help=f"wire-log directory (default: ${ENV_DIR} or {DEFAULT_DIR})"
    )
    parser.add_argument("--message-id", help="only this message id")
    parser.add_argument(
        "--request-id", help="only records naming this request id (of the request that sent the message)"
    )
    parser.add_argument("--group", help="only this group (strict order parameter)")
    parser.add_argument("--worker", help="only this worker id")
    parser.add_argument("--queue", help="only this queue")
    parser.add_argument("--kind", help="only this kind: http, delivery, log or event")
    parser.add_argument("--action", help="only http records with this action (pass, block, mimic, ...)")
    parser.add_argument("--status", help="only http responses with this status (502) or class (5xx)")
    parser.add_argument("--since", help=f"records at or after this time: {_TIME_HELP}")
    parser.add_argument("--until", help=f"records at or before this time: {_TIME_HELP}")
    parser.add_argument("--json", action="store_true", help="print the raw records, one JSON object per line")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# ----------------------------------------------------------------------------------------- commands
def cmd_grep(args: argparse.Namespace) -> int:
    return _run(args, _grep)


def cmd_tail(args: argparse.Namespace) -> int:
    return _run(args, _tail)


def _run(args: argparse.Namespace, body: Any) -> int:
    try:
        return int(body(args))
    except UsageError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `strictq wirelog grep ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:  # the way out of --follow
        return 0


def _grep(args: argparse.Namespace) -> int:
    from wirelog.reader import ReadStats, merged_records

    directory, where = _prepare(args)
    stats = ReadStats()
    printer = _printer(args.json)
    for record in merged_records(directory, include_open=not args.closed_only, stats=stats, where=where):
        printer(record)
    sys.stdout.flush()
    _report(stats)
    return 0 if stats.matched else 1


def _tail(args: argparse.Namespace) -> int:
    from wirelog.reader import ReadStats, tail_records

    if args.lines < 0:
        raise UsageError("-n must be >= 0")
    directory, where = _prepare(args)
    stats = ReadStats()
    printer = _printer(args.json)
    records, follower = tail_records(directory, args.lines, where=where, stats=stats)
    for record in records:
        printer(record)
    sys.stdout.flush()
    _report(stats)
    if not args.follow:
        return 0
    reported = len(stats.notes)
    while True:
        time.sleep(FOLLOW_POLL_SECONDS)
        try:
            batch = follower.poll()
        except Exception as exc:  # the directory was removed under us
            print(f"strictq: {exc}", file=sys.stderr)
            return 1
        batch.sort(key=_ts_of)
        for record in batch:
            printer(record)
        sys.stdout.flush()
        for note in stats.notes[reported:]:
            print(f"strictq: wirelog: {note}", file=sys.stderr)
        reported = len(stats.notes)


def _prepare(args: argparse.Namespace) -> tuple[Path, Any]:
    from wirelog.reader import RecordFilter, parse_status
    from wirelog.record import ACTIONS, KINDS
    from wirelog.times import TimeParseError, parse_time

    directory = args.dir if args.dir is not None else default_dir()
    if not directory.is_dir():
        hint = "" if args.dir is not None else f" (give --dir or set ${ENV_DIR})"
        raise UsageError(f"wire-log directory {directory} does not exist{hint}")
    if args.kind is not None and args.kind not in KINDS:
        raise UsageError(f"--kind must be one of {', '.join(KINDS)}, not {args.kind!r}")
    if args.action is not None and args.action not in ACTIONS:
        raise UsageError(f"--action must be one of {', '.join(ACTIONS)}, not {args.action!r}")
    try:
        status = parse_status(args.status) if args.status is not None else None
    except ValueError as exc:
        raise UsageError(f"--status: {exc}") from None
    now = time.time()
    try:
        since = parse_time(args.since, now=now) if args.since is not None else None
        until = parse_time(args.until, now=now) if args.until is not None else None
    except TimeParseError as exc:
        raise UsageError(f"--since/--until: {exc}") from None
    if since is not None and until is not None and since > until:
        raise UsageError("--since is after --until: nothing can match")
    where = RecordFilter(
        message_id=args.message_id,
        group=args.group,
        worker=args.worker,
        status=status,
        since=since,
        until=until,
        kind=args.kind,
        queue=args.queue,
        action=args.action,
        request_id=args.request_id,
    )
    return directory, (None if where.empty else where)


def _report(stats: Any) -> None:
    """Skipped lines are never silent: a summary and one note per affected file on stderr."""
    if not stats.problems:
        return
    print(f"strictq: wirelog: {stats.summary()}", file=sys.stderr)
    for note in stats.notes:
        print(f"strictq: wirelog: {note}", file=sys.stderr)


# ------------------------------------------------------------------------------------------ output
def _printer(raw: bool) -> Any:
    import orjson

    out = sys.stdout
    if raw:
        return lambda record: out.write(orjson.dumps(record).decode() + "\n")
    return lambda record: out.write(format_record(record) + "\n")


def format_record(record: dict[str, Any]) -> str:
    """One human-readable line: time kind worker message group, then what happened."""
    from wirelog.times import format_time

    ts = record.get("ts")
    head = [
        format_time(ts if isinstance(ts, int | float) and not isinstance(ts, bool) else None),
        f"{record.get('kind') or '-':<8}",
        _text(record.get("worker")),
        _text(record.get("message_id")),
        _text(record.get("group")),
    ]
    kind = record.get("kind")
    if kind == "http":
        raw_request, raw_response = record.get("request"), record.get("response")
        request: dict[str, Any] = raw_request if isinstance(raw_request, dict) else {}
        response: dict[str, Any] | None = raw_response if isinstance(raw_response, dict) else None
        latency = record.get("latency_ms")
        tail = [
            _text(record.get("action")),
            _text(request.get("method")),
            _text(request.get("url")),
            _text(response.get("status")) if response else "ERR",
            f"{latency:.1f}ms" if isinstance(latency, int | float) else "-",
        ]
        if record.get("error"):
            tail.append(f"error={record['error']!r}")
    elif kind == "delivery":
        tail = [f"seq={_text(record.get('seq'))}", f"receive_count={_text(record.get('receive_count'))}"]
    elif kind == "log":
        tail = [f"outcome={_text(record.get('outcome'))}", f"reason={_text(record.get('reason'))}"]
    elif kind == "event":
        tail = [f"event={_text(record.get('event'))}", f"reason={_text(record.get('reason'))}"]
    else:
        tail = []
    return " ".join(head + tail)


def _ts_of(record: dict[str, Any]) -> float:
    ts = record.get("ts")
    return float(ts) if isinstance(ts, int | float) else 0.0


def _text(value: Any) -> str:
    if value is None or value == "":
        return "-"
    text = str(value)
    return text if text.isprintable() else repr(text)
