"""Incremental, crash-idempotent index build: closed wire-log segments -> bucketed, sorted Parquet.

One run: take the writer lock, remove what a dead run left (`layout.remove_orphans`), list closed
segments (`.jsonl`, `.jsonl.gz`; never `.open`), subtract those committed batches already indexed
(manifests), and index the rest in batches. A batch is one Spark job:

    text lines -> from_json(explicit schema, corrupt-record column) -> flat columns + raw line
      -> bucket = pmod(crc32(message_id), buckets)   (bad lines -> -1, unknown versions -> -2)
      -> repartition(bucket) -> sort(bucket, message_id, ts) -> Parquet partitioned by bucket
         (zstd, small row groups, bloom filter on message_id) into _staging/batch-K/

then the good files move to data/bucket=<b>/, the manifest is written, and `_index.json` is replaced
atomically: the commit. Skipped lines (pseudo-buckets -1/-2) are counted per segment and reported,
never indexed. If Spark cannot read an input (a segment compressed or removed under us, a truncated
gzip), the batch's inputs are re-resolved, damaged gzip segments are salvaged up to the damage with
the wire-log reader (reported), and the batch is retried once.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import shutil
import signal
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import layout
from .buckets import spark_bucket
from .schema import (
    BAD_LINE_BUCKET,
    CORRUPT_COLUMN,
    RECORD_SCHEMA_VERSION,
    UNKNOWN_VERSION_BUCKET,
    spark_parse_schema,
)

log = logging.getLogger("strictq.spark.index")

ROW_GROUP_BYTES = 1024 * 1024  # parquet.block.size: small row groups, so a lookup reads little
PAGE_BYTES = 256 * 1024
DEFAULT_MAX_BATCH_BYTES = 1024 * 1024 * 1024  # on-disk segment bytes per batch (gzip ~5x smaller)
MIN_RECORD_BYTES = 300  # in-memory bytes of the smallest records: the most ids a row group can hold
CRASH_ENV = "STRICTQ_INDEX_CRASH_AT"  # tests: "<point>:<batch>" -> SIGKILL ourselves there
Fault = Callable[[str, int], None]
POINTS = ("before-write", "after-write", "after-move", "after-manifest", "after-commit")


@dataclass(frozen=True, slots=True)
class Segment:
    """A closed segment: its identity (`writer.stamp.seq`) and the file that holds it now."""

    name: str
    path: Path
    size: int


@dataclass(slots=True)
class BatchReport:
    batch: int
    segments: int
    records: int = 0
    files: int = 0
    bad_lines: int = 0
    unknown_versions: int = 0
    salvaged_segments: int = 0
    missing_segments: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    stream_batch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "records": self.records,
            "files": self.files,
            "bad_lines": self.bad_lines,
            "unknown_versions": self.unknown_versions,
            "salvaged_segments": self.salvaged_segments,
            "missing_segments": self.missing_segments,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "stream_batch": self.stream_batch,
        }


@dataclass(slots=True)
class IndexReport:
    batches: list[BatchReport] = field(default_factory=list)
    already_indexed: int = 0
    orphans_removed: list[str] = field(default_factory=list)
    state: layout.IndexState | None = None

    @property
    def records(self) -> int:
        return sum(b.records for b in self.batches)

    @property
    def skipped(self) -> int:
        return sum(b.bad_lines + b.unknown_versions for b in self.batches)

    @property
    def notes(self) -> list[str]:
        return [note for b in self.batches for note in b.notes]


# ---------------------------------------------------------------------------------------- segments
def closed_segments(wirelog_dir: Path) -> list[Segment]:
    """Closed segments in time order, one file per segment (the most final state)."""
    from wirelog.layout import GZ, parse_segment_name
    from wirelog.reader import segments

    found: list[Segment] = []
    for path in segments(Path(wirelog_dir), include_open=False):
        name = parse_segment_name(path.name)
        if name is None:
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            # Compressed between listing and stat: the writer renames the .gz into place before it
            # removes the .jsonl, so the compressed file is there now.
            path = path.with_name(name.filename(GZ))
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue  # removed by retention meanwhile: nothing left to index
        found.append(Segment(name.base, path, size))
    return found


def plan_batches(
    pending: list[Segment], *, max_bytes: int = DEFAULT_MAX_BATCH_BYTES, max_segments: int | None = None
) -> list[list[Segment]]:
    batches: list[list[Segment]] = []
    current: list[Segment] = []
    size = 0
    for segment in pending:
        full = (max_segments is not None and len(current) >= max_segments) or (
            current and size + segment.size > max_bytes
        )
        if full:
            batches.append(current)
            current, size = [], 0
        current.append(segment)
        size += segment.size
    if current:
        batches.append(current)
    return batches


# ------------------------------------------------------------------------------------------- runs
def run_index(
    spark: Any,
    wirelog_dir: Path,
    index_dir: Path,
    *,
    buckets: int | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    max_batch_segments: int | None = None,
    fault: Fault | None = None,
    stream_batch: int | None = None,
    progress: Callable[[str], None] | None = None,
    locked: bool = False,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> IndexReport:
    """Index every closed segment not indexed yet; safe to kill at any point and run again.

    `locked`: the caller already holds the index's writer lock (--follow holds it for its life).
    """
    wirelog_dir, index_dir = Path(wirelog_dir), Path(index_dir)
    if not wirelog_dir.is_dir():
        raise FileNotFoundError(f"wire-log directory {wirelog_dir} does not exist")
    fault = fault or _env_fault()
    report = IndexReport()
    with contextlib.nullcontext() if locked else layout.writer_lock(index_dir):
        state = layout.open_for_write(index_dir, buckets)
        report.orphans_removed = layout.remove_orphans(index_dir, state)
        if report.orphans_removed and progress:
            progress(f"removed {len(report.orphans_removed)} leftover(s) of an interrupted run")
        layout.consolidate_manifests(index_dir, state)
        done = layout.indexed_segments(index_dir, state)
        listed = closed_segments(wirelog_dir)
        pending = [s for s in listed if s.name not in done]
        report.already_indexed = len(listed) - len(pending)
        for segments in plan_batches(pending, max_bytes=max_batch_bytes, max_segments=max_batch_segments):
            batch = state.last_batch + 1
            if progress:
                progress(f"indexing batch {batch}: {len(segments)} segment(s), {_mib(segments)} MiB")
            result = index_batch(
                spark,
                index_dir,
                state,
                segments,
                batch,
                fault=fault,
                stream_batch=stream_batch,
                row_group_bytes=row_group_bytes,
            )
            report.batches.append(result)
            if progress:
                rate = result.records / result.seconds if result.seconds else 0.0
                progress(
                    f"batch {batch}: {result.records:,} record(s) in {result.seconds:.1f} s ({rate:,.0f}/s), "
                    f"{result.files} file(s)"
                )
        report.state = state
        shutil.rmtree(index_dir / layout.STAGING_DIR, ignore_errors=True)
    return report


def index_batch(
    spark: Any,
    root: Path,
    state: layout.IndexState,
    segments: list[Segment],
    batch: int,
    *,
    fault: Fault | None = None,
    stream_batch: int | None = None,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> BatchReport:
    """Index one batch and commit it (see the module doc); `state` is updated in place."""
    started = time.perf_counter()
    fault = fault or (lambda point, batch: None)
    report = BatchReport(batch=batch, segments=len(segments), stream_batch=stream_batch)
    staging = root / layout.STAGING_DIR / f"batch-{batch:08d}"
    shutil.rmtree(staging, ignore_errors=True)
    output = staging / "out"
    fault("before-write", batch)
    inputs = [str(s.path) for s in segments]
    if inputs:
        try:
            write_batch(spark, inputs, output, state.buckets, row_group_bytes)
        except Exception as exc:
            repaired = repair_inputs(segments, staging / "salvage", report)
            if repaired is None:
                raise
            log.warning("batch %d: re-running after an unreadable input (%s)", batch, _first_line(exc))
            shutil.rmtree(output, ignore_errors=True)
            if repaired:
                write_batch(spark, repaired, output, state.buckets, row_group_bytes)
    fault("after-write", batch)

    moved: dict[int, list[str]] = {}
    for bucket, files in _staged_files(output):
        if bucket < 0:
            _count_skipped(bucket, files, report)
            continue
        target = layout.bucket_dir(root, bucket)
        target.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(files):
            name = f"b{batch:08d}-{i:03d}.parquet"
            report.records += _row_count(path)
            os.replace(path, target / name)
            layout.fsync_file(target / name)
            moved.setdefault(bucket, []).append(name)
    for bucket in moved:
        layout.fsync_dir(layout.bucket_dir(root, bucket))
    report.files = sum(len(names) for names in moved.values())
    fault("after-move", batch)

    report.seconds = time.perf_counter() - started
    manifest = {
        "batch": batch,
        "record_schema": RECORD_SCHEMA_VERSION,
        "segments": [{"name": s.name, "file": s.path.name, "bytes": s.size} for s in segments],
        "files": {str(b): names for b, names in sorted(moved.items())},
        "committed": time.time(),
        **report.to_json(),
    }
    layout.write_manifest(root, batch, manifest)
    fault("after-manifest", batch)

    for bucket, names in moved.items():
        state.files.setdefault(bucket, []).extend(names)
    state.last_batch = batch
    state.records += report.records
    layout.commit_state(root, state)
    fault("after-commit", batch)
    shutil.rmtree(staging, ignore_errors=True)
    return report


# ------------------------------------------------------------------------------------------ spark
def parquet_options(row_group_bytes: int = ROW_GROUP_BYTES) -> dict[str, str]:
    """Writer options: zstd, small row groups, a bloom filter on message_id only.

    parquet-mr sizes a bloom filter per row group from the expected NDV, so the NDV is that of one row
    group (at most one id per record), not of a file: sized per file, the filters outweighed the data.
    """
    ndv = max(256, row_group_bytes // MIN_RECORD_BYTES)
    return {
        "compression": "zstd",
        "parquet.block.size": str(row_group_bytes),
        "parquet.page.size": str(min(PAGE_BYTES, row_group_bytes)),
        "parquet.bloom.filter.enabled#message_id": "true",
        "parquet.bloom.filter.expected.ndv#message_id": str(ndv),
        "parquet.bloom.filter.enabled": "false",
        # parquet-mr writes no bloom filter for a fully dictionary-encoded chunk; ids are near-unique anyway.
        "parquet.enable.dictionary#message_id": "false",
        "parquet.enable.dictionary#id": "false",  # unique per record: a dictionary is only wasted work
        "parquet.enable.dictionary#record": "false",
    }


def write_batch(
    spark: Any,
    inputs: list[str],
    output: Path,
    buckets: int,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> None:
    """The Spark job of one batch: parse, classify, bucket, sort and write to `output`."""
    rows = parse_lines(spark, inputs, buckets)
    partitions = max(1, min(buckets, int(spark.conf.get("spark.sql.shuffle.partitions"))))
    (
        rows.repartition(partitions, "bucket")
        .sortWithinPartitions("bucket", "message_id", "ts")
        .write.mode("overwrite")
        .options(**parquet_options(row_group_bytes))
        .partitionBy("bucket")
        .parquet(str(output))
    )


def parse_lines(spark: Any, inputs: list[str], buckets: int) -> Any:
    """Wire-log lines as index rows (flat columns, raw line, bucket; skipped lines in buckets < 0)."""
    from pyspark.sql import functions as F

    lines = spark.read.format("text").load(inputs)
    parsed = lines.select(
        F.col("value"),
        F.col("_metadata.file_name").alias("file"),
        F.from_json(
            "value", spark_parse_schema(), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
        ).alias("r"),
    )
    r = F.col("r")
    bad = r.isNull() | r[CORRUPT_COLUMN].isNotNull() | r["v"].isNull()
    bucket = (
        F.when(bad, F.lit(BAD_LINE_BUCKET))
        .when(r["v"] != F.lit(RECORD_SCHEMA_VERSION), F.lit(UNKNOWN_VERSION_BUCKET))
        .otherwise(spark_bucket(r["message_id"], buckets))
    )
    plain = (
        "message_id",
        "ts",
        "kind",
        "id",
        "writer",
        "worker",
        "queue",
        "group",
        "lease",
        "attempt",
        "call",
        "request_id",
    )
    return parsed.select(
        *(r[name].alias(name) for name in plain),
        r["request"]["method"].alias("method"),
        r["request"]["url"].alias("url"),
        r["response"]["status"].alias("status"),
        *(r[name].alias(name) for name in ("latency_ms", "action", "error", "event", "outcome", "reason")),
        r["seq"].alias("seq"),
        r["receive_count"].alias("receive_count"),
        F.regexp_extract(F.col("file"), r"^(.*?)\.jsonl", 1).alias("segment"),
        F.col("value").alias("record"),
        bucket.alias("bucket"),
    )


def _staged_files(output: Path) -> Iterable[tuple[int, list[Path]]]:
    if not output.is_dir():
        return []
    found = []
    for directory in sorted(output.iterdir()):
        if directory.is_dir() and directory.name.startswith("bucket="):
            files = sorted(p for p in directory.iterdir() if p.suffix == ".parquet")
            if files:
                found.append((int(directory.name.split("=", 1)[1]), files))
    return found


def _row_count(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _count_skipped(bucket: int, files: list[Path], report: BatchReport) -> None:
    """Per segment: how many lines were skipped, with the first one as an example."""
    import pyarrow.parquet as pq

    per_segment: dict[str, list[Any]] = {}
    for path in files:
        table = pq.read_table(path, columns=["segment", "record"])
        for segment, line in zip(
            table.column("segment").to_pylist(), table.column("record").to_pylist(), strict=True
        ):
            entry = per_segment.setdefault(segment or "?", [0, line])
            entry[0] += 1
    what = (
        "line(s) that are not wire-log records"
        if bucket == BAD_LINE_BUCKET
        else ("record(s) of an unknown schema version")
    )
    for segment, (count, example) in sorted(per_segment.items()):
        if bucket == BAD_LINE_BUCKET:
            report.bad_lines += count
        else:
            report.unknown_versions += count
        shown = (example or "")[:120]
        report.notes.append(f"{segment}: skipped {count} {what} (first: {shown!r})")


# -------------------------------------------------------------------------------------- salvaging
def repair_inputs(segments: list[Segment], salvage_dir: Path, report: BatchReport) -> list[str] | None:
    """Inputs to retry a failed batch with, or None if none of them was the problem.

    Each segment is re-resolved to its current file (it may have been compressed meanwhile); a gzip
    that ends early or is corrupt is read up to the damage by the wire-log reader into a plain file.
    """
    from wirelog.layout import parse_segment_name
    from wirelog.reader import ReadStats, read_records
    from wirelog.reader import segments as list_segments

    changed = False
    inputs: list[str] = []
    by_dir: dict[Path, dict[str, Path]] = {}
    for segment in segments:
        directory = segment.path.parent
        if directory not in by_dir:
            current = {}
            for listed in list_segments(directory, include_open=False):
                name = parse_segment_name(listed.name)
                if name is not None:
                    current[name.base] = listed
            by_dir[directory] = current
        path = by_dir[directory].get(segment.name)
        if path is None:
            changed = True
            report.missing_segments += 1
            report.notes.append(
                f"{segment.name}: disappeared before it could be indexed (removed by retention?)"
            )
            continue
        if path != segment.path:
            changed = True
        if path.name.endswith(".gz") and not _gzip_intact(path):
            changed = True
            salvage_dir.mkdir(parents=True, exist_ok=True)
            target = salvage_dir / f"{segment.name}.jsonl"
            stats = ReadStats()
            with open(target, "wb") as out:
                for record in read_records(path, stats=stats):
                    out.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
            report.salvaged_segments += 1
            report.bad_lines += stats.torn_lines + stats.bad_lines
            report.unknown_versions += stats.unknown_versions
            report.notes.append(
                f"{path.name}: gzip stream ends early or is corrupt; indexed the {stats.records} record(s) "
                "before the damage"
            )
            report.notes.extend(f"{note}" for note in stats.notes if "gzip stream" not in note)
            path = target
        inputs.append(str(path))
    return inputs if changed else None


def _gzip_intact(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as stream:
            while stream.read(4 * 1024 * 1024):
                pass
    except (EOFError, OSError, zlib.error):
        return False
    return True


# ------------------------------------------------------------------------------------------ misc
def _mib(segments: list[Segment]) -> str:
    return f"{sum(s.size for s in segments) / 1048576:.1f}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _env_fault() -> Fault | None:
    """`STRICTQ_INDEX_CRASH_AT=after-move:2`: die by SIGKILL at that point (the crash tests)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return None
    point, _, batch = spec.partition(":")

    def crash(where: str, current: int) -> None:
        if where == point and (not batch or int(batch) == current):
            print(
                f"strictq: index: crashing at {where} of batch {current} ({CRASH_ENV})",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)

    return crash
