"""The bucket of a message id: `pmod(crc32(utf8(id)), n)`, the same in Spark SQL and in plain Python.

Spark's `hash()` (murmur3 with Spark's own seed) has no cheap Python twin; crc32 is in both Spark SQL
and zlib, so the pyarrow lookup finds the bucket without a JVM. A record without a message id hashes
as the empty string (bucket 0). Parity is tested on random and non-ASCII ids.
"""

from __future__ import annotations

import zlib
from typing import Any

DEFAULT_BUCKETS = 64
MAX_BUCKETS = 4096


def bucket_of(message_id: str | None, buckets: int) -> int:
    """The bucket a message id's records live in (0 <= bucket < buckets)."""
    data = (message_id or "").encode("utf-8", "surrogatepass")
    return zlib.crc32(data) % buckets  # crc32 is unsigned: % is already pmod


def spark_bucket(column: Any, buckets: int) -> Any:
    """The same as a Spark Column expression: `pmod(crc32(coalesce(id, '')), buckets)` as an int."""
    from pyspark.sql import functions as F

    return F.pmod(F.crc32(F.coalesce(column, F.lit(""))), F.lit(buckets)).cast("int")


def check_bucket_count(buckets: int) -> int:
    if not isinstance(buckets, int) or not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"bucket count must be 1-{MAX_BUCKETS}, not {buckets!r}")
    return buckets
