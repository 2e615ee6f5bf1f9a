"""The edge's side of geography (issue 16): which region a request comes from (gateway.client_region), the
`strictq serve` flags of an edge refused as one line, and the SDK's STRICTQ_REGION on the wire."""

from __future__ import annotations

import asyncio
import ipaddress
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from cluster.geo import CLIENT_REGION, ClientRegion, client_region
from gateway.client_region import (
    RegionResolver,
    RegionTableError,
    client_region_middleware,
    load_table,
    parse_address,
    parse_network,
)
from protocol import headers
from strictq.sdk import ConfigError
from strictq.sdk.client import EmoClient
from strictq.sdk.config import ClientConfig
from strictq.sdk.producer import Producer
from tests.kit.backend import Backend
from tests.kit.process import strictq

REGION = headers.REGION
XFF = "X-Forwarded-For"


def net(text: str) -> Any:
    return ipaddress.ip_network(text)


TABLE = [
    (net("10.0.0.0/8"), "us"),
    (net("10.1.0.0/16"), "eu"),
    (net("10.1.2.0/24"), "ap"),
    (net("203.0.113.0/24"), "ap"),
    (net("2001:db8::/32"), "eu"),
    (net("2001:db8:1::/48"), "us"),
]
PROXIES = [net("192.168.0.0/24"), net("127.0.0.1/32")]


def resolver(*, trust_header: bool = False, edge: str = "eu") -> RegionResolver:
    return RegionResolver(edge, TABLE, PROXIES, trust_header)


# ------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    ("address", "region"),
    [
        ("10.9.9.9", "us"),  # only the /8
        ("10.1.9.9", "eu"),  # the /16 beats the /8
        ("10.1.2.3", "ap"),  # the /24 beats both
        ("2001:db8:2::1", "eu"),
        ("2001:db8:1::1", "us"),  # the /48 beats the /32
        ("::ffff:10.1.2.3", "ap"),  # an IPv4-mapped peer (a dual-stack socket) is its IPv4 address
    ],
)
def test_longest_prefix_wins(address: str, region: str) -> None:
    assert resolver().resolve(address, {}) == ClientRegion(region, "address")


def test_an_address_in_no_network_gets_the_edges_region() -> None:
    assert resolver().resolve("172.16.0.1", {}) == ClientRegion("eu", "edge")
    assert resolver().resolve(None, {}) == ClientRegion("eu", "edge")  # a unix socket: no peer address
    assert resolver().resolve("2001:db9::1", {}) == ClientRegion("eu", "edge")
    unknown = RegionResolver("").resolve("10.1.2.3", {})
    assert unknown == ClientRegion("", "edge") and not unknown.trusted  # no region anywhere: unknown


def test_a_trusted_header_wins_over_everything() -> None:
    answer = resolver(trust_header=True).resolve("10.1.2.3", {REGION: "us", XFF: "10.1.0.1"})
    assert answer == ClientRegion("us", "header") and answer.trusted


def test_an_untrusted_header_is_only_a_claim_when_nothing_else_is_known() -> None:
    # The edge knows (table, or its own region): the claim changes nothing, it never moves a partition.
    assert resolver().resolve("10.1.2.3", {REGION: "us"}) == ClientRegion("ap", "address")
    assert resolver().resolve("172.16.0.1", {REGION: "us"}) == ClientRegion("eu", "edge")
    # An edge without a region and an address in no network: the claim orders that worker's polls only.
    claimed = RegionResolver("", TABLE).resolve("172.16.0.1", {REGION: "us"})
    assert claimed == ClientRegion("us", "claimed") and not claimed.trusted


@pytest.mark.parametrize("value", ["", "  ", "u s", "eu;drop", "x" * 65, "ü"])
def test_a_header_that_is_not_a_region_name_is_ignored(value: str) -> None:
    assert resolver(trust_header=True).resolve("10.1.0.1", {REGION: value}) == ClientRegion("eu", "address")
    assert RegionResolver("").resolve("172.16.0.1", {REGION: value}) == ClientRegion("", "edge")


