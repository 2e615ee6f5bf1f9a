"""`strictq limits` and `strictq protections`: read and change the gateway's admission of sends at run time,
per tenant (send rates) and per queue (backpressure and TTL), through gateway.limits_http.

Cheap to import (stdlib only), like strictq.admin_cli, whose admin-key and request plumbing it shares.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .admin_cli import ENV_HELP, UsageError, _common, _json_flag, _print_json, _quote, _run, print_line

LIMITS_HELP = (
    "A tenant's sends (messages, a batch counting each) are admitted by a token bucket: RATE messages per "
    "second on average, BURST at once after a quiet spell. Sends over it are refused with 429 and "
    "Retry-After (EmoDB face) or RequestThrottled (SQS face), and nothing of a refused send is stored. "
    "Every tenant without a limit of its own gets `strictq serve --tenant-rate/--tenant-burst` (default: "
    "unlimited). Limits set here are kept in <data-dir>/limits.json across restarts; each gateway process "
    "limits the sends it sees. Changing them takes an operator key (or the admin key where the key file "
    "serves one tenant, as `make run`'s does). "
)


def register(commands: Any) -> None:
    """Add `strictq limits [list|set|clear]` to the `strictq` subcommand parsers."""
    limits = commands.add_parser(
        "limits",
        help="per-tenant send rate limits at the gateway: list, set, clear",
        description="Show the send limit of each tenant (its own or the default) and how many requests and "
        "messages it had throttled, or change one. " + LIMITS_HELP + ENV_HELP,
    )
    actions = limits.add_subparsers(dest="limits_action", metavar="{list,set,clear}")
    listing = actions.add_parser("list", help="each tenant's limit and throttle counts (the default action)")
    _json_flag(listing, "the server's answer as JSON instead of a table")
    _common(listing)
    setting = actions.add_parser(
        "set",
        help="give TENANT a limit of its own",
        description="Give TENANT its own send limit (instead of the default). " + LIMITS_HELP + ENV_HELP,
    )
    setting.add_argument("tenant", metavar="TENANT")
    amount = setting.add_mutually_exclusive_group(required=True)
    amount.add_argument("--rate", type=float, metavar="MSGS_PER_S", help="messages per second on average")
    amount.add_argument("--unlimited", action="store_true", help="no limit for TENANT, whatever the default")
    setting.add_argument(
        "--burst", type=float, metavar="MSGS", help="messages at once after a quiet spell (default: the rate)"
    )
    _json_flag(setting, "the server's answer as JSON instead of a line")
    _common(setting)
    clearing = actions.add_parser("clear", help="TENANT back to the default limit")
    clearing.add_argument("tenant", metavar="TENANT")
    _json_flag(clearing, "the server's answer as JSON instead of a line")
    _common(clearing)
    # `strictq limits` alone lists, with the admin key from the environment; the flags are the actions'
    # (the same flags on the parent would be overwritten by a subcommand's defaults: argparse).
    for parser in (limits, listing, setting, clearing):
        parser.set_defaults(handler=cmd_limits, json=False)


PROTECTIONS_HELP = (
    "Backpressure: past a threshold (the oldest message's age, the queue's size) the gateway admits only the "
    "share threshold/backlog of the sends to QUEUE (at least 5%), evenly, and refuses the rest with 429 "
    "backpressure and Retry-After (EmoDB face) or RequestThrottled (SQS face), saying why, until the backlog "
    "is back under. TTL: messages older than --ttl leave the queue in order, dropped or (--on-expiry "
    "dead_letter) moved to its dead-letter queue, counted and logged. All off by default (a queue accepts "
    "and keeps whatever comes, as order processing may prefer). Fairness, for a queue shared by tenants "
    "whose groups are named <tenant><separator><rest>: tenants take turns at delivery, each tenant may "
    "hold --tenant-concurrency claims at once, each tenant's groups go to --pools-per-tenant of "
    "--worker-pools pools of workers (shuffle-sharding), and groups over a tenant's --sideline-rate or "
    "older than --sideline-age wait whole in a spillover lane served once the live lane is caught up. "
    "Takes the admin key (its tenant's queues) "
    "or an operator key (any queue, by its core name <tenant>.<name>). "
)
SETTINGS = (  # (flag's dest, attribute)
    ("backpressure_age", "backpressure_age"),
    ("backpressure_depth", "backpressure_depth"),
    ("ttl", "ttl"),
    ("on_expiry", "on_expiry"),
    ("tenant_separator", "tenant_separator"),
    ("tenant_concurrency", "tenant_concurrency"),
    ("group_in_flight", "group_in_flight"),
    ("worker_pools", "worker_pools"),
    ("pools_per_tenant", "pools_per_tenant"),
    ("sideline_age", "sideline_age"),
    ("sideline_rate", "sideline_rate"),
)


def register_protections(commands: Any) -> None:
    """Add `strictq protections QUEUE [...]` to the `strictq` subcommand parsers."""
    parser = commands.add_parser(
        "protections",
        help="show or set a queue's backpressure and TTL (docs/protections.md)",
        description="Show QUEUE's protections, its backlog now, the share of sends admitted, the sends "
        "refused and the messages expired; with a setting, change it first. " + PROTECTIONS_HELP + ENV_HELP,
    )
    parser.add_argument("queue", metavar="QUEUE")
    parser.add_argument(
        "--backpressure-age",
        type=float,
        metavar="SECONDS",
        help="the oldest message's age threshold (0: off)",
    )
    parser.add_argument(
        "--backpressure-depth", type=int, metavar="MESSAGES", help="the queue's size threshold (0: off)"
    )
    parser.add_argument(
        "--ttl", type=float, metavar="SECONDS", help="messages older than this expire (0: off)"
    )
    parser.add_argument(
        "--on-expiry",
        choices=("drop", "dead_letter"),
        help="what becomes of expired messages (default: drop)",
    )
    fairness = parser.add_argument_group("fairness (a queue shared by tenants; 0 or '' turns one off)")
    fairness.add_argument(
        "--tenant-separator",
        metavar="CHAR",
        help="groups are named <tenant>CHAR<rest> (e.g. ':'); tenants then take turns at delivery",
    )
    fairness.add_argument(
        "--tenant-concurrency", type=int, metavar="N", help="a tenant's groups claimed at once, at most"
    )
    fairness.add_argument(
        "--group-in-flight", type=int, metavar="N", help="messages of one group in one claim, at most"
    )
    fairness.add_argument(
        "--worker-pools", type=int, metavar="N", help="shuffle-sharding: pools of workers (by worker id)"
    )
    fairness.add_argument(
        "--pools-per-tenant", type=int, metavar="K", help="pools each tenant is hashed onto (default 2)"
    )
    fairness.add_argument(
        "--sideline-age", type=float, metavar="SECONDS", help="older groups wait in the spillover lane"
    )
    fairness.add_argument(
        "--sideline-rate",
        type=float,
        metavar="PER_SECOND",
        help="a tenant's sends over this rate sideline their groups",
    )
    parser.add_argument("--dedupq", action="store_true", help="QUEUE is an EmoDB dedup queue (/dedupq/1)")
    _json_flag(parser, "the server's answer as JSON instead of lines")
    _common(parser)
    parser.set_defaults(handler=cmd_protections)


def cmd_protections(args: argparse.Namespace) -> int:
    path = f"/admin/v1/queues/{_quote(args.queue)}/protections" + ("?face=dedupq" if args.dedupq else "")
    changes = {name: getattr(args, dest) for dest, name in SETTINGS if getattr(args, dest) is not None}

    def body() -> dict[str, Any]:
        for flag in ("backpressure_age", "ttl", "sideline_age", "sideline_rate"):
            value = changes.get(flag)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UsageError(f"--{flag.replace('_', '-')} {value:g}: give seconds, 0 or more (0: off)")
        for flag in ("backpressure_depth", "tenant_concurrency", "group_in_flight", "worker_pools"):
            count = changes.get(flag)
            if count is not None and count < 0:
                raise UsageError(f"--{flag.replace('_', '-')} {count}: give a number, 0 or more (0: off)")
        return changes

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
            return
        age = f"{result.get('backpressure_age', 0):g} s" if result.get("backpressure_age") else "off"
        depth = f"{result.get('backpressure_depth')} messages" if result.get("backpressure_depth") else "off"
        print_line(f"{result.get('queue')}: backpressure age {age}, depth {depth}")
        if result.get("ttl"):
            where = "dead-lettered" if result.get("on_expiry") == "dead_letter" else "dropped"
            print_line(f"ttl {result.get('ttl'):g} s, then {where}; {result.get('expired', 0)} expired")
        else:
            print_line(f"ttl off (retention only); {result.get('expired', 0)} expired")
        share = float(result.get("admitted_share", 1.0))
        backlog = f"{result.get('messages', 0)} messages, the oldest {result.get('oldest_age', 0):.0f} s old"
        state = (
            f"slowing producers to {share:.0%}: {result.get('why')}" if share < 1 else "admitting every send"
        )
        print_line(f"now: {backlog}; {state}; {result.get('refused', 0)} sends refused by this gateway")
        print_line(_fairness_line(result))

    return _run(args, "PUT" if changes else "GET", path, body if changes else None, show)


def _fairness_line(result: dict[str, Any]) -> str:
    separator = result.get("tenant_separator") or ""
    parts = [f"tenants by {separator!r}, taking turns" if separator else "no tenants (oldest first)"]
    if result.get("tenant_concurrency"):
        parts.append(f"{result['tenant_concurrency']} claims per tenant")
    if result.get("group_in_flight"):
        parts.append(f"{result['group_in_flight']} messages per group claim")
    if result.get("worker_pools"):
        parts.append(f"{result.get('pools_per_tenant')} of {result['worker_pools']} worker pools per tenant")
    sideline = []
    if result.get("sideline_rate"):
        sideline.append(f"over {result['sideline_rate']:g}/s per tenant")
    if result.get("sideline_age"):
        sideline.append(f"older than {result['sideline_age']:g} s")
    if sideline:
        parts.append("sidelining groups " + " or ".join(sideline))
    return "fairness: " + ", ".join(parts) + f"; {result.get('sidelined', 0)} groups sidelined"


def cmd_limits(args: argparse.Namespace) -> int:
    action = args.limits_action or "list"
    if action == "list":
        return _run(args, "GET", "/admin/v1/limits", None, lambda result: _show_list(args, result))
    path = f"/admin/v1/limits/{_quote(args.tenant)}"
    if action == "clear":
        return _run(args, "DELETE", path, None, lambda result: _show_one(args, result))

    def body() -> dict[str, Any]:
        if args.unlimited:
            if args.burst is not None:
                raise UsageError("--burst goes with --rate, not --unlimited")
            return {"rate": None}
        if not (math.isfinite(args.rate) and args.rate > 0):
            raise UsageError(f"--rate {args.rate:g}: give a positive number of messages per second")
        if args.burst is not None and not (math.isfinite(args.burst) and args.burst >= 1):
            raise UsageError(f"--burst {args.burst:g}: give a number of messages, at least 1")
        return {"rate": args.rate} | ({} if args.burst is None else {"burst": args.burst})

    return _run(args, "PUT", path, body, lambda result: _show_one(args, result))


def describe_limit(limit: Any) -> str:
    if not isinstance(limit, dict):
        return "unlimited"
    return f"{limit.get('rate', 0):g} msg/s, burst {limit.get('burst', 0):g}"


def _show_one(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        _print_json(result)
        return
    source = "its own" if result.get("source") == "tenant" else "the default"
    print_line(f"{result.get('tenant')}: {describe_limit(result.get('limit'))} ({source})")


def _show_list(args: argparse.Namespace, result: Any) -> None:
    if args.json:
        _print_json(result)
        return
    print_line(f"default: {describe_limit(result.get('default'))}")
    rows = [("TENANT", "LIMIT", "FROM", "ADMITTED", "THROTTLED (REQUESTS/MESSAGES)")]
    for item in result.get("tenants", []):
        rows.append(
            (
                str(item.get("tenant")),
                describe_limit(item.get("limit")),
                "tenant" if item.get("source") == "tenant" else "default",
                str(item.get("admitted", 0)),
                f"{item.get('throttled_requests', 0)}/{item.get('throttled_messages', 0)}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print_line("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
