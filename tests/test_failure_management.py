"""Failure management end to end in one process: the gateway with the core, the health monitor's shell and
the control stream, driven with plain EmoDB calls (no SDK) and followed by a real control-stream client.

A worker failing past the threshold is fenced (control stream), gets no messages, and its groups go to
another worker in order; a passing probe lifts the fence; failed probes blacklist it; failures shared by
several workers fence nobody and suspend the queue until a probe passes; alerts, operator commands, the
admin API, tenancy, the wire log and `strictq status` / `suspend` / `resume` over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import start_server
from health_support import QUEUE, SETTINGS, TIMEOUT, Health, until
from kit.secret import internal_secret

from fencing.control_client import ControlClient
from queue_core.control import ControlHub
from queue_core.failures import FailureManager
from queue_core.machine import SendRequest
from queue_core.machine.capabilities import SDK
from queue_core.machine.inputs import AttemptResult
from queue_core.remote import RemoteQueueService
from queue_core.service import QueueService
from wirelog.reader import RecordFilter, read_records
from wirelog.record import event_record
from wirelog.writer import WireLogWriter

BACKEND_DOWN = "POST billing/charge 5xx"


def ids(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": item["id"], "token": item["token"]}


async def send_groups(h: Health, groups: dict[str, list[str]]) -> None:
    for group, names in groups.items():
        for name in names:
            await h.send(group, {"name": name})


async def fence_worker_1(h: Health) -> list[dict[str, Any]]:
    """worker-1 takes three groups' heads and fails each for a reason of its own: fenced."""
    await send_groups(h, {"g1": ["a1", "a2"], "g2": ["b1", "b2"], "g3": ["c1"]})
    items = await h.poll("worker-1")
    assert [i["payload"]["name"] for i in items] == ["a1", "a2", "b1", "b2", "c1"]
    heads = [i for i in items if i["payload"]["name"] in ("a1", "b1", "c1")]
    for item in heads:
        rest = [i for i in items if i["group"] == item["group"] and i is not item]
        results = [
            {"id": item["id"], "token": item["token"], "outcome": "failed", "reason": "NullPointerException"}
        ]
        results += [{"id": r["id"], "token": r["token"], "outcome": "not_attempted"} for r in rest]
        await h.report("worker-1", results)
    await until(lambda: "worker-1" in h.control.fences, what="the fence on the control stream")
    return items


