"""Failure management's shell: the HealthMonitor inside the process that holds the queue core.

`FailureManager` feeds the sans-I/O `HealthMonitor` (queue_core.machine.health) with the core's
`AttemptRecorded` effects, every poll (through `QueueService.receive_gate`), probe results (through
`QueueService.take_probe_result`), alerts (the `event: alert` records `strictq errors` writes to the wire
log, or `POST /admin/v1/alerts`) and operator commands, runs its timer, and carries out its decisions:

- fence / unfence: through the `ControlHub` (durable, on the control stream; reason prefixed `health:`),
  and a fenced worker's claims are released at once so its groups go to other workers in order;
- polls of a fenced or blacklisted worker, and of a suspended queue, return only probes (or nothing);
- a probe is a synthetic item `{"id": "probe-…", "probe": true, "payload": <queue's probe_payload>}` in
  the worker's next poll, announced on the control stream (`probe` / `probe_end`) so the proxy serves its
  calls by mimicry, or passes them for a `probe_safe` queue, even while the worker is fenced;
- every decision is an event: logged, counted, kept in a bounded ring (`events()`, `status()`) and
  written to the wire log (kind `event`, writer `core`).

Only fences this manager set are lifted by it: an operator's `strictq fence` keeps its meaning (the proxy
isolates the worker, which still gets messages: mimicry testing needs them), and an operator's `strictq
unfence` of a worker the monitor fenced restores that worker.
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
from typing import Any

import orjson

from wirelog.files import StartupError

from .control import ControlHub
from .fences import MAX_REASON, Fence, FenceMode, NotFenced, _replace_file
from .machine import Delivery, QueueNotFound
from .machine.effects import AttemptRecorded, GroupEvent
from .machine.health import Decision, HealthMonitor, HealthSettings, Probe
from .scope import tenant_of
from .service import QueueService, Received

log = logging.getLogger("strictq.health")
REASON_PREFIX = "health: "
DEFAULT_PROBE_PAYLOAD: dict[str, Any] = {"probe": True}
EVENT_RING = 1000
ALERT_POLL = 2.0  # seconds between looks for new alert records in the wire log
ALERT_WRITER = "spark-alerts"  # spark.alerts.WRITER (not imported: that package pulls in pyspark)
TICK = 0.25  # seconds between flushes of the event writer
DRAIN_TIMEOUT = 5.0  # seconds close() waits for queued fence changes
# Decisions that are events (the rest only drive the control stream).
QUIET = frozenset({"probe-cancelled"})
Action = Callable[[], Awaitable[None]]


class FailureManager:
    """Owns the monitor, its timer, the event ring and the event writer; start after the hub."""

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
        self.monitor = HealthMonitor(self.settings)
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
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._writer: Any = None  # wirelog.writer.WireLogWriter, imported lazily
        # Suspended queues survive restarts (beside fences.json); the rest of the monitor's state is
        # rebuilt from what happens next (fences are adopted from the hub).
        self.suspensions_path = hub.registry.path.with_name("suspended.json")
        self._started = False

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Hook into the service and the hub, adopt the fences an earlier run set, start the tasks."""
        epoch = self.service.core.epoch
        self.monitor = HealthMonitor(self.settings, probe_prefix=f"{epoch}-")
        if self.wirelog is not None:
            from wirelog.writer import WireLogWriter

            self._writer = await asyncio.to_thread(WireLogWriter, self.wirelog, "core")
        now = self.service.clock()
        for fence in self.hub.fences():
            if fence.reason.startswith(REASON_PREFIX):
                self._fences[fence.worker] = fence
                self.monitor.adopt_fence(fence.worker, fence.reason[len(REASON_PREFIX) :], fence.since, now)
        for queue, saved in (await asyncio.to_thread(self._load_suspensions)).items():
            if queue in self.service.core.queues:
                self.monitor.suspend(queue, saved["reason"], now, manual=saved["manual"])
        self.service.failure_listeners.append(self._on_effect)
        self.service.receive_gate = self._gate
        self.service.worker_blocked = self.monitor.blocked
        self.service.probe_results = self.probe_result
        self.hub.event_listeners.append(self._on_hub_event)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run_actions(), name="strictq-health-actions"))
        if self._writer is not None:
            self._tasks.append(loop.create_task(self._tick(), name="strictq-health-events"))
        if self.wirelog is not None and self.alert_poll > 0:
            self._tasks.append(loop.create_task(self._follow_alerts(), name="strictq-health-alerts"))
        self._started = True
        self._after()
        log.info("failure management on: %s", self.settings.to_dict())

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._on_effect in self.service.failure_listeners:
            self.service.failure_listeners.remove(self._on_effect)
        self.service.receive_gate = None
        self.service.worker_blocked = None
        self.service.probe_results = None
        if self._on_hub_event in self.hub.event_listeners:
            self.hub.event_listeners.remove(self._on_hub_event)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
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

    # --------------------------------------------------------------------------------------- inputs
    def _on_effect(self, effect: AttemptRecorded | GroupEvent) -> None:
        """Called by the service inside `_submit` (no core operation may run from here): an attempt to
        account, or a retry-workflow decision (park, release, dead_letter, redrive) to publish."""
        if isinstance(effect, GroupEvent):
            self._publish(
                Decision(effect.event, effect.reason, effect.at, queue=effect.queue, group=effect.group)
            )
            return
        self.monitor.attempt(effect)
        self._after()

    def _gate(self, queue: str, worker: str, probes: bool) -> list[Received] | None:
        """`QueueService.receive_gate`: None lets the poll through; a list is what the worker gets."""
        verdict = self.monitor.poll(queue, worker, self.service.clock(), probes=probes)
        if verdict.allowed:
            return None
        if verdict.probe is None:
            return []
        probe = verdict.probe
        self._announce(probe)  # a queue probe learns its worker only now
        return [self._probe_item(probe)]

    def probe_result(self, queue: str, worker: str, message_id: str, outcome: str, reason: str) -> bool:
        """`QueueService.probe_results`: a worker's result for a probe (outcome `succeeded` passes)."""
        if message_id not in self.monitor.probes:
            return False
        ok = outcome == "succeeded"
        why = reason or ("ok" if ok else outcome)
        taken = self.monitor.probe_result(worker, message_id, ok, why, self.service.clock())
        self._after()
        return taken

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
        now = self.service.clock()
        suspended = self.monitor.alert(reason, now, queue=queue, signatures=signatures, within=within)
        self._after(tenant)
        return suspended

    def suspend(self, queue: str, reason: str) -> None:
        self._known_queue(queue)
        self.monitor.suspend(queue, reason, self.service.clock())
        self._after()

    def resume(self, queue: str, reason: str) -> bool:
        resumed = self.monitor.resume(queue, reason, self.service.clock())
        self._after()
        return resumed

    def lift_blacklist(self, worker: str, reason: str) -> bool:
        lifted = self.monitor.lift_blacklist(worker, reason, self.service.clock())
        self._after()
        return lifted

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
                self.monitor.unfence(worker, f"fence lifted ({why})", self.service.clock())
                self._after()

    # ------------------------------------------------------------------------------------ decisions
    def _after(self, tenant: str | None = None) -> None:
        """Carry out what the monitor decided, then re-arm its timer; `tenant`: the tenant whose request
        caused these decisions (written into their events)."""
        for decision in self.monitor.drain_decisions():
            self._carry_out(decision)
            if decision.event not in QUIET:
                self._publish(decision, tenant)
        self._rearm()

    def _carry_out(self, decision: Decision) -> None:
        event, worker, queue = decision.event, decision.worker, decision.queue
        if event == "fence" and worker is not None:
            mode = decision.mode or self.settings.fence_mode
            self._act(lambda: self._fence(worker, mode, decision.reason))
        elif event == "unfence" and worker is not None:
            self._act(lambda: self._unfence(worker, decision.reason))
            self.service.wake()
        elif event == "blacklist" and worker is not None:
            until = _iso(decision.expires)
            self._act(lambda: self._refence(worker, f"blacklisted until {until}: {decision.reason}"))
        elif event == "probe" and decision.probe_id is not None:
            probe = self.monitor.probes.get(decision.probe_id)
            if probe is not None and probe.worker is not None and probe.queue:
                self._announce(probe)
            self.service.wake(queue)
        elif event in ("probe-passed", "probe-failed", "probe-cancelled") and decision.probe_id:
            self._announced.discard(decision.probe_id)
            self.hub.probe_end(decision.probe_id)
        if event in ("suspend", "resume"):
            self._act(self._save_suspensions)
        if event == "resume" and queue is not None:
            self.service.wake(queue)

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
        released = await self.service.release_worker(worker)
        if released:
            log.info("released %d message(s) claimed by fenced worker %s", released, worker)

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

    def _load_suspensions(self) -> dict[str, dict[str, Any]]:
        return read_suspensions(self.suspensions_path)

    async def _save_suspensions(self) -> None:
        queues = {
            q.name: {"reason": q.reason, "manual": q.manual, "since": q.since}
            for q in self.monitor.queues.values()
            if q.suspended
        }
        data = orjson.dumps({"version": 1, "queues": queues}, option=orjson.OPT_INDENT_2)
        await asyncio.to_thread(_replace_file, self.suspensions_path, data)

    # ------------------------------------------------------------------------------------------ probes
    def _attributes(self, queue: str) -> Any:
        state = self.service.core.queues.get(queue)
        return state.attributes if state is not None else None

    def _probe_safe(self, queue: str) -> bool:
        return bool(getattr(self._attributes(queue), "probe_safe", False))

    def _probe_item(self, probe: Probe) -> Received:
        payload = getattr(self._attributes(probe.queue), "probe_payload", None)
        body = orjson.dumps(DEFAULT_PROBE_PAYLOAD if payload is None else payload)
        now = self.service.clock()
        delivered = probe.delivered or now
        delivery = Delivery(
            key=-1,
            message_id=probe.id,
            group=probe.id,  # its own group: it never holds up (or waits behind) a real one
            seq=0,
            token=1,  # no claim behind it; 1 passes the results' token check and any floor (none: own group)
            receipt=probe.id,
            receive_count=1,
            sent_at=probe.created,
            first_receive_at=delivered,
            claim_expires=probe.deadline or delivered + self.settings.probe_timeout,
        )
        return Received(delivery, body, "application/json", b"", probe=True)

    # ------------------------------------------------------------------------------------------- timer
    def _rearm(self) -> None:
        if not self._started:
            return
        deadline = self.monitor.next_deadline()
        if deadline is None or (self._timer is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, deadline - self.service.clock()), self._on_timer)
        self._timer_at = deadline

    def _on_timer(self) -> None:
        self._timer = None
        self.monitor.handle_timer(self.service.clock())
        self._after()

    # ------------------------------------------------------------------------------------------ events
    def _publish(self, decision: Decision, tenant: str | None = None) -> None:
        self._n += 1
        event = decision.to_event()
        if tenant is not None:
            event["tenant"] = tenant
        event["n"] = self._n
        self._ring.append(event)
        self.counts[decision.event] += 1
        log.info(
            "%s%s%s: %s",
            decision.event,
            f" worker={decision.worker}" if decision.worker else "",
            f" queue={decision.queue}" if decision.queue else "",
            decision.reason,
        )
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
        """Poll the wire log for `event: alert` records (strictq errors' alert rules) and act on them."""
        assert self.wirelog is not None
        follower = _AlertFollower(self.wirelog)
        fresh_after = self.service.clock() - self.settings.window  # older alerts were acted on before
        while True:
            try:
                records = await asyncio.to_thread(follower.poll)
            except Exception:
                log.exception("cannot read alert records in %s", self.wirelog)
                records = []
            for record in records:
                ts = record.get("ts")
                if record.get("event") != "alert" or not isinstance(ts, int | float) or ts < fresh_after:
                    continue
                self._alert_record(record)
            await asyncio.sleep(self.alert_poll)

    def _alert_record(self, record: dict[str, Any]) -> None:
        alert = record.get("alert")
        details: dict[str, Any] = alert if isinstance(alert, dict) else {}
        signatures = [s for s in [details.get("signature"), *(details.get("signatures") or [])] if s]
        queue = record.get("queue")
        tenant = record.get("tenant")
        if isinstance(queue, str) and queue not in self.service.core.queues and tenant:
            queue = f"{tenant}.{queue}"
        # A record of one tenant reaches only that tenant's queues; one without: any (the operator's rule).
        scoped = tenant if isinstance(tenant, str) and tenant else None
        self.alert(
            str(record.get("reason") or details.get("rule") or "alert"),
            queue=queue if isinstance(queue, str) else None,
            signatures=[str(s) for s in signatures],
            within=None if scoped is None else (lambda name: tenant_of(name) == scoped),
            tenant=scoped,
        )


class _AlertFollower:
    """New records of the alert writer's segments only (the proxy's busy segments are never read)."""

    def __init__(self, directory: Path) -> None:
        from wirelog.reader import Follower, RecordFilter

        self.directory = directory
        self._follower = Follower(directory, where=RecordFilter(kind="event"))

    def poll(self) -> list[dict[str, Any]]:
        from wirelog.layout import TMP, parse_segment_name

        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        names: dict[tuple[str, int, str], Any] = {}
        for entry in entries:
            name = parse_segment_name(entry)
            if name is not None and name.writer == ALERT_WRITER and name.state != TMP:
                names.setdefault(name.key, name)
        found: list[dict[str, Any]] = []
        for key in sorted(names):
            found.extend(self._follower.read_segment(names[key]))
        return found


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
    """`t1.orders` -> ("t1", "orders"): wire-log records name queues as their tenant sees them."""
    if not isinstance(queue, str):
        return None, None
    tenant, dot, name = queue.partition(".")
    return (tenant, name) if dot else (None, queue)


def _iso(at: float | None) -> str:
    if at is None:
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
