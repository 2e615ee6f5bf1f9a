"""The backend `examples/replay_worker.py` calls (inventory, charge, notify), for trying replay by hand.

    python examples/replay_backend.py --port 8099

Prints one line per request, so it is easy to see that `strictq replay` sends it nothing.
"""

from __future__ import annotations

import argparse
import uuid

import orjson
from aiohttp import web


async def handle(request: web.Request) -> web.Response:
    body = await request.read()
    print(f"{request.method} {request.path_qs} {body.decode(errors='replace')}", flush=True)
    if request.path.startswith("/inventory/"):
        return web.json_response({"sku": request.path.rsplit("/", 1)[1], "available": 7})
    if request.path == "/charge":
        order = orjson.loads(body)["order"]
        return web.json_response({"charge_id": f"ch-{order}-{uuid.uuid4().hex[:8]}", "status": "ok"})
    return web.json_response({"ok": True})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    args = parser.parse_args()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
