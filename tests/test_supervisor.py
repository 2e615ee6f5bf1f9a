"""The supervisor in the pure core (queue_core.machine.supervisor): the worker lifecycle's transition
table swept over every (state, input) pair, one-step decisions on a fake clock, probe routing without
looking at ids, and the durable part (fences, suspensions, blacklists in the store) across restarts of a
real `strictq queue-server` process, including the migration of legacy JSON files."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import ServerProcess, start_server
from control_stream_support import admin_call, server_keys
from store_support import (
    STORE_FILE,
    stored_blacklists,
    stored_fences,
    stored_participants,
    stored_suspensions,
)

from queue_core.client import QueueClient
from queue_core.machine import QueueCore, SendRequest
from queue_core.machine.capabilities import PLAIN, SDK
from queue_core.machine.effects import AttemptRecorded, ClaimsChanged, SuspensionSaved
from queue_core.machine.health import (
    TRANSITIONS,
    WORKER_INPUTS,
    WORKER_STATES,
    HealthMonitor,
    HealthSettings,
    IllegalTransition,
    next_state,
)
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.supervisor import (
    FenceRequested,
    ProbeDelivered,
    ProbeIssued,
    QueueSuspended,
    Supervisor,
)

Q = "t1.jobs"
T0 = 1_000_000.0
SETTINGS = HealthSettings(window=60, worker_failures=2, probe_interval=1, probe_backoff_max=2)


# -------------------------------------------------------------------------------- the lifecycle table
def test_every_state_input_pair_is_either_a_transition_or_raises() -> None:
    """As h11 tests its state machine: the whole product, not just the happy paths."""
    taken = 0
    for state in WORKER_STATES:
        for event in WORKER_INPUTS:
            target = TRANSITIONS.get((state, event))
            if target is None:
                with pytest.raises(IllegalTransition, match=state):
                    next_state(state, event)
            else:
                assert next_state(state, event) == target
                taken += 1
    assert taken == len(TRANSITIONS)
    assert {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values()) == set(WORKER_STATES)  # all reachable
    assert {e for _, e in TRANSITIONS} == set(WORKER_INPUTS)  # no input is dead


def test_the_monitor_moves_workers_only_through_the_table() -> None:
    """A fenced worker's probe failing past the limit blacklists it; lifting the blacklist is legal only
    from `blacklisted` (the monitor refuses it otherwise, never reaching an illegal transition)."""
    settings = HealthSettings(worker_failures=1, probe_interval=1, probe_failures_to_blacklist=1)
    monitor = HealthMonitor(settings)
    monitor.attempt(AttemptRecorded(Q, "g", "m", "w1", 1, "failed", "bug", "sig", T0))
    assert monitor.worker_state("w1") == "fenced"
    assert not monitor.lift_blacklist("w1", "op", T0)  # not blacklisted: no transition tried
    monitor.handle_timer(T0 + 1)
    assert monitor.worker_state("w1") == "probing"
    (probe_id,) = monitor.probes
    assert monitor.poll(Q, "w1", T0 + 1).probe is not None
    assert monitor.probe_result("w1", probe_id, False, "still broken", T0 + 1.1)
    assert monitor.worker_state("w1") == "blacklisted"
    assert monitor.lift_blacklist("w1", "op", T0 + 2)
    assert monitor.worker_state("w1") == "fenced"


# ------------------------------------------------------------------------------ one step, fake clock
def supervised() -> Supervisor:
    core = QueueCore(opt_in=True)
    core.create_queue(Q, T0, attributes={"retry_backoff": 0.0, "visibility_timeout": 5.0})
    core.drain_effects()
    return Supervisor(core, HealthMonitor(SETTINGS, probe_prefix="1-"))


def send(s: Supervisor, *groups: str, now: float = T0, **fields: Any) -> None:
    s.core.send(Q, [SendRequest(body=b"{}", group=g, **fields) for g in groups], now=now)
    s.drain_effects(now)


def test_a_fence_frees_the_workers_claims_and_retries_in_the_same_step() -> None:
    s = supervised()
    send(s, "g1", "g2", "g3")
    polled = s.poll(Q, 10, None, "w1", SDK, T0)
    assert len(polled.deliveries) == 3
    s.drain_effects(T0)
    failed = [AttemptResult(d.message_id, d.token, "failed", "bug", "sig") for d in polled.deliveries[:2]]
    s.report(Q, "w1", failed, T0 + 0.1)
    effects = s.drain_effects(T0 + 0.1)
    fence = [e for e in effects if isinstance(e, FenceRequested)]
    assert [(e.worker, e.decision.event) for e in fence] == [("w1", "fence")]
    # In the same drain: the third claim is released (no attempt counted) ...
    after = effects.index(fence[0])
    assert any(isinstance(e, ClaimsChanged) for e in effects[after:])
    assert s.core.queue(Q).in_flight == 0
    assert [e for e in effects if isinstance(e, AttemptRecorded)] and all(
        e.message_id != polled.deliveries[2].message_id for e in effects if isinstance(e, AttemptRecorded)
    )
    # ... and the failed groups' same-worker retries are anyone's: w2 gets all three, in order.
    got = s.poll(Q, 10, None, "w2", SDK, T0 + 0.2).deliveries
    assert sorted(d.group for d in got) == ["g1", "g2", "g3"]
    # w1 itself gets a probe (after probe_interval), never a message.
    s.drain_effects(T0 + 0.2)
    s.handle_timer(T0 + 1.2)
    issued = [e for e in s.drain_effects(T0 + 1.2) if isinstance(e, ProbeIssued)]
    assert [e.probe.worker for e in issued] == ["w1"]
    polled = s.poll(Q, 10, None, "w1", SDK, T0 + 1.3)
    assert polled.probe is not None and not polled.deliveries
    assert any(isinstance(e, ProbeDelivered) for e in s.drain_effects(T0 + 1.3))
    # A plain poll of the same id is not held by the health fence (only the proxy acts on it).
    send(s, "g4", now=T0 + 1.4)
    assert [d.group for d in s.poll(Q, 10, None, "w1", PLAIN, T0 + 1.5).deliveries] == ["g4"]


def test_plain_lapses_are_redeliveries_participant_lapses_are_attempts() -> None:
    s = supervised()
    send(s, "g1")
    (first,) = s.poll(Q, 10, None, "plain", PLAIN, T0).deliveries
    s.handle_timer(T0 + 6)
    assert not [e for e in s.drain_effects(T0 + 6) if isinstance(e, AttemptRecorded)]
    message = s.core.queue(Q).by_id[first.message_id]
    assert message.history is None and message.receive_count == 1  # SQS: the receive still counts
    (again,) = s.poll(Q, 10, None, "sdk", SDK, T0 + 6).deliveries
    assert again.message_id == first.message_id
    s.handle_timer(T0 + 12)
    recorded = [e for e in s.drain_effects(T0 + 12) if isinstance(e, AttemptRecorded)]
    assert [(e.worker, e.outcome) for e in recorded] == [("sdk", "expired")]
    assert s.monitor is not None and s.monitor.status(T0 + 12)["workers"][0]["worker"] == "sdk"


def test_probe_results_are_routed_by_the_probe_table_not_by_the_id() -> None:
    """A real message whose id looks like a probe's goes to the core; a probe's result to the monitor;
    a probe id of someone else's (or one no longer out) is `gone`."""
    s = supervised()
    send(s, "g1", message_id="probe-1-1")  # the id the monitor's first probe will have
    (real,) = s.poll(Q, 10, None, "w1", SDK, T0).deliveries
    assert real.message_id == "probe-1-1"
    outcome = s.report(Q, "w1", [AttemptResult(real.message_id, real.token, "succeeded")], T0 + 0.1)
    assert [o.status for o in outcome] == ["ok"]
    assert real.message_id not in s.core.queue(Q).by_id  # the core deleted it: it was a real message
    s.drain_effects(T0 + 0.1)
    s.suspend(Q, "maintenance", T0 + 0.2, manual=False)  # an automatic suspension: probed
    effects = s.drain_effects(T0 + 0.2)
    assert any(isinstance(e, SuspensionSaved) and e.state for e in effects)
    assert any(isinstance(e, QueueSuspended) and not e.manual for e in effects)
    s.handle_timer(T0 + 1.2)
    s.drain_effects(T0 + 1.2)
    probe = s.poll(Q, 10, None, "w2", SDK, T0 + 1.3).probe
    assert probe is not None
    assert s.poll(Q, 10, None, "w3", PLAIN, T0 + 1.3).held  # a suspension holds everyone
    gone = s.report(Q, "w3", [AttemptResult(probe.id, 1, "succeeded")], T0 + 1.4)
    assert [o.status for o in gone] == ["gone"]  # not w3's probe
    taken = s.report(Q, "w2", [AttemptResult(probe.id, 1, "succeeded")], T0 + 1.5)
    assert [o.status for o in taken] == ["ok"]
    assert s.monitor is not None and not s.monitor.suspended(Q)


