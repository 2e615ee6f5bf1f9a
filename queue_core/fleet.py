"""The worker fleet's shell: the registry and control messages (queue_core.machine.fleet) in the process
holding the core, with the clock, the store and the events (docs/fleet.md).

- Heartbeats (the gateway's `POST /fleet/v1/heartbeat`, gateway.fleet_face) and operators' controls
  (`POST /admin/v1/fleet/control`, queue_core.fleet_http) go through `Fleet` at `now`; what it decides to
  keep (pending controls, rebalancing policies) commits through the core's group commit
  (`QueueService.persist`) before the answer, so an issued control survives a restart until acknowledged
  or expired.
- Its events (control-applied / -refused / -failed / -expired, sleep, wake) are failure management's
  events: `strictq status` shows them and they are written to the wire log as `event` records (writer
  `core`), through `FailureManager.record`. Without failure management (`--no-health`) they are logged.
- A tick (`tick` seconds) runs each queue's rebalancing policy against its backlog and expires controls.

`version_of(worker)` and `workers()` are the registry's view for others (group routing by version,
rollouts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

from .backend import QueueBackend
from .machine.errors import LimitExceeded
from .machine.fleet import Answer, Control, Fleet, FleetEvent, FleetSettings, Heartbeat, WorkerEntry
from .machine.handover import MAX_GROUPS_PER_CALL
from .machine.rebalance import RebalancePolicy
from .service import QueueService

if TYPE_CHECKING:
    from .failures import FailureManager

log = logging.getLogger("strictq.fleet")
TICK = 0.5  # seconds between rebalancing passes and expiry sweeps


class FleetBackend(Protocol):
    """What the gateway's heartbeat route needs: this process's `FleetService`, `RemoteFleet` in front
    of a `strictq queue-server` (queue_core.fleet_remote), or a cluster's `ClusterFleet` (cluster.fleet_kv).
    `admin()`: the registry's admin side where this edge serves the fleet's admin routes, else None."""

    async def heartbeat(self, beat: Heartbeat) -> Answer: ...
    def has_pending(self, worker: str) -> bool: ...
    def admin(self) -> FleetAdmin | None: ...


class FleetAdmin(Protocol):
    """What the fleet's admin routes (queue_core.fleet_http) need, whatever holds the registry: the core's
    process (FleetService) or a cluster's KV bucket (cluster.fleet_kv.ClusterFleet). Queue names are the
    core's; `backend` is the port the routes look queues up through."""

    @property
    def settings(self) -> FleetSettings: ...
    @property
    def backend(self) -> QueueBackend: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def heartbeat(self, beat: Heartbeat) -> Answer: ...
    async def registry(self) -> tuple[list[dict[str, Any]], dict[str, RebalancePolicy]]: ...
    async def live_targets(self, queue: str, version: str | None) -> list[str]: ...
    async def issue(
        self,
        kind: str,
        args: dict[str, Any] | None,
        workers: list[str],
        *,
        ttl: float | None = None,
        queue: str | None = None,
    ) -> list[Control]: ...
    async def set_policy(self, queue: str, policy: RebalancePolicy | None) -> None: ...


