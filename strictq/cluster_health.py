"""Failure management at a cluster's edge (docs/failure-management.md §3.2, docs/cluster.md).

- `ClusterHealthView`: failure management's port (queue_core.health_view) over the node holding the
  decider (cluster.decider_client, NATS request/reply), so the edge serves queue_core.health_http's admin
  routes and the dashboard's failure panel as in one process.
- `ProbeBridge` copies the decider's probes (`probe.*` keys of the control bucket with a worker) into this
  edge's control hub, so its egress proxies exempt them as in one process. Fences need no copy: the hub's
  registry is the control bucket's (cluster.control_fences).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from cluster.control_keys import read_state
from cluster.decider_client import DeciderClient
from cluster.kv_mirror import KvMirror
from queue_core.admin_http import existing_queue
from queue_core.backend import QueueBackend
from queue_core.control import ControlHub
from queue_core.health_view import Alert, ErrorCases, EventPage, scope_status
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
        within = None
        if not scope.operator:  # a tenant's alert by signature reaches only its tenant's queues
            within = [q for q in await self.backend.list_queues() if scope.sees_queue(q)]
        answer = await self.client.request(
            "alert", reason=alert.reason, queue=alert.queue, signatures=alert.signatures, queues=within
        )
        return [str(q) for q in answer.get("suspended", [])]

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        return None  # the decider's tally stays on its node; the index's error cases are shown instead


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
