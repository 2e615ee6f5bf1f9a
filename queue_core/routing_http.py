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

The routes depend on the port only (queue_core.backend: attributes, `version_figures`, set_attributes), so
they answer alike in process, in front of a queue server and of a cluster (which sums its partitions'
figures). What the port does not hold comes from `RoutingHooks`: which workers are fenced (failure
management's view where it runs beside the core, else the control hub's fences) and where a rollout's
step is published as an event (failure management's events; none without it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from access.permissions import READ_ROLES, WRITE_ROLES

from .admin_http import errors_as_json, json_object_body, queue_in_path
from .backend import QueueBackend
from .http_errors import json_response
from .machine.errors import InvalidArgument
from .machine.routing import MAX_NAME, figures_of, parse_routing

log = logging.getLogger("strictq.gateway")
ROLLOUT_STATES = ("running", "completed", "reverted")
# Seconds a step waits for its event to be recorded. The step is in force (stored) before: an event that
# cannot be recorded (no decider right now, a queue server without failure management) is logged, and
# the step answered as done, so a client never retries a change that took effect.
RECORD_WAIT = 3.0
RECENT = 30.0  # seconds: a worker that polled since counts as running its version
MAX_WORKERS_SHOWN = 1000
MAX_BODY = 64 * 1024


@dataclass(frozen=True, slots=True)
class RoutingHooks:
    """What the routes need beside the port: `blocked(worker)` (it takes no real message now: fenced,
    probing or blacklisted), `record(event, reason, queue)` publishing a rollout's step in failure
    management's events, durable when it returns (queue_core.health_view.HealthView.record; None:
    failure management does not run)."""

    blocked: Callable[[str], bool]
    record: Callable[[str, str, str], Awaitable[None]] | None = None


ROUTING_BACKEND = web.AppKey("strictq_routing_backend", QueueBackend)
ROUTING_HOOKS = web.AppKey("strictq_routing_hooks", RoutingHooks)


class RolloutRequestError(InvalidArgument):
    """A refused rollout step: 400 with a code naming what was wrong (`bad_state`, `bad_reason`)."""

    def __init__(self, message: str, code: str, field: str) -> None:
        super().__init__(message, field=field)
        self.code = code


async def _view(request: web.Request, name: str, internal: str) -> dict[str, Any]:
    backend = request.app[ROUTING_BACKEND]
    attributes = await backend.attributes(internal)
    figures = await backend.version_figures(internal, RECENT)
    tallies = figures_of(figures.known, figures.recent, figures.attempts)
    blocked = request.app[ROUTING_HOOKS].blocked
    for version, tally in tallies.items():
        # Every worker known to run it, not only the recent pollers: a fenced worker's polls are held
        # before they reach the claims, so it stops counting as polling while it stays fenced.
        tally["fenced"] = sum(1 for w, v in figures.known.items() if v == version and blocked(w))
    return {
        "queue": name,
        "routing": parse_routing(attributes.routing).to_json(),
        "rollout": attributes.rollout,
        "versions": tallies,
        "workers": dict(sorted(figures.recent.items())[:MAX_WORKERS_SHOWN]),
    }


async def _body(request: web.Request) -> dict[str, Any]:
    return await json_object_body(request, MAX_BODY, "send a JSON object")


@errors_as_json
async def get_routing(request: web.Request) -> web.StreamResponse:
    name, internal = await queue_in_path(request, request.app[ROUTING_BACKEND], READ_ROLES)
    return json_response(await _view(request, name, internal))


@errors_as_json
async def put_routing(request: web.Request) -> web.StreamResponse:
    name, internal = await queue_in_path(request, request.app[ROUTING_BACKEND], WRITE_ROLES)
    data = await _body(request)
    routing = parse_routing(data or None).to_json() or None  # the core validates again, in its one place
    await request.app[ROUTING_BACKEND].set_attributes(internal, {"routing": routing})
    return json_response(await _view(request, name, internal))


@errors_as_json
async def put_rollout(request: web.Request) -> web.StreamResponse:
    backend, hooks = request.app[ROUTING_BACKEND], request.app[ROUTING_HOOKS]
    name, internal = await queue_in_path(request, backend, WRITE_ROLES)
    data = await _body(request)
    state = data.get("state")
    if state not in ROLLOUT_STATES:
        raise RolloutRequestError(f"state must be one of {', '.join(ROLLOUT_STATES)}", "bad_state", "state")
    version = data.get("version")
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 1000:
        raise RolloutRequestError(
            "reason must be a string of at most 1000 characters", "bad_reason", "reason"
        )
    percent = data.get("percent", 0)
    if not isinstance(percent, int | float) or isinstance(percent, bool) or not 0 <= percent <= 100:
        raise InvalidArgument("percent must be a number from 0 to 100", field="percent")
    routing = parse_routing((await backend.attributes(internal)).routing).to_json()
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
    await backend.set_attributes(internal, {"routing": routing, "rollout": record})
    if hooks.record is not None:
        event = f"rollout-{state}"
        told = f"version {version} at {percent:g}% of groups" + (f": {reason}" if reason else "")
        try:
            async with asyncio.timeout(RECORD_WAIT):
                await hooks.record(event, told, internal)
        except Exception as exc:  # the step stands; only its event is missing
            log.warning("rollout step on %s applied, its event %s not recorded: %s", internal, event, exc)
    return json_response(await _view(request, name, internal))


def add_routing_routes(app: web.Application, backend: QueueBackend, hooks: RoutingHooks) -> None:
    """Serve the routes above from `app` over `backend` (its ADMIN_KEYS authenticate them)."""
    app[ROUTING_BACKEND] = backend
    app[ROUTING_HOOKS] = hooks
    app.router.add_get("/admin/v1/queues/{queue}/routing", get_routing)
    app.router.add_put("/admin/v1/queues/{queue}/routing", put_routing)
    app.router.add_put("/admin/v1/queues/{queue}/rollout", put_rollout)
