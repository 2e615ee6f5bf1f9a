"""Wire-log search: a PySpark index by message id, a pyarrow lookup, known error cases and alerts.

Modules (one concept each; docs/search.md has the story):

- `schema`     index columns (Spark parse schema + pyarrow schema of the Parquet files)
- `buckets`    crc32 bucket of a message id, identical in Spark SQL and plain Python
- `layout`     the index directory: metadata, the committed state (`_index.json`), manifests, lock
- `session`    the one place that builds a SparkSession (local[2] by default, loopback, UI off)
- `index`      incremental, crash-idempotent build of the index from closed segments
- `follow`     `--follow`: Structured Streaming trigger that indexes segments as they close
- `compact`    merges a bucket's files so a lookup opens a bounded number of them
- `search`     pyarrow-only lookup (no JVM): the message's bucket, row groups pruned by min/max
- `story`      a message's records as a time-ordered story (text and JSON; CLI and admin endpoint)
- `masking`    error signatures: ids, numbers, uuids, hex and quoted values masked (Python + Spark SQL)
- `drain`      Drain-style templates over masked error texts
- `errors`     `strictq errors`: the Spark job grouping failures into signatures and templates
- `alerts`     alert rules (TOML) evaluated over signature counts per window -> wire-log events
- `cli`        `strictq index | search | errors` (lazy imports: `search` never loads pyspark)
- `submit`     entry point for `spark-submit spark/submit.py index ...`
- `admin_endpoint`  `GET /admin/v1/search` on the gateway

Importing this package imports nothing heavy.
"""
