"""`strictq index`, `strictq search` and `strictq errors`.

Only argparse and the stdlib at module level: `strictq` builds its parser on every run. `search`
imports pyarrow (never pyspark, mitmproxy or aiohttp); `index` and `errors` start Spark (after one line
saying so: the JVM takes seconds). Exit status: 0 done (search: something found), 1 search found nothing
or `index` found no closed segment to index (said on stderr, with the file names it looks for; before any
JVM starts), 2 usage error (bad id, time, status, missing or mismatched index, bad alert rules), with a
one-line message and no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_WIRELOG = Path("var/strictq/wirelog")
DEFAULT_INDEX = Path("var/strictq/index")  # `strictq serve` uses <data-dir>/index, same default
ENV_WIRELOG = "STRICTQ_WIRELOG_DIR"
ENV_INDEX = "STRICTQ_INDEX_DIR"
_TIME_HELP = "ISO-8601 (2026-11-22T10:00:00Z; no zone means UTC) or relative: 15m, 2h, 7d (ago)"


class UsageError(Exception):
    """Bad input on the command line: exit 2 with the message, no traceback."""


def default_wirelog() -> Path:
    return Path(os.environ.get(ENV_WIRELOG) or DEFAULT_WIRELOG)


def default_index() -> Path:
    return Path(os.environ.get(ENV_INDEX) or DEFAULT_INDEX)


def register(commands: Any) -> None:
    """Add `index`, `search` and `errors` to strictq's subcommands (an argparse subparsers action)."""
    index = commands.add_parser(
        "index",
        help="index closed wire-log segments by message id (Spark)",
        description="Index closed wire-log segments into bucketed, sorted Parquet (a Spark job; local[2] by "
        "default, any master with --master; also runnable with spark-submit spark/submit.py index ...). "
        "Incremental: only segments not indexed yet; a killed run can simply be run again. A running server "
        "closes its segments within 30 s ($STRICTQ_WIRELOG_SEGMENT_AGE). Exit status 0 done, 1 no closed "
        "segment in the wire-log directory, 2 usage error.",
    )
    _dirs(index, wirelog=True)
    index.add_argument(
        "--buckets", type=int, help="bucket count of a new index (default 64; fixed per index)"
    )
    index.add_argument(
        "--follow", action="store_true", help="keep indexing segments as they close (Ctrl-C stops)"
    )
    index.add_argument(
        "--interval", default="10s", help="--follow: how often to look for new segments (default 10s)"
    )
    index.add_argument("--compact", action="store_true", help="merge each bucket's files into one, then exit")
    index.add_argument(
        "--max-files",
        type=int,
        default=16,
        help="compact a bucket by itself once it has more files than this (default %(default)s)",
    )
    index.add_argument(
        "--batch-mb", type=int, default=1024, help="segment MiB per Spark batch (default %(default)s)"
    )
    index.add_argument("--batch-segments", type=int, help="at most this many segments per batch")
    _spark_options(index)
    index.set_defaults(handler=cmd_index)

    search = commands.add_parser(
        "search",
        help="a message's whole story from the index (no JVM, sub-second)",
        description="Print a message's records in time order: deliveries, attempts, every outbound call with "
        "status and latency, fence actions, retries. Reads only the message's bucket with pyarrow. Exit 0 if "
        "something matched, 1 if nothing, 2 on a usage error.",
    )
    _dirs(search, wirelog=False)
    search.add_argument("--message-id", help="the message id")
    search.add_argument(
        "--request-id",
        help="the stories of the messages this request sent (its X-Request-Id; SQS: its RequestId)",
    )
    search.add_argument("--group", help="only (or: every message of) this group")
    search.add_argument("--worker", help="only (or: every message of) this worker")
    search.add_argument("--status", help="only http calls with this status (502) or class (5xx)")
    search.add_argument("--since", help=f"records at or after this time: {_TIME_HELP}")
    search.add_argument("--until", help=f"records at or before this time: {_TIME_HELP}")
    search.add_argument("--limit", type=int, help="at most this many records")
    search.add_argument(
        "--json", action="store_true", help="one JSON document (what the admin endpoint returns)"
    )
    search.add_argument("--explain", action="store_true", help="also print what the lookup read, on stderr")
    search.set_defaults(handler=cmd_search)

    errors = commands.add_parser(
        "errors",
        help="group failures into error signatures and templates; evaluate alert rules (Spark)",
        description="Group failed calls and failed attempts of the index into signatures (endpoint with ids "
        "masked, status class, error text with numbers/uuids/hex/quoted values masked) and Drain templates; "
        "write <index>/errors/errors.json and print the top N. With --alerts, rules that fire become "
        "wire-log `event` records (event=alert) in --wirelog.",
    )
    _dirs(errors, wirelog=True)
    errors.add_argument(
        "--top", type=int, default=10, help="how many signatures to print (default %(default)s)"
    )
    errors.add_argument("--since", help=f"failures at or after this time: {_TIME_HELP}")
    errors.add_argument("--until", help=f"failures at or before this time: {_TIME_HELP}")
    errors.add_argument("--alerts", type=Path, help="alert rules (TOML, see docs/search.md)")
    errors.add_argument("--no-events", action="store_true", help="print alerts but write no wire-log events")
    errors.add_argument("--json", action="store_true", help="print the report as JSON")
    _spark_options(errors)
    errors.set_defaults(handler=cmd_errors)


