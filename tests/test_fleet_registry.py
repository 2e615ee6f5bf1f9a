"""The fleet's registry, control messages and rebalancing, sans-I/O (queue_core.machine.fleet, .rebalance),
driven by a fake clock: heartbeats, staleness, acknowledgements and their events, expiry, the durable rows
they ask for, and the rebalancing decisions (sleep surplus idle workers on an empty backlog, wake on a
backlog or an old message)."""

from __future__ import annotations

import pytest
from kit.clock import FakeClock

from queue_core.machine import InvalidArgument
from queue_core.machine.effects import FleetControlSaved, FleetPolicySaved
from queue_core.machine.fleet import (
    ControlAck,
    Fleet,
    FleetSettings,
    Heartbeat,
    Load,
    check_control,
    heartbeat_from_json,
)
from queue_core.machine.rebalance import RebalancePolicy

Q = "t1.jobs"


def beat(
    worker: str,
    *,
    idle: bool = False,
    in_flight: int = 0,
    acks: tuple[ControlAck, ...] = (),
    version: str = "1",
    state: str = "active",
) -> Heartbeat:
    load = Load(in_flight=in_flight, concurrency=4, polls=2, empty_polls=2 if idle else 0)
    return Heartbeat(worker, (Q,), version, load=load, state=state, interval=1.0, acks=acks)  # type: ignore[arg-type]


def test_heartbeats_register_workers_and_staleness_follows_their_interval() -> None:
    clock = FakeClock()
    fleet = Fleet(FleetSettings(stale_intervals=3))
    answer = fleet.heartbeat(beat("w1", version="1.4"), clock.now)
    assert answer.state == "active" and answer.controls == () and answer.interval == 1.0
    assert fleet.version_of("w1") == "1.4" and fleet.version_of("nobody") is None
    assert [w.worker for w in fleet.live(clock.now)] == ["w1"]
    clock.advance(2.9)
    assert fleet.targets(Q, None, clock.now) == ["w1"]
    assert fleet.targets(Q, "2.0", clock.now) == []
    clock.advance(0.2)  # 3.1 s: three intervals missed
    assert fleet.live(clock.now) == [] and fleet.targets(Q, None, clock.now) == []
    assert fleet.view(clock.now)[0]["stale"] is True


def test_a_control_is_pending_until_acknowledged_then_an_event_and_a_dropped_row() -> None:
    clock = FakeClock()
    fleet = Fleet(id_prefix="7-")
    fleet.heartbeat(beat("w1"), clock.now)
    [control] = fleet.issue("config", {"concurrency": 2}, ["w1"], clock.now)
    assert control.id == "7-1" and control.args == {"concurrency": 2}
    effects, events = fleet.drain()
    assert effects == [FleetControlSaved("7-1", control.to_row())] and events == []
    assert fleet.has_pending("w1", clock.now)
    first = fleet.heartbeat(beat("w1"), clock.advance(1))
    again = fleet.heartbeat(beat("w1"), clock.advance(1))  # delivered until acknowledged
    assert [c.id for c in first.controls] == [c.id for c in again.controls] == ["7-1"]
    ack = ControlAck("7-1", "applied", "concurrency=2")
    assert fleet.heartbeat(beat("w1", acks=(ack,)), clock.advance(1)).controls == ()
    effects, events = fleet.drain()
    assert effects == [FleetControlSaved("7-1", None)]
    assert [(e.event, e.worker, e.queue) for e in events] == [("control-applied", "w1", Q)]
    assert "concurrency=2" in events[0].reason
    # A repeated acknowledgement (the answer was lost) changes nothing.
    fleet.heartbeat(beat("w1", acks=(ack,)), clock.advance(1))
    assert fleet.drain() == ([], [])


def test_state_controls_move_the_desired_state_and_refusals_put_it_back() -> None:
    clock = FakeClock()
    fleet = Fleet()
    fleet.heartbeat(beat("w1"), clock.now)
    [sleep] = fleet.issue("sleep", {}, ["w1"], clock.now)
    assert fleet.heartbeat(beat("w1"), clock.advance(1)).state == "sleeping"
    answer = fleet.heartbeat(beat("w1", acks=(ControlAck(sleep.id, "applied"),), state="sleeping"), clock.now)
    assert answer.state == "sleeping" and fleet.workers["w1"].state == "sleeping"
    [drain] = fleet.issue("drain", {}, ["w1"], clock.now)
    refused = ControlAck(drain.id, "refused", "no")
    assert (
        fleet.heartbeat(beat("w1", acks=(refused,), state="sleeping"), clock.advance(1)).state == "sleeping"
    )
    [upgrade] = fleet.issue("upgrade", {"version": "2.0"}, ["w1"], clock.now)
    fleet.heartbeat(beat("w1", acks=(ControlAck(upgrade.id, "applied", "", "2.0"),)), clock.advance(1))
    assert fleet.version_of("w1") == "2.0"
    _, events = fleet.drain()
    assert [e.event for e in events] == ["control-applied", "control-refused", "control-applied"]


def test_unacknowledged_controls_expire_with_an_event() -> None:
    clock = FakeClock()
    fleet = Fleet()
    [control] = fleet.issue("wake", None, ["w-never-seen"], clock.now, ttl=10)
    fleet.drain()
    clock.advance(9.9)
    fleet.expire(clock.now)
    assert fleet.drain() == ([], [])
    clock.advance(0.2)
    fleet.expire(clock.now)
    effects, events = fleet.drain()
    assert effects == [FleetControlSaved(control.id, None)]
    assert [(e.event, e.worker) for e in events] == [("control-expired", "w-never-seen")]


