"""Group routing (queue_core/machine/routing.py, docs/rollouts.md): pins of group ranges to workers and a
rollout's canary share by worker version, in the sans-I/O core with a fake clock, a hypothesis property
(a pinned range never leaves its workers, order and nothing lost), and the real SQLite store across a
restart."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import T0, ack, ids, make_core, send

from queue_core.machine import InvalidArgument, QueueCore
from queue_core.machine.routing import BUCKETS, bucket_of, in_share, parse_routing
from queue_core.store import SqliteStore


def route(core: QueueCore, routing: dict[str, Any] | None) -> None:
    core.set_attributes("q", {"routing": routing}, T0)


def drain(core: QueueCore, worker: str, now: float, version: str = "", limit: int = 10) -> list[str]:
    """Everything `worker` can receive now, each claim acknowledged at once."""
    out: list[str] = []
    for _ in range(1000):
        got = core.receive("q", limit, 30.0, worker, now, version)
        if not got:
            return out
        ack(core, "q", got, now)
        out.extend(ids(got))
    raise AssertionError("drain did not end")


def test_a_pinned_prefix_goes_only_to_its_workers_and_the_rest_to_everyone() -> None:
    core = make_core()
    send(core, "q", T0, ("acme-1", "acme:a"), ("acme-2", "acme:b"), ("other-1", "other"), ("plain-1", "p"))
    route(core, {"pins": [{"name": "acme", "prefix": "acme:", "workers": ["w-acme"]}]})
    assert drain(core, "w-any", T0) == ["other-1", "plain-1"]  # acme's groups wait for their worker
    assert drain(core, "w-acme", T0) == ["acme-1", "acme-2"]


def test_an_exclusive_pin_keeps_its_workers_for_its_groups_only() -> None:
    core = make_core()
    send(core, "q", T0, ("o1", "other"), ("s1", "secret:x"))
    shared = {"name": "secret", "prefix": "secret:", "workers": ["dedicated"]}
    route(core, {"pins": [shared]})
    assert drain(core, "dedicated", T0) == ["o1", "s1"]  # not exclusive: it helps with the rest too
    send(core, "q", T0 + 1, ("o2", "other"), ("s2", "secret:x"))
    route(core, {"pins": [{**shared, "exclusive": True}]})
    assert drain(core, "dedicated", T0 + 1) == ["s2"]
    assert drain(core, "anyone", T0 + 1) == ["o2"]


def test_a_bucket_range_pin_takes_exactly_the_groups_hashed_into_it() -> None:
    groups = [f"g{i}" for i in range(200)]
    low = [g for g in groups if bucket_of(g) < BUCKETS // 4]
    core = make_core()
    send(core, "q", T0, *[(f"m-{g}", g) for g in groups])
    route(core, {"pins": [{"name": "q1", "buckets": [0, BUCKETS // 4], "workers": ["w1"]}]})
    taken = drain(core, "w1", T0)
    assert set(taken) >= {f"m-{g}" for g in low}
    rest = drain(core, "w2", T0)
    assert not set(rest) & {f"m-{g}" for g in low} and len(taken) + len(rest) == 200


def test_the_canary_version_takes_its_share_and_nothing_else() -> None:
    groups = [f"g{i}" for i in range(400)]
    core = make_core()
    send(core, "q", T0, *[(f"m-{g}", g) for g in groups])
    route(core, {"canary": {"version": "2.0", "percent": 10}})
    canary = drain(core, "new", T0, version="2.0")
    share = {f"m-{g}" for g in groups if in_share(g, 10)}
    assert set(canary) == share and 20 < len(share) < 60  # about 10 % of 400
    assert set(drain(core, "old", T0, version="1.0")) == {f"m-{g}" for g in groups} - share
    # At 100 % the old version gets nothing; without a canary everyone gets everything again.
    send(core, "q", T0 + 1, ("late", "g1"))
    route(core, {"canary": {"version": "2.0", "percent": 100}})
    assert drain(core, "old", T0 + 1, version="1.0") == []
    route(core, None)
    assert drain(core, "old", T0 + 1, version="1.0") == ["late"]


def test_with_a_baseline_a_third_version_takes_nothing() -> None:
    core = make_core()
    send(core, "q", T0, *[(f"m{i}", f"g{i}") for i in range(50)])
    route(core, {"canary": {"version": "2.0", "percent": 0, "baseline": ["1.0", ""]}})
    assert drain(core, "next", T0, version="3.0") == []  # neither the canary nor the baseline
    assert len(drain(core, "canary", T0, version="2.0")) == 0  # a share of nothing
    assert len(drain(core, "plain", T0)) == 50  # unversioned workers are in this baseline


def test_the_share_only_grows_with_the_percentage() -> None:
    groups = [f"group-{i}" for i in range(2000)]
    previous: set[str] = set()
    for percent in (1, 2, 5, 25, 100):
        share = {g for g in groups if in_share(g, percent)}
        assert previous <= share
        previous = share
    assert previous == set(groups)


def test_a_group_keeps_its_order_when_its_route_changes_mid_claim() -> None:
    core = make_core()
    send(core, "q", T0, ("a1", "g"), ("a2", "g"), ("a3", "g"))
    first = core.receive("q", 1, 30.0, "w1", T0)
    assert ids(first) == ["a1"]
    route(core, {"pins": [{"name": "p", "prefix": "g", "workers": ["w2"]}]})
    assert core.receive("q", 10, 30.0, "w2", T0) == []  # still claimed by w1: one at a time
    ack(core, "q", first, T0)
    assert drain(core, "w1", T0) == []
    assert drain(core, "w2", T0) == ["a2", "a3"]


@pytest.mark.parametrize(
    ("routing", "field"),
    [
        ([1], "routing"),
        ({"pins": [{"name": "x", "workers": ["w"]}]}, "routing.pins[0]"),
        ({"pins": [{"name": "x", "prefix": "a", "workers": []}]}, "routing.pins[0].workers"),
        ({"pins": [{"name": "x", "buckets": [5, 5], "workers": ["w"]}]}, "routing.pins[0].buckets"),
        ({"canary": {"version": "2", "percent": 101}}, "routing.canary.percent"),
        ({"canary": {"version": "", "percent": 1}}, "routing.canary.version"),
        ({"canary": {"version": "2", "percent": 1, "baseline": ["2"]}}, "routing.canary.baseline"),
        ({"pins": [], "colour": 1}, "routing"),
    ],
)
def test_bad_routing_is_refused_naming_the_field(routing: Any, field: str) -> None:
    core = make_core()
    with pytest.raises(InvalidArgument) as caught:
        route(core, routing)
    assert caught.value.details.get("field") == field, caught.value


def test_routing_and_tenant_fairness_are_not_combined_yet() -> None:
    core = make_core(attributes={"tenant_separator": ":"})
    with pytest.raises(InvalidArgument, match="cannot be combined"):
        route(core, {"canary": {"version": "2", "percent": 5}})
    assert parse_routing(None).route_of("anything") == ""


def test_routing_survives_a_restart_on_the_real_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "q.db")
    epoch, snapshot = store.open(T0)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, T0)
    core.create_queue("q", T0, None)
    send(core, "q", T0, ("a1", "acme:x"), ("o1", "other"))
    route(core, {"pins": [{"name": "acme", "prefix": "acme:", "workers": ["w-acme"], "exclusive": True}]})
    store.apply(core.drain_effects())
    store.close()

    epoch, snapshot = store.open(T0 + 1)
    again = QueueCore(epoch=epoch)
    again.restore(snapshot, T0 + 1)
    assert drain(again, "w-other", T0 + 1) == ["o1"]  # acme's group waits for its dedicated worker
    assert drain(again, "w-acme", T0 + 1) == ["a1"]
    store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sends=st.lists(
        st.sampled_from([f"t{t}:g{g}" for t in range(3) for g in range(3)]), min_size=1, max_size=40
    ),
    polls=st.lists(
        st.tuples(st.sampled_from(["pinned", "other", "canary"]), st.integers(1, 4), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    percent=st.sampled_from([0, 10, 50, 100]),
)
def test_a_pinned_range_never_leaves_its_workers(
    sends: list[str], polls: list[tuple[str, int, bool]], percent: int
) -> None:
    """Random sends and polls (some claims acknowledged, some left to lapse): tenant t0's groups only ever
    reach the pinned worker, the canary's only its share, each group in send order, nothing lost."""
    core = make_core()
    versions = {"pinned": "1", "other": "1", "canary": "2"}
    route(
        core,
        {
            "pins": [{"name": "t0", "prefix": "t0:", "workers": ["pinned"]}],
            "canary": {"version": "2", "percent": percent},
        },
    )
    now = T0
    expected: dict[str, list[str]] = defaultdict(list)
    for index, group in enumerate(sends):
        send(core, "q", now, (f"m{index}", group))
        expected[group].append(f"m{index}")
    done: dict[str, list[str]] = defaultdict(list)

    def poll(worker: str, limit: int, keep: bool) -> None:
        got = core.receive("q", limit, 5.0, worker, now, versions[worker])
        for delivery in got:
            group = delivery.group or ""
            if group.startswith("t0:"):
                assert worker == "pinned", (worker, group)
            elif in_share(group, percent):
                assert worker == "canary", (worker, group)
            else:
                assert worker != "canary", (worker, group)
        if keep:
            ack(core, "q", got, now)
            for delivery in got:
                done[delivery.group or ""].append(delivery.message_id)

    for worker, limit, keep in polls:
        poll(worker, limit, keep)
        now += 1.0
    now += 10.0  # every unacknowledged claim lapses
    for _ in range(100):
        for worker in versions:
            poll(worker, 10, True)
        if sum(map(len, done.values())) == len(sends):
            break
        now += 60.0  # lapsed claims' retries back off (doubling): let them come due
    assert dict(done) == dict(expected)  # every group complete and in send order


