"""Error signatures: the variable parts of a failure masked, so equal failures compare equal.

A signature is `<kind> <method> <endpoint> <status class> <error text>`, where the endpoint is host +
path with id-like path segments as `{id}` (query dropped), the status class is `5xx`/`4xx`, `error`
(no response) or the proxy's action (`stale-lease`, `block`, ...), and the error text (the http
record's `error` or a failed log's `reason`) has quoted values, uuids, hex and numbers masked.

Every rule is one regular expression written in the common subset of Python's `re` and Java's regex,
applied in the same order by `mask_*` (Python) and `spark_*` (Spark SQL `regexp_replace`), and the
tests check both give the same strings.
"""

from __future__ import annotations

import re
from typing import Any

from wirelog.record import ACTION_BLOCK, ACTION_STALE_LEASE, ACTION_UNMATCHED, ACTION_UNSYNCED

# (pattern, replacement) in order; quoted values first so nothing inside them is masked separately.
TEXT_RULES: tuple[tuple[str, str], ...] = (
    (r"'[^']*'", "<str>"),
    (r'"[^"]*"', "<str>"),
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<uuid>"),
    (r"\b0[xX][0-9a-fA-F]+\b", "<hex>"),
    (r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\b", "<hex>"),
    (r"\b[A-Za-z]+_(?=[A-Za-z0-9]*[0-9])[A-Za-z0-9]{4,}\b", "<id>"),
    (r"\b[0-9]+(?:\.[0-9]+)?\b", "<n>"),
    (r"\s+", " "),
)
# An id-like path segment: all digits, or 8+ characters with a digit (uuids, hex, ch_3f2a..., 10045231).
PATH_SEGMENT_RULE = (r"(?<=/)(?:[0-9]+|(?=[^/]{8,}(?:/|$))[^/]*[0-9][^/]*)(?=/|$)", "{id}")
URL_RULE = r"^[a-zA-Z][a-zA-Z0-9+.\-]*://(?:[^/?#@]*@)?([^/?#]*)([^?#]*)"
FAILED_ACTIONS = (ACTION_BLOCK, ACTION_STALE_LEASE, ACTION_UNSYNCED, ACTION_UNMATCHED)
OK_OUTCOMES = ("done", "ok", "success", "succeeded", "completed", "acked")
MAX_TEXT = 300  # characters of error text kept in a signature

_TEXT = [(re.compile(p), r) for p, r in TEXT_RULES]
_SEGMENT = re.compile(PATH_SEGMENT_RULE[0])
_URL = re.compile(URL_RULE)


# ---------------------------------------------------------------------------------------- python
def mask_text(text: str | None) -> str:
    if not text:
        return ""
    for pattern, replacement in _TEXT:
        text = pattern.sub(replacement, text)
    return text.strip()[:MAX_TEXT]


def mask_endpoint(url: str | None) -> str:
    if not url:
        return ""
    match = _URL.match(url)
    if match is None:
        return ""
    host, path = match.group(1).lower(), match.group(2) or "/"
    return host + _SEGMENT.sub(PATH_SEGMENT_RULE[1], path)


def status_class(status: int | None, error: str | None, action: str | None) -> str:
    if action in FAILED_ACTIONS:
        return str(action)
    if status is None:
        return "error"
    return f"{status // 100}xx"


def is_failure(row: dict[str, Any]) -> bool:
    if row.get("kind") == "http":
        status = row.get("status")
        return (
            bool(row.get("error")) or status is None or status >= 400 or row.get("action") in FAILED_ACTIONS
        )
    if row.get("kind") == "log":
        outcome = row.get("outcome")
        return bool(outcome) and str(outcome).lower() not in OK_OUTCOMES
    return False


def signature(row: dict[str, Any]) -> str:
    """The signature of a failed http or log record (see the module doc)."""
    kind = row.get("kind") or "-"
    if kind == "http":
        parts = [
            kind,
            row.get("method") or "-",
            mask_endpoint(row.get("url")) or "-",
            status_class(row.get("status"), row.get("error"), row.get("action")),
            mask_text(row.get("error")),
        ]
    else:
        parts = [kind, str(row.get("outcome") or "-").lower(), mask_text(row.get("reason"))]
    return " ".join(p for p in parts if p)


# ----------------------------------------------------------------------------------------- spark
def spark_mask_text(column: Any) -> Any:
    from pyspark.sql import functions as F

    expr = F.coalesce(column, F.lit(""))
    for pattern, replacement in TEXT_RULES:
        expr = F.regexp_replace(expr, pattern, replacement)
    return F.substring(F.trim(expr), 1, MAX_TEXT)


def spark_mask_endpoint(column: Any) -> Any:
    from pyspark.sql import functions as F

    url = F.coalesce(column, F.lit(""))
    host = F.lower(F.regexp_extract(url, URL_RULE, 1))
    path = F.regexp_extract(url, URL_RULE, 2)
    path = F.when(path == "", F.lit("/")).otherwise(path)
    masked = F.regexp_replace(path, PATH_SEGMENT_RULE[0], PATH_SEGMENT_RULE[1])
    matched = F.regexp_extract(url, URL_RULE, 0) != ""
    return F.when(matched, F.concat(host, masked)).otherwise(F.lit(""))


def spark_status_class(status: Any, action: Any) -> Any:
    from pyspark.sql import functions as F

    return (
        F.when(action.isin(*FAILED_ACTIONS), action)
        .when(status.isNull(), F.lit("error"))
        .otherwise(F.concat(F.floor(status / 100).cast("string"), F.lit("xx")))
    )


def spark_is_failure() -> Any:
    from pyspark.sql import functions as F

    http = (F.col("kind") == "http") & (
        (F.coalesce(F.col("error"), F.lit("")) != "")
        | F.col("status").isNull()
        | (F.col("status") >= 400)
        | F.col("action").isin(*FAILED_ACTIONS)
    )
    outcome = F.lower(F.col("outcome"))
    log = (F.col("kind") == "log") & outcome.isNotNull() & (outcome != "") & ~outcome.isin(*OK_OUTCOMES)
    return http | log


def spark_signature() -> Any:
    """Columns kind/method/url/status/action/error/outcome/reason -> the signature string."""
    from pyspark.sql import functions as F

    def part(expr: Any) -> Any:
        return F.when(expr == "", F.lit(None)).otherwise(expr)

    http = F.concat_ws(
        " ",
        F.col("kind"),
        F.coalesce(F.col("method"), F.lit("-")),
        F.coalesce(part(spark_mask_endpoint(F.col("url"))), F.lit("-")),
        spark_status_class(F.col("status"), F.col("action")),
        part(spark_mask_text(F.col("error"))),
    )
    other = F.concat_ws(
        " ",
        F.coalesce(F.col("kind"), F.lit("-")),
        F.coalesce(part(F.lower(F.col("outcome"))), F.lit("-")),
        part(spark_mask_text(F.col("reason"))),
    )
    return F.when(F.col("kind") == "http", http).otherwise(other)


def spark_message_text() -> Any:
    """The masked text Drain templates are mined from: the http error or the log reason."""
    from pyspark.sql import functions as F

    return F.when(F.col("kind") == "http", spark_mask_text(F.col("error"))).otherwise(
        spark_mask_text(F.col("reason"))
    )
