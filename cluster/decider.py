"""Failure management's decider in a cluster: one node at a time holds it, by a lease in KV
(docs/failure-management.md §3.2).

Any node may take the role: it creates the `decider` key of `sq_<id>_decider` (TTL DECIDER_TTL) and renews
it with compare-and-set on its revision, as the master does (cluster.master); when the holder dies the key
expires and another node's create succeeds. The holder:

- adopts what the control bucket holds (the decider's fences, suspensions, blacklists, restore times;
  probes an earlier holder offered are withdrawn and asked again), then replays the last window of the
  health stream (`SQ_<id>_HEALTH`: every partition's gate reports) and follows it, feeding a
  `queue_core.machine.decider.Decider`;
- carries out each typed decision as a write to the control bucket (cluster.control_keys); a fence is a
  create, so a fence an earlier holder already wrote is not decided, nor published, twice;
- publishes every event to `SQ_<id>_EVENTS` (numbered by its stream sequence, so the numbers go on
  across a takeover), with the events the edges decide (the fleet's, `record`: cluster.edge_events; a
  gateway may not publish to the stream itself, cluster.nats_roles), and answers requests on
  `sq.<id>.decider.api` (status, events, suspend, resume, unblacklist, alert, record;
  cluster.decider_client) for every edge.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from queue_core.fences import MAX_REASON, Fence
from queue_core.machine.decider import Decider, ProbeTaken
from queue_core.machine.gate import ProbeOffered, report_from_json
from queue_core.machine.health import Decision, HealthSettings
from queue_core.machine.supervisor import (
    BlacklistLifted,
    FenceRequested,
    HealthEffect,
    ProbeEnded,
    ProbeIssued,
    QueueResumed,
    QueueSuspended,
    UnfenceRequested,
    WorkerBlacklisted,
)

from .control_keys import (
    HEALTH_REASON,
    blacklist_key,
    fence_key,
    health_fence_entries,
    probe_key,
    probe_value,
    read_state,
    restored_key,
    suspend_key,
)
from .kv_mirror import KvMirror
from .layout import DECIDER_TTL, EVENTS_KEPT, ClusterLayout, retrying

log = logging.getLogger("strictq.health")
DECIDER_KEY = "decider"
QUIET = frozenset({"probe-cancelled", "probe-delivered"})  # not events (queue_core.failures.QUIET)
# Decided at an edge: the fleet's (`sleep`, `wake`, `control-*`) and a rollout's steps (`rollout-*`).
EDGE_EVENTS = frozenset({"sleep", "wake"})
EDGE_EVENT_PREFIXES = ("control-", "rollout-")
# Below the edges' request timeout (cluster.decider_client.REQUEST_TIMEOUT): a slow publish is answered
# as failed before the edge gives up on the answer, and the edge's retry carries the same id.
PUBLISH_TIMEOUT = 4.0
MAX_WAIT = 0.25  # seconds the holder waits for reports before it looks at its timers and lease again


class DeciderRole:
    def __init__(
        self,
        nc: NatsClient,
        layout: ClusterLayout,
        me: str,
        control: KvMirror,
        settings: HealthSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._layout = layout
        self._me = me
        self.control = control
        self.settings = settings
        self._clock = clock
        self.holding = False
        self.decider: Decider | None = None
        self.ring: list[dict[str, Any]] = []  # the newest EVENTS_KEPT events, in stream order
        self.counts: Counter[str] = Counter()
        self.last_event = 0
        # One publish at a time: events are numbered and remembered in stream order, so a reader paging
        # `since` the last number it saw never misses one acknowledged out of order.
        self._publishing = asyncio.Lock()
        self._subscriptions: list[Any] = []
        self._seen_fences: set[str] = set()  # the decider's fences the control bucket showed
        # Fences this holder wrote, by the revision of the write, until its copy of the bucket has heard
        # that far: one deleted before this copy looked was still lifted by someone (an operator).
        self._written: dict[str, int] = {}
        self._reports: asyncio.Queue[Msg] = asyncio.Queue()

    # ------------------------------------------------------------------------------------- the lease
    async def run(self) -> None:
        lease = await retrying(
            lambda: self._js.key_value(self._layout.decider_bucket), "the decider's lease", 3600.0
        )
        revision = 0
        value = orjson.dumps({"node": self._me})
        renew_at = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= renew_at:
                    try:
                        if revision:
                            revision = await lease.update(DECIDER_KEY, value, last=revision)
                        else:
                            revision = await lease.create(DECIDER_KEY, value)
                        renew_at = now + DECIDER_TTL / 3
                        if not self.holding:
                            await self._take_over()
                    except KeyWrongLastSequenceError:
                        revision = 0
                        renew_at = now + DECIDER_TTL / 3
                        await self._give_up("another node holds the lease")
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        log.warning("decider lease: %s", exc)
                        revision = 0
                        renew_at = now + DECIDER_TTL / 3
                        await self._give_up(f"lease: {exc}")
                if self.holding:
                    await self._step(min(MAX_WAIT, max(0.0, renew_at - time.monotonic())))
                else:
                    await asyncio.sleep(max(0.0, renew_at - time.monotonic()))
        finally:
            await self._give_up("stopping")

    async def _take_over(self) -> None:
        now = self._clock()
        log.info("%s holds failure management's decider", self._me)
        await self._load_events()
        decider = Decider(self.settings, self._layout.partitions, probe_prefix=secrets.token_hex(3) + "-")
        state = read_state({k: e.value for k, e in self.control.entries.items()})
        blacklists = []
        for worker, row in state.blacklists.items():
            with contextlib.suppress(TypeError, ValueError):
                blacklists.append(
                    (
                        worker,
                        str(row.get("reason") or "restored"),
                        float(row.get("since") or now),
                        float(row.get("until") or now),
                        str(row.get("queue") or ""),
                    )
                )
        decider.adopt(
            fences=list(health_fence_entries(state)),
            suspensions=[
                (q, str(row.get("reason") or "restored"), row.get("manual") is not False)
                for q, row in state.suspensions.items()
            ],
            blacklists=blacklists,
            restored=state.restored,
            now=now,
        )
        bucket = self.control.bucket
        for probe_id in state.probes:  # an earlier holder's: the adopted fences are probed afresh
            with contextlib.suppress(Exception):
                await bucket.delete(probe_key(probe_id))
        self.decider = decider
        self._seen_fences = set(state.health_fences())
        self._reports = asyncio.Queue()
        start = datetime.datetime.fromtimestamp(now - self.settings.window, tz=datetime.UTC)
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)

        async def heard(msg: Msg) -> None:
            self._reports.put_nowait(msg)

        self._subscriptions.append(
            await self._js.subscribe(
                self._layout.health_subject, cb=heard, ordered_consumer=True, config=config
            )
        )
        self._subscriptions.append(await self._nc.subscribe(self._layout.decider_subject, cb=self._answer))
        self.holding = True

    async def _give_up(self, why: str) -> None:
        """Stop deciding (also after a takeover that failed half-way: what it subscribed goes)."""
        if self.holding:
            log.warning("%s no longer holds the decider: %s", self._me, why)
        self.holding = False
        self.decider = None
        for subscription in self._subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        self._subscriptions = []

    # -------------------------------------------------------------------------------------- deciding
    async def _step(self, wait: float) -> None:
        decider = self.decider
        assert decider is not None
        deadline = decider.next_deadline()
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - self._clock()))
        with contextlib.suppress(TimeoutError):
            msg = await asyncio.wait_for(self._reports.get(), wait)
            await self._feed(msg)
            while not self._reports.empty():
                await self._feed(self._reports.get_nowait())
        if self.decider is not None:
            await self._carry_out(self.decider.handle_timer(self._clock()))
        if self.decider is not None:
            await self._lifted_elsewhere(self.decider)

    async def _lifted_elsewhere(self, decider: Decider) -> None:
        """A fence of the decider's that left the control bucket without its word (an operator's
        `strictq unfence`): the worker is restored, as in one process."""
        fenced = set(read_state({k: e.value for k, e in self.control.entries.items()}).health_fences())
        gone, self._seen_fences = self._seen_fences - fenced, fenced
        heard = self.control.revision
        for worker, revision in list(self._written.items()):
            if heard >= revision:  # this copy is past our write: present (seen above) or lifted already
                del self._written[worker]
                if worker not in fenced:
                    gone.add(worker)
        for worker in sorted(gone):
            monitor = decider.monitor
            if monitor.blocked(worker):
                why = "fence lifted (operator)"
                _, effects = decider.command(monitor.unfence, worker, why, now=self._clock())
                await self._carry_out(effects)

    async def _feed(self, msg: Msg) -> None:
        try:
            items = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            return
        for item in items if isinstance(items, list) else []:
            report = report_from_json(item)
            if report is not None and self.decider is not None:
                await self._carry_out(self.decider.feed(report))

    async def _carry_out(self, effects: list[HealthEffect], tenant: str | None = None) -> None:
        for effect in effects:
            try:
                if await self._act(effect) and effect.decision.event not in QUIET:
                    await self._publish(effect.decision, tenant)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("decider: carrying out %s", effect.decision.event)

    async def _act(self, effect: HealthEffect) -> bool:
        """One decision written to the control bucket; False when it was already in force there (an
        earlier holder decided it) or is not ours to make (an operator's fence)."""
        bucket = self.control.bucket
        decider = self.decider
        assert decider is not None
        reason = effect.decision.reason
        if isinstance(effect, FenceRequested):
            fence = Fence(
                effect.worker,
                "mimic" if effect.mode == "mimic" else "block",
                _reason(reason),
                effect.decision.at,
            )
            try:
                revision = await bucket.create(fence_key(effect.worker), orjson.dumps(fence.to_dict()))
                self._written[effect.worker] = revision
            except KeyWrongLastSequenceError:
                return False  # fenced already: by an earlier holder (adopted) or by an operator
        elif isinstance(effect, UnfenceRequested):
            current = self._fence(effect.worker)
            if current is not None and current.reason.startswith(HEALTH_REASON):
                await bucket.delete(fence_key(effect.worker))
            at = effect.decision.at
            await bucket.put(restored_key(effect.worker), orjson.dumps({"worker": effect.worker, "at": at}))
        elif isinstance(effect, WorkerBlacklisted):
            row = {
                "worker": effect.worker,
                "reason": reason,
                "since": effect.decision.at,
                "until": effect.until,
                "queue": effect.decision.queue or "",
            }
            await bucket.put(blacklist_key(effect.worker), orjson.dumps(row))
            current = self._fence(effect.worker)
            if current is not None and current.reason.startswith(HEALTH_REASON):
                until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(effect.until))
                again = Fence(
                    current.worker,
                    current.mode,
                    _reason(f"blacklisted until {until}: {reason}"),
                    current.since,
                )
                await bucket.put(fence_key(effect.worker), orjson.dumps(again.to_dict()))
        elif isinstance(effect, BlacklistLifted):
            with contextlib.suppress(KeyNotFoundError):
                await bucket.delete(blacklist_key(effect.worker))
        elif isinstance(effect, ProbeIssued | ProbeTaken):
            probe = effect.probe
            offer = ProbeOffered(
                probe.id,
                probe.queue,
                probe.purpose,
                probe.worker,
                decider.probe_partition(probe),
                probe.created,
            )
            await bucket.put(probe_key(probe.id), probe_value(offer))
        elif isinstance(effect, ProbeEnded):
            await bucket.delete(probe_key(effect.probe_id))
        elif isinstance(effect, QueueSuspended):
            row = {
                "queue": effect.queue,
                "reason": reason,
                "manual": effect.manual,
                "since": effect.decision.at,
            }
            await bucket.put(suspend_key(effect.queue), orjson.dumps(row))
        elif isinstance(effect, QueueResumed):
            await bucket.delete(suspend_key(effect.queue))
        return True

    def _fence(self, worker: str) -> Fence | None:
        return read_state({k: e.value for k, e in self.control.entries.items()}).fences.get(worker)

    # ---------------------------------------------------------------------------------------- events
    async def _publish(
        self, decision: Decision, tenant: str | None = None, msg_id: str | None = None
    ) -> None:
        """`msg_id`: an edge's id for its event (JetStream drops a repeat of it, the edge's retry)."""
        event = decision.to_event()
        if tenant is not None:
            event["tenant"] = tenant
        headers = None if msg_id is None else {"Nats-Msg-Id": msg_id}
        async with self._publishing:
            ack = await self._js.publish(
                self._layout.events_subject, orjson.dumps(event), timeout=PUBLISH_TIMEOUT, headers=headers
            )
            event["n"] = ack.seq
            self._remember(event)
        if not ack.duplicate:
            log.info("%s", decision.summary())

    def _remember(self, event: dict[str, Any]) -> None:
        """`event` (numbered `n`) into the ring in stream order, once: publishes acknowledged out of order
        (a request's beside the step's) are all kept."""
        n = event["n"]
        at = bisect.bisect_left(self.ring, n, key=_number)
        if at < len(self.ring) and self.ring[at]["n"] == n:
            return
        if len(self.ring) >= EVENTS_KEPT and at == 0:
            return  # older than every event kept
        self.ring.insert(at, event)
        del self.ring[:-EVENTS_KEPT]
        self.counts[str(event.get("event"))] += 1
        self.last_event = max(self.last_event, n)

    async def _load_events(self) -> None:
        """The events earlier holders published (the newest EVENTS_KEPT), into the ring."""
        try:
            info = await self._js.stream_info(self._layout.events_stream)
        except Exception as exc:
            log.warning("decider: cannot read the events stream: %s", exc)
            return
        last = info.state.last_seq
        if not info.state.messages or last <= self.last_event:
            return
        subscription = await self._js.subscribe(
            self._layout.events_subject,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        try:
            for _ in range(EVENTS_KEPT + 1):
                try:
                    msg = await subscription.next_msg(timeout=2.0)
                except NatsTimeoutError:
                    break
                with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                    event = orjson.loads(msg.data)
                    event["n"] = msg.metadata.sequence.stream
                    self._remember(event)
                if msg.metadata.sequence.stream >= last:
                    break
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    # -------------------------------------------------------------------------------------- requests
    async def _answer(self, msg: Msg) -> None:
        try:
            request = orjson.loads(msg.data)
            answer = await self.handle(request if isinstance(request, dict) else {})
        except Exception as exc:  # never a traceback to the edge: one line
            log.exception("decider: a request failed")
            answer = {"error": {"code": "internal", "message": str(exc)[:200]}}
        with contextlib.suppress(Exception):
            await msg.respond(orjson.dumps(answer))

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request of an edge (cluster.decider_client); the caller checked the scope."""
        decider = self.decider
        if decider is None or not self.holding:
            return {"error": {"code": "not_decider", "message": "this node no longer holds the decider"}}
        op = request.get("op")
        now = self._clock()
        monitor = decider.monitor
        if op == "status":
            return {"status": self.status(now)}
        if op == "events":
            since = int(request.get("since") or 0)
            return {"events": [e for e in self.ring if e["n"] > since], "last": self.last_event}
        if op == "suspend":
            queue = str(request["queue"])
            _, effects = decider.command(monitor.suspend, queue, str(request["reason"]), now=now)
            await self._carry_out(effects)
            return {"ok": True}
        if op == "resume":
            resumed, effects = decider.command(
                monitor.resume, str(request["queue"]), str(request["reason"]), now=now
            )
            await self._carry_out(effects)
            return {"ok": bool(resumed)}
        if op == "unblacklist":
            lifted, effects = decider.command(
                monitor.lift_blacklist, str(request["worker"]), "operator", now=now
            )
            await self._carry_out(effects)
            return {"ok": bool(lifted)}
        if op == "alert":
            queues = request.get("queues")
            allowed = None if queues is None else set(queues)
            tenant = request.get("tenant")  # a tenant's alert: its events carry the tenant (scope.event)
            suspended, effects = decider.command(
                monitor.alert,
                str(request["reason"]),
                now=now,
                queue=request.get("queue"),
                signatures=[str(s) for s in request.get("signatures") or []],
                within=None if allowed is None else allowed.__contains__,
            )
            await self._carry_out(effects, tenant if isinstance(tenant, str) and tenant else None)
            return {"suspended": suspended}
        if op == "record":
            decision = edge_decision(request.get("event"))
            if decision is None:
                return {"error": {"code": "bad_request", "message": "not an event an edge decides"}}
            msg_id = request.get("id")
            edge_id = f"edge-{msg_id[:64]}" if isinstance(msg_id, str) and msg_id else None
            await self._publish(decision, msg_id=edge_id)
            return {"ok": True}
        return {"error": {"code": "bad_request", "message": f"unknown operation {op!r}"}}

    def status(self, now: float) -> dict[str, Any]:
        """`GET /admin/v1/status`'s document, before scoping (queue_core.failures.FailureManager.status)."""
        decider = self.decider
        assert decider is not None
        view = decider.monitor.status(now)
        fences = read_state({k: e.value for k, e in self.control.entries.items()}).fences
        for worker in view["workers"]:
            fence = fences.get(worker["worker"])
            worker["fence"] = None if fence is None else fence.to_dict()
        for queue in view["queues"]:
            queue["parked_groups"] = 0  # the edge fills it in from the partitions
        view["operator_fences"] = [
            f.to_dict() for w, f in sorted(fences.items()) if not f.reason.startswith(HEALTH_REASON)
        ]
        view["probe_list"] = [[p.queue, p.worker] for p in decider.monitor.probes.values()]
        view["events"] = list(self.ring)
        view["counts"] = dict(self.counts)
        view["settings"] = self.settings.to_dict()
        view["now"] = now
        view["decider"] = self._me
        return view


def edge_decision(event: Any) -> Decision | None:
    """The Decision of an event an edge decided (the fleet's: `control-*`, `sleep`, `wake`; a rollout's step:
    `rollout-*`), checked;
    None for anything else, so an edge's request cannot pass for the decider's own decisions."""
    if not isinstance(event, dict):
        return None
    kind, reason, at = event.get("event"), event.get("reason"), event.get("at")
    if not isinstance(kind, str) or not (kind in EDGE_EVENTS or kind.startswith(EDGE_EVENT_PREFIXES)):
        return None
    if not isinstance(reason, str) or not isinstance(at, int | float) or isinstance(at, bool):
        return None
    worker, queue = event.get("worker"), event.get("queue")
    if not all(v is None or (isinstance(v, str) and v) for v in (worker, queue)):
        return None
    return Decision(kind[:64], reason[:MAX_REASON], float(at), worker=worker, queue=queue)


def _number(event: dict[str, Any]) -> int:
    return int(event["n"])


def _reason(text: str) -> str:
    return (HEALTH_REASON + text)[:MAX_REASON]
