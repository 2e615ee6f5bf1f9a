"""`GET /admin/v1/search?message_id=...`: the `strictq search --json` document over HTTP, for a web page.

Authenticated like the other admin routes (an `admin` or `operator` key in X-BV-API-Key or
Authorization: Bearer; never `proxy`: records hold message bodies), by the admin routes' own check, which
the composition root hands in (`SearchGate`: spark imports nothing of the queue core). An admin gets only
records of its own tenant (their `tenant` field; access.scope), as if the others did not exist; an
operator gets every record. Query parameters: `message_id`, `request_id`, `group`, `worker`, `status`,
`since`, `until` (same formats as the CLI), `limit`. The lookup (pyarrow file reads) runs in a thread,
never on the event loop. Errors are the one error body `{"error": {"code", "message", "details"?}}`
(docs/errors.md): 400 `invalid_parameter` (`details.field` names it), 404 `no_index` (none built yet),
409 `index_mismatch` (an index of another version or bucket count).

`PageIndex` gives the operator's dashboard (gateway.dashboard) the same search, rendered as the lines
`strictq search` prints, and the top known error cases `strictq errors` wrote beside the index.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from access.permissions import READ_ROLES
from access.scope import Scope
from protocol.errors import StrictqError

if TYPE_CHECKING:
    from .search import Query, SearchResult

PATH = "/admin/v1/search"
_PARAMS = ("message_id", "request_id", "group", "worker", "status", "since", "until", "limit")
MAX_LIMIT_DIGITS = 19


@dataclasses.dataclass(frozen=True, slots=True)
class SearchGate:
    """The admin routes' authentication and error rendering, handed in by the composition root
    (strictq.serve: queue_core.admin_http's), so search answers exactly as every admin route does."""

    authorize: Callable[[web.Request, tuple[str, ...]], Scope]  # 401/403 as StrictqError, else the scope
    render_error: Callable[[StrictqError], web.StreamResponse]  # the admin dialect's one error body


SEARCH_INDEX = web.AppKey("strictq_search_index", Path)
SEARCH_GATE = web.AppKey("strictq_search_gate", SearchGate)


def add_search_route(app: web.Application, index_dir: Path, gate: SearchGate) -> None:
    """Mount the search route over the index in `index_dir`, behind `gate`."""
    app[SEARCH_INDEX] = Path(index_dir)
    app[SEARCH_GATE] = gate
    app.router.add_get(PATH, search_handler)


class SearchError(StrictqError):
    """A search request the route refuses; `details.field` names the parameter when one is at fault."""

    status = 400
    code = "invalid_parameter"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, **({"field": field} if field is not None else {}))


class InvalidParameter(SearchError):
    pass


class NoIndex(SearchError):
    """No index has been built yet."""

    status = 404
    code = "no_index"


class IndexOutOfDate(SearchError):
    """The index is of another version or bucket count: it needs a rebuild."""

    status = 409
    code = "index_mismatch"


def _limit(raw: str) -> int:
    """`limit` as plain ASCII digits (int() would also take '٣', '1_0', ' 5' and '+5'), at least 1."""
    digits = raw.isascii() and raw.isdigit() and len(raw) <= MAX_LIMIT_DIGITS
    if not digits or int(raw) < 1:
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
    """Every refusal as the admin routes' one error body, with the status it carries (docs/errors.md)."""
    try:
        return await _search(request)
    except StrictqError as exc:
        return request.app[SEARCH_GATE].render_error(exc)


async def _search(request: web.Request) -> web.StreamResponse:
    scope = request.app[SEARCH_GATE].authorize(request, READ_ROLES)
    from .story import story_json

    result = await scoped_search(request.app[SEARCH_INDEX], parse_query(request.query), scope)
    document = story_json(result)
    if not scope.operator:
        # The lookup counts files and rows read before the tenant filter: they would tell another
        # tenant's admin whether a group, worker or message id exists. Only operators see them.
        document.pop("lookup", None)
    return web.Response(body=orjson.dumps(document), content_type="application/json")


