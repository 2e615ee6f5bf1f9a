"""Group routing and rollouts over HTTP, on the process holding the core (docs/rollouts.md).

- `GET /admin/v1/queues/{queue}/routing`: the queue's routing (pins, canary), the rollout record, per
  worker version the attempts that succeeded and failed since the routing last changed, the workers that
  polled as it in the last 30 s and those of them fenced (what a rollout's gate compares), and those
  workers' versions (`workers`: what a rollout's replay gate picks recorded traffic by).
- `PUT /admin/v1/queues/{queue}/routing` with `{"pins": [...], "canary": {...}}` (or `null`: off):
  validated by the core (queue_core.machine.routing), 400 naming the field at fault.
- `PUT /admin/v1/queues/{queue}/rollout` with `{"version", "percent", "state", "reason", ...}`: one step
  of `strictq rollout` — the canary share set to `percent` (`running`), to 0 (`reverted`: the version's
  workers take nothing) or to 100 (`completed`: only the version's workers take groups), the
  record kept with the queue's attributes and the step published as an event (`rollout-running`,
  `rollout-reverted`, `rollout-completed`: `strictq status`, the wire log).

`admin` keys act on their tenant's queues by their names, `operator` keys on any queue; errors are the one
JSON body of the admin routes.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES

from .admin_http import scope_of
from .failures import FailureManager
from .health_http import FAILURES, HealthRequestError, _body, _errors_as_json, _internal_queue
from .http_errors import json_response
from .machine.errors import InvalidArgument
from .machine.routing import MAX_NAME, figures_of, parse_routing

ROLLOUT_STATES = ("running", "completed", "reverted")
RECENT = 30.0  # seconds: a worker that polled since counts as running its version
MAX_WORKERS_SHOWN = 1000


def _view(manager: FailureManager, name: str, internal: str) -> dict[str, Any]:
    queue = manager.service.core.queue(internal)
    router = queue.router
    horizon = manager.service.clock() - RECENT
    recent = {
        worker: version
        for worker, version in queue.worker_versions.items()
        if queue.pollers.get(worker, horizon - 1) >= horizon
    }
    figures = figures_of(queue.worker_versions, recent, router.attempts if router is not None else {})
    monitor = manager.service.supervisor.monitor
    for version, tally in figures.items():
        # Every worker known to run it, not only the recent pollers: a fenced worker's polls are held
        # before they reach the claims, so it stops counting as polling while it stays fenced.
        known = [w for w, v in queue.worker_versions.items() if v == version]
        tally["fenced"] = sum(1 for w in known if monitor is not None and monitor.blocked(w))
    return {
        "queue": name,
        "routing": parse_routing(queue.attributes.routing).to_json(),
        "rollout": queue.attributes.rollout,
        "versions": figures,
        "workers": dict(sorted(recent.items())[:MAX_WORKERS_SHOWN]),
    }


@_errors_as_json
async def get_routing(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    return json_response(_view(manager, name, _internal_queue(manager, scope, name)))


@_errors_as_json
async def put_routing(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    internal = _internal_queue(manager, scope, name)
    data = await _body(request)
    routing = parse_routing(data or None).to_json() or None  # the core validates again, in its one place
    await manager.service.set_attributes(internal, {"routing": routing})
    return json_response(_view(manager, name, internal))


@_errors_as_json
async def put_rollout(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, WRITE_ROLES)
    manager = request.app[FAILURES]
    name = request.match_info["queue"]
    internal = _internal_queue(manager, scope, name)
    data = await _body(request)
    state = data.get("state")
    if state not in ROLLOUT_STATES:
        raise HealthRequestError(f"state must be one of {', '.join(ROLLOUT_STATES)}", "bad_state")
    version = data.get("version")
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 1000:
        raise HealthRequestError("reason must be a string of at most 1000 characters", "bad_reason")
    percent = data.get("percent", 0)
    if not isinstance(percent, int | float) or isinstance(percent, bool) or not 0 <= percent <= 100:
        raise InvalidArgument("percent must be a number from 0 to 100", field="percent")
    attributes = manager.service.core.queue(internal).attributes
    routing = parse_routing(attributes.routing).to_json()
    # Reverted: the canary's workers keep a share of nothing (without a canary they would take any group);
    # completed: every group goes to the new version until the routing says otherwise.
    share = percent if state == "running" else 0 if state == "reverted" else 100
    routing["canary"] = {"version": version, "percent": share}
    if data.get("baseline"):
        routing["canary"]["baseline"] = data["baseline"]
    if not isinstance(version, str) or not 0 < len(version) <= MAX_NAME:
        raise InvalidArgument("version must name the rollout's version", field="version")
    parse_routing(routing)  # the version's characters checked, naming the field
    record = {**data, "updated_at": round(time.time(), 3)}
    await manager.service.set_attributes(internal, {"routing": routing, "rollout": record})
    manager.record(
        f"rollout-{state}",
        f"version {version} at {percent:g}% of groups" + (f": {reason}" if reason else ""),
        queue=internal,
    )
    await manager.settled()
    return json_response(_view(manager, name, internal))


def add_routing_routes(app: web.Application) -> None:
    """Serve the routes above from `app`, which already serves failure management's (FAILURES)."""
    app.router.add_get("/admin/v1/queues/{queue}/routing", get_routing)
    app.router.add_put("/admin/v1/queues/{queue}/routing", put_routing)
    app.router.add_put("/admin/v1/queues/{queue}/rollout", put_rollout)
