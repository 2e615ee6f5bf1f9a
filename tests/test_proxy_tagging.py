"""The tagging addon: X-Strictq-* tags parsed into the call's context, stripped before the call leaves
(unless --keep-tags), malformed tags refused with 400 and recorded; untagged calls pass and are logged
as untagged."""

from __future__ import annotations

import pytest
from mitmproxy.test import taddons, tflow
from proxy_support import (
    ProxyProcess,
    WorkerClient,
    make_tags,
    unique,
    wait_marked,
)

from fencing.addons.tagging import MalformedTags, Tagging, parse_into
from fencing.context import CallContext, context_of
from fencing.runtime import ProxyRuntime
from strictq.sdk.outbound import TAG_HEADERS

GOOD = {
    "X-Strictq-Queue": "orders",
    "X-Strictq-Message-Id": "m-1",
    "X-Strictq-Group": "g1",
    "X-Strictq-Lease": "30064771073",
    "X-Strictq-Attempt": "2",
    "X-Strictq-Call": "3",
}

pytest_plugins = ["proxy_support"]  # its fixtures: backends, proxies, CAs


def parsed(headers: dict[str, str], max_bytes: int = 256) -> CallContext:
    ctx = CallContext(started=0.0)
    parse_into(ctx, [(k.lower().encode(), v.encode()) for k, v in headers.items()], max_bytes)
    return ctx


# ------------------------------------------------------------------------------------------- unit
def test_parse_full_tag_set() -> None:
    ctx = parsed(GOOD)
    assert (ctx.queue, ctx.message_id, ctx.group) == ("orders", "m-1", "g1")
    assert (ctx.lease, ctx.attempt, ctx.call, ctx.tagged) == (30064771073, 2, 3, True)


def test_message_id_alone_is_enough() -> None:
    ctx = parsed({"X-Strictq-Message-Id": "m-9"})
    assert ctx.tagged and ctx.message_id == "m-9" and ctx.lease is None


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"X-Strictq-Lease": "abc"}, "X-Strictq-Lease must be a decimal integer"),
        ({"X-Strictq-Lease": "-1"}, "X-Strictq-Lease must be a decimal integer"),
        ({"X-Strictq-Lease": str(2**64)}, "X-Strictq-Lease must be a decimal integer"),
        ({"X-Strictq-Attempt": "1.5"}, "X-Strictq-Attempt must be a decimal integer"),
        ({"X-Strictq-Call": "٣"}, "X-Strictq-Call must be a decimal integer"),  # non-ASCII digit
        ({"X-Strictq-Group": "g" * 300}, "longer than 256 bytes"),
        ({"X-Strictq-Queue": ""}, "X-Strictq-Queue is empty"),
        ({"X-Strictq-Message-Id": None}, "X-Strictq-Message-Id is missing"),
        ({"X-Strictq-Group": None}, "X-Strictq-Lease needs X-Strictq-Queue and X-Strictq-Group"),
    ],
)
def test_malformed(change: dict[str, str | None], fragment: str) -> None:
    headers = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(MalformedTags, match=fragment):
        parsed(headers)


def test_repeated_tag_is_malformed() -> None:
    ctx = CallContext(started=0.0)
    pairs = [(b"x-strictq-message-id", b"m-1"), (b"x-strictq-message-id", b"m-2")]
    with pytest.raises(MalformedTags, match="repeated"):
        parse_into(ctx, pairs, 256)
    assert ctx.message_id == "m-1"  # what parsed is kept for the record


async def test_addon_strips_tags_and_refuses_malformed() -> None:
    tagging = Tagging(ProxyRuntime())
    with taddons.context(tagging) as tctx:
        flow = tflow.tflow()
        for name, value in GOOD.items():
            flow.request.headers[name] = value
        flow.request.headers["X-Other"] = "kept"
        tagging.requestheaders(flow)
        assert context_of(flow).message_id == "m-1"  # type: ignore[union-attr]
        assert not any(h in flow.request.headers for h in TAG_HEADERS)
        assert flow.request.headers["X-Other"] == "kept"
        assert flow.response is None

        bad = tflow.tflow()
        bad.request.headers["X-Strictq-Message-Id"] = "m-2"
        bad.request.headers["x-strictq-lease"] = "nope"
        tagging.requestheaders(bad)
        assert bad.response is not None and bad.response.status_code == 400
        assert bad.response.json()["code"] == "malformed_tags"
        assert "X-Strictq-Proxy-Action" not in bad.response.headers

        tctx.configure(tagging, strictq_keep_tags=True)
        kept = tflow.tflow()
        kept.request.headers["X-Strictq-Message-Id"] = "m-3"
        tagging.requestheaders(kept)
        assert kept.request.headers["X-Strictq-Message-Id"] == "m-3"

        untagged = tflow.tflow()
        tagging.requestheaders(untagged)
        assert context_of(untagged) is None  # nothing to record beyond what auth set


