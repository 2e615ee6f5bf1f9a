"""`GET /admin/v1/search?message_id=...`: the `strictq search --json` document over HTTP, for a web page.

Authenticated like the other admin routes (queue_core.admin_http: an `admin` or `proxy` key in
X-BV-API-Key or Authorization: Bearer). Query parameters: `message_id`, `group`, `worker`, `status`,
`since`, `until` (same formats as the CLI), `limit`. The lookup (pyarrow file reads) runs in a thread,
never on the event loop. Errors are JSON `{code, message}`: 400 bad parameter, 404 no index yet,
409 index of another version or bucket count.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
from aiohttp import web

from gateway.keys import KeyRing
from queue_core.admin_http import ADMIN_KEYS, READ_ROLES, Forbidden, Unauthorized, authenticate, json_response

SEARCH_INDEX = web.AppKey("strictq_search_index", Path)
PATH = "/admin/v1/search"
_PARAMS = ("message_id", "group", "worker", "status", "since", "until", "limit")


def add_search_route(app: web.Application, index_dir: Path, keys: KeyRing) -> None:
    """Mount the search route; reuses the admin key ring (set here if the admin routes are not mounted)."""
    app[SEARCH_INDEX] = Path(index_dir)
    if ADMIN_KEYS not in app:
        app[ADMIN_KEYS] = keys
    app.router.add_get(PATH, search_handler)


def _error(status: int, code: str, message: str) -> web.Response:
    return json_response({"code": code, "message": message}, status)


async def search_handler(request: web.Request) -> web.StreamResponse:
    try:
        authenticate(request, READ_ROLES)
    except (Unauthorized, Forbidden) as exc:
        return _error(401 if isinstance(exc, Unauthorized) else 403, exc.code, str(exc))
    from wirelog.times import TimeParseError, parse_time

    from .layout import IndexMismatch, IndexMissing
    from .search import Query, QueryError, search
    from .story import story_json

    params = request.query
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        return _error(400, "invalid-parameter", f"unknown parameter(s): {', '.join(unknown)}")
    now = time.time()
    try:
        since = parse_time(params["since"], now=now) if "since" in params else None
        until = parse_time(params["until"], now=now) if "until" in params else None
        limit = int(params["limit"]) if "limit" in params else None
    except (TimeParseError, ValueError) as exc:
        return _error(400, "invalid-parameter", str(exc))
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
        result = await asyncio.to_thread(search, request.app[SEARCH_INDEX], query, with_records=True)
    except QueryError as exc:
        return _error(400, "invalid-parameter", str(exc))
    except IndexMissing as exc:
        return _error(404, "no-index", str(exc))
    except IndexMismatch as exc:
        return _error(409, "index-mismatch", str(exc))
    return web.Response(body=orjson.dumps(story_json(result)), content_type="application/json")
