"""A worker whose handler calls a backend through the egress proxy: every call lands in the wire log
tagged with the message being processed, so `strictq wirelog grep --message-id ...` finds it.

The "payments backend" is a tiny aiohttp server this script starts on 127.0.0.1 (no network needed).
Run with the client settings `strictq serve` wrote (they include STRICTQ_PROXY_URL):
    set -a; . var/strictq/client.env; set +a; .venv/bin/python examples/payments_worker.py

Settings that cannot work end it with one line naming the setting, and exit status 1.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from strictq.sdk import Entry, Message, Producer, SetupError, Worker, WorkerError

QUEUE = "demo-payments"


async def start_backend() -> tuple[web.AppRunner, str]:
    async def charge(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"charged": body["amount"], "card": body["card"]})

    app = web.Application()
    app.router.add_post("/charge", charge)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def main() -> int:
    runner, backend = await start_backend()
    try:
        async with Producer() as producer:
            entries = [Entry(QUEUE, {"card": "card-42", "amount": amount}, "card-42") for amount in (10, 25)]
            sent = await producer.send_batch(entries)
            print("sent:", [r.status for r in sent])

        done = asyncio.Event()
        charged: list[int] = []

        async def handle(message: Message) -> None:
            # Through the proxy (STRICTQ_PROXY_URL), tagged with this message's id, group, lease and call.
            async with message.http.post(f"{backend}/charge", json=message.payload) as response:
                answer = await response.json()
            charged.append(answer["charged"])
            print(f"message {message.id} (group {message.group}, lease {message.token}): {answer}")
            if len(charged) == len(entries):
                done.set()

        worker = Worker(QUEUE, handle)
        worker.install_signal_handlers()  # SIGTERM / Ctrl-C: hand back what it holds, no traceback
        running = asyncio.create_task(worker.run(), name="worker")
        finished = asyncio.create_task(done.wait(), name="done")
        await asyncio.wait({running, finished}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        worker.stop()
        await running
        print(f"acked {worker.stats.acked}, failed {worker.stats.failed}")
        return worker.exit_code  # 0, or 130 after Ctrl-C
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    try:
        raise SystemExit(asyncio.run(main()))
    except (SetupError, WorkerError) as exc:  # one line naming the setting, no traceback
        raise SystemExit(f"examples/payments_worker.py: {exc}") from None
