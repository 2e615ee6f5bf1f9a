"""State transfer in the core (machine.handover), sans-I/O with a fake clock: groups held while they move,
the donor asked for their state, the state handed to the next claimer and dropped once used, the donor's
claim waited for, the timeout under both policies, the size bounds and a restart with a transfer pending."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import Clock, ack, ids, make_core, send_group

from queue_core.machine import InvalidArgument, QueueCore, TooLarge
from queue_core.machine.effects import GroupEvent, HandoverSaved
from queue_core.machine.handover import MAX_GROUP_STATE
from queue_core.store import SqliteStore

TIMEOUT = 5.0


def events(core: QueueCore) -> list[tuple[str, str]]:
    return [(e.group, e.event) for e in core.drain_effects() if isinstance(e, GroupEvent)]


def core_with(clock: Clock, policy: str = "proceed") -> QueueCore:
    core = make_core(attributes={"handover_timeout": TIMEOUT, "handover_policy": policy}, now=clock.now)
    send_group(core, "q", clock.now, "g", ["g1", "g2", "g3"])
    send_group(core, "q", clock.now, "h", ["h1"])
    return core


def test_a_moved_group_is_held_until_its_state_arrives_then_the_next_claimer_gets_it() -> None:
    clock = Clock()
    core = core_with(clock)
    first = core.receive("q", 1, 10.0, "w1", clock.advance(1))
    assert ids(first) == ["g1"]
    ack(core, "q", first, clock.advance(1))
    marked, already = core.hand_over("q", ["g"], "w1", clock.advance(1))
    assert (marked, already) == (["g"], [])
    assert ("g", "handover") in events(core)

    # Held: nobody gets g, other groups go on; only the donor is asked for g's state.
    assert ids(core.receive("q", 10, 10.0, "w2", clock.advance(1))) == ["h1"]
    assert core.export_requests("q", "w2") == []
    assert core.export_requests("q", "w1") == ["g"]
    assert core.put_state("q", "w2", {"g": {"count": 99}}, clock.now) == {"g": "not_requested"}
    assert core.put_state("q", "w1", {"g": {"count": 1}}, clock.advance(1)) == {"g": "ok"}
    assert core.export_requests("q", "w1") == []

    # The next claimer (whoever it is) gets the state with the group; a lapse hands it on again.
    taken = core.receive("q", 1, 2.0, "w3", clock.advance(1))
    assert ids(taken) == ["g2"]
    assert core.take_states("q", taken) == {"g": {"count": 1}}
    retaken = core.receive("q", 1, 10.0, "w2", clock.advance(3))
    assert ids(retaken) == ["g2"]
    assert core.take_states("q", retaken) == {"g": {"count": 1}}
    core.drain_effects()
    ack(core, "q", retaken, clock.advance(1))
    assert HandoverSaved(core.queue("q").qid, "g", None) in core.drain_effects()  # used: dropped
    after = core.receive("q", 1, 10.0, "w2", clock.advance(1))
    assert ids(after) == ["g3"]
    assert core.take_states("q", after) == {}


def test_a_group_claimed_by_the_donor_moves_only_after_that_claim_and_the_timeout_starts_then() -> None:
    clock = Clock()
    core = core_with(clock)
    busy = core.receive("q", 2, 60.0, "w1", clock.advance(1))
    assert ids(busy) == ["g1", "g2"]
    core.hand_over("q", ["g"], "w1", clock.advance(1))
    assert core.export_requests("q", "w1") == []  # the batch is not done: its state is not final
    assert core.put_state("q", "w1", {"g": {"n": 1}}, clock.now) == {"g": "not_requested"}
    clock.advance(3 * TIMEOUT)  # longer than the timeout: it has not started yet
    core.handle_timer(clock.now)
    assert core.handovers("q", clock.now)[0]["phase"] == "draining"
    ack(core, "q", busy, clock.now)  # the batch is done
    assert core.export_requests("q", "w1") == ["g"]
    assert ids(core.receive("q", 10, 10.0, "w2", clock.advance(TIMEOUT - 0.5))) == ["h1"]  # still held
    assert core.put_state("q", "w1", {"g": {"n": 2}}, clock.now) == {"g": "ok"}
    got = core.receive("q", 10, 10.0, "w2", clock.advance(0.1))
    assert ids(got) == ["g3"]
    assert core.take_states("q", got) == {"g": {"n": 2}}


def test_the_donor_gone_policy_proceed_delivers_without_state_after_the_timeout() -> None:
    clock = Clock()
    core = core_with(clock)
    core.hand_over("q", ["g"], "w1", clock.advance(1))
    events(core)
    assert core.next_deadline() == pytest.approx(clock.now + TIMEOUT)
    assert ids(core.receive("q", 10, 10.0, "w2", clock.advance(TIMEOUT - 0.01))) == ["h1"]
    clock.advance(0.02)
    core.handle_timer(clock.now)
    assert ("g", "handover-timeout") in events(core)
    got = core.receive("q", 10, 10.0, "w2", clock.now)
    assert ids(got) == ["g1", "g2", "g3"]
    assert core.take_states("q", got) == {}
    assert core.handovers("q", clock.now) == []


def test_the_donor_gone_policy_wait_holds_until_an_operator_releases_or_the_state_comes() -> None:
    clock = Clock()
    core = core_with(clock, policy="wait")
    send_group(core, "q", clock.now, "k", ["k1"])
    core.hand_over("q", ["g", "k"], "w1", clock.advance(1))
    clock.advance(TIMEOUT + 1)
    core.handle_timer(clock.now)
    assert {("g", "handover-wait"), ("k", "handover-wait")} <= set(events(core))
    assert ids(core.receive("q", 10, 10.0, "w2", clock.advance(100))) == ["h1"]  # held, however long
    assert core.export_requests("q", "w1") == ["g", "k"]  # the donor may still come back
    assert core.release_handover("q", ["g", "nope"], clock.now) == ["g"]
    assert ("g", "handover-release") in events(core)
    assert ids(core.receive("q", 10, 10.0, "w2", clock.advance(1))) == ["g1", "g2", "g3"]
    assert core.put_state("q", "w1", {"k": {"late": True}}, clock.now) == {"k": "ok"}
    got = core.receive("q", 10, 10.0, "w3", clock.advance(1))
    assert core.take_states("q", got) == {"k": {"late": True}}


def test_all_moves_the_groups_whose_newest_claim_went_to_the_donor_and_a_policy_may_override() -> None:
    clock = Clock()
    core = core_with(clock)
    mine = core.receive("q", 1, 10.0, "w1", clock.advance(1))
    ack(core, "q", mine, clock.advance(1))
    marked, _ = core.hand_over("q", None, "w1", clock.advance(1), policy="wait")
    assert marked == ["g"]
    assert core.handovers("q", clock.now)[0]["policy"] == "wait"
    assert core.hand_over("q", ["g", "h"], "w2", clock.now) == (["h"], ["g"])


def test_bad_input_and_the_size_bound_are_refused_naming_the_group() -> None:
    clock = Clock()
    core = core_with(clock)
    core.hand_over("q", ["g"], "w1", clock.advance(1))
    with pytest.raises(InvalidArgument) as bad:
        core.put_state("q", "w1", {"g": [1, 2]}, clock.now)
    assert bad.value.details["field"] == "g"
    with pytest.raises(TooLarge) as big:
        core.put_state("q", "w1", {"g": {"blob": "x" * MAX_GROUP_STATE}}, clock.now)
    assert big.value.details["field"] == "g" and "over" in big.value.message
    with pytest.raises(InvalidArgument):
        core.hand_over("q", ["g"], "w1", clock.now, policy="later")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        core.set_attributes("q", {"handover_policy": "maybe"}, clock.now)
    with pytest.raises(InvalidArgument):
        core.set_attributes("q", {"handover_timeout": -1}, clock.now)
    assert core.handovers("q", clock.now)[0]["phase"] == "awaiting"  # nothing changed


def test_a_transfer_pending_and_a_state_kept_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path / "q.sqlite3")
    epoch, snapshot = store.open(clock.now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, clock.now)
    core.create_queue("q", clock.now, {"handover_timeout": TIMEOUT})
    send_group(core, "q", clock.now, "g", ["g1"])
    send_group(core, "q", clock.now, "p", ["p1"])
    core.hand_over("q", ["g", "p"], "w1", clock.advance(1))
    core.put_state("q", "w1", {"g": {"sum": 41}}, clock.advance(1))
    store.apply(core.drain_effects())
    store.close()

    epoch, snapshot = store.open(clock.advance(1))
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, clock.now)
    assert core.export_requests("q", "w1") == ["p"]  # still awaiting, its deadline kept
    got = core.receive("q", 10, 10.0, "w2", clock.now)
    assert ids(got) == ["g1"]
    assert core.take_states("q", got) == {"g": {"sum": 41}}
    clock.advance(TIMEOUT)
    core.handle_timer(clock.now)
    assert ids(core.receive("q", 10, 10.0, "w2", clock.now)) == ["p1"]
    store.close()
