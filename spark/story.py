"""A message's story: its records in time order, summarised, as text lines (CLI) or JSON (CLI --json and
the admin endpoint build the same document with `story_json`, so a web page shows what the CLI prints).
"""

from __future__ import annotations

from typing import Any

import orjson

from wirelog.record import (
    ACTION_BLOCK,
    ACTION_MIMIC,
    ACTION_PASS,
    ACTION_STALE_LEASE,
    ACTION_UNMATCHED,
    ACTION_UNSYNCED,
)
from wirelog.times import format_time

from .search import SearchResult

FENCE_ACTIONS = (ACTION_BLOCK, ACTION_STALE_LEASE, ACTION_UNSYNCED, ACTION_UNMATCHED, ACTION_MIMIC)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts an operator asks first: deliveries, attempts, retries, calls and failures, fence actions."""
    calls = [r for r in rows if r["kind"] == "http"]
    failed = [r for r in calls if _failed(r)]
    deliveries = [r for r in rows if r["kind"] == "delivery"]
    attempts = {(r["lease"], r["attempt"]) for r in rows if r["attempt"] is not None}
    fence = [r for r in calls if r["action"] in FENCE_ACTIONS] + [r for r in rows if r["kind"] == "event"]
    outcomes = [r["outcome"] for r in rows if r["kind"] == "log" and r["outcome"]]
    times = [r["ts"] for r in rows if r["ts"] is not None]
    receive = max((r["receive_count"] or 0 for r in deliveries), default=0)
    return {
        "records": len(rows),
        "messages": len({r["message_id"] for r in rows}),
        "deliveries": len(deliveries),
        "attempts": len(attempts),
        "retries": max(receive - 1, len(attempts) - 1, 0),
        "calls": len(calls),
        "failed_calls": len(failed),
        "fence_actions": len(fence),
        "outcome": outcomes[-1] if outcomes else None,
        "queues": sorted({r["queue"] for r in rows if r["queue"]}),
        "groups": sorted({r["group"] for r in rows if r["group"]}),
        "workers": sorted({r["worker"] for r in rows if r["worker"]}),
        "request_ids": sorted({r["request_id"] for r in rows if r.get("request_id")}),
        "first": times[0] if times else None,
        "last": times[-1] if times else None,
    }


def story_json(result: SearchResult) -> dict[str, Any]:
    """The document `strictq search --json` prints and `GET /admin/v1/search` returns."""
    records = []
    for row in result.rows:
        raw = row.get("record")
        records.append(orjson.loads(raw) if raw else {k: v for k, v in row.items() if k != "record"})
    return {
        "query": result.query.to_json(),
        "summary": summarize(result.rows),
        "records": records,
        "truncated": result.truncated,
        "lookup": result.stats.to_json(),
    }


def story_lines(result: SearchResult) -> list[str]:
    """Human-readable: one summary line, then one line per record."""
    rows = result.rows
    s = summarize(rows)
    query = result.query
    many = query.message_id is None
    if query.request_id is not None and many:
        what = f"request {query.request_id} · {s['messages']} message(s)"
    elif many:
        what = f"{s['messages']} message(s)"
    else:
        what = f"message {query.message_id}"
    head = [
        what,
        f"queue {','.join(s['queues']) or '-'}",
        f"group {','.join(s['groups'][:5]) or '-'}",
        f"{s['deliveries']} deliver{'y' if s['deliveries'] == 1 else 'ies'}",
        f"{s['attempts']} attempt(s) ({s['retries']} retr{'y' if s['retries'] == 1 else 'ies'})",
        f"{s['calls']} call(s) ({s['failed_calls']} failed)",
        f"{s['fence_actions']} fence action(s)",
    ]
    if s["outcome"]:
        head.append(f"outcome {s['outcome']}")
    lines = [" · ".join(head)]
    for row in rows:
        lines.append(format_row(row, with_message=many))
    if result.truncated:
        lines.append(f"(stopped at --limit {result.query.limit})")
    return lines


def format_row(row: dict[str, Any], *, with_message: bool = False) -> str:
    kind = row["kind"] or "-"
    where = f"attempt {row['attempt']}" if row["attempt"] is not None else "-"
    if kind == "http" and row["call"] is not None:
        where = f"call {row['attempt'] or '-'}.{row['call']}"
    parts = [format_time(row["ts"]), f"{kind:<8}", f"{where:<10}", _text(row["worker"])]
    if with_message:
        parts.insert(1, _text(row["message_id"]))
    if kind == "http":
        latency = row["latency_ms"]
        outcome = str(row["status"]) if row["status"] is not None else "ERR"
        parts += [
            _text(row["method"]),
            _text(row["url"]),
            "->",
            outcome,
            f"{latency:.1f}ms" if latency is not None else "-",
        ]
        if row["action"] and row["action"] != ACTION_PASS:
            parts.append(f"[{row['action']}]")
        if row["error"]:
            parts.append(f"error={row['error']!r}")
    elif kind == "delivery":
        parts += [
            f"seq={_text(row['seq'])}",
            f"receive_count={_text(row['receive_count'])}",
            f"lease={_text(row['lease'])}",
        ]
    elif kind == "log":
        parts.append(f"outcome={_text(row['outcome'])}")
        if row["reason"]:
            parts.append(f"reason={row['reason']!r}")
    elif kind == "event":
        parts.append(f"event={_text(row['event'])}")
        if row["reason"]:
            parts.append(f"reason={row['reason']!r}")
    return " ".join(parts)


def _failed(row: dict[str, Any]) -> bool:
    status = row["status"]
    return bool(row["error"]) or (status is not None and status >= 500) or status is None


def _text(value: Any) -> str:
    if value is None or value == "":
        return "-"
    text = str(value)
    return text if text.isprintable() else repr(text)
