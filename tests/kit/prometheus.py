"""Prometheus text exposition read back for assertions: one series map for every /metrics test."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# (sample name, sorted labels) -> value
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_series(text: str) -> Series:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Series, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]
