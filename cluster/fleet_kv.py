"""The worker fleet of a cluster (docs/fleet.md, "In a cluster"): one registry for every edge, in the KV
bucket `strictq_fleet_<cluster id>` (cluster.layout.ClusterLayout.fleet_bucket).

Each edge (`strictq serve --cluster`) runs a `ClusterFleet`: the same interface as the in-process
`FleetService` (queue_core.fleet), the same rules (the pure registry, queue_core.machine.fleet), but the
state lives in the bucket, so a heartbeat through one edge is listed at every edge and a control issued
at any edge reaches the worker at whichever edge it heartbeats through:

- key `w.<worker>` (the id base64url-encoded, keys allow few characters): the worker's registry entry
  (queues, version, load, state, desired state, last heartbeat as wall-clock time) and its pending
  controls. Every change of a worker (a heartbeat and its acknowledgements, a control issued, expiry, a
  rebalancing decision) is read-modify-write of that one key, written only if the bucket has not changed
  since the read (compare-and-set on the bucket's stream, `ClusterFleet._write` says why not on the
  key's revision), heard again and replayed on a conflict: two edges never lose each other's updates,
  and an acknowledgement or an expiry happens (and is published as an event) once;
- key `p.<queue>`: a queue's rebalancing policy (a plain put: the operator's last word wins).

Each edge watches the bucket (cluster.kv_mirror) for the poll answers' `X-Strictq-Control: pending` and
for its admin routes' reads, which first wait until the copy holds every revision the bucket had (so a
heartbeat acknowledged at one edge is listed by the next read at another). Each edge's tick (`TICK`)
expires controls and runs the queues' policies against their backlog (read through the port: summed over
the partitions); the edges' ticks may act at once, and the compare-and-set with the "no state change
pending" rule re-checked on the worker's fresh record keeps a worker from getting a second sleep or wake.

Control ids are `<edge>-<n>`: a random prefix drawn when the edge starts, then a counter (unique across
edges and restarts, as the in-process `<epoch>-<n>`). A worker silent for FORGET_AFTER with nothing
pending is dropped from the bucket (one process forgets its registry at a restart; the bucket would
otherwise keep every worker ever seen).

Events (control-applied / -refused / -failed / -expired, sleep, wake) go to `events` when given (the
edge hands them to the cluster's decider: cluster.edge_events), else to the log (as with `--no-health`). A
drain does not hand the worker's groups' local state over (state transfer needs the core's state
holders, which the port does not expose yet): its groups go on elsewhere without their state.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, BucketNotFoundError
from nats.js.kv import KeyValue

from queue_core.backend import QueueBackend
from queue_core.fleet import TICK, FleetAdmin
from queue_core.machine import QueueNotFound, Unavailable
from queue_core.machine.fleet import (
    STATE_KINDS,
    STATES,
    Answer,
    Capacity,
    Control,
    Fleet,
    FleetEvent,
    FleetSettings,
    Heartbeat,
    Load,
    State,
    WorkerEntry,
)
from queue_core.machine.rebalance import RebalancePolicy

from .kv_mirror import KvMirror
from .layout import TRANSIENT, ClusterLayout, retrying

log = logging.getLogger("strictq.fleet")
WORKER_PREFIX = "w."
POLICY_PREFIX = "p."
CAS_ATTEMPTS = 50  # writes of other edges in between one edge's read and its write
WRONG_LAST_SEQUENCE = 10071  # JetStream's answer to a write whose expected last sequence is not the stream's
WRITE_TIMEOUT = 5.0
SYNC_WITHIN = 2.0  # how long an admin read waits for this edge's copy to catch up with the bucket
FORGET_AFTER = 86400.0  # seconds a worker may be silent, with nothing pending, before the bucket drops it


@dataclass(slots=True)
class WorkerRecord:
    """One worker's key: its registry entry (None: never heard from, only controls addressed to it) and
    its pending controls in issue order."""

    worker: str
    entry: WorkerEntry | None
    controls: list[Control]


# ------------------------------------------------------------------------------------------ the keys
def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


def worker_key(worker: str) -> str:
    return WORKER_PREFIX + _encode(worker)


def policy_key(queue: str) -> str:
    return POLICY_PREFIX + _encode(queue)


def record_to_json(record: WorkerRecord) -> bytes:
    entry = record.entry
    return orjson.dumps(
        {
            "worker": record.worker,
            "entry": None
            if entry is None
            else {
                "queues": list(entry.queues),
                "version": entry.version,
                "capacity": entry.capacity.to_dict(),
                "load": {
                    "in_flight": entry.load.in_flight,
                    "concurrency": entry.load.concurrency,
                    "polls": entry.load.polls,
                    "empty_polls": entry.load.empty_polls,
                },
                "state": entry.state,
                "desired": entry.desired,
                "interval": entry.interval,
                "first_seen": entry.first_seen,
                "last_seen": entry.last_seen,
                "idle_beats": entry.idle_beats,
                "heartbeats": entry.heartbeats,
            },
            "controls": [{**c.to_row(), "delivered": c.delivered} for c in record.controls],
        }
    )


def _state(value: Any) -> State:
    for state in STATES:
        if value == state:
            return state
    raise ValueError(f"unknown state {value!r}")


def record_from_json(raw: bytes) -> WorkerRecord:
    """A worker's key as written by record_to_json; ValueError when it is not."""
    try:
        data = orjson.loads(raw)
        worker = str(data["worker"])
        raw_entry = data.get("entry")
        entry = None
        if raw_entry is not None:
            capacity, load = raw_entry["capacity"], raw_entry["load"]
            entry = WorkerEntry(
                worker,
                tuple(str(q) for q in raw_entry["queues"]),
                str(raw_entry["version"]),
                Capacity(
                    int(capacity["cpus"]), int(capacity["memory_mib"]), int(capacity["max_message_bytes"])
                ),
                Load(
                    int(load["in_flight"]),
                    int(load["concurrency"]),
                    int(load["polls"]),
                    int(load["empty_polls"]),
                ),
                _state(raw_entry["state"]),
                _state(raw_entry["desired"]),
                float(raw_entry["interval"]),
                float(raw_entry["first_seen"]),
                float(raw_entry["last_seen"]),
                int(raw_entry["idle_beats"]),
                int(raw_entry["heartbeats"]),
            )
        controls = []
        for row in data.get("controls") or []:
            control = Control.from_row(row)
            control.delivered = int(row.get("delivered") or 0)
            controls.append(control)
        return WorkerRecord(worker, entry, controls)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"unreadable fleet record: {exc}") from None


