"""Fairness in a queue shared by tenants (queue_core/machine/scheduling.py, docs/protections.md): tenants
take turns, per-tenant and per-group in-flight caps, shuffle-sharding onto worker pools, and sidelining of
excess or old traffic into a spillover lane that is served once the live lane is caught up.

The sans-I/O core with a fake clock, a hypothesis property over random mixes (per-group order, nothing
lost, caps held, everything delivered in the end), and the real SQLite store across a restart.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import T0, ack, ids, make_core, send

from queue_core.machine import Delivery, InvalidArgument, QueueCore, SendRequest, SendResult
from queue_core.machine.scheduling import pool_of_worker, pools_of, tenant_of
from queue_core.store import SqliteStore

SHARED = {"tenant_separator": ":"}


def flood(core: QueueCore, now: float, tenant: str, groups: int, per_group: int = 1) -> list[str]:
    sent = []
    for g in range(groups):
        for m in range(per_group):
            message_id = f"{tenant}-{g}-{m}"
            send(core, "q", now, (message_id, f"{tenant}:g{g}"))
            sent.append(message_id)
    return sent


def one_at_a_time(core: QueueCore, now: float, count: int, worker: str = "w") -> list[str]:
    """`count` receives of one message each, every claim acknowledged at once."""
    out: list[str] = []
    for _ in range(count):
        got = core.receive("q", 1, 30.0, worker, now)
        if not got:
            break
        ack(core, "q", got, now)
        out.extend(ids(got))
    return out


# ---------------------------------------------------------------------------------------- turns
def test_a_quiet_tenant_is_not_pushed_back_behind_a_flooding_tenant() -> None:
    core = make_core(attributes=SHARED)
    flood(core, T0, "a", groups=100)
    send(core, "q", T0 + 1, ("b-0", "b:orders"))
    order = one_at_a_time(core, T0 + 2, 3)
    assert order[:2] == ["a-0-0", "b-0"]  # b's turn comes right after a's first, not after 100 of a's

    plain = make_core()  # without tenants: the SQS FIFO rule, oldest head first
    flood(plain, T0, "a", groups=100)
    send(plain, "q", T0 + 1, ("b-0", "b:orders"))
    assert one_at_a_time(plain, T0 + 2, 101)[-1] == "b-0"


def test_tenants_take_turns_and_each_tenants_groups_go_oldest_first() -> None:
    core = make_core(attributes=SHARED)
    send(core, "q", T0, ("a1", "a:x"), ("a2", "a:y"), ("a3", "a:z"))
    send(core, "q", T0 + 1, ("b1", "b:x"), ("b2", "b:y"))
    send(core, "q", T0 + 2, ("c1", "c"))  # no separator: the whole name is the tenant
    assert one_at_a_time(core, T0 + 3, 10) == ["a1", "b1", "c1", "a2", "b2", "a3"]
    assert tenant_of("acme:order-7", ":") == "acme" and tenant_of("acme", ":") == "acme"
    assert tenant_of("acme:order-7", "") == ""


# ----------------------------------------------------------------------------------------- caps
def test_the_group_cap_bounds_the_messages_of_one_group_in_one_claim() -> None:
    core = make_core(attributes={"group_in_flight": 2})
    send(core, "q", T0, *[(f"m{i}", "g") for i in range(5)], ("h0", "h"))
    got = core.receive("q", 10, 30.0, "w", T0)
    assert ids(got) == ["m0", "m1", "h0"]  # the batch goes on to the next group at the cap
    ack(core, "q", got, T0)
    assert ids(core.receive("q", 10, 30.0, "w", T0)) == ["m2", "m3"]


def test_a_tenant_at_its_concurrency_cap_waits_while_others_are_served() -> None:
    core = make_core(attributes={**SHARED, "tenant_concurrency": 2})
    flood(core, T0, "a", groups=5)
    send(core, "q", T0 + 1, ("b-0", "b:1"), ("b-1", "b:2"))
    claims = [core.receive("q", 1, 30.0, f"w{i}", T0 + 2) for i in range(6)]
    assert [ids(c) for c in claims] == [["a-0-0"], ["b-0"], ["a-1-0"], ["b-1"], [], []]
    assert core.queue("q").scheduler is not None
    ack(core, "q", claims[0], T0 + 3)  # one of a's claims ends: a has a free slot again
    assert ids(core.receive("q", 1, 30.0, "w9", T0 + 3)) == ["a-2-0"]
    assert core.receive("q", 1, 30.0, "w9", T0 + 3) == []
    core.handle_timer(T0 + 40)  # the other claims run out (a lapse ends a claim as well as an ack)
    again = ids(core.receive("q", 10, 30.0, "w9", T0 + 40))
    assert sorted(again) == ["a-1-0", "a-2-0", "b-0", "b-1"]  # a's third group waits: a holds 2 again


def test_a_capped_tenant_whose_claimed_group_leaves_whole_is_served_again() -> None:
    core = make_core("dlq")
    core.create_queue(
        "q",
        T0,
        {
            **SHARED,
            "tenant_concurrency": 1,
            "ttl": 10,
            "on_expiry": "dead_letter",
            "dead_letter_queue": "dlq",
        },
    )
    send(core, "q", T0, ("a-1", "a:1"))
    send(core, "q", T0 + 8, ("a-2", "a:2"))
    assert ids(core.receive("q", 1, 60.0, "w", T0 + 9)) == ["a-1"]
    assert core.receive("q", 1, 60.0, "w", T0 + 9) == []  # a is at its cap
    core.handle_timer(T0 + 11)  # a:1 expires while claimed and goes, whole, to the dead-letter queue
    assert list(core.queue("dlq").by_id) == ["a-1"]
    assert ids(core.receive("q", 1, 60.0, "w", T0 + 11)) == ["a-2"]


# ---------------------------------------------------------------------------------------- pools
def test_shuffle_sharding_keeps_a_flooding_tenant_inside_its_own_pools() -> None:
    pools, per_tenant = 8, 2
    attributes = {**SHARED, "worker_pools": pools, "pools_per_tenant": per_tenant}
    core = make_core(attributes=attributes)
    shard_a = pools_of("a", pools, per_tenant)
    shard_b = pools_of("b", pools, per_tenant)
    assert len(set(shard_a)) == per_tenant and shard_a == pools_of("a", pools, per_tenant)
    flood(core, T0, "a", groups=40)
    send(core, "q", T0, ("b-0", "b:1"))
    queue = core.queue("q")
    placed = Counter(g.pool for g in queue.groups.values() if g.name.startswith("a:"))
    assert set(placed) == set(shard_a)  # only a's pools, and spread over both (least loaded first)
    assert max(placed.values()) - min(placed.values()) <= 1
    # One worker per pool, each polling once so every pool counts as served.
    workers = _workers_by_pool(pools)
    outside = next(p for p in shard_b if p not in shard_a)
    for worker in workers.values():
        core.receive("q", 1, 0.0, worker, T0 + 1)  # ttl 0: claimed and released at once
    # b's worker in a pool outside a's shard gets b's message, never a's backlog.
    assert ids(core.receive("q", 10, 30.0, workers[outside], T0 + 2)) == ["b-0"]
    assert core.receive("q", 10, 30.0, workers[outside], T0 + 2) == []
    got = core.receive("q", 1, 30.0, workers[shard_a[0]], T0 + 2)
    assert got and got[0].group.startswith("a:")


def test_a_pool_nobody_polls_is_served_by_the_other_pools() -> None:
    core = make_core(attributes={**SHARED, "worker_pools": 4, "pools_per_tenant": 1})
    (pool,) = pools_of("a", 4, 1)
    other = next(w for p, w in _workers_by_pool(4).items() if p != pool)
    send(core, "q", T0, ("a-0", "a:1"))
    assert ids(core.receive("q", 1, 30.0, other, T0 + 1)) == ["a-0"]  # a's pool has no worker yet


def _workers_by_pool(pools: int) -> dict[int, str]:
    workers: dict[int, str] = {}
    n = 0
    while len(workers) < pools:
        workers.setdefault(pool_of_worker(f"worker-{n}", pools), f"worker-{n}")
        n += 1
    return workers


# ----------------------------------------------------------------------------------- sidelining
def test_old_groups_are_sidelined_whole_and_served_once_the_live_lane_is_caught_up() -> None:
    core = make_core(attributes={"sideline_age": 10})
    send(core, "q", T0, ("old-0", "old"), ("old-1", "old"), ("stale-0", "stale"))
    send(core, "q", T0 + 20, ("new-0", "new"))
    assert one_at_a_time(core, T0 + 20, 1) == ["new-0"]  # fresh work first
    send(core, "q", T0 + 21, ("old-2", "old"), ("new-1", "new"))  # old's new message stays with old
    assert one_at_a_time(core, T0 + 21, 10) == ["new-1", "old-0", "old-1", "stale-0", "old-2"]
    assert core.metrics("q", T0 + 21).sidelined == 2
    send(core, "q", T0 + 22, ("old-3", "old"))  # the group drained: it starts live again
    assert core.queue("q").groups["old"].sidelined is False


def test_sends_over_a_tenants_rate_sideline_its_groups_and_the_others_go_first() -> None:
    core = make_core(attributes={**SHARED, "sideline_rate": 5})
    flood(core, T0, "a", groups=20)  # 20 at once against 5/s: 5 live, 15 sidelined
    send(core, "q", T0 + 0.5, ("b-0", "b:1"))
    queue = core.queue("q")
    assert sum(g.sidelined for g in queue.groups.values()) == 15
    order = one_at_a_time(core, T0 + 1, 30)
    assert order[:6] == ["a-0-0", "b-0", "a-1-0", "a-2-0", "a-3-0", "a-4-0"]
    assert sorted(order) == sorted([*(f"a-{g}-0" for g in range(20)), "b-0"])
    (gauges,) = core.gauges(5, T0 + 1)
    assert gauges.sidelined == 15


def test_a_sidelined_group_keeps_its_order() -> None:
    core = make_core(attributes={**SHARED, "sideline_rate": 2})
    send(core, "q", T0, *[(f"m{i}", "a:g") for i in range(6)])  # the 3rd send sidelines a:g whole
    send(core, "q", T0, ("b0", "b:g"))
    assert core.queue("q").groups["a:g"].sidelined
    assert one_at_a_time(core, T0 + 1, 10) == ["b0", "m0", "m1", "m2", "m3", "m4", "m5"]


# ---------------------------------------------------------------------------- settings, restart
def test_bad_scheduling_settings_are_refused_with_the_field_named() -> None:
    core = make_core()
    for changes, field in (
        ({"tenant_separator": "ab"}, "tenant_separator"),
        ({"tenant_separator": "x"}, "tenant_separator"),
        ({"tenant_concurrency": 3}, "tenant_concurrency"),  # per tenant: needs a separator
        ({"worker_pools": -1}, "worker_pools"),
        ({"tenant_separator": ":", "pools_per_tenant": 0}, "pools_per_tenant"),
        ({"sideline_age": "soon"}, "sideline_age"),
        ({"group_in_flight": 1.5}, "group_in_flight"),
    ):
        with pytest.raises(InvalidArgument) as raised:
            core.set_attributes("q", changes, T0)
        assert raised.value.details.get("field") == field, (changes, raised.value)
    assert core.queue("q").scheduler is None


def test_turning_fairness_on_and_off_reschedules_the_backlog_without_losing_any() -> None:
    core = make_core()
    flood(core, T0, "a", groups=5)
    send(core, "q", T0 + 1, ("b-0", "b:1"))
    core.set_attributes("q", SHARED, T0 + 1)
    assert one_at_a_time(core, T0 + 2, 2) == ["a-0-0", "b-0"]
    core.set_attributes("q", {"tenant_separator": ""}, T0 + 2)
    assert core.queue("q").scheduler is None
    assert one_at_a_time(core, T0 + 2, 10) == ["a-1-0", "a-2-0", "a-3-0", "a-4-0"]


def test_the_schedule_is_rebuilt_after_a_restart(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "q.db")
    epoch, snapshot = store.open(T0)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, T0)
    core.create_queue("q", T0, {**SHARED, "tenant_concurrency": 1, "worker_pools": 2})
    flood(core, T0, "a", groups=3)
    send(core, "q", T0, ("b-0", "b:1"))
    held = core.receive("q", 1, 60.0, "w", T0 + 1)
    store.apply(core.drain_effects())
    store.close()

    epoch, snapshot = store.open(T0 + 2)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, T0 + 2)
    (holder,) = held
    tenant = tenant_of(holder.group, ":")
    got = []
    while batch := core.receive("q", 1, 60.0, "w", T0 + 2):
        got.extend(batch)
    # The restored claim still counts against its tenant's cap: the other tenant gets its turn only.
    assert [tenant_of(d.group, ":") for d in got] == ["b" if tenant == "a" else "a"]
    store.close()


# --------------------------------------------------------------------------------- the property
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from("abc"), st.integers(0, 3), st.integers(1, 3)),
        st.tuples(st.just("receive"), st.integers(1, 4), st.sampled_from(["w1", "w2", "w3"])),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 3.0, 40.0])),
    ),
    max_size=60,
)
SETTINGS = st.fixed_dictionaries(
    {
        "tenant_separator": st.just(":"),
        "tenant_concurrency": st.integers(0, 2),
        "group_in_flight": st.integers(0, 2),
        "worker_pools": st.sampled_from([0, 2, 3]),
        "pools_per_tenant": st.integers(1, 2),
        "sideline_age": st.sampled_from([0.0, 2.0]),
        "sideline_rate": st.sampled_from([0.0, 1.0]),
        "visibility_timeout": st.just(30.0),
    }
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attributes=SETTINGS, ops=OPS)
def test_scheduling_keeps_group_order_loses_nothing_holds_caps_and_delivers_everything(
    attributes: dict[str, Any], ops: list[tuple[Any, ...]]
) -> None:
    core = make_core(attributes=attributes)
    now = T0
    sent: dict[str, list[str]] = defaultdict(list)  # group -> ids in send order
    done: dict[str, list[str]] = defaultdict(list)  # group -> ids acknowledged, in order
    held: list[Delivery] = []
    serial = 0

    def check_claims() -> None:
        queue = core.queue("q")
        claimed = Counter(tenant_of(g.name, ":") for g in queue.groups.values() if g.claimed)
        cap = attributes["tenant_concurrency"]
        assert not cap or max(claimed.values(), default=0) <= cap
        per_group = attributes["group_in_flight"]
        assert not per_group or all(len(g.claimed) <= per_group for g in queue.groups.values())

    def receive(limit: int, worker: str) -> None:
        got = core.receive("q", limit, 30.0, worker, now)
        for delivery in got:
            group = delivery.group
            position = len(done[group]) + sum(1 for h in held if h.group == group)
            assert sent[group][position] == delivery.message_id  # the group's next, never ahead
            held.append(delivery)
        check_claims()

    for op in ops:
        if op[0] == "send":
            _, tenant, group, count = op
            for _ in range(count):
                serial += 1
                name = f"{tenant}:{group}"
                (result,) = core.send("q", [SendRequest(b"x", group=name, message_id=f"m{serial}")], now)
                assert isinstance(result, SendResult)
                sent[name].append(f"m{serial}")
        elif op[0] == "receive":
            receive(op[1], op[2])
        elif op[0] == "ack" and held:
            delivery = held[op[1] % len(held)]
            first = next(h for h in held if h.group == delivery.group)  # in order within the claim
            (outcome,) = core.ack("q", [(first.message_id, first.token)], now)
            if outcome.status == "ok":
                done[first.group].append(first.message_id)
            held.remove(first)
        elif op[0] == "advance":
            now += op[1]
            core.handle_timer(now)
            queued = core.queue("q").by_id
            held = [h for h in held if queued[h.message_id].claim_expires]  # lapsed claims go back
    # Drain: every message still queued comes out, each group in send order (liveness and order).
    for _ in range(500):
        now += 31.0
        core.handle_timer(now)
        held.clear()
        got = core.receive("q", 10, 30.0, "drain", now)
        if not got and not core.queue("q").by_id:
            break
        for delivery in got:
            group = delivery.group
            assert sent[group][len(done[group])] == delivery.message_id
            (outcome,) = core.ack("q", [(delivery.message_id, delivery.token)], now)
            assert outcome.status == "ok"
            done[group].append(delivery.message_id)
    assert dict(done) == {g: ids for g, ids in sent.items() if ids}
    assert not core.queue("q").by_id