def parse_query(params: Mapping[str, str], now: float | None = None) -> Query:
    """The search's query from the route's parameters; InvalidParameter (400, naming it) for a bad one."""
    from wirelog.times import TimeParseError, parse_time

    from .search import Query

    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise InvalidParameter(f"unknown parameter(s): {', '.join(unknown)}")
    now = time.time() if now is None else now
    times: dict[str, float | None] = {"since": None, "until": None}
    for name in times:
        if name in params:
            try:
                times[name] = parse_time(_time_text(params[name], name), now=now)
            except (TimeParseError, ValueError) as exc:
                raise InvalidParameter(f"{name}: {exc}", name) from None
    try:
        limit = _limit(params["limit"]) if "limit" in params else None
    except ValueError as exc:
        raise InvalidParameter(str(exc), "limit") from None
    return Query(
        message_id=params.get("message_id"),
        request_id=params.get("request_id"),
        group=params.get("group"),
        worker=params.get("worker"),
        status=params.get("status"),
        since=times["since"],
        until=times["until"],
        limit=limit,
    )


async def scoped_search(index: Path, query: Query, scope: Scope) -> SearchResult:
    """The lookup in a thread, within the caller's scope; the refusals as this route's errors (an admin's
    hide the server's paths)."""
    from .layout import IndexMismatch, IndexMissing
    from .search import QueryError

    try:
        return await asyncio.to_thread(_scoped_search, index, query, scope)
    except QueryError as exc:
        raise InvalidParameter(str(exc)) from None
    except IndexMissing as exc:
        raise NoIndex(str(exc) if scope.operator else "no search index yet; ask an operator") from None
    except IndexMismatch as exc:
        hidden = "the search index needs a rebuild; ask an operator"
        raise IndexOutOfDate(str(exc) if scope.operator else hidden) from None


@dataclasses.dataclass(frozen=True, slots=True)
class PageIndex:
    """The index as the operator's dashboard reads it (gateway.dashboard's `StoryIndex`): whether one is
    built, a search's story as `strictq search` prints it, and the top known error cases."""

    path: Path

    def ready(self) -> bool:
        from .layout import STATE_FILE

        return (self.path / STATE_FILE).is_file()

    async def story(self, params: Mapping[str, str], scope: Scope) -> dict[str, Any]:
        """The summary and the lines `strictq search` prints, within the caller's scope. Raises this
        route's errors (400 `invalid_parameter`, 404 `no_index`, 409 `index_mismatch`)."""
        from .story import story_lines, summarize

        result = await scoped_search(self.path, parse_query(params), scope)
        return {
            "query": result.query.to_json(),
            "summary": summarize(result.rows),
            "lines": story_lines(result),
            "truncated": result.truncated,
        }

    def error_cases(self, scope: Scope, top: int = 10) -> dict[str, Any] | None:
        """The top signatures `strictq errors` wrote beside the index; None when there are none yet, or
        for a tenant's admin: they are counted over every tenant's records (signatures name hosts and
        paths, exemplars message ids), so they are operators' only."""
        from .errors import ERRORS_FILE
        from .layout import ERRORS_DIR

        if not scope.operator:
            return None
        try:
            report = orjson.loads((self.path / ERRORS_DIR / ERRORS_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(report, dict) or not isinstance(report.get("signatures"), list):
            return None
        return {
            "generated": report.get("generated"),
            "records": report.get("records"),
            "failures": report.get("failures"),
            "signatures": [s for s in report["signatures"] if isinstance(s, dict)][:top],
        }


def _scoped_search(index: Path, query: Query, scope: Scope) -> SearchResult:
    """The search, keeping only records the caller's scope sees; the limit applies to those."""
    from .search import QueryError, SearchResult, cache_for, search

    cache = cache_for(index)  # the gateway lives long: its footers and `_index.json` stay parsed
    if scope.operator:
        return search(index, query, with_records=True, cache=cache)
    if query.limit is not None and query.limit < 1:
        raise QueryError("--limit must be >= 1")
    found = search(index, dataclasses.replace(query, limit=None), with_records=True, cache=cache)
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
