"""The core's Prometheus collector: every queue's gauges and counters, fences and held workers, read from
the live state at scrape time (no background thread, no global registry: each app registers its own, so
several apps can share one process).

Series carry `tenant`, `face` and `queue` as the tenant names the queue (access.tenancy): `acme.orders` is
tenant `acme`, face `queue`, queue `orders`; `acme_dedupq.orders` the same on face `dedupq`; a queue of the
queue server's internal API (no '.') has tenant "". Who may see which series: queue_core.metrics_http.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from access import tenancy
from access.keys import KeyRing

from .control import ControlHub
from .machine.gauges import QueueGauges
from .service import QueueService

QUEUE_LABELS = ["tenant", "face", "queue"]
GROUP_LABELS = [*QUEUE_LABELS, "group"]
# Failure-management states that hold a worker back (machine.health); healthy and suspect are not counted.
HELD_STATES = ("fenced", "probing", "blacklisted")

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
    """A `prometheus_client` collector over one in-process core (`strictq serve`, `strictq queue-server`)."""

    def __init__(self, service: QueueService, hub: ControlHub | None, keys: KeyRing) -> None:
        self.service = service
        self.hub = hub
        self.keys = keys

    def collect(self) -> Iterator[Metric]:
        service = self.service
        if not service.ready:
            return  # the store is not open yet (or any more): nothing true to say
        gauges = service.gauges()
        labels = {g.name: queue_labels(g.name) for g in gauges}
        for name, doc, value in QUEUE_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=QUEUE_LABELS)
            for g in gauges:
                gauge.add_metric(labels[g.name], value(g))
            yield gauge
        for name, doc, value in QUEUE_COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=QUEUE_LABELS)
            for g in gauges:
                counter.add_metric(labels[g.name], value(g))
            yield counter
        monitor = service.supervisor.monitor
        suspended = GaugeMetricFamily(
            "strictq_queue_suspended",
            "1 while failure management or an operator suspends the queue.",
            labels=QUEUE_LABELS,
        )
        for g in gauges:
            held = monitor is not None and monitor.suspended(g.name)
            suspended.add_metric(labels[g.name], 1.0 if held else 0.0)
        yield suspended
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
        for g in gauges:
            for group in g.top_groups:
                backlog.add_metric([*labels[g.name], group.name], group.messages)
                group_age.add_metric([*labels[g.name], group.name], group.oldest_age)
        yield backlog
        yield group_age
        yield from self._workers()

    def _tenant_of_worker(self, worker: str) -> str:
        credential = self.keys.by_id(worker)
        return "" if credential is None else credential.tenant

    def _workers(self) -> Iterator[Metric]:
        fences = GaugeMetricFamily(
            "strictq_fences",
            "Fences in force (an operator's or failure management's), by worker tenant and mode.",
            labels=["tenant", "mode"],
        )
        if self.hub is not None:
            counts: dict[tuple[str, str], int] = {}
            for fence in self.hub.fences():
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
        monitor = self.service.supervisor.monitor
        if monitor is not None:
            states: dict[tuple[str, str], int] = {}
            for worker in monitor.workers:
                state = monitor.worker_state(worker)
                if state in HELD_STATES:
                    key = (self._tenant_of_worker(worker), str(state))
                    states[key] = states.get(key, 0) + 1
            for (tenant, name), n in sorted(states.items()):
                held.add_metric([tenant, name], n)
        yield held


def core_registry(service: QueueService, hub: ControlHub | None, keys: KeyRing) -> CollectorRegistry:
    """A registry of its own for one app holding the core (never prometheus_client's global one)."""
    registry = CollectorRegistry()
    registry.register(CoreCollector(service, hub, keys))
    return registry
