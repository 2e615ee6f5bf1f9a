"""The operator's dashboard: `GET /dashboard`, a server-rendered page of every gateway, whatever its backend
(the core in process, a queue server, a cluster): it reads the queues through the backend port
(`QueueBackend.figures`, queue_core.figures) and, in front of a cluster, the cluster's partitions, owners and
standbys' lag (gateway.cluster_figures). What only failure management or the fences hub provide is shown
where this gateway has them, and said to be elsewhere where it has not.

It shows the caller's queues (depth, age of the oldest message, AgeOfFirstAttempt, a chart of the backlog
age over the last minutes: gateway.dashboard_history), the groups with the oldest backlog, workers
(healthy, suspect, fenced, probing, blacklisted), suspended queues, parked groups, the top error cases and
recent events, and a message-story search box over the wire-log index (`strictq search`'s lines). Its
buttons fence, unfence, lift a blacklist, suspend, resume and release a parked group, each after a
confirmation, by calling the admin routes those actions already have.

Routes (all HTML but the static files):
- `GET /dashboard`: the page, or the login form without a session; `?by=message_id|group|worker&q=...`
  searches the index (a bad value: 400 with the page saying why);
- `POST /dashboard/login` (form field `key`), `POST /dashboard/logout` (form field `csrf`);
- `GET /dashboard/panels`: the page's panels alone, for its refresh (needs `X-Strictq-CSRF`);
- `GET /dashboard/static/{dashboard.js,dashboard.css,favicon.svg}`.

Who sees what: exactly what the key's scope sees on the admin routes (queue_core.scope): an `admin` its
tenant, an `operator` every tenant; other roles cannot log in. Sessions, the cookie and CSRF:
gateway.dashboard_session. Every page is sent with a Content-Security-Policy allowing only this origin's
script and style (no inline script), `frame-ancestors 'none'` and `Cache-Control: no-store`. Keys are
never logged; failed logins are logged with the peer address and why, never with what was typed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import jinja2
from aiohttp import web

from access.keys import Credential, KeyRing
from protocol.errors import StrictqError
from queue_core.admin_http import UNTENANTED
from queue_core.backend import QueueBackend
from queue_core.control import ControlHub
from queue_core.figures import Figures
from queue_core.health_view import ErrorCases, HealthView
from queue_core.machine import QueueError
from queue_core.scope import Scope

from .cluster_figures import ClusterFigures, ClusterSource
from .dashboard_history import INTERVAL, BacklogHistory
from .dashboard_session import (
    CSRF_FIELD,
    CSRF_HEADER,
    DASHBOARD_ROLES,
    Session,
    SessionStore,
    clear_cookie,
    csrf_ok,
    session_cookie,
    session_middleware,
    set_cookie,
)
from .dashboard_view import CHART, EVENTS, build_view

log = logging.getLogger("strictq.dashboard")
MAX_LOGIN_BODY = 8 * 1024
SEARCH_BY = ("message_id", "group", "worker")
SEARCH_LIMIT = "200"  # records of one search shown at most
MAX_SEARCH = 256
STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "favicon.svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form POST's Origin "null"
    "Cache-Control": "no-store",
}


class StoryIndex(Protocol):
    """The wire-log index as the page reads it (spark.admin_endpoint.PageIndex; the composition root
    passes it, so the gateway does not import spark)."""

    def ready(self) -> bool: ...

    async def story(self, params: Mapping[str, str], scope: Scope) -> dict[str, Any]: ...

    def error_cases(self, scope: Scope, top: int = 10) -> dict[str, Any] | None: ...


# The page's buttons and the admin route each calls: a button shows only where this app serves its route.
ACTION_ROUTES = {
    "fence": ("PUT", "/admin/v1/fences/{worker}"),
    "unfence": ("DELETE", "/admin/v1/fences/{worker}"),
    "lift": ("DELETE", "/admin/v1/blacklist/{worker}"),
    "suspend": ("POST", "/admin/v1/queues/{queue}/suspend"),
    "resume": ("POST", "/admin/v1/queues/{queue}/resume"),
    "release": ("POST", "/admin/v1/queues/{queue}/groups/release"),
}


@dataclass(slots=True)
class Dashboard:
    backend: QueueBackend
    hub: ControlHub | None
    keys: KeyRing
    health: HealthView | None
    index: StoryIndex | None
    sessions: SessionStore
    history: BacklogHistory
    templates: jinja2.Environment
    static: dict[str, bytes]
    refresh: float
    cluster: ClusterSource | None = None
    allowed: frozenset[str] = frozenset()  # ACTION_ROUTES' kinds this app serves (known at start-up)


DASHBOARD = web.AppKey("strictq_dashboard", Dashboard)


def add_dashboard(
    app: web.Application,
    backend: QueueBackend,
    hub: ControlHub | None,
    keys: KeyRing,
    health: HealthView | None = None,
    index: StoryIndex | None = None,
    *,
    cluster: ClusterSource | None = None,
    sessions: SessionStore | None = None,
    interval: float = INTERVAL,
    refresh: float = 5.0,
) -> Dashboard:
    """Serve the dashboard from `app`; `hub`: the fences this gateway holds (None: none here);
    `health`: failure management's state, wherever it runs (queue_core.health_view; None: off);
    `index`: the wire-log index for the search box and the top error cases (None: the page says there is
    none); `cluster`: a cluster's state (partitions, owners, lag). `interval`: seconds between backlog
    samples; `refresh`: seconds between the page's refreshes (0: none). Buttons show only where `app`
    serves their route."""
    dashboard = Dashboard(
        backend=backend,
        hub=hub,
        keys=keys,
        health=health,
        index=index,
        sessions=sessions or SessionStore(keys),
        history=BacklogHistory.of(backend, interval=interval),
        templates=_templates(),
        static={name: _static(name) for name in STATIC},
        refresh=refresh,
        cluster=cluster,
    )
    app[DASHBOARD] = dashboard
    app.middlewares.append(session_middleware(dashboard.sessions))
    app.router.add_get("/dashboard", page)
    app.router.add_post("/dashboard/login", login)
    app.router.add_post("/dashboard/logout", logout)
    app.router.add_get("/dashboard/panels", panels)
    app.router.add_get("/dashboard/static/{name}", static)

    async def start(app: web.Application) -> None:
        served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
        dashboard.allowed = frozenset(kind for kind, route in ACTION_ROUTES.items() if route in served)
        dashboard.history.start()

    async def close(app: web.Application) -> None:
        await dashboard.history.close()

    app.on_startup.append(start)
    app.on_cleanup.append(close)
    return dashboard


# ------------------------------------------------------------------------------------------- rendering
def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gateway", "dashboard_templates"),
        autoescape=True,  # every value is escaped for HTML (attributes included) unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,  # read once: the templates are package data
    )
    env.filters["age"] = age
    return env


def _static(name: str) -> bytes:
    return resources.files("gateway").joinpath("dashboard_static", name).read_bytes()


def age(seconds: Any) -> str:
    """A duration as people read it: `0`, `850 ms`, `42 s`, `5 min 07 s`, `3 h 20 min`, `2 d 4 h`."""
    if not isinstance(seconds, int | float) or seconds <= 0:
        return "0"
    if seconds < 0.9995:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 9.95:  # what rounds to 10.0 is shown as 10 s
        return f"{seconds:.1f} s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=SECURITY_HEADERS)


def _render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    return _html(request.app[DASHBOARD].templates.get_template(template).render(**context), status)


def _message(request: web.Request, message: str, status: int) -> web.Response:
    return _render(request, "message.html", status, message=message)


def _see_dashboard() -> web.Response:
    """303 to the page: after a login or logout the browser GETs it (a reload posts nothing again)."""
    return web.Response(status=303, headers={"Location": "/dashboard", **SECURITY_HEADERS})


def _login_form(request: web.Request, error: str | None = None, status: int = 200) -> web.Response:
    return _render(request, "login.html", status, error=error)


# -------------------------------------------------------------------------------------------- sessions
def _session(request: web.Request) -> tuple[Session, Credential] | None:
    return request.app[DASHBOARD].sessions.find(session_cookie(request))


def _scope(request: web.Request, credential: Credential) -> Scope:
    return Scope(credential, request.app[DASHBOARD].keys, request.app.get(UNTENANTED, False))


def _same_origin(request: web.Request) -> bool:
    """A form POST from this origin (or from a client sending no Origin, as curl): never another site's."""
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.host}"


