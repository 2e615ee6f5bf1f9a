"""Failure management at a cluster's edge (docs/failure-management.md §3.2, docs/cluster.md).

- The admin routes of queue_core.health_http (`GET /admin/v1/status`, `/admin/v1/events`, suspend,
  resume, `DELETE /admin/v1/blacklist/{worker}`, `POST /admin/v1/alerts`), answered by the node holding
  the decider (cluster.decider_client), scoped here as in one process.
- `ProbeBridge` copies the decider's probes (`probe.*` keys of the control bucket with a worker) into this
  edge's control hub, so its egress proxies exempt them as in one process. Fences need no copy: the hub's
  registry is the control bucket's (cluster.control_fences).
- `ClusterHealthView`: the decider's status for the status route and the dashboard (queue_core.health_view).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES
from cluster.control_keys import read_state
from cluster.decider_client import DeciderClient
from cluster.kv_mirror import KvMirror
from queue_core.admin_http import existing_queue, scope_of
from queue_core.backend import QueueBackend
from queue_core.control import ControlHub
from queue_core.health_http import (
    NotBlacklisted,
    NotSuspended,
    _body,
    _errors_as_json,
    _int_query,
    _text,
    alert_request,
    scope_status,
    scoped_events,
)
from queue_core.health_view import ErrorCases
from queue_core.http_errors import json_response

log = logging.getLogger("strictq.health")
DECIDER = web.AppKey("strictq_decider", DeciderClient)
BACKEND = web.AppKey("strictq_health_backend", QueueBackend)


# ------------------------------------------------------------------------------------------ routes
async def _queue(request: web.Request, scope: Any, name: str) -> str:
    """The core's name of the caller's queue `name`, looked up by name (not the whole queue list)."""
    return await existing_queue(scope, request.app[BACKEND], name)


class ClusterHealthView:
    """The decider's status for this edge's dashboard and status route (queue_core.health_view): asked
    over NATS, parked groups counted over the partitions, cut to the caller's scope."""

    def __init__(self, client: DeciderClient, backend: QueueBackend) -> None:
        self.client = client
        self.backend = backend

    async def status(self, scope: Any, latest: int) -> dict[str, Any]:
        answer = await self.client.request("status")
        view: dict[str, Any] = answer["status"]
        every = list(view["events"])
        view["events"] = every[-latest:] if latest > 0 else []
        probes: list[dict[str, str | None]] = [
            {"queue": str(q), "worker": None if w is None else str(w)} for q, w in view.pop("probe_list", [])
        ]
        queues = view["queues"]
        parked = await asyncio.gather(
            *(self.backend.parked_groups(q["queue"]) for q in queues), return_exceptions=True
        )  # every queue's partitions asked at once: a refresh of the dashboard costs one round trip
        for queue, groups in zip(queues, parked, strict=True):
            if not isinstance(groups, BaseException):
                queue["parked_groups"] = len(groups)
        return scope_status(view, every, probes, scope, latest)

    async def error_cases(self, scope: Any, now: float) -> ErrorCases | None:
        return None  # the decider's tally stays on its node; the index's error cases are shown instead


