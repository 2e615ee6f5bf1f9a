"""The lease guard (`fencing.addons.lease_guard`): a call tagged below its group's floor is refused 409
`stale-lease`, tagged calls while the control stream is not synchronised get 503 `unsynced`, and in both
cases nothing reaches the backend.

Unit tests drive the addon with mitmproxy's test flows; the end-to-end test runs the issue's scenario
against a real queue server, a real `strictq proxy` following its control stream, and real backends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import proxy_support
import pytest
from control_support import QueueServer, proxy_control, until, wait_proxy_saw
from mitmproxy.test import tflow
from proxy_support import (
    PROXY_CREDENTIAL,
    Backends,
    ProxyProcess,
    WorkerClient,
    free_port,
    make_tags,
    wait_records,
)

from fencing.addons.lease_guard import LeaseGuard
from fencing.context import METADATA_KEY, PROXY_ACTION_HEADER, CallContext
from fencing.control_client import ControlClient, ControlState
from queue_core.client import QueueClient
from strictq.sdk.outbound import CallFenced

# proxy_support's fixtures, registered for this module (conftest does not load them).
upstream_ca, backends = proxy_support.upstream_ca, proxy_support.backends
proxy_keys, proxy_factory = proxy_support.proxy_keys, proxy_support.proxy_factory


def tagged_flow(
    lease: int, *, group: str = "g1", queue: str = "orders", tenant: str = "t1"
) -> tflow.HTTPFlow:
    flow = tflow.tflow()
    flow.metadata[METADATA_KEY] = CallContext(
        started=0.0, worker="worker-1", tenant=tenant, queue=queue, message_id="m-1", group=group,
        lease=lease, attempt=1, call=1, tagged=True,
    )  # fmt: skip
    return flow


def synced_state(**floors: int) -> ControlState:
    state = ControlState()
    for group, token in floors.items():
        state.raise_floor("t1.orders", group, token)
    state.mark_synced()
    return state


def test_lease_at_or_above_the_floor_passes() -> None:
    guard = LeaseGuard(synced_state(g1=10))
    for lease in (10, 11):
        flow = tagged_flow(lease)
        guard.requestheaders(flow)
        guard.request(flow)
        assert flow.response is None
        assert flow.metadata[METADATA_KEY].action == "pass"


def test_lease_below_the_floor_is_refused_409() -> None:
    guard = LeaseGuard(synced_state(g1=10))
    flow = tagged_flow(9)
    guard.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 409
    assert flow.response.headers[PROXY_ACTION_HEADER] == "stale-lease"
    body = orjson.loads(flow.response.content or b"")
    assert body["code"] == "stale_lease" and body["action"] == "stale-lease"
    assert "floor 10" in body["message"] and "lease 9" in body["message"]
    ctx = flow.metadata[METADATA_KEY]
    assert (ctx.action, ctx.code) == ("stale-lease", "stale_lease")
    assert guard.refused_stale == 1


def test_floors_are_scoped_by_tenant_queue_and_group() -> None:
    guard = LeaseGuard(synced_state(g1=10))
    for flow in (tagged_flow(1, group="g2"), tagged_flow(1, queue="other"), tagged_flow(1, tenant="t2")):
        guard.requestheaders(flow)
        assert flow.response is None


def test_a_floor_raised_during_the_upload_is_caught_at_request() -> None:
    state = synced_state(g1=10)
    guard = LeaseGuard(state)
    flow = tagged_flow(10)
    guard.requestheaders(flow)
    assert flow.response is None
    state.raise_floor("t1.orders", "g1", 11)  # another claim got the group while the body streamed in
    guard.request(flow)
    assert flow.response is not None and flow.response.status_code == 409


def test_unsynced_refuses_tagged_calls_503_and_passes_untagged_ones() -> None:
    state = ControlState()  # never synchronised
    guard = LeaseGuard(state)
    flow = tagged_flow(10**6)
    guard.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 503
    assert flow.response.headers[PROXY_ACTION_HEADER] == "unsynced"
    assert orjson.loads(flow.response.content or b"")["code"] == "unsynced"
    untagged = tflow.tflow()
    untagged.metadata[METADATA_KEY] = CallContext(started=0.0, worker="worker-1", tenant="t1")
    guard.requestheaders(untagged)
    assert untagged.response is None
    state.mark_synced()
    again = tagged_flow(10**6)
    guard.requestheaders(again)
    assert again.response is None


def test_an_earlier_refusal_stands() -> None:
    guard = LeaseGuard(ControlState())
    flow = tagged_flow(1)
    flow.response = tflow.tresp(status_code=400)
    guard.requestheaders(flow)
    assert flow.response.status_code == 400
    assert guard.refused_unsynced == 0


# ------------------------------------------------------------------------------------- end to end
async def claim_after_expiry(core: QueueClient, queue: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Worker A claims the group's message with a short claim; it expires; worker B gets the group."""
    await core.send_one(queue, "charge order 7", group="g1")
    (a,) = await core.receive(queue, limit=1, worker="worker-1", ttl=0.3)
    deadline = time.monotonic() + 15
    while True:
        got = await core.receive(queue, limit=1, worker="worker-2", ttl=60, wait=1.0)
        if got:
            return a, got[0]
        assert time.monotonic() < deadline, "the expired claim never went to worker B"


