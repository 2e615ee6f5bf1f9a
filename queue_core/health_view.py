"""Failure management's port: what its admin routes and the operator's dashboard need, wherever it runs.

Why a port of its own: failure management runs beside the core in one process, inside the queue server
behind `--queue-server`, and as a cluster's decider on one queue server. The admin routes
(queue_core.health_http: status, events, suspend, resume, unblacklist, alerts) and the dashboard's
failure panel depend on `HealthView` only, so they are written once and mounted at every topology's edge:

- `LocalHealthView`: the FailureManager beside the core, in this process;
- `RemoteHealthView`: the queue server's, over its internal admin routes (queue_core.admin_internal);
- `ClusterHealthView` (strictq.cluster_health): the decider's, over NATS request/reply.

Every operation takes and answers core queue names; the caller's scope (queue_core.scope) is applied with
the one set of rules here (`scope_status`, `scoped_events`), so every topology answers alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from access.tenancy import tenant_of

from . import operations as ops
from .admin_http import existing_queue
from .failures import FailureManager
from .remote import RemoteQueueService
from .scope import Scope


@dataclass(frozen=True, slots=True)
class ErrorCases:
    """Failed attempts still in failure management's window (`window` seconds), by signature: count,
    workers, queues, the latest reason and time (HealthMonitor.failure_signatures' rows)."""

    window: float
    cases: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class EventPage:
    """Failure management's events numbered after the `since` asked for (every tenant's, each with its
    number `n`), and the number of the latest event."""

    events: list[dict[str, Any]]
    last: int


@dataclass(frozen=True, slots=True)
class Alert:
    """A checked known-error-case alert: its reason, the core queue it names (or None) and the
    signatures (exact or glob) whose queues it suspends."""

    reason: str
    queue: str | None
    signatures: list[str]


class HealthView(Protocol):
    """Failure management's operations, by core names; `scope` where the answer or the reach depends on
    the caller (a tenant's alert by signature suspends only its own queues)."""

    async def status(self, scope: Scope, latest: int) -> dict[str, Any]:
        """The document of `GET /admin/v1/status`, cut to `scope`, with its `latest` events."""
        ...

    async def events(self, since: int) -> EventPage:
        """Every event after `since` (the caller scopes them)."""
        ...

    async def queue(self, scope: Scope, name: str, face: str) -> str:
        """The core's name of the existing queue `name` the caller names; QueueNotFound (404) else."""
        ...

    async def suspend(self, queue: str, reason: str) -> None:
        """Suspend `queue`, in force (stored) when this returns."""
        ...

    async def resume(self, queue: str, reason: str) -> bool:
        """Resume `queue`; False when it was not suspended."""
        ...

    async def lift_blacklist(self, worker: str) -> bool:
        """Lift `worker`'s blacklist (it is probed again); False when it was not blacklisted."""
        ...

    async def alert(self, scope: Scope, alert: Alert) -> list[str]:
        """Raise `alert` within `scope`'s queues; the core queues it suspended."""
        ...

    async def record(self, event: str, reason: str, queue: str) -> None:
        """A step decided at the edge (a rollout's, `rollout-*`: queue_core.routing_http) into failure
        management's events beside its own decisions, durable when this returns."""
        ...

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        """None where failure management keeps no such tally for this caller to read."""
        ...


# ------------------------------------------------------------------------------------------- scoping
def scoped_events(scope: Scope, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failure-management events `scope` sees, renamed as it names queues."""
    return [e for e in (scope.event(event) for event in events) if e is not None]


def scope_status(
    view: dict[str, Any],
    events: list[dict[str, Any]],
    probes: list[dict[str, str | None]],
    scope: Scope,
    latest: int = 20,
) -> dict[str, Any]:
    """The status document `view` (FailureManager.status, every tenant's) cut to `scope`, with the tenant's
    own latest events and counts out of `events` (all of them) and its probes out of `probes`: the one
    rule, wherever the manager runs."""
    if scope.operator:
        return view
    view["workers"] = [w for w in view["workers"] if scope.sees_worker(w["worker"])]
    view["operator_fences"] = [f for f in view["operator_fences"] if scope.sees_worker(f["worker"])]
    queues = []
    for queue in view["queues"]:
        name = scope.queue_name(queue["queue"])
        if name is not None:
            queues.append({**queue, "queue": name})
    view["queues"] = queues
    for worker in view["workers"]:
        worker["queue"] = scope.queue_name(worker["queue"]) if worker["queue"] else None
    # The tenant's own events, counts and probes only: the server-wide ones tell of other tenants.
    mine = scoped_events(scope, events)
    view["events"] = mine[-latest:] if latest > 0 else []
    view["counts"] = dict(Counter(e["event"] for e in mine))
    view["probes"] = sum(
        1
        for probe in probes
        if isinstance(queue := probe.get("queue"), str)
        and scope.sees_queue(queue)
        and ((worker := probe.get("worker")) is None or scope.sees_worker(worker))
    )
    return view


def probe_owners(manager: FailureManager) -> list[dict[str, str | None]]:
    """The queue and worker of every probe out (what a scope counts its own probes by)."""
    return [{"queue": probe.queue, "worker": probe.worker} for probe in manager.monitor.probes.values()]


def tenant_reach(tenant: str | None, prefixes: list[str] | None, queue: str) -> bool:
    """Whether a tenant's alert (`tenant`; its credential's queue `prefixes`, None: all of them) reaches
    the core queue `queue`: Scope.sees_queue's rule, for a caller known by its tenant and prefixes."""
    if tenant_of(queue) != tenant:
        return False
    return prefixes is None or any(queue.partition(".")[2].startswith(p) for p in prefixes)


# ------------------------------------------------------------------------------------------ in process
class LocalHealthView:
    """Failure management beside the core, in this process."""

    def __init__(self, manager: FailureManager) -> None:
        self.manager = manager

    async def status(self, scope: Scope, latest: int) -> dict[str, Any]:
        manager = self.manager
        view = manager.status(latest=latest)
        return scope_status(view, manager.events(), probe_owners(manager), scope, latest)

    async def events(self, since: int) -> EventPage:
        return EventPage(self.manager.events(since), self.manager.last_event)

    async def queue(self, scope: Scope, name: str, face: str) -> str:
        return scope.internal_queue(name, self.manager.service.core.queues, face)

    async def suspend(self, queue: str, reason: str) -> None:
        self.manager.suspend(queue, reason)
        await self.manager.settled()  # in the store before the answer

    async def resume(self, queue: str, reason: str) -> bool:
        resumed = self.manager.resume(queue, reason)
        await self.manager.settled()
        return resumed

    async def lift_blacklist(self, worker: str) -> bool:
        lifted = self.manager.lift_blacklist(worker, "operator")
        await self.manager.settled()
        return lifted

    async def alert(self, scope: Scope, alert: Alert) -> list[str]:
        # A tenant's alert by signature suspends only the tenant's queues (an operator's: any tenant's).
        return await self.alert_within(alert, None if scope.operator else scope.sees_queue, scope.tenant)

    async def alert_within(
        self, alert: Alert, within: Callable[[str], bool] | None, tenant: str | None
    ) -> list[str]:
        """`alert` reaching the queues `within` accepts (None: any), its events carrying `tenant`: a
        caller known by its tenant rather than its scope (the queue server's internal route)."""
        suspended = self.manager.alert(
            alert.reason, queue=alert.queue, signatures=alert.signatures, within=within, tenant=tenant
        )
        await self.manager.settled()
        return suspended

    async def record(self, event: str, reason: str, queue: str) -> None:
        self.manager.record(event, reason, queue=queue)
        await self.manager.settled()

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        within = None if scope.operator else scope.sees_queue
        found = self.manager.monitor.failure_signatures(now, within)
        return ErrorCases(self.manager.settings.window, found)


# -------------------------------------------------------------------------------------- queue server
class RemoteHealthView:
    """Failure management in the queue server behind this gateway (`--queue-server`): its internal admin
    routes (queue_core.admin_internal) by core names, through the gateway's one client; the queue server
    unreachable is 503 `unavailable`, its 4xx passed on with its status and body."""

    def __init__(self, remote: RemoteQueueService) -> None:
        self.remote = remote

    async def status(self, scope: Scope, latest: int) -> dict[str, Any]:
        state = await self.remote.call(ops.FAILURES.bind(latest))
        return scope_status(state["view"], state["events"], state["probes"], scope, latest)

    async def events(self, since: int) -> EventPage:
        state = await self.remote.call(ops.FAILURES.bind(0, since))
        return EventPage(list(state["events"]), int(state["last"]))

    async def queue(self, scope: Scope, name: str, face: str) -> str:
        return await existing_queue(scope, self.remote, name, face)

    async def suspend(self, queue: str, reason: str) -> None:
        await self.remote.call(ops.SUSPEND.bind(queue, reason))

    async def resume(self, queue: str, reason: str) -> bool:
        answer = await self.remote.call(ops.RESUME.bind(queue, reason))
        return answer.get("resumed") is True

    async def lift_blacklist(self, worker: str) -> bool:
        answer = await self.remote.call(ops.UNBLACKLIST.bind(worker))
        return answer.get("lifted") is True

    async def alert(self, scope: Scope, alert: Alert) -> list[str]:
        # A tenant's alert by signature suspends only the tenant's queues within its prefixes.
        body = {
            "reason": alert.reason,
            "queue": alert.queue,
            "signatures": alert.signatures,
            "tenant": scope.tenant,
            "prefixes": None if scope.operator else list(scope.credential.prefixes),
        }
        answer = await self.remote.call(ops.ALERT.bind(body))
        return [str(q) for q in answer["suspended"]]

    async def record(self, event: str, reason: str, queue: str) -> None:
        await self.remote.call(ops.RECORD_EVENT.bind(event, reason, queue))

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        return None  # the queue server's tally stays there; the index's error cases are shown instead
