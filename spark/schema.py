"""The index's columns in one place: the Spark schema records are parsed with, and the Parquet columns.

Spark must never infer the JSON schema (inference scans everything twice), so the parse schema is
explicit and lists only the fields the index keeps; unknown fields are ignored. The Parquet files
hold flat columns (what lookups filter and print) plus `record`, the raw line, so `--json` and the
admin endpoint return records exactly as they were written.

No pyspark or pyarrow import at module level: `spark.search` imports this for the column names.
"""

from __future__ import annotations

from typing import Any

INDEX_FORMAT = "strictq-wirelog-index"
INDEX_VERSION = 1  # bump when columns, bucketing or layout change: older indexes are then refused
RECORD_SCHEMA_VERSION = 1  # the wire-log schema the parse schema follows (wirelog.record.SCHEMA_VERSION)

# Rows of these pseudo-buckets never reach the index: they count what was skipped in a batch.
BAD_LINE_BUCKET = -1  # not JSON, not an object, no integer `v`, torn, fields of the wrong type
UNKNOWN_VERSION_BUCKET = -2  # a valid record of a schema version this code does not know

# (name, type) of the flat Parquet columns, in file order. Types: string, double, long.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("message_id", "string"),
    ("ts", "double"),
    ("kind", "string"),
    ("id", "string"),
    ("writer", "string"),
    ("worker", "string"),
    ("queue", "string"),
    ("group", "string"),
    ("lease", "long"),
    ("attempt", "long"),
    ("call", "long"),
    ("method", "string"),
    ("url", "string"),
    ("status", "long"),
    ("latency_ms", "double"),
    ("action", "string"),
    ("error", "string"),
    ("event", "string"),
    ("outcome", "string"),
    ("reason", "string"),
    ("seq", "long"),
    ("receive_count", "long"),
    ("segment", "string"),  # the wire-log segment the record came from (`writer.stamp.seq`)
    ("record", "string"),  # the raw JSON line
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
SUMMARY_COLUMNS = tuple(name for name in COLUMN_NAMES if name != "record")

# Top-level record fields read as-is; nested ones are flattened from request/response below.
_TOP_LEVEL = (
    ("v", "long"),
    ("kind", "string"),
    ("id", "string"),
    ("ts", "double"),
    ("writer", "string"),
    ("worker", "string"),
    ("queue", "string"),
    ("message_id", "string"),
    ("group", "string"),
    ("lease", "long"),
    ("attempt", "long"),
    ("call", "long"),
    ("error", "string"),
    ("latency_ms", "double"),
    ("action", "string"),
    ("event", "string"),
    ("outcome", "string"),
    ("reason", "string"),
    ("seq", "long"),
    ("receive_count", "long"),
)
CORRUPT_COLUMN = "_corrupt_record"


def spark_parse_schema() -> Any:
    """The StructType `from_json` parses each line with (plus the corrupt-record column)."""
    from pyspark.sql import types as T

    kinds = {"string": T.StringType(), "double": T.DoubleType(), "long": T.LongType()}
    fields = [T.StructField(name, kinds[kind]) for name, kind in _TOP_LEVEL]
    fields.append(
        T.StructField(
            "request",
            T.StructType([T.StructField("method", T.StringType()), T.StructField("url", T.StringType())]),
        )
    )
    fields.append(T.StructField("response", T.StructType([T.StructField("status", T.LongType())])))
    fields.append(T.StructField(CORRUPT_COLUMN, T.StringType()))
    return T.StructType(fields)


def spark_index_schema() -> Any:
    """The StructType of the index's Parquet files plus the `bucket` partition column (for reads)."""
    from pyspark.sql import types as T

    kinds = {"string": T.StringType(), "double": T.DoubleType(), "long": T.LongType()}
    return T.StructType(
        [T.StructField(name, kinds[kind]) for name, kind in COLUMNS]
        + [T.StructField("bucket", T.IntegerType())]
    )


def arrow_schema() -> Any:
    """The pyarrow schema of the index's Parquet files (without the partition column)."""
    import pyarrow as pa

    kinds = {"string": pa.string(), "double": pa.float64(), "long": pa.int64()}
    return pa.schema([pa.field(name, kinds[kind]) for name, kind in COLUMNS])