async def proxy_floor_reached(server: QueueServer, proxy: ProxyProcess, queue: str, token: int) -> None:
    """Until the proxy has processed the floor event carrying `token` (seen first by our own
    subscriber to the same stream, so the wait is on an event id, not on time)."""
    observer = ControlClient(server.control_url, PROXY_CREDENTIAL.secret, reconnect_min=0.05)
    observer.start()
    try:
        await until(lambda: observer.state.floor(queue, "g1") >= token, what="floor event")
        await wait_proxy_saw(proxy.admin_url, observer.state.last_event_id)
    finally:
        await observer.stop()


async def test_worker_a_with_its_expired_claim_is_refused_while_b_passes(
    tmp_path: Path,
    proxy_keys: Path,
    backends: Backends,
    proxy_factory: Callable[..., ProxyProcess],
) -> None:
    server = QueueServer(tmp_path / "core", proxy_keys).start()
    try:
        proxy = proxy_factory("--control", server.url)
        async with QueueClient(server.url) as core:
            a, b = await claim_after_expiry(core, "t1.orders")
        assert a["id"] == b["id"] and b["token"] > a["token"]
        await proxy_floor_reached(server, proxy, "t1.orders", b["token"])
        # A learnt nothing: its calls still carry its old token. B carries the new one.
        tags_b = make_tags("orders", b["id"], "g1", b["token"], attempt=2)
        async with WorkerClient(proxy, "worker-2", tags=tags_b) as worker_b:
            for backend in backends.all():
                backends.reset()
                # Through the SDK: the refusal cancels A's handler (CallFenced)...
                tags_a = make_tags("orders", a["id"], "g1", a["token"], attempt=1)
                async with WorkerClient(proxy, "worker-1", tags=tags_a) as worker_a:
                    with pytest.raises(CallFenced) as fenced:
                        await worker_a.call("POST", f"{backend.url}/charge", json={"order": 7})
                assert (fenced.value.action, fenced.value.code, fenced.value.status) == (
                    "stale-lease",
                    "stale_lease",
                    409,
                )
                # ...and on the wire it is a 409 whose JSON body names the floor.
                raw_tags = make_tags("orders", a["id"], "g1", a["token"], attempt=1).next_headers()
                async with WorkerClient(proxy, "worker-1") as raw_a:
                    refused = await raw_a.call(
                        "POST", f"{backend.url}/charge", json={"order": 7}, headers=raw_tags
                    )
                assert refused.status == 409, (backend.url, refused)
                assert refused.headers.get(PROXY_ACTION_HEADER) == "stale-lease"
                body = refused.json()
                assert body["code"] == "stale_lease" and f"floor {b['token']}" in body["message"]
                assert backend.accepted == 0 and backend.seen == []  # never reached the backend
                passed = await worker_b.call("POST", f"{backend.url}/charge", json={"order": 7})
                assert passed.status == 200 and PROXY_ACTION_HEADER not in passed.headers
                assert [s.path for s in backend.seen] == ["/charge"]
        records = await wait_records(
            proxy.wirelog_dir, lambda rs: sum(r["action"] == "stale-lease" for r in rs) == 4
        )
        stale = [r for r in records if r["action"] == "stale-lease"]
        assert {(r["worker"], r["lease"], r["message_id"]) for r in stale} == {
            ("worker-1", a["token"], a["id"])
        }
        assert all(r["response"]["status"] == 409 for r in stale)
    finally:
        server.stop()


async def test_unsynced_window_answers_tagged_calls_503_until_the_core_is_reachable(
    tmp_path: Path,
    proxy_keys: Path,
    backends: Backends,
    proxy_factory: Callable[..., ProxyProcess],
) -> None:
    port = free_port()  # the core is not running yet: the proxy cannot synchronise
    proxy = proxy_factory("--control", f"http://127.0.0.1:{port}")
    async with WorkerClient(proxy, "worker-1", tags=make_tags(lease=1)) as tagged:
        for backend in backends.all():
            reply = await tagged.call("GET", f"{backend.url}/work")
            assert reply.status == 503 and reply.headers.get(PROXY_ACTION_HEADER) == "unsynced"
            assert reply.json()["code"] == "unsynced"
            assert backend.accepted == 0
    async with WorkerClient(proxy, "worker-1") as untagged:  # untagged calls are not fenced by it
        reply = await untagged.call("GET", f"{backends.http.url}/plain")
        assert reply.status == 200
    server = QueueServer(tmp_path / "core", proxy_keys, port=port).start()
    try:
        await wait_proxy_saw(proxy.admin_url, None, within=20)
        backends.reset()
        async with WorkerClient(proxy, "worker-1", tags=make_tags(lease=1)) as tagged:
            for backend in backends.all():
                reply = await tagged.call("GET", f"{backend.url}/work")
                assert reply.status == 200, reply
                assert len(backend.seen) == 1
        # The core restarts: unsynced (503) while it is away, synchronised again once it is back.
        server.stop()
        await until_proxy_unsynced(proxy.admin_url)
        async with WorkerClient(proxy, "worker-1", tags=make_tags(lease=1)) as tagged:
            assert (await tagged.call("GET", f"{backends.http.url}/work")).status == 503
        server.start()
        await wait_proxy_saw(proxy.admin_url, None, within=20)
        async with WorkerClient(proxy, "worker-1", tags=make_tags(lease=1)) as tagged:
            assert (await tagged.call("GET", f"{backends.http.url}/work")).status == 200
    finally:
        server.stop()


async def until_proxy_unsynced(admin_url: str, within: float = 10.0) -> None:
    async def unsynced() -> bool:
        return not (await proxy_control(admin_url))["synced"]

    await until(unsynced, within, what="the proxy to notice the core was gone")
