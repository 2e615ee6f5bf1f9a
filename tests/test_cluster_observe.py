"""The dashboard and /metrics in front of a cluster: one `strictq cluster up` (3 JetStream servers, 3 queue
servers, R3, a gateway) for the module, real EmoDB sends through the gateway over many groups (so over
several partitions), a real receive; then the edge's /metrics (queue figures summed over the partitions,
per owner node, per partition; owners, epochs and standbys' lag as `strictq cluster status` shows them),
each node's own /metrics (its partitions' figures, authenticated with the cluster's key file), and the
dashboard's queues and cluster panels.

Every test uses a queue of its own, so their order does not matter.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from cluster_support import Cluster, start_cluster, status
from kit.prometheus import Series, parse_series, value

from access.keys import Credential, write_keys
from gateway.dashboard_session import SECURE_COOKIE

pytestmark = [pytest.mark.xdist_group("cluster"), pytest.mark.timeout(300)]

TENANT = "dev"
CREDENTIALS = [
    Credential("admin", "observe-admin-secret-0123456789", "admin", TENANT),
    Credential("producer", "observe-producer-secret-0123456789", "producer", TENANT),
    Credential("worker-1", "observe-worker-1-secret-0123456789", "worker", TENANT),
    Credential("proxy", "observe-proxy-secret-0123456789", "proxy", TENANT),
    Credential("ops-1", "observe-operator-secret-0123456789", "operator", "ops"),
]
SECRETS = {c.id: c.secret for c in CREDENTIALS}
GROUPS = 12  # groups hash to partitions: 12 of them land on more than one of the cluster's partitions
CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("cluster-observe") / "c"
    # The gateway's key file, with an operator (cluster-wide series are operators' only), written before
    # `cluster up`: the gateway reads it, and so do the nodes (`cluster up` gives them --keys).
    os.makedirs(data_dir / "gateway", mode=0o700)
    os.chmod(data_dir, 0o700)
    write_keys(data_dir / "gateway" / "keys.toml", CREDENTIALS)
    cluster = start_cluster(data_dir)
    try:
        yield cluster
    finally:
        cluster.process.stop()


@pytest.fixture
async def http(cluster: Cluster) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=cluster.ca)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=60),
    ) as session:
        yield session


async def call(
    http: aiohttp.ClientSession,
    cluster: Cluster,
    method: str,
    path: str,
    key: str,
    body: Any = None,
    **q: str,
) -> Any:
    async with http.request(
        method, cluster.url + path, json=body, params=q, headers={"X-BV-API-Key": SECRETS[key]}
    ) as answer:
        text = await answer.text()
        assert answer.status == 200, (method, path, answer.status, text)
        return await answer.json()


async def send_over_groups(http: aiohttp.ClientSession, cluster: Cluster, queue: str) -> None:
    for n in range(GROUPS):
        await call(http, cluster, "POST", f"/queue/1/{queue}/send", "producer", {"n": n}, group=f"g{n}")


async def scrape(http: aiohttp.ClientSession, url: str, key: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {SECRETS[key]}"} if key is not None else {}
    async with http.get(url + "/metrics", headers=headers) as answer:
        return answer.status, await answer.text()


async def series(http: aiohttp.ClientSession, url: str, key: str) -> Series:
    code, text = await scrape(http, url, key)
    assert code == 200, text
    return parse_series(text)


def of_queue(found: Series, name: str, queue: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` for `queue` of TENANT, by their labels."""
    return {
        labels: v
        for (n, labels), v in found.items()
        if n == name and ("queue", queue) in labels and ("tenant", TENANT) in labels
    }


