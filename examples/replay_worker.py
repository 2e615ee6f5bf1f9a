"""An order worker for `strictq replay`, with variants that behave differently on purpose.

For each message `{"order": n, "sku": "...", "amount": a}` (group: the customer) it makes three tagged
calls through the egress proxy to the backend at $REPLAY_EXAMPLE_BACKEND (default http://127.0.0.1:8099):

    GET  /inventory/<sku>                               is it in stock?
    POST /charge  {"order": n, "amount": a}             -> {"charge_id": ...}
    POST /notify  {"order": n, "charge_id": ..., "status": "charged"}

A message with `"fail_first": true` fails its first attempt (after the calls) and succeeds on the next.
`--stamp` adds `"sent_at": <now>` to /notify: a non-deterministic field, for masking.

Variants (`--variant`, repeatable, applied only to the message whose order is `--target`; default: every
message):
`same` (default), `body` (charges amount + 1), `added` (checks the inventory twice), `removed` (does not
notify), `swapped` (charges before checking the inventory), `fail` (raises after its calls), `audit`
(also posts to /audit, an endpoint the recording never saw, and ignores the answer).

    set -a; . var/strictq/client.env; set +a
    python examples/replay_worker.py --queue orders                      # the version in production
    strictq replay --wirelog var/strictq/wirelog --queue orders \\
        --worker "python examples/replay_worker.py --queue orders --variant body"
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Any

from strictq.sdk import Message, Worker, serve

VARIANTS = ("same", "body", "added", "removed", "swapped", "fail", "audit")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queue", default="orders")
    parser.add_argument("--variant", choices=VARIANTS, action="append", default=[])
    parser.add_argument("--target", type=int, help="order number the variant applies to (default: all)")
    parser.add_argument("--stamp", action="store_true", help='add "sent_at": <now> to /notify')
    return parser.parse_args()


def make_handler(args: argparse.Namespace, backend: str) -> Any:
    async def handle(message: Message) -> None:
        order = message.payload["order"]
        variant = set(args.variant) if args.target in (None, order) else set()
        http = message.http

        async def inventory() -> None:
            async with http.get(f"{backend}/inventory/{message.payload['sku']}") as response:
                response.raise_for_status()

        async def charge() -> str:
            amount = message.payload["amount"] + (1 if "body" in variant else 0)
            async with http.post(f"{backend}/charge", json={"order": order, "amount": amount}) as response:
                response.raise_for_status()
                return str((await response.json())["charge_id"])

        if "swapped" in variant:
            charge_id = await charge()
            await inventory()
        else:
            await inventory()
            if "added" in variant:
                await inventory()
            charge_id = await charge()
        if "audit" in variant:  # best effort: its answer does not matter to the order
            async with http.post(f"{backend}/audit", json={"order": order}) as response:
                await response.read()
        if "removed" not in variant:
            note: dict[str, Any] = {"order": order, "charge_id": charge_id, "status": "charged"}
            if args.stamp:
                note["sent_at"] = time.time()
            async with http.post(f"{backend}/notify", json=note) as response:
                response.raise_for_status()
        if "fail" in variant:
            raise RuntimeError(f"order {order}: this version refuses it")
        if message.payload.get("fail_first") and message.attempt == 1:
            raise RuntimeError(f"order {order}: first attempt fails (recorded flakiness)")
        print(f"order {order} done (attempt {message.attempt})", flush=True)

    return handle


async def main() -> int:
    args = parse_args()
    backend = os.environ.get("REPLAY_EXAMPLE_BACKEND", "http://127.0.0.1:8099").rstrip("/")
    worker = Worker(args.queue, make_handler(args, backend), wait=1.0, retry_backoff=(0.1, 1.0), grace=2.0)
    # SIGTERM: stop gracefully (replay stops its workers so); settings that cannot work: one line, exit 1/2
    status = await serve(worker)
    print(f"acked {worker.stats.acked}, failed {worker.stats.failed}", flush=True)
    return status


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(asyncio.run(main()))
