"""Probes at the proxy: a fenced worker's calls for its active probe are mimicked or passed, never blocked.

The control stream's `probe` / `probe_end` events (and a snapshot's `probes`) feed `ControlState`; the
fence addon consults it for a fenced worker's tagged calls (docs/control-stream.md, docs/failure-
management.md §3) and the mimic addon after it answers a mimic probe. Unit tests drive the two addons with
mitmproxy test flows, as tests/test_proxy_fence.py and tests/test_proxy_mimic.py do.
"""

from __future__ import annotations

import orjson
import pytest
from test_proxy_fence import call_flow, fenced, run_request
from test_proxy_mimic import answer_of, guards, index_of, recorded

from fencing.context import METADATA_KEY, PROXY_ACTION_HEADER
from fencing.control_client import ControlClient, ControlState, ControlStreamError


def probing(state: ControlState, worker: str, message_id: str, mode: str) -> None:
    state.set_probe({"worker": worker, "message_id": message_id, "mode": mode})


async def test_a_pass_probe_lets_only_the_probes_calls_of_a_block_fenced_worker_through() -> None:
    addons = guards()
    state = addons[0].state
    fenced(state, "worker-1", "block")
    probing(state, "worker-1", "probe-3-1", "pass")
    probe_call = call_flow(message_id="probe-3-1")
    await run_request(addons, probe_call)
    assert probe_call.response is None  # on its way to the backend
    assert probe_call.metadata[METADATA_KEY].action == "pass"
    for other in (
        call_flow(message_id="m-1"),  # a real message's call: still blocked
        call_flow(message_id=None, call=None),  # untagged: blocked
        call_flow("worker-2", message_id="probe-3-1"),  # another worker naming the probe
    ):
        if other.metadata[METADATA_KEY].worker == "worker-2":
            fenced(state, "worker-2", "block")
        await run_request(addons, other)
        assert other.response is not None and other.response.status_code == 403
        assert other.response.headers[PROXY_ACTION_HEADER] == "block"


async def test_a_mimic_probe_is_answered_from_recordings_even_under_a_block_fence() -> None:
    fence, mimic = addons = guards()
    state = fence.state
    mimic.index = index_of(recorded("r1", 1.0, 200, "charged"))
    fenced(state, "worker-1", "block")
    probing(state, "worker-1", "probe-3-2", "mimic")
    flow = call_flow(message_id="probe-3-2")
    await run_request(addons, flow)
    assert flow.response is not None and flow.response.headers[PROXY_ACTION_HEADER] == "mimic"
    assert answer_of(flow) == "charged" and flow.metadata[METADATA_KEY].replayed_from == "r1"
    # After probe_end the same call is blocked again.
    state.end_probe({"worker": "worker-1", "message_id": "probe-3-2", "mode": "mimic"})
    again = call_flow(message_id="probe-3-2")
    await run_request(addons, again)
    assert again.response is not None and again.response.status_code == 403


async def test_a_probe_of_a_worker_that_is_not_fenced_changes_nothing() -> None:
    addons = guards()
    probing(addons[0].state, "worker-1", "probe-3-3", "mimic")
    flow = call_flow(message_id="probe-3-3")
    await run_request(addons, flow)
    assert flow.response is None  # not fenced: the probe exercises the real backend


def test_the_stream_events_and_the_snapshot_keep_the_probes() -> None:
    client = ControlClient("http://127.0.0.1:1/admin/v1/control", "key")
    state = client.state
    probe = {"worker": "worker-1", "message_id": "probe-1-1", "mode": "pass"}
    client._dispatch("probe", "1-1", orjson.dumps(probe))
    assert state.probe_mode("worker-1", "probe-1-1") == "pass"
    assert state.probe_mode("worker-2", "probe-1-1") is None
    assert state.probe_mode("worker-1", None) is None
    client._dispatch("probe_end", "1-2", orjson.dumps(probe))
    assert state.probes == {}
    snapshot = {"instance": 1, "fences": [], "floors": [], "probes": [{**probe, "mode": "mimic"}]}
    client._dispatch("snapshot", "1-2", orjson.dumps(snapshot))
    assert state.probe_mode("worker-1", "probe-1-1") == "mimic"
    client._dispatch("snapshot", "2-1", orjson.dumps({"instance": 2, "fences": [], "floors": []}))
    assert state.probes == {}  # a new core process: its snapshot has none


@pytest.mark.parametrize(
    "data",
    [
        {"worker": "worker-1", "message_id": "probe-1", "mode": "block"},
        {"worker": "worker-1", "mode": "pass"},
        ["not", "an", "object"],
    ],
)
def test_a_bad_probe_event_drops_the_connection(data: object) -> None:
    client = ControlClient("http://127.0.0.1:1/admin/v1/control", "key")
    with pytest.raises(ControlStreamError):
        client._dispatch("probe", "1-1", orjson.dumps(data))
