"""`strictq fence`, `strictq unfence`, `strictq fences`: the operator's side of the fence API.

Cheap to import (argparse only): `strictq --help` builds every parser, so aiohttp and orjson are imported
inside the handlers. Wire contract: docs/control-stream.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8470"
ENV_HELP = (
    f"Talks to STRICTQ_URL (default {DEFAULT_URL}; the process holding the queue core: `strictq serve` or "
    "`strictq queue-server`) with the admin key in STRICTQ_ADMIN_KEY (--admin-key overrides; `strictq "
    "serve` writes it to <data-dir>/client.env, `strictq queue-server` has it in <data-dir>/keys.toml), "
    "trusting the CA in STRICTQ_CA_FILE for HTTPS."
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
    _common(fence)
    fence.set_defaults(handler=cmd_fence)

    unfence = commands.add_parser(
        "unfence",
        help="lift a worker's fence",
        description="Lift WORKER's fence; the proxies let its calls through again. " + ENV_HELP,
    )
    unfence.add_argument("worker", metavar="WORKER", help="worker id")
    _common(unfence)
    unfence.set_defaults(handler=cmd_unfence)

    fences = commands.add_parser(
        "fences",
        help="list fenced workers",
        description="List the fences the queue core holds, as a table (or JSON with --json). " + ENV_HELP,
    )
    fences.add_argument("--json", action="store_true", help="one JSON object per fence instead of a table")
    _common(fences)
    fences.set_defaults(handler=cmd_fences)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-key", help="admin secret (default: $STRICTQ_ADMIN_KEY)")


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

    return _run(args, "PUT", f"/admin/v1/fences/{_quote(args.worker)}", body, _print_json)


def cmd_unfence(args: argparse.Namespace) -> int:
    return _run(args, "DELETE", f"/admin/v1/fences/{_quote(args.worker)}", None, _print_json)


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
    """One request to the admin API; exit 0 on success, 1 on a refusal or no server, 2 on bad usage."""
    try:
        key = args.admin_key or os.environ.get("STRICTQ_ADMIN_KEY")
        if not key:
            raise UsageError("no admin key: set STRICTQ_ADMIN_KEY or pass --admin-key")
        data = body() if body is not None else None
    except UsageError as exc:
        print(f"strictq: {exc}", file=sys.stderr)
        return 2
    url = os.environ.get("STRICTQ_URL", DEFAULT_URL).rstrip("/") + path
    ca_file = os.environ.get("STRICTQ_CA_FILE") or None
    import aiohttp

    try:
        status, result = asyncio.run(_request(method, url, key, ca_file, data))
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        print(
            f"strictq: cannot reach {url} ({reason}); is the server running? Set STRICTQ_URL.",
            file=sys.stderr,
        )
        return 1
    if status >= 400:
        from protocol.errors import parse_error  # `{"error": {...}}`, or an older server's flat body

        error = parse_error(result, default_code="error")
        message = error.message or ("" if isinstance(result, dict) else str(result))
        print(f"strictq: {status} {error.code}: {message}", file=sys.stderr)
        return 1
    show(result)
    return 0


async def _request(method: str, url: str, key: str, ca_file: str | None, data: Any) -> tuple[int, Any]:
    import ssl

    import aiohttp
    import orjson

    context: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=context)) as session:
        from protocol.headers import API_KEY

        headers = {API_KEY: key}
        payload = None
        if data is not None:
            payload = orjson.dumps(data)
            headers["Content-Type"] = "application/json"
        async with session.request(method, url, data=payload, headers=headers) as response:
            raw = await response.read()
            try:
                return response.status, orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                from protocol.errors import BAD_RESPONSE, error_body

                return response.status, error_body(BAD_RESPONSE, raw[:200].decode(errors="replace"))


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
    if not isinstance(value, int | float):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
