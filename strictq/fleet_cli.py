"""The worker fleet on the command line (docs/fleet.md): `strictq fleet` lists workers, `strictq control`
sends them control messages, `strictq fleet-policy` sets a queue's rebalancing policy; and the fleet's
settings flags of `strictq serve`.

Cheap to import (argparse only), like strictq.health_cli, whose request plumbing (`_run`: the admin key,
the one-line refusal) these commands share.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .admin_cli import ENV_HELP, UsageError, _common, _json_flag, _print_json, _quote, _run, print_line
from .health_cli import _seconds, _table

KINDS = ("config", "log_level", "drain", "sleep", "wake", "upgrade")
TEXT_KEYS = frozenset({"version", "level"})  # always text: `--set version=2.0` is "2.0", not a number


# ------------------------------------------------------------------------------------------ settings
def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("worker fleet", "heartbeats and control messages (docs/fleet.md)")
    group.add_argument(
        "--fleet-stale-after",
        dest="fleet_stale_intervals",
        type=float,
        metavar="INTERVALS",
        help="heartbeat intervals a worker may miss before it counts as gone (default 3)",
    )
    group.add_argument(
        "--fleet-control-ttl",
        dest="fleet_control_ttl",
        type=_seconds,
        metavar="SECONDS",
        help="how long an issued control waits for its worker to acknowledge it (default 1h)",
    )


def settings_from_args(args: argparse.Namespace) -> Any:
    """FleetSettings from the flags; ValueError on values out of range."""
    from queue_core.machine.fleet import FleetSettings

    given = {
        name: getattr(args, f"fleet_{name}")
        for name in ("stale_intervals", "control_ttl")
        if getattr(args, f"fleet_{name}", None) is not None
    }
    return FleetSettings(**given).validate()


# ------------------------------------------------------------------------------------------ commands
def register(commands: Any) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="list the worker fleet: states, versions, loads, pending controls",
        description="List the workers that send heartbeats (the SDK's Worker does): their queues, state "
        "(active, sleeping, draining, drained; the one the service wants beside it when they differ), "
        "version, load (in flight / concurrency), last heartbeat and pending control messages; and the "
        "queues' rebalancing policies. " + ENV_HELP,
    )
    _json_flag(fleet, "the server's answer as one JSON object")
    _common(fleet)
    fleet.set_defaults(handler=cmd_fleet)

    control = commands.add_parser(
        "control",
        help="send workers a control message (config, log_level, drain, sleep, wake, upgrade)",
        description="Send a control message to workers: --worker (repeatable) names them, --queue Q sends "
        "it to every live worker of Q (--version narrows to those running it). KIND and its arguments "
        "(--set KEY=VALUE; VALUE as JSON when it parses, else text; version and level always text): "
        "config (concurrency, limit, ttl, "
        "wait: `--set concurrency=4`), log_level (`--set level=DEBUG`), drain, sleep, wake (no "
        "arguments), upgrade (`--set version=2.1`, optional `--set 'args={...}'` for the worker's "
        "upgrade hook). The control is durable until the worker acknowledges it (applied, refused, failed: "
        "events in `strictq status`) or its --ttl runs out. " + ENV_HELP,
    )
    control.add_argument("kind", metavar="KIND", choices=KINDS, help=" | ".join(KINDS))
    targets = control.add_mutually_exclusive_group(required=True)
    targets.add_argument("--worker", action="append", metavar="WORKER", help="a worker id (repeatable)")
    targets.add_argument("--queue", metavar="QUEUE", help="every live worker of this queue")
    control.add_argument("--version", metavar="VERSION", help="with --queue: only workers running it")
    control.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="an argument of KIND (repeatable)"
    )
    control.add_argument("--ttl", type=_seconds, help="how long it waits for the worker (default: 1h)")
    _json_flag(control, "the server's answer as JSON instead of a table")
    _common(control)
    control.set_defaults(handler=cmd_control)

    policy = commands.add_parser(
        "fleet-policy",
        help="set or clear a queue's rebalancing policy (sleep surplus idle workers, wake on backlog)",
        description="Rebalance QUEUE's workers by their heartbeats: while its backlog is empty, idle "
        "workers beyond --min-active are put to sleep (idle: --idle-heartbeats heartbeats in a row with "
        "nothing in flight and no message received); sleepers are woken once the backlog reaches "
        "--wake-backlog messages or its oldest message is --wake-age old. --off removes the policy "
        "(nobody is put to sleep; the default). Decisions are events in `strictq status`. " + ENV_HELP,
    )
    policy.add_argument("queue", metavar="QUEUE")
    policy.add_argument("--off", action="store_true", help="remove the queue's policy")
    policy.add_argument("--min-active", type=int, metavar="N", help="workers kept awake (default 1)")
    policy.add_argument("--idle-heartbeats", type=int, metavar="N", help="idle heartbeats before sleep (3)")
    policy.add_argument("--wake-backlog", type=int, metavar="N", help="ready messages that wake (1)")
    policy.add_argument("--wake-age", type=_seconds, metavar="SECONDS", help="oldest message age that wakes")
    _json_flag(policy, "the server's answer as JSON")
    _common(policy)
    policy.set_defaults(handler=cmd_policy)


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs as the control's args: VALUE as JSON when it parses, else as text (and
    always as text for `version` and `level`)."""
    import json

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {pair!r}: give KEY=VALUE")
        if key in TEXT_KEYS:
            out[key] = value
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def cmd_control(args: argparse.Namespace) -> int:
    def body() -> dict[str, Any]:
        if args.version is not None and args.queue is None:
            raise UsageError("--version narrows --queue: give --queue too")
        data: dict[str, Any] = {"kind": args.kind, "args": parse_sets(args.set)}
        if args.queue is not None:
            data["queue"] = args.queue
            if args.version is not None:
                data["version"] = args.version
        else:
            data["workers"] = args.worker
        if args.ttl is not None:
            data["ttl"] = args.ttl
        return data

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
            return
        controls = result.get("controls", []) if isinstance(result, dict) else []
        rows: list[tuple[str, ...]] = [("ID", "WORKER", "KIND", "ARGS")]
        for c in controls:
            rows.append((str(c.get("id")), str(c.get("worker")), str(c.get("kind")), _args(c.get("args"))))
        for line in _table(rows):
            print_line(line.removeprefix("  "))

    return _run(args, "POST", "/admin/v1/fleet/control", body, show)


