"""The auth addon: workers authenticate at the egress proxy with Proxy-Authorization (their own credential
from the gateway's key file). Unit tests drive the addon through mitmproxy's test context; the rest go
through a real `strictq proxy` to real HTTP and HTTPS backends."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from mitmproxy.test import taddons, tflow
from proxy_support import (
    ProxyProcess,
    WorkerClient,
    credential,
    unique,
    wait_marked,
    write_keys,
)

from fencing.addons.auth import Auth, parse_basic
from fencing.context import context_of
from fencing.runtime import ProxyRuntime

pytest_plugins = ["proxy_support"]  # its fixtures: backends, proxies, CAs


def basic(user: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


@pytest.fixture
def auth(tmp_path: Path) -> Auth:
    return Auth(ProxyRuntime())


def configured(auth: Auth, keys: Path) -> taddons.context:
    tctx = taddons.context(auth)
    tctx.configure(auth, strictq_keys=str(keys))
    return tctx


# ------------------------------------------------------------------------------------------- unit
def test_parse_basic() -> None:
    assert parse_basic(basic("worker-1", "s:e:c")) == ("worker-1", "s:e:c")  # secret may hold colons
    assert parse_basic("basic " + base64.b64encode(b"a:b").decode()) == ("a", "b")
    for bad in ("Bearer abc", "Basic", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        assert parse_basic(bad) is None, bad


async def test_valid_worker_is_attributed_and_header_removed(auth: Auth, tmp_path: Path) -> None:
    with configured(auth, write_keys(tmp_path / "k.toml")):
        flow = tflow.tflow()
        flow.request.headers["Proxy-Authorization"] = basic("worker-1", credential("worker-1").secret)
        auth.requestheaders(flow)
        ctx = context_of(flow)
        assert ctx is not None and (ctx.worker, ctx.tenant) == ("worker-1", "t1")
        assert flow.response is None
        assert "Proxy-Authorization" not in flow.request.headers
        # the second call with the same header takes the cached path and is attributed the same way
        again = tflow.tflow()
        again.request.headers["Proxy-Authorization"] = basic("worker-1", credential("worker-1").secret)
        auth.requestheaders(again)
        assert context_of(again).worker == "worker-1"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "proxy_auth_required"),
        ("Bearer xyz", "bad_proxy_authorization"),
        (basic("nobody-0", "whatever-secret-123"), "bad_credentials"),
        (basic("worker-1", "wrong-secret-0123456789"), "bad_credentials"),
        (basic("producer-1", credential("producer-1").secret), "role_not_allowed"),
        (basic("proxy-1", credential("proxy-1").secret), "role_not_allowed"),
    ],
)
async def test_refused_with_407(auth: Auth, tmp_path: Path, header: str | None, code: str) -> None:
    with configured(auth, write_keys(tmp_path / "k.toml")):
        flow = tflow.tflow()
        if header is not None:
            flow.request.headers["Proxy-Authorization"] = header
        auth.requestheaders(flow)
        assert flow.response is not None and flow.response.status_code == 407
        assert flow.response.headers["Proxy-Authenticate"].startswith("Basic realm=")
        assert flow.response.json()["code"] == code
        assert "X-Strictq-Proxy-Action" not in flow.response.headers  # not a verdict on a claim
        assert "Proxy-Authorization" not in flow.request.headers
        ctx = context_of(flow)
        assert ctx is not None and ctx.worker is None and (ctx.action, ctx.code) == ("block", code)


async def test_admin_may_use_the_proxy(auth: Auth, tmp_path: Path) -> None:
    with configured(auth, write_keys(tmp_path / "k.toml")):
        flow = tflow.tflow()
        flow.request.headers["Proxy-Authorization"] = basic("admin-1", credential("admin-1").secret)
        auth.requestheaders(flow)
        assert flow.response is None and context_of(flow).worker == "admin-1"  # type: ignore[union-attr]


async def test_tunnel_remembers_the_worker(auth: Auth, tmp_path: Path) -> None:
    """A CONNECT authenticates the client connection: requests inside carry no credential."""
    with configured(auth, write_keys(tmp_path / "k.toml")):
        connect = tflow.tflow()
        connect.request.method = "CONNECT"
        connect.request.headers["Proxy-Authorization"] = basic("worker-2", credential("worker-2").secret)
        auth.http_connect(connect)
        assert connect.response is None
        inner = tflow.tflow(client_conn=connect.client_conn)
        auth.requestheaders(inner)
        assert inner.response is None and context_of(inner).worker == "worker-2"  # type: ignore[union-attr]
        # another connection is not authenticated by it
        other = tflow.tflow()
        auth.requestheaders(other)
        assert other.response is not None and other.response.status_code == 407
        # the tunnel is forgotten with its connection
        auth.client_disconnected(connect.client_conn)
        late = tflow.tflow(client_conn=connect.client_conn)
        auth.requestheaders(late)
        assert late.response is not None and late.response.status_code == 407


async def test_no_key_file_refuses_everyone(auth: Auth) -> None:
    with taddons.context(auth):
        flow = tflow.tflow()
        flow.request.headers["Proxy-Authorization"] = basic("worker-1", credential("worker-1").secret)
        auth.requestheaders(flow)
        assert flow.response is not None and flow.response.status_code == 407


# ------------------------------------------------------------------------------------ real proxy
@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize(
    ("worker", "secret", "code"),
    [
        (None, None, "proxy_auth_required"),
        ("nobody-0", "whatever-secret-123", "bad_credentials"),
        ("worker-1", "wrong-secret-0123456789", "bad_credentials"),
    ],
)
async def test_bad_credentials_get_407_and_are_recorded(
    shared_proxy: ProxyProcess,
    shared_backends,
    scheme: str,
    worker: str | None,
    secret: str | None,
    code: str,
) -> None:
    backend = shared_backends.http if scheme == "http" else shared_backends.https
    marker = unique("auth")
    async with WorkerClient(shared_proxy, worker, secret=secret) as client:
        reply = await client.call("GET", f"{backend.url}/{marker}")
    assert reply.status == 407
    assert reply.headers.get("Proxy-Authenticate", "").startswith("Basic realm=")
    if scheme == "http":  # an HTTPS refusal happens at CONNECT: aiohttp keeps only the status
        assert reply.json()["code"] == code
    assert backend.accepted == 0 and backend.seen == []  # nothing reached the backend
    if scheme == "http":
        (record,) = await wait_marked(shared_proxy, marker, 1)
        assert record["request"]["url"].endswith(f"/{marker}")
    else:  # the refused CONNECT is the record: its URL is the authority
        records = await wait_marked(shared_proxy, backend.host_port, 1)
        record = records[-1]
        assert record["request"]["method"] == "CONNECT"
    assert record["response"]["status"] == 407
    assert (record["worker"], record["action"], record["code"]) == (None, "block", code)


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_worker_passes_and_credential_never_leaves(
    shared_proxy: ProxyProcess, shared_backends, scheme: str
) -> None:
    backend = shared_backends.http if scheme == "http" else shared_backends.https
    marker = unique("auth-ok")
    async with WorkerClient(shared_proxy, "worker-2") as client:
        for _ in range(2):  # the second call reuses the tunnel / connection
            reply = await client.call("GET", f"{backend.url}/{marker}")
            assert reply.status == 200, reply
    assert len(backend.seen) == 2
    for seen in backend.seen:
        assert seen.header("Proxy-Authorization") is None
    records = await wait_marked(shared_proxy, marker, 2)
    assert [r["worker"] for r in records] == ["worker-2", "worker-2"]
    assert [r["response"]["status"] for r in records] == [200, 200]
    secret = credential("worker-2").secret
    for record in records:
        assert secret not in str(record)
