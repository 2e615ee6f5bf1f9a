"""Prompt delivery of fleet controls on poll answers (docs/fleet.md): the app's fleet and the
`X-Strictq-Control: pending` header, in a module of their own so the EmoDB face's poll (gateway.emodb) and
the heartbeat route (gateway.fleet_face, which uses the face's authentication) need not import each other."""

from __future__ import annotations

from aiohttp import web

from queue_core.fleet import FleetBackend

CONTROL_HEADER = "X-Strictq-Control"  # on a poll answer: controls are pending, heartbeat now
FLEET_FACE = web.AppKey("strictq_fleet_face", FleetBackend)


def control_headers(request: web.Request, worker: str, declared: bool) -> dict[str, str]:
    """The poll answer's header: only for a poller that declared `control`, only when a control waits."""
    fleet = request.app.get(FLEET_FACE)
    if declared and fleet is not None and fleet.has_pending(worker):
        return {CONTROL_HEADER: "pending"}
    return {}