def test_restore_keeps_pending_controls_and_policies() -> None:
    clock = FakeClock()
    fleet = Fleet(id_prefix="1-")
    [control] = fleet.issue("log_level", {"level": "debug"}, ["w1"], clock.now)
    fleet.set_policy(Q, RebalancePolicy(min_active=0))
    effects, _ = fleet.drain()
    rows = {e.control_id: e.row for e in effects if isinstance(e, FleetControlSaved) and e.row}
    policies = {e.queue: e.policy for e in effects if isinstance(e, FleetPolicySaved) and e.policy}
    restored = Fleet(id_prefix="2-")
    restored.restore(rows.values(), policies)
    answer = restored.heartbeat(beat("w1"), clock.advance(1))
    assert [(c.id, c.kind, c.args) for c in answer.controls] == [
        (control.id, "log_level", {"level": "DEBUG"})
    ]
    assert restored.policies[Q].min_active == 0
    [fresh] = restored.issue("wake", {}, ["w1"], clock.now)
    assert fresh.id == "2-1"  # ids stay unique across restarts (the epoch prefix)


@pytest.mark.parametrize(
    ("kind", "args", "field"),
    [
        ("reboot", {}, "kind"),
        ("config", {}, "args"),
        ("config", {"colour": 1}, "args.colour"),
        ("config", {"concurrency": 0}, "args.concurrency"),
        ("config", {"concurrency": 2.5}, "args.concurrency"),
        ("config", {"ttl": True}, "args.ttl"),
        ("config", {"wait": 99}, "args.wait"),
        ("log_level", {"level": "LOUD"}, "args.level"),
        ("sleep", {"now": True}, "args.now"),
        ("upgrade", {}, "args.version"),
        ("upgrade", {"version": "2", "args": []}, "args.args"),
        ("config", [], "args"),
    ],
)
def test_bad_controls_are_refused_naming_the_field(kind: str, args: object, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_control(kind, args)
    assert caught.value.details["field"] == field


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"queues": "jobs"}, "queues"),
        ({"interval": 0}, "interval"),
        ({"state": "asleep"}, "state"),
        ({"load": {"in_flight": -1}}, "load.in_flight"),
        ({"capabilities": {"gpus": 1}}, "capabilities.gpus"),
        ({"acks": [{"id": "1-1", "status": "done"}]}, "acks[0].status"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_heartbeats_are_refused_naming_the_field(body: object, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        heartbeat_from_json("w1", body, lambda name: f"t1.{name}")
    assert caught.value.details["field"] == field


def test_rebalancing_sleeps_surplus_idle_workers_and_wakes_them_on_backlog() -> None:
    clock = FakeClock()
    fleet = Fleet()
    fleet.set_policy(Q, RebalancePolicy(min_active=1, idle_heartbeats=2, wake_backlog=3, wake_age=30))
    fleet.drain()
    for worker in ("w1", "w2", "w3"):
        fleet.heartbeat(beat(worker, idle=True), clock.now)
    fleet.heartbeat(beat("w2", in_flight=1), clock.advance(0.5))  # busy: it is not idle
    assert fleet.rebalance(Q, backlog=0, oldest_age=0, now=clock.now) == []  # one idle beat is not enough
    for worker in ("w1", "w3"):
        fleet.heartbeat(beat(worker, idle=True), clock.now)
    fleet.heartbeat(beat("w2", idle=True), clock.now)
    # Not while there is a backlog.
    assert fleet.rebalance(Q, backlog=1, oldest_age=1, now=clock.now) == []
    issued = fleet.rebalance(Q, backlog=0, oldest_age=0, now=clock.now)
    # w1 and w3 were idle twice; w2 only once since its busy beat; one worker stays awake.
    assert sorted(c.worker for c in issued) == ["w1", "w3"] and {c.kind for c in issued} == {"sleep"}
    assert all(c.issued_by == "rebalance" for c in issued)
    _, events = fleet.drain()
    assert sorted((e.event, e.worker) for e in events) == [("sleep", "w1"), ("sleep", "w3")]
    assert fleet.rebalance(Q, 0, 0, clock.now) == []  # pending controls are not issued twice
    for control in issued:
        ack = ControlAck(control.id, "applied")
        fleet.heartbeat(beat(control.worker, acks=(ack,), state="sleeping"), clock.advance(0.1))
    fleet.drain()
    assert fleet.rebalance(Q, backlog=2, oldest_age=5, now=clock.now) == []  # under both thresholds
    woken = fleet.rebalance(Q, backlog=1, oldest_age=31, now=clock.now)  # the oldest is too old
    assert sorted(c.worker for c in woken) == ["w1", "w3"] and {c.kind for c in woken} == {"wake"}
    _, events = fleet.drain()
    assert {e.event for e in events} == {"wake"} and "oldest message" in events[0].reason


def test_no_policy_means_nobody_sleeps_and_policies_are_checked() -> None:
    clock = FakeClock()
    fleet = Fleet()
    for _ in range(5):
        fleet.heartbeat(beat("w1", idle=True), clock.advance(0.1))
        fleet.heartbeat(beat("w2", idle=True), clock.now)
    assert fleet.rebalance(Q, 0, 0, clock.now) == []
    with pytest.raises(InvalidArgument) as caught:
        RebalancePolicy.from_dict({"min_active": -1})
    assert caught.value.details["field"] == "min_active"
    with pytest.raises(InvalidArgument) as caught:
        RebalancePolicy.from_dict({"sleepiness": 3})
    assert caught.value.details["field"] == "sleepiness"
    with pytest.raises(InvalidArgument) as caught:
        RebalancePolicy.from_dict({"wake_age": -0.5})
    assert caught.value.details["field"] == "wake_age"