def test_forwarded_for_from_a_trusted_proxy() -> None:
    assert resolver().resolve("192.168.0.7", {XFF: "10.1.2.9"}) == ClientRegion("ap", "forwarded")
    # No X-Forwarded-For: the proxy's own address.
    assert resolver().resolve("192.168.0.7", {}) == ClientRegion("eu", "edge")
    # Through two trusted proxies (each appends what it saw): the client is left of them.
    chain = {XFF: "10.9.0.1, 192.168.0.3"}
    assert resolver().resolve("192.168.0.7", chain) == ClientRegion("us", "forwarded")
    # Behind the proxy, a client in no network: the edge's region, not the proxy's address's.
    assert resolver().resolve("192.168.0.7", {XFF: "172.16.0.1"}) == ClientRegion("eu", "edge")


def test_a_spoofed_chain_is_not_believed() -> None:
    # The client (203.0.113.9, ap) wrote "10.1.0.5" (eu) itself; the trusted proxy appended what it saw.
    spoofed = {XFF: "10.1.0.5, 203.0.113.9"}
    assert resolver().resolve("192.168.0.7", spoofed) == ClientRegion("ap", "forwarded")
    # A client that claims to be a trusted proxy in the chain is skipped only as far as a real address.
    assert resolver().resolve("192.168.0.7", {XFF: "10.1.0.5, 203.0.113.9, 192.168.0.2"}) == ClientRegion(
        "ap", "forwarded"
    )
    # X-Forwarded-For from a peer that is not a trusted proxy: ignored, the peer's address counts.
    assert resolver().resolve("203.0.113.9", {XFF: "10.1.0.5"}) == ClientRegion("ap", "address")
    # Garbage where the client should be: unknown, so the edge's region (never an address left of it).
    assert resolver().resolve("192.168.0.7", {XFF: "10.1.0.5, not-an-ip"}) == ClientRegion("eu", "edge")
    # Without trusted proxies nothing forwarded counts.
    plain = RegionResolver("eu", TABLE)
    assert plain.resolve("192.168.0.7", {XFF: "10.1.2.9"}) == ClientRegion("eu", "edge")


def test_forwarded_chains_over_repeated_headers_with_ports_and_ipv6() -> None:
    repeated = CIMultiDict([(XFF, "10.1.0.5"), (XFF, "203.0.113.9:5123, 192.168.0.2")])
    assert resolver().resolve("192.168.0.7", repeated) == ClientRegion("ap", "forwarded")
    v6 = {XFF.lower(): "[2001:db8:1::9]:443"}  # a plain dict with the lowercase spelling
    assert resolver().resolve("192.168.0.7", CIMultiDict(v6)) == ClientRegion("us", "forwarded")
    all_proxies = {XFF: "192.168.0.2, 192.168.0.3"}  # every hop trusted: the left-most is the client
    assert resolver().resolve("127.0.0.1", all_proxies) == ClientRegion("eu", "edge")


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("10.0.0.1", "10.0.0.1"),
        (" 10.0.0.1:8080 ", "10.0.0.1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("2001:db8::1", "2001:db8::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("unknown", None),
        ("[2001:db8::1", None),
        ("", None),
    ],
)
def test_parse_address(text: str, address: str | None) -> None:
    parsed = parse_address(text)
    assert (str(parsed) if parsed is not None else None) == address


def test_parse_network() -> None:
    assert parse_network("10.1.0.0/16") == net("10.1.0.0/16")
    assert parse_network("127.0.0.1") == net("127.0.0.1/32")
    with pytest.raises(ValueError, match=r"'10.1.2.3/16' has host bits set \(the network is 10.1.0.0/16\)"):
        parse_network("10.1.2.3/16")
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an IPv4 or IPv6 network"):
        parse_network("10.0.0.0/33")


# ------------------------------------------------------------------------------------ the table
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "regions.toml"
    path.write_text(text)
    return path


