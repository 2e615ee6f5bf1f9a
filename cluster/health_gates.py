"""A node's gates (docs/failure-management.md §3.2): every partition it serves gets a `PartitionGate`,
brought to the control bucket's state whenever it changes (cluster.control_keys), and what each gate saw
is published to the cluster's health stream for the decider (cluster.decider), in batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import orjson
from nats.js.client import JetStreamContext

from queue_core.machine.gate import GateReport, PartitionGate, ProbeOffered, report_to_json
from queue_core.machine.supervisor import GateReported
from queue_core.service import FailureEffect, QueueService

from .control_keys import gate_changes, read_state
from .kv_mirror import KvMirror
from .layout import ClusterLayout

log = logging.getLogger("strictq.cluster")
MAX_BATCH = 200  # reports per health-stream message
QUEUE_LIMIT = 100_000  # reports waiting to be published: past this, the oldest are dropped (and counted)


class NodeGates:
    def __init__(self, js: JetStreamContext, layout: ClusterLayout, control: KvMirror) -> None:
        self._js = js
        self._layout = layout
        self.control = control
        self._services: dict[int, QueueService] = {}
        self._listeners: dict[int, Callable[[FailureEffect], None]] = {}
        self._pending: list[GateReport] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._apply_forever(), name="strictq-gates"),
            asyncio.create_task(self._publish_forever(), name="strictq-gate-reports"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    # ------------------------------------------------------------------------------------ partitions
    def attach(self, partition: int, service: QueueService) -> None:
        """Before `service.start()`: its supervisor gets a gate, its steps' reports come here."""
        service.supervisor.gate = PartitionGate(partition)

        def heard(effect: FailureEffect) -> None:
            if isinstance(effect, GateReported):
                self._queue(effect.reports)

        self._listeners[partition] = heard
        service.failure_listeners.append(heard)
        self._services[partition] = service

    def started(self, partition: int) -> None:
        """The service is serving: bring its gate to the control state now."""
        service = self._services.get(partition)
        if service is not None:
            self._apply(service)

    def detach(self, partition: int) -> None:
        service = self._services.pop(partition, None)
        listener = self._listeners.pop(partition, None)
        if service is not None and listener in service.failure_listeners:
            service.failure_listeners.remove(listener)

    # -------------------------------------------------------------------------------------- applying
    async def _apply_forever(self) -> None:
        while True:
            await self.control.changed(1.0)
            for service in list(self._services.values()):
                try:
                    self._apply(service)
                except Exception:
                    log.exception("applying failure management's state to a partition")

    def _apply(self, service: QueueService) -> None:
        gate = service.supervisor.gate
        if gate is None or not service.ready:
            return
        state = read_state({key: entry.value for key, entry in self.control.entries.items()})
        changes = gate_changes(gate, state)
        for change in changes:
            service.supervise(service.supervisor.apply_gate, change)
        if changes:
            queues = {c.queue for c in changes if isinstance(c, ProbeOffered)}
            if queues and len(changes) == len(queues):
                for queue in queues:
                    service.wake(queue)  # a probe for a long poll of that queue
            else:
                service.wake()

    # ------------------------------------------------------------------------------------ publishing
    def _queue(self, reports: list[GateReport]) -> None:
        self._pending.extend(reports)
        if len(self._pending) > QUEUE_LIMIT:
            extra = len(self._pending) - QUEUE_LIMIT
            del self._pending[:extra]
            self.dropped += extra
        self._wake.set()

    async def _publish_forever(self) -> None:
        subject = self._layout.health_subject
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                body = orjson.dumps([report_to_json(r) for r in batch])
                try:
                    await self._js.publish(subject, body, timeout=5.0)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("health stream: cannot publish %d report(s): %s; retrying", len(batch), exc)
                    await asyncio.sleep(0.5)
                    continue
                del self._pending[: len(batch)]
