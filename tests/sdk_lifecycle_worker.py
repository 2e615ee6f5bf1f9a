"""An SDK worker process for tests/test_sdk_lifecycle.py, configured from STRICTQ_* like any worker and run
with `strictq.sdk.run` (SIGTERM: exit 0, Ctrl-C: exit 130). It says what it does on stdout, one line each:
`started <id> <n>` when a handler begins, `done <id> <n>` when it returns.

--mode hang:   the handler runs until cancelled (a message in flight when the signal comes);
--mode ok:     the handler returns at once;
--mode charge: the handler POSTs the payload to --backend through `message.http` (the egress proxy).
--backoff BASE CAP: the worker's full-jitter backoff (seconds) after a refused call or a failing poll.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from strictq.sdk import Message, Worker, run


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queue", required=True)
    parser.add_argument("--mode", choices=("hang", "ok", "charge"), required=True)
    parser.add_argument("--backend", default="")
    parser.add_argument("--ttl", type=float, default=60.0)
    parser.add_argument("--grace", type=float, default=1.0)
    parser.add_argument("--backoff", type=float, nargs=2, default=(0.1, 30.0), metavar=("BASE", "CAP"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    def say(what: str, message: Message) -> None:
        print(f"{what} {message.id} {message.payload.get('n')}", flush=True)

    async def handle(message: Message) -> None:
        say("started", message)
        if args.mode == "hang":
            await asyncio.Event().wait()  # until the worker's grace period is over
        elif args.mode == "charge":
            async with message.http.post(f"{args.backend}/v1/charge", json=message.payload) as response:
                response.raise_for_status()
        say("done", message)

    base, cap = args.backoff
    worker = Worker(args.queue, handle, ttl=args.ttl, grace=args.grace, wait=0.5, backoff=(base, cap))
    return run(worker)


if __name__ == "__main__":
    raise SystemExit(main())