def test_load_table(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[regions]\n"10.1.0.0/16" = "eu"\n"10.0.0.0/8" = "us"\n"2001:db8::/32" = "ap"\n"192.0.2.7" = "eu"\n',
    )
    table = load_table(path)
    assert dict(table) == {
        net("10.1.0.0/16"): "eu",
        net("10.0.0.0/8"): "us",
        net("2001:db8::/32"): "ap",
        net("192.0.2.7/32"): "eu",
    }
    assert RegionResolver("x", table).resolve("10.1.3.4", {}) == ClientRegion("eu", "address")
    assert load_table(write(tmp_path, "[regions]\n")) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[regions\n", "not valid TOML"),
        ('regions = "eu"\n', "no [regions] table"),
        ("", "no [regions] table"),
        ('[region]\n"10.0.0.0/8" = "eu"\n', "unknown key 'region': only a [regions] table"),
        ('[regions]\n"10.0.0.0/33" = "eu"\n', "[regions] key '10.0.0.0/33' is not an IPv4 or IPv6 network"),
        ('[regions]\n"10.1.2.3/16" = "eu"\n', "'10.1.2.3/16' has host bits set (the network is 10.1.0.0/16)"),
        ('[regions]\neu = "10.0.0.0/8"\n', "[regions] key 'eu' is not an IPv4 or IPv6 network"),
        ('[regions]\n"10.0.0.0/8" = 1\n', "'10.0.0.0/8': the region must be a string, not 1"),
        ('[regions]\n"10.0.0.0/8" = "e u"\n', "'10.0.0.0/8': 'e u' is not a region"),
        (
            '[regions]\n"2001:db8::/32" = "eu"\n"2001:0db8::/32" = "us"\n',
            "'2001:0db8::/32': 2001:db8::/32 is already given region 'eu'",
        ),
    ],
)
def test_load_table_errors_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RegionTableError) as raised:
        load_table(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_load_table_unreadable(tmp_path: Path) -> None:
    with pytest.raises(RegionTableError, match=r"missing\.toml: cannot read it"):
        load_table(tmp_path / "missing.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[regions]")
    with pytest.raises(RegionTableError, match=r"binary\.toml: not UTF-8 text"):
        load_table(binary)


# ------------------------------------------------------------------------- over a real socket
async def test_middleware_sets_the_client_region_behind_a_trusted_proxy() -> None:
    """An edge app behind a real server, its trusted front proxy on 127.0.0.1 (this test's client): each
    request's handler sees the region of the address the proxy forwarded, and the next request on the same
    connection does not inherit it."""
    seen: list[ClientRegion | None] = []

    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(0)  # across a suspension point too
        found = client_region()
        seen.append(found)
        return web.json_response(None if found is None else [found.region, found.source])

    app = web.Application()
    app.middlewares.append(client_region_middleware(RegionResolver("eu", TABLE, [net("127.0.0.1/32")])))
    app.router.add_get("/", handler)
    plain = web.Application()  # the same handler without the middleware: nothing is set
    plain.router.add_get("/", handler)
    runners = [web.AppRunner(a, handle_signals=False, access_log=None) for a in (app, plain)]
    urls = []
    try:
        for runner in runners:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}/")
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection: requests in sequence on it
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as s:

            async def get(url: str, **request_headers: str) -> Any:
                async with s.get(url, headers=request_headers) as answer:
                    assert answer.status == 200
                    return await answer.json()

            assert await get(urls[0], **{XFF: "10.1.2.9"}) == ["ap", "forwarded"]
            assert await get(urls[0], **{XFF: "10.1.0.5, 203.0.113.9"}) == ["ap", "forwarded"]
            assert await get(urls[0], **{XFF: "10.9.0.1"}) == ["us", "forwarded"]
            assert await get(urls[0]) == ["eu", "edge"]  # 127.0.0.1 itself is in no network
            assert await get(urls[0], **{REGION: "us"}) == ["eu", "edge"]  # not trusted: no say
            assert await get(urls[1], **{XFF: "10.1.2.9"}) is None
        assert CLIENT_REGION.get() is None
        assert len(seen) == 6
    finally:
        for runner in runners:
            await runner.cleanup()


# --------------------------------------------------------------------------------- serve's flags
def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        strictq("serve", "--data-dir", str(tmp_path / "data"), "--port", "0", "--no-proxy", *args),
        capture_output=True,
        text=True,
        timeout=60,
    )


