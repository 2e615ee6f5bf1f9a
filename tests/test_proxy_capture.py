"""The capture addon: one schema-v1 `http` record per call through a real proxy, read back with
wirelog's reader: tagged calls over HTTP and HTTPS, errors (backend down: the worker gets a 502 with
the reason, the record has the error), and a real SDK worker processing a message from the gateway
with its outbound calls going through the proxy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from gateway_support import Gateway
from proxy_support import (
    ProxyProcess,
    WorkerClient,
    credential,
    free_port,
    make_tags,
    unique,
    wait_marked,
)

from strictq.sdk import ClientConfig, EmoClient, Message, Worker

pytest_plugins = ["proxy_support"]  # its fixtures: backends, proxies, CAs

SCHEMA_KEYS = {
    "v", "kind", "id", "ts", "writer", "worker", "queue", "message_id", "group", "lease", "attempt", "call",
    "request", "response", "error", "latency_ms", "action", "replayed_from",
}  # fmt: skip


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_tagged_calls_are_recorded(shared_proxy: ProxyProcess, shared_backends, scheme: str) -> None:
    backend = shared_backends.http if scheme == "http" else shared_backends.https
    marker = unique("cap")
    tags = make_tags(queue="orders", message_id=marker, group="g-7", lease=30064771073, attempt=2)
    started = time.time()
    async with WorkerClient(shared_proxy, "worker-2", tags=tags) as client:
        first = await client.call("POST", f"{backend.url}/charge/{marker}?delay=0.05", json={"amount": 5})
        second = await client.call("GET", f"{backend.url}/status/{marker}")
    assert (first.status, second.status) == (200, 200)
    records = await wait_marked(shared_proxy, marker, 2)
    assert [r["call"] for r in records] == [1, 2]  # the SDK's ordinals, not the proxy's
    for record in records:
        assert SCHEMA_KEYS <= set(record)
        assert (record["v"], record["kind"], record["writer"]) == (1, "http", "proxy")
        assert record["id"].startswith("proxy-")
        assert (record["worker"], record["queue"], record["message_id"], record["group"]) == (
            "worker-2",
            "orders",
            marker,
            "g-7",
        )
        assert (record["lease"], record["attempt"], record["tagged"]) == (30064771073, 2, True)
        assert (record["action"], record["error"], record["replayed_from"]) == ("pass", None, None)
        assert record["response"]["status"] == 200
        assert started - 1 <= record["ts"] <= time.time()
        assert record["request"]["url"].startswith(f"{scheme}://{backend.host_port}/")
    assert records[0]["request"]["method"] == "POST" and records[0]["request"]["body"] == '{"amount": 5}'
    assert records[0]["latency_ms"] >= 50  # the backend waited 50 ms
    assert 0 < records[1]["latency_ms"] < records[0]["latency_ms"] + 1000
    assert len({r["id"] for r in records}) == 2


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_backend_down_gives_502_and_an_error_record(shared_proxy: ProxyProcess, scheme: str) -> None:
    marker = unique("down")
    port = free_port()
    async with WorkerClient(shared_proxy, tags=make_tags(message_id=marker)) as client:
        reply = await client.call("GET", f"{scheme}://127.0.0.1:{port}/{marker}")
    assert reply.status == 502
    assert b"refused" in reply.body.lower()  # the reason
    (record,) = await wait_marked(shared_proxy, marker, 1)
    assert record["response"] is None and "refused" in record["error"].lower()
    assert (record["message_id"], record["worker"], record["action"]) == (marker, "worker-1", "pass")
    assert shared_proxy.running()


async def test_untrusted_upstream_certificate_is_an_error(shared_proxy: ProxyProcess, backends) -> None:
    """`backends` use a CA the shared proxy was not given (--upstream-ca): verification fails."""
    marker = unique("untrusted")
    async with WorkerClient(shared_proxy) as client:
        reply = await client.call("GET", f"{backends.https.url}/{marker}")
    assert reply.status == 502
    (record,) = await wait_marked(shared_proxy, marker, 1)
    assert record["error"] and "certificate" in record["error"].lower()
    assert backends.https.seen == []


async def test_metrics_count_calls(shared_proxy: ProxyProcess, shared_backends) -> None:
    marker = unique("metrics")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{shared_proxy.admin_url}/metrics?format=json") as resp:
            before = (await resp.json())["counters"]
    async with WorkerClient(shared_proxy) as client:
        await client.call("GET", f"{shared_backends.http.url}/{marker}")
    async with WorkerClient(shared_proxy, None) as client:
        await client.call("GET", f"{shared_backends.http.url}/{marker}")
    await wait_marked(shared_proxy, marker, 2)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{shared_proxy.admin_url}/metrics?format=json") as resp:
            metrics = await resp.json()
    after = metrics["counters"]

    def grew(key: str) -> int:
        return int(after.get(key, 0)) - int(before.get(key, 0))

    assert grew("requests") == 2 and grew("records") == 2
    assert grew("action.pass") == 1 and grew("code.proxy_auth_required") == 1
    assert metrics["wirelog"]["records"] >= 2 and metrics["process"] == "proxy"


# ------------------------------------------------------------------------------------ real worker
async def test_sdk_worker_calls_are_captured_with_its_message(
    gateway: Gateway, shared_proxy: ProxyProcess, shared_backends
) -> None:
    """A real Worker polls the gateway, its handler calls both backends through the proxy; the wire log
    has the calls under that message id, with the claim's token and the call ordinals."""
    queue = unique("capq")
    handled: list[Message] = []

    async def handler(msg: Message) -> None:
        for backend in shared_backends.all():
            async with msg.http.post(f"{backend.url}/side-effect/{queue}", json=msg.payload) as resp:
                assert resp.status == 200
                await resp.read()
        handled.append(msg)

    async with EmoClient(
        ClientConfig(url=gateway.url, ca_file=str(gateway.ca_file)), credential("producer-1").secret
    ) as producer:
        await producer.send_batch({queue: [{"n": 1}]}, group="g-1")
    config = ClientConfig(
        url=gateway.url,
        ca_file=str(gateway.ca_file),
        worker_id="worker-1",
        worker_secret=credential("worker-1").secret,
        proxy_url=shared_proxy.url,
        proxy_ca_file=str(shared_proxy.ca_file),
    )
    worker = Worker(queue, handler, config=config, wait=0.5)
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(20):
            while worker.stats.acked < 1:
                if task.done():
                    task.result()
                await asyncio.sleep(0.05)
    finally:
        worker.stop(1.0)
        async with asyncio.timeout(10):
            await task
    (msg,) = handled
    for backend in shared_backends.all():
        (seen,) = backend.seen
        assert seen.tag_headers == [] and seen.header("Proxy-Authorization") is None
    records: list[dict[str, Any]] = await wait_marked(shared_proxy, msg.id, 2)
    assert [r["call"] for r in records] == [1, 2]
    assert {r["request"]["url"].split("://")[0] for r in records} == {"http", "https"}
    for record in records:
        assert (record["worker"], record["queue"], record["group"]) == ("worker-1", queue, "g-1")
        assert str(record["lease"]) == str(msg.token) and record["attempt"] == msg.attempt
        assert record["action"] == "pass" and record["response"]["status"] == 200
