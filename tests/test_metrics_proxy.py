"""The egress proxy's admin /metrics (a real `strictq proxy` process, real calls through it): Prometheus
text by default, parsed with prometheus_client's parser, with the values the calls made; the JSON of
earlier versions still at `?format=json` and for `Accept: application/json`."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from proxy_support import ProxyProcess, WorkerClient, unique, wait_marked

pytest_plugins = ["proxy_support"]  # its fixtures: backends, proxies, CAs
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"
)


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers=headers or {}) as response:
            return response.status, response.headers.get("Content-Type", ""), await response.text()


async def scrape(proxy: ProxyProcess, headers: dict[str, str] | None = None) -> dict[str, Any]:
    status, content_type, text = await get(f"{proxy.admin_url}/metrics", headers)
    assert status == 200 and content_type.startswith("text/plain; version="), (status, content_type, text)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert all(family.documentation for family in families.values())  # HELP on every family
    return {
        sample.name + "".join(f"|{k}={v}" for k, v in sorted(sample.labels.items())): sample.value
        for family in families.values()
        for sample in family.samples
    }


async def test_prometheus_text_counts_real_calls(proxy: ProxyProcess, backends: Any) -> None:
    before = await scrape(proxy)
    assert before["strictq_proxy_calls_total"] == 0 and before["strictq_proxy_control_synced"] == 1
    marker = unique("prom")
    async with WorkerClient(proxy) as client:
        assert (await client.call("GET", f"{backends.http.url}/{marker}")).status == 200
    async with WorkerClient(proxy, None) as client:  # no Proxy-Authorization: 407
        assert (await client.call("GET", f"{backends.http.url}/{marker}")).status == 407
    await wait_marked(proxy, marker, 2)
    after = await scrape(proxy, {"Accept": PROMETHEUS_ACCEPT})  # what a Prometheus server sends
    assert after["strictq_proxy_calls_total"] == 2
    assert after["strictq_proxy_records_written_total"] == 2
    assert after["strictq_proxy_calls_by_action_total|action=pass"] == 1
    assert after["strictq_proxy_calls_by_code_total|code=proxy_auth_required"] == 1
    assert after["strictq_proxy_auth_refusals_total|code=proxy_auth_required"] == 1
    assert after["strictq_proxy_calls_by_status_class_total|status_class=2xx"] == 1
    assert after["strictq_proxy_calls_by_status_class_total|status_class=4xx"] == 1
    assert after["strictq_proxy_upstream_errors_total"] == 0
    assert after["strictq_proxy_wirelog_records_total"] >= 2
    assert after["strictq_proxy_in_flight"] == 0
    assert after["strictq_proxy_fences"] == 0 and "strictq_proxy_client_connections" in after


async def test_the_json_counters_stay_available(proxy: ProxyProcess, backends: Any) -> None:
    marker = unique("json")
    async with WorkerClient(proxy) as client:
        assert (await client.call("GET", f"{backends.http.url}/{marker}")).status == 200
    await wait_marked(proxy, marker, 1)
    for url, headers in (
        (f"{proxy.admin_url}/metrics?format=json", None),
        (f"{proxy.admin_url}/metrics", {"Accept": "application/json"}),
    ):
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=headers or {}) as response:
                assert response.status == 200 and response.content_type == "application/json"
                body = await response.json()
        assert body["process"] == "proxy" and body["counters"]["requests"] == 1
        assert body["counters"]["action.pass"] == 1 and body["control"]["synced"] is True
        assert body["wirelog"]["records"] >= 1 and body["in_flight"] == 0
