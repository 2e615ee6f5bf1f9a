"""Failure management at a cluster's edge (docs/failure-management.md §3.2, docs/cluster.md).

- `ClusterHealthView`: failure management's port (queue_core.health_view) over the node holding the
  decider (cluster.decider_client, NATS request/reply), so the edge serves queue_core.health_http's admin
  routes and the dashboard's failure panel as in one process.
- `ProbeBridge` copies the decider's probes (`probe.*` keys of the control bucket with a worker) into this
  edge's control hub, so its egress proxies exempt them as in one process. Fences need no copy: the hub's
  registry is the control bucket's (cluster.control_fences).
- `AlertRelay` hands the alerts of this edge's wire log (`strictq errors`' rules) to the decider;
  `EdgeEvents` (cluster.edge_events) publishes the events decided here (the fleet's) to the events stream
  the decider follows, so every edge's status shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from access.tenancy import tenant_of
from cluster.control_keys import read_state
from cluster.decider_client import DeciderClient
from cluster.edge_events import EdgeEvents
from cluster.kv_mirror import KvMirror
from queue_core.admin_http import existing_queue
from queue_core.alert_records import ALERT_POLL, WireAlert, follow_alerts
from queue_core.backend import QueueBackend
from queue_core.control import ControlHub
from queue_core.health_view import Alert, ErrorCases, EventPage, scope_status
from queue_core.machine.health import Decision
from queue_core.scope import Scope

log = logging.getLogger("strictq.health")


# -------------------------------------------------------------------------------------------- port
class ClusterHealthView:
    """The decider's failure management for this edge's admin routes and dashboard: asked over NATS,
    parked groups counted over the partitions, queues looked up through the port, cut to the caller."""

    def __init__(self, client: DeciderClient, backend: QueueBackend) -> None:
        self.client = client
        self.backend = backend

    async def status(self, scope: Scope, latest: int) -> dict[str, Any]:
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

    async def events(self, since: int) -> EventPage:
        answer = await self.client.request("events", since=since)
        return EventPage(list(answer["events"]), int(answer["last"]))

    async def queue(self, scope: Scope, name: str, face: str) -> str:
        return await existing_queue(scope, self.backend, name, face)  # by name, not the whole list

    async def suspend(self, queue: str, reason: str) -> None:
        await self.client.request("suspend", queue=queue, reason=reason)

    async def resume(self, queue: str, reason: str) -> bool:
        answer = await self.client.request("resume", queue=queue, reason=reason)
        return bool(answer.get("ok"))

    async def lift_blacklist(self, worker: str) -> bool:
        answer = await self.client.request("unblacklist", worker=worker)
        return bool(answer.get("ok"))

    async def alert(self, scope: Scope, alert: Alert) -> list[str]:
        # A tenant's alert by signature reaches only its tenant's queues (an operator's: any queue).
        return await self._alert(alert, None if scope.operator else scope.sees_queue, scope.tenant)

    async def tenant_alert(self, alert: Alert, tenant: str | None) -> list[str]:
        """An alert of the wire log: one of `tenant` reaches only its queues (None: any queue)."""
        if tenant is None:
            return await self._alert(alert, None, None)
        return await self._alert(alert, lambda queue: tenant_of(queue) == tenant, tenant)

    async def _alert(
        self, alert: Alert, within: Callable[[str], bool] | None, tenant: str | None
    ) -> list[str]:
        queues = None if within is None else [q for q in await self.backend.list_queues() if within(q)]
        answer = await self.client.request(
            "alert",
            reason=alert.reason,
            queue=alert.queue,
            signatures=alert.signatures,
            queues=queues,
            tenant=tenant,
        )
        return [str(q) for q in answer.get("suspended", [])]

    async def record(self, event: str, reason: str, queue: str) -> None:
        # Answered once the decider published it to the events stream (cluster.decider, `record`).
        decision = Decision(event, reason, time.time(), queue=queue)
        await self.client.request("record", event=decision.to_event(), id=secrets.token_hex(12))

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        return None  # the decider's tally stays on its node; the index's error cases are shown instead


async def _stop(task: asyncio.Task[None] | None) -> None:
    """Cancel one of this module's follower tasks and wait for it to end."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


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
        await _stop(self._task)
        self._task = None

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


class AlertRelay:
    """This edge's wire-log alerts (`event: alert` records of `strictq errors`' rules in its data dir) to
    the decider, as one process's failure manager acts on its own (queue_core.alert_records)."""

    def __init__(self, wirelog: Path, window: float, poll: float = ALERT_POLL) -> None:
        self.wirelog = wirelog
        self.window = window  # alerts older than failure management's window were acted on before
        self.poll = poll
        self._task: asyncio.Task[None] | None = None

    async def start(self, view: ClusterHealthView) -> None:
        fresh_after = time.time() - self.window

        async def act(alert: WireAlert) -> None:
            queue = None
            if alert.queue is not None:
                found = {q for q in await view.backend.list_queues(alert.queue) if q == alert.queue}
                queue = alert.core_queue(found.__contains__)
            await view.tenant_alert(Alert(alert.reason, queue, alert.signatures), alert.tenant)

        follow = follow_alerts(self.wirelog, fresh_after, self.poll, act)
        self._task = asyncio.create_task(follow, name="strictq-alert-relay")

    async def close(self) -> None:
        await _stop(self._task)
        self._task = None


class EdgeHealth:
    """Failure management's part of a cluster edge: the decider's client, the probe bridge, the relay of
    this edge's wire-log alerts and its events (the fleet's) into the cluster's events stream."""

    def __init__(
        self, client: DeciderClient, bridge: ProbeBridge, events: EdgeEvents, alerts: AlertRelay
    ) -> None:
        self.client = client
        self.bridge = bridge
        self.events = events
        self.alerts = alerts
        self.backend: QueueBackend | None = None  # the edge's backend, set once it is made

    def view(self, backend: QueueBackend) -> ClusterHealthView:
        """The decider's state for this edge's dashboard (parked groups counted over `backend`)."""
        return ClusterHealthView(self.client, backend)

    async def start(self) -> None:
        """After the app started (the hub runs): follow the decider's probes and this edge's alerts."""
        await self.bridge.start()
        if self.backend is not None:
            await self.alerts.start(self.view(self.backend))

    async def close(self) -> None:
        await self.alerts.close()
        await self.bridge.close()
        await self.events.close()
