"""Compaction: rewrite a bucket's files as one sorted file, so a lookup opens a bounded number of files
whatever the index's history (every batch adds one file per bucket it touches).

Same commit protocol as a batch: the Spark job writes to staging, the new files move into the bucket
directories, `_index.json` is replaced naming them instead of the old ones (the commit), and only then
are the old files deleted. A run killed before the commit leaves unreferenced new files, one killed
after it leaves unreferenced old ones: either way the next writer removes them. Row counts are checked
before the commit: a compaction never loses or duplicates a row.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import layout
from .buckets import spark_bucket
from .index import ROW_GROUP_BYTES, Fault, _row_count, _staged_files, parquet_options
from .schema import COLUMN_NAMES, spark_index_schema

DEFAULT_MAX_FILES = 16  # `strictq index` compacts a bucket by itself past this many files
MAX_RECORDS_PER_FILE = 4_000_000  # a huge bucket becomes several (disjoint, sorted) files


@dataclass(slots=True)
class CompactReport:
    buckets: list[int] = field(default_factory=list)
    files_before: int = 0
    files_after: int = 0
    records: int = 0
    seconds: float = 0.0


def run_compact(
    spark: Any,
    index_dir: Path,
    *,
    min_files: int = 2,
    fault: Fault | None = None,
    locked: bool = False,
    progress: Callable[[str], None] | None = None,
    row_group_bytes: int = ROW_GROUP_BYTES,
) -> CompactReport:
    """Compact every bucket holding at least `min_files` files."""
    index_dir = Path(index_dir)
    if locked:
        return _compact(spark, index_dir, min_files, fault, progress, row_group_bytes)
    with layout.writer_lock(index_dir):
        return _compact(spark, index_dir, min_files, fault, progress, row_group_bytes)


def _compact(
    spark: Any,
    root: Path,
    min_files: int,
    fault: Fault | None,
    progress: Callable[[str], None] | None,
    row_group_bytes: int,
) -> CompactReport:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    fault = fault or (lambda point, generation: None)
    state = layout.load_state(root)
    layout.remove_orphans(root, state)
    report = CompactReport()
    targets = sorted(b for b, names in state.files.items() if len(names) >= max(min_files, 1))
    if not targets:
        return report
    generation = state.generation + 1
    old = {b: layout.bucket_files(root, state, b) for b in targets}
    report.buckets = targets
    report.files_before = sum(len(paths) for paths in old.values())
    expected = sum(_row_count(p) for paths in old.values() for p in paths)
    if progress:
        progress(
            f"compacting {len(targets)} bucket(s): {report.files_before} file(s), {expected:,} record(s)"
        )
    staging = root / layout.STAGING_DIR / f"compact-{generation:08d}"
    shutil.rmtree(staging, ignore_errors=True)
    output = staging / "out"
    schema = spark_index_schema()
    file_schema = type(schema)([f for f in schema.fields if f.name != "bucket"])
    rows = spark.read.schema(file_schema).parquet(*[str(p) for paths in old.values() for p in paths])
    rows = rows.select(*COLUMN_NAMES, spark_bucket(F.col("message_id"), state.buckets).alias("bucket"))
    partitions = max(1, min(len(targets), int(spark.conf.get("spark.sql.shuffle.partitions"))))
    (
        rows.repartition(partitions, "bucket")
        .sortWithinPartitions("bucket", "message_id", "ts")
        .write.mode("overwrite")
        .options(**parquet_options(row_group_bytes))
        .option("maxRecordsPerFile", MAX_RECORDS_PER_FILE)
        .partitionBy("bucket")
        .parquet(str(output))
    )
    fault("after-write", generation)
    staged = dict(_staged_files(output))
    if set(staged) - set(targets):
        raise RuntimeError(f"compaction produced unexpected buckets {sorted(set(staged) - set(targets))}")
    written = sum(_row_count(p) for files in staged.values() for p in files)
    if written != expected:
        raise RuntimeError(f"compaction wrote {written} rows for {expected}; nothing was changed")
    new_files: dict[int, list[str]] = {}
    for bucket, files in staged.items():
        target = layout.bucket_dir(root, bucket)
        for i, path in enumerate(files):
            name = f"c{generation:08d}-{i:03d}.parquet"
            os.replace(path, target / name)
            layout.fsync_file(target / name)
            new_files.setdefault(bucket, []).append(name)
        layout.fsync_dir(target)
    fault("after-move", generation)
    for bucket in targets:
        state.files[bucket] = new_files.get(bucket, [])
    state.generation = generation
    layout.commit_state(root, state)
    fault("after-commit", generation)
    for paths in old.values():
        for path in paths:
            path.unlink(missing_ok=True)
    shutil.rmtree(root / layout.STAGING_DIR, ignore_errors=True)
    report.files_after = sum(len(names) for names in new_files.values())
    report.records = written
    report.seconds = time.perf_counter() - started
    if progress:
        progress(f"compacted to {report.files_after} file(s) in {report.seconds:.1f} s")
    return report
