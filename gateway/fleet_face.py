"""The worker side of the fleet (docs/fleet.md): `POST /fleet/v1/heartbeat` beside the EmoDB face, and the
poll answer's `X-Strictq-Control: pending` for pollers that declare the `control` capability.

Opt-in: a plain EmoDB client never calls the route and never declares `control`, so it sees nothing new.
Authentication and errors are the EmoDB face's (`X-BV-API-Key`; `{"error": {...}}` with the status each
error carries, 400 naming the field for bad input); the worker is the key's id, as for polls. Queue names
are the EmoDB queue face's (`orders`, inside the key's tenant and prefixes; another's is 404). The
registry lives where the core runs (queue_core.fleet); this module only parses and answers.
"""

from __future__ import annotations

from aiohttp import web

from access.permissions import allowed, require
from queue_core.fleet import FleetBackend
from queue_core.http_errors import client_gone, json_response
from queue_core.machine.fleet import heartbeat_from_json

from .emodb import QUEUE_FACE, authenticate, error_response, read_json
from .fleet_control import FLEET_FACE

HEARTBEAT_PATH = "/fleet/v1/heartbeat"


async def heartbeat(request: web.Request) -> web.StreamResponse:
    try:
        credential = authenticate(request)
        require(credential, allowed(credential, "consume"), "send heartbeats")
        data = await read_json(request)
        beat = heartbeat_from_json(credential.id, data, lambda name: QUEUE_FACE.internal(credential, name))
        answer = await request.app[FLEET_FACE].heartbeat(beat)
        return json_response(answer.to_wire())
    except Exception as exc:
        if client_gone(request, exc):
            raise
        return error_response(exc, request)


def add_heartbeat_route(app: web.Application, fleet: FleetBackend) -> None:
    app[FLEET_FACE] = fleet
    app.router.add_post(HEARTBEAT_PATH, heartbeat)
