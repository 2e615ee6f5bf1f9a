"""`strictq errors`: the Spark job that turns failed interactions and failed attempts into known cases.

Reads the whole index (all buckets), keeps failures (`masking.spark_is_failure`: http errors, no
response, status >= 400, refused actions; logs whose outcome is not a success), computes each one's
signature in Spark SQL, and aggregates per signature: count, first/last seen, affected groups (count
and a few names) and the latest exemplar message ids. The distinct masked texts (few, with counts) are
collected and mined into Drain templates on the driver. Per-window counts feed the alert rules.
Output goes beside the index, `<index>/errors/errors.json` (atomic write), and the top N are printed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import layout
from .drain import templates_for
from .masking import spark_is_failure, spark_message_text, spark_signature
from .schema import spark_index_schema

ERRORS_FILE = "errors.json"
EXEMPLARS = 3
GROUP_SAMPLE = 5


@dataclass(slots=True)
class ErrorReport:
    signatures: list[dict[str, Any]]
    templates: list[dict[str, Any]]
    failures: int
    records: int
    windows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # window seconds -> counts
    since: float | None = None
    until: float | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "generated": time.time(),
            "records": self.records,
            "failures": self.failures,
            "since": self.since,
            "until": self.until,
            "signatures": self.signatures,
            "templates": self.templates,
        }


def failures_frame(
    spark: Any, index_dir: Path, since: float | None = None, until: float | None = None
) -> Any:
    """The failed records of the index, with `signature` and `text` (masked message) columns."""
    from pyspark.sql import functions as F

    state = layout.load_state(index_dir)
    files = [str(p) for p in layout.all_files(index_dir, state)]
    schema = spark_index_schema()
    file_schema = type(schema)([f for f in schema.fields if f.name != "bucket"])
    if not files:
        return spark.createDataFrame([], file_schema).select(
            "*", F.lit("").alias("signature"), F.lit("").alias("text")
        ), state
    frame = spark.read.schema(file_schema).parquet(*files).drop("record")
    if since is not None:
        frame = frame.where(F.col("ts") >= since)
    if until is not None:
        frame = frame.where(F.col("ts") <= until)
    failed = frame.where(spark_is_failure())
    return failed.select("*", spark_signature().alias("signature"), spark_message_text().alias("text")), state


def run_errors(
    spark: Any,
    index_dir: Path,
    *,
    since: float | None = None,
    until: float | None = None,
    windows: tuple[int, ...] = (),
    write: bool = True,
) -> ErrorReport:
    """Group failures into signatures and templates; `windows` (seconds) adds per-window counts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.perf_counter()
    index_dir = Path(index_dir)
    failed, state = failures_frame(spark, index_dir, since, until)
    failed = failed.persist()
    try:
        aggregated = failed.groupBy("signature").agg(
            F.count(F.lit(1)).alias("count"),
            F.min("ts").alias("first_seen"),
            F.max("ts").alias("last_seen"),
            F.count_distinct("group").alias("groups"),
            F.slice(F.array_sort(F.collect_set("group")), 1, GROUP_SAMPLE).alias("group_sample"),
            F.first("kind").alias("kind"),
            F.first("text").alias("text"),
            F.min("status").alias("status_min"),
            F.max("status").alias("status_max"),
        )
        latest = Window.partitionBy("signature").orderBy(F.col("ts").desc(), F.col("message_id"))
        exemplars = (
            failed.where(F.col("message_id").isNotNull())
            .groupBy("signature", "message_id")
            .agg(F.max("ts").alias("ts"))
            .select("signature", "message_id", F.row_number().over(latest).alias("n"))
            .where(F.col("n") <= EXEMPLARS)
            .groupBy("signature")
            .agg(F.collect_list("message_id").alias("exemplars"))
        )
        rows = [r.asDict() for r in aggregated.join(exemplars, "signature", "left").collect()]
        texts: dict[str, int] = {}
        for row in rows:
            if row["text"]:
                texts[row["text"]] = texts.get(row["text"], 0) + row["count"]
        per_window: dict[int, list[dict[str, Any]]] = {}
        for seconds in sorted(set(windows)):
            start = (F.floor(F.col("ts") / seconds) * seconds).alias("window_start")
            counted = failed.groupBy("signature", start).agg(F.count(F.lit(1)).alias("count"))
            per_window[seconds] = [r.asDict() for r in counted.collect()]
    finally:
        failed.unpersist()
    template_of = templates_for(texts)
    signatures = []
    for row in sorted(rows, key=lambda r: (-r["count"], r["signature"])):
        template = template_of.get(row["text"] or "")
        signatures.append(
            {
                "signature": row["signature"],
                "kind": row["kind"],
                "template": template,
                "count": row["count"],
                "first_seen": row["first_seen"],
                "last_seen": row["last_seen"],
                "groups": row["groups"],
                "group_sample": row["group_sample"],
                "exemplars": row["exemplars"] or [],
            }
        )
    templates: dict[str, dict[str, Any]] = {}
    for item in signatures:
        if item["template"] is None:
            continue
        entry = templates.setdefault(
            item["template"],
            {
                "template": item["template"],
                "count": 0,
                "signatures": 0,
                "first_seen": None,
                "last_seen": None,
            },
        )
        entry["count"] += item["count"]
        entry["signatures"] += 1
        entry["first_seen"] = _min(entry["first_seen"], item["first_seen"])
        entry["last_seen"] = _max(entry["last_seen"], item["last_seen"])
    report = ErrorReport(
        signatures=signatures,
        templates=sorted(templates.values(), key=lambda t: (-t["count"], t["template"])),
        failures=sum(s["count"] for s in signatures),
        records=state.records,
        windows=per_window,
        since=since,
        until=until,
        seconds=time.perf_counter() - started,
    )
    if write:
        layout.write_atomic(
            index_dir / layout.ERRORS_DIR / ERRORS_FILE,
            orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2),
        )
    return report


def format_top(report: ErrorReport, top: int) -> list[str]:
    from wirelog.times import format_time

    lines = [
        f"{len(report.signatures)} error signature(s) in {report.failures:,} failure(s) "
        f"of {report.records:,} indexed record(s); top {min(top, len(report.signatures))}:"
    ]
    for item in report.signatures[:top]:
        lines.append(
            f"{item['count']:>9,}  {item['signature']}\n"
            f"           first {format_time(item['first_seen'])}  last {format_time(item['last_seen'])}  "
            f"groups {item['groups']} ({', '.join(item['group_sample'])}"
            f"{', ...' if item['groups'] > len(item['group_sample']) else ''})\n"
            f"           exemplars {', '.join(item['exemplars']) or '-'}"
            + (f"\n           template {item['template']}" if item["template"] else "")
        )
    return lines


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)
