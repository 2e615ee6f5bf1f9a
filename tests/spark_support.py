"""Spark test support: one local SparkSession for the whole run, and one sample index built from
segments written by the real wire-log writer (read-only: tests that change an index build their own).

`local[2]`, 2 shuffle partitions, UI off. Data stays small (hundreds of messages) and row groups tiny
(16 KiB) so pruning is visible with little data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark.sample import SampleSpec, Traffic
from wirelog.reader import ReadStats, RecordFilter, read_records

SAMPLE_BUCKETS = 4
SMALL_ROW_GROUPS = 16 * 1024
SMALL_SEGMENTS = 48 * 1024


@dataclass
class SampleIndex:
    wirelog: Path
    index: Path
    traffic: Traffic
    records: int


def brute_force(wirelog: Path, message_id: str) -> list[dict[str, Any]]:
    """Every record of a message straight from the segments, in the index's order (time, record id)."""
    stats = ReadStats()
    found = list(
        read_records(wirelog, include_open=False, stats=stats, where=RecordFilter(message_id=message_id))
    )
    return sorted(found, key=lambda r: (r["ts"], r["id"]))


def write_traffic(directory: Path, spec: SampleSpec, *, segment_bytes: int = SMALL_SEGMENTS) -> Traffic:
    traffic = Traffic(spec)
    traffic.write_to(directory, max_segment_bytes=segment_bytes)
    return traffic


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark.session import build_session

    session = build_session(
        master="local[2]", shuffle_partitions=2, driver_memory="1g", app_name="strictq-tests"
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_sample(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> SampleIndex:
    from spark.index import run_index

    base = tmp_path_factory.mktemp("spark-sample")
    traffic = write_traffic(base / "wirelog", SampleSpec(messages=500, seed=11))
    report = run_index(
        spark, base / "wirelog", base / "index", buckets=SAMPLE_BUCKETS, row_group_bytes=SMALL_ROW_GROUPS
    )
    return SampleIndex(base / "wirelog", base / "index", traffic, report.records)