# ------------------------------------------------------------------------------ selection by size
def sized(core: QueueCore, now: float, *items: tuple[str, str, int]) -> None:
    """Send (message id, group, body size) triples."""
    from queue_core.machine import SendRequest

    requests = [SendRequest(body=b"x" * size, group=group, message_id=mid) for mid, group, size in items]
    core.send("q", requests, now)


def test_a_big_message_goes_to_a_worker_that_takes_it_when_one_polls() -> None:
    core = make_core()
    sized(core, T0, ("big", "g1", 5000), ("small", "g2", 10))
    small = core.receive("q", 10, 30.0, "light", T0, max_bytes=1000)
    assert ids(small) == ["big", "small"]  # nobody bigger has polled yet: better than holding it
    core.unclaim_all("q", T0)
    core.receive("q", 1, 30.0, "heavy", T0 + 1, max_bytes=0)  # a worker that takes any size polls
    core.unclaim_all("q", T0 + 1)
    assert ids(core.receive("q", 10, 30.0, "light", T0 + 2, max_bytes=1000)) == ["small"]
    assert ids(core.receive("q", 10, 30.0, "heavy", T0 + 2)) == ["big"]


def test_a_claim_stops_before_a_message_bigger_than_the_worker_takes() -> None:
    core = make_core()
    sized(core, T0, ("a1", "g", 10), ("a2", "g", 10), ("a3", "g", 9000), ("a4", "g", 10))
    core.receive("q", 1, 0.0, "heavy", T0)  # heavy polls (ttl 0: released at once)
    got = core.receive("q", 10, 30.0, "light", T0 + 1, max_bytes=1000)
    assert ids(got) == ["a1", "a2"]  # the group's order is kept: the big one waits for its turn
    ack(core, "q", got, T0 + 1)
    assert core.receive("q", 10, 30.0, "light", T0 + 2, max_bytes=1000) == []
    assert ids(core.receive("q", 10, 30.0, "heavy", T0 + 2)) == ["a3", "a4"]
