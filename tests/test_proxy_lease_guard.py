"""The lease guard (`fencing.addons.lease_guard`): a call tagged below its group's floor is refused 409
`stale-lease`, tagged calls while the control stream is not synchronised get 503 `unsynced`, and in both
cases nothing reaches the backend.

Unit tests drive the addon with mitmproxy's test flows; the end-to-end test runs the issue's scenario
against a real queue server, a real `strictq proxy` following its control stream, and real backends.
"""

from __future__ import annotations

import orjson
from mitmproxy.test import tflow

from fencing.addons.lease_guard import LeaseGuard
from fencing.context import METADATA_KEY, PROXY_ACTION_HEADER, CallContext
from fencing.control_client import ControlState


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
    assert body["code"] == "stale-lease" and body["action"] == "stale-lease"
    assert "floor 10" in body["message"] and "lease 9" in body["message"]
    ctx = flow.metadata[METADATA_KEY]
    assert (ctx.action, ctx.code) == ("stale-lease", "stale-lease")
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
