"""Failure management's shell: carries out what the supervisor decides, publishes it as events.

The decisions are made in the pure core (`queue_core.machine.supervisor.Supervisor`, which owns the queue
core and the `HealthMonitor`): polls, results and timers go through it in `QueueService`. This shell gives
it its monitor, hears the typed effects of every step (`QueueService.failure_listeners`) and carries
them out:

- fence / unfence: through the `ControlHub` (durable in the store, on the control stream; reason prefixed
  `health:`); the fenced worker's claims and same-worker retries were freed in the deciding step;
- a probe is announced on the control stream (`probe` / `probe_end`) so the proxy serves its calls by
  mimicry, or passes them for a `probe_safe` queue, even while the worker is fenced;
- suspensions and blacklists are rows of the store (written in the deciding step's commit);
- every decision is an event: logged, counted, kept in a bounded ring (`events()`, `status()`) and
  written to the wire log (kind `event`, writer `core`).

Its inputs besides: alerts (the `event: alert` records `strictq errors` writes to the wire log, or `POST
/admin/v1/alerts`) and operator commands. Only fences this manager set are lifted by it: an operator's
`strictq fence` keeps its meaning (the proxy isolates the worker, which still gets messages: mimicry
testing needs them), and an operator's `strictq unfence` of a worker the monitor fenced restores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from access.tenancy import split, tenant_of
from wirelog.files import StartupError

from .alert_records import ALERT_POLL, WireAlert, follow_alerts
from .control import ControlHub
from .fences import MAX_REASON, MIGRATED_SUFFIX, Fence, FenceMode, NotFenced
from .machine import QueueNotFound
from .machine.effects import GroupEvent, SuspensionSaved
from .machine.health import Decision, HealthMonitor, HealthSettings, Probe
from .machine.supervisor import (
    FenceRequested,
    HealthEffect,
    ProbeDelivered,
    ProbeEnded,
    ProbeIssued,
    QueueResumed,
    UnfenceRequested,
    WorkerBlacklisted,
)
from .service import FailureEffect, QueueService

log = logging.getLogger("strictq.health")
REASON_PREFIX = "health: "
EVENT_RING = 1000
TICK = 0.25  # seconds between flushes of the event writer
DRAIN_TIMEOUT = 5.0  # seconds close() waits for queued fence changes
# Decisions that are events (the rest only drive the control stream).
QUIET = frozenset({"probe-cancelled"})
Action = Callable[[], Awaitable[None]]
T = TypeVar("T")


class FailureManager:
    """The shell of failure management: owns the health monitor's settings, the event ring and writer;
    start after the hub. The decisions themselves are the supervisor's (queue_core.machine.supervisor)."""

    def __init__(
        self,
        service: QueueService,
        hub: ControlHub,
        settings: HealthSettings | None = None,
        *,
        wirelog: Path | None = None,
        ring: int = EVENT_RING,
        alert_poll: float = ALERT_POLL,
    ) -> None:
        self.service = service
        self.hub = hub
        self.settings = (settings or HealthSettings()).validate()
        self.wirelog = wirelog
        self.alert_poll = alert_poll
        self.counts: Counter[str] = Counter()
        self._ring: deque[dict[str, Any]] = deque(maxlen=ring)
        self._n = 0
        self._fences: dict[str, Fence] = {}  # the hub fences this manager set, by worker
        self._changing: set[str] = set()  # workers whose fence this manager is changing right now
        self._announced: set[str] = set()  # probe ids on the control stream
        self._actions: asyncio.Queue[Action] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._writer: Any = None  # wirelog.writer.WireLogWriter, imported lazily
        self._tenant: str | None = None  # the tenant whose request is being decided (its events carry it)
        self._idle_monitor = HealthMonitor(self.settings)  # what `monitor` shows while not started
        # A suspended.json left by an earlier version beside the legacy fences.json: migrated at start.
        self.suspensions_path = hub.registry.path.with_name("suspended.json")
        self._started = False

    @property
    def monitor(self) -> HealthMonitor:
        """The supervisor's health monitor (a fresh one before `start`)."""
        monitor = self.service.supervisor.monitor
        return monitor if monitor is not None else self._idle_monitor

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Give the supervisor its monitor, adopt the fences an earlier run set, restore the suspensions
        and blacklists the store kept (migrating a legacy suspended.json), start the tasks."""
        service = self.service
        supervisor = service.supervisor
        supervisor.monitor = HealthMonitor(self.settings, probe_prefix=f"{service.core.epoch}-")
        if self.wirelog is not None:
            from wirelog.writer import WireLogWriter

            self._writer = await asyncio.to_thread(WireLogWriter, self.wirelog, "core")
        service.failure_listeners.append(self._on_effect)
        self.hub.event_listeners.append(self._on_hub_event)
        self._started = True
        monitor, now = supervisor.monitor, service.clock()
        for fence in self.hub.fences():
            if fence.reason.startswith(REASON_PREFIX):
                self._fences[fence.worker] = fence
                monitor.adopt_fence(fence.worker, fence.reason[len(REASON_PREFIX) :], fence.since, now)
        await self._migrate_suspensions()
        service.supervise(supervisor.restore, service.saved_control)
        await service.settled()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run_actions(), name="strictq-health-actions"))
        if self._writer is not None:
            self._tasks.append(loop.create_task(self._tick(), name="strictq-health-events"))
        if self.wirelog is not None and self.alert_poll > 0:
            self._tasks.append(loop.create_task(self._follow_alerts(), name="strictq-health-alerts"))
        log.info("failure management on: %s", self.settings.to_dict())

    async def _migrate_suspensions(self) -> None:
        """suspended.json of an earlier version: read once (SuspensionFileError if damaged), written to the
        store, renamed `*.migrated`; the store's own rows win."""
        path = self.suspensions_path
        if not await asyncio.to_thread(path.exists):
            return
        legacy = await asyncio.to_thread(read_suspensions, path)
        saved = self.service.saved_control.suspensions
        fresh = {q: s for q, s in legacy.items() if q not in saved}
        now = self.service.clock()
        if fresh:
            rows = {q: {"reason": s["reason"], "manual": s["manual"], "since": now} for q, s in fresh.items()}
            await self.service.persist([SuspensionSaved(q, state) for q, state in sorted(rows.items())])
            saved.update(rows)
        target = path.with_name(path.name + MIGRATED_SUFFIX)
        await asyncio.to_thread(os.replace, path, target)
        log.info("migrated %d suspension(s) from %s to the store (renamed %s)", len(fresh), path, target)

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._on_effect in self.service.failure_listeners:
            self.service.failure_listeners.remove(self._on_effect)
        self.service.supervisor.monitor = None
        if self._on_hub_event in self.hub.event_listeners:
            self.hub.event_listeners.remove(self._on_hub_event)
        await self._drain_actions()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
            self._writer = None

    async def _drain_actions(self) -> None:
        """Let queued fence changes finish (bounded): they may be half on disk already."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT):
                await self._actions.join()

    async def settled(self) -> None:
        """What was decided so far is durable (an admin route answers after this)."""
        await self.service.settled()

    # --------------------------------------------------------------------------------------- inputs
    def _on_effect(self, effect: FailureEffect) -> None:
        """Called by the service as it submits a step's effects (no core operation may run from here):
        a retry-workflow event (park, release, dead_letter, redrive) to publish, or a decision of the
        supervisor to carry out and publish."""
        if isinstance(effect, GroupEvent):
            self._publish(
                Decision(effect.event, effect.reason, effect.at, queue=effect.queue, group=effect.group)
            )
        elif isinstance(effect, ProbeDelivered):
            self._announce(effect.probe)  # a queue probe learns its worker only now
        elif isinstance(effect, HealthEffect):
            self._carry_out(effect)
            if effect.decision.event not in QUIET:
                self._publish(effect.decision, self._tenant)

    def _decide(self, operation: Callable[..., T], *args: Any, tenant: str | None = None, **kwargs: Any) -> T:
        """One input of the supervisor at `now`; `tenant`: whose request it is (its events carry it)."""
        self._tenant = tenant
        try:
            return self.service.supervise(operation, *args, **kwargs)
        finally:
            self._tenant = None

    def alert(
        self,
        reason: str,
        *,
        queue: str | None = None,
        signatures: Iterable[str] = (),
        within: Callable[[str], bool] | None = None,
        tenant: str | None = None,
    ) -> list[str]:
        """A known-error-case alert; returns the queues it suspended. A tenant's alert (`tenant`) reaches
        only the queues `within` accepts, and its events carry the tenant (so only it sees them)."""
        supervisor = self.service.supervisor
        return self._decide(
            supervisor.alert, reason, queue=queue, signatures=signatures, within=within, tenant=tenant
        )

    def suspend(self, queue: str, reason: str) -> None:
        self._known_queue(queue)
        self._decide(self.service.supervisor.suspend, queue, reason)

    def resume(self, queue: str, reason: str) -> bool:
        return self._decide(self.service.supervisor.resume, queue, reason)

    def lift_blacklist(self, worker: str, reason: str) -> bool:
        return self._decide(self.service.supervisor.lift_blacklist, worker, reason)

    def record(self, event: str, reason: str, **fields: Any) -> None:
        """Publish an event decided elsewhere (the retry workflow's park, release, redrive)."""
        at = fields.pop("at", None) or self.service.clock()
        self._publish(Decision(event, reason, at, **fields))

    def _known_queue(self, queue: str) -> None:
        if queue not in self.service.core.queues:
            raise QueueNotFound(f"queue {queue!r} does not exist", queue=queue)

    def _on_hub_event(self, event: str, data: dict[str, Any]) -> None:
        """Fence changes this manager did not make: an operator's fence replacing ours is theirs to lift;
        an unfence (`strictq unfence`, expiry) of a worker the monitor holds restores it."""
        worker = data.get("worker")
        if not isinstance(worker, str) or worker in self._changing:
            return
        if event == "fence":
            self._fences.pop(worker, None)
        elif event == "unfence":
            self._fences.pop(worker, None)
            if self.monitor.blocked(worker):
                why = data.get("reason") or "operator"
                self._decide(self.service.supervisor.unfence, worker, f"fence lifted ({why})")

    # ------------------------------------------------------------------------------------ decisions
    def _carry_out(self, effect: HealthEffect) -> None:
        reason = effect.decision.reason
        if isinstance(effect, FenceRequested):
            worker, mode = effect.worker, effect.mode or self.settings.fence_mode
            self._act(lambda: self._fence(worker, mode, reason))
            self.service.wake()  # its released groups and freed retries are anyone's now
        elif isinstance(effect, UnfenceRequested):
            worker = effect.worker
            self._act(lambda: self._unfence(worker, reason))
            self.service.wake()
        elif isinstance(effect, WorkerBlacklisted):
            worker, until = effect.worker, _iso(effect.until)
            self._act(lambda: self._refence(worker, f"blacklisted until {until}: {reason}"))
        elif isinstance(effect, ProbeIssued):
            probe = effect.probe
            if probe.worker is not None and probe.queue:
                self._announce(probe)
            self.service.wake(probe.queue or None)
        elif isinstance(effect, ProbeEnded):
            self._announced.discard(effect.probe_id)
            self.hub.probe_end(effect.probe_id)
        elif isinstance(effect, QueueResumed):
            self.service.wake(effect.queue)

    def _announce(self, probe: Probe) -> None:
        """Tell the proxies before the worker can make a call for it (the stream event goes out now)."""
        if probe.worker is None or probe.id in self._announced:
            return
        self._announced.add(probe.id)
        self.hub.probe(probe.worker, probe.id, "pass" if self._probe_safe(probe.queue) else "mimic")

    def _act(self, action: Action) -> None:
        """Fence changes run one at a time, in decision order (a fence is on disk before its unfence)."""
        self._actions.put_nowait(action)

    async def _run_actions(self) -> None:
        while True:
            action = await self._actions.get()
            try:
                await action()
            except Exception:
                log.exception("failure management: an action failed")
            finally:
                self._actions.task_done()

    async def _fence(self, worker: str, mode: str, reason: str) -> None:
        current = self.hub.registry.get(worker)
        if current is None or self._fences.get(worker) == current:  # never replace an operator's fence
            self._changing.add(worker)
            try:
                fence_mode: FenceMode = "mimic" if mode == "mimic" else "block"
                self._fences[worker] = await self.hub.fence(worker, fence_mode, _reason(reason))
            finally:
                self._changing.discard(worker)

    async def _refence(self, worker: str, reason: str) -> None:
        ours = self._fences.get(worker)
        if ours is not None and self.hub.registry.get(worker) == ours:
            self._changing.add(worker)
            try:
                self._fences[worker] = await self.hub.fence(worker, ours.mode, _reason(reason))
            finally:
                self._changing.discard(worker)

    async def _unfence(self, worker: str, reason: str) -> None:
        ours = self._fences.pop(worker, None)
        if ours is None or self.hub.registry.get(worker) != ours:
            return  # not ours (any more): an operator's fence stays
        self._changing.add(worker)
        try:
            await self.hub.unfence(worker, _reason(reason))
        except NotFenced:
            pass
        finally:
            self._changing.discard(worker)

    def _probe_safe(self, queue: str) -> bool:
        state = self.service.core.queues.get(queue)
        return bool(state is not None and state.attributes.probe_safe)

    # ------------------------------------------------------------------------------------------ events
    def _publish(self, decision: Decision, tenant: str | None = None) -> None:
        self._n += 1
        event = decision.to_event()
        if tenant is not None:
            event["tenant"] = tenant
        event["n"] = self._n
        self._ring.append(event)
        self.counts[decision.event] += 1
        log.info("%s", decision.summary())
        if self._writer is not None:
            self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        from wirelog.record import event_record

        tenant, queue = _split(event.get("queue"))
        tenant = tenant or event.get("tenant")
        record = event_record(
            event=event["event"],
            reason=event["reason"],
            ts=event["at"],
            worker=event.get("worker"),
            queue=queue,
            message_id=event.get("probe_id"),
            group=event.get("group"),
        )
        record["tenant"] = tenant
        for name in ("mode", "expires", "signature"):
            if name in event:
                record[name] = event[name]
        try:
            self._writer.write(record)
        except Exception:  # a full disk must not stop failure management
            self.counts["event-write-errors"] += 1
            log.exception("cannot write an event record")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self._writer.tick(time.time())
            except Exception:
                log.exception("event writer tick failed")

    def events(self, since: int = 0, limit: int = EVENT_RING) -> list[dict[str, Any]]:
        """Events numbered after `since` (oldest first), at most `limit` of the newest."""
        found = [e for e in self._ring if e["n"] > since]
        return found[-limit:] if limit > 0 else []

    @property
    def last_event(self) -> int:
        return self._n

    def status(self, latest: int = 20) -> dict[str, Any]:
        """Workers, queues (suspended, parked groups), fences, latest events and counts."""
        now = self.service.clock()
        view = self.monitor.status(now)
        fences = {fence.worker: fence for fence in self.hub.fences()}
        for worker in view["workers"]:
            fence = fences.get(worker["worker"])
            worker["fence"] = None if fence is None else fence.to_dict()
        core = self.service.core
        seen = {q["queue"] for q in view["queues"]}
        for name, state in core.queues.items():
            if name not in seen and state.parked:  # held groups are worth a line even when all is well
                view["queues"].append({"queue": name, "suspended": False, "manual": False})
        for queue in view["queues"]:
            name = queue["queue"]
            queue["parked_groups"] = len(core.parked_groups(name)) if name in core.queues else 0
        view["queues"].sort(key=lambda q: q["queue"])
        view["operator_fences"] = [f.to_dict() for w, f in sorted(fences.items()) if w not in self._fences]
        view["events"] = self.events(limit=latest)
        view["counts"] = dict(self.counts)
        view["settings"] = self.settings.to_dict()
        view["now"] = now
        return view

    # ------------------------------------------------------------------------------------------ alerts
    async def _follow_alerts(self) -> None:
        """Follow the wire log's `event: alert` records (strictq errors' alert rules) and act on them."""
        assert self.wirelog is not None
        fresh_after = self.service.clock() - self.settings.window  # older alerts were acted on before
        await follow_alerts(self.wirelog, fresh_after, self.alert_poll, self._alert_record)

    async def _alert_record(self, alert: WireAlert) -> None:
        tenant = alert.tenant
        self.alert(
            alert.reason,
            queue=alert.core_queue(self.service.core.queues.__contains__),
            signatures=alert.signatures,
            within=None if tenant is None else (lambda name: tenant_of(name) == tenant),
            tenant=tenant,
        )


class SuspensionFileError(StartupError):
    """suspended.json is unreadable or malformed: refuse to start rather than resume queues an operator
    (or an alert) suspended."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            path, problem, "fix it, restore it from a backup, or remove it to start with no queue suspended"
        )


def read_suspensions(path: Path) -> dict[str, dict[str, Any]]:
    """The suspended queues an earlier run saved (none: no file); SuspensionFileError if it is damaged."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SuspensionFileError(path, f"cannot read it ({exc.strerror or exc})") from None
    except orjson.JSONDecodeError as exc:
        raise SuspensionFileError(path, f"not valid JSON ({exc})") from None
    queues = data.get("queues") if isinstance(data, dict) else None
    if not isinstance(queues, dict):
        raise SuspensionFileError(path, 'malformed (expected an object with "queues": {...})')
    return {
        name: {
            "reason": str(entry.get("reason") or "restored"),
            "manual": entry.get("manual") is not False,
        }
        for name, entry in queues.items()
        if isinstance(name, str) and isinstance(entry, dict)
    }


def _reason(text: str) -> str:
    return (REASON_PREFIX + text)[:MAX_REASON]


def _split(queue: Any) -> tuple[str | None, str | None]:
    """`t1.orders` and `t1_dedupq.orders` -> ("t1", "orders"): wire-log records name queues as their
    tenant sees them (access.tenancy)."""
    if not isinstance(queue, str):
        return None, None
    return tenant_of(queue), split(queue)[1]


def _iso(at: float | None) -> str:
    if at is None:
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