# -------------------------------------------------------------------------------------------- handlers
async def login(request: web.Request) -> web.StreamResponse:
    peer = request.remote or "?"  # log lines are escaped (wirelog.logsafe)
    if not _same_origin(request):
        log.warning("dashboard: refused a login from %s: posted from another origin", peer)
        return _message(request, "A login must be posted from the dashboard's own page.", 403)
    if request.content_length is None:
        return _login_form(request, "Send the login form with a Content-Length.", 411)
    if request.content_length > MAX_LOGIN_BODY:
        return _login_form(request, "Send the login form (at most 8 KiB).", 413)
    if request.content_type != "application/x-www-form-urlencoded":
        return _login_form(request, "Send the login form (application/x-www-form-urlencoded).", 415)
    try:
        form = await request.post()
    except ValueError:
        return _login_form(request, "The login form could not be read.", 400)
    key = form.get("key")
    if not isinstance(key, str) or not key.strip():
        log.info("dashboard: refused a login from %s: no key", peer)
        return _login_form(request, "Enter an admin or operator key.", 401)
    dashboard = request.app[DASHBOARD]
    credential = dashboard.keys.by_secret(key.strip())
    if credential is None:
        log.warning("dashboard: refused a login from %s: unknown key", peer)
        return _login_form(request, "That key is not in the gateway's key file.", 401)
    if credential.role not in DASHBOARD_ROLES:
        log.warning("dashboard: refused a login of %s from %s: role %s", credential.id, peer, credential.role)
        return _login_form(
            request,
            f"A {credential.role} key cannot open the dashboard: use an admin or operator key.",
            403,
        )
    dashboard.sessions.close(session_cookie(request))  # a new session id at every login
    session_id, _ = dashboard.sessions.open(credential)
    log.info("dashboard: %s (%s) logged in from %s", credential.id, credential.role, peer)
    response = _see_dashboard()
    set_cookie(response, request, session_id)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    found = _session(request)
    if found is not None:
        if request.content_type != "application/x-www-form-urlencoded":
            return _message(request, "Log out with the page's button.", 400)
        form = await request.post()
        token = form.get(CSRF_FIELD)
        if not _same_origin(request) or not csrf_ok(found[0], token if isinstance(token, str) else None):
            return _message(request, "Log out with the page's button (the form's token did not match).", 403)
        request.app[DASHBOARD].sessions.close(session_cookie(request))
        log.info("dashboard: %s logged out", found[1].id)
    response = _see_dashboard()
    clear_cookie(response, request)
    return response


