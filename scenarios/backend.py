"""The failover scenario's fake payments backend: it counts the calls that reach it, per worker and kind,
so a fence shows as calls that stop arriving."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable

from aiohttp import web

from .settings import GOOD_BASE, KIND_HEADER, WORKER_HEADER


class Backend:
    """The fake payments backend: `POST /v1/charge`, `GET /v1/health`; 404 elsewhere; 503 while down.
    It remembers when each call reached it, per worker and kind, and the charges per order."""

    def __init__(self) -> None:
        self.down = False
        self.calls: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.charges: Counter[tuple[str, int]] = Counter()
        self.switched: list[tuple[float, bool]] = []  # (when, down)
        self.url = ""
        self._runner: web.AppRunner | None = None

    def set_down(self, down: bool) -> float:
        self.down = down
        now = time.time()
        self.switched.append((now, down))
        return now

    def count(self, worker: str, kinds: Iterable[str] = ("order", "canary"), since: float = 0.0,
              until: float = float("inf")) -> int:  # fmt: skip
        return sum(1 for k in kinds for at in self.calls.get((worker, k), ()) if since <= at <= until)

    async def _handle(self, request: web.Request) -> web.Response:
        worker = request.headers.get(WORKER_HEADER, "-")
        kind = request.headers.get(KIND_HEADER, "-")
        self.calls[(worker, kind)].append(time.time())
        if self.down:
            return web.json_response({"error": "payments backend unavailable"}, status=503)
        if request.method == "GET" and request.path == f"{GOOD_BASE}/health":
            return web.json_response({"ok": True})
        if request.method == "POST" and request.path == f"{GOOD_BASE}/charge":
            order = await request.json()
            self.charges[(str(order["group"]), int(order["n"]))] += 1
            return web.json_response({"charge_id": f"ch-{order['group']}-{order['n']}", "status": "ok"})
        return web.json_response({"error": f"no route {request.method} {request.path}"}, status=404)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
