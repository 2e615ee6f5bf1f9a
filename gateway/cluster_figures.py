"""A cluster's partitions, owners, epochs and standbys' lag, as the dashboard and `/metrics` of a cluster's
edge show them: the typed reading `strictq cluster status --json` prints, through a small source the
composition root passes in (strictq.cluster_source reads the cluster's KV buckets; the gateway does not
import strictq). Every series here is cluster-wide, without a `tenant` label: operators only
(queue_core.metrics_http), and the dashboard shows the panel to operators only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from queue_core.metrics_http import Collector, ScrapeSource

log = logging.getLogger("strictq.metrics")


@dataclass(frozen=True, slots=True)
class StandbyFigures:
    node: str
    applied: int  # the last stream position it applied
    lag: int | None  # frames behind the stream's end; None: the stream could not be read


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    partition: int
    owner: str | None  # None: no owner now (a failover in progress)
    epoch: int | None
    serving: bool  # the owner is alive, in the assigned incarnation, and serves it
    last_seq: int | None  # the partition stream's last sequence
    standbys: tuple[StandbyFigures, ...]
    moving_to: str | None = None  # a pending move
    region: str = ""


@dataclass(frozen=True, slots=True)
class NodeFigures:
    name: str
    url: str
    alive: bool
    age: float  # seconds since its last heartbeat
    serving: tuple[int, ...]
    region: str = ""


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    cluster: str  # the cluster's id
    replicas: int
    partitions: tuple[PartitionOwner, ...]
    nodes: tuple[NodeFigures, ...]

    @property
    def max_lag(self) -> int | None:
        lags = [s.lag for p in self.partitions for s in p.standbys if s.lag is not None]
        return max(lags) if lags else None


class ClusterSource(Protocol):
    """Where a cluster's edge reads its cluster's state (strictq.cluster_source.KvClusterSource)."""

    async def cluster_figures(self) -> ClusterFigures: ...


class ClusterCollector:
    """The partitions' owners, epochs and standbys' lag, and the nodes' liveness, of one reading."""

    def __init__(self, figures: ClusterFigures | None) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self.figures
        readable = GaugeMetricFamily(
            "strictq_cluster_status_readable",
            "1 when this edge could read the cluster's state for the scrape.",
        )
        readable.add_metric([], 0.0 if figures is None else 1.0)
        yield readable
        if figures is None:
            return
        where = ["partition", "node"]
        epoch = GaugeMetricFamily(
            "strictq_partition_epoch", "The owner's epoch of the partition.", labels=where
        )
        serving = GaugeMetricFamily(
            "strictq_partition_serving", "1 while the partition's owner serves it, 0 otherwise.", labels=where
        )
        last = GaugeMetricFamily(
            "strictq_partition_last_sequence", "The partition stream's last sequence.", labels=["partition"]
        )
        lag = GaugeMetricFamily(
            "strictq_partition_lag",
            "Frames of the partition's stream a standby node has not applied yet.",
            labels=where,
        )
        for p in figures.partitions:
            owner = [str(p.partition), p.owner or ""]
            if p.epoch is not None:
                epoch.add_metric(owner, p.epoch)
            serving.add_metric(owner, 1.0 if p.serving else 0.0)
            if p.last_seq is not None:
                last.add_metric([str(p.partition)], p.last_seq)
            for standby in p.standbys:
                if standby.lag is not None:
                    lag.add_metric([str(p.partition), standby.node], standby.lag)
        yield from (epoch, serving, last, lag)
        alive = GaugeMetricFamily(
            "strictq_node_alive", "1 while the node's heartbeat is fresh.", labels=["node"]
        )
        age = GaugeMetricFamily(
            "strictq_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat.", labels=["node"]
        )
        served = GaugeMetricFamily(
            "strictq_node_partitions_served", "Partitions the node serves now.", labels=["node"]
        )
        for node in figures.nodes:
            alive.add_metric([node.name], 1.0 if node.alive else 0.0)
            age.add_metric([node.name], node.age)
            served.add_metric([node.name], len(node.serving))
        yield from (alive, age, served)


def cluster_metrics(source: ClusterSource) -> ScrapeSource:
    """A scrape's reading of the cluster (an unreadable cluster: strictq_cluster_status_readable 0)."""

    async def read() -> Collector:
        try:
            return ClusterCollector(await source.cluster_figures())
        except (
            Exception
        ) as exc:  # JetStream electing a leader, or out of reach: the queue series still answer
            log.info("metrics: cannot read the cluster's state: %s", exc)
            return ClusterCollector(None)

    return read