async def page(request: web.Request) -> web.StreamResponse:
    found = _session(request)
    if found is None:
        return _login_form(request)
    session, credential = found
    scope = _scope(request, credential)
    dashboard = request.app[DASHBOARD]
    search, status = await _search(request, dashboard, scope)
    return _render(
        request,
        "page.html",
        status,
        csrf=session.csrf,
        view=await _view(dashboard, scope),
        search=search,
        refresh=dashboard.refresh,
        chart=CHART,
        interval=dashboard.history.interval,
    )


async def panels(request: web.Request) -> web.StreamResponse:
    found = _session(request)
    if found is None:
        return _message(request, "Your dashboard session has ended: log in again.", 401)
    session, credential = found
    if not csrf_ok(session, request.headers.get(CSRF_HEADER)):
        return _message(request, f"The panels need the page's token in {CSRF_HEADER}.", 403)
    dashboard = request.app[DASHBOARD]
    view = await _view(dashboard, _scope(request, credential))
    template = dashboard.templates.get_template("panels.html")
    return _html(template.render(view=view, chart=CHART, interval=dashboard.history.interval))


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    body = request.app[DASHBOARD].static.get(name)
    if body is None:
        raise web.HTTPNotFound()
    return web.Response(
        body=body,
        content_type=STATIC[name],
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
    )


