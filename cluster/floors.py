"""Fencing-token floors across a cluster: owners publish them, each gateway's control stream relays them.

The egress proxy refuses a call carrying a lease below its group's floor (docs/control-stream.md). In one
process the core tells the control hub directly; in a cluster the owner of a group's partition raises its
floor, so each node publishes the raises of the partitions it serves on the core-NATS subject
`sq.<cluster>.floors` (coalesced, every FLUSH_EVERY), and the gateway's `ClusterFloors` is the hub's
floor source. Floors only rise and a new owner's tokens are above every earlier owner's (the epoch is in
their high bits), so a floor is never wrong for being late, only late. A gateway that starts asks every
node for all floors of the partitions it serves (`.sync`), and a node that takes a partition over
publishes all of that partition's floors, so a restart or a failover does not leave a proxy with floors
below the real ones for longer than a heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator

import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from queue_core.machine.effects import FloorRaised

from .layout import ClusterLayout

log = logging.getLogger("strictq.cluster")
FLUSH_EVERY = 0.05
MAX_FLOORS_PER_MESSAGE = 5_000  # well under NATS's max_payload


class FloorPublisher:
    """A node's side: hears its partitions' floor raises and publishes them, coalesced."""

    def __init__(
        self, nc: NatsClient, layout: ClusterLayout, current: Callable[[], Iterable[tuple[str, str, int]]]
    ):
        self._nc = nc
        self._layout = layout
        self._current = current  # every floor of the partitions this node serves now
        self._pending: dict[tuple[str, str], int] = {}
        self._flush: asyncio.TimerHandle | None = None
        self._subscription: object | None = None

    async def start(self) -> None:
        self._subscription = await self._nc.subscribe(self._layout.floors_sync_subject, cb=self._on_sync)

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()  # type: ignore[attr-defined]

    def on_floor(self, effect: FloorRaised) -> None:
        """A partition service's floor listener: runs inside every claim, so it only updates a dict."""
        key = (effect.queue, effect.group)
        if effect.token > self._pending.get(key, 0):
            self._pending[key] = effect.token
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(FLUSH_EVERY, self._send_pending)

    def publish_all(self, floors: Iterable[tuple[str, str, int]]) -> None:
        for queue, group, token in floors:
            if token > self._pending.get((queue, group), 0):
                self._pending[queue, group] = token
        self._send_pending()

    def _send_pending(self) -> None:
        self._flush = None
        pending, self._pending = self._pending, {}
        entries = [[queue, group, token] for (queue, group), token in pending.items()]
        for start in range(0, len(entries), MAX_FLOORS_PER_MESSAGE):
            chunk = entries[start : start + MAX_FLOORS_PER_MESSAGE]
            asyncio.get_running_loop().create_task(self._publish(orjson.dumps({"floors": chunk})))

    async def _publish(self, payload: bytes) -> None:
        try:
            await self._nc.publish(self._layout.floors_subject, payload)
        except Exception as exc:  # the next raise or sync sends them again; floors only rise
            log.warning("publishing floors: %s", exc)

    async def _on_sync(self, msg: Msg) -> None:
        self.publish_all(self._current())


class ClusterFloors:
    """A gateway's side: queue_core.control.FloorSource over the floors the cluster's owners publish."""

    def __init__(self, nc: NatsClient, layout: ClusterLayout, clock: Callable[[], float] = time.time) -> None:
        self._nc = nc
        self._layout = layout
        self.clock = clock
        self.floor_listeners: list[Callable[[FloorRaised], None]] = []
        self._floors: dict[tuple[str, str], int] = {}
        # A new instance per gateway start: proxies that reconnect take a snapshot, as after a restart.
        self._instance = int(clock() * 1000)
        self._subscription: object | None = None

    @property
    def epoch(self) -> int:
        return self._instance

    def floors(self) -> Iterator[tuple[str, str, int]]:
        for (queue, group), token in self._floors.items():
            yield queue, group, token

    async def start(self) -> None:
        self._subscription = await self._nc.subscribe(self._layout.floors_subject, cb=self._on_floors)
        await self._nc.publish(self._layout.floors_sync_subject, b"{}")

    async def close(self) -> None:
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()  # type: ignore[attr-defined]

    async def _on_floors(self, msg: Msg) -> None:
        try:
            entries = orjson.loads(msg.data)["floors"]
            raised = [
                FloorRaised(str(queue), str(group), int(token))
                for queue, group, token in entries
                if int(token) > self._floors.get((str(queue), str(group)), 0)
            ]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring an unreadable floors message: %s", exc)
            return
        for effect in raised:
            self._floors[effect.queue, effect.group] = effect.token
            for listener in self.floor_listeners:
                listener(effect)