CLUSTER = ("--cluster", "nats://u:p@127.0.0.1:1")  # never reached: every case is refused before


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--zone", "eu-1"), "strictq: --zone is for an edge of a cluster: it goes with --cluster"),
        (("--trust-region-header",), "strictq: --trust-region-header is for an edge of a cluster"),
        (("--reach", "eu=http://x:1"), "strictq: --reach is for an edge of a cluster"),
        (("--traffic-window", "5"), "strictq: --traffic-window is for an edge of a cluster"),
        (("--trusted-proxy", "10.0.0.0/8"), "strictq: --trusted-proxy is for an edge of a cluster"),
        ((*CLUSTER, "--reach", "eu"), "strictq: --reach: 'eu' is not NODE=URL (e.g. eu=http://10.0.0.5:8470)"),
        ((*CLUSTER, "--reach", "e u=http://x:1"), "strictq: --reach: 'e u' is not a node name"),
        ((*CLUSTER, "--reach", "eu=ftp://x"), "strictq: --reach: 'eu=ftp://x': the URL must be http://"),
        (
            (*CLUSTER, "--reach", "eu=http://a:1", "--reach", "eu=http://b:1"),
            "strictq: --reach: 'eu=http://b:1': node 'eu' is given twice",
        ),
        (
            (*CLUSTER, "--trusted-proxy", "10.0.0.1/8"),
            "strictq: --trusted-proxy: '10.0.0.1/8' has host bits set (the network is 10.0.0.0/8)",
        ),
        ((*CLUSTER, "--trusted-proxy", "proxy"), "strictq: --trusted-proxy: 'proxy' is not an IPv4 or IPv6"),
        ((*CLUSTER, "--zone", "a/b"), "strictq: --zone: 'a/b' is not a zone"),
        ((*CLUSTER, "--edge-name", "edge.1"), "strictq: --edge-name: 'edge.1' is not a name for an edge"),
        ((*CLUSTER, "--traffic-window", "0"), "strictq: --traffic-window: 0 is not 1-86400 seconds"),
        ((*CLUSTER, "--traffic-window", "nan"), "strictq: --traffic-window: nan is not 1-86400 seconds"),
        ((*CLUSTER, "--region", "EU"), "strictq: --region: invalid region 'EU'"),
    ],
)
def test_serve_refuses_bad_edge_flags_in_one_line(tmp_path: Path, args: tuple[str, ...], line: str) -> None:
    result = serve(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(line), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was written


def test_serve_refuses_a_bad_client_region_table(tmp_path: Path) -> None:
    table = write(tmp_path, '[regions]\n"10.0.0.0/8" = "e u"\n')
    result = serve(tmp_path, *CLUSTER, "--client-regions", str(table))
    assert result.returncode == 2
    assert result.stderr == f"strictq: --client-regions: {table}: [regions] '10.0.0.0/8': 'e u' is not a region: 1-64 letters, digits, '_' or '-'\n"  # noqa: E501
    missing = serve(tmp_path, *CLUSTER, "--client-regions", str(tmp_path / "none.toml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"strictq: --client-regions: {tmp_path / 'none.toml'}: cannot read it")


def test_serve_help_says_the_first_region_is_the_edges() -> None:
    result = subprocess.run(strictq("serve", "--help"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "the first --region is also this edge's region" in text
    for flag in ("--zone", "--edge-name", "--client-regions", "--trusted-proxy", "--trust-region-header"):
        assert flag in text
    assert "--reach NODE=URL" in text and "--traffic-window SECONDS" in text


# ------------------------------------------------------------------------------- the SDK's header
async def test_sdk_sends_strictq_region_on_every_gateway_request() -> None:
    backend = Backend()
    backend.answer = lambda seen: [] if seen.path.endswith("/poll") else {}  # type: ignore[assignment,return-value]
    await backend.start(None)
    try:
        env = {"STRICTQ_URL": backend.url, "STRICTQ_API_KEY": "k", "STRICTQ_REGION": "ap-1"}
        config = ClientConfig.from_env(env)
        assert config.region == "ap-1"
        async with Producer(config, linger=0) as producer:
            await producer.send_batch([("orders", {"n": 1}, "g")])
        async with EmoClient(config, "worker-key") as worker:  # the worker's gateway client
            assert await worker.poll("orders", ttl=5, limit=1) == []
            await worker.ack("orders", ["m1"], 7)
        assert [s.header(REGION) for s in backend.seen] == ["ap-1"] * 3
        backend.reset()
        unset = ClientConfig.from_env({**env, "STRICTQ_REGION": " "})
        async with Producer(unset, linger=0) as producer:
            await producer.send_batch([("orders", {"n": 2}, "g")])
        assert [s.header(REGION) for s in backend.seen] == [None]
    finally:
        await backend.stop()


def test_sdk_refuses_a_region_that_is_not_a_name() -> None:
    with pytest.raises(ConfigError, match="STRICTQ_REGION: 'eu west' is not a region"):
        ClientConfig.from_env({"STRICTQ_URL": "http://127.0.0.1:1", "STRICTQ_REGION": "eu west"})
