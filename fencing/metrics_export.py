"""The egress proxy's Prometheus collector: the runtime's counters (fencing.runtime), the control state and
the wire-log writer's counters, turned into families at scrape time. The counters stay a plain `Counter` the
addons bump (one dict increment per call); label values are made only when Prometheus scrapes.

Served by the admin addon's `/metrics` (fencing.addons.admin), one registry per proxy process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fencing.runtime import ProxyRuntime

# Runtime counter prefix -> (family, help, label) of the labelled ones; "status.2xx" -> status_class="2xx".
LABELLED = {
    "action.": (
        "strictq_proxy_calls_by_action",
        "Calls by what the proxy did (pass, block, mimic...).",
        "action",
    ),
    "code.": (
        "strictq_proxy_calls_by_code",
        "Calls the proxy refused or answered itself, by error code.",
        "code",
    ),
    "status.": (
        "strictq_proxy_calls_by_status_class",
        "Calls by the status class of their answer.",
        "status_class",
    ),
    "auth.": ("strictq_proxy_auth_refusals", "Calls refused at authentication (407), by code.", "code"),
}
# Runtime counter -> (family, help) of the plain ones.
PLAIN = {
    "requests": ("strictq_proxy_calls", "Calls seen (every call, whatever happened to it)."),
    "upstream.errors": (
        "strictq_proxy_upstream_errors",
        "Calls whose upstream failed (connect, TLS, reset).",
    ),
    "tagging.malformed": ("strictq_proxy_malformed_tags", "Calls with malformed X-Strictq-* tags."),
    "records": ("strictq_proxy_records_written", "Wire-log records written by the capture addon."),
    "capture.write_errors": (
        "strictq_proxy_record_write_errors",
        "Wire-log records that could not be written.",
    ),
}
OTHER = ("strictq_proxy_events", "Any other runtime counter, by its name.")


class ProxyCollector:
    """`connections` and `wirelog` read what lives in other addons (None: not there, e.g. no capture)."""

    def __init__(
        self,
        runtime: ProxyRuntime,
        connections: Callable[[], int | None],
        wirelog: Callable[[], dict[str, int] | None],
    ) -> None:
        self.runtime = runtime
        self.connections = connections
        self.wirelog = wirelog

    def collect(self) -> Iterator[Metric]:
        runtime = self.runtime
        counters = dict(runtime.metrics)
        labelled = {
            prefix: CounterMetricFamily(n, h, labels=[label]) for prefix, (n, h, label) in LABELLED.items()
        }
        other = CounterMetricFamily(*OTHER, labels=["event"])
        plain = {key: CounterMetricFamily(n, h) for key, (n, h) in PLAIN.items()}
        for key, n in sorted(counters.items()):
            if key in PLAIN:
                continue
            prefix = key[: key.index(".") + 1] if "." in key else ""
            family = labelled.get(prefix)
            if family is not None:
                family.add_metric([key[len(prefix) :]], n)
            else:
                other.add_metric([key], n)
        for key, family in plain.items():
            family.add_metric([], counters.get(key, 0))
            yield family
        yield from labelled.values()
        yield other
        yield GaugeMetricFamily(
            "strictq_proxy_in_flight", "Calls seen and not yet recorded.", runtime.in_flight
        )
        connections = self.connections()
        if connections is not None:
            yield GaugeMetricFamily(
                "strictq_proxy_client_connections", "Open client connections.", connections
            )
        state = runtime.control
        yield GaugeMetricFamily(
            "strictq_proxy_control_synced",
            "1 once the control stream is synchronised.",
            1 if state.synced else 0,
        )
        yield GaugeMetricFamily(
            "strictq_proxy_fences", "Fences the proxy knows (control stream).", len(state.fences)
        )
        yield GaugeMetricFamily(
            "strictq_proxy_floors", "Groups' fencing-token floors the proxy knows.", len(state.floors)
        )
        yield GaugeMetricFamily(
            "strictq_proxy_start_time_seconds",
            "When this proxy process started (Unix time).",
            runtime.started_at,
        )
        writer = self.wirelog()
        if writer is not None:
            for key, n in sorted(writer.items()):
                if key == "segments_pending_compression":
                    yield GaugeMetricFamily(
                        "strictq_proxy_wirelog_segments_pending_compression",
                        "Closed segments not compressed yet.",
                        n,
                    )
                else:
                    yield CounterMetricFamily(
                        f"strictq_proxy_wirelog_{key}", f"The wire-log writer's {key}.", n
                    )
