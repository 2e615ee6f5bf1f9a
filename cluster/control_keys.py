"""Failure management's keys in the cluster's control bucket (`strictq_control_<id>`, ClusterLayout.
control_bucket), and what a partition's gate makes of them (docs/failure-management.md §3.2).

- `fence.<worker b64>`: `queue_core.fences.Fence.to_dict()`; the decider's have reason `health: …`
  (operators' fences are the control registry's); deleted = unfenced;
- `suspend.<queue b64>`: `{"queue", "reason", "manual", "since"}`: nobody receives from the queue;
- `blacklist.<worker b64>`: `{"worker", "reason", "since", "until", "queue"}`;
- `probe.<probe id>`: `{"id", "queue", "purpose", "worker", "partition", "created"}`: hand the probe out at
  `partition` (to `worker`, or to any worker let through for a suspended queue's);
- `restored.<worker b64>`: `{"worker", "at"}`: its last restore (a takeover does not count its older
  attempts again).

`<… b64>` is the name's UTF-8 as URL-safe base64 without padding (KV keys allow only `[-/_=.A-Za-z0-9]`).
Only health fences (reason `health: …`) hold a worker's deliveries at the gates: an operator's fence acts
at the proxy only, as in one process.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from queue_core.fences import Fence
from queue_core.machine.gate import (
    GateChange,
    PartitionGate,
    ProbeOffered,
    ProbeWithdrawn,
    QueueFreed,
    QueueHeld,
    WorkerFreed,
    WorkerHeld,
)

from . import control_state

HEALTH_REASON = "health: "  # queue_core.failures.REASON_PREFIX
FENCE, SUSPEND, BLACKLIST, PROBE, RESTORED = "fence.", "suspend.", "blacklist.", "probe.", "restored."


def b64(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


def fence_key(worker: str) -> str:
    return control_state.fence_key(worker)  # the control registry's key (one spelling of it)


def suspend_key(queue: str) -> str:
    return SUSPEND + b64(queue)


def blacklist_key(worker: str) -> str:
    return BLACKLIST + b64(worker)


def probe_key(probe_id: str) -> str:
    return PROBE + probe_id


def restored_key(worker: str) -> str:
    return RESTORED + b64(worker)


def probe_value(offer: ProbeOffered) -> bytes:
    return orjson.dumps(
        {
            "id": offer.probe_id,
            "queue": offer.queue,
            "purpose": offer.purpose,
            "worker": offer.worker,
            "partition": offer.partition,
            "created": offer.created,
        }
    )


@dataclass(slots=True)
class ControlState:
    """Failure management's part of the control bucket, read."""

    fences: dict[str, Fence] = field(default_factory=dict)
    suspensions: dict[str, dict[str, Any]] = field(default_factory=dict)
    blacklists: dict[str, dict[str, Any]] = field(default_factory=dict)
    probes: dict[str, ProbeOffered] = field(default_factory=dict)
    restored: dict[str, float] = field(default_factory=dict)

    def health_fences(self) -> dict[str, Fence]:
        return {w: f for w, f in self.fences.items() if f.reason.startswith(HEALTH_REASON)}


def read_state(entries: Mapping[str, bytes]) -> ControlState:
    """The entries (key -> value) of the control bucket, parsed; unreadable ones are skipped."""
    state = ControlState()
    for key, raw in entries.items():
        with contextlib.suppress(ValueError, TypeError, KeyError, orjson.JSONDecodeError):
            data = orjson.loads(raw)
            if key.startswith(FENCE):
                fence = Fence.from_dict(data)
                state.fences[fence.worker] = fence
            elif key.startswith(SUSPEND):
                state.suspensions[str(data["queue"])] = data
            elif key.startswith(BLACKLIST):
                state.blacklists[str(data["worker"])] = data
            elif key.startswith(PROBE):
                worker = data.get("worker")
                state.probes[str(data["id"])] = ProbeOffered(
                    str(data["id"]),
                    str(data["queue"]),
                    str(data["purpose"]),
                    None if worker is None else str(worker),
                    int(data["partition"]),
                    float(data["created"]),
                )
            elif key.startswith(RESTORED):
                state.restored[str(data["worker"])] = float(data["at"])
    return state


def gate_changes(gate: PartitionGate, state: ControlState) -> list[GateChange]:
    """What brings `gate` to `state`: held workers (health fences), suspended queues, this partition's
    probes (a probe a worker has been handed stays until its result, whatever its key says)."""
    changes: list[GateChange] = []
    held = set(state.health_fences())
    changes += [WorkerHeld(w) for w in sorted(held - gate.held)]
    changes += [WorkerFreed(w) for w in sorted(gate.held - held)]
    for queue, row in sorted(state.suspensions.items()):
        manual = row.get("manual") is not False
        current = gate.suspended_queues.get(queue)
        if current is None or current.manual != manual:
            changes.append(QueueHeld(queue, manual))
    changes += [QueueFreed(q) for q in sorted(set(gate.suspended_queues) - set(state.suspensions))]
    mine = {pid: offer for pid, offer in state.probes.items() if offer.partition == gate.partition}
    changes += [offer for pid, offer in sorted(mine.items()) if pid not in gate.probes]
    changes += [ProbeWithdrawn(pid) for pid in sorted(set(gate.probes) - set(mine))]
    return changes


def health_fence_entries(state: ControlState) -> Iterable[tuple[str, str, float]]:
    """(worker, reason without the prefix, since) of the decider's fences in force."""
    for worker, fence in sorted(state.health_fences().items()):
        yield worker, fence.reason[len(HEALTH_REASON) :], fence.since
