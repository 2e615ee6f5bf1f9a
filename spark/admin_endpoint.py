"""`GET /admin/v1/search?message_id=...`: the `strictq search --json` document over HTTP, for a web page.

Authenticated like the other admin routes (queue_core.admin_http: an `admin` or `operator` key in
X-BV-API-Key or Authorization: Bearer; never `proxy`: records hold message bodies). An admin gets only
records of its own tenant (their `tenant` field; queue_core.scope), as if the others did not exist; an
operator gets every record. Query parameters: `message_id`, `group`, `worker`, `status`, `since`, `until`
(same formats as the CLI), `limit`. The lookup (pyarrow file reads) runs in a thread, never on the event
loop. Errors are JSON `{code, message}`: 400 bad parameter, 404 no index yet, 409 index of another
version or bucket count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from gateway.keys import KeyRing
from queue_core.admin_http import ADMIN_KEYS, READ_ROLES, Forbidden, Unauthorized, json_response, scope_of
from queue_core.scope import Scope

if TYPE_CHECKING:
    from .search import Query, SearchResult

SEARCH_INDEX = web.AppKey("strictq_search_index", Path)
PATH = "/admin/v1/search"
_PARAMS = ("message_id", "group", "worker", "status", "since", "until", "limit")


def add_search_route(app: web.Application, index_dir: Path, keys: KeyRing) -> None:
    """Mount the search route; reuses the admin key ring (set here if the admin routes are not mounted)."""
    app[SEARCH_INDEX] = Path(index_dir)
    if ADMIN_KEYS not in app:
        app[ADMIN_KEYS] = keys
    app.router.add_get(PATH, search_handler)


def _error(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return json_response(body, status)


def _limit(raw: str) -> int:
    """`limit` as plain ASCII digits (int() would also take '٣', '1_0', ' 5' and '+5'), at least 1."""
    from queue_core.machine.text import INTEGER_RE

    if not INTEGER_RE.fullmatch(raw) or int(raw) < 1:
        raise ValueError(f"limit must be a whole number >= 1 in plain ASCII digits, got {raw!r}")
    return int(raw)


def _time_text(raw: str, name: str) -> str:
    """`since` / `until` as plain ASCII text: the time parser's `\\d` would take other scripts' digits."""
    if not raw.isascii() or not raw.isprintable() or raw != raw.strip():
        raise ValueError(
            f"must be ISO-8601 (2026-11-22T10:00:00Z) or a duration like 15m, in plain ASCII, got {raw!r}"
        )
    return raw


async def search_handler(request: web.Request) -> web.StreamResponse:
    try:
        scope = scope_of(request, READ_ROLES)
    except (Unauthorized, Forbidden) as exc:
        return _error(401 if isinstance(exc, Unauthorized) else 403, exc.code, str(exc))
    from wirelog.times import TimeParseError, parse_time

    from .layout import IndexMismatch, IndexMissing
    from .search import Query, QueryError
    from .story import story_json

    params = request.query
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        return _error(400, "invalid-parameter", f"unknown parameter(s): {', '.join(unknown)}")
    now = time.time()
    times: dict[str, float | None] = {"since": None, "until": None}
    for name in times:
        if name in params:
            try:
                times[name] = parse_time(_time_text(params[name], name), now=now)
            except (TimeParseError, ValueError) as exc:
                return _error(400, "invalid-parameter", f"{name}: {exc}", name)
    since, until = times["since"], times["until"]
    try:
        limit = _limit(params["limit"]) if "limit" in params else None
    except ValueError as exc:
        return _error(400, "invalid-parameter", str(exc), "limit")
    query = Query(
        message_id=params.get("message_id"),
        group=params.get("group"),
        worker=params.get("worker"),
        status=params.get("status"),
        since=since,
        until=until,
        limit=limit,
    )
    try:
        result = await asyncio.to_thread(_scoped_search, request.app[SEARCH_INDEX], query, scope)
    except QueryError as exc:
        return _error(400, "invalid-parameter", str(exc))
    except IndexMissing as exc:
        return _error(404, "no-index", str(exc) if scope.operator else "no search index yet; ask an operator")
    except IndexMismatch as exc:
        hidden = "the search index needs a rebuild; ask an operator"
        return _error(409, "index-mismatch", str(exc) if scope.operator else hidden)
    document = story_json(result)
    if not scope.operator:
        # The lookup counts files and rows read before the tenant filter: they would tell another
        # tenant's admin whether a group, worker or message id exists. Only operators see them.
        document.pop("lookup", None)
    return web.Response(body=orjson.dumps(document), content_type="application/json")


def _scoped_search(index: Path, query: Query, scope: Scope) -> SearchResult:
    """The search, keeping only records the caller's scope sees; the limit applies to those."""
    from .search import QueryError, SearchResult, search

    if scope.operator:
        return search(index, query, with_records=True)
    if query.limit is not None and query.limit < 1:
        raise QueryError("--limit must be >= 1")
    found = search(index, dataclasses.replace(query, limit=None), with_records=True)
    rows = [row for row in found.rows if scope.record(_record_of(row))]
    truncated = query.limit is not None and len(rows) > query.limit
    if query.limit is not None:
        rows = rows[: query.limit]
    return SearchResult(dataclasses.replace(found.query, limit=query.limit), rows, found.stats, truncated)


def _record_of(row: dict[str, object]) -> dict[str, object]:
    raw = row.get("record")
    try:
        record = orjson.loads(raw) if isinstance(raw, str | bytes) else None
    except orjson.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}
