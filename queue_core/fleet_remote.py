"""The worker fleet of a `strictq queue-server` behind a gateway (`strictq serve --queue-server URL`): the
gateway's heartbeat route forwards each heartbeat to the queue server's internal API
(`POST /v1/fleet/heartbeat`, queue_core.fleet_http), where the registry lives beside the core.

Prompt delivery (`X-Strictq-Control: pending` on poll answers) needs the registry in the gateway's
process: here `has_pending` is always False, and workers get their controls at their next heartbeat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .machine.fleet import Answer, Heartbeat, heartbeat_to_json
from .remote import RemoteQueueService

if TYPE_CHECKING:
    from .fleet import FleetAdmin


class RemoteFleet:
    def __init__(self, remote: RemoteQueueService) -> None:
        self.remote = remote

    async def heartbeat(self, beat: Heartbeat) -> Answer:
        return Answer.from_wire(await self.remote.fleet_heartbeat(heartbeat_to_json(beat)))

    def has_pending(self, worker: str) -> bool:
        return False

    def admin(self) -> FleetAdmin | None:
        """The admin routes are the queue server's, where the registry lives."""
        return None
