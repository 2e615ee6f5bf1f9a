"""The worker fleet of a `strictq queue-server` behind a gateway (`strictq serve --queue-server URL`): the
registry lives beside the core in the queue server; the gateway forwards each heartbeat to it and serves
the fleet's admin routes (queue_core.fleet_http, the same handlers as in one process and in a cluster)
over `RemoteFleetAdmin`, which asks the queue server's internal admin operations (queue_core.operations,
served by queue_core.admin_internal) by core names.

Prompt delivery (`X-Strictq-Control: pending` on poll answers) needs the registry in the gateway's
process: here `has_pending` is always False, and workers get their controls at their next heartbeat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import operations as ops
from .machine.fleet import Answer, Control, FleetSettings, Heartbeat, heartbeat_to_json
from .machine.rebalance import RebalancePolicy
from .remote import RemoteQueueService

if TYPE_CHECKING:
    from .backend import QueueBackend
    from .fleet import FleetAdmin


class RemoteFleet:
    def __init__(self, remote: RemoteQueueService) -> None:
        self.remote = remote
        self._admin = RemoteFleetAdmin(remote)

    async def heartbeat(self, beat: Heartbeat) -> Answer:
        return await self._admin.heartbeat(beat)

    def has_pending(self, worker: str) -> bool:
        return False

    def admin(self) -> FleetAdmin | None:
        return self._admin


class RemoteFleetAdmin:
    """`FleetAdmin` over the queue server's registry. Its settings are the queue server's, as its last
    registry answer gave them (the defaults until then: the routes read them after `registry`). The queue
    server unreachable: 503 `unavailable`; its 4xx passed on with its status and body."""

    def __init__(self, remote: RemoteQueueService) -> None:
        self.remote = remote
        self._settings = FleetSettings()

    @property
    def settings(self) -> FleetSettings:
        return self._settings

    @property
    def backend(self) -> QueueBackend:
        return self.remote

    async def start(self) -> None:
        """Nothing to start: the registry and its timers run in the queue server."""

    async def close(self) -> None:
        """Nothing to close: the remote client is the gateway's."""

    async def heartbeat(self, beat: Heartbeat) -> Answer:
        return Answer.from_wire(await self.remote.fleet_heartbeat(heartbeat_to_json(beat)))

    async def registry(self) -> tuple[list[dict[str, Any]], dict[str, RebalancePolicy]]:
        document = await self.remote.call(ops.FLEET.bind())
        known = FleetSettings.__slots__  # a queue server of another version may name more or fewer
        self._settings = FleetSettings(**{k: v for k, v in document["settings"].items() if k in known})
        policies = {queue: RebalancePolicy.from_dict(p) for queue, p in document["policies"].items()}
        return list(document["workers"]), policies

    async def live_targets(self, queue: str, version: str | None) -> list[str]:
        answer = await self.remote.call(ops.FLEET_TARGETS.bind(queue, version))
        return [str(worker) for worker in answer["workers"]]

    async def issue(
        self,
        kind: str,
        args: dict[str, Any] | None,
        workers: list[str],
        *,
        ttl: float | None = None,
        queue: str | None = None,
    ) -> list[Control]:
        # Checked (kind, args, ttl) by the queue server's registry, in one place (machine.fleet).
        answer = await self.remote.call(ops.FLEET_CONTROL.bind(kind, args, workers, ttl, queue))
        issued = []
        for row in answer["controls"]:
            control = Control.from_row(row)
            control.delivered = int(row.get("delivered") or 0)
            issued.append(control)
        return issued

    async def set_policy(self, queue: str, policy: RebalancePolicy | None) -> None:
        if policy is None:
            await self.remote.call(ops.DELETE_FLEET_POLICY.bind(queue))
        else:
            await self.remote.call(ops.PUT_FLEET_POLICY.bind(queue, policy.to_dict()))
