"""The edge's admission in Prometheus terms: per tenant, the messages its send rate admitted and the
requests and messages it throttled (gateway.rate_limits); per queue, the sends its backpressure refused
(gateway.backpressure). Read at scrape time from the limiter's and the gate's counters; a tenant's admin
sees its own tenant's series, an operator all (queue_core.metrics_http)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from queue_core.metrics_export import queue_labels

from .backpressure import BackpressureGate
from .rate_limits import TenantRateLimiter


class AdmissionCollector:
    def __init__(self, limiter: TenantRateLimiter, gate: BackpressureGate) -> None:
        self.limiter = limiter
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        admitted = CounterMetricFamily(
            "strictq_tenant_admitted_messages", "Messages a tenant's send rate admitted.", labels=["tenant"]
        )
        requests = CounterMetricFamily(
            "strictq_tenant_throttled_requests",
            "Send requests refused by the tenant's send rate (429 throttled, SQS RequestThrottled).",
            labels=["tenant"],
        )
        messages = CounterMetricFamily(
            "strictq_tenant_throttled_messages", "Messages of the throttled requests.", labels=["tenant"]
        )
        for tenant, counters in sorted(self.limiter.counters.items()):
            admitted.add_metric([tenant], counters.admitted)
            requests.add_metric([tenant], counters.throttled_requests)
            messages.add_metric([tenant], counters.throttled_messages)
        refused = CounterMetricFamily(
            "strictq_queue_backpressure_refused_requests",
            "Send requests refused by the queue's backpressure (429 backpressure, SQS RequestThrottled).",
            labels=["tenant", "face", "queue"],
        )
        for queue, count in self.gate.refusals():
            refused.add_metric(queue_labels(queue), count)
        yield from (admitted, requests, messages, refused)
