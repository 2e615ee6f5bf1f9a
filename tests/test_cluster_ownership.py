"""Who owns which partition (cluster/ownership.py), as plain values: the master's `plan` (first owners spread
evenly, live owners kept, a dead owner replaced by the standby furthest along, epochs bumped, the promotion
grace, planned moves), `rebalance`, and the KV records' encoding. A stateful test drives `plan` through
random deaths, restarts and joins the way cluster.master and cluster.node carry it out, and checks that
every partition always has one live owner and that each partition's epoch only rises."""

from __future__ import annotations

import itertools
from collections import Counter

import orjson
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster.ownership import (
    PROMOTION_GRACE,
    Assignment,
    NodeInfo,
    RecordError,
    owner_is_live,
    plan,
    rebalance,
)

NOW = 10_000.0


def node(
    name: str,
    incarnation: str = "i1",
    applied: dict[int, int] | None = None,
    serving: tuple[int, ...] = (),
) -> NodeInfo:
    return NodeInfo(name, incarnation, f"http://{name}", 1, dict(applied or {}), frozenset(serving))


def nodes_of(*infos: NodeInfo) -> dict[str, NodeInfo]:
    return {info.node: info for info in infos}


def owned(partition: int, name: str, epoch: int = 1, incarnation: str = "i1", at: float = 0.0) -> Assignment:
    return Assignment(partition, name, incarnation, epoch, at)


def by_partition(changes: list[Assignment]) -> dict[int, Assignment]:
    assert len({c.partition for c in changes}) == len(changes), f"one change per partition: {changes}"
    return {c.partition: c for c in changes}


# ------------------------------------------------------------------------------------------- plan
def test_no_live_node_no_plan() -> None:
    assert plan(3, {}, {}, NOW) == []
    assert plan(3, {0: owned(0, "a")}, {}, NOW) == []


def test_first_owners_are_live_nodes_spread_evenly() -> None:
    nodes = nodes_of(node("a"), node("b"), node("c"))
    changes = by_partition(plan(7, {}, nodes, NOW))
    assert sorted(changes) == list(range(7))
    for change in changes.values():
        assert change.node in nodes and change.incarnation == nodes[change.node].incarnation
        assert (change.epoch, change.assigned_at, change.reason) == (1, NOW, "first owner")
    counts = Counter(c.node for c in changes.values())
    assert sorted(counts.values()) == [2, 2, 3]


def test_first_owners_count_the_partitions_already_owned() -> None:
    nodes = nodes_of(node("a", serving=(0, 1)), node("b"))
    assignments = {0: owned(0, "a"), 1: owned(1, "a")}
    changes = by_partition(plan(4, assignments, nodes, NOW))
    assert {p: c.node for p, c in changes.items()} == {2: "b", 3: "b"}


def test_live_owners_are_kept() -> None:
    nodes = nodes_of(node("a", serving=(0,)), node("b", serving=(1,), applied={0: 99}))
    assignments = {0: owned(0, "a", epoch=4), 1: owned(1, "b", epoch=2)}
    assert plan(2, assignments, nodes, NOW) == []


def test_a_gone_owner_goes_to_the_standby_furthest_along_with_the_next_epoch() -> None:
    nodes = nodes_of(node("b", applied={0: 10}), node("c", applied={0: 12}), node("d", applied={0: 11}))
    changes = plan(1, {0: owned(0, "a", epoch=5)}, nodes, NOW)
    assert len(changes) == 1
    change = changes[0]
    assert (change.partition, change.node, change.incarnation, change.epoch) == (0, "c", "i1", 6)
    assert change.assigned_at == NOW and "a" in change.reason


def test_an_owner_in_another_incarnation_is_gone() -> None:
    """The same name back with a new incarnation (a restart) lost what it served: replace the owner; the
    restarted node may get it back when it is the furthest along (its store survived)."""
    restarted = node("a", incarnation="i2", applied={0: 30})
    changes = plan(1, {0: owned(0, "a", epoch=3)}, nodes_of(restarted, node("b", applied={0: 20})), NOW)
    assert [(c.node, c.incarnation, c.epoch) for c in changes] == [("a", "i2", 4)]
    changes = plan(1, {0: owned(0, "a", epoch=3)}, nodes_of(restarted, node("b", applied={0: 31})), NOW)
    assert [(c.node, c.incarnation, c.epoch) for c in changes] == [("b", "i1", 4)]


