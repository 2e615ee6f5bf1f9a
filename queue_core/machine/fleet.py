"""The worker fleet's registry and control messages, sans-I/O (docs/fleet.md).

Workers send heartbeats (their queues, version, declared capabilities and load); the registry keeps the
newest per worker (the API key's id: processes sharing a credential are one worker) and calls a worker
stale after `stale_intervals` of its heartbeat interval without one. Operators (and rebalancing,
queue_core.machine.rebalance) issue control messages to workers: each is pending until the worker
acknowledges it (`applied`, `refused` or `failed`) on a later heartbeat, or until it expires. Every
heartbeat's answer carries the worker's pending controls (again, until acknowledged: the SDK applies each
id once), the interval and the worker's desired state.

Everything here takes `now` explicitly and returns what must be stored (`FleetControlSaved`,
`FleetPolicySaved`) and published (`FleetEvent`) through `drain()`; the shell (queue_core.fleet) does the
I/O. Names of queues are the core's (`t1.orders`); tenancy is the shell's concern.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .effects import FleetControlSaved, FleetPolicySaved
from .errors import InvalidArgument
from .rebalance import RebalancePolicy, decide

State = Literal["active", "sleeping", "draining", "drained"]
STATES: tuple[State, ...] = ("active", "sleeping", "draining", "drained")
KINDS = ("config", "log_level", "drain", "sleep", "wake", "upgrade")
ACK_STATUSES = ("applied", "refused", "failed")
# The Worker settings a `config` control may change at run time: (type, low, high); the SDK checks again.
CONFIG_KEYS: dict[str, tuple[type, float, float]] = {
    "concurrency": (int, 1, 1000),
    "limit": (int, 1, 1000),
    "ttl": (float, 0.1, 3600.0),
    "wait": (float, 0.0, 20.0),
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_TEXT = 500  # versions, details, reasons
MAX_VERSION = 64
MAX_ARGS_BYTES = 4096  # an upgrade's operator arguments, as JSON
MAX_QUEUES = 64  # queues one heartbeat names
MAX_ACKS = 100
MAX_PENDING = 100  # pending controls per worker: more is an operator's loop gone wrong
STATE_KINDS: dict[str, State] = {"sleep": "sleeping", "wake": "active", "drain": "draining"}


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """`stale_intervals`: heartbeats a worker may miss before it counts as gone; `control_ttl`: how long
    an issued control waits for its worker (seconds); `min_interval`/`max_interval`: the heartbeat
    intervals the service accepts (a worker's is clamped into them)."""

    stale_intervals: float = 3.0
    control_ttl: float = 3600.0
    min_interval: float = 0.05
    max_interval: float = 300.0

    def validate(self) -> FleetSettings:
        for name in ("stale_intervals", "control_ttl", "min_interval", "max_interval"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"fleet setting {name} must be a positive number, got {value!r}")
        if self.stale_intervals < 1:
            raise ValueError("fleet setting stale_intervals must be at least 1")
        if self.min_interval > self.max_interval:
            raise ValueError("fleet setting min_interval must not exceed max_interval")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a worker declares it has: CPUs, memory and the largest message body it accepts."""

    cpus: int = 1
    memory_mib: int = 0
    max_message_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "memory_mib": self.memory_mib, "max_message_bytes": self.max_message_bytes}


@dataclass(frozen=True, slots=True)
class Load:
    """A worker's load at its heartbeat: messages in flight of its concurrency, and its polls since the
    previous heartbeat (how many came back empty)."""

    in_flight: int = 0
    concurrency: int = 1
    polls: int = 0
    empty_polls: int = 0

    @property
    def idle(self) -> bool:
        """Nothing in flight and no poll since the last heartbeat brought a message (a worker backing off
        after empty polls, or long-polling, may have made none): it had nothing to do."""
        return self.in_flight == 0 and self.empty_polls >= self.polls

    def to_dict(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "concurrency": self.concurrency,
            "polls": self.polls,
            "empty_polls": self.empty_polls,
            "utilisation": round(self.in_flight / self.concurrency, 3) if self.concurrency else 0.0,
        }


@dataclass(frozen=True, slots=True)
class ControlAck:
    """A worker's answer to one control: `applied` (with what it did: `detail`, and for an upgrade the
    `version` it now runs), `refused` (it will not: unknown kind, bad arguments, no upgrade hook) or
    `failed` (it tried: the hook raised)."""

    id: str
    status: str
    detail: str = ""
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    worker: str
    queues: tuple[str, ...]
    version: str = ""
    capacity: Capacity = Capacity()
    load: Load = Load()
    state: State = "active"
    interval: float = 5.0
    acks: tuple[ControlAck, ...] = ()


@dataclass(slots=True)
class Control:
    """One control message for one worker; durable (its row) until acknowledged or expired."""

    id: str
    worker: str
    kind: str
    args: dict[str, Any]
    issued_at: float
    expires_at: float
    issued_by: str = "operator"  # operator | rebalance
    queue: str | None = None  # the queue it was issued for (a target by queue, rebalancing)
    reason: str = ""
    delivered: int = 0  # heartbeat answers that carried it (not stored: informational)

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "worker": self.worker,
            "kind": self.kind,
            "args": self.args,
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
            "issued_by": self.issued_by,
            "queue": self.queue,
            "reason": self.reason,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Control:
        return cls(
            id=str(row["id"]),
            worker=str(row["worker"]),
            kind=str(row["kind"]),
            args=dict(row.get("args") or {}),
            issued_at=float(row["issued_at"]),
            expires_at=float(row["expires_at"]),
            issued_by=str(row.get("issued_by") or "operator"),
            queue=row.get("queue"),
            reason=str(row.get("reason") or ""),
        )

    def to_wire(self) -> dict[str, Any]:
        """As a heartbeat answer carries it to the worker."""
        return {
            "id": self.id,
            "kind": self.kind,
            "args": self.args,
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.to_row(), "delivered": self.delivered}


@dataclass(slots=True)
class WorkerEntry:
    """The registry's view of one worker."""

    worker: str
    queues: tuple[str, ...]
    version: str
    capacity: Capacity
    load: Load
    state: State  # as the worker reported it
    desired: State  # what the service wants (sleep/wake/drain controls move it)
    interval: float
    first_seen: float
    last_seen: float
    idle_beats: int = 0  # heartbeats in a row that found it idle (Load.idle)
    heartbeats: int = 0

    def stale(self, now: float, settings: FleetSettings) -> bool:
        return now - self.last_seen > self.interval * settings.stale_intervals

    def to_dict(self, now: float, settings: FleetSettings) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "queues": list(self.queues),
            "version": self.version,
            "capabilities": self.capacity.to_dict(),
            "load": self.load.to_dict(),
            "state": self.state,
            "desired": self.desired,
            "interval": self.interval,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "age": max(now - self.last_seen, 0.0),
            "stale": self.stale(now, settings),
            "idle_beats": self.idle_beats,
            "heartbeats": self.heartbeats,
        }


