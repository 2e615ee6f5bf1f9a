"""The operator's dashboard over HTTP (gateway.dashboard): login, sessions and CSRF, tenancy, escaping, bad
input, and what the panels show, against the in-process gateway with failure management on over real TLS.
The browser end of it is tests/test_dashboard_browser.py (real chromium against a real `strictq serve`).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from health_support import CREDENTIALS, QUEUE, Health, running_health, until

from access.keys import Credential, KeyRing
from gateway.dashboard import age
from gateway.dashboard_history import BacklogHistory, sparkline
from gateway.dashboard_session import CSRF_HEADER, SECURE_COOKIE, SessionStore
from queue_core.figures import Figures, QueueFigures
from queue_core.machine.effects import AttemptRecorded
from queue_core.machine.gauges import QueueGauges
from queue_core.machine.health import HealthMonitor, HealthSettings
from spark.admin_endpoint import PageIndex

OPERATOR = Credential("operator-1", "operator-secret-0123456789", "operator", "ops")
PRODUCER_2 = Credential("producer-t2", "producer2-secret-0123456789", "producer", "t2")
KEYS = [*CREDENTIALS, OPERATOR, PRODUCER_2]
CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')


@dataclass
class Browserless:
    """A client of the dashboard that keeps its cookie by hand (aiohttp's jar ignores IP hosts)."""

    health: Health
    session: aiohttp.ClientSession

    async def login(self, secret: str) -> tuple[int, str, str | None]:
        """(status, page, the session cookie's value if one was set)."""
        async with self.session.post(
            self.health.url + "/dashboard/login", data={"key": secret}, allow_redirects=False
        ) as answer:
            text = await answer.text()
            cookie = answer.cookies.get(SECURE_COOKIE)
            return answer.status, text, cookie.value if cookie is not None else None

    async def as_(self, key_id: str) -> tuple[str, str]:
        """Log `key_id` in: (its cookie, the page's CSRF token)."""
        status, _, cookie = await self.login(self.health.secret(key_id))
        assert status == 303 and cookie, status
        status, page = await self.get("/dashboard", cookie)
        assert status == 200
        match = CSRF_META.search(page)
        assert match is not None, page[:500]
        return cookie, match.group(1)

    async def get(self, path: str, cookie: str | None, csrf: str | None = None) -> tuple[int, str]:
        status, text, _ = await self.request("GET", path, cookie, csrf)
        return status, text

    async def request(
        self,
        method: str,
        path: str,
        cookie: str | None,
        csrf: str | None = None,
        json: Any = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        sent = dict(headers or {})
        if cookie is not None:
            sent["Cookie"] = f"{SECURE_COOKIE}={cookie}"
        if csrf is not None:
            sent[CSRF_HEADER] = csrf
        async with self.session.request(
            method, self.health.url + path, headers=sent, json=json, data=data, allow_redirects=False
        ) as answer:
            return answer.status, await answer.text(), answer


@pytest.fixture
async def dash(tmp_path: Path) -> AsyncIterator[Browserless]:
    keys = KeyRing(list(KEYS))
    async with running_health(tmp_path, keys=keys, story_index=PageIndex(tmp_path / "index")) as health:
        context = ssl.create_default_context(cafile=str(health.ca_file))
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as session:
            yield Browserless(health, session)


def _row(page: str, attribute: str, value: str) -> str | None:
    """The HTML of the table row with `attribute="value"`, or None."""
    match = re.search(rf'<tr [^>]*{attribute}="{re.escape(value)}"[^>]*>.*?</tr>', page, re.S)
    return match.group(0) if match else None


def _no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


# ------------------------------------------------------------------------------------------------ login
async def test_login_refuses_no_key_a_wrong_key_and_other_roles(
    dash: Browserless, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    status, page = await dash.get("/dashboard", None)
    assert status == 200 and 'action="/dashboard/login"' in page and 'id="panels"' not in page
    wrong = "not-a-key-of-this-gateway-0123456789"
    for secret, code, says in [
        ("", 401, "Enter an admin or operator key."),
        (wrong, 401, "That key is not in the gateway&#39;s key file."),
        (dash.health.secret("producer-1"), 403, "A producer key cannot open the dashboard"),
        (dash.health.secret("worker-1"), 403, "A worker key cannot open the dashboard"),
    ]:
        status, page, cookie = await dash.login(secret)
        assert (status, cookie) == (code, None), (secret, status)
        assert says in page and 'id="login-error"' in page
    # Refusals are logged, with the peer and why; no key typed ever is.
    logged = caplog.text
    assert "refused a login" in logged and "unknown key" in logged
    for credential in KEYS:
        assert credential.secret not in logged
    assert wrong not in logged
    _no_errors_logged(caplog)


async def test_a_login_sets_a_strict_session_cookie(
    dash: Browserless, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with dash.session.post(
        dash.health.url + "/dashboard/login",
        data={"key": dash.health.secret("admin-1")},
        allow_redirects=False,
    ) as answer:
        assert answer.status == 303 and answer.headers["Location"] == "/dashboard"
        raw = answer.headers["Set-Cookie"]
    morsel = SimpleCookie(raw)[SECURE_COOKIE]
    assert len(morsel.value) >= 40  # 32 random bytes
    assert (
        morsel["httponly"] and morsel["secure"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
    )
    assert not morsel["max-age"] and not morsel["expires"]  # a browser-session cookie
    status, page, answer = await dash.request("GET", "/dashboard", morsel.value)
    assert status == 200 and "admin-1 · admin of tenant t1" in page
    policy = answer.headers["Content-Security-Policy"]
    assert (
        "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    )
    assert answer.headers["Cache-Control"] == "no-store" and answer.headers["X-Frame-Options"] == "DENY"
    assert "<script>" not in page  # the one script is a file of this origin
    assert morsel.value not in caplog.text and dash.health.secret("admin-1") not in caplog.text


async def test_the_page_shows_queues_groups_and_workers(dash: Browserless) -> None:
    health = dash.health
    await health.send("customer-1", {"n": 1})
    await health.send("customer-1", {"n": 2})
    await health.send("customer-2", {"n": 3})
    await health.ok("PUT", "/admin/v1/fences/worker-2", "admin-1", {"mode": "block", "reason": "bad deploy"})
    cookie, csrf = await dash.as_("admin-1")
    status, page = await dash.get("/dashboard", cookie)
    assert status == 200
    row = _row(page, "data-queue", QUEUE)
    assert row is not None and '<td class="n">3</td>' in row
    assert 'data-path="/admin/v1/queues/jobs/suspend"' in row
    fenced = _row(page, "data-worker", "worker-2")
    assert (
        fenced is not None
        and 'data-state="fenced"' in fenced
        and "block, by an operator: bad deploy" in fenced
    )
    assert 'data-kind="unfence"' in fenced
    healthy = _row(page, "data-worker", "worker-1")
    assert healthy is not None and 'data-state="healthy"' in healthy and 'data-kind="fence"' in healthy
    assert "customer-1" in page and "customer-2" in page  # the groups panel
    # The refresh serves the panels alone, with the token.
    status, panels = await dash.get("/dashboard/panels", cookie, csrf)
    assert status == 200 and 'id="queues"' in panels and "<html" not in panels and 'id="search"' not in panels


async def test_failure_management_states_error_cases_and_parked_groups(dash: Browserless) -> None:
    health = dash.health
    for n in range(4):
        await health.send(f"g{n}", {"n": n})
    # worker-1 fails three attempts (SETTINGS.worker_failures): failure management fences it.
    for _ in range(3):
        (item,) = await health.poll("worker-1", limit=1)
        await health.fail("worker-1", item, "card declined", "http POST pay.example/v1/charge 4xx")
    # Fenced, then probing as soon as its first probe is out (the probe interval is 0.2 s): both hold it.
    held = ("fenced", "probing")
    await until(lambda: health.manager.monitor.worker_state("worker-1") in held, what="worker-1 fenced")
    # A group whose policy allows one attempt parks after its failure.
    await health.ok(
        "PUT",
        f"/admin/v1/queues/{QUEUE}/groups/policy",
        "admin-1",
        {"max_attempts": 1},
        params={"group": "g3"},
    )
    items = await health.poll("worker-2", limit=10)
    item = next(i for i in items if i["group"] == "g3")
    await health.fail("worker-2", item, "timeout", "http GET slow.example/x error")
    cookie, csrf = await dash.as_("admin-1")
    _, page = await dash.get("/dashboard", cookie)
    worker = _row(page, "data-worker", "worker-1")
    assert worker is not None and "by failure management" in worker
    assert re.search(r'data-state="(fenced|probing)"', worker), worker
    assert "http POST pay.example/v1/charge 4xx" in page and "card declined" in page  # top error cases
    parked = _row(page, "data-group", "g3")
    assert parked is not None and 'data-path="/admin/v1/queues/jobs/groups/release?group=g3"' in parked
    # The release button's call, as the page's script makes it: the session cookie and the token.
    status, body, _ = await dash.request(
        "POST", "/admin/v1/queues/jobs/groups/release?group=g3", cookie, csrf
    )
    assert status == 200 and '"released":1' in body.replace(" ", "")
    _, page = await dash.get("/dashboard", cookie)
    assert _row(page, "data-group", "g3") is None


# ------------------------------------------------------------------------------------------ csrf, logout
async def test_actions_need_the_sessions_csrf_token(dash: Browserless) -> None:
    cookie, csrf = await dash.as_("admin-1")
    fence = {"mode": "block", "reason": "from the page"}
    for token in (None, "", "x" * 43, csrf[:-1] + ("A" if csrf[-1] != "A" else "B")):
        status, body, _ = await dash.request("PUT", "/admin/v1/fences/worker-1", cookie, token, json=fence)
        assert status == 403 and '"code":"csrf_mismatch"' in body.replace(" ", ""), (token, body)
    status, _, _ = await dash.request("GET", "/admin/v1/fences", cookie)
    assert status == 403  # reads through the session need the token too
    status, _ = await dash.get("/dashboard/panels", cookie)
    assert status == 403
    assert dash.health.hub.fences() == []
    status, body, _ = await dash.request("PUT", "/admin/v1/fences/worker-1", cookie, csrf, json=fence)
    assert status == 200, body
    assert [f.worker for f in dash.health.hub.fences()] == ["worker-1"]
    # No cookie, or one that is not a session: the route answers as to anyone without a key.
    for bad in (None, "not-a-session"):
        status, body, _ = await dash.request("DELETE", "/admin/v1/fences/worker-1", bad, csrf)
        assert status == 401 and "unauthorized" in body
    # A key in the headers is used as before, whatever the cookie says.
    status, _, _ = await dash.request(
        "GET", "/admin/v1/fences", "not-a-session", headers={"X-BV-API-Key": dash.health.secret("admin-1")}
    )
    assert status == 200


async def test_logout_needs_the_token_and_ends_the_session(dash: Browserless) -> None:
    cookie, csrf = await dash.as_("admin-1")
    status, page, _ = await dash.request("POST", "/dashboard/logout", cookie, data={"csrf": "wrong"})
    assert status == 403 and "token did not match" in page
    status, page = await dash.get("/dashboard", cookie)
    assert status == 200 and 'id="panels"' in page  # still logged in
    status, _, answer = await dash.request("POST", "/dashboard/logout", cookie, data={"csrf": csrf})
    assert status == 303 and answer.cookies[SECURE_COOKIE].value == ""
    status, page = await dash.get("/dashboard", cookie)
    assert status == 200 and 'id="panels"' not in page and 'action="/dashboard/login"' in page
    status, _, _ = await dash.request("GET", "/admin/v1/fences", cookie, csrf)
    assert status == 401
    status, _ = await dash.get("/dashboard/panels", cookie, csrf)
    assert status == 401


async def test_a_login_from_another_origin_is_refused(dash: Browserless) -> None:
    status, page, answer = await dash.request(
        "POST",
        "/dashboard/login",
        None,
        data={"key": dash.health.secret("admin-1")},
        headers={"Origin": "https://evil.example"},
    )
    assert status == 403 and SECURE_COOKIE not in answer.cookies and "own page" in page


# ---------------------------------------------------------------------------------------------- tenancy
async def test_a_tenants_admin_sees_and_changes_only_its_tenant(dash: Browserless) -> None:
    health = dash.health
    await health.send("customer-1", {"n": 1})  # t1's jobs
    await health.call("POST", "/queue/1/invoices/send", "producer-t2", {"n": 1}, params={"group": "b1"})
    await health.ok(
        "PUT", "/admin/v1/fences/worker-3", "admin-1", {"mode": "block", "reason": "t1 secret reason"}
    )
    cookie, csrf = await dash.as_("other-1")
    _, page = await dash.get("/dashboard", cookie)
    _, panels = await dash.get("/dashboard/panels", cookie, csrf)
    for shown in (page, panels):
        assert _row(shown, "data-queue", "invoices") is not None
        assert _row(shown, "data-queue", QUEUE) is None and "customer-1" not in shown
        for worker in ("worker-1", "worker-2", "worker-3"):
            assert worker not in shown
        assert "t1 secret reason" not in shown
    assert "admin of tenant t2" in page
    # Its session cannot act on t1's queue or workers: as if they did not exist.
    for method, path, body in [
        ("POST", f"/admin/v1/queues/{QUEUE}/suspend", {"reason": "x"}),
        ("DELETE", "/admin/v1/fences/worker-3", None),
        ("PUT", "/admin/v1/fences/worker-1", {"mode": "block", "reason": "x"}),
    ]:
        status, text, _ = await dash.request(method, path, cookie, csrf, json=body)
        assert status == 404, (path, text)
    assert not health.manager.monitor.suspended(f"t1.{QUEUE}")
    # The operator sees both tenants, by core name.
    cookie, _ = await dash.as_("operator-1")
    _, page = await dash.get("/dashboard", cookie)
    assert _row(page, "data-queue", f"t1.{QUEUE}") is not None and _row(page, "data-queue", "t2.invoices")
    assert "operator: every tenant" in page and 'data-worker="worker-3"' in page


# ------------------------------------------------------------------------------------- input and output
async def test_names_and_reasons_are_escaped(dash: Browserless) -> None:
    health = dash.health
    group = "<img/src=x/onerror=alert(1)>"  # a group is ASCII punctuation, letters and digits
    await health.send(group, {"n": 1})
    await health.ok(
        "PUT", "/admin/v1/fences/worker-1", "admin-1", {"mode": "block", "reason": "<script>x()</script>"}
    )
    cookie, _ = await dash.as_("admin-1")
    _, page = await dash.get("/dashboard", cookie)
    assert "<img" not in page and "&lt;img/src=x/onerror=alert(1)&gt;" in page
    assert "<script>x()" not in page and "&lt;script&gt;x()&lt;/script&gt;" in page


async def test_bad_input_is_a_clear_4xx(dash: Browserless, caplog: pytest.LogCaptureFixture) -> None:
    cookie, _ = await dash.as_("admin-1")
    for query, says in [
        ("?by=body&q=x", "Search by one of message_id, group, worker."),
        ("?q=", "Enter a message id of 1-256 characters."),
        ("?by=group&q=" + "g" * 300, "Enter a group of 1-256 characters."),
        ("?q=not%20an%20id!", "malformed message id"),
    ]:
        status, page = await dash.get("/dashboard" + query, cookie)
        assert status == 400 and 'id="story-error"' in page and says in page, (query, status)
        assert 'id="panels"' in page  # the rest of the page is there
    # A well-formed search without an index says so (and hides the server's paths from an admin).
    status, page = await dash.get("/dashboard?q=1a2100ac58a00000", cookie)
    assert (
        status == 200
        and "no search index yet; ask an operator" in page
        and str(dash.health.wirelog.parent) not in page
    )
    assert 'id="no-index"' in page
    async with dash.session.post(dash.health.url + "/dashboard/login", json={"key": "x"}) as answer:
        assert answer.status == 415 and "login form" in await answer.text()
    status, _, _ = await dash.request("POST", "/dashboard/login", None, data={"key": "k" * 9000})
    assert status == 413
    status, body, _ = await dash.request("GET", "/dashboard/static/../../keys.toml", cookie)
    assert status == 404 and "{" in body
    status, body, _ = await dash.request("GET", "/dashboard/static/nothing.js", cookie)
    assert status == 404 and '"code":"no_such_route"' in body.replace(" ", "")
    status, body, _ = await dash.request("DELETE", "/dashboard", cookie)
    assert status == 405 and "method_not_allowed" in body
    status, body, _ = await dash.request("GET", "/dashboard/static/dashboard.js", None)
    assert status == 200 and "X-Strictq-CSRF" in body
    _no_errors_logged(caplog)


# ------------------------------------------------------------------------------------------------- units
def test_sessions_expire_when_idle_after_their_lifetime_and_by_count() -> None:
    now = [1000.0]
    admin, producer = CREDENTIALS[0], CREDENTIALS[1]
    store = SessionStore(KeyRing([admin, producer]), idle=60, lifetime=300, limit=3, clock=lambda: now[0])
    sid, session = store.open(admin)
    assert store.find(sid) == (session, admin)
    assert store.find(sid + "x") is None and store.find("") is None and store.find(None) is None
    now[0] += 59
    assert store.find(sid) is not None  # used: the idle clock starts again
    now[0] += 61
    assert store.find(sid) is None  # idle too long
    sid, _ = store.open(admin)
    for _ in range(6):
        now[0] += 50
        assert store.find(sid) is not None
    now[0] += 50  # 350 s after the login
    assert store.find(sid) is None
    opened = [store.open(admin)[0] for _ in range(4)]  # the limit: the least recently used goes
    assert store.find(opened[0]) is None and all(store.find(s) for s in opened[1:]) and len(store) == 3
    # A credential the key file no longer holds (or no longer as an admin) ends its sessions.
    sid, _ = store.open(admin)
    store.keys = KeyRing([producer])
    assert store.find(sid) is None


def test_sparkline_and_ages() -> None:
    assert sparkline([], 100, 20) == ""
    assert sparkline([0.0, 5.0, 10.0], 100, 20, pad=0) == "0.0,20.0 50.0,10.0 100.0,0.0"
    assert sparkline([5.0], 100, 20, top=10.0, pad=0) == "0.0,10.0 100.0,10.0"
    assert [age(s) for s in (0, -1, None, 0.25, 4.25, 9.97, 42, 307, 12_000, 200_000)] == [
        "0",
        "0",
        "0",
        "250 ms",
        "4.2 s",
        "10 s",
        "42 s",
        "5 min 07 s",
        "3 h 20 min",
        "2 d 7 h",
    ]


async def test_the_backlog_history_is_bounded() -> None:
    now = [0.0]

    def gauge(name: str, age: float) -> QueueGauges:
        return QueueGauges(
            name=name, visible=0, in_flight=0, delayed=0, groups=0, oldest_age=age,
            oldest_unattempted_age=age / 2, first_attempt_wait=0.0, sent=0, received=0, deleted=0,
            dead_lettered=0, empty_receives=0, expired=0, sidelined=0, top_groups=(),
        )  # fmt: skip

    present = ["t1.a", "t1.b", "t1.c"]

    async def figures() -> Figures:
        return Figures(now[0], tuple(QueueFigures(gauge(n, now[0])) for n in present))

    history = BacklogHistory(figures, samples=4, max_queues=2)
    for _ in range(6):
        now[0] += 5
        await history.sample()
    assert [s.oldest_age for s in history.series("t1.a")] == [15, 20, 25, 30]  # the last 4 samples
    assert [s.at for s in history.series("t1.a")] == [15, 20, 25, 30]  # stamped with the core's clock
    assert history.series("t1.c") == ()  # past max_queues: no history
    present.remove("t1.a")
    await history.sample()
    assert history.series("t1.a") == ()  # a queue that is gone loses its history


def test_failure_signatures_count_the_window_within_a_scope() -> None:
    monitor = HealthMonitor(HealthSettings(window=60, worker_failures=100))

    def fail(worker: str, queue: str, signature: str, at: float, reason: str = "r") -> None:
        monitor.attempt(AttemptRecorded(queue, "g", "m", worker, 1, "failed", reason, signature, at))

    fail("w1", "t1.a", "POST x 5xx", 10)
    fail("w2", "t1.a", "POST x 5xx", 20, "latest")
    fail("w1", "t1.b", "GET y error", 30)
    fail("w9", "t2.c", "POST x 5xx", 40)
    every = monitor.failure_signatures(65)
    assert [(f["signature"], f["count"]) for f in every] == [("POST x 5xx", 3), ("GET y error", 1)]
    mine = monitor.failure_signatures(65, lambda q: q.startswith("t1."))
    assert mine[0] == {
        "signature": "POST x 5xx",
        "count": 2,
        "workers": ["w1", "w2"],
        "queues": ["t1.a"],
        "last_seen": 20,
        "last_reason": "latest",
    }
    assert [f["count"] for f in monitor.failure_signatures(85, lambda q: q.startswith("t1."))] == [1]


async def test_an_operator_sees_the_indexs_error_cases(dash: Browserless, tmp_path: Path) -> None:
    """`strictq errors` writes its report beside the index; operators see its top signatures (they span
    tenants), a tenant's admin failure management's figures of its own queues."""
    from spark import layout
    from spark.errors import ERRORS_FILE, ErrorReport

    index = tmp_path / "index"  # the dash fixture's PageIndex
    signature = {
        "signature": "http POST api.payments.example/v1/charges/{id}/capture 5xx",
        "kind": "http",
        "template": "payment <*> failed",
        "count": 168,
        "first_seen": 1.0,
        "last_seen": 2.0,
        "groups": 40,
        "group_sample": ["customer-0"],
        "exemplars": ["c98c5e9c-9abf-4302-a807-1c15a9ab70e0"],
    }
    report = ErrorReport(signatures=[signature], templates=[], failures=168, records=9762)
    layout.write_atomic(index / layout.ERRORS_DIR / ERRORS_FILE, json.dumps(report.to_json()).encode())
    (index / layout.STATE_FILE).write_text("{}")
    cookie, _ = await dash.as_("operator-1")
    _, page = await dash.get("/dashboard", cookie)
    errors = page[page.index('id="errors"') :]
    assert "from the index: 168 failure(s) in 9762 record(s)" in errors
    assert "api.payments.example/v1/charges/{id}/capture 5xx" in errors and "c98c5e9c-9abf" in errors
    assert 'id="no-index"' not in page
    cookie, _ = await dash.as_("admin-1")
    _, page = await dash.get("/dashboard", cookie)
    errors = page[page.index('id="errors"') :]
    assert "from failure management" in errors and "api.payments.example" not in errors


# ----------------------------------------------------------------------- in front of a queue server
async def test_the_dashboard_in_front_of_a_queue_server(tmp_path: Path) -> None:
    """`--queue-server`: the page reads the queues through the port (the queue server's `GET /v1/figures`):
    real depth after real sends, in flight after a receive; what this gateway does not hold (fences,
    failure management) is said to be elsewhere, and no button calls a route it does not serve."""
    from observe_support import remote_edge

    async with remote_edge(tmp_path, KeyRing(list(KEYS)), HealthSettings()) as edge:
        for n in range(3):
            await edge.call(
                "POST", f"/queue/1/{QUEUE}/send", "producer-1", {"n": n}, group=f"customer-{n % 2}"
            )
        await edge.call("POST", "/queue/1/invoices/send", "producer-t2", {"theirs": True}, group="g")
        dash = Browserless(edge, edge.session)  # type: ignore[arg-type]
        cookie, csrf = await dash.as_("admin-1")
        _, page = await dash.get("/dashboard", cookie)
        row = _row(page, "data-queue", QUEUE)
        assert row is not None, page
        cells = re.findall(r'<td class="n">([^<]*)</td>', row)
        assert cells[:4] == ["3", "0", "0", "2"], cells  # visible, in flight, delayed, groups
        assert _row(page, "data-queue", "invoices") is None  # t2's
        assert 'id="count-messages">3<' in page and "customer-0" in page  # the groups panel
        assert 'id="no-fences"' in page and "failure management is off" in page
        assert "data-kind=" not in page  # no fence, suspend or release route here: no button
        assert 'id="cluster"' not in page

        items = await edge.call("GET", f"/queue/1/{QUEUE}/poll", "worker-1", limit="1", ttl="60")
        assert len(items) == 1
        status, panels = await dash.get("/dashboard/panels", cookie, csrf)
        assert status == 200
        row = _row(panels, "data-queue", QUEUE)
        assert row is not None
        assert re.findall(r'<td class="n">([^<]*)</td>', row)[:2] == ["2", "1"]

        cookie, csrf = await dash.as_("operator-1")
        _, page = await dash.get("/dashboard", cookie)
        assert _row(page, "data-queue", f"t1.{QUEUE}") is not None
        assert _row(page, "data-queue", "t2.invoices") is not None

        # Suspended by the queue server's failure management (its own admin route): the figures say so.
        headers = {"X-BV-API-Key": edge.secret("admin-1")}
        url = f"{edge.server.url}/admin/v1/queues/{QUEUE}/suspend"
        async with edge.session.post(url, json={"reason": "maintenance"}, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
        status, panels = await dash.get("/dashboard/panels", cookie, csrf)
        row = _row(panels, "data-queue", f"t1.{QUEUE}")
        assert row is not None and "state-suspended" in row
        suspended = panels[panels.index('id="suspended"') : panels.index('id="parked"')]
        assert f"t1.{QUEUE}" in suspended and 'id="count-suspended">1<' in panels

        # The queue server gone: the page still answers, and says why it has no figures.
        await edge.server.stop_serving()
        status, panels = await dash.get("/dashboard/panels", cookie, csrf)
        assert status == 200 and 'id="unreachable"' in panels, panels[:400]