def test_ties_go_to_the_node_owning_fewest_then_to_the_first_name() -> None:
    nodes = nodes_of(node("c", serving=(1,)), node("b", serving=(2,)), node("a", serving=(3,)), node("d"))
    assignments = {1: owned(1, "c"), 2: owned(2, "b"), 3: owned(3, "a")}
    assert [c.node for c in plan(4, assignments, nodes, NOW)] == ["d"]
    nodes = nodes_of(node("c"), node("b"), node("a"))
    assert [c.node for c in plan(1, {}, nodes, NOW)] == ["a"]


def test_a_young_assignment_has_its_grace_to_open_the_partition() -> None:
    nodes = nodes_of(node("a"), node("b", applied={0: 50}))  # a has not opened it yet
    young = owned(0, "a", epoch=2, at=NOW - PROMOTION_GRACE + 0.5)
    assert owner_is_live(young, nodes, NOW)
    assert plan(1, {0: young}, nodes, NOW) == []
    late = owned(0, "a", epoch=2, at=NOW - PROMOTION_GRACE - 0.5)
    assert not owner_is_live(late, nodes, NOW)
    assert [(c.node, c.epoch) for c in plan(1, {0: late}, nodes, NOW)] == [("b", 3)]
    serving = nodes_of(node("a", serving=(0,)), node("b", applied={0: 50}))
    assert plan(1, {0: late}, serving, NOW) == []  # old, but it serves


def test_a_move_waits_for_the_target_to_catch_up_and_the_owner_to_stop() -> None:
    assignments = {0: owned(0, "a", epoch=3)}
    moves = {0: "b"}
    behind = nodes_of(node("a", applied={0: 40}, serving=(0,)), node("b", applied={0: 30}))
    assert plan(1, assignments, behind, NOW, moves) == []
    caught_up_owner_serving = nodes_of(node("a", applied={0: 40}, serving=(0,)), node("b", applied={0: 40}))
    assert plan(1, assignments, caught_up_owner_serving, NOW, moves) == []
    stopped_behind = nodes_of(node("a", applied={0: 40}), node("b", applied={0: 39}))
    assert plan(1, assignments, stopped_behind, NOW, moves) == []
    handed_over = nodes_of(node("a", applied={0: 40}), node("b", incarnation="i7", applied={0: 40}))
    changes = plan(1, assignments, handed_over, NOW, moves)
    assert [(c.node, c.incarnation, c.epoch, c.reason) for c in changes] == [("b", "i7", 4, "moved")]


def test_a_move_to_a_dead_node_or_to_the_owner_changes_nothing() -> None:
    assignments = {0: owned(0, "a", epoch=3)}
    nodes = nodes_of(node("a", applied={0: 40}, serving=(0,)), node("b", applied={0: 40}))
    assert plan(1, assignments, nodes, NOW, {0: "zed"}) == []
    assert plan(1, assignments, nodes, NOW, {0: "a"}) == []


def test_a_move_whose_owner_died_goes_to_the_target() -> None:
    assignments = {0: owned(0, "a", epoch=3)}
    changes = plan(
        1, assignments, nodes_of(node("b", applied={0: 5}), node("c", applied={0: 9})), NOW, {0: "b"}
    )
    assert [(c.node, c.epoch) for c in changes] == [("b", 4)]


def test_a_move_whose_owner_restarted_does_not_wait_for_the_target() -> None:
    """The owner's name is back in a new incarnation (it serves nothing): the assignment is dead, so the
    partition must not wait, ownerless, for the target to catch up with the restarted node's store."""
    assignments = {0: owned(0, "a", epoch=3)}
    nodes = nodes_of(node("a", incarnation="i2", applied={0: 40}), node("b", applied={0: 30}))
    changes = plan(1, assignments, nodes, NOW, {0: "b"})
    assert len(changes) == 1 and changes[0].epoch == 4 and owner_is_live(changes[0], nodes, NOW)


# -------------------------------------------------------------------------------------- rebalance
def serving_all(
    layout: dict[str, tuple[int, ...]], applied: dict[str, dict[int, int]] | None = None
) -> tuple[dict[int, Assignment], dict[str, NodeInfo]]:
    assignments = {p: owned(p, name) for name, ps in layout.items() for p in ps}
    nodes = nodes_of(
        *(node(name, serving=ps, applied=(applied or {}).get(name)) for name, ps in layout.items())
    )
    return assignments, nodes


def test_rebalance_moves_one_partition_from_the_busiest_to_the_idlest() -> None:
    assignments, nodes = serving_all({"a": (0, 1, 2, 3), "b": (4,), "c": ()}, {"c": {1: 7, 2: 9, 3: 9}})
    assert rebalance(5, assignments, nodes, {}) == {2: "c"}  # the most applied, then the lowest number


