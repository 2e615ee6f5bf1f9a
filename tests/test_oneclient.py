"""One client per face (issue 13): the `strictq` CLI's EmoDB calls go through the SDK's EmoClient
(strictq.edge_client), the admin commands through one admin call (strictq.admin_cli.admin_call), and every
refusal reads `<status> <code>: <message>` (strictq.cli_endpoint.refusal). Real sockets on 127.0.0.1: the
in-process gateway (TLS, trustme CA) and small aiohttp servers answering what a test needs."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from gateway_support import Gateway

from strictq.admin_cli import admin_call
from strictq.cli_endpoint import CliError, EdgeError, Endpoint
from strictq.edge_client import EdgeClient, parse_receipt
from strictq.sdk import ClientConfig, EmoClient, GatewayError

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """A plain-HTTP aiohttp server on 127.0.0.1 answering every request with `handler`."""
    runner = web.ServerRunner(web.Server(handler, access_log=None))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def at(url: str, *, internal: bool = False, ca_file: str | None = None) -> Endpoint:
    return Endpoint(url, "--queue-server" if internal else "STRICTQ_URL", internal, ca_file)


def secret(gw: Gateway, key_id: str) -> str:
    return gw.credential(key_id).secret


# ------------------------------------------------------------------------------- the SDK's admin calls
async def test_an_admin_emoclient_peeks_and_counts(gateway: Gateway) -> None:
    config = ClientConfig(url=gateway.url, ca_file=str(gateway.ca_file))
    async with EmoClient(config, secret(gateway, "producer-1")) as producer:
        await producer.send_batch({"jobs": [{"n": 1}, {"n": 2}, {"n": 3}]}, group="g")
    async with EmoClient(config, secret(gateway, "worker-1")) as worker:
        (claimed,) = await worker.poll("jobs", ttl=30, limit=1)
    async with EmoClient(config, secret(gateway, "admin-1")) as admin:
        peeked = await admin.peek("jobs", 10)
        assert [m["payload"] for m in peeked] == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert {m["group"] for m in peeked} == {"g"}
        assert await admin.size("jobs") == 3
        assert await admin.claimcount("jobs") == 1
    assert claimed.payload == {"n": 1}


async def test_size_that_is_not_a_number_is_a_gateway_error() -> None:
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        return web.json_response({"size": 3})

    async with serve(answer) as url, EmoClient(ClientConfig(url=url), "k") as client:
        with pytest.raises(GatewayError, match="size of q: expected a number"):
            await client.size("q")


async def test_queue_names_travel_as_one_path_segment() -> None:
    seen: list[str] = []

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        seen.append(request.raw_path)
        return web.json_response(0)

    async with serve(answer) as url, EmoClient(ClientConfig(url=url), "k") as client:
        await client.size("a/b?c")
    assert seen == ["/queue/1/a%2Fb%3Fc/size"]


# ------------------------------------------------------------------------------- the CLI through the SDK
async def test_the_cli_client_sends_polls_acks_and_counts_through_the_sdk(gateway: Gateway) -> None:
    found = at(gateway.url, ca_file=str(gateway.ca_file))
    worker = secret(gateway, "worker-1")
    async with EdgeClient(found) as client:
        await client.send("cart", ["a", "b"], "c-1", secret(gateway, "producer-1"))
        polled = await client.poll("cart", 10, 30, 0, worker)
        assert [m["payload"] for m in polled] == ["a", "b"]
        parsed = [parse_receipt(m["receipt"]) for m in polled]
        assert parsed == [(m["id"], m["token"]) for m in polled]
        assert await client.size("cart", secret(gateway, "admin-1")) == {
            "name": "cart",
            "total": 2,
            "in_flight": 2,
        }
        token = polled[0]["token"]
        stale = await client.ack("cart", [polled[0]["id"]], token + 1, worker)
        assert [r["status"] for r in stale] == ["stale_claim"]
        acked = await client.ack("cart", [m["id"] for m in polled], token, worker)
        assert acked == [{"id": m["id"], "status": "ok"} for m in polled]
        with pytest.raises(EdgeError) as refused:  # peek is an admin's
            await client.peek("cart", 10, secret(gateway, "producer-1"))
    assert refused.value.status == 403 and refused.value.exit_code == 1
    assert str(refused.value).startswith(f"403 {refused.value.code}: ")


async def test_a_refusal_is_one_line_whatever_the_body() -> None:
    answers = {
        "/queue/1/text/peek": web.Response(status=500, text="boom\n   at line 3"),
        "/queue/1/empty/peek": web.Response(status=503),
        "/queue/1/json/peek": web.json_response(
            {"error": {"code": "not-allowed", "message": "no\tpeeking"}}, status=403
        ),
    }

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        return answers[request.path]

    async with serve(answer) as url, EdgeClient(at(url)) as client:
        lines = []
        for queue in ("text", "empty", "json"):
            with pytest.raises(EdgeError) as refused:
                await client.peek(queue, 1, "k")
            lines.append(str(refused.value))
    assert lines == [
        "500 bad_response: boom at line 3",
        "503 http_error: Service Unavailable",
        "403 not_allowed: no peeking",
    ]


async def test_no_answer_is_explained_not_a_gateway_error() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with EdgeClient(at(f"http://127.0.0.1:{port}")) as client:
        with pytest.raises(CliError) as refused:
            await client.size("q", "k")
    assert not isinstance(refused.value, EdgeError)
    assert str(refused.value).startswith(f"cannot reach http://127.0.0.1:{port} (")
    assert "strictq serve" in str(refused.value)


async def test_https_to_a_plain_http_server_names_the_scheme() -> None:
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        return web.json_response(0)

    async with serve(answer) as url:
        secure = "https://" + url.removeprefix("http://")
        async with EdgeClient(at(secure)) as client:
            with pytest.raises(CliError) as refused:
                await client.size("q", "k")
    assert str(refused.value) == f"{secure} answers plain HTTP, not TLS: use {url} (STRICTQ_URL)"


# ------------------------------------------------------------------------------------- the admin call
async def test_the_admin_call_sends_the_key_and_renders_refusals() -> None:
    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get("X-BV-API-Key") != "admin-key":
            return web.json_response({"code": "unauthorized", "message": "who?"}, status=401)  # flat body
        if request.path == "/admin/v1/fences":
            return web.json_response({"fences": []})
        if request.path == "/admin/v1/text":
            return web.json_response("plain words", status=400)
        return web.json_response({"error": {"code": "no_such_route", "message": "no route"}}, status=404)

    async with serve(answer) as url:
        assert await admin_call(at(url), "admin-key", "GET", "/admin/v1/fences") == {"fences": []}
        failures = {}
        for name, found, key, path in (
            ("flat", at(url), "wrong", "/admin/v1/fences"),
            ("text", at(url), "admin-key", "/admin/v1/text"),
            ("gateway", at(url), "admin-key", "/admin/v1/none"),
            ("core", at(url, internal=True), "admin-key", "/admin/v1/none"),
        ):
            with pytest.raises(EdgeError) as refused:
                await admin_call(found, key, "GET", path)
            failures[name] = str(refused.value)
    assert failures["flat"] == "401 unauthorized: who?"
    assert failures["text"] == "400 error: plain words"
    assert failures["gateway"].startswith("404 no_such_route: no route; ")
    assert "has no admin routes" in failures["gateway"] and "STRICTQ_QUEUE_URL" in failures["gateway"]
    assert failures["core"] == "404 no_such_route: no route"