def cmd_fleet(args: argparse.Namespace) -> int:
    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        else:
            sys.stdout.write(format_fleet(result if isinstance(result, dict) else {}))

    return _run(args, "GET", "/admin/v1/fleet", None, show)


def cmd_policy(args: argparse.Namespace) -> int:
    given = {
        "min_active": args.min_active,
        "idle_heartbeats": args.idle_heartbeats,
        "wake_backlog": args.wake_backlog,
        "wake_age": args.wake_age,
    }
    chosen = {k: v for k, v in given.items() if v is not None}

    def body() -> dict[str, Any]:
        if args.off and chosen:
            raise UsageError("--off takes no other setting")
        return chosen

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
            return
        policy = result.get("policy") if isinstance(result, dict) else None
        if policy is None:
            print_line(f"{args.queue}: no rebalancing policy")
        else:
            print_line(f"{args.queue}: rebalancing " + ", ".join(f"{k}={v}" for k, v in policy.items()))

    path = f"/admin/v1/fleet/policies/{_quote(args.queue)}"
    return _run(args, "DELETE" if args.off else "PUT", path, None if args.off else body, show)


# ------------------------------------------------------------------------------------------- output
def format_fleet(view: dict[str, Any]) -> str:
    lines = ["WORKERS"]
    workers = view.get("workers") or []
    if not workers:
        lines.append("  (none: no worker has sent a heartbeat)")
    else:
        now = time.time()
        rows: list[tuple[str, ...]] = [("WORKER", "STATE", "VERSION", "QUEUES", "LOAD", "LAST", "PENDING")]
        for w in workers:
            state = str(w.get("state", "?"))
            if w.get("desired") and w.get("desired") != state:
                state += f" -> {w['desired']}"
            if w.get("stale"):
                state += " (stale)"
            load = w.get("load") or {}
            shown_load = f"{load.get('in_flight', 0)}/{load.get('concurrency', 0)}" if load else "-"
            last = w.get("last_seen")
            ago = f"{max(now - last, 0):.1f}s ago" if isinstance(last, int | float) else "never"
            pending = ", ".join(f"{c['kind']} {c['id']}" for c in w.get("pending") or []) or "-"
            queues = ",".join(w.get("queues") or []) or "-"
            rows.append(
                (str(w["worker"]), state, str(w.get("version") or "-"), queues, shown_load, ago, pending)
            )
        lines.extend(_table(rows))
    policies = view.get("policies") or {}
    lines.append("")
    lines.append("REBALANCING")
    if not policies:
        lines.append("  (no queue has a policy)")
    for queue, policy in policies.items():
        lines.append(f"  {queue}: " + ", ".join(f"{k}={v}" for k, v in policy.items()))
    from wirelog.logsafe import escape_controls  # names and versions are client text

    return "\n".join(escape_controls(line) for line in lines) + "\n"


def _args(value: Any) -> str:
    if not isinstance(value, dict) or not value:
        return "-"
    return ", ".join(f"{k}={v}" for k, v in value.items())
