"""`python -m bench.proxy_backend CERT KEY`: the backend the proxy benchmark calls, HTTP and HTTPS.

An aiohttp server (uvloop, no access log) answering every request with a small JSON body, on two free
loopback ports; prints `backend http <port> https <port>` once both accept connections and stops on
SIGTERM. One process, so the three setups measured (direct, stock mitmdump, our proxy) share it.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys

import orjson
from aiohttp import web

BODY = orjson.dumps({"ok": True, "items": [{"id": i, "name": f"item-{i}"} for i in range(5)]})


async def answer(request: web.Request) -> web.Response:
    if request.body_exists:
        await request.read()
    return web.Response(body=BODY, content_type="application/json")


async def main(cert: str, key: str) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    plain = web.TCPSite(runner, "127.0.0.1", 0)
    secure = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await plain.start()
    await secure.start()
    http_port, https_port = (address[1] for address in runner.addresses)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"backend http {http_port} https {https_port}", flush=True)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(sys.argv[1], sys.argv[2]))