def test_rebalance_leaves_an_even_spread_alone() -> None:
    assignments, nodes = serving_all({"a": (0, 1), "b": (2,)})
    assert rebalance(3, assignments, nodes, {}) == {}
    assignments, nodes = serving_all({"a": (0, 1, 2)})
    assert rebalance(3, assignments, nodes, {}) == {}  # one node: nowhere to go


def test_rebalance_waits_until_everything_is_served_and_no_move_is_under_way() -> None:
    assignments, nodes = serving_all({"a": (0, 1, 2), "b": ()})
    assert rebalance(3, assignments, nodes, {}) == {0: "b"}
    assert rebalance(3, assignments, nodes, {1: "b"}) == {}
    assert rebalance(4, assignments, nodes, {}) == {}  # partition 3 has no owner
    not_serving = dict(nodes)
    not_serving["a"] = node("a", serving=(0, 1))
    assert rebalance(3, assignments, not_serving, {}) == {}
    restarted = dict(nodes)
    restarted["a"] = node("a", incarnation="i2", serving=(0, 1, 2))
    assert rebalance(3, assignments, restarted, {}) == {}
    gone = {"b": nodes["b"], "c": node("c")}
    assert rebalance(3, assignments, gone, {}) == {}


# ---------------------------------------------------------------------------------------- records
def test_records_round_trip() -> None:
    assignment = Assignment(7, "node-1", "abc123", 2**40, 1234.5, "moved")
    assert Assignment.from_json(assignment.to_json()) == assignment
    info = NodeInfo(
        "node-2",
        "def456",
        "http://127.0.0.1:9",
        4242,
        {0: 17, 3: 2**40},
        frozenset({0}),
        frozenset({3}),
        9.25,
        "eu-west",
        "eu-west-1b",
    )
    assert NodeInfo.from_json(info.to_json()) == info
    # A heartbeat from a version without regions: region and zone unknown ("").
    legacy = orjson.dumps({"node": "n", "incarnation": "i", "url": "http://n", "pid": 1})
    assert (NodeInfo.from_json(legacy).region, NodeInfo.from_json(legacy).zone) == ("", "")
    assert NodeInfo.from_json(node("x").to_json()) == node("x")
    older = orjson.dumps({"partition": 1, "node": "a", "incarnation": "i", "epoch": 2, "assigned_at": 3})
    assert Assignment.from_json(older) == Assignment(1, "a", "i", 2, 3.0, "")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"null",
        b"[]",
        b'"text"',
        b"{}",
        b'{"partition": 1, "node": "a", "incarnation": "i", "epoch": 2}',
        b'{"partition": "one", "node": "a", "incarnation": "i", "epoch": 2, "assigned_at": 0}',
        b'{"partition": [1], "node": "a", "incarnation": "i", "epoch": 2, "assigned_at": 0}',
        b'{"partition": 1, "node": "a", "incarnation": "i", "epoch": null, "assigned_at": 0}',
    ],
)
def test_an_unreadable_assignment_is_a_record_error(raw: bytes) -> None:
    with pytest.raises(RecordError, match="unreadable assignment"):
        Assignment.from_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"null",
        b"[1, 2]",
        b'{"node": "a", "incarnation": "i", "url": "u"}',
        b'{"node": "a", "incarnation": "i", "url": "u", "pid": "x"}',
        b'{"node": "a", "incarnation": "i", "url": "u", "pid": 1, "applied": [1]}',
        b'{"node": "a", "incarnation": "i", "url": "u", "pid": 1, "applied": {"p0": 1}}',
        b'{"node": "a", "incarnation": "i", "url": "u", "pid": 1, "serving": 3}',
        b'{"node": "a", "incarnation": "i", "url": "u", "pid": 1, "draining": [null]}',
        b'{"node": "a", "incarnation": "i", "url": "u", "pid": 1, "started_at": "soon"}',
    ],
)
def test_an_unreadable_node_record_is_a_record_error(raw: bytes) -> None:
    with pytest.raises(RecordError, match="unreadable node record"):
        NodeInfo.from_json(raw)


# ------------------------------------------------------------------------- plan, over and over
NAMES = ("a", "b", "c", "d")
PARTITIONS = 4


