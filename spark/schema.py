"""The index's columns in one place: the Spark schema records are parsed with, and the Parquet columns.

Spark must never infer the JSON schema (inference scans everything twice), so the parse schema is
explicit and lists only the fields the index keeps; unknown fields are ignored. The Parquet files
hold flat columns (what lookups filter and print) plus `record`, the raw line, so `--json` and the
admin endpoint return records exactly as they were written.

No pyspark or pyarrow import at module level: `spark.search` imports this for the column names.
"""

from __future__ import annotations

from typing import Any

from wirelog.record import REQUEST_FIELDS, RESPONSE_FIELDS, SCHEMA_VERSION, field_types

INDEX_FORMAT = "strictq-wirelog-index"
# Bump when columns, bucketing or layout change: older indexes are then refused (rebuild them from the wire
# log). 2: the `request_id` column (the id of the request that sent the message).
INDEX_VERSION = 2
RECORD_SCHEMA_VERSION = SCHEMA_VERSION  # the wire-log schema the parse schema follows (wirelog.record)

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
    ("request_id", "string"),  # the id of the request that sent the message (`strictq search --request-id`)
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

# Record fields the index reads: the names are spark's choice, their types wirelog.record's (one definition).
_KEPT = (
    "v", "kind", "id", "ts", "writer", "worker", "queue", "message_id", "group", "lease", "attempt", "call",
    "request_id", "error", "latency_ms", "action", "event", "outcome", "reason", "seq", "receive_count",
)  # fmt: skip
_KEPT_REQUEST = ("method", "url")
_KEPT_RESPONSE = ("status",)
_TOP_LEVEL = tuple((name, field_types()[name]) for name in _KEPT)
_REQUEST = tuple((name, dict(REQUEST_FIELDS)[name]) for name in _KEPT_REQUEST)
_RESPONSE = tuple((name, dict(RESPONSE_FIELDS)[name]) for name in _KEPT_RESPONSE)
CORRUPT_COLUMN = "_corrupt_record"


def spark_parse_schema() -> Any:
    """The StructType `from_json` parses each line with (plus the corrupt-record column)."""
    from pyspark.sql import types as T

    kinds = {"string": T.StringType(), "double": T.DoubleType(), "long": T.LongType()}
    fields = [T.StructField(name, kinds[kind]) for name, kind in _TOP_LEVEL]
    for part, kept in (("request", _REQUEST), ("response", _RESPONSE)):
        fields.append(T.StructField(part, T.StructType([T.StructField(n, kinds[k]) for n, k in kept])))
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