# ------------------------------------------------------------------------------------ real proxy
@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_tags_are_stripped_upstream(shared_proxy: ProxyProcess, shared_backends, scheme: str) -> None:
    backend = shared_backends.http if scheme == "http" else shared_backends.https
    marker = unique("strip")
    async with WorkerClient(shared_proxy, tags=make_tags(message_id=marker, lease=7)) as client:
        reply = await client.call("GET", f"{backend.url}/{marker}", headers={"X-Keep": "1"})
    assert reply.status == 200
    (seen,) = backend.seen
    assert seen.tag_headers == [] and seen.header("X-Keep") == "1"
    (record,) = await wait_marked(shared_proxy, marker, 1)
    assert (record["message_id"], record["lease"], record["call"], record["tagged"]) == (marker, 7, 1, True)
    # the record's request headers are what left the proxy: no tags either
    names = {name.lower() for name, _ in record["request"]["headers"]}
    assert not names & {t.lower() for t in TAG_HEADERS}


async def test_keep_tags_forwards_them(proxy_factory, shared_backends) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory("--keep-tags")
    marker = unique("keep")
    async with WorkerClient(proxy, tags=make_tags(message_id=marker)) as client:
        # the shared backends trust the shared CA; this proxy trusts the function-scoped one: use HTTP
        reply = await client.call("GET", f"{shared_backends.http.url}/{marker}")
    assert reply.status == 200
    (seen,) = shared_backends.http.seen
    assert seen.header("X-Strictq-Message-Id") == marker
    assert sorted(seen.tag_headers) == sorted(TAG_HEADERS)


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_untagged_calls_pass_and_are_logged_untagged(
    shared_proxy: ProxyProcess, shared_backends, scheme: str
) -> None:
    backend = shared_backends.http if scheme == "http" else shared_backends.https
    marker = unique("untagged")
    async with WorkerClient(shared_proxy, "worker-1") as client:
        reply = await client.call("GET", f"{backend.url}/{marker}")
    assert reply.status == 200
    (record,) = await wait_marked(shared_proxy, marker, 1)
    assert record["worker"] == "worker-1" and record["tagged"] is False and record["action"] == "pass"
    assert [record[k] for k in ("queue", "message_id", "group", "lease", "attempt", "call")] == [None] * 6


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_malformed_tags_get_400_recorded_and_proxy_keeps_running(
    shared_proxy: ProxyProcess, shared_backends, scheme: str
) -> None:
    backend = shared_backends.http if scheme == "http" else shared_backends.https
    marker = unique("bad")
    bad_sets = [
        {
            "X-Strictq-Message-Id": marker,
            "X-Strictq-Queue": "q",
            "X-Strictq-Group": "g",
            "X-Strictq-Lease": "x1",
        },
        {"X-Strictq-Message-Id": marker, "X-Strictq-Group": "g" * 1000},
        {"X-Strictq-Queue": "q", "X-Strictq-Group": "g"},  # partial: no message id
    ]
    async with WorkerClient(shared_proxy, "worker-1") as client:
        for headers in bad_sets:
            reply = await client.call("POST", f"{backend.url}/{marker}", headers=headers, data=b"x")
            assert reply.status == 400
            body = reply.json()
            assert body["code"] == "malformed_tags" and "X-Strictq" in body["message"]
            assert "X-Strictq-Proxy-Action" not in reply.headers
        assert backend.seen == []  # refused calls never reach the backend
        ok = await client.call("GET", f"{backend.url}/{marker}")  # the proxy is fine
        assert ok.status == 200
    assert shared_proxy.running()
    records = await wait_marked(shared_proxy, marker, 4)
    assert [r["response"]["status"] for r in records] == [400, 400, 400, 200]
    assert [r["code"] for r in records] == ["malformed_tags"] * 3 + [None]
    assert all(r["action"] == ("block" if r["code"] else "pass") for r in records)
    assert records[0]["message_id"] == marker and records[0]["lease"] is None
