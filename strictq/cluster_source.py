"""The cluster's state for its edge's dashboard and /metrics (gateway.cluster_figures.ClusterSource): the
reading `strictq cluster status` prints (strictq.cluster_view, from the KV buckets and the partition
streams), turned into the gateway's typed figures. The composition root (strictq.serve) passes it to the
gateway, which does not import strictq.
"""

from __future__ import annotations

import asyncio

from nats.js.client import JetStreamContext

from cluster.layout import ClusterLayout
from gateway.cluster_figures import ClusterFigures, NodeFigures, PartitionOwner, StandbyFigures

from .cluster_view import ClusterView, read_view

READ_TIMEOUT = 5.0  # seconds one reading may take (a page refresh or a scrape waits at most this)
FRESH = 1.0  # seconds a reading is reused for: page refreshes, the sampler and scrapes share it


class KvClusterSource:
    def __init__(self, js: JetStreamContext, layout: ClusterLayout, nats: tuple[str, ...] = ()) -> None:
        self._js = js
        self._layout = layout
        self._nats = nats
        self._last: tuple[float, ClusterFigures] | None = None
        self._lock = asyncio.Lock()

    async def cluster_figures(self) -> ClusterFigures:
        """The cluster now (at most FRESH seconds old); TimeoutError, or a NATS error, when JetStream does
        not answer within READ_TIMEOUT."""
        async with self._lock:  # one reading at a time: concurrent callers share it
            loop = asyncio.get_running_loop()
            if self._last is not None and loop.time() - self._last[0] < FRESH:
                return self._last[1]
            view = await asyncio.wait_for(read_view(self._js, self._layout, self._nats), READ_TIMEOUT)
            figures = figures_of(view)
            self._last = (loop.time(), figures)
            return figures


def figures_of(view: ClusterView) -> ClusterFigures:
    return ClusterFigures(
        cluster=view.layout.id,
        replicas=view.layout.replicas,
        partitions=tuple(
            PartitionOwner(
                p.partition,
                p.owner,
                p.epoch,
                p.serving,
                p.last_seq,
                tuple(StandbyFigures(s.node, s.applied, s.lag) for s in p.standbys),
                p.moving_to,
                p.region,
            )
            for p in view.partitions
        ),
        nodes=tuple(NodeFigures(n.name, n.url, n.alive, n.age, n.serving, n.region) for n in view.nodes),
    )
