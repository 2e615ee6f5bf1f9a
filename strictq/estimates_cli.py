"""`strictq estimates QUEUE`: read and set a queue's processing-time estimates (pipelining,
docs/pipelining.md) through gateway.estimates_http.

Cheap to import (stdlib only), like strictq.limits_cli, whose admin-key and request plumbing it shares.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .admin_cli import ENV_HELP, UsageError, _common, _json_flag, _print_json, _quote, _run, print_line

ESTIMATES_HELP = (
    "Workers that pipeline (the SDK's Worker(preprocess=...)) pre-process the next message of another group "
    "while the current one is processed, starting so that it is ready when the current one ends: at the "
    "current message's processing estimate minus the next one's pre-processing estimate. Deliveries carry "
    "them: the message's own (its producer's X-Strictq-Estimate), else the queue's settings here, else "
    "what the queue learned from its workers' attempts (a least-squares fit of duration against message "
    "size). 0 clears a setting (learned again). Takes the admin key (its tenant's queues) or an operator "
    "key (any queue, by its core name <tenant>.<name>). "
)


def register_estimates(commands: Any) -> None:
    """Add `strictq estimates QUEUE [--processing S] [--preprocessing S]` to the subcommand parsers."""
    parser = commands.add_parser(
        "estimates",
        help="show or set a queue's processing-time estimates (docs/pipelining.md)",
        description="Show QUEUE's processing and pre-processing estimates; with a setting, change it "
        "first. " + ESTIMATES_HELP + ENV_HELP,
    )
    parser.add_argument("queue", metavar="QUEUE")
    parser.add_argument(
        "--processing", type=float, metavar="SECONDS", help="seconds to process a message (0: learned)"
    )
    parser.add_argument(
        "--preprocessing", type=float, metavar="SECONDS", help="seconds to pre-process one (0: learned)"
    )
    parser.add_argument("--dedupq", action="store_true", help="QUEUE is an EmoDB dedup queue (/dedupq/1)")
    _json_flag(parser, "the server's answer as JSON instead of a line")
    _common(parser)
    parser.set_defaults(handler=cmd_estimates)


def cmd_estimates(args: argparse.Namespace) -> int:
    path = f"/admin/v1/queues/{_quote(args.queue)}/estimates" + ("?face=dedupq" if args.dedupq else "")
    changes = {
        f"{flag}_estimate": getattr(args, flag)
        for flag in ("processing", "preprocessing")
        if getattr(args, flag) is not None
    }

    def body() -> dict[str, Any]:
        for name, value in changes.items():
            if not (math.isfinite(value) and value >= 0):
                flag = name.removesuffix("_estimate")
                raise UsageError(f"--{flag} {value:g}: give seconds, 0 or more (0: learned)")
        return changes

    def show(result: Any) -> None:
        if args.json:
            _print_json(result)
            return

        def shown(value: Any) -> str:
            return f"{value:g} s" if value else "learned"

        print_line(
            f"{result.get('queue')}: processing {shown(result.get('processing_estimate'))}, "
            f"pre-processing {shown(result.get('preprocessing_estimate'))}"
        )

    return _run(args, "PUT" if changes else "GET", path, body if changes else None, show)
