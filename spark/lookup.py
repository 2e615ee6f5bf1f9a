"""A message's rows through Spark: for a warm session (notebooks, jobs, the benchmark), not the CLI.

Reads only the message's bucket files; the equality filter on `message_id` is pushed down to the
Parquet reader, which skips row groups by their statistics and by the bloom filter the index writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import layout
from .buckets import bucket_of
from .schema import spark_index_schema


def spark_lookup(
    spark: Any, index_dir: Path, message_id: str, columns: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The message's index rows (all columns, or `columns`), in time order."""
    from pyspark.sql import functions as F

    state = layout.load_state(Path(index_dir))
    files = [
        str(p) for p in layout.bucket_files(Path(index_dir), state, bucket_of(message_id, state.buckets))
    ]
    if not files:
        return []
    schema = spark_index_schema()
    file_schema = type(schema)([f for f in schema.fields if f.name != "bucket"])
    frame = spark.read.schema(file_schema).parquet(*files).where(F.col("message_id") == message_id)
    frame = frame.orderBy("ts", "id")
    return [row.asDict() for row in (frame.select(*columns) if columns else frame).collect()]