@dataclass(frozen=True, slots=True)
class FleetEvent:
    """Something to publish (`strictq status`, a wire-log `event` record): a control applied, refused,
    failed or expired; a rebalancing decision (`sleep`, `wake`)."""

    event: str
    reason: str
    at: float
    worker: str | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """A heartbeat's answer: the worker's pending controls, the interval to beat at, its desired state."""

    worker: str
    controls: tuple[Control, ...]
    interval: float
    state: State

    def to_wire(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "interval": self.interval,
            "state": self.state,
            "controls": [c.to_wire() for c in self.controls],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Answer:
        """An answer as the queue server's internal API sends it (to a gateway in front of it)."""
        controls = tuple(
            Control(
                id=str(c["id"]),
                worker=str(data["worker"]),
                kind=str(c["kind"]),
                args=dict(c.get("args") or {}),
                issued_at=float(c["issued_at"]),
                expires_at=float(c["expires_at"]),
            )
            for c in data.get("controls") or []
        )
        state = data.get("state")
        return cls(
            str(data["worker"]), controls, float(data["interval"]), state if state in STATES else "active"
        )


FleetEffect = FleetControlSaved | FleetPolicySaved


def check_control(kind: Any, args: Any) -> tuple[str, dict[str, Any]]:
    """A control's kind and arguments as the service accepts them; InvalidArgument naming the field."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {', '.join(KINDS)}", field="kind")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidArgument("args must be a JSON object", field="args")
    if kind == "config":
        if not args:
            raise InvalidArgument(f"config needs at least one of {', '.join(CONFIG_KEYS)}", field="args")
        return kind, check_config(args, "args")
    if kind == "log_level":
        level = args.get("level")
        extra = sorted(set(args) - {"level"})
        if extra:
            raise InvalidArgument(f"log_level takes only `level`, not {extra[0]!r}", field=f"args.{extra[0]}")
        if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
            raise InvalidArgument(f"args.level must be one of {', '.join(LOG_LEVELS)}", field="args.level")
        return kind, {"level": level.upper()}
    if kind == "upgrade":
        version = args.get("version")
        extra = sorted(set(args) - {"version", "args"})
        if extra:
            raise InvalidArgument(
                f"upgrade takes `version` and `args`, not {extra[0]!r}", field=f"args.{extra[0]}"
            )
        if not isinstance(version, str) or not 1 <= len(version) <= MAX_VERSION or not version.isprintable():
            raise InvalidArgument(
                f"args.version must be 1-{MAX_VERSION} printable characters", field="args.version"
            )
        hook_args = args.get("args", {})
        if not isinstance(hook_args, dict):
            raise InvalidArgument(
                "args.args (the upgrade hook's arguments) must be a JSON object", field="args.args"
            )
        if len(repr(hook_args)) > MAX_ARGS_BYTES:
            raise InvalidArgument(f"args.args is over {MAX_ARGS_BYTES} bytes", field="args.args")
        return kind, {"version": version, "args": hook_args}
    if args:  # drain, sleep, wake take nothing
        name = sorted(args)[0]
        raise InvalidArgument(f"{kind} takes no arguments, got {name!r}", field=f"args.{name}")
    return kind, {}


def check_config(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Allow-listed Worker settings with values in range (see CONFIG_KEYS); InvalidArgument naming
    `<where>.<key>` otherwise. Shared with the SDK's own check."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in CONFIG_KEYS:
            raise InvalidArgument(
                f"{key!r} is not a setting a control may change ({', '.join(CONFIG_KEYS)})",
                field=f"{where}.{key}",
            )
        kind, low, high = CONFIG_KEYS[key]
        number_ok = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
            number_ok = False
        if not number_ok or not math.isfinite(value) or not low <= value <= high:
            what = "an integer" if kind is int else "a number"
            raise InvalidArgument(
                f"{where}.{key} must be {what} from {low:g} to {high:g}", field=f"{where}.{key}"
            )
        out[key] = int(value) if kind is int else float(value)
    return out


class Fleet:
    """The registry of workers, their pending controls and the queues' rebalancing policies."""

    def __init__(self, settings: FleetSettings | None = None, id_prefix: str = "") -> None:
        self.settings = (settings or FleetSettings()).validate()
        self.id_prefix = id_prefix  # unique across restarts (the shell passes the store's epoch)
        self.workers: dict[str, WorkerEntry] = {}
        self.controls: dict[str, Control] = {}  # pending, by id, in issue order
        self.policies: dict[str, RebalancePolicy] = {}
        self._n = 0
        self._effects: list[FleetEffect] = []
        self._events: list[FleetEvent] = []

    # ------------------------------------------------------------------------------------- state
    def restore(
        self, controls: Iterable[Mapping[str, Any]], policies: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """What the store kept: pending controls (in issue order) and policies."""
        for row in sorted(controls, key=lambda r: (float(r.get("issued_at", 0)), str(r.get("id")))):
            control = Control.from_row(row)
            self.controls[control.id] = control
        for queue, policy in policies.items():
            self.policies[queue] = RebalancePolicy.from_dict(policy)

    def drain(self) -> tuple[list[FleetEffect], list[FleetEvent]]:
        """What the last operations decided: rows to store, events to publish."""
        effects, self._effects = self._effects, []
        events, self._events = self._events, []
        return effects, events

    def version_of(self, worker: str) -> str | None:
        """The software version `worker` last reported (None: never heard of)."""
        entry = self.workers.get(worker)
        return entry.version if entry is not None else None

    def live(self, now: float) -> list[WorkerEntry]:
        return [w for w in self.workers.values() if not w.stale(now, self.settings)]

    def pending(self, worker: str) -> list[Control]:
        return [c for c in self.controls.values() if c.worker == worker]

    def has_pending(self, worker: str, now: float) -> bool:
        return any(c.worker == worker and c.expires_at > now for c in self.controls.values())

    def view(self, now: float) -> list[dict[str, Any]]:
        """Every known worker, with its pending controls (workers that never beat but have controls too)."""
        self.expire(now)
        rows: dict[str, dict[str, Any]] = {
            name: entry.to_dict(now, self.settings) for name, entry in sorted(self.workers.items())
        }
        for control in self.controls.values():
            row = rows.setdefault(
                control.worker, {"worker": control.worker, "state": "unknown", "queues": []}
            )
            row.setdefault("pending", []).append(control.to_dict())
        for row in rows.values():
            row.setdefault("pending", [])
        return list(rows.values())

    # -------------------------------------------------------------------------------- heartbeats
    def heartbeat(self, beat: Heartbeat, now: float) -> Answer:
        """Record a heartbeat, take its acknowledgements, and answer with what is pending for it."""
        self.expire(now)
        interval = min(max(beat.interval, self.settings.min_interval), self.settings.max_interval)
        entry = self.workers.get(beat.worker)
        if entry is None:
            entry = WorkerEntry(
                beat.worker,
                beat.queues,
                beat.version,
                beat.capacity,
                beat.load,
                beat.state,
                beat.state,  # after a restart the service adopts what the worker does
                interval,
                now,
                now,
            )
            self.workers[beat.worker] = entry
        entry.queues, entry.version, entry.capacity = beat.queues, beat.version, beat.capacity
        entry.load, entry.state, entry.interval, entry.last_seen = beat.load, beat.state, interval, now
        entry.heartbeats += 1
        entry.idle_beats = entry.idle_beats + 1 if beat.load.idle and beat.state == "active" else 0
        for ack in beat.acks:
            self._acknowledged(entry, ack, now)
        pending = tuple(self.pending(beat.worker))
        for control in pending:
            control.delivered += 1
        return Answer(beat.worker, pending, interval, entry.desired)

    def _acknowledged(self, entry: WorkerEntry, ack: ControlAck, now: float) -> None:
        control = self.controls.get(ack.id)
        if control is None or control.worker != entry.worker:
            return  # acknowledged before (the SDK reports once more after a lost answer) or expired
        del self.controls[ack.id]
        self._effects.append(FleetControlSaved(ack.id, None))
        detail = f": {ack.detail}" if ack.detail else ""
        if ack.status == "applied":
            if control.kind in STATE_KINDS:
                entry.desired = "drained" if control.kind == "drain" else STATE_KINDS[control.kind]
                entry.state = entry.desired
                entry.idle_beats = 0
            if control.kind == "upgrade" and ack.version:
                entry.version = ack.version
        elif control.kind in STATE_KINDS:
            entry.desired = entry.state  # it did not move: the service wants what it does
        event = f"control-{ack.status}"
        queue = control.queue or (entry.queues[0] if entry.queues else None)
        self._events.append(
            FleetEvent(event, f"{control.kind} {control.id}{detail}", now, entry.worker, queue)
        )

    # ---------------------------------------------------------------------------------- controls
    def issue(
        self,
        kind: str,
        args: Mapping[str, Any] | None,
        workers: Sequence[str],
        now: float,
        *,
        ttl: float | None = None,
        issued_by: str = "operator",
        queue: str | None = None,
        reason: str = "",
    ) -> list[Control]:
        """One control of `kind` per worker (checked: InvalidArgument naming the field); durable from the
        shell's next commit on."""
        kind, checked = check_control(kind, dict(args) if args is not None else None)
        if ttl is None:
            ttl = self.settings.control_ttl
        if (
            isinstance(ttl, bool)
            or not isinstance(ttl, int | float)
            or not math.isfinite(ttl)
            or not 0 < ttl <= 7 * 86400
        ):
            raise InvalidArgument("ttl must be a number of seconds from 0 to 604800 (7 days)", field="ttl")
        if not workers:
            raise InvalidArgument("no worker to send it to", field="workers")
        for worker in workers:
            if len(self.pending(worker)) >= MAX_PENDING:
                raise InvalidArgument(
                    f"worker {worker!r} has {MAX_PENDING} controls pending already", field="workers"
                )
        issued: list[Control] = []
        for worker in dict.fromkeys(workers):
            self._n += 1
            control = Control(
                f"{self.id_prefix}{self._n}",
                worker,
                kind,
                dict(checked),
                now,
                now + ttl,
                issued_by,
                queue,
                reason,
            )
            self.controls[control.id] = control
            self._effects.append(FleetControlSaved(control.id, control.to_row()))
            entry = self.workers.get(worker)
            if entry is not None and kind in STATE_KINDS:
                entry.desired = STATE_KINDS[kind]
            issued.append(control)
        return issued

    def targets(self, queue: str, version: str | None, now: float) -> list[str]:
        """The live workers that named `queue` in their latest heartbeat (of `version`, when given)."""
        return sorted(
            w.worker
            for w in self.live(now)
            if queue in w.queues and (version is None or w.version == version)
        )

    def expire(self, now: float) -> None:
        for control in [c for c in self.controls.values() if c.expires_at <= now]:
            del self.controls[control.id]
            self._effects.append(FleetControlSaved(control.id, None))
            entry = self.workers.get(control.worker)
            if entry is not None and control.kind in STATE_KINDS:
                entry.desired = entry.state
            self._events.append(
                FleetEvent(
                    "control-expired",
                    f"{control.kind} {control.id}: not acknowledged within its ttl",
                    now,
                    control.worker,
                    control.queue,
                )
            )

    # -------------------------------------------------------------------------------- rebalancing
    def set_policy(self, queue: str, policy: RebalancePolicy | None) -> None:
        if policy is None:
            self.policies.pop(queue, None)
            self._effects.append(FleetPolicySaved(queue, None))
        else:
            self.policies[queue] = policy.validate()
            self._effects.append(FleetPolicySaved(queue, policy.to_dict()))

    def rebalance(self, queue: str, backlog: int, oldest_age: float, now: float) -> list[Control]:
        """Apply `queue`'s policy (none or disabled: nothing) to its live workers given its backlog (messages
        ready to deliver) and the age of its oldest message; issues sleep/wake controls, with events."""
        policy = self.policies.get(queue)
        if policy is None or not policy.enabled:
            return []
        self.expire(now)
        busy = {c.worker for c in self.controls.values() if c.kind in STATE_KINDS}
        workers = [w for w in self.live(now) if queue in w.queues and w.worker not in busy]
        decision = decide(policy, workers, backlog, oldest_age)
        issued: list[Control] = []
        for worker in decision.sleep:
            issued += self.issue(
                "sleep", {}, [worker], now, issued_by="rebalance", queue=queue, reason=decision.reason
            )
            self._events.append(FleetEvent("sleep", decision.reason, now, worker, queue))
        for worker in decision.wake:
            issued += self.issue(
                "wake", {}, [worker], now, issued_by="rebalance", queue=queue, reason=decision.reason
            )
            self._events.append(FleetEvent("wake", decision.reason, now, worker, queue))
        return issued


# ------------------------------------------------------------------------------------- wire format
def heartbeat_from_json(worker: str, data: Any, queue_name: Callable[[str], str]) -> Heartbeat:
    """`POST /fleet/v1/heartbeat`'s body (docs/fleet.md) as a Heartbeat; InvalidArgument naming the
    field. `queue_name`: the core's name of a queue the worker names (raises for names it may not use)."""
    if not isinstance(data, dict):
        raise InvalidArgument("the body must be a JSON object", field="body")
    known = {"queues", "version", "interval", "capabilities", "load", "state", "acks"}
    for name in data:
        if name not in known:
            raise InvalidArgument(f"unknown field {str(name)[:40]!r}", field=str(name)[:40])
    queues = data.get("queues", [])
    if (
        not isinstance(queues, list)
        or not all(isinstance(q, str) and q for q in queues)
        or len(queues) > MAX_QUEUES
    ):
        raise InvalidArgument(f"queues must be a list of up to {MAX_QUEUES} queue names", field="queues")
    version = data.get("version", "")
    if not isinstance(version, str) or len(version) > MAX_VERSION or not version.isprintable():
        raise InvalidArgument(
            f"version must be text of at most {MAX_VERSION} printable characters", field="version"
        )
    interval = _number(data.get("interval", 5.0), "interval", 0.001, 3600.0)
    state = data.get("state", "active")
    if state not in STATES:
        raise InvalidArgument(f"state must be one of {', '.join(STATES)}", field="state")
    caps = _object(data.get("capabilities", {}), "capabilities", {"cpus", "memory_mib", "max_message_bytes"})
    capacity = Capacity(
        cpus=_integer(caps.get("cpus", 1), "capabilities.cpus", 1, 65536),
        memory_mib=_integer(caps.get("memory_mib", 0), "capabilities.memory_mib", 0, 1 << 40),
        max_message_bytes=_integer(
            caps.get("max_message_bytes", 0), "capabilities.max_message_bytes", 0, 1 << 40
        ),
    )
    raw_load = _object(data.get("load", {}), "load", {"in_flight", "concurrency", "polls", "empty_polls"})
    load = Load(
        in_flight=_integer(raw_load.get("in_flight", 0), "load.in_flight", 0, 1 << 31),
        concurrency=_integer(raw_load.get("concurrency", 1), "load.concurrency", 1, 1 << 31),
        polls=_integer(raw_load.get("polls", 0), "load.polls", 0, 1 << 31),
        empty_polls=_integer(raw_load.get("empty_polls", 0), "load.empty_polls", 0, 1 << 31),
    )
    raw_acks = data.get("acks", [])
    if not isinstance(raw_acks, list) or len(raw_acks) > MAX_ACKS:
        raise InvalidArgument(f"acks must be a list of up to {MAX_ACKS} objects", field="acks")
    acks = []
    for index, raw in enumerate(raw_acks):
        where = f"acks[{index}]"
        item = _object(raw, where, {"id", "status", "detail", "version"})
        ack_id, status, detail = item.get("id"), item.get("status"), item.get("detail", "")
        if not isinstance(ack_id, str) or not 1 <= len(ack_id) <= 64:
            raise InvalidArgument(f"{where}.id must be a control id", field=f"{where}.id")
        if status not in ACK_STATUSES:
            raise InvalidArgument(
                f"{where}.status must be one of {', '.join(ACK_STATUSES)}", field=f"{where}.status"
            )
        if not isinstance(detail, str):
            raise InvalidArgument(f"{where}.detail must be text", field=f"{where}.detail")
        ack_version = item.get("version")
        if ack_version is not None and (not isinstance(ack_version, str) or len(ack_version) > MAX_VERSION):
            raise InvalidArgument(
                f"{where}.version must be text of at most {MAX_VERSION} characters", field=f"{where}.version"
            )
        acks.append(ControlAck(ack_id, status, detail[:MAX_TEXT], ack_version))
    names = tuple(dict.fromkeys(queue_name(q) for q in queues))
    return Heartbeat(worker, names, version, capacity, load, state, interval, tuple(acks))


def _object(value: Any, where: str, known: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where} must be a JSON object", field=where)
    for name in value:
        if name not in known:
            raise InvalidArgument(
                f"{where}: unknown field {str(name)[:40]!r}", field=f"{where}.{str(name)[:40]}"
            )
    return value


def _integer(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{where} must be an integer from {low} to {high}", field=where)
    return value


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{where} must be a number", field=where)
    if not low <= value <= high:
        raise InvalidArgument(f"{where} must be from {low:g} to {high:g}", field=where)
    return float(value)


def heartbeat_to_json(beat: Heartbeat) -> dict[str, Any]:
    """A parsed heartbeat for the queue server's internal API: `heartbeat_from_json`'s body (queues by
    their core names) plus `worker`."""
    return {
        "worker": beat.worker,
        "queues": list(beat.queues),
        "version": beat.version,
        "interval": beat.interval,
        "capabilities": beat.capacity.to_dict(),
        "load": {
            "in_flight": beat.load.in_flight,
            "concurrency": beat.load.concurrency,
            "polls": beat.load.polls,
            "empty_polls": beat.load.empty_polls,
        },
        "state": beat.state,
        "acks": [
            {
                "id": a.id,
                "status": a.status,
                "detail": a.detail,
                **({"version": a.version} if a.version else {}),
            }
            for a in beat.acks
        ],
    }