async def fleet_bucket(js: JetStreamContext, layout: ClusterLayout) -> KeyValue:
    """The cluster's fleet bucket, created when missing (its queue servers create it with the others;
    an edge of a cluster made before the fleet bucket existed creates it itself)."""

    async def bucket() -> KeyValue:
        try:
            return await js.key_value(layout.fleet_bucket)
        except BucketNotFoundError:
            return await js.create_key_value(bucket=layout.fleet_bucket, history=1, replicas=layout.replicas)

    return await retrying(bucket, "the fleet bucket")


class ClusterFleet:
    """The fleet of one edge of a cluster; start after the backend, close before it (and its NATS
    connection)."""

    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        backend: QueueBackend,
        settings: FleetSettings | None = None,
        *,
        events: Callable[[FleetEvent], None] | None = None,
        tick: float = TICK,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.js = js
        self.layout = layout
        self._backend = backend
        self.settings = (settings or FleetSettings()).validate()
        self.events = events
        self.tick = tick
        self.clock = clock  # wall clock: heartbeats' times are compared across edges (keep clocks in sync)
        # The rules, over one worker's (or a queue's workers') state at a time; it keeps the id counter.
        self.machine = Fleet(self.settings, id_prefix=f"{secrets.token_hex(3)}-")
        self._mirror: KvMirror | None = None
        self._decoded: dict[str, tuple[int, WorkerRecord | None]] = {}  # key -> (revision, record)
        self._task: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()  # this edge's writes one at a time: they would only conflict

    @property
    def backend(self) -> QueueBackend:
        return self._backend

    def admin(self) -> FleetAdmin:
        return self

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        bucket = await fleet_bucket(self.js, self.layout)
        self._mirror = KvMirror(bucket, "fleet", self.js, f"KV_{self.layout.fleet_bucket}")
        await self._mirror.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="strictq-fleet")
        log.info(
            "fleet: in the cluster's bucket %s, %d worker(s), %d rebalancing policies",
            self.layout.fleet_bucket,
            len(self._records()),
            len(self._policies()),
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._mirror is not None:
            await self._mirror.stop()

    @property
    def mirror(self) -> KvMirror:
        if self._mirror is None:
            raise Unavailable("the fleet has not started")
        return self._mirror

    # --------------------------------------------------------------------------------------- inputs
    async def heartbeat(self, beat: Heartbeat) -> Answer:
        answer, events = await self._update(beat.worker, lambda m, now: m.heartbeat(beat, now))
        self._publish(events)
        for queue in beat.queues:  # the load just changed: look at once rather than at the next tick
            try:
                await self._rebalance(queue)
            except Unavailable as exc:  # a partition cannot tell its backlog now: the tick looks again
                log.info("fleet: rebalancing %s after a heartbeat: %s", queue, exc)
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
        """An operator's control for each of `workers`, each written to its worker's key before the
        answer. Checked for all of them first (InvalidArgument naming the field, nothing written)."""
        now = self.clock()
        self._load([self._record(w) for w in dict.fromkeys(workers)])
        try:
            self.machine.issue(kind, args, workers, now, ttl=ttl, queue=queue)
        finally:
            self.machine.drain()
        issued: list[Control] = []
        for worker in dict.fromkeys(workers):

            def step(m: Fleet, at: float, w: str = worker) -> list[Control]:
                return m.issue(kind, args, [w], at, ttl=ttl, queue=queue)

            controls, events = await self._update(worker, step)
            issued += controls
            self._publish(events)
        return issued

    async def set_policy(self, queue: str, policy: RebalancePolicy | None) -> None:
        """Set or remove `queue`'s policy (the operator's last word wins: no compare-and-set)."""
        value = None if policy is None else orjson.dumps(policy.validate().to_dict())
        async with self._writing:
            await self._write(policy_key(queue), value, None)

    # ---------------------------------------------------------------------------------------- views
    def has_pending(self, worker: str) -> bool:
        record = self._record(worker)
        now = self.clock()
        return record is not None and any(c.expires_at > now for c in record.controls)

    def version_of(self, worker: str) -> str | None:
        """The software version `worker` runs, as its latest heartbeat said (None: never heard of)."""
        record = self._record(worker)
        return record.entry.version if record is not None and record.entry is not None else None

    def workers(self) -> list[WorkerEntry]:
        """The live workers (not stale), for routing and rollouts."""
        now = self.clock()
        return [
            r.entry for r in self._records() if r.entry is not None and not r.entry.stale(now, self.settings)
        ]

    async def registry(self) -> tuple[list[dict[str, Any]], dict[str, RebalancePolicy]]:
        await self.mirror.caught_up(SYNC_WITHIN)
        self._load(self._records())
        try:
            return self.machine.view(self.clock()), self._policies()
        finally:
            self.machine.drain()  # the view's expiry is the tick's to write

    async def live_targets(self, queue: str, version: str | None) -> list[str]:
        await self.mirror.caught_up(SYNC_WITHIN)
        self._load(self._records())
        return self.machine.targets(queue, version, self.clock())

    # -------------------------------------------------------------------------- the bucket's state
    def _record(self, worker: str) -> WorkerRecord | None:
        return self._decoded_at(worker_key(worker))[1]

    def _decoded_at(self, key: str) -> tuple[int, WorkerRecord | None]:
        """(revision, record) of `key` in this edge's copy; (0, None) when missing. Decoded once per
        revision (polls ask at every answer)."""
        entry = self.mirror.entries.get(key)
        if entry is None:
            self._decoded.pop(key, None)
            return 0, None
        cached = self._decoded.get(key)
        if cached is not None and cached[0] == entry.revision:
            return cached
        try:
            record: WorkerRecord | None = record_from_json(entry.value)
        except ValueError as exc:  # overwritten by the next change of this worker
            log.warning("fleet bucket key %s: %s", key, exc)
            record = None
        self._decoded[key] = (entry.revision, record)
        return entry.revision, record

    def _records(self) -> list[WorkerRecord]:
        found = []
        for key in list(self.mirror.entries):
            if key.startswith(WORKER_PREFIX):
                record = self._decoded_at(key)[1]
                if record is not None:
                    found.append(record)
        return found

    def _policies(self) -> dict[str, RebalancePolicy]:
        found = {}
        for key, entry in list(self.mirror.entries.items()):
            if not key.startswith(POLICY_PREFIX):
                continue
            try:
                found[_decode(key[len(POLICY_PREFIX) :])] = RebalancePolicy.from_dict(
                    orjson.loads(entry.value)
                )
            except (orjson.JSONDecodeError, binascii.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
                log.warning("fleet bucket key %s: unreadable policy (%s)", key, exc)
        return found

    def _load(self, records: Iterable[WorkerRecord | None]) -> Fleet:
        """The machine holding copies of exactly `records` (and the policies), nothing of an earlier
        call (it changes what it holds; the decoded copies stay as the bucket has them)."""
        machine = self.machine
        machine.drain()
        machine.workers, machine.controls = {}, {}
        for original in records:
            if original is None:
                continue
            record = record_from_json(record_to_json(original))
            if record.entry is not None:
                machine.workers[record.worker] = record.entry
            for control in record.controls:
                machine.controls[control.id] = control
        machine.policies = self._policies()
        return machine

    def _unload(self, worker: str) -> WorkerRecord:
        machine = self.machine
        controls = [c for c in machine.controls.values() if c.worker == worker]
        return WorkerRecord(worker, machine.workers.get(worker), controls)

    async def _update[T](self, worker: str, step: Callable[[Fleet, float], T]) -> tuple[T, list[FleetEvent]]:
        """`step` applied to `worker`'s record as this edge's copy holds it, written back only if the
        bucket has not changed since (`_write`); on a conflict (another edge wrote meanwhile) wait for the
        copy to hear it and replay. Returns what `step` returned and the events of the write that landed."""
        key = worker_key(worker)
        async with self._writing:
            for _ in range(CAS_ATTEMPTS):
                base = self.mirror.revision
                record = self._decoded_at(key)[1]
                self._load([record])
                try:
                    result = step(self.machine, self.clock())
                    written = self._unload(worker)
                finally:
                    _, events = self.machine.drain()
                if await self._write(key, record_to_json(written), base):
                    return result, events
            raise Unavailable(f"worker {worker!r}: the fleet bucket kept changing ({CAS_ATTEMPTS} attempts)")

    async def _write(self, key: str, value: bytes | None, base: int | None) -> bool:
        """Put `value` at `key` (None: delete it) if the bucket's stream is still at `base` (its last
        sequence; None: unconditionally). True once written and heard back here; False on a conflict,
        once this copy has caught up with the bucket. Compare-and-set is on the whole bucket's stream
        (`Nats-Expected-Last-Sequence`), not on the key's revision: nats-server 2.9.10 lets concurrent
        writes with the same expected revision of a subject all succeed on a replicated stream (measured:
        20 of 20), while the stream-wide check lets exactly one through. A write JetStream may have taken
        without saying so (a timeout) is not replayed: Unavailable, it may have been applied."""
        headers = {} if base is None else {"Nats-Expected-Last-Sequence": str(base)}
        if value is None:
            headers["KV-Operation"] = "DEL"
        subject = f"$KV.{self.layout.fleet_bucket}.{key}"
        try:
            ack = await self.js.publish(subject, value or b"", headers=headers, timeout=WRITE_TIMEOUT)
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise Unavailable(f"the cluster's fleet bucket refused a write: {exc}") from None
            await self.mirror.caught_up(SYNC_WITHIN)  # another edge's write: hear it, then replay on it
            return False
        except TRANSIENT as exc:
            raise Unavailable(
                f"the cluster's fleet bucket did not answer ({exc!r}); the change may have been made"
            ) from None
        await self.mirror.heard(ack.seq, SYNC_WITHIN)  # this edge's next read sees its own write
        return True

    # ------------------------------------------------------------------------------------- plumbing
    async def _rebalance(self, queue: str) -> None:
        policy = self._policies().get(queue)
        if policy is None or not policy.enabled:
            return
        try:
            metrics = await self.backend.metrics(queue)
        except QueueNotFound:
            return
        self._load(self._records())
        try:
            decided = self.machine.rebalance(queue, metrics.visible, metrics.oldest_age, self.clock())
        finally:
            _, decisions = self.machine.drain()
        for control in decided:  # each written to its worker only if it is still free for it

            def step(m: Fleet, now: float, c: Control = control) -> list[Control]:
                entry = m.workers.get(c.worker)
                busy = any(p.kind in STATE_KINDS for p in m.controls.values() if p.worker == c.worker)
                if entry is None or busy or entry.stale(now, self.settings) or queue not in entry.queues:
                    return []
                return m.issue(
                    c.kind, {}, [c.worker], now, issued_by="rebalance", queue=queue, reason=c.reason
                )

            written, events = await self._update(control.worker, step)
            if written:
                self._publish(
                    [e for e in decisions if e.worker == control.worker and e.event in ("sleep", "wake")]
                )
                self._publish(events)

    async def _expire_and_forget(self) -> None:
        now = self.clock()
        for record in self._records():
            if any(c.expires_at <= now for c in record.controls):
                _, events = await self._update(record.worker, lambda m, at: m.expire(at))
                self._publish(events)
            elif not record.controls and (
                record.entry is None or now - record.entry.last_seen > FORGET_AFTER
            ):
                async with self._writing:  # not if it changed meanwhile (it beat): kept
                    base = self.mirror.revision
                    if self._record(record.worker) == record:
                        await self._write(worker_key(record.worker), None, base)

    def _publish(self, events: Iterable[FleetEvent]) -> None:
        for event in events:
            if self.events is not None:
                self.events(event)
            else:
                log.info("%s worker=%s queue=%s: %s", event.event, event.worker, event.queue, event.reason)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            try:
                await self._expire_and_forget()
                if self._policies():  # decide on what every edge wrote until now
                    await self.mirror.caught_up(SYNC_WITHIN)
                for queue in list(self._policies()):
                    await self._rebalance(queue)
            except Exception:  # JetStream or a partition unreachable now: the next tick tries again
                log.warning("fleet tick failed", exc_info=True)