class Ownership(RuleBasedStateMachine):
    """The cluster as the master and the nodes act on `plan`'s output: the master writes each change (and
    forgets a move once done, proposes a rebalance when nothing changed), a node serves what is assigned to
    it (same incarnation) once its promotion succeeds, stops serving what is not, steps down for a planned
    move once the target is close, and followers apply the stream at their own pace."""

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW
        self.incarnations = itertools.count(1)
        self.nodes: dict[str, NodeInfo] = {}
        self.assignments: dict[int, Assignment] = {}
        self.moves: dict[int, str] = {}
        self.stream = dict.fromkeys(range(PARTITIONS), 0)  # each partition's last stream position
        self.epochs: dict[int, int] = {}  # the highest epoch each partition was assigned
        self.join("a", 0)

    @rule(name=st.sampled_from(NAMES), lag=st.integers(0, 5))
    def join(self, name: str, lag: int) -> None:
        """A node starts (or restarts: a new incarnation, nothing served), its stores as it left them."""
        old = self.nodes.get(name)
        applied = (
            dict(old.applied) if old is not None else {p: max(0, s - lag) for p, s in self.stream.items()}
        )
        self.nodes[name] = NodeInfo(name, f"i{next(self.incarnations)}", f"http://{name}", 1, applied)

    @rule(name=st.sampled_from(NAMES))
    def die(self, name: str) -> None:
        if len(self.nodes) > 1:  # with nobody alive the plan is empty: nothing to check
            self.nodes.pop(name, None)

    @rule(seconds=st.sampled_from([0.0, 0.5, 3.0, PROMOTION_GRACE + 1]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(partition=st.integers(0, PARTITIONS - 1), to=st.sampled_from(NAMES))
    def move(self, partition: int, to: str) -> None:
        self.moves.setdefault(partition, to)

    @rule(
        promoted=st.lists(st.booleans(), min_size=PARTITIONS, max_size=PARTITIONS), progress=st.integers(0, 3)
    )
    def nodes_act(self, promoted: list[bool], progress: int) -> None:
        for name, info in list(self.nodes.items()):
            serving = set(info.serving)
            applied = dict(info.applied)
            for partition in range(PARTITIONS):
                a = self.assignments.get(partition)
                mine = a is not None and a.node == name and a.incarnation == info.incarnation
                target = self.moves.get(partition)
                leaving = target is not None and target != name and target in self.nodes
                if partition in serving and (not mine or (leaving and self._close(target, partition))):
                    serving.discard(partition)
                elif mine and not leaving and promoted[partition]:
                    applied[partition] = self.stream[partition] = self.stream[partition] + 1  # its marker
                    serving.add(partition)
                if partition in serving:
                    self.stream[partition] += progress  # it appends
                    applied[partition] = self.stream[partition]
                else:
                    applied[partition] = min(self.stream[partition], applied.get(partition, 0) + progress)
            self.nodes[name] = NodeInfo(name, info.incarnation, info.url, 1, applied, frozenset(serving))

    def _close(self, target: str | None, partition: int) -> bool:
        assert target is not None
        return self.stream[partition] - self.nodes[target].applied.get(partition, 0) <= 2

    @rule()
    def master_decides(self) -> None:
        changes = plan(PARTITIONS, self.assignments, self.nodes, self.now, self.moves)
        for change in changes:
            assert change.node in self.nodes and self.nodes[change.node].incarnation == change.incarnation
            assert change.epoch > self.epochs.get(change.partition, 0), (change, self.epochs)
            assert change.assigned_at == self.now
            self.epochs[change.partition] = change.epoch
            event(f"plan: {change.reason if change.reason in ('moved', 'first owner') else 'failover'}")
            self.assignments[change.partition] = change
        for partition, target in list(self.moves.items()):
            current = self.assignments.get(partition)
            if current is not None and current.node == target:
                del self.moves[partition]
        if not changes:
            self.moves.update(rebalance(PARTITIONS, self.assignments, self.nodes, self.moves))
        self._check_owned()

    def _check_owned(self) -> None:
        """Right after the master's decision: every partition has one owner, alive in its incarnation and
        serving or within its grace; or is being handed over between two live nodes (a planned move)."""
        for partition in range(PARTITIONS):
            assignment = self.assignments.get(partition)
            assert assignment is not None, f"partition {partition} has no owner"
            if owner_is_live(assignment, self.nodes, self.now):
                continue
            owner = self.nodes.get(assignment.node)
            target = self.moves.get(partition)
            assert (
                owner is not None
                and owner.incarnation == assignment.incarnation
                and target is not None
                and target in self.nodes
            ), f"partition {partition}: owner {assignment} is not live ({self.nodes}, moves {self.moves})"

    @invariant()
    def one_node_serves_each_partition(self) -> None:
        for partition in range(PARTITIONS):
            servers = [name for name, info in self.nodes.items() if partition in info.serving]
            assert len(servers) <= 1, (partition, servers)
            if servers:
                assignment, server = self.assignments[partition], self.nodes[servers[0]]
                assert (assignment.node, assignment.incarnation) == (server.node, server.incarnation)


TestOwnership = Ownership.TestCase
TestOwnership.settings = settings(max_examples=150, stateful_step_count=40, deadline=None, derandomize=True)
