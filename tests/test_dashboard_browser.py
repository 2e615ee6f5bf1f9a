"""The operator's dashboard end to end: a real `strictq serve` over TLS (two tenants), real traffic and a real
wire-log index built with the suite's Spark session, driven in Debian's headless chromium through
Playwright (`make chromium`; never a browser Playwright downloads). The page loads and lists the tenant's
queues, shows a worker fenced through the API, the search box finds a message's story in the index, and
actions run after their confirmation (checked through the admin API); a wrong key and another tenant's
admin see nothing of it. Screenshots go to the module's temporary directory; with
STRICTQ_DASHBOARD_SCREENSHOT=PATH the page with a story is also written there (docs/dashboard.png is made so).

One `strictq serve` and one browser for the module; each test opens its own browser context.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kit.until import until_sync
from serve_support import Serve, start_serve

from access.keys import Credential, write_keys
from wirelog.reader import read_records
from wirelog.writer import ENV_SEGMENT_AGE

pytestmark = pytest.mark.timeout(300)  # the module's set-up starts a server, Spark and chromium

SCREENSHOT_ENV = "STRICTQ_DASHBOARD_SCREENSHOT"
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")  # Debian's binary, then its launcher
TIMEOUT_MS = 15_000
CREDENTIALS = [
    Credential("admin-1", "dash-admin-1-secret-0123456789", "admin", "acme"),
    Credential("producer-1", "dash-producer-1-secret-0123456789", "producer", "acme"),
    Credential("worker-1", "dash-worker-1-secret-0123456789", "worker", "acme"),
    Credential("worker-2", "dash-worker-2-secret-0123456789", "worker", "acme"),
    Credential("worker-3", "dash-worker-3-secret-0123456789", "worker", "acme"),
    Credential("admin-2", "dash-admin-2-secret-0123456789", "admin", "globex"),
    Credential("producer-2", "dash-producer-2-secret-0123456789", "producer", "globex"),
    Credential("worker-9", "dash-worker-9-secret-0123456789", "worker", "globex"),
]
SECRETS = {c.id: c.secret for c in CREDENTIALS}
RESULTS = {"X-Strictq-Capabilities": "results, probes"}  # a worker that takes part in failure management


@dataclass
class Stack:
    serve: Serve
    message_id: str  # a message of acme's `orders` whose story is in the index
    shots: Path

    def call(
        self, method: str, path: str, key_id: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        """The gateway's HTTP API with a key; asserts a 2xx and answers the JSON body."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.serve.url + path, data=data, method=method)
        request.add_header("X-BV-API-Key", SECRETS[key_id])
        for name, value in {
            **(headers or {}),
            **({"Content-Type": "application/json"} if data else {}),
        }.items():
            request.add_header(name, value)
        with urllib.request.urlopen(request, timeout=30, context=self.serve.ssl_context()) as answer:
            assert 200 <= answer.status < 300, answer.status
            return json.loads(answer.read() or b"null")

    def status(self) -> Any:
        return self.call("GET", "/admin/v1/status", "admin-1")

    def suspended(self, queue: str) -> bool:
        return any(q["queue"] == queue and q["suspended"] for q in self.status()["queues"])

    def fenced(self) -> list[str]:
        return [f["worker"] for f in self.call("GET", "/admin/v1/fences", "admin-1")["fences"]]