# ------------------------------------------------------------------------------ restarts, a real process
HEALTH_FLAGS = (
    *("--fence-after", "1", "--probe-interval", "0.1"),
    *("--blacklist-after", "1", "--blacklist-for", "600"),
)


async def _admin(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    key = _operator_key(server.data_dir)
    status, answer = await admin_call(server.url, method, path, key, body)
    assert status == 200, (method, path, status, answer)
    return answer


def _operator_key(data_dir: Path) -> str:
    keys = server_keys(data_dir)
    admin = next(c for c in keys.credentials if c.role in ("operator", "admin"))
    return admin.secret


async def _blacklist_w1(client: QueueClient) -> None:
    """w1 takes part, fails once (fenced), then fails its probe (blacklisted)."""
    await client.send("jobs", [{"body": "m", "group": "g"}], create=True)
    (item,) = await client.receive("jobs", worker="w1", ttl=30, capabilities=["results", "probes"])
    await client.request(
        "POST",
        "/v1/queues/jobs/results",
        {"worker": "w1", "results": [{"id": item["id"], "token": item["token"], "outcome": "failed"}]},
    )
    deadline = time.monotonic() + 15
    while True:
        got = await client.receive("jobs", worker="w1", wait=0.5, capabilities=["results", "probes"])
        assert all(m.get("probe") for m in got)
        if got:
            break
        assert time.monotonic() < deadline, "no probe"
    (probe,) = got
    answer = await client.request(
        "POST",
        "/v1/queues/jobs/results",
        {"worker": "w1", "results": [{"id": probe["id"], "token": probe["token"], "outcome": "failed"}]},
    )
    assert answer["results"][0]["status"] == "ok"


async def test_fences_suspensions_and_blacklists_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = await asyncio.to_thread(start_server, data, *HEALTH_FLAGS)
    try:
        async with QueueClient(server.url) as client:
            await _blacklist_w1(client)
            await client.send("other", [{"body": "x", "group": "g"}], create=True)
        await _admin(server, "POST", "/admin/v1/queues/other/suspend", {"reason": "maintenance"})
        status = await _admin(server, "GET", "/admin/v1/status")
        (w1,) = [w for w in status["workers"] if w["worker"] == "w1"]
        assert w1["state"] == "blacklisted"
    finally:
        assert await asyncio.to_thread(server.terminate) == 0
    store = data / STORE_FILE
    assert [f["worker"] for f in stored_fences(store)] == ["w1"]
    assert set(stored_blacklists(store)) == {"w1"}
    assert stored_suspensions(store)["other"]["manual"] is True
    assert stored_participants(store) == ["w1"]
    assert not (data / "fences.json").exists() and not (data / "suspended.json").exists()

    server = await asyncio.to_thread(start_server, data, *HEALTH_FLAGS)
    try:
        status = await _admin(server, "GET", "/admin/v1/status")
        (w1,) = [w for w in status["workers"] if w["worker"] == "w1"]
        assert w1["state"] == "blacklisted" and w1["blacklisted_until"]
        (other,) = [q for q in status["queues"] if q["queue"] == "other"]
        assert other["suspended"] and other["manual"]
        assert [f["worker"] for f in (await _admin(server, "GET", "/admin/v1/fences"))["fences"]] == ["w1"]
        async with QueueClient(server.url) as client:
            assert await client.receive("other", worker="w2", capabilities=["results"]) == []
            assert await client.receive("jobs", worker="w1", capabilities=["results", "probes"]) == []
        # Lifting the blacklist is durable too: the row goes, the worker is fenced and probed again.
        status_code, _ = await admin_call(server.url, "DELETE", "/admin/v1/blacklist/w1", _operator_key(data))
        assert status_code == 200
        await _admin(server, "POST", "/admin/v1/queues/other/resume", {"reason": "done"})
        assert stored_blacklists(store) == {} and stored_suspensions(store) == {}
    finally:
        assert await asyncio.to_thread(server.terminate) == 0


async def test_legacy_json_files_are_migrated_once(tmp_path: Path) -> None:
    """fences.json and suspended.json of an earlier version: read at start, written to the store, renamed
    `*.migrated`; a second start reads the store only."""
    data = tmp_path / "data"
    server = await asyncio.to_thread(start_server, data)  # creates the store and the keys
    try:
        async with QueueClient(server.url) as client:
            await client.send("legacy", [{"body": "x", "group": "g"}], create=True)
    finally:
        assert await asyncio.to_thread(server.terminate) == 0
    fence = {"worker": "w9", "mode": "mimic", "reason": "operator: old", "since": T0, "expires": None}
    (data / "fences.json").write_bytes(orjson.dumps({"version": 1, "fences": [fence]}))
    (data / "suspended.json").write_bytes(
        orjson.dumps({"version": 1, "queues": {"legacy": {"reason": "old", "manual": True}}})
    )
    for path in (data / "fences.json", data / "suspended.json"):
        path.chmod(0o600)
    for _ in range(2):
        server = await asyncio.to_thread(start_server, data)
        try:
            assert (await _admin(server, "GET", "/admin/v1/fences"))["fences"] == [fence]
            status = await _admin(server, "GET", "/admin/v1/status")
            (legacy,) = [q for q in status["queues"] if q["queue"] == "legacy"]
            assert legacy["suspended"] and legacy["reason"] == "old"
        finally:
            assert await asyncio.to_thread(server.terminate) == 0
        assert not (data / "fences.json").exists() and (data / "fences.json.migrated").exists()
        assert not (data / "suspended.json").exists() and (data / "suspended.json.migrated").exists()
        assert stored_fences(data / STORE_FILE) == [fence]
        assert set(stored_suspensions(data / STORE_FILE)) == {"legacy"}
