"""A minimal strictq worker and producer: two customers' orders, each processed in order, one at a time.

Run with the client settings `strictq serve` wrote:
    set -a; . var/strictq/client.env; set +a; .venv/bin/python examples/worker.py

Settings that cannot work (STRICTQ_URL unset, a key the gateway refuses, a CA file that is missing or
does not verify the gateway) end it with one line naming the setting, and exit status 1.
"""

from __future__ import annotations

import asyncio

from strictq.sdk import Entry, Message, Producer, SetupError, Worker, WorkerError

QUEUE = "demo-orders"


async def main() -> None:
    async with Producer() as producer:  # STRICTQ_API_KEY: the producer's key
        entries = [
            Entry(QUEUE, {"order": n, "step": step}, f"customer-{n}") for n in (1, 2) for step in (1, 2)
        ]
        results = await producer.send_batch(entries)
        print("sent:", [r.status for r in results])

    done = asyncio.Event()
    handled: list[str] = []

    async def handle(message: Message) -> None:  # a group's messages come one at a time, in order
        step = message.payload["step"]
        handled.append(f"{message.group}#{step}")
        print(f"{message.group} step {step} token {message.token} attempt {message.attempt}")
        if len(handled) == len(entries):
            done.set()

    worker = Worker(QUEUE, handle)  # STRICTQ_WORKER_ID / STRICTQ_WORKER_SECRET: the worker's credential
    running = asyncio.create_task(worker.run(), name="worker")
    finished = asyncio.create_task(done.wait(), name="done")
    await asyncio.wait({running, finished}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    finished.cancel()
    worker.stop()
    await running  # raises the worker's WorkerError (or ConfigError) if it could not go on
    print(f"acked {worker.stats.acked}, failed {worker.stats.failed}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except (SetupError, WorkerError) as exc:  # one line naming the setting, no traceback
        raise SystemExit(f"examples/worker.py: {exc}") from None