def _traffic(stack: Stack) -> str:
    """acme: orders, payments and emails with a few groups; a worker succeeding, one failing (error cases), a
    parked group; globex: invoices. Answers the id of a message worker-1 processed."""
    for n in range(1, 7):
        stack.call("POST", f"/queue/1/orders/send?group=customer-{n}", "producer-1", {"order": n})
        stack.call("POST", f"/queue/1/orders/send?group=customer-{n}", "producer-1", {"order": n + 10})
    for n in range(1, 4):
        stack.call("POST", f"/queue/1/payments/send?group=acct-{n}", "producer-1", {"amount": n})
    stack.call("POST", "/queue/1/emails/send?group=welcome", "producer-1", {"to": "someone"})
    stack.call("POST", "/queue/1/invoices/send?group=inv-1", "producer-2", {"total": 1})
    stack.call("PUT", "/admin/v1/queues/payments/groups/policy?group=acct-3", "admin-1", {"max_attempts": 1})
    (item,) = stack.call("GET", "/queue/1/orders/poll?ttl=30&limit=1", "worker-1", headers=RESULTS)
    done = {"id": item["id"], "token": item["token"], "outcome": "succeeded"}
    stack.call("POST", "/queue/1/orders/results", "worker-1", {"results": [done]})
    failing = stack.call("GET", "/queue/1/payments/poll?ttl=30&limit=10", "worker-2", headers=RESULTS)
    assert {i["group"] for i in failing} == {"acct-1", "acct-2", "acct-3"}, failing
    for failed in failing:
        result = {
            "id": failed["id"],
            "token": failed["token"],
            "outcome": "failed",
            "reason": "POST https://payments.example/v1/charge: 503 Service Unavailable",
            "signature": "http POST payments.example/v1/charge 5xx",
        }
        stack.call("POST", "/queue/1/payments/results", "worker-2", {"results": [result]})
    stack.call(
        "PUT", "/admin/v1/fences/worker-3", "admin-1", {"mode": "block", "reason": "bad deploy", "ttl": 3600}
    )
    return str(item["id"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Stack]:
    from spark.index import run_index

    base = tmp_path_factory.mktemp("dashboard")
    keys = base / "keys.toml"
    write_keys(keys, CREDENTIALS, "the dashboard test's tenants")
    data = base / "data"
    # A long health window: worker-2's failures stay counted however long Spark takes on a busy machine.
    serve = start_serve(
        data, "--keys", str(keys), "--health-window", "10m", tls=True, env={ENV_SEGMENT_AGE: "0.3"}
    )
    try:
        stack = Stack(serve, "", base / "screenshots")
        stack.shots.mkdir()
        stack.message_id = _traffic(stack)

        def indexed() -> bool:  # the message's delivery and result in closed segments
            records = read_records(data / "wirelog", include_open=False)
            kinds = {r["kind"] for r in records if r.get("message_id") == stack.message_id}
            return {"delivery", "log"} <= kinds

        until_sync(indexed, 30, what="the message's records in closed wire-log segments")
        run_index(spark, data / "wirelog", data / "index", buckets=4)
        yield stack
    finally:
        serve.stop()


def _spki_pin(certificate: Path) -> str:
    """The base64 SHA-256 of the server certificate's public key, which chromium is told to accept."""
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Any]:
    """Headless chromium, once for the module. The server's certificate comes from its own local CA, which
    the browser does not know: it is told to accept exactly that certificate's key (chromium's SPKI
    allow-list), so TLS stays real and verified."""
    from playwright.sync_api import sync_playwright

    executable = next((path for path in CHROMIUM if os.access(path, os.X_OK)), shutil.which("chromium"))
    if executable is None:
        pytest.fail("Debian's chromium is not installed: run `make chromium` (make test does)")
    pin = _spki_pin(stack.serve.data_dir / "tls" / "server.pem")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=[f"--ignore-certificate-errors-spki-list={pin}"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A fresh browser context per test: its own cookies."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


def _log_in(context: Any, stack: Stack, key_id: str) -> Any:
    page = context.new_page()
    page.goto(stack.serve.url + "/dashboard")
    page.fill("#key", SECRETS[key_id])
    page.click("#login")
    page.wait_for_selector("#panels")
    return page


def _shot(page: Any, stack: Stack, name: str) -> Path:
    path = stack.shots / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# ------------------------------------------------------------------------------------------------ tests
def test_the_page_lists_the_queues_and_shows_the_fenced_worker(context: Any, stack: Stack) -> None:
    page = _log_in(context, stack, "admin-1")
    assert "admin-1 · admin of tenant acme" in page.inner_text("#who")
    for queue in ("orders", "payments", "emails"):
        assert page.locator(f'#queues tr[data-queue="{queue}"]').count() == 1, queue
    assert page.locator('#queues tr[data-queue="invoices"]').count() == 0  # globex's
    orders = page.locator('#queues tr[data-queue="orders"]')
    assert "12" in orders.inner_text() or "11" in orders.inner_text()  # its messages
    fenced = page.locator('#workers tr[data-worker="worker-3"]')
    assert fenced.get_attribute("data-state") == "fenced"
    assert "bad deploy" in fenced.inner_text() and fenced.locator('button[data-kind="unfence"]').count() == 1
    # worker-2's three failures: suspect, and the top error case; acct-3 (one attempt allowed) is parked.
    assert page.locator('#workers tr[data-worker="worker-2"]').get_attribute("data-state") == "suspect"
    assert "http POST payments.example/v1/charge 5xx" in page.inner_text("#errors")
    assert page.locator('#parked tr[data-group="acct-3"] button[data-kind="release"]').count() == 1
    # The backlog-age charts fill in as the gateway samples (every 5 s): one is drawn once sampled.
    page.wait_for_selector('#queues tr[data-queue="orders"] svg polyline.line-age', timeout=20_000)
    _shot(page, stack, "dashboard")


def test_the_search_box_finds_a_message_in_the_index(context: Any, stack: Stack) -> None:
    page = _log_in(context, stack, "admin-1")
    assert page.locator("#no-index").count() == 0  # the index is built
    page.fill("#search-q", stack.message_id)
    page.click("#search-go")
    page.wait_for_selector("#story")
    story = page.inner_text("#story")
    assert f"message {stack.message_id}" in story and "queue orders" in story
    assert "delivery" in story and "outcome=succeeded" in story and "worker-1" in story
    path = _shot(page, stack, "search")  # the whole page with a story: the README's picture
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(path, os.environ[SCREENSHOT_ENV])
    # A malformed id: the page says why (and the server answered 400).
    with page.expect_response(lambda r: "/dashboard?" in r.url) as answer:
        page.fill("#search-q", "not an id!")
        page.click("#search-go")
    assert answer.value.status == 400
    assert "malformed message id" in page.inner_text("#story-error")


def test_actions_run_after_their_confirmation(context: Any, stack: Stack) -> None:
    page = _log_in(context, stack, "admin-1")
    suspend = '#queues tr[data-queue="orders"] button[data-kind="suspend"]'
    # Cancel: nothing happens.
    page.click(suspend)
    assert page.locator("#confirm").is_visible()
    assert "Suspend queue orders?" in page.inner_text("#confirm-title")
    page.click("#confirm-cancel")
    assert not page.locator("#confirm").is_visible()
    assert not stack.suspended("orders")
    # Confirm, with a reason: the queue is suspended (seen through the admin API).
    page.click(suspend)
    page.fill('#confirm input[name="reason"]', "maintenance from the dashboard")
    _shot(page, stack, "confirm")
    page.click("#confirm-ok")
    page.wait_for_selector("#flash.ok")
    assert "Suspend queue orders: done" in page.inner_text("#flash")
    until_sync(lambda: stack.suspended("orders"), 10, what="orders suspended")
    page.wait_for_selector('#suspended tr[data-queue="orders"]')
    # Resume it from the suspended panel, unfence worker-3, release the parked group.
    page.click('#suspended tr[data-queue="orders"] button[data-kind="resume"]')
    page.click("#confirm-ok")
    page.wait_for_selector('#suspended tr[data-queue="orders"]', state="detached")
    assert not stack.suspended("orders")
    page.click('#workers tr[data-worker="worker-3"] button[data-kind="unfence"]')
    page.click("#confirm-ok")
    page.wait_for_selector('#workers tr[data-worker="worker-3"][data-state="healthy"]')
    assert "worker-3" not in stack.fenced()
    page.click('#parked tr[data-group="acct-3"] button[data-kind="release"]')
    page.click("#confirm-ok")
    page.wait_for_selector('#parked tr[data-group="acct-3"]', state="detached")
    assert stack.call("GET", "/admin/v1/queues/payments/parked", "admin-1")["groups"] == []
    # Fence worker-1 again through the page (a reason is required; block for 10 minutes).
    page.click('#workers tr[data-worker="worker-1"] button[data-kind="fence"]')
    page.fill('#confirm input[name="reason"]', "checking the fence button")
    page.click("#confirm-ok")
    page.wait_for_selector('#workers tr[data-worker="worker-1"][data-state="fenced"]')
    fences = stack.call("GET", "/admin/v1/fences", "admin-1")["fences"]
    (fence,) = [f for f in fences if f["worker"] == "worker-1"]
    assert fence["mode"] == "block" and fence["reason"] == "checking the fence button" and fence["expires"]
    stack.call("DELETE", "/admin/v1/fences/worker-1", "admin-1")
    _shot(page, stack, "after-actions")


def test_a_wrong_key_and_another_tenant_see_nothing(context: Any, stack: Stack) -> None:
    page = context.new_page()
    page.goto(stack.serve.url + "/dashboard")
    page.fill("#key", "not-a-key-of-this-gateway")
    with page.expect_response(lambda r: r.url.endswith("/dashboard/login")) as answer:
        page.click("#login")
    assert answer.value.status == 401
    assert "not in the gateway's key file" in page.inner_text("#login-error")
    assert page.locator("#panels").count() == 0 and context.cookies() == []
    page = _log_in(context, stack, "admin-2")
    assert page.locator('#queues tr[data-queue="invoices"]').count() == 1
    text = page.inner_text("body")
    for foreign in ("orders", "payments", "worker-1", "worker-3", "bad deploy", "payments.example"):
        assert foreign not in text, foreign
    # Its search does not find acme's message either.
    page.fill("#search-q", stack.message_id)
    page.click("#search-go")
    page.wait_for_selector("#story")
    assert "Nothing found" in page.inner_text("#story") and "orders" not in page.inner_text("#story")
    _shot(page, stack, "other-tenant")
