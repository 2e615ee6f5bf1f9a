"""A minimal strictq worker and producer: two customers' orders, each processed in order, one at a time.

Run with the client settings `strictq serve` wrote:
    set -a; . var/strictq/client.env; set +a; .venv/bin/python examples/worker.py
"""

from __future__ import annotations

import asyncio

from strictq.sdk import Entry, Message, Producer, Worker

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
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(worker.run(), name="worker")
        await asyncio.wait_for(done.wait(), 30)
        worker.stop()
    print(f"acked {worker.stats.acked}, failed {worker.stats.failed}")


if __name__ == "__main__":
    asyncio.run(main())
