"""The queues' Prometheus collector: every queue's gauges and counters, fences and held workers, read at
scrape time through the backend port (`QueueBackend.figures`, queue_core.figures), so the same series come
from a gateway with the core in process, in front of a queue server, or of a cluster (summed over the
partitions, plus per owner node and per partition), and from the queue servers themselves. No background
thread, no global registry: each app has its own, so several apps can share one process.

Series carry `tenant`, `face` and `queue` as the tenant names the queue (access.tenancy): `acme.orders` is
tenant `acme`, face `queue`, queue `orders`; `acme_dedupq.orders` the same on face `dedupq`; a queue of the
queue server's internal API (no '.') has tenant "". Who may see which series: queue_core.metrics_http.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from access import tenancy
from access.keys import KeyRing

from .backend import QueueBackend
from .control import ControlHub
from .fences import Fence
from .figures import Figures
from .machine import QueueError
from .machine.gauges import QueueGauges
from .metrics_http import Collector, ScrapeSource, add_metrics_route

log = logging.getLogger("strictq.metrics")
QUEUE_LABELS = ["tenant", "face", "queue"]
GROUP_LABELS = [*QUEUE_LABELS, "group"]

# (name, help, how to read it) of the per-queue series; the type is in the table each sits in.
QueueValue = Callable[[QueueGauges], float]
QUEUE_GAUGES: tuple[tuple[str, str, QueueValue], ...] = (
    (
        "strictq_queue_visible_messages",
        "Messages a receive could claim now or once their group frees.",
        lambda g: g.visible,
    ),
    (
        "strictq_queue_in_flight_messages",
        "Messages claimed and not yet acknowledged or released.",
        lambda g: g.in_flight,
    ),
    ("strictq_queue_delayed_messages", "Messages whose delay has not passed yet.", lambda g: g.delayed),
    ("strictq_queue_groups", "Groups with at least one message or claim.", lambda g: g.groups),
    (
        "strictq_queue_oldest_message_age_seconds",
        "Age of the oldest message (0 when empty).",
        lambda g: g.oldest_age,
    ),
    (
        "strictq_queue_oldest_unattempted_age_seconds",
        "AgeOfFirstAttempt: age of the oldest deliverable message no worker has attempted yet (0: none).",
        lambda g: g.oldest_unattempted_age,
    ),
    (
        "strictq_queue_first_attempt_wait_seconds",
        "How long the latest message to get its first attempt had waited since it was sent.",
        lambda g: g.first_attempt_wait,
    ),
)
QUEUE_COUNTERS: tuple[tuple[str, str, QueueValue], ...] = (
    ("strictq_queue_sent_messages", "Messages accepted since the process started.", lambda g: g.sent),
    (
        "strictq_queue_received_messages",
        "Deliveries (claims of a message) since the process started.",
        lambda g: g.received,
    ),
    (
        "strictq_queue_deleted_messages",
        "Messages deleted (acknowledged, purged, expired) since start.",
        lambda g: g.deleted,
    ),
    (
        "strictq_queue_dead_lettered_messages",
        "Messages moved to the dead-letter queue since start.",
        lambda g: g.dead_lettered,
    ),
    (
        "strictq_queue_expired_messages",
        "Messages past the queue's TTL or retention (dropped or dead-lettered) since start.",
        lambda g: g.expired,
    ),
    (
        "strictq_queue_sidelined_groups",
        "Groups moved whole to the spillover lane (over their tenant's rate, or too old) since start.",
        lambda g: g.sidelined,
    ),
    (
        "strictq_queue_empty_receives",
        "Receives (a long poll: its whole wait) that returned no message.",
        lambda g: g.empty_receives,
    ),
)


def queue_labels(queue: str) -> list[str]:
    """[tenant, face, queue] of a core queue name (see the module docstring)."""
    space, name = tenancy.split(queue)
    if space is None:
        return ["", tenancy.DEFAULT_FACE, name]
    tenant, underscore, suffix = space.partition("_")
    faces = {s: f for f, s in tenancy.FACE_SUFFIXES.items()}
    return [tenant, faces.get(underscore + suffix, suffix), name]


class CoreCollector:
    """A `prometheus_client` collector over one read of the queues' figures (queue_core.figures, read
    through the backend port for this scrape: in process, from a queue server, summed over a cluster's
    partitions) and the fences of `fences` (None: no fences here, e.g. a gateway in front of a queue
    server, whose own /metrics has them)."""

    def __init__(self, figures: Figures, fences: Sequence[Fence] | None, keys: KeyRing) -> None:
        self.figures = figures
        self.fences = fences
        self.keys = keys

    def collect(self) -> Iterator[Metric]:
        figures = self.figures
        if not figures.ready:
            return  # the store is not open yet (or any more): nothing true to say
        queues = figures.queues
        labels = {q.name: queue_labels(q.name) for q in queues}
        for name, doc, value in QUEUE_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=QUEUE_LABELS)
            for q in queues:
                gauge.add_metric(labels[q.name], value(q.gauges))
            yield gauge
        for name, doc, value in QUEUE_COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=QUEUE_LABELS)
            for q in queues:
                counter.add_metric(labels[q.name], value(q.gauges))
            yield counter
        suspended = GaugeMetricFamily(
            "strictq_queue_suspended",
            "1 while failure management or an operator suspends the queue.",
            labels=QUEUE_LABELS,
        )
        parked = GaugeMetricFamily(
            "strictq_queue_parked_groups", "Groups parked by the retry workflow.", labels=QUEUE_LABELS
        )
        for q in queues:
            suspended.add_metric(labels[q.name], 1.0 if q.suspended else 0.0)
            parked.add_metric(labels[q.name], q.parked_count)
        yield suspended
        yield parked
        backlog = GaugeMetricFamily(
            "strictq_group_backlog_messages",
            "Messages of the queue's groups with the largest backlog (the top 5 of each queue).",
            labels=GROUP_LABELS,
        )
        group_age = GaugeMetricFamily(
            "strictq_group_oldest_message_age_seconds",
            "Age of the oldest message of those top groups.",
            labels=GROUP_LABELS,
        )
        for q in queues:
            for group in q.gauges.top_groups:
                backlog.add_metric([*labels[q.name], group.name], group.messages)
                group_age.add_metric([*labels[q.name], group.name], group.oldest_age)
        yield backlog
        yield group_age
        yield from self._workers()
        if figures.partitions or figures.missing:
            yield from self._partitions(labels)

    def _tenant_of_worker(self, worker: str) -> str:
        credential = self.keys.by_id(worker)
        return "" if credential is None else credential.tenant

    def _workers(self) -> Iterator[Metric]:
        fences = GaugeMetricFamily(
            "strictq_fences",
            "Fences in force (an operator's or failure management's), by worker tenant and mode.",
            labels=["tenant", "mode"],
        )
        if self.fences is not None:
            counts: dict[tuple[str, str], int] = {}
            for fence in self.fences:
                fenced = (self._tenant_of_worker(fence.worker), str(fence.mode))
                counts[fenced] = counts.get(fenced, 0) + 1
            for (tenant, mode), n in sorted(counts.items()):
                fences.add_metric([tenant, mode], n)
        yield fences
        held = GaugeMetricFamily(
            "strictq_workers_held",
            "Workers failure management holds back (fenced, probing or blacklisted), by tenant and state.",
            labels=["tenant", "state"],
        )
        states: dict[tuple[str, str], int] = {}
        for worker in self.figures.held:
            key = (self._tenant_of_worker(worker.worker), worker.state)
            states[key] = states.get(key, 0) + 1
        for (tenant, name), n in sorted(states.items()):
            held.add_metric([tenant, name], n)
        yield held

    def _partitions(self, labels: dict[str, list[str]]) -> Iterator[Metric]:
        """A cluster's figures per owner node (queue series with a `node` label, scoped like the others)
        and per partition (no tenant: operators only, as the process-wide series)."""
        node_labels = ["node", *QUEUE_LABELS]
        per_node: dict[tuple[str, str], list[QueueGauges]] = {}
        for part in self.figures.partitions:
            for q in part.queues:
                per_node.setdefault((part.node, q.name), []).append(q.gauges)
        for name, doc, value in NODE_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=node_labels)
            for (node, queue), found in sorted(per_node.items()):
                gauge.add_metric(
                    [node, *labels.get(queue, queue_labels(queue))], sum(value(g) for g in found)
                )
            yield gauge
        up = GaugeMetricFamily(
            "strictq_partition_up",
            "1 when the partition's owner answered this scrape, 0 when not (its figures are left out).",
            labels=["partition", "node"],
        )
        messages = GaugeMetricFamily(
            "strictq_partition_messages",
            "Messages of every queue in the partition.",
            labels=["partition", "node"],
        )
        in_flight = GaugeMetricFamily(
            "strictq_partition_in_flight_messages",
            "Claimed messages of every queue in the partition.",
            labels=["partition", "node"],
        )
        for part in self.figures.partitions:
            where = [str(part.partition), part.node]
            up.add_metric(where, 1.0)
            messages.add_metric(
                where, sum(q.gauges.visible + q.gauges.in_flight + q.gauges.delayed for q in part.queues)
            )
            in_flight.add_metric(where, sum(q.gauges.in_flight for q in part.queues))
        for partition in self.figures.missing:
            up.add_metric([str(partition), ""], 0.0)
        yield up
        yield messages
        yield in_flight


NODE_GAUGES: tuple[tuple[str, str, QueueValue], ...] = (
    (
        "strictq_node_queue_visible_messages",
        "strictq_queue_visible_messages of the partitions this node owns (a cluster).",
        lambda g: g.visible,
    ),
    (
        "strictq_node_queue_in_flight_messages",
        "strictq_queue_in_flight_messages of the partitions this node owns (a cluster).",
        lambda g: g.in_flight,
    ),
    (
        "strictq_node_queue_delayed_messages",
        "strictq_queue_delayed_messages of the partitions this node owns (a cluster).",
        lambda g: g.delayed,
    ),
)


def core_source(backend: QueueBackend, hub: ControlHub | None, keys: KeyRing) -> ScrapeSource:
    """What a scrape reads of the queues: the backend's figures (through the port) and the hub's fences."""

    async def read() -> Collector:
        try:
            figures = await backend.figures()
        except (
            QueueError
        ) as exc:  # the queue server out of reach (or too old): this process's series still answer
            log.info("metrics: no queue figures for this scrape: %s", exc)
            figures = Figures(0.0, (), ready=False)
        return CoreCollector(figures, hub.fences() if hub is not None else None, keys)

    return read


def add_queue_metrics(
    app: web.Application,
    backend: QueueBackend,
    hub: ControlHub | None,
    keys: KeyRing,
    registry: CollectorRegistry | None = None,
) -> None:
    """GET /metrics on `app`: `registry` (a registry of its own by default, never prometheus_client's
    global one) and the queues' series of `backend`, read at each scrape."""
    add_metrics_route(app, registry or CollectorRegistry(), keys, [core_source(backend, hub, keys)])
