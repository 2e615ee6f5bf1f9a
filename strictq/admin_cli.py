"""`strictq fence`, `strictq unfence`, `strictq fences`: the operator's side of the fence API.

Cheap to import (stdlib only): `strictq --help` builds every parser, so aiohttp and orjson are imported
inside the handlers. Answers print as tables with ISO-8601 times (UTC); `--json` prints the server's JSON.
Wire contract: docs/control-stream.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .cli_endpoint import (
    DEFAULT_GATEWAY,
    CliError,
    EdgeError,
    Endpoint,
    endpoint,
    explain,
    refusal,
    ssl_context,
)

ADMIN_KEY_ENV = "STRICTQ_ADMIN_KEY"
ENV_HELP = (
    f"Talks to `strictq serve` at STRICTQ_URL (default {DEFAULT_GATEWAY}), or to a `strictq queue-server` "
    "at --queue-server URL or STRICTQ_QUEUE_URL (either wins over STRICTQ_URL), trusting the CA in "
    "STRICTQ_CA_FILE for HTTPS. The admin key: --admin-key, else the file --admin-key-file, else "
    f"${ADMIN_KEY_ENV} (`strictq serve` writes it to <data-dir>/client.env; `strictq queue-server` has it in "
    "<data-dir>/keys.toml); prefer the environment or the file: a flag's value shows in `ps`."
)


class UsageError(Exception):
    """Bad command-line input: exit 2 with the message."""


def register(commands: Any) -> None:
    """Add the fence commands to the `strictq` subcommand parsers (`commands` is add_subparsers())."""
    fence = commands.add_parser(
        "fence",
        help="fence a worker: the egress proxy blocks or mimics its outbound calls",
        description="Fence WORKER (a worker credential id of the key file). With --mode block the proxy "
        "refuses the worker's outbound calls without contacting the backend; with --mode mimic it answers "
        "them from recorded responses. Fencing an already fenced worker replaces its fence. The fence is "
        "durable (it survives restarts) until `strictq unfence` or its --ttl runs out. " + ENV_HELP,
    )
    fence.add_argument("worker", metavar="WORKER", help="worker id (its credential id in the key file)")
    fence.add_argument("--mode", required=True, choices=("block", "mimic"), help="what the proxy does")
    fence.add_argument("--reason", required=True, help="why (shown to operators and in events; 1-500 chars)")
    fence.add_argument(
        "--ttl",
        help="lift the fence automatically after this long: seconds (600) or with a unit (90s, 30m, 2h, 7d); "
        "default: until unfenced",
    )
    _json_flag(fence, "the server's answer as JSON (times in epoch seconds) instead of a table")
    _common(fence)
    fence.set_defaults(handler=cmd_fence)

    unfence = commands.add_parser(
        "unfence",
        help="lift a worker's fence",
        description="Lift WORKER's fence; the proxies let its calls through again. " + ENV_HELP,
    )
    unfence.add_argument("worker", metavar="WORKER", help="worker id")
    _json_flag(unfence, "the server's answer as JSON instead of a line")
    _common(unfence)
    unfence.set_defaults(handler=cmd_unfence)

    fences = commands.add_parser(
        "fences",
        help="list fenced workers",
        description="List the fences the queue core holds, as a table (or JSON with --json). " + ENV_HELP,
    )
    _json_flag(fences, "one JSON object per fence (times in epoch seconds) instead of a table")
    _common(fences)
    fences.set_defaults(handler=cmd_fences)


def _common(parser: argparse.ArgumentParser) -> None:
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--admin-key", help=f"admin secret (wins over --admin-key-file and ${ADMIN_KEY_ENV}; visible in `ps`)"
    )
    keys.add_argument(
        "--admin-key-file",
        type=Path,
        metavar="PATH",
        help=f"file whose first line is the admin secret (wins over ${ADMIN_KEY_ENV})",
    )
    parser.add_argument(
        "--queue-server",
        metavar="URL",
        help="a `strictq queue-server` at URL instead of `strictq serve` (default: $STRICTQ_QUEUE_URL; "
        "unset: $STRICTQ_URL)",
    )


def admin_key(args: argparse.Namespace) -> str:
    """--admin-key, else the first line of --admin-key-file, else $STRICTQ_ADMIN_KEY; UsageError if none."""
    if getattr(args, "admin_key", None):
        return str(args.admin_key)
    path: Path | None = getattr(args, "admin_key_file", None)
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:  # "No such file or directory", "Is a directory", "Permission denied"
            raise UsageError(f"--admin-key-file {path}: cannot read it ({exc.strerror or exc})") from None
        except UnicodeDecodeError:
            raise UsageError(f"--admin-key-file {path}: cannot read it (not UTF-8 text)") from None
        key = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not key:
            raise UsageError(f"--admin-key-file {path} is empty: put the admin secret on its first line")
        return key
    key = os.environ.get(ADMIN_KEY_ENV, "").strip()
    if not key:
        if getattr(args, "queue_server", None) or os.environ.get("STRICTQ_QUEUE_URL"):
            where = "the secret of the admin credential in the `strictq queue-server`'s <data-dir>/keys.toml"
        else:
            where = "load <data-dir>/client.env of `strictq serve`: set -a; . var/strictq/client.env; set +a"
        raise UsageError(f"no admin key: set {ADMIN_KEY_ENV} ({where}), or pass --admin-key-file")
    return key


def _json_flag(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--json", action="store_true", help=text)


def parse_ttl(text: str) -> float:
    """'600' or '600s', '30m', '2h', '7d' -> seconds (positive)."""
    from wirelog.times import TimeParseError, parse_duration  # stdlib only: the CLI stays cheap

    try:
        seconds = parse_duration(text)
    except TimeParseError:
        raise UsageError(f"--ttl {text!r}: give seconds (600) or a number with s, m, h or d (30m)") from None
    if seconds <= 0:
        raise UsageError("--ttl must be positive")
    return seconds


# ------------------------------------------------------------------------------------------ commands
def cmd_fence(args: argparse.Namespace) -> int:
    def body() -> dict[str, Any]:
        data: dict[str, Any] = {"mode": args.mode, "reason": args.reason}
        if args.ttl is not None:
            data["ttl"] = parse_ttl(args.ttl)
        return data

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            _print_table([result] if isinstance(result, dict) else [])

    return _run(args, "PUT", f"/admin/v1/fences/{_quote(args.worker)}", body, show)


def cmd_unfence(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            print_line(f"{_field(result, 'worker', args.worker)}: unfenced")

    return _run(args, "DELETE", f"/admin/v1/fences/{_quote(args.worker)}", None, show)


def cmd_fences(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        fences = result.get("fences", [])
        if args.json:
            for fence in fences:
                _print_json(fence)
        else:
            _print_table(fences)

    return _run(args, "GET", "/admin/v1/fences", None, show)


# --------------------------------------------------------------------------------------------- plumbing
def _quote(worker: str) -> str:
    from urllib.parse import quote

    return quote(worker, safe="")


def _run(
    args: argparse.Namespace,
    method: str,
    path: str,
    body: Callable[[], dict[str, Any]] | None,
    show: Callable[[Any], None],
) -> int:
    """One admin command (also strictq.health_cli's): exit 0 on success, 1 on a refusal or no server, 2 on
    bad usage; the request and its failures are admin_call's."""
    try:
        key = admin_key(args)
        data = body() if body is not None else None
        found = endpoint(getattr(args, "queue_server", None))
        ssl_context(found)  # a missing or bad STRICTQ_CA_FILE named before anything is sent
    except UsageError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    except CliError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        result = asyncio.run(admin_call(found, key, method, path, data))
    except CliError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return exc.exit_code
    show(result)
    return 0


async def admin_call(found: Endpoint, key: str, method: str, path: str, data: Any = None) -> Any:
    """The CLI's one admin-API call: `data` as JSON with the admin key, the JSON answer back. A refusal is
    `EdgeError` (cli_endpoint.refusal: `<status> <code>: <message>`); no answer, explain's one line."""
    import aiohttp
    import orjson

    from protocol.errors import BAD_RESPONSE, NO_SUCH_ROUTE, error_body
    from protocol.headers import API_KEY

    headers = {API_KEY: key}
    payload = None
    if data is not None:
        payload = orjson.dumps(data)
        headers["Content-Type"] = "application/json"
    connector = aiohttp.TCPConnector(ssl=ssl_context(found))
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), connector=connector) as session,
            session.request(method, found.url + path, data=payload, headers=headers) as response,
        ):
            status, raw = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise CliError(await explain(exc, found)) from None
    try:
        result = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        result = error_body(BAD_RESPONSE, raw[:200].decode(errors="replace"))
    if status < 400:
        return result
    fallback = "" if isinstance(result, dict) else str(result)  # a JSON answer that is no error body
    error = refusal(status, result, default_code="error", fallback=fallback)
    if error.code == NO_SUCH_ROUTE and not found.internal:  # a gateway without the core in-process
        hint = (
            f"; {found.url} has no admin routes: with `strictq serve --queue-server URL` the queue "
            "server holds them: set STRICTQ_QUEUE_URL (or --queue-server) to its URL"
        )
        raise EdgeError(status, error.code, error.message + hint, result)
    raise error


def _print_json(obj: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(obj).decode() + "\n")


def _print_table(fences: Sequence[dict[str, Any]]) -> None:
    if not fences:
        print("no fenced workers")
        return
    rows = [("WORKER", "MODE", "SINCE", "EXPIRES", "REASON")]
    for fence in fences:
        expires = fence.get("expires")
        rows.append(
            (
                str(fence.get("worker", "")),
                str(fence.get("mode", "")),
                _when(fence.get("since")),
                "never" if expires is None else _when(expires),
                str(fence.get("reason", "")),
            )
        )
    from wirelog.logsafe import escape_controls  # reasons are client text: no terminal escapes

    escaped = [tuple(escape_controls(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in escaped) for i in range(4)]
    for row in escaped:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])


def _when(value: Any) -> str:
    """An epoch time as ISO 8601 in UTC (`2026-05-01T12:00:00Z`); '-' when there is none."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))


def _field(result: Any, name: str, default: str) -> str:
    value = result.get(name) if isinstance(result, dict) else None
    return str(value) if value is not None else default


def print_line(text: str) -> None:
    """One line of client text (names, reasons) for a terminal: control characters escaped."""
    from wirelog.logsafe import escape_controls

    print(escape_controls(text))