# ------------------------------------------------------------------------------------------- fencing
async def test_a_failing_worker_is_fenced_and_its_groups_finish_elsewhere_in_order(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    fence = h.control.fences["worker-1"]
    assert fence.mode == "block" and fence.reason.startswith("health: 3 failed attempts in 60s")
    # Its polls hand it no message any more (at most a probe).
    for _ in range(3):
        assert all(i.get("probe") for i in await h.poll("worker-1"))
    # Another worker gets every group, each in order, at once (no wait for the same-worker retries).
    got = await h.poll("worker-2")
    by_group: dict[str, list[str]] = {}
    for item in got:
        by_group.setdefault(item["group"], []).append(item["payload"]["name"])
    assert by_group == {"g1": ["a1", "a2"], "g2": ["b1", "b2"], "g3": ["c1"]}
    for item in got:
        await h.succeed("worker-2", item)
    status = await h.status()
    (w1,) = [w for w in status["workers"] if w["worker"] == "worker-1"]
    assert w1["state"] in ("fenced", "probing") and w1["failures"] == 3 and w1["queue"] == QUEUE
    assert w1["fence"]["reason"].startswith("health: ")
    assert [e["event"] for e in status["events"]][:1] == ["fence"]


async def test_a_fenced_workers_claims_are_released_to_the_others(health: Health) -> None:
    h = health
    await send_groups(h, {"slow": ["s1", "s2"]})
    (held, held2) = await h.poll("worker-1", limit=2)
    await send_groups(h, {"g1": ["a1"], "g2": ["b1"], "g3": ["c1"]})
    for item in await h.poll("worker-1"):
        await h.fail("worker-1", item, "bug")
    await until(lambda: "worker-1" in h.control.fences, what="the fence")
    # The group it still held goes to worker-2 right away, in order, under a newer token.
    await until(lambda: h.service.core.queue(f"t1.{QUEUE}").groups["slow"].claimed == [], what="the release")
    got = await h.poll("worker-2")
    slow = [i for i in got if i["group"] == "slow"]
    assert [i["payload"]["name"] for i in slow] == ["s1", "s2"]
    assert slow[0]["token"] > held["token"]
    stale = await h.report("worker-1", [{"id": held["id"], "token": held["token"], "outcome": "succeeded"}])
    assert stale[0]["status"] != "ok"  # the fenced worker's old claim is gone
    del held2


async def test_the_failure_that_fences_a_worker_reserves_no_retry_for_it(health: Health) -> None:
    """The report that crosses the threshold fences the worker in the same step: its failed message is
    not held for a same-worker retry the fenced worker will never take (it goes to the others at once)."""
    h = health
    await send_groups(h, {"g1": ["a1"], "g2": ["b1"], "g3": ["c1"]})
    items = await h.poll("worker-1")
    for item in items:
        await h.fail("worker-1", item, "bug")
    # No waiting for the fence's slower steps (disk, control stream, release of claims): already free.
    assert "worker-1" not in h.service.core.queue(f"t1.{QUEUE}").reserved
    got = await h.poll("worker-2")
    assert sorted(i["payload"]["name"] for i in got) == ["a1", "b1", "c1"]


async def test_a_passing_probe_lifts_the_fence(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    probe = await h.probe("worker-1")
    assert probe["id"].startswith("probe-") and probe["payload"] == {"probe": True}
    # The proxy learns it may serve this worker's calls for the probe (mimicry: not probe_safe).
    await until(lambda: h.control.probe_mode("worker-1", probe["id"]) == "mimic", what="the probe event")
    (outcome,) = await h.report(
        "worker-1", [{"id": probe["id"], "token": probe["token"], "outcome": "succeeded"}]
    )
    assert outcome["status"] == "ok"
    await until(lambda: "worker-1" not in h.control.fences, what="the unfence")
    await until(lambda: not h.control.probes, what="probe_end")
    await h.send("g9", {"name": "after"})
    items = await h.poll("worker-1")
    assert any(i["payload"] == {"name": "after"} for i in items) and not any(i.get("probe") for i in items)
    names = h.event_names()
    assert names.index("fence") < names.index("probe") < names.index("probe-passed") < names.index("unfence")
    kinds = [kind for kind, _ in h.stream_events]
    assert kinds.index("fence") < kinds.index("probe") < kinds.index("probe_end") < kinds.index("unfence")


async def test_probe_payload_and_probe_safe_come_from_the_queue(health: Health) -> None:
    h = health
    await h.service.set_attributes(f"t1.{QUEUE}", {"probe_payload": {"order": "dummy-1"}, "probe_safe": True})
    await fence_worker_1(h)
    probe = await h.probe("worker-1")
    assert probe["payload"] == {"order": "dummy-1"}
    await until(lambda: h.control.probe_mode("worker-1", probe["id"]) == "pass", what="a pass probe")


async def test_failed_probes_blacklist_the_worker_until_lifted(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    for _ in range(SETTINGS.probe_failures_to_blacklist):
        probe = await h.probe("worker-1")
        await h.fail("worker-1", probe, "still broken")
    await until(lambda: "blacklist" in h.event_names(), what="the blacklist")
    status = await h.status()
    (w1,) = [w for w in status["workers"] if w["worker"] == "worker-1"]
    assert w1["state"] == "blacklisted" and "2 probes failed in a row" in w1["reason"]
    assert w1["blacklisted_until"] == pytest.approx(h.service.clock() + SETTINGS.blacklist_for, abs=5)
    (blacklist,) = [e for e in await h.events() if e["event"] == "blacklist"]
    assert blacklist["expires"] == w1["blacklisted_until"]
    await until(
        lambda: h.control.fences["worker-1"].reason.startswith("health: blacklisted until"), what="refence"
    )
    assert await h.poll("worker-1", wait=0.3) == []  # blacklisted: not even probes
    assert await h.ok("DELETE", "/admin/v1/blacklist/worker-1", "admin-1") == {
        "worker": "worker-1",
        "lifted": True,
    }
    status, body = await h.call("DELETE", "/admin/v1/blacklist/worker-1", "admin-1")
    assert (status, body["error"]["code"]) == (404, "not_blacklisted")
    probe = await h.probe("worker-1")  # probed again; a pass restores it
    await h.succeed("worker-1", probe)
    await until(lambda: "worker-1" not in h.control.fences, what="the unfence")


async def test_an_operator_unfence_restores_the_worker(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    assert await h.ok("DELETE", "/admin/v1/fences/worker-1", "admin-1") == {
        "worker": "worker-1",
        "unfenced": True,
    }
    await until(lambda: "unfence" in h.event_names(), what="the monitor to hear it")
    await h.send("g9", {"name": "after"})
    assert any(i["payload"] == {"name": "after"} for i in await h.poll("worker-1"))


async def test_an_operator_fence_is_left_alone(health: Health) -> None:
    """`strictq fence` isolates a worker at the proxy only (mimicry testing needs it to get messages)."""
    h = health
    body = {"mode": "mimic", "reason": "testing v2"}
    await h.ok("PUT", "/admin/v1/fences/worker-3", "admin-1", body)
    await h.send("g1", {"name": "a1"})
    assert [i["payload"]["name"] for i in await h.poll("worker-3")] == ["a1"]
    status = await h.status()
    assert [f["worker"] for f in status["operator_fences"]] == ["worker-3"]


# --------------------------------------------------------------------------------------- large-scale
async def test_shared_failures_fence_nobody_and_suspend_the_queue_until_a_probe_passes(
    health: Health,
) -> None:
    h = health
    for worker in ("worker-1", "worker-2", "worker-3"):
        assert await h.poll(worker) == []  # they poll: the queue's recent workers
    await send_groups(h, {f"g{i}": [f"m{i}-1", f"m{i}-2"] for i in range(1, 7)})
    for worker in ("worker-1", "worker-2"):
        first, second = await h.poll(worker, limit=2)  # one group's two messages
        results = [
            {**ids(first), "outcome": "failed", "reason": "502 Bad Gateway", "signature": BACKEND_DOWN},
            {**ids(second), "outcome": "not_attempted"},
        ]
        assert [r["status"] for r in await h.report(worker, results)] == ["ok", "ok"]
    await until(lambda: "shared-failure" in h.event_names(), what="the shared failure")
    # Every recent worker is checked with a probe; two of three fail: a large-scale event.
    probes = {w: await h.probe(w) for w in ("worker-1", "worker-2", "worker-3")}
    await h.fail("worker-1", probes["worker-1"], "502 Bad Gateway", BACKEND_DOWN)
    await h.fail("worker-2", probes["worker-2"], "502 Bad Gateway", BACKEND_DOWN)
    await until(lambda: "suspend" in h.event_names(), what="the suspension")
    await h.fail("worker-3", probes["worker-3"], "502 Bad Gateway", BACKEND_DOWN)
    status = await h.status()
    (jobs,) = [q for q in status["queues"] if q["queue"] == QUEUE]
    assert jobs["suspended"] and not jobs["manual"] and "large-scale event" in jobs["reason"]
    # Suspended: nobody gets messages; probes go on, the first that fails keeps it suspended.
    probe = await h.probe("worker-3")
    await h.fail("worker-3", probe, "502 Bad Gateway", BACKEND_DOWN)
    # The backend is back: the next probe passes and the queue resumes by itself.
    probe = await h.probe("worker-2")
    await h.succeed("worker-2", probe)
    await until(lambda: "resume" in h.event_names(), what="the resume")
    # Every group can be had again, in order, nothing lost (a failed group's retry is first offered to
    # the worker that failed it).
    got = [item for worker in ("worker-3", "worker-1", "worker-2") for item in await h.poll(worker)]
    names = [i["payload"]["name"] for i in got]
    for i in range(1, 7):
        assert [n for n in names if n.startswith(f"m{i}-")] == [f"m{i}-1", f"m{i}-2"]
    assert h.control.fences == {} and "fence" not in h.event_names()


async def test_an_alert_in_the_wire_log_suspends_the_queue(health: Health) -> None:
    h = health
    await send_groups(h, {"g1": ["a1", "a2"]})
    (item, _) = await h.poll("worker-1")
    await h.fail("worker-1", item, "503 from billing", "http POST billing.example/charge 5xx")
    record = event_record(event="alert", reason="payments-5xx: 12 failures")
    record["alert"] = {
        "rule": "payments-5xx",
        "signature": "http POST billing.example/* 5xx",
        "signatures": [],
    }
    with WireLogWriter(h.wirelog, "spark-alerts", fsync="always") as writer:
        writer.write(record)
    await until(lambda: h.manager.monitor.suspended(f"t1.{QUEUE}"), what="the alert to suspend the queue")
    (suspend,) = [e for e in await h.events() if e["event"] == "suspend"]
    assert suspend["reason"] == "alert: payments-5xx: 12 failures" and suspend["queue"] == QUEUE
    assert all(i.get("probe") for i in await h.poll("worker-2"))


async def test_alerts_and_operator_suspension_through_the_api(health: Health) -> None:
    h = health
    answer = await h.ok("POST", "/admin/v1/alerts", "admin-1", {"reason": "db down", "queue": QUEUE})
    assert answer == {"suspended": [QUEUE]}
    await h.ok("POST", f"/admin/v1/queues/{QUEUE}/suspend", "admin-1", {"reason": "maintenance"})
    await h.send("g1", {"name": "kept"})
    assert await h.poll("worker-1", wait=0.3) == []  # an operator's suspension: no probes either
    assert await h.ok("POST", f"/admin/v1/queues/{QUEUE}/resume", "admin-1", {}) == {
        "queue": QUEUE,
        "resumed": True,
    }
    assert [i["payload"]["name"] for i in await h.poll("worker-1")] == ["kept"]
    status, body = await h.call("POST", f"/admin/v1/queues/{QUEUE}/resume", "admin-1", {})
    assert (status, body["error"]["code"]) == (404, "not_suspended")
    for path, data, code in [
        (f"/admin/v1/queues/{QUEUE}/suspend", {}, "bad_reason"),
        ("/admin/v1/queues/nope/suspend", {"reason": "x"}, "queue_not_found"),
        ("/admin/v1/alerts", {"reason": "x"}, "bad_alert"),
        ("/admin/v1/alerts", {"reason": "x", "signatures": [1]}, "bad_signatures"),
    ]:
        status, body = await h.call("POST", path, "admin-1", data)
        assert status in (400, 404) and body["error"]["code"] == code, (path, status, body)


# ------------------------------------------------------------------------------------ API and events
async def test_events_since_tenancy_and_roles(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    events = await h.events()
    assert events[0]["event"] == "fence" and events[0]["worker"] == "worker-1" and events[0]["queue"] == QUEUE
    last = events[-1]["n"]
    await h.ok("POST", f"/admin/v1/queues/{QUEUE}/suspend", "admin-1", {"reason": "maintenance"})
    newer = await h.events(since=last)
    assert [e["event"] for e in newer] == ["suspend"] and newer[0]["reason"] == "operator: maintenance"
    # Another tenant's admin sees none of it, and cannot touch the queue.
    assert await h.events(key_id="other-1") == []
    other = await h.status("other-1")
    assert other["workers"] == [] and other["queues"] == []
    status, _ = await h.call("POST", f"/admin/v1/queues/{QUEUE}/resume", "other-1", {})
    assert status == 404
    status, body = await h.call("POST", f"/admin/v1/queues/{QUEUE}/resume", "worker-1", {})
    assert (status, body["error"]["code"]) == (403, "forbidden")
    async with h.session.get(h.url + "/admin/v1/status") as response:
        assert response.status == 401


async def test_every_decision_is_an_event_record_in_the_wire_log(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    probe = await h.probe("worker-1")
    await h.succeed("worker-1", probe)
    await until(lambda: "unfence" in h.event_names(), what="the unfence")
    await h.manager.close()  # flushes the writer
    records = list(read_records(h.wirelog, where=RecordFilter(kind="event")))
    mine = [r for r in records if r["id"].startswith("core-")]
    assert [r["event"] for r in mine][:1] == ["fence"]
    assert {"fence", "probe", "probe-passed", "unfence"} <= {r["event"] for r in mine}
    fence = mine[0]
    assert (fence["worker"], fence["queue"], fence["tenant"], fence["mode"]) == (
        "worker-1",
        QUEUE,
        "t1",
        "block",
    )
    (passed,) = [r for r in mine if r["event"] == "probe-passed"]
    assert passed["message_id"] == probe["id"]


# ------------------------------------------------------------------------------------------------ CLI
async def strictq(h: Health, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "STRICTQ_URL": h.url,
        "STRICTQ_CA_FILE": str(h.ca_file),
        "STRICTQ_ADMIN_KEY": h.secret("admin-1"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "strictq",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_status_suspend_resume_unblacklist(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    code, out, err = await strictq(h, "suspend", QUEUE, "--reason", "backend maintenance", "--json")
    assert code == 0, err
    assert json.loads(out) == {"queue": QUEUE, "suspended": True, "reason": "backend maintenance"}
    code, out, err = await strictq(h, "status")
    assert code == 0, err
    assert "WORKERS" in out and "QUEUES" in out and "LATEST EVENTS" in out
    (row,) = [line for line in out.splitlines() if line.strip().startswith("worker-1")]
    assert any(state in row for state in ("fenced", "probing")) and "3 failed attempts" in row
    (queue_row,) = [line for line in out.splitlines() if line.strip().startswith(QUEUE)]
    assert "suspended (operator)" in queue_row and "operator: backend maintenance" in queue_row
    assert "fence" in out and "suspend" in out
    code, out, _ = await strictq(h, "status", "--json")
    assert code == 0 and json.loads(out)["queues"][0]["suspended"] is True
    code, out, err = await strictq(h, "resume", QUEUE, "--json")
    assert (code, json.loads(out)) == (0, {"queue": QUEUE, "resumed": True}), err
    code, _, err = await strictq(h, "resume", QUEUE)
    assert code == 1 and "404 not_suspended" in err
    code, _, err = await strictq(h, "unblacklist", "worker-2")
    assert code == 1 and "not_blacklisted" in err
    code, _, err = await strictq(h, "suspend", QUEUE)
    assert code == 2 and "--reason" in err


async def test_a_reconnecting_proxy_learns_active_probes_from_the_snapshot(health: Health) -> None:
    h = health
    await fence_worker_1(h)
    probe = await h.probe("worker-1")
    late = ControlClient(h.url + "/admin/v1/control", h.secret("admin-1"), ca_file=str(h.ca_file))
    late.start()
    try:
        await asyncio.wait_for(late.state.wait_synced(), TIMEOUT)
        assert late.state.probe_mode("worker-1", probe["id"]) == "mimic"
        assert "worker-1" in late.state.fences
    finally:
        await late.stop()


# ------------------------------------------------------------------------------- separate queue server
async def test_probes_travel_through_a_separate_queue_server(tmp_path: Path) -> None:
    """`strictq queue-server` holds the core and failure management; the gateway's RemoteQueueService
    gets probes (flagged) and hands their results back over the internal API."""
    server = start_server(tmp_path / "data", "--fence-after", "1", "--probe-interval", "0.1")
    remote = RemoteQueueService(server.url, secret=internal_secret())
    try:
        await remote.start()
        await remote.create_queue("t1.jobs", {"retry_backoff": 0.0})
        message = SendRequest(body=b'{"n": 1}', group="g", content_type="application/json")
        await remote.send("t1.jobs", [message])
        (item,) = await remote.receive("t1.jobs", worker="worker-1", capabilities=SDK)
        failed = AttemptResult(item.delivery.message_id, item.delivery.token, "failed", "bug")
        assert [o.status for o in await remote.report("t1.jobs", "worker-1", [failed])] == ["ok"]
        probe = None
        for _ in range(100):
            received = await remote.receive("t1.jobs", worker="worker-1", wait=0.5, capabilities=SDK)
            assert all(r.probe for r in received)
            if received:
                (probe,) = received
                break
        assert probe is not None and probe.delivery.message_id.startswith("probe-")
        assert orjson.loads(probe.body) == {"probe": True}
        passed = AttemptResult(probe.delivery.message_id, probe.delivery.token, "succeeded")
        assert [o.status for o in await remote.report("t1.jobs", "worker-1", [passed])] == ["ok"]
        # restored: the retry is its
        (again,) = await remote.receive("t1.jobs", worker="worker-1", wait=5, capabilities=SDK)
        assert again.delivery.message_id == item.delivery.message_id and not again.probe
    finally:
        await remote.close()
        assert server.terminate() == 0
    records = list(read_records(tmp_path / "data" / "wirelog", where=RecordFilter(kind="event")))
    assert [r["event"] for r in records if r["event"] in ("fence", "unfence")] == ["fence", "unfence"]


# -------------------------------------------------------------------------------------------- restart
async def test_fences_and_suspensions_outlive_a_restart(tmp_path: Path) -> None:
    """The fence is durable (in the store); a new process adopts it (reason `health: …`) and probes. A
    suspended queue stays suspended."""

    async def start() -> tuple[QueueService, ControlHub, FailureManager]:
        service = QueueService(tmp_path / "queue")
        await service.start()
        hub = ControlHub(service)
        await hub.start()
        manager = FailureManager(service, hub, SETTINGS)
        await manager.start()
        return service, hub, manager

    async def stop(service: QueueService, hub: ControlHub, manager: FailureManager) -> None:
        await manager.close()
        await hub.close()
        await service.close()

    service, hub, manager = await start()
    try:
        await service.create_queue("t1.jobs", {"retry_backoff": 0.0})
        requests = [SendRequest(body=b"{}", group=f"g{i}", content_type="application/json") for i in range(3)]
        await service.send("t1.jobs", requests)
        got = await service.receive("t1.jobs", 10, None, "worker-1", capabilities=SDK)
        results = [AttemptResult(r.delivery.message_id, r.delivery.token, "failed", "bug") for r in got]
        await service.report("t1.jobs", "worker-1", results)
        await until(lambda: hub.registry.get("worker-1") is not None, what="the fence")
        await service.create_queue("t1.other")
        manager.suspend("t1.other", "operator: maintenance")
    finally:
        await stop(service, hub, manager)
    service, hub, manager = await start()
    try:
        assert manager.monitor.blocked("worker-1")
        assert manager.monitor.suspended("t1.other")  # suspensions are durable too (in the store)
        assert await service.receive("t1.other", 10, None, "worker-2") == []
        probe = None
        for _ in range(100):
            received = await service.receive("t1.jobs", 10, None, "worker-1", wait=0.5, capabilities=SDK)
            assert all(r.probe for r in received)
            if received:
                (probe,) = received
                break
        assert probe is not None
        passed = AttemptResult(probe.delivery.message_id, probe.delivery.token, "succeeded")
        await service.report("t1.jobs", "worker-1", [passed])
        await until(lambda: hub.registry.get("worker-1") is None, what="the unfence")
        assert not manager.monitor.blocked("worker-1")
    finally:
        await stop(service, hub, manager)


# ---------------------------------------------------------------------------------------------- flags
def test_settings_flags_of_serve_and_queue_server() -> None:
    from strictq.cli import build_parser
    from strictq.health_cli import settings_from_args

    parser = build_parser()
    for command in ("serve", "queue-server"):
        args = parser.parse_args(
            [
                command,
                "--probe-interval",
                "0.2",
                "--probe-backoff-max",
                "2s",
                "--fence-after",
                "3",
                "--fence-mode",
                "mimic",
                "--health-window",
                "5m",
                "--large-scale-fraction",
                "0.25",
            ]
        )
        settings = settings_from_args(args)
        assert (settings.probe_interval, settings.probe_backoff_max, settings.window) == (0.2, 2.0, 300.0)
        assert (settings.worker_failures, settings.fence_mode, settings.large_scale_fraction) == (
            3,
            "mimic",
            0.25,
        )
        assert settings.blacklist_for == 600.0  # the contract's default where no flag is given
        assert settings_from_args(parser.parse_args([command, "--no-health"])) is None
    with pytest.raises(ValueError, match="probe_backoff_max"):
        settings_from_args(parser.parse_args(["serve", "--probe-interval", "5", "--probe-backoff-max", "1"]))
    for bad in (["--fence-after", "0"], ["--large-scale-fraction", "2"], ["--probe-interval", "soon"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])