# -------------------------------------------------------------------------------------------- /metrics
async def test_the_edges_metrics_sum_the_partitions(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    queue = "orders"
    await send_over_groups(http, cluster, queue)
    q = {"tenant": TENANT, "face": "queue", "queue": queue}
    found = await series(http, cluster.url, "ops-1")
    assert value(found, "strictq_queue_visible_messages", **q) == GROUPS
    assert value(found, "strictq_queue_in_flight_messages", **q) == 0
    assert value(found, "strictq_queue_groups", **q) == GROUPS
    assert value(found, "strictq_queue_sent_messages_total", **q) == GROUPS
    per_node = of_queue(found, "strictq_node_queue_visible_messages", queue)
    assert sum(per_node.values()) == GROUPS and {dict(k)["node"] for k in per_node} <= {"n1", "n2", "n3"}
    data = status(cluster)
    partitions = data["partitions"]
    up = {dict(k)["partition"]: v for (n, k), v in found.items() if n == "strictq_partition_up"}
    assert up == {str(p["partition"]): 1.0 for p in partitions}
    holding = [v for (n, _), v in found.items() if n == "strictq_partition_messages" and v > 0]
    assert sum(holding) >= GROUPS and len(holding) > 1  # the queue's messages are over several partitions
    for p in partitions:  # owners and epochs as `strictq cluster status` shows them
        where = {"partition": str(p["partition"]), "node": p["owner"]}
        assert value(found, "strictq_partition_epoch", **where) == p["epoch"]
        assert value(found, "strictq_partition_serving", **where) == 1
    lags = {
        (dict(k)["partition"], dict(k)["node"]): v
        for (n, k), v in found.items()
        if n == "strictq_partition_lag"
    }
    expected = {(str(p["partition"]), s["node"]) for p in partitions for s in p["standbys"]}
    assert expected and set(lags) == expected and all(v >= 0 for v in lags.values())
    assert value(found, "strictq_cluster_status_readable") == 1
    assert value(found, "strictq_node_alive", node="n1") == 1

    items = await call(http, cluster, "GET", f"/queue/1/{queue}/poll", "worker-1", limit="1", ttl="120")
    assert len(items) == 1
    found = await series(http, cluster.url, "admin")  # the tenant's admin: its queues, nothing cluster-wide
    assert value(found, "strictq_queue_in_flight_messages", **q) == 1
    assert value(found, "strictq_queue_visible_messages", **q) == GROUPS - 1
    assert sum(of_queue(found, "strictq_node_queue_in_flight_messages", queue).values()) == 1
    assert not [k for k in found if k[0].startswith(("strictq_partition_", "strictq_cluster_"))]


async def test_each_nodes_metrics_are_its_partitions(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    queue = "payments"
    await send_over_groups(http, cluster, queue)
    owners = {p["partition"]: p["owner"] for p in status(cluster)["partitions"]}
    total = 0.0
    for name, (_, url) in cluster.nodes.items():
        found = await series(http, url, "ops-1")
        mine = of_queue(found, "strictq_queue_visible_messages", queue)
        total += sum(mine.values())
        served = {dict(k)["partition"] for (n, k) in found if n == "strictq_partition_up"}
        assert served == {str(p) for p, owner in owners.items() if owner == name}, (name, served)
        code, text = await scrape(http, url, None)
        assert code == 401 and '"unauthorized"' in text  # no key, no figures
    assert total == GROUPS


# ------------------------------------------------------------------------------------------- dashboard
async def login(http: aiohttp.ClientSession, cluster: Cluster, key: str) -> tuple[str, str]:
    async with http.post(
        cluster.url + "/dashboard/login", data={"key": SECRETS[key]}, allow_redirects=False
    ) as answer:
        cookie = answer.cookies.get(SECURE_COOKIE)
        assert answer.status == 303 and cookie is not None, await answer.text()
    page = await get(http, cluster, "/dashboard", cookie.value)
    match = CSRF_META.search(page)
    assert match is not None
    return cookie.value, match.group(1)


async def get(http: aiohttp.ClientSession, cluster: Cluster, path: str, cookie: str, csrf: str = "") -> str:
    headers = {"Cookie": f"{SECURE_COOKIE}={cookie}", **({"X-Strictq-CSRF": csrf} if csrf else {})}
    async with http.get(cluster.url + path, headers=headers) as answer:
        text = await answer.text()
        assert answer.status == 200, text[:500]
        return text


def row(page: str, attribute: str, value: str) -> str:
    match = re.search(rf'<tr [^>]*{attribute}="{re.escape(value)}"[^>]*>.*?</tr>', page, re.S)
    assert match is not None, (attribute, value)
    return match.group(0)


def numbers(html: str) -> list[str]:
    return re.findall(r'<td class="n">([^<]*)</td>', html)


async def test_the_dashboard_shows_the_queues_and_the_cluster(
    cluster: Cluster, http: aiohttp.ClientSession
) -> None:
    queue = "invoices"
    await send_over_groups(http, cluster, queue)
    items = await call(http, cluster, "GET", f"/queue/1/{queue}/poll", "worker-1", limit="1", ttl="120")
    assert len(items) == 1
    cookie, csrf = await login(http, cluster, "ops-1")
    page = await get(http, cluster, "/dashboard", cookie)
    assert numbers(row(page, "data-queue", f"{TENANT}.{queue}"))[:4] == [
        str(GROUPS - 1),
        "1",
        "0",
        str(GROUPS),
    ]
    assert 'id="cluster"' in page and 'id="missing"' not in page
    data = status(cluster)
    for p in data["partitions"]:
        shown = row(page, "data-partition", str(p["partition"]))
        assert f'data-owner="{p["owner"]}"' in shown and "serving" in shown
        assert numbers(shown)[:2] == [str(p["partition"]), str(p["epoch"])]
        for standby in p["standbys"]:
            assert f'data-node="{standby["node"]}"' in shown
    for node in data["nodes"]:
        assert "alive" in row(page, "data-node", node["node"])
    # The fence buttons call the edge's fences, which it holds; the panels' refresh shows the same.
    assert 'data-kind="fence"' in row(page, "data-worker", "worker-1")
    panels = await get(http, cluster, "/dashboard/panels", cookie, csrf)
    assert 'id="cluster-partitions"' in panels

    cookie, _ = await login(http, cluster, "admin")  # a tenant's admin: its queues, not the cluster
    page = await get(http, cluster, "/dashboard", cookie)
    assert numbers(row(page, "data-queue", queue))[:2] == [str(GROUPS - 1), "1"]
    assert 'id="cluster"' not in page


# ---------------------------------------------------------------------------------------------- browser
def test_the_dashboard_in_chromium_follows_the_cluster(cluster: Cluster) -> None:
    """The page in Debian's headless chromium (as tests/test_dashboard_browser.py drives it) against the
    cluster's edge: the cluster panel's owners are `cluster status`'s, and the page's own refresh shows a
    message sent after it loaded. The fence button fences through the edge (seen in its fence list)."""
    import json
    import shutil
    import urllib.request

    from playwright.sync_api import sync_playwright
    from test_dashboard_browser import CHROMIUM, _spki_pin

    queue = "browser"
    context_ssl = ssl.create_default_context(cafile=cluster.ca)

    def edge(method: str, path: str, key: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(cluster.url + path, data=data, method=method)
        request.add_header("X-BV-API-Key", SECRETS[key])
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30, context=context_ssl) as answer:
            return json.loads(answer.read() or b"null")

    for n in range(3):
        edge("POST", f"/queue/1/{queue}/send?group=b{n}", "producer", {"n": n})
    owners = {str(p["partition"]): p["owner"] for p in status(cluster)["partitions"]}
    executable = next((p for p in CHROMIUM if os.access(p, os.X_OK)), shutil.which("chromium"))
    if executable is None:
        pytest.fail("Debian's chromium is not installed: run `make chromium` (make test does)")
    pin = _spki_pin(cluster.data_dir / "gateway" / "tls" / "server.pem")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=[f"--ignore-certificate-errors-spki-list={pin}"]
        )
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.set_default_timeout(15_000)
            page.goto(cluster.url + "/dashboard")
            page.fill("#key", SECRETS["ops-1"])
            page.click("#login")
            page.wait_for_selector("#cluster-partitions")
            for partition, owner in owners.items():
                shown = page.locator(f'#cluster-partitions tr[data-partition="{partition}"]')
                assert shown.get_attribute("data-owner") == owner
            row = f'#queues tr[data-queue="{TENANT}.{queue}"]'
            assert page.locator(row).locator("td.n").first.inner_text() == "3"
            edge("POST", f"/queue/1/{queue}/send?group=b9", "producer", {"n": 9})
            page.wait_for_function(  # the page refreshes its panels every 5 s
                "sel => document.querySelector(sel)?.querySelector('td.n')?.textContent === '4'",
                arg=row,
                timeout=30_000,
            )
            page.click('#workers tr[data-worker="worker-1"] button[data-kind="fence"]')
            page.fill('#confirm input[name="reason"]', "from the cluster's dashboard")
            page.click("#confirm-ok")
            page.wait_for_selector("#flash.ok")
            fences = edge("GET", "/admin/v1/fences", "admin")["fences"]
            assert [f["worker"] for f in fences] == ["worker-1"]
            edge("DELETE", "/admin/v1/fences/worker-1", "admin")
        finally:
            browser.close()
