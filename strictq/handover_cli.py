"""`strictq handover`: move groups of a queue away from a worker with their local state, release groups held
for a state that will not come, or list the groups in handover (docs/state-transfer.md).

Cheap to import (stdlib only), like strictq.admin_cli, whose admin-key and request plumbing it shares.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .admin_cli import ENV_HELP, _common, _json_flag, _print_json, _quote, _run, print_line

HANDOVER_HELP = (
    "A moved group is delivered to nobody until the worker it moves from (--from) has uploaded its local "
    "state for it (the worker's SDK does so on its next poll, once any claim it holds on the group has "
    "ended), then the next worker to claim the group gets that state with it. If the state does not come "
    "within the queue's handover_timeout, its handover_policy decides: `proceed` delivers the group without "
    "it, `wait` holds it until `strictq handover QUEUE --release GROUP`. "
)


def register(commands: Any) -> None:
    """Add `strictq handover` to the `strictq` subcommand parsers."""
    parser = commands.add_parser(
        "handover",
        help="move groups away from a worker with their local state; release or list held groups",
        description="With --from: move the --group(s) of QUEUE (all groups whose newest claim went to the "
        "worker, without --group) away from that worker. With --release: let held groups go on without "
        "their state. Neither: list the groups in handover. " + HANDOVER_HELP + ENV_HELP,
    )
    parser.add_argument("queue", metavar="QUEUE", help="the queue, as your tenant names it")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--from", dest="donor", metavar="WORKER", help="the worker the groups move away from")
    action.add_argument(
        "--release", action="append", metavar="GROUP", default=[], help="release a held group (repeatable)"
    )
    parser.add_argument(
        "--group",
        action="append",
        metavar="GROUP",
        default=[],
        help="a group to move (repeatable; default: all)",
    )
    parser.add_argument(
        "--policy", choices=("proceed", "wait"), help="instead of the queue's handover_policy, for this move"
    )
    parser.add_argument("--face", choices=("queue", "dedupq"), default="queue", help="an EmoDB dedup queue")
    _json_flag(parser, "the server's answer as JSON")
    _common(parser)
    parser.set_defaults(handler=cmd_handover)


def cmd_handover(args: argparse.Namespace) -> int:
    base = f"/admin/v1/queues/{_quote(args.queue)}/handover"
    face = "" if args.face == "queue" else f"?face={args.face}"
    if (args.group or args.policy) and not args.donor:
        print("strictq: --group and --policy go with --from WORKER", file=sys.stderr)
        return 2

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
        elif args.donor:
            groups = ", ".join(result.get("groups", [])) or "none"
            print_line(f"{args.queue}: moving from {args.donor}: {groups}")
            if result.get("already"):
                print_line(f"  already moving: {', '.join(result['already'])}")
        elif args.release:
            print_line(f"{args.queue}: released {', '.join(result.get('released', [])) or 'nothing'}")
        else:
            rows = result.get("handovers", [])
            if not rows:
                print_line(f"{args.queue}: no group in handover")
            for row in rows:
                print_line(
                    f"{row['group']}  {row['phase']:8}  from {row['donor']}  policy {row['policy']}"
                    f"  state {row['size']} bytes"
                )

    if args.donor:
        body: dict[str, Any] = {"from": args.donor, "groups": args.group or "all"}
        if args.policy:
            body["policy"] = args.policy
        return _run(args, "POST", base + face, lambda: body, show)
    if args.release:
        return _run(args, "POST", base + "/release" + face, lambda: {"groups": args.release}, show)
    return _run(args, "GET", base + face, None, show)
