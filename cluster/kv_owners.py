"""The gateway's owner map from the cluster's KV buckets: partition -> the internal API of its owner.

Watched, not polled (cluster.kv_mirror): a partition's owner URL is known as soon as the master writes the
assignment and the new owner's heartbeat names it serving. A partition whose assigned node has stopped
heart-beating has no owner (None): the ClusterBackend waits for the master's next assignment, then answers
503 with Retry-After if none comes in its budget.
"""

from __future__ import annotations

import asyncio
import time

from nats.js.client import JetStreamContext

from .kv_mirror import KvMirror
from .layout import ClusterLayout
from .master import live_nodes, read_assignments
from .ownership import NodeInfo

RECOMPUTE_EVERY = 0.05
LOOK_EVERY = 0.25
ROUTE_STALENESS = 30.0


class KvOwnerMap:
    """cluster.owners.OwnerMap over the cluster's `owners` and `nodes` buckets."""

    def __init__(self, js: JetStreamContext, layout: ClusterLayout) -> None:
        self._js = js
        self.layout = layout
        self.partitions = layout.partitions
        self._nodes: KvMirror | None = None
        self._owners: KvMirror | None = None
        self._owners_now: list[NodeInfo | None] = [None] * self.partitions
        self._computed_at = -1.0

    async def start(self) -> None:
        self._nodes = await KvMirror.open(self._js, self.layout.nodes_bucket, "nodes")
        self._owners = await KvMirror.open(self._js, self.layout.owners_bucket, "owners")
        await self._nodes.start()
        await self._owners.start()

    async def close(self) -> None:
        for mirror in (self._nodes, self._owners):
            if mirror is not None:
                await mirror.stop()

    def owner_url(self, partition: int) -> str | None:
        info = self._owner(partition)
        return None if info is None else info.url

    def owner_node(self, partition: int) -> str | None:
        info = self._owner(partition)
        return None if info is None else info.node

    def owner_region(self, partition: int) -> str:
        info = self._owner(partition)
        return "" if info is None else info.region

    def nodes(self, max_age: float = ROUTE_STALENESS) -> dict[str, NodeInfo]:
        """The nodes heart-beating within `max_age` seconds, by name (an edge probes them)."""
        return {} if self._nodes is None else live_nodes(self._nodes, max_age)

    def _owner(self, partition: int) -> NodeInfo | None:
        now = time.monotonic()
        if now - self._computed_at > RECOMPUTE_EVERY:  # parsing the records per request would cost
            self._owners_now = self._compute()
            self._computed_at = now
        return self._owners_now[partition]

    def _compute(self) -> list[NodeInfo | None]:
        owners: list[NodeInfo | None] = [None] * self.partitions
        if self._nodes is None or self._owners is None:
            return owners
        assignments, _ = read_assignments(self._owners)
        # Not the master's short NODE_TTL: while a bucket elects a new leader no heartbeat lands for a few
        # seconds, and every owner would look gone. A dead owner's URL refuses connections at once, which
        # the backend retries until the master's new assignment shows here.
        nodes = live_nodes(self._nodes, ROUTE_STALENESS)
        for partition, assignment in assignments.items():
            info = nodes.get(assignment.node)
            if info is None or info.incarnation != assignment.incarnation or partition not in info.serving:
                continue
            if 0 <= partition < self.partitions:
                owners[partition] = info
        return owners

    async def changed(self, seconds: float, /) -> None:
        """Returns when some partition's owner URL changed, or after `seconds`. Node heartbeats arrive every
        half second whether or not anything moved, so it compares the map rather than waking on each; a
        node that stops heart-beating changes nothing in the buckets, hence the look every LOOK_EVERY."""
        deadline = time.monotonic() + seconds
        before = [self.owner_url(p) for p in range(self.partitions)]
        while (remaining := deadline - time.monotonic()) > 0:
            if self._nodes is None:
                await asyncio.sleep(remaining)
                return
            await self._nodes.changed(min(remaining, LOOK_EVERY))
            self._computed_at = -1.0
            if [self.owner_url(p) for p in range(self.partitions)] != before:
                return

    async def refresh(self) -> None:
        """The mirrors follow the buckets by themselves: just recompute from them at the next look."""
        self._computed_at = -1.0
