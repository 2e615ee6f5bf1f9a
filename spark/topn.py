"""The top-N hashtags of a stream of posts, as one Spark job: the check of the multi-tier example.

The multi-tier example (scenarios/topn, docs/multi-tier.md) counts hashtags with SDK workers over strict
queues, tier by tier; this job computes the same top N straight from the raw stream file (JSON lines,
`{"id", "author", "text"}`), with Spark SQL only: the lower-cased text's `HASHTAG_PATTERN` matches,
distinct per post, exploded, counted, ordered by count descending and then by tag ascending (the one
tie-break both sides use: `rank_key`). It also returns the totals (distinct tags, mentions, posts) so a
check can compare more than the head of the list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

HASHTAG_PATTERN = r"#([a-z0-9_]+)"  # on the lower-cased text; group 1 is the tag. ASCII only, both sides.


def rank_key(tag: str, count: int) -> tuple[int, str]:
    """The order of the ranking: more mentions first; equal counts by tag name (deterministic ties)."""
    return (-count, tag)


@dataclass(frozen=True, slots=True)
class TopN:
    top: list[tuple[str, int]]  # (tag, mentions), best first
    tags: int  # distinct tags in the stream
    mentions: int  # (post, tag) pairs: each post counts a tag once
    posts: int


def top_hashtags(spark: Any, posts_file: Path, n: int) -> TopN:
    """The `n` most mentioned hashtags of the posts in `posts_file` (JSON lines)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField(name, StringType()) for name in ("id", "author", "text")])
    posts = spark.read.schema(schema).json(str(posts_file))
    tags = F.array_distinct(F.regexp_extract_all(F.lower(F.col("text")), F.lit(HASHTAG_PATTERN), F.lit(1)))
    mentions = posts.select(F.explode(tags).alias("tag"))
    counts = mentions.groupBy("tag").agg(F.count(F.lit(1)).alias("mentions")).cache()
    try:
        head = counts.orderBy(F.col("mentions").desc(), F.col("tag").asc()).limit(n).collect()
        totals = counts.agg(F.count(F.lit(1)).alias("tags"), F.sum("mentions").alias("mentions")).first()
    finally:
        counts.unpersist()
    return TopN(
        top=[(str(row["tag"]), int(row["mentions"])) for row in head],
        tags=int(totals["tags"] or 0),
        mentions=int(totals["mentions"] or 0),
        posts=int(posts.count()),
    )