class FleetService:
    """Start after the service (and failure management, whose events it publishes); close before them."""

    def __init__(
        self,
        service: QueueService,
        failures: FailureManager | None = None,
        settings: FleetSettings | None = None,
        *,
        tick: float = TICK,
    ) -> None:
        self.service = service
        self.failures = failures
        self.settings = (settings or FleetSettings()).validate()
        self.tick = tick
        self.fleet = Fleet(self.settings)
        self._task: asyncio.Task[None] | None = None

    @property
    def backend(self) -> QueueBackend:
        return self.service

    def admin(self) -> FleetAdmin:
        return self

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Restore the pending controls and policies the store kept; start the rebalancing tick."""
        self.fleet = Fleet(self.settings, id_prefix=f"{self.service.core.epoch}-")
        saved = self.service.saved_control
        self.fleet.restore(saved.fleet_controls.values(), saved.fleet_policies)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="strictq-fleet")
        log.info(
            "fleet: %d pending control(s), %d rebalancing policies",
            len(self.fleet.controls),
            len(self.fleet.policies),
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --------------------------------------------------------------------------------------- inputs
    async def heartbeat(self, beat: Heartbeat) -> Answer:
        answer = self.fleet.heartbeat(beat, self.service.clock())
        for queue in beat.queues:  # the load just changed: look at once rather than at the next tick
            await self._rebalance(queue)
        await self._commit()
        return answer

    async def issue(
        self,
        kind: str,
        args: dict[str, Any] | None,
        workers: list[str],
        *,
        ttl: float | None = None,
        queue: str | None = None,
    ) -> list[Control]:
        """An operator's control for each of `workers` (InvalidArgument naming the field); durable on
        return."""
        if kind == "drain":  # before the worker can hear of it: its uploads must find the groups moving
            await self._hand_over_state(workers, queue)
        issued = self.fleet.issue(kind, args, workers, self.service.clock(), ttl=ttl, queue=queue)
        await self._commit()
        return issued

    async def _hand_over_state(self, workers: list[str], only: str | None) -> None:
        """A drained worker's groups go on elsewhere with their local state (state transfer): each group
        whose state it holds is handed over (it exports the state on its next polls while it drains)."""
        core = self.service.core
        for name, queue in list(core.queues.items()):
            if only is not None and name != only:
                continue
            for worker in workers:
                groups = [g for g, holder in queue.state_holders.items() if holder == worker]
                for start in range(0, len(groups), MAX_GROUPS_PER_CALL):
                    try:
                        await self.service.hand_over(
                            name, groups[start : start + MAX_GROUPS_PER_CALL], worker
                        )
                    except LimitExceeded:  # the rest moves without its state
                        log.warning("drain of %s: too many groups in handover on %s", worker, name)
                        break

    async def set_policy(self, queue: str, policy: RebalancePolicy | None) -> None:
        self.fleet.set_policy(queue, policy)
        await self._commit()

    # ---------------------------------------------------------------------------------------- views
    def version_of(self, worker: str) -> str | None:
        """The software version `worker` runs, as its latest heartbeat said (None: never heard of)."""
        return self.fleet.version_of(worker)

    def workers(self) -> list[WorkerEntry]:
        """The live workers (not stale), for routing and rollouts."""
        return self.fleet.live(self.service.clock())

    def has_pending(self, worker: str) -> bool:
        return self.fleet.has_pending(worker, self.service.clock())

    def targets(self, queue: str, version: str | None) -> list[str]:
        return self.fleet.targets(queue, version, self.service.clock())

    def view(self) -> list[dict[str, Any]]:
        return self.fleet.view(self.service.clock())

    async def registry(self) -> tuple[list[dict[str, Any]], dict[str, RebalancePolicy]]:
        """Every known worker with its pending controls (Fleet.view), and the queues' policies."""
        return self.view(), dict(self.fleet.policies)

    async def live_targets(self, queue: str, version: str | None) -> list[str]:
        return self.targets(queue, version)

    # ------------------------------------------------------------------------------------- plumbing
    async def _rebalance(self, queue: str) -> None:
        if queue not in self.fleet.policies or queue not in self.service.core.queues:
            return
        metrics = await self.service.metrics(queue)
        self.fleet.rebalance(queue, metrics.visible, metrics.oldest_age, self.service.clock())

    async def _commit(self) -> None:
        effects, events = self.fleet.drain()
        if effects:
            await asyncio.shield(self.service.persist(effects))
        for event in events:
            self._publish(event)

    def _publish(self, event: FleetEvent) -> None:
        if self.failures is not None:
            self.failures.record(
                event.event, event.reason, at=event.at, worker=event.worker, queue=event.queue
            )
        else:
            log.info("%s worker=%s queue=%s: %s", event.event, event.worker, event.queue, event.reason)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            try:
                self.fleet.expire(self.service.clock())
                for queue in list(self.fleet.policies):
                    await self._rebalance(queue)
                await self._commit()
            except Exception:  # a failed commit is the store's to report; the tick goes on
                log.exception("fleet tick failed")
