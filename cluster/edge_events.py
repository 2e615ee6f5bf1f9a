"""Events decided at an edge, into the cluster's events (`SQ_<id>_EVENTS`, cluster.layout), by the decider.

Why: failure management's events are the decider's (cluster.decider), but some are decided elsewhere: the
fleet's (`control-applied` / `-refused` / `-failed` / `-expired`, `sleep`, `wake`: cluster.fleet_kv) at
whichever edge heard the heartbeat or ran the tick. One process records them beside failure management's
own (queue_core.fleet -> FailureManager.record); in a cluster the edge hands them to the decider (`record`,
cluster.decider_client), which publishes them to the events stream beside its own, so `strictq status` and
`/admin/v1/events` at every edge show them, numbered in the one sequence. Not published by the edge
itself: a gateway's NATS user may not publish events (cluster.nats_roles), and the decider accepts only
the fleet's kinds from an edge.

Sending is off the caller's path (the fleet's step is synchronous): one sender task, in order, each event
answered by the decider or logged as lost (none holds it for longer than the client waits, or failure
management is off); `close` sends what is queued first (bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from queue_core.machine.fleet import FleetEvent
from queue_core.machine.health import Decision

from .decider_client import DeciderClient

log = logging.getLogger("strictq.health")
MAX_QUEUED = 10_000  # events waiting for the decider; past it (none for long) they are logged only
CLOSE_WITHIN = 5.0  # seconds close() waits for the queued events to be sent


class EdgeEvents:
    def __init__(self, client: DeciderClient) -> None:
        self._client = client
        # Each event with its id: the decider publishes it with that id, so a retry (an answer lost in a
        # slow publish) is dropped by JetStream instead of published twice.
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(MAX_QUEUED)
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def fleet(self, event: FleetEvent) -> None:
        """A fleet event (cluster.fleet_kv's `events` callback)."""
        self.record(Decision(event.event, event.reason, event.at, worker=event.worker, queue=event.queue))

    def record(self, decision: Decision) -> None:
        log.info("%s", decision.summary())
        if self._closed:
            log.warning("edge closing: event %s only logged", decision.event)
            return
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._send(), name="strictq-edge-events")
        try:
            self._queue.put_nowait((secrets.token_hex(12), decision.to_event()))
        except asyncio.QueueFull:
            log.warning("no decider for long: event %s only logged", decision.event)

    async def _send(self) -> None:
        while True:
            event_id, event = await self._queue.get()
            try:
                await self._client.request("record", event=event, id=event_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("event %s not in the cluster's events: %s", event.get("event"), exc)
            finally:
                self._queue.task_done()

    async def close(self) -> None:
        self._closed = True
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), CLOSE_WITHIN)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