@_errors_as_json
async def status(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    latest = _int_query(request, "events", 20)
    view = ClusterHealthView(request.app[DECIDER], request.app[BACKEND])
    return json_response(await view.status(scope, latest))


@_errors_as_json
async def events(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    limit = _int_query(request, "limit", 1000)
    answer = await request.app[DECIDER].request("events", since=_int_query(request, "since", 0))
    shown = scoped_events(scope, list(answer["events"]))
    return json_response({"events": shown[-limit:] if limit > 0 else [], "last": answer["last"]})


@_errors_as_json
async def suspend(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    name = request.match_info["queue"]
    queue = await _queue(request, scope, name)
    reason = _text(await _body(request), "reason", None)
    await request.app[DECIDER].request("suspend", queue=queue, reason=f"operator: {reason}")
    return json_response({"queue": name, "suspended": True, "reason": reason})


@_errors_as_json
async def resume(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    name = request.match_info["queue"]
    queue = await _queue(request, scope, name)
    reason = _text(await _body(request), "reason", "operator")
    answer = await request.app[DECIDER].request("resume", queue=queue, reason=reason)
    if not answer.get("ok"):
        raise NotSuspended(f"queue {name!r} is not suspended")
    return json_response({"queue": name, "resumed": True})


@_errors_as_json
async def lift_blacklist(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    worker = request.match_info["worker"]
    if not scope.sees_worker(worker):
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
    answer = await request.app[DECIDER].request("unblacklist", worker=worker)
    if not answer.get("ok"):
        raise NotBlacklisted(f"worker {worker!r} is not blacklisted")
    return json_response({"worker": worker, "lifted": True})


@_errors_as_json
async def alert(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    asked = alert_request(await _body(request))
    reason, signatures = asked.reason, asked.signatures
    queue = None if asked.queue is None else await _queue(request, scope, asked.queue)
    within = None
    if not scope.operator:  # a tenant's alert by signature reaches only its tenant's queues
        within = [q for q in await request.app[BACKEND].list_queues() if scope.sees_queue(q)]
    answer = await request.app[DECIDER].request(
        "alert", reason=reason, queue=queue, signatures=signatures, queues=within
    )
    names = [n for n in (scope.queue_name(q) for q in answer.get("suspended", [])) if n is not None]
    return json_response({"suspended": names})


def add_cluster_health_routes(app: web.Application, client: DeciderClient, backend: QueueBackend) -> None:
    """The routes above on a cluster edge's app (which has the admin keys already)."""
    app[DECIDER] = client
    app[BACKEND] = backend
    app.router.add_get("/admin/v1/status", status)
    app.router.add_get("/admin/v1/events", events)
    app.router.add_post("/admin/v1/queues/{queue}/suspend", suspend)
    app.router.add_post("/admin/v1/queues/{queue}/resume", resume)
    app.router.add_delete("/admin/v1/blacklist/{worker}", lift_blacklist)
    app.router.add_post("/admin/v1/alerts", alert)


# ------------------------------------------------------------------------------------------ bridge
class ProbeBridge:
    """The decider's probes (`probe.<id>` keys of the control bucket) into this edge's hub, so its proxies
    let a probe's calls through (or mimic them) as in one process. Its fences need no bridge: the hub's
    registry is the control bucket's (cluster.control_fences), which every edge watches, and an operator's
    unfence deletes the decider's key there, which the decider hears as a restore (cluster.decider)."""

    def __init__(self, control: KvMirror, hub: ControlHub, backend: QueueBackend | None = None) -> None:
        self.control = control  # the fence registry's copy of the bucket: it starts and stops it
        self.hub = hub
        self.backend = backend  # the queues' `probe_safe` (a probe's calls pass instead of mimicked)
        self._probes: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="strictq-probe-bridge")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("probe bridge")
            await self.control.changed(1.0)

    async def _probe_mode(self, queue: str) -> str:
        """`pass` for a `probe_safe` queue, else `mimic` (queue_core.failures does the same)."""
        if self.backend is not None:
            with contextlib.suppress(Exception):
                if (await self.backend.attributes(queue)).probe_safe:
                    return "pass"
        return "mimic"

    async def sync(self) -> None:
        state = read_state({k: e.value for k, e in self.control.entries.items()})
        live = {pid: offer for pid, offer in state.probes.items() if offer.worker is not None}
        for pid, offer in sorted(live.items()):
            if pid not in self._probes and offer.worker is not None:
                self._probes.add(pid)
                self.hub.probe(offer.worker, pid, await self._probe_mode(offer.queue))
        for pid in sorted(self._probes - set(live)):
            self._probes.discard(pid)
            self.hub.probe_end(pid)


class EdgeHealth:
    """Failure management's part of a cluster edge: the decider's client and the probe bridge."""

    def __init__(self, client: DeciderClient, bridge: ProbeBridge) -> None:
        self.client = client
        self.bridge = bridge

    def view(self, backend: QueueBackend) -> ClusterHealthView:
        """The decider's state for this edge's dashboard (parked groups counted over `backend`)."""
        return ClusterHealthView(self.client, backend)

    async def start(self) -> None:
        """After the app started (the hub runs): follow the decider's probes."""
        await self.bridge.start()

    async def close(self) -> None:
        await self.bridge.close()