async def _view(dashboard: Dashboard, scope: Scope) -> Any:
    index = dashboard.index
    unreachable = None
    try:
        figures = await dashboard.backend.figures()
    except QueueError as exc:  # the queue server or every partition out of reach: the page says so
        figures, unreachable = Figures(time.time(), (), ready=False), exc.message
    cluster: ClusterFigures | str | None = None
    if dashboard.cluster is not None and scope.operator:
        cluster = await _cluster(dashboard.cluster)
    status, cases = await _health(dashboard.health, scope, figures.at)
    return build_view(
        scope,
        figures,
        dashboard.hub,
        dashboard.keys,
        status,
        cases,
        dashboard.history,
        index.error_cases(scope) if index is not None and index.ready() else None,
        index is not None and index.ready(),
        allowed=dashboard.allowed,
        cluster=cluster if isinstance(cluster, ClusterFigures) else None,
        cluster_error=cluster if isinstance(cluster, str) else None,
        unreachable=unreachable,
    )


async def _health(
    health: HealthView | None, scope: Scope, now: float
) -> tuple[dict[str, Any] | None, ErrorCases | None]:
    """Failure management's status and error cases for the page (None, None: not running, or out of
    reach now: the rest of the page is still worth showing)."""
    if health is None:
        return None, None
    try:
        return await health.status(scope, EVENTS), await health.error_cases(scope, now)
    except Exception as exc:  # the queue server or the decider out of reach, a takeover
        log.info("dashboard: cannot read failure management's state: %s", exc)
        return None, None


async def _cluster(source: ClusterSource) -> ClusterFigures | str:
    """The cluster's state, or why it cannot be read now (JetStream electing a leader, out of reach)."""
    try:
        return await source.cluster_figures()
    except Exception as exc:  # the rest of the page is still worth showing
        log.info("dashboard: cannot read the cluster's state: %s", exc)
        return f"the cluster's state cannot be read now ({type(exc).__name__}: {exc})"


async def _search(request: web.Request, dashboard: Dashboard, scope: Scope) -> tuple[dict[str, Any], int]:
    """The search box's query and result: (what the template shows, the page's status)."""
    by = request.query.get("by", "message_id")
    q = request.query.get("q", "").strip()
    shown: dict[str, Any] = {
        "by": by if by in SEARCH_BY else "message_id",
        "q": q,
        "story": None,
        "error": None,
    }
    if "q" not in request.query:
        return shown, 200
    if by not in SEARCH_BY:
        shown["error"] = f"Search by one of {', '.join(SEARCH_BY)}."
        return shown, 400
    if not q or len(q) > MAX_SEARCH:
        shown["error"] = f"Enter a {by.replace('_', ' ')} of 1-{MAX_SEARCH} characters."
        return shown, 400
    if dashboard.index is None:
        shown["error"] = "This gateway has no search index configured."
        return shown, 200
    try:
        shown["story"] = await dashboard.index.story({by: q, "limit": SEARCH_LIMIT}, scope)
    except StrictqError as exc:
        shown["error"] = exc.public_message or str(exc)
        return shown, exc.status if exc.status == 400 else 200
    return shown, 200
