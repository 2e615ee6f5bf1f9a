"""Issue 11, item 2 (follow-ups): the egress proxy serves its control key's tenant only, and the search
endpoint's numbers are plain ASCII digits.

A proxy reading the control stream with tenant A's `proxy` key only ever learns A's fences and token
floors (queue_core.scope), so a worker of tenant B must not get through it: B's fenced worker would pass.
Unit tests drive the auth addon (with the control addon's options) through mitmproxy's test context; the
end-to-end test runs a real `strictq queue-server` with a two-tenant key file and real `strictq proxy`
processes following its control stream, with real HTTP and HTTPS backends.
(The health monitor's per-tenant shared signatures are tested in tests/test_health_monitor.py.)
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import proxy_support
import pytest
from aiohttp import web
from control_support import admin_call, proxy_control, running_queue_server
from mitmproxy import exceptions
from mitmproxy.test import taddons, tflow
from proxy_support import Backends, ProxyProcess, WorkerClient, proxy_command, wait_records, write_keys

from access.keys import Credential, KeyRing
from fencing.addons.auth import Auth
from fencing.addons.control import Control
from fencing.context import PROXY_ACTION_HEADER, context_of
from fencing.runtime import ProxyRuntime
from queue_core.control import ControlHub
from queue_core.service import QueueService
from strictq.serve import make_edge_app

pytest_plugins = ["proxy_support"]  # backends, upstream CA, proxy factory

CREDENTIALS = [
    Credential("ta-worker", "ta-worker-secret-0123456789", "worker", "ta"),
    Credential("tb-worker", "tb-worker-secret-0123456789", "worker", "tb"),
    Credential("ta-admin", "ta-admin-secret-0123456789", "admin", "ta"),
    Credential("tb-admin", "tb-admin-secret-0123456789", "admin", "tb"),
    Credential("ta-proxy", "ta-proxy-secret-0123456789", "proxy", "ta"),  # the first proxy: the default
    Credential("tb-proxy", "tb-proxy-secret-0123456789", "proxy", "tb"),
    Credential("ops-1", "operator-secret-0123456789", "operator", "ops"),
]
CONTROL_URL = "http://127.0.0.1:9"  # never contacted: the control addon connects only once running


def secret(key_id: str) -> str:
    return next(c.secret for c in CREDENTIALS if c.id == key_id)


def basic(key_id: str) -> str:
    return "Basic " + base64.b64encode(f"{key_id}:{secret(key_id)}".encode()).decode()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return write_keys(tmp_path / "b2-keys.toml", CREDENTIALS)  # proxy_keys writes keys.toml


def proxy_addons(keys: Path, **control: str) -> tuple[Auth, taddons.context]:
    """The auth addon beside the control addon (which declares the control options), configured as
    `build_master` does: the key file first, the control options after."""
    auth = Auth(ProxyRuntime())
    tctx = taddons.context(auth, Control())
    tctx.configure(auth, strictq_keys=str(keys))
    if control:
        tctx.configure(auth, **control)
    return auth, tctx


def call(auth: Auth, worker: str) -> Any:
    flow = tflow.tflow()
    flow.request.headers["Proxy-Authorization"] = basic(worker)
    auth.requestheaders(flow)
    return flow


def refused_for_tenant(flow: Any, worker: str, tenant: str) -> bool:
    ctx = context_of(flow)
    assert flow.response is not None and flow.response.status_code == 407, flow.response
    body = flow.response.json()
    assert body["code"] == "tenant_not_served" and f"tenant {tenant!r} is not served" in body["message"]
    assert flow.response.headers["Proxy-Authenticate"].startswith("Basic realm=")
    assert PROXY_ACTION_HEADER not in flow.response.headers  # not a verdict on a claim
    assert "Proxy-Authorization" not in flow.request.headers
    assert ctx is not None and (ctx.worker, ctx.tenant, ctx.action) == (worker, tenant, "block")
    return True


def passed(flow: Any, worker: str) -> bool:
    ctx = context_of(flow)
    return flow.response is None and ctx is not None and ctx.worker == worker


# ------------------------------------------------------------------------------------------- unit
async def test_the_default_control_key_serves_its_tenant_only(keys: Path) -> None:
    auth, tctx = proxy_addons(keys, strictq_control=CONTROL_URL)
    with tctx:
        assert auth.tenant == "ta"
        assert passed(call(auth, "ta-worker"), "ta-worker")
        for _ in range(2):  # the second call takes the cached path: refused all the same
            flow = call(auth, "tb-worker")
            assert refused_for_tenant(flow, "tb-worker", "tb")
            assert "'ta'" not in flow.response.json()["message"]  # the served tenant is not named
        assert not passed(call(auth, "tb-admin"), "tb-admin")  # admins of another tenant too
        assert auth.runtime.metrics["auth.tenant_not_served"] == 3


async def test_a_refused_connect_opens_no_tunnel(keys: Path) -> None:
    auth, tctx = proxy_addons(keys, strictq_control=CONTROL_URL)
    with tctx:
        connect = tflow.tflow()
        connect.request.method = "CONNECT"
        connect.request.headers["Proxy-Authorization"] = basic("tb-worker")
        auth.http_connect(connect)
        assert refused_for_tenant(connect, "tb-worker", "tb")
        inner = tflow.tflow(client_conn=connect.client_conn)
        auth.requestheaders(inner)
        assert inner.response is not None and inner.response.status_code == 407


async def test_a_tunnel_of_a_tenant_no_longer_served_is_refused(keys: Path) -> None:
    auth, tctx = proxy_addons(keys)  # standalone first: every tenant
    with tctx:
        connect = tflow.tflow()
        connect.request.method = "CONNECT"
        connect.request.headers["Proxy-Authorization"] = basic("tb-worker")
        auth.http_connect(connect)
        assert connect.response is None
        tctx.configure(auth, strictq_control=CONTROL_URL)  # now tenant ta's proxy
        inner = tflow.tflow(client_conn=connect.client_conn)
        auth.requestheaders(inner)
        assert refused_for_tenant(inner, "tb-worker", "tb")


@pytest.mark.parametrize(
    ("options", "served", "refused"),
    [
        ({"strictq_control_key_id": "ops-1"}, ["ta-worker", "tb-worker"], []),  # operator: all tenants
        ({"strictq_control_key_id": "tb-proxy"}, ["tb-worker"], ["ta-worker"]),
        ({"strictq_control_key_id": "tb-admin"}, ["tb-worker"], ["ta-worker"]),
        ({"strictq_control_key": secret("tb-proxy")}, ["tb-worker"], ["ta-worker"]),
        ({"strictq_control_key": secret("ops-1")}, ["ta-worker", "tb-worker"], []),
    ],
)
async def test_the_control_key_decides_the_tenant(
    keys: Path, options: dict[str, str], served: list[str], refused: list[str]
) -> None:
    auth, tctx = proxy_addons(keys, strictq_control=CONTROL_URL, **options)
    with tctx:
        for worker in served:
            assert passed(call(auth, worker), worker)
        for worker in refused:
            assert refused_for_tenant(call(auth, worker), worker, worker[:2])


async def test_a_standalone_proxy_serves_every_tenant(keys: Path) -> None:
    """No control stream: nothing is fenced and no floor is known for anyone (documented standalone)."""
    auth, tctx = proxy_addons(keys)
    with tctx:
        assert auth.tenant is None
        for worker in ("ta-worker", "tb-worker"):
            assert passed(call(auth, worker), worker)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"strictq_control_key": "not-a-key-of-this-file-000"}, "cannot tell which tenant"),
        ({"strictq_control_key": secret("ta-worker")}, "cannot tell which tenant"),
        ({"strictq_control_key_id": "nobody-1"}, "is not a credential of"),
        ({"strictq_control_key_id": "ta-worker"}, "has role worker"),
    ],
)
async def test_a_control_key_of_unknown_tenant_is_refused_at_start(
    keys: Path, options: dict[str, str], message: str
) -> None:
    auth = Auth(ProxyRuntime())
    with taddons.context(auth, Control()) as tctx:
        tctx.configure(auth, strictq_keys=str(keys))
        with pytest.raises(exceptions.OptionsError, match=message):
            tctx.configure(auth, strictq_control=CONTROL_URL, **options)


def test_cli_control_key_id_needs_control_and_a_known_credential(tmp_path: Path, keys: Path) -> None:
    base = proxy_command(tmp_path / "p", tmp_path / "w", keys, None)
    for extra, expected in (
        (["--control-key-id", "ops-1"], "--control-key-id needs --control"),
        (["--control", CONTROL_URL, "--control-key-id", "nobody-1"], "'nobody-1' is not a credential"),
    ):
        done = subprocess.run(
            [*base, *extra], cwd=proxy_support.ROOT, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done
        assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_strictq_serve_gives_its_proxy_the_operator_key_when_it_serves_several_tenants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from strictq.serve import proxy_control_args

    assert proxy_control_args(KeyRing(list(CREDENTIALS))) == ["--control-key-id", "ops-1"]
    one_tenant = [c for c in CREDENTIALS if c.tenant == "ta"]
    assert proxy_control_args(KeyRing(one_tenant)) == []  # the first proxy key: its own tenant
    assert capsys.readouterr().err == ""
    no_operator = [c for c in CREDENTIALS if c.role != "operator"]
    assert proxy_control_args(KeyRing(no_operator)) == []
    assert "serves tenant ta only" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- end to end
async def synced(proxy: ProxyProcess, within: float = 15.0) -> None:
    """Until the proxy has its control snapshot (fences set before it started are then known)."""
    deadline = time.monotonic() + within
    while not (await proxy_control(proxy.admin_url))["synced"]:
        assert time.monotonic() < deadline, "the proxy never synchronised"
        await asyncio.sleep(0.05)


async def test_a_tenants_proxy_refuses_another_tenants_fenced_worker(
    tmp_path: Path, keys: Path, backends: Backends, proxy_factory: Any
) -> None:
    """The issue's gap: B's worker, fenced by B's admin, went through A's proxy (which never learns B's
    fences). Now A's proxy refuses B's workers with 407; a proxy with the operator key blocks the fenced
    worker with 403; neither call reaches a backend."""
    with running_queue_server(tmp_path / "core", keys) as core:
        fence = {"mode": "block", "reason": "t"}
        path = "/admin/v1/fences/tb-worker"
        status, body = await admin_call(core.url, secret("tb-admin"), "PUT", path, fence)
        assert status == 200, body
        proxy_a = proxy_factory("--control", core.url, keys=keys, name="a")  # ta-proxy: the first proxy
        proxy_ops = proxy_factory("--control", core.url, "--control-key-id", "ops-1", keys=keys, name="o")
        await synced(proxy_a)
        await synced(proxy_ops)
        for backend in backends.all():
            async with WorkerClient(proxy_a, "tb-worker", secret=secret("tb-worker")) as worker:
                reply = await worker.call("GET", f"{backend.url}/b-through-a")
            assert reply.status == 407
            if backend is backends.http:  # an HTTPS refusal happens at CONNECT: only the status is kept
                assert reply.json()["code"] == "tenant_not_served"
            async with WorkerClient(proxy_ops, "tb-worker", secret=secret("tb-worker")) as worker:
                reply = await worker.call("GET", f"{backend.url}/b-through-ops")
            assert reply.status == 403 and reply.headers.get(PROXY_ACTION_HEADER) == "block"
            assert (backend.accepted, backend.seen) == (0, [])  # B's worker reached no backend
            async with WorkerClient(proxy_a, "ta-worker", secret=secret("ta-worker")) as worker:
                assert (await worker.call("GET", f"{backend.url}/a-through-a")).status == 200
            async with WorkerClient(proxy_ops, "ta-worker", secret=secret("ta-worker")) as worker:
                assert (await worker.call("GET", f"{backend.url}/a-through-ops")).status == 200
            assert sorted(s.path for s in backend.seen) == ["/a-through-a", "/a-through-ops"]
        # A's proxy recorded the refusals as tenant B's (so B's admin finds them in search), never passed.
        records = await wait_records(
            proxy_a.wirelog_dir, lambda rs: sum(r["code"] == "tenant_not_served" for r in rs) >= 2
        )
        refused = [r for r in records if r["code"] == "tenant_not_served"]
        assert {(r["worker"], r["tenant"], r["action"]) for r in refused} == {("tb-worker", "tb", "block")}
        assert all(r["response"]["status"] == 407 for r in refused)
        assert not [r for r in records if r["worker"] == "tb-worker" and r["action"] == "pass"]


# ------------------------------------------------------------------------------- search parameters
@pytest.fixture
async def search_url(tmp_path: Path) -> AsyncIterator[str]:
    """The gateway app with search mounted on an index directory that does not exist yet: parameters
    are checked first (400), a valid query then answers 404 no_index."""
    service = QueueService(tmp_path / "queue")
    await service.start()
    app = make_edge_app(
        service, KeyRing(list(CREDENTIALS)), index=tmp_path / "index", control=ControlHub(service)
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/admin/v1/search"
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("limit", " 5"),
        ("limit", "5 "),
        ("limit", "\u0663"),  # ARABIC-INDIC DIGIT THREE: int() takes it
        ("limit", "1_0"),
        ("limit", "+5"),
        ("limit", "0"),
        ("limit", "-1"),
        ("limit", "1e3"),
        ("limit", ""),
        ("since", "\u0663m"),  # the time parser's \d takes other scripts' digits
        ("until", " 15m"),
        ("since", "15m\n"),
        ("since", "soon"),
    ],
)
async def test_search_numbers_are_plain_ascii_digits(search_url: str, name: str, value: str) -> None:
    params = {"message_id": "m-1", name: value}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(search_url, params=params, headers={"X-BV-API-Key": secret("ta-admin")}) as r:
            assert r.status == 400 and r.content_type == "application/json"
            body = await r.json()
    error = body["error"]
    assert (error["code"], error["details"]["field"]) == ("invalid_parameter", name)
    assert name in error["message"]


@pytest.mark.parametrize("params", [{"limit": "5"}, {"limit": "10", "since": "15m", "until": "1m ago"}])
async def test_valid_search_numbers_pass(search_url: str, params: dict[str, str]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(
            search_url, params={"message_id": "m-1", **params}, headers={"X-BV-API-Key": secret("ta-admin")}
        ) as r:
            # past the parameter checks
            assert r.status == 404 and (await r.json())["error"]["code"] == "no_index"
