"""Placement (cluster/placement.py) as plain values: `propose` in traffic mode (the dominant region wins only
past min_share and min_saving_ms, unmeasured latency gives no proposal), hysteresis (hold), cooldown, the
hourly budget, pending moves, the choice of the target node, draining nodes, schedule mode over a
compressed day, the risk text; the policy's codec and `parse_schedule`'s errors; the history codec. A
stateful test drives time, demand, deaths and moves against the invariants the master relies on. And one
test of cluster/placement_store.py against a real JetStream server (policy and history round trip, the
history's compare-and-set under concurrent appends)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Literal

import orjson
import pytest
from cluster_support import nats1, nats_client
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from kit.until import until

from cluster.kv_mirror import KvMirror
from cluster.layout import ensure_layout, ensure_streams
from cluster.nats_servers import NatsCluster
from cluster.ownership import Assignment, NodeInfo, RecordError
from cluster.placement import (
    BUDGET_WINDOW,
    HISTORY_KEEP,
    MoveRecord,
    PlacementPolicy,
    PlacementState,
    PolicyError,
    Proposal,
    ScheduleStep,
    format_schedule,
    history_from_json,
    history_to_json,
    parse_schedule,
    propose,
    trim_history,
)
from cluster.placement_store import (
    HISTORY_KEY,
    placement_bucket,
    read_placement,
    record_moves,
    write_policy,
)
from cluster.placer import Placer
from cluster.traffic import EdgeReport, NodeLatency, PartitionTraffic

__all__ = ["nats1"]  # the fixture, used by name

NOW = 1_000_000.0
# Round trips in ms between regions (twice the one-way delays of the WAN simulation), 1 ms within one.
RTT = {("eu", "us"): 80.0, ("us", "ap"): 180.0, ("eu", "ap"): 240.0}
REGIONS = ("eu", "us", "ap")


def latency_table(skip: tuple[str, str] | None = None) -> dict[tuple[str, str], float]:
    table: dict[tuple[str, str], float] = {}
    for a in REGIONS:
        for b in REGIONS:
            table[(a, b)] = 1.0 if a == b else RTT.get((a, b), RTT.get((b, a), 0.0))
    if skip is not None:
        del table[skip]
    return table


LATENCY = latency_table()


def node(
    name: str,
    region: str,
    zone: str = "",
    applied: dict[int, int] | None = None,
    draining: tuple[int, ...] = (),
) -> NodeInfo:
    return NodeInfo(
        name,
        "i1",
        f"http://{name}",
        1,
        dict(applied or {}),
        frozenset(),
        frozenset(draining),
        region=region,
        zone=zone or f"{region}-1",
    )


def nodes_of(*infos: NodeInfo) -> dict[str, NodeInfo]:
    return {info.node: info for info in infos}


WORLD = nodes_of(node("eu1", "eu"), node("us1", "us"), node("ap1", "ap"))


def owned(**owners: str) -> dict[int, Assignment]:
    """owned(p0="eu1", p1="us1") -> assignments."""
    return {int(key[1:]): Assignment(int(key[1:]), name, "i1", 1, 0.0) for key, name in owners.items()}


def traffic(**changes: object) -> PlacementPolicy:
    values: dict[str, object] = {"mode": "traffic", "hold": 0.0, "cooldown": 0.0, **changes}
    return PlacementPolicy(**values)  # type: ignore[arg-type]


def run(
    *,
    demand: dict[int, dict[str, float]],
    policy: PlacementPolicy | None = None,
    nodes: dict[str, NodeInfo] | None = None,
    assignments: dict[int, Assignment] | None = None,
    latency: dict[tuple[str, str], float] | None = None,
    state: PlacementState | None = None,
    now: float = NOW,
    pending: dict[int, str] | None = None,
    partitions: int = 1,
) -> tuple[list[Proposal], PlacementState]:
    return propose(
        partitions=partitions,
        assignments=owned(p0="eu1") if assignments is None else assignments,
        nodes=WORLD if nodes is None else nodes,
        demand=demand,
        latency=LATENCY if latency is None else latency,
        policy=traffic() if policy is None else policy,
        state=PlacementState() if state is None else state,
        now=now,
        pending_moves=pending or {},
    )


def only(proposals: list[Proposal]) -> Proposal:
    assert len(proposals) == 1, proposals
    return proposals[0]


def record(partition: int, at: float, to_region: str = "us") -> MoveRecord:
    return MoveRecord(at, partition, "eu1", f"{to_region}1", "eu", to_region, "test", "placement")


# ------------------------------------------------------------------------------------------- traffic
def test_the_dominant_region_wins() -> None:
    proposal = only(run(demand={0: {"us": 10.0}})[0])
    assert (proposal.from_node, proposal.to_node, proposal.from_region, proposal.to_region) == (
        "eu1",
        "us1",
        "eu",
        "us",
    )
    assert proposal.blocked == ""
    assert proposal.saved_ms == pytest.approx(79.0)
    assert "100% of 10.0 msg/s from us" in proposal.reason


def test_where_the_producers_already_are_nothing_moves() -> None:
    assert run(demand={0: {"eu": 10.0, "us": 1.0}})[0] == []


def test_after_the_move_the_same_demand_keeps_it_there() -> None:
    demand = {0: {"us": 6.0, "eu": 3.0, "ap": 1.0}}
    proposal = only(run(demand=demand)[0])
    assert proposal.to_node == "us1"
    assert run(demand=demand, assignments=owned(p0="us1"))[0] == []  # no way back while nothing changed


def test_a_mixed_audience_below_min_share_stays() -> None:
    # us is the cheapest place (cost 73 ms against 92 in eu) but only 40% of the sends come from there.
    demand = {0: {"us": 4.0, "eu": 3.5, "ap": 2.5}}
    assert run(demand=demand)[0] == []
    proposal = only(run(demand=demand, policy=traffic(min_share=0.3))[0])
    assert proposal.to_region == "us"
    assert proposal.saved_ms == pytest.approx(0.4 * 79 + 0.35 * -79 + 0.25 * 60)


def test_a_small_saving_stays() -> None:
    near = {**LATENCY, ("us", "eu"): 4.0, ("eu", "us"): 4.0}
    assert run(demand={0: {"us": 10.0}}, latency=near)[0] == []
    assert only(run(demand={0: {"us": 10.0}}, latency=near, policy=traffic(min_saving_ms=2.0))[0])


def test_a_trickle_below_min_rate_stays() -> None:
    assert run(demand={0: {"us": 0.1}})[0] == []
    assert run(demand={0: {"": 50.0}})[0] == []  # sends from an unknown region do not count


def test_unmeasured_latency_gives_no_proposal() -> None:
    # No edge in us measured ap: the cost of ap is unknown, so nothing is proposed at all.
    assert run(demand={0: {"us": 10.0}}, latency=latency_table(skip=("us", "ap")))[0] == []
    # ...and a node of unknown region is no candidate, nor an owner placement can judge.
    nodes = {**WORLD, "x1": node("x1", "")}
    assert only(run(demand={0: {"us": 10.0}}, nodes=nodes)[0]).to_node == "us1"
    assert run(demand={0: {"us": 10.0}}, nodes=nodes, assignments=owned(p0="x1"))[0] == []


def test_a_trickle_from_an_unmeasured_region_does_not_stop_placement() -> None:
    # A region no edge measures (a client table's entry without an edge) sends 5%: the decision is made on
    # the measured 95% and says so; once the unmeasured part passes 1 - min_share, nothing is proposed.
    table = {**LATENCY}
    proposal = only(run(demand={0: {"us": 9.5, "sa": 0.5}}, latency=table)[0])
    assert (
        proposal.to_region == "us"
        and "5% of the sends from regions without measured latency" in proposal.reason
    )
    assert proposal.saved_ms == pytest.approx(79.0)
    assert run(demand={0: {"us": 4.0, "sa": 6.0}}, latency=table)[0] == []


def test_a_dead_owner_is_left_to_failover() -> None:
    assert run(demand={0: {"us": 10.0}}, assignments=owned(p0="gone"))[0] == []
    assert run(demand={0: {"us": 10.0}}, assignments={})[0] == []


def test_off_proposes_nothing_and_mode_overrides() -> None:
    off = PlacementPolicy(hold=0.0, cooldown=0.0)
    assert run(demand={0: {"us": 10.0}}, policy=off)[0] == []
    proposals, _ = propose(
        partitions=1,
        assignments=owned(p0="eu1"),
        nodes=WORLD,
        demand={0: {"us": 10.0}},
        latency=LATENCY,
        policy=off,
        state=PlacementState(),
        now=NOW,
        pending_moves={},
        mode="traffic",
    )
    assert only(proposals).to_node == "us1"


# ---------------------------------------------------------------------------------------- hysteresis
def test_hold_waits_for_the_same_wish() -> None:
    policy = traffic(hold=30.0)
    first, state = run(demand={0: {"us": 10.0}}, policy=policy)
    assert only(first).blocked == "hold 30 s more"
    assert state.leaning == {0: ("us", NOW)}
    later, state = run(demand={0: {"us": 10.0}}, policy=policy, state=state, now=NOW + 12)
    assert only(later).blocked == "hold 18 s more"
    done, state = run(demand={0: {"us": 10.0}}, policy=policy, state=state, now=NOW + 30)
    assert only(done).blocked == ""
    assert state.leaning == {}  # made: the next wish starts afresh


def test_a_changed_wish_or_none_starts_the_hold_over() -> None:
    policy = traffic(hold=30.0)
    _, state = run(demand={0: {"us": 10.0}}, policy=policy)
    ap, state = run(demand={0: {"ap": 10.0}}, policy=policy, state=state, now=NOW + 20)
    assert only(ap).blocked == "hold 30 s more"
    quiet, state = run(demand={0: {"eu": 10.0}}, policy=policy, state=state, now=NOW + 40)
    assert quiet == [] and state.leaning == {}
    again, _ = run(demand={0: {"ap": 10.0}}, policy=policy, state=state, now=NOW + 50)
    assert only(again).blocked == "hold 30 s more"


def test_cooldown_after_a_move() -> None:
    state = PlacementState(history=(record(0, NOW - 100),))
    proposal = only(run(demand={0: {"us": 10.0}}, policy=traffic(cooldown=900.0), state=state)[0])
    assert proposal.blocked == "cooldown 800 s more"
    later = PlacementState(history=(record(0, NOW - 600),))
    proposal = only(run(demand={0: {"us": 10.0}}, policy=traffic(cooldown=900.0), state=later)[0])
    assert proposal.blocked == "cooldown 300 s more"
    free = only(run(demand={0: {"us": 10.0}}, policy=traffic(cooldown=90.0), state=state)[0])
    assert free.blocked == ""


def test_the_budget_counts_the_last_hour_and_this_call() -> None:
    two = PlacementState(history=(record(5, NOW - 10), record(6, NOW - 3000), record(7, NOW - 3700)))
    policy = traffic(max_moves_per_hour=2)
    assert only(run(demand={0: {"us": 10.0}}, policy=policy, state=two)[0]).blocked == (
        "budget: 2 moves in the last hour"
    )
    assert only(run(demand={0: {"us": 10.0}}, policy=policy, state=two, now=NOW + 700)[0]).blocked == ""
    # Two partitions want to move, one move left: the first goes, the second waits.
    proposals, _ = run(
        demand={0: {"us": 10.0}, 1: {"ap": 10.0}},
        assignments=owned(p0="eu1", p1="eu1"),
        policy=traffic(max_moves_per_hour=1),
        partitions=2,
    )
    assert [p.blocked for p in proposals] == ["", "budget: 1 moves in the last hour"]


def test_a_pending_move_blocks() -> None:
    nodes = nodes_of(
        node("eu1", "eu", applied={0: 50}), node("us1", "us", applied={0: 20}), node("ap1", "ap")
    )
    proposal = only(run(demand={0: {"us": 10.0}}, nodes=nodes, pending={0: "us1"})[0])
    assert proposal.blocked == "a move is under way: us1 catching up, 30 frames behind"
    other = only(run(demand={0: {"us": 10.0}}, nodes=nodes, pending={0: "ap1"})[0])
    assert other.blocked.startswith("a move is under way")


# --------------------------------------------------------------------------------------------- target
def test_the_target_is_the_least_loaded_then_furthest_along_then_by_name() -> None:
    nodes = nodes_of(
        node("eu1", "eu"),
        node("us1", "us", applied={0: 9}),
        node("us2", "us", applied={0: 5}),
        node("us3", "us", applied={0: 9}),
    )
    # us1 already owns partition 1: us2 and us3 own nothing, us3 has more of partition 0 applied.
    proposals, _ = run(
        demand={0: {"us": 10.0}}, nodes=nodes, assignments=owned(p0="eu1", p1="us1"), partitions=2
    )
    assert only(proposals).to_node == "us3"
    even = {**nodes, "us2": node("us2", "us", applied={0: 9})}
    proposals, _ = run(
        demand={0: {"us": 10.0}}, nodes=even, assignments=owned(p0="eu1", p1="us1"), partitions=2
    )
    assert only(proposals).to_node == "us2"


def test_draining_nodes_are_skipped() -> None:
    nodes = nodes_of(node("eu1", "eu"), node("us1", "us", draining=(2,)), node("us2", "us"))
    assert only(run(demand={0: {"us": 10.0}}, nodes=nodes)[0]).to_node == "us2"
    busy = {**nodes, "us2": node("us2", "us", draining=(1,))}
    proposal = only(run(demand={0: {"us": 10.0}}, nodes=busy)[0])
    assert (proposal.to_node, proposal.blocked) == ("", "every node in us is handing partitions over")


def test_the_risk_says_the_lag_and_where_failover_could_go() -> None:
    nodes = nodes_of(
        node("eu1", "eu", applied={0: 12}),
        node("us1", "us", applied={0: 7}),
        node("ap1", "ap", applied={0: 12}),
    )
    proposal = only(run(demand={0: {"us": 10.0}}, nodes=nodes)[0])
    assert proposal.risk == "target 5 frames behind; failover candidates in 2 other zones"
    alone = nodes_of(node("eu1", "eu", zone="z"), node("us1", "us", zone="z"))
    proposal = only(run(demand={0: {"us": 10.0}}, nodes=alone)[0])
    assert proposal.risk == "target 0 frames behind; failover candidates only in z"


# ------------------------------------------------------------------------------------------- schedule
DAY = PlacementPolicy(
    mode="schedule",
    schedule=parse_schedule("00:00=eu,08:00=us,16:00=ap"),
    day_seconds=24.0,
    day_origin=NOW,
    hold=0.0,
    cooldown=0.0,
)


def test_scheduled_region_over_a_compressed_day() -> None:
    assert [DAY.scheduled_region(NOW + t) for t in (0, 7.9, 8, 15.9, 16, 23.9, 24, 32, 48 + 17)] == [
        "eu",
        "eu",
        "us",
        "us",
        "ap",
        "ap",
        "eu",
        "us",
        "ap",
    ]
    # Before the day's first step: the day's last step is still in force (wrap-around).
    late = replace(DAY, schedule=parse_schedule("08:00=us,16:00=ap"))
    assert late.scheduled_region(NOW + 3) == "ap"
    assert late.scheduled_region(NOW - 1) == "ap"  # 23:00 of the day before
    assert PlacementPolicy().scheduled_region(NOW) is None


def test_schedule_mode_moves_every_partition_to_the_scheduled_region() -> None:
    assignments = owned(p0="eu1", p1="us1", p2="ap1")
    proposals, _ = run(demand={}, policy=DAY, assignments=assignments, now=NOW + 9, partitions=3)
    assert [(p.partition, p.to_node, p.blocked) for p in proposals] == [(0, "us1", ""), (2, "us1", "")]
    assert proposals[0].reason == "schedule: 08:00=us"
    assert proposals[0].saved_ms is None  # nothing measured
    measured, _ = run(demand={0: {"us": 2.0}}, policy=DAY, now=NOW + 9)
    assert only(measured).saved_ms == pytest.approx(79.0)


def test_schedule_toward_a_region_without_a_live_node_is_blocked() -> None:
    nodes = nodes_of(node("eu1", "eu"), node("us1", "us"))
    proposal = only(run(demand={}, policy=DAY, nodes=nodes, now=NOW + 17)[0])
    assert (proposal.to_region, proposal.to_node, proposal.blocked) == ("ap", "", "no live node in ap")


# ------------------------------------------------------------------------------------ policy and codecs
def test_policy_round_trip() -> None:
    policy = replace(DAY, min_share=0.6, min_saving_ms=2.5, min_rate=1.0, max_moves_per_hour=3)
    assert PlacementPolicy.from_json(policy.to_json()) == policy
    assert PlacementPolicy.from_json(b"{}") == PlacementPolicy()
    assert orjson.loads(policy.to_json())["schedule_text"] == "00:00=eu,08:00=us,16:00=ap"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"[", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"mode": "sun"}', "mode"),
        (b'{"mode": "schedule"}', "schedule"),
        (b'{"min_share": 2}', "min_share"),
        (b'{"hold": "long"}', "hold"),
        (b'{"cooldown": -1}', "cooldown"),
        (b'{"day_seconds": 0}', "day_seconds"),
        (b'{"max_moves_per_hour": 1.5}', "max_moves_per_hour"),
        (b'{"schedule": [{"at_hour": 25, "region": "eu"}]}', "schedule"),
        (b'{"schedule": [{"at": 1}]}', "schedule step"),
        (b'{"schedule": "08:00=eu"}', "schedule"),
    ],
)
def test_a_bad_policy_names_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        PlacementPolicy.from_json(raw)


def test_replace_validates() -> None:
    with pytest.raises(PolicyError, match="min_saving_ms"):
        replace(PlacementPolicy(), min_saving_ms=-1.0)


def test_parse_schedule() -> None:
    steps = parse_schedule(" 16:00=us, 00:00=ap ,08:30=eu")
    assert steps == (ScheduleStep(0.0, "ap"), ScheduleStep(8.5, "eu"), ScheduleStep(16.0, "us"))
    assert format_schedule(steps) == "00:00=ap,08:30=eu,16:00=us"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no steps"),
        ("08:00", "HH:MM=REGION"),
        ("8=eu", "HH:MM=REGION"),
        ("24:00=eu", "00:00-23:59"),
        ("08:60=eu", "00:00-23:59"),
        ("08:00=e u", "not a region"),
        ("08:00=eu,8:00=us", "two steps at 08:00"),
    ],
)
def test_parse_schedule_errors(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_schedule(text)


def test_history_codec_and_trim() -> None:
    records = (record(0, NOW - 10), record(1, NOW - 5, "ap"))
    assert history_from_json(history_to_json(records)) == records
    for bad in (b"{", b"{}", b'[{"at": 1}]'):
        with pytest.raises(RecordError):
            history_from_json(bad)
    old = record(2, NOW - 3 * 86400)
    assert trim_history((records[1], old, records[0]), NOW) == records
    many = [record(0, NOW - i) for i in range(HISTORY_KEEP + 5)]
    kept = trim_history(many, NOW)
    assert len(kept) == HISTORY_KEEP and kept[-1].at == NOW


def test_a_record_of_a_proposal() -> None:
    proposal = only(run(demand={0: {"us": 10.0}})[0])
    made = MoveRecord.of(proposal, NOW, "plan")
    assert (made.partition, made.to_node, made.to_region, made.by, made.at) == (0, "us1", "us", "plan", NOW)


# ----------------------------------------------------------------------------------------- stateful
NAMES = ("eu1", "eu2", "us1", "ap1")
HOME = {"eu1": "eu", "eu2": "eu", "us1": "us", "ap1": "ap"}
PARTITIONS = 3


class Placement(RuleBasedStateMachine):
    """The master's loop around `propose`: each tick it makes the unblocked proposals (a pending move,
    recorded in the history), moves finish when the test says, nodes die (their partitions fail over to
    another live node) and come back, demand and time change."""

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW
        self.live: set[str] = set(NAMES)
        self.assignments = {p: Assignment(p, NAMES[p % 2], "i1", 1, 0.0) for p in range(PARTITIONS)}
        self.demand: dict[int, dict[str, float]] = {}
        self.pending: dict[int, str] = {}
        self.state = PlacementState()
        self.policy = traffic()
        # partition -> (from region, demand, live nodes) of its last placement move: the no-flap check
        self.last_move: dict[int, tuple[str, dict[str, float], frozenset[str]]] = {}

    @initialize(
        mode=st.sampled_from(["traffic", "traffic", "schedule"]),
        hold=st.sampled_from([0.0, 30.0, 400.0]),
        cooldown=st.sampled_from([0.0, 600.0]),
        budget=st.sampled_from([1, 2, 4]),
        tops=st.lists(st.sampled_from(REGIONS), min_size=PARTITIONS, max_size=PARTITIONS),
    )
    def choose_policy(
        self,
        mode: Literal["traffic", "schedule"],
        hold: float,
        cooldown: float,
        budget: int,
        tops: list[str],
    ) -> None:
        self.policy = PlacementPolicy(
            mode=mode,
            schedule=parse_schedule("00:00=eu,08:00=us,16:00=ap"),
            day_seconds=7200.0,  # a day in two hours: the schedule changes every 40 minutes
            day_origin=NOW,
            hold=hold,
            cooldown=cooldown,
            max_moves_per_hour=budget,
        )
        self.demand = {p: {region: 10.0} for p, region in enumerate(tops)}

    def nodes(self) -> dict[str, NodeInfo]:
        return {name: node(name, HOME[name]) for name in sorted(self.live)}

    @rule(seconds=st.sampled_from([1.0, 400.0, 2000.0]), finished=st.booleans())
    def time_passes(self, seconds: float, finished: bool) -> None:
        """Time passes; the moves under way finish (the target caught up) or not yet."""
        self.now += seconds
        if finished:
            for partition, target in self.pending.items():
                current = self.assignments[partition]
                self.assignments[partition] = replace(current, node=target, epoch=current.epoch + 1)
            self.pending = {}

    @rule(
        partition=st.integers(0, PARTITIONS - 1),
        region=st.sampled_from(REGIONS),
        rate=st.sampled_from([0.0, 0.1, 5.0, 50.0]),
        shift=st.booleans(),
    )
    def demand_changes(self, partition: int, region: str, rate: float, shift: bool) -> None:
        """The sends of one region change, or (shift) all now come from that region."""
        if shift:
            self.demand[partition] = {}
        self.demand.setdefault(partition, {})[region] = rate

    @rule(name=st.sampled_from(NAMES))
    def dies_or_comes_back(self, name: str) -> None:
        """A node dies (its partitions fail over to another live node; a move to it is dropped) or a dead
        one comes back."""
        if name not in self.live:
            self.live.add(name)
            return
        if len(self.live) == 1:
            return
        self.live.discard(name)
        heir = sorted(self.live)[0]
        for partition, assignment in list(self.assignments.items()):
            if assignment.node == name:
                self.assignments[partition] = replace(assignment, node=heir, epoch=assignment.epoch + 1)
        self.pending = {p: target for p, target in self.pending.items() if target != name}

    @rule()
    def master_ticks(self) -> None:
        nodes = self.nodes()
        proposals, self.state = propose(
            partitions=PARTITIONS,
            assignments=self.assignments,
            nodes=nodes,
            demand=self.demand,
            latency=LATENCY,
            policy=self.policy,
            state=self.state,
            now=self.now,
            pending_moves=self.pending,
        )
        made: list[MoveRecord] = []
        for proposal in proposals:
            assert proposal.from_node == self.assignments[proposal.partition].node
            assert proposal.to_region != proposal.from_region
            if self.policy.mode == "traffic":
                assert any(info.region == proposal.to_region for info in nodes.values()), proposal
            event(f"proposal: {proposal.blocked.split(' ')[0] if proposal.blocked else 'made'}")
            if proposal.blocked:
                continue
            target = nodes.get(proposal.to_node)
            assert target is not None and target.region == proposal.to_region, proposal
            assert proposal.partition not in self.pending, proposal
            if self.policy.mode == "traffic":
                self._no_flap(proposal, nodes)
            made.append(MoveRecord.of(proposal, self.now, "placement"))
            self.pending[proposal.partition] = proposal.to_node
        self.state = PlacementState(self.state.leaning, (*self.state.history, *made))

    def _no_flap(self, proposal: Proposal, nodes: dict[str, NodeInfo]) -> None:
        rates = dict(self.demand.get(proposal.partition, {}))
        last = self.last_move.get(proposal.partition)
        if last is not None:
            back_to, then_rates, then_live = last
            unchanged = then_rates == rates and then_live == frozenset(nodes)
            assert not (unchanged and proposal.to_region == back_to), (proposal, last)
        self.last_move[proposal.partition] = (proposal.from_region, rates, frozenset(nodes))

    @invariant()
    def never_over_budget_in_any_hour(self) -> None:
        times = sorted(r.at for r in self.state.history)
        for i, at in enumerate(times):
            within = [t for t in times[: i + 1] if t > at - BUDGET_WINDOW]
            assert len(within) <= self.policy.max_moves_per_hour, (times, self.policy)

    @invariant()
    def never_twice_within_cooldown(self) -> None:
        last: dict[int, float] = {}
        for r in self.state.history:
            if r.partition in last:
                assert r.at - last[r.partition] >= self.policy.cooldown, self.state.history
            last[r.partition] = r.at


TestPlacement = Placement.TestCase
TestPlacement.settings = settings(max_examples=50, stateful_step_count=30, deadline=None, derandomize=True)


# --------------------------------------------------------------------------------------- the store
async def test_placement_store_round_trip_and_concurrent_appends(nats1: NatsCluster) -> None:
    async with nats_client(nats1, "placement") as nc:
        js = nc.jetstream()
        layout = await ensure_layout(js, 1, 1)
        await ensure_streams(js, layout)
        assert await read_placement(js, layout) == (PlacementPolicy(), ())  # nothing written: off
        await write_policy(js, layout, DAY)
        assert await read_placement(js, layout) == (DAY, ())

        first = (record(0, NOW), record(1, NOW + 1))
        assert await record_moves(js, layout, first, now=NOW + 1) == first
        # Ten writers append at once: every append is compare-and-set, retried, so none is lost.
        batches = [(record(2 + i, NOW + 2 + i),) for i in range(10)]
        await asyncio.gather(*(record_moves(js, layout, batch, now=NOW + 20) for batch in batches))
        _, history = await read_placement(js, layout)
        assert sorted(r.partition for r in history) == list(range(12))
        assert [r.at for r in history] == sorted(r.at for r in history)

        # Another writer replaced the history: an append builds on what is there now.
        bucket = await placement_bucket(js, layout)
        await bucket.put(HISTORY_KEY, history_to_json(history[:1]))
        written = await record_moves(js, layout, (record(40, NOW + 30),), now=NOW + 30)
        assert [r.partition for r in written] == [0, 40]

        # An unreadable history counts as empty and is replaced; an unreadable policy is an error.
        await bucket.put(HISTORY_KEY, b"not json")
        assert (await read_placement(js, layout))[1] == ()
        assert [r.partition for r in await record_moves(js, layout, (record(7, NOW),), now=NOW)] == [7]
        await bucket.put("policy", b'{"mode": "sun"}')
        with pytest.raises(PolicyError, match="mode"):
            await read_placement(js, layout)


async def test_the_masters_placer_asks_for_the_move_and_records_it(nats1: NatsCluster) -> None:
    """cluster.placer as the master runs it: an edge in us reports partition 0's sends (all from us) and
    its round trips; with placement on, the tick writes the move request and the history, then holds
    back (a move under way); rebalancing is held while placement is on."""
    async with nats_client(nats1, "placer") as nc:
        js = nc.jetstream()
        layout = await ensure_layout(js, 2, 1)
        await ensure_streams(js, layout)
        edges = await js.key_value(layout.edges_bucket)
        report = EdgeReport(
            "edge-us",
            "us",
            "us-1",
            "http://edge-us",
            NOW,
            10.0,
            {0: PartitionTraffic({"us": 10.0}, 100, 80.0, 81.0, "eu1")},
            {"eu1": NodeLatency("eu", 80.0), "us1": NodeLatency("us", 1.0)},
        )
        await edges.put("edge-us", report.to_json())
        owners = await KvMirror.open(js, layout.owners_bucket, "owners")
        await owners.start()
        placer = Placer(js, layout, owners, clock=lambda: NOW, every=0.0)
        try:
            assert placer.holds_rebalance()  # the policy not heard yet: rebalancing waits (OPEN_GRACE)
            nodes = nodes_of(node("eu1", "eu"), node("us1", "us"))
            assignments = owned(p0="eu1", p1="eu1")
            assert await placer.tick(assignments, nodes, {}) == []  # off: nothing
            assert not placer.holds_rebalance()

            await write_policy(js, layout, traffic())
            await until(placer.holds_rebalance, 10.0, what="the placer hears the policy")
            made = await placer.tick(assignments, nodes, {})
            assert [(r.partition, r.to_node, r.by, r.at) for r in made] == [(0, "us1", "placement", NOW)]
            request = orjson.loads((await owners.bucket.get("move-p0")).value or b"")
            assert request["node"] == "us1" and request["by"] == "placement"
            assert "from us" in request["why"]
            _, history = await read_placement(js, layout)
            assert history == tuple(made)

            assert await placer.tick(assignments, nodes, {0: "us1"}) == []  # under way
            await write_policy(js, layout, PlacementPolicy())
            await until(lambda: not placer.holds_rebalance(), 10.0, what="the placer hears placement off")
        finally:
            await placer.close()
            await owners.stop()
