"""Admin addon: a small aiohttp server on its own port inside the proxy process.

- `/healthz`: the process is alive (its event loop answers);
- `/readyz`: ready to pass tagged calls, i.e. the control stream is synchronised (503 until then, with
  the gateway's `{"error": {"code": "not_ready", ...}}` body; a proxy started without `--control` has no
  stream to wait for and is ready at once);
- `/metrics`: Prometheus text (fencing.metrics_export; names in docs/metrics.md): calls by action, code and
  status class, auth refusals, malformed tags, upstream errors, records written, the wire-log writer's
  counters, fences and floors known, open client connections, calls in flight. The same as one JSON object
  with `?format=json` or `Accept: application/json` (what the tests and scripts read). Unauthenticated: the
  admin port listens on loopback by default (docs/security.md).

Errors (an unknown route, a wrong method) are JSON like every other app's (queue_core.http_errors).
It runs on the proxy's own loop, so it answers only while that loop is responsive: exactly what a
health check should measure.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web
from mitmproxy import exceptions
from mitmproxy.addonmanager import Loader
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from fencing.metrics_export import ProxyCollector
from fencing.runtime import ProxyRuntime
from protocol.errors import NOT_READY, error_body
from queue_core.http_errors import json_http_errors

log = logging.getLogger("strictq.proxy.admin")


class Admin:
    def __init__(self, runtime: ProxyRuntime, control: Any = None) -> None:
        self.runtime = runtime
        self.control = control  # the guards' Control addon: its state says whether we are synchronised
        self.host = "127.0.0.1"
        self.port = 0
        self._runner: web.AppRunner | None = None
        # This process's own registry (never prometheus_client's global one), read at scrape time.
        self.registry = CollectorRegistry()
        self.registry.register(ProxyCollector(runtime, self._client_connections, self._wirelog_counters))

    def load(self, loader: Loader) -> None:
        add = loader.add_option
        add(
            "strictq_admin_host",
            str,
            "127.0.0.1",
            "Address of the admin server (/healthz, /readyz, /metrics).",
        )
        add("strictq_admin_port", int, 8490, "Port of the admin server; 0 picks a free one, -1 disables it.")

    def configure(self, updated: set[str]) -> None:
        from mitmproxy import ctx

        if "strictq_admin_port" in updated:
            port = ctx.options.strictq_admin_port
            if not -1 <= port <= 65535:
                raise exceptions.OptionsError("strictq_admin_port must be -1 (off) or 0-65535")
            self.port = port
        if "strictq_admin_host" in updated:
            self.host = ctx.options.strictq_admin_host

    async def running(self) -> None:
        if self.port < 0:
            return
        app = web.Application(middlewares=[json_http_errors])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            self.runtime.startup_errors.append(f"admin server on {self.host}:{self.port}: {exc}")
            return
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.runtime.admin_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def done(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---------------------------------------------------------------------------------------- routes
    def _synced(self) -> tuple[bool, str]:
        control = self.control
        if control is None:
            return True, "no control stream configured"
        enabled = getattr(control, "enabled", None)
        if enabled is False:
            return True, "no control stream configured"
        state = self.runtime.control
        if state.synced:
            return True, "control stream synchronised"
        return False, "control stream not synchronised"

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "process": self.runtime.name})

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = self._synced()
        body: dict[str, Any] = {"ready": ready, "reason": reason, "process": self.runtime.name}
        if not ready:
            body.update(error_body(NOT_READY, reason, retriable=True))
        return web.json_response(body, status=200 if ready else 503)

    @staticmethod
    def _client_connections() -> int | None:
        from mitmproxy import ctx

        proxyserver = ctx.master.addons.get("proxyserver")
        return None if proxyserver is None else len(proxyserver.connections)

    @staticmethod
    def _wirelog_counters() -> dict[str, int] | None:
        from mitmproxy import ctx

        writer = getattr(ctx.master.addons.get("capture"), "writer", None)
        return None if writer is None else dict(writer.counters())

    async def metrics(self, request: web.Request) -> web.Response:
        if not wants_json(request):
            text = generate_latest(self.registry)
            return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE_LATEST})
        body: dict[str, Any] = {
            "process": self.runtime.name,
            "uptime_s": round(time.time() - self.runtime.started_at, 3),
            "counters": dict(self.runtime.metrics),
            "in_flight": self.runtime.in_flight,
        }
        connections = self._client_connections()
        if connections is not None:
            body["client_connections"] = connections
        wirelog = self._wirelog_counters()
        if wirelog is not None:
            body["wirelog"] = wirelog
        state = self.runtime.control
        body["control"] = {
            "synced": bool(state.synced),
            "fences": len(state.fences),
            "floors": len(state.floors),
            "last_event_id": state.last_event_id,
        }
        return web.json_response(body)


def wants_json(request: web.Request) -> bool:
    """`?format=json`, or an Accept that names JSON and not Prometheus' text formats."""
    if request.query.get("format") == "json":
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/plain" not in accept and "openmetrics" not in accept