def _dirs(parser: argparse.ArgumentParser, *, wirelog: bool) -> None:
    if wirelog:
        parser.add_argument(
            "--wirelog",
            type=Path,
            default=None,
            help=f"wire-log directory (default: ${ENV_WIRELOG} or {DEFAULT_WIRELOG})",
        )
    parser.add_argument(
        "--index", type=Path, default=None, help=f"index directory (default: ${ENV_INDEX} or {DEFAULT_INDEX})"
    )


def _spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", help="Spark master (default local[2]; spark://host:7077, ...)")
    parser.add_argument("--driver-memory", help="driver heap, fixed when the JVM starts (default 2g)")
    parser.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions (default 4)")


# ------------------------------------------------------------------------------------------ running
def _run(body: Any, args: argparse.Namespace) -> int:
    try:
        return int(body(args))
    except UsageError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


def _times(args: argparse.Namespace) -> tuple[float | None, float | None]:
    from wirelog.times import TimeParseError, parse_time

    now = time.time()
    try:
        since = parse_time(args.since, now=now) if args.since is not None else None
        until = parse_time(args.until, now=now) if args.until is not None else None
    except TimeParseError as exc:
        raise UsageError(f"--since/--until: {exc}") from None
    if since is not None and until is not None and since > until:
        raise UsageError("--since is after --until: nothing can match")
    return since, until


def _session(args: argparse.Namespace, command: str = "index") -> Any:
    from .session import DEFAULT_MASTER, under_spark_submit

    if args.shuffle_partitions is not None and args.shuffle_partitions < 1:
        raise UsageError("--shuffle-partitions must be >= 1")
    master = args.master or ("spark-submit's master" if under_spark_submit() else DEFAULT_MASTER)
    print(f"strictq: {command}: starting Spark ({master}) ...", file=sys.stderr, flush=True)
    from .session import build_session

    return build_session(
        master=args.master, driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions
    )


def _say(line: str) -> None:
    print(f"strictq: index: {line}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------------------------------- index
def cmd_index(args: argparse.Namespace) -> int:
    from wirelog.files import restrict_umask

    restrict_umask()  # the index holds (redacted) wire-log records: no more readable than the segments
    return _run(_index, args)


def _index(args: argparse.Namespace) -> int:
    from .layout import IndexLayoutError, load_state, open_for_write

    wirelog = args.wirelog if args.wirelog is not None else default_wirelog()
    index = args.index if args.index is not None else default_index()
    if args.buckets is not None and not 1 <= args.buckets <= 4096:
        raise UsageError("--buckets must be 1-4096")
    if (
        args.max_files < 1
        or args.batch_mb < 1
        or (args.batch_segments is not None and args.batch_segments < 1)
    ):
        raise UsageError("--max-files, --batch-mb and --batch-segments must be >= 1")
    if args.follow and args.compact:
        raise UsageError("--follow and --compact do not go together (--follow compacts by itself)")
    if not args.compact and not wirelog.is_dir():
        hint = "" if args.wirelog is not None else f" (give --wirelog or set ${ENV_WIRELOG})"
        raise UsageError(f"wire-log directory {wirelog} does not exist{hint}")
    interval = _interval(args.interval)
    if not args.compact and not args.follow:
        missing = _no_closed_segments(wirelog)
        if missing:
            print(f"strictq: index: {missing}", file=sys.stderr)
            return 1
    try:  # refuse a mismatched index before paying for a JVM
        load_state(index) if args.compact else open_for_write(index, args.buckets)
    except IndexLayoutError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a --index that cannot be created or written
        where = "" if args.index is not None else f" (give --index or set ${ENV_INDEX})"
        reason = exc.strerror or exc
        raise UsageError(f"index directory {index}: cannot create or write it ({reason}){where}") from None
    spark = _session(args)
    try:
        return _index_with(spark, args, wirelog, index, interval)
    except IndexLayoutError as exc:
        raise UsageError(str(exc)) from None
    finally:
        spark.stop()


def _index_with(spark: Any, args: argparse.Namespace, wirelog: Path, index: Path, interval: str) -> int:
    from .compact import run_compact
    from .follow import run_follow
    from .index import run_index

    if args.compact:
        report = run_compact(spark, index, progress=_say)
        if not report.buckets:
            _say("nothing to compact (every bucket has at most one file)")
        return 0
    if args.follow:
        _say(f"following {wirelog} every {interval} (Ctrl-C or SIGTERM stops)")

        def each(batch_id: int, result: Any) -> None:
            _report_skips(result)

        run_follow(
            spark,
            wirelog,
            index,
            interval=interval,
            buckets=args.buckets,
            max_files=args.max_files,
            on_batch=each,
            progress=_say,
        )
        _say("stopped")
        return 0
    result = run_index(
        spark,
        wirelog,
        index,
        buckets=args.buckets,
        max_batch_bytes=args.batch_mb * 1024 * 1024,
        max_batch_segments=args.batch_segments,
        progress=_say,
    )
    _report_skips(result)
    state = result.state
    assert state is not None
    if state.max_files_per_bucket() > args.max_files:
        run_compact(spark, index, min_files=args.max_files, progress=_say)
    print(
        f"strictq: index: {index}: {len(result.batches)} new batch(es), {result.records:,} record(s) added "
        f"({result.already_indexed} segment(s) were indexed before); {state.records:,} record(s) in "
        f"{state.buckets} buckets, at most {state.max_files_per_bucket()} file(s) per bucket"
    )
    return 0


def _no_closed_segments(wirelog: Path) -> str | None:
    """Why there is nothing to index (one line naming the files looked for), or None if there is."""
    from wirelog.files import SEGMENT_DIRS
    from wirelog.layout import OPEN
    from wirelog.reader import segments
    from wirelog.writer import ENV_SEGMENT_AGE

    found = segments(wirelog)
    open_ones = sum(p.name.endswith(OPEN) for p in found)
    if len(found) > open_ones:
        return None
    if open_ones:
        return (
            f"no closed wire-log segment in {wirelog} yet, {open_ones} still open (*.jsonl.open): a running "
            f"server closes a segment 30 s after its first record (${ENV_SEGMENT_AGE}) and all of them when "
            "it stops; run again then"
        )
    looked = (
        "<writer>.<stamp>.<seq>.jsonl or .jsonl.gz, e.g. gateway.20261122T100000123456Z.000001.jsonl.gz"
    )
    hint = ""
    for sub in SEGMENT_DIRS:  # given the data dir instead of its wire-log directory?
        if (wirelog / sub).is_dir() and segments(wirelog / sub):
            hint = f"; did you mean --wirelog {wirelog / sub}?"
            break
    return f"no wire-log segments in {wirelog} (looked for files named {looked}){hint}"


def _report_skips(result: Any) -> None:
    """Skipped lines are never silent: a total and one note per affected segment, on stderr."""
    bad = sum(b.bad_lines for b in result.batches)
    unknown = sum(b.unknown_versions for b in result.batches)
    salvaged = sum(b.salvaged_segments for b in result.batches)
    missing = sum(b.missing_segments for b in result.batches)
    if bad or unknown or salvaged or missing:
        parts = [
            f"{n} {label}"
            for n, label in (
                (bad, "unreadable line(s)"),
                (unknown, "record(s) of an unknown schema version"),
                (salvaged, "truncated/corrupt gzip segment(s) read up to the damage"),
                (missing, "segment(s) gone before they could be read"),
            )
            if n
        ]
        _say("skipped " + ", ".join(parts))
        for note in result.notes:
            _say(note)


def _interval(text: str) -> str:
    from .alerts import AlertConfigError, parse_window

    try:
        return f"{parse_window(text)} seconds"
    except AlertConfigError:
        raise UsageError(f"--interval {text!r}: use a duration like 5s, 1m") from None


# ------------------------------------------------------------------------------------------- search
def cmd_search(args: argparse.Namespace) -> int:
    return _run(_search, args)


def _search(args: argparse.Namespace) -> int:
    from .layout import IndexLayoutError
    from .search import Query, QueryError, search

    index = args.index if args.index is not None else default_index()
    since, until = _times(args)
    query = Query(
        message_id=args.message_id,
        request_id=args.request_id,
        group=args.group,
        worker=args.worker,
        status=args.status,
        since=since,
        until=until,
        limit=args.limit,
    )
    try:
        result = search(index, query, with_records=args.json)
    except QueryError as exc:
        raise UsageError(str(exc)) from None
    except IndexLayoutError as exc:
        raise UsageError(str(exc)) from None
    import orjson

    from .story import story_json, story_lines

    out = sys.stdout
    if args.json:
        out.write(orjson.dumps(story_json(result)).decode() + "\n")
    elif result.rows:
        out.write("\n".join(story_lines(result)) + "\n")
    out.flush()
    if args.explain:
        s = result.stats
        print(
            f"strictq: search: bucket {s.bucket}, {len(s.files_opened)} file(s), "
            f"{s.row_groups_read}/{s.row_groups_total} row group(s) read, {s.rows_read} row(s), "
            f"{s.seconds * 1000:.1f} ms",
            file=sys.stderr,
        )
    if not result.rows and not args.json:
        print("strictq: search: no records match", file=sys.stderr)
    return 0 if result.rows else 1


# ------------------------------------------------------------------------------------------- errors
def cmd_errors(args: argparse.Namespace) -> int:
    return _run(_errors, args)


def _errors(args: argparse.Namespace) -> int:
    from .alerts import AlertConfigError, emit, evaluate, load_rules
    from .errors import format_top, run_errors
    from .layout import IndexLayoutError, load_state

    index = args.index if args.index is not None else default_index()
    wirelog = args.wirelog if args.wirelog is not None else default_wirelog()
    since, until = _times(args)
    if args.top < 0:
        raise UsageError("--top must be >= 0")
    try:
        rules = load_rules(args.alerts) if args.alerts is not None else []
        load_state(index)
    except (AlertConfigError, IndexLayoutError) as exc:
        raise UsageError(str(exc)) from None
    if rules and not args.no_events and not wirelog.is_dir():
        raise UsageError(f"wire-log directory {wirelog} (for alert events) does not exist; give --wirelog")
    spark = _session(args, "errors")
    try:
        report = run_errors(spark, index, since=since, until=until, windows=tuple(r.window for r in rules))
    finally:
        spark.stop()
    alerts = evaluate(rules, report)
    fresh = emit(alerts, index_dir=index, wirelog_dir=None if args.no_events else wirelog) if alerts else []
    import orjson

    if args.json:
        doc = report.to_json()
        doc["alerts"] = [a.to_json() | {"new": a in fresh} for a in alerts]
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
    else:
        print("\n".join(format_top(report, args.top)))
        for alert in alerts:
            print(f"ALERT{'' if alert in fresh else ' (emitted before)'} {alert.text()}")
    return 0
