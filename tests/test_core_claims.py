"""Claims, fencing tokens, renew/release, dead-lettering, queue lifecycle and validation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import T0, Clock, ack, ids, make_core, send, send_group, statuses

from queue_core.machine import (
    InvalidArgument,
    QueueCore,
    QueueNotFound,
    SendRequest,
    SendResult,
    TooLarge,
    parse_receipt,
)
from queue_core.machine.effects import (
    ClaimsChanged,
    FloorRaised,
    MessagesClaimed,
    MessagesMoved,
    QueueDropped,
    QueuePurged,
)
from queue_core.store import SqliteStore


# -------------------------------------------------------------------------------------------- tokens
def test_fencing_tokens_strictly_increase_per_claim_and_name_the_receipt() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    send_group(core, "q", clock.now, "h", ["n1"])

    tokens = []
    for _ in range(4):
        batch = core.receive("q", 10, 5.0, "w", clock.advance(1))
        assert ids(batch) == ["m1", "n1"]
        tokens += [d.token for d in batch]
        for d in batch:
            assert parse_receipt(d.receipt) == (d.message_id, d.token)
        clock.advance(5)  # let the claims expire
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)
    assert core.floor("q", "g") == tokens[-2]
    assert core.floor("q", "h") == tokens[-1]


def test_floor_raised_effect_emitted_for_each_claimed_group() -> None:
    clock = Clock()
    core = make_core()
    send(core, "q", clock.now, ("a1", "A"), ("b1", "B"), ("a2", "A"))
    core.drain_effects()

    batch = core.receive("q", 10, None, "worker-7", clock.advance(1))
    effects = core.drain_effects()

    raised = [e for e in effects if isinstance(e, FloorRaised)]
    by_group = {d.group: d.token for d in batch}
    assert sorted((e.group, e.token) for e in raised) == sorted(by_group.items())
    assert all(e.queue == "q" for e in raised)
    assert core.floor("q", "A") == by_group["A"]
    claimed = [e for e in effects if isinstance(e, MessagesClaimed)]
    assert len(claimed) == 1 and claimed[0].worker == "worker-7"
    assert [row.token for row in claimed[0].claims] == [d.token for d in batch]


def test_new_core_with_higher_epoch_issues_larger_tokens() -> None:
    old = make_core()
    send_group(old, "q", T0, "g", ["m1"])
    old_token = old.receive("q", 1, None, "w", T0 + 1)[0].token

    new = QueueCore(epoch=2)
    new.create_queue("q", T0)
    send_group(new, "q", T0, "g", ["m1"])
    new_token = new.receive("q", 1, None, "w", T0 + 1)[0].token

    assert new_token > old_token
    with pytest.raises(ValueError):
        QueueCore(epoch=0)


# ------------------------------------------------------------------------------------- stale claims
def test_stale_ack_renew_release_are_refused_while_the_message_remains() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    old = core.receive("q", 1, 10.0, "slow", clock.advance(1))[0]
    clock.advance(10)  # expires; another worker claims it again
    new = core.receive("q", 1, 10.0, "fast", clock.now)[0]
    assert new.message_id == old.message_id and new.token > old.token

    for outcome in (
        core.ack("q", [("m1", old.token)], clock.advance(1)),
        core.renew("q", [("m1", old.token)], 30.0, clock.now),
        core.renew("q", [("m1", old.token)], 30.0, clock.now, mode="set"),
        core.release("q", [("m1", old.token)], clock.now),
    ):
        assert statuses(outcome) == ["stale_claim"]
        assert "m1" in core.queue("q").by_id
        assert core.metrics("q", clock.now).in_flight == 1  # the newer claim is untouched

    assert statuses(core.ack("q", [("m1", new.token)], clock.advance(1))) == ["ok"]
    assert statuses(core.ack("q", [("m1", new.token)], clock.now)) == ["gone"]


def test_expired_claim_nobody_reclaimed_can_still_be_acked_with_its_token() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1", "m2"])
    batch = core.receive("q", 10, 5.0, "w", clock.advance(1))
    clock.advance(60)
    core.handle_timer(clock.now)
    assert core.metrics("q", clock.now).in_flight == 0

    assert statuses(core.ack("q", [("m1", batch[0].token)], clock.now)) == ["ok"]
    assert ids(core.receive("q", 10, None, "w", clock.advance(1))) == ["m2"]


def test_ack_batch_reports_each_item_on_its_own() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1", "m2"])
    batch = core.receive("q", 10, None, "w", clock.advance(1))
    outcomes = core.ack(
        "q", [("m1", batch[0].token), ("m1", batch[0].token), ("nope", 1), ("m2", 12345)], clock.now
    )
    assert statuses(outcomes) == ["ok", "gone", "gone", "stale_claim"]
    assert list(core.queue("q").by_id) == ["m2"]


# -------------------------------------------------------------------------------------------- renew
def claim_expiry(core: QueueCore, message_id: str) -> float:
    return core.queue("q").by_id[message_id].claim_expires


def test_renew_extend_never_shortens_and_extends_from_now() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    d = core.receive("q", 1, 30.0, "w", clock.now)[0]
    assert d.claim_expires == T0 + 30

    assert statuses(core.renew("q", [("m1", d.token)], 10.0, clock.advance(5))) == ["ok"]
    assert claim_expiry(core, "m1") == T0 + 30  # extend never shortens
    assert statuses(core.renew("q", [("m1", d.token)], 60.0, clock.now)) == ["ok"]
    assert claim_expiry(core, "m1") == T0 + 65
    changed = [e for e in core.drain_effects() if isinstance(e, ClaimsChanged)]
    assert changed[-1].changes == ((d.key, T0 + 65),)

    # Still in flight past the original expiry.
    assert core.receive("q", 10, None, "w", clock.advance(40)) == []
    assert core.metrics("q", clock.now).in_flight == 1
    clock.now = T0 + 65
    assert ids(core.receive("q", 10, None, "w", clock.now)) == ["m1"]


def test_renew_set_may_shorten_and_counts_from_now() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    d = core.receive("q", 1, 300.0, "w", clock.now)[0]

    assert statuses(core.renew("q", [("m1", d.token)], 5.0, clock.advance(1), mode="set")) == ["ok"]
    assert claim_expiry(core, "m1") == T0 + 6
    assert core.receive("q", 10, None, "w", T0 + 5.9) == []
    assert ids(core.receive("q", 10, None, "w", T0 + 6)) == ["m1"]


@pytest.mark.parametrize("mode", ["extend", "set"])
def test_renew_with_ttl_zero_releases_the_claim(mode: str) -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1", "m2"])
    batch = core.receive("q", 10, 300.0, "w", clock.now)

    outcomes = core.renew("q", [(d.message_id, d.token) for d in batch], 0.0, clock.advance(1), mode=mode)
    assert statuses(outcomes) == ["ok", "ok"]
    assert core.metrics("q", clock.now).in_flight == 0
    again = core.receive("q", 10, None, "w", clock.now)
    assert ids(again) == ["m1", "m2"]
    assert [d.receive_count for d in again] == [2, 2]


def test_renew_extend_recreates_an_expired_claim_nobody_superseded() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    d = core.receive("q", 1, 5.0, "w", clock.now)[0]
    clock.advance(10)
    core.handle_timer(clock.now)
    assert core.metrics("q", clock.now).in_flight == 0

    assert statuses(core.renew("q", [("m1", d.token)], 30.0, clock.now)) == ["ok"]
    assert claim_expiry(core, "m1") == clock.now + 30
    assert core.metrics("q", clock.now).in_flight == 1
    assert core.receive("q", 10, None, "other", clock.advance(1)) == []  # claimed again, same token
    assert core.floor("q", "g") == d.token
    assert statuses(core.ack("q", [("m1", d.token)], clock.now)) == ["ok"]


def test_renew_cannot_recreate_a_superseded_claim() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    old = core.receive("q", 1, 5.0, "w", clock.now)[0]
    new = core.receive("q", 1, 5.0, "w", clock.advance(10))[0]
    clock.advance(10)  # the newer claim expires too
    assert statuses(core.renew("q", [("m1", old.token)], 30.0, clock.now)) == ["stale_claim"]
    assert statuses(core.renew("q", [("m1", new.token)], 30.0, clock.now)) == ["ok"]


def test_renew_set_on_expired_claim_is_not_in_flight() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    d = core.receive("q", 1, 5.0, "w", clock.now)[0]
    clock.advance(10)
    assert statuses(core.renew("q", [("m1", d.token)], 30.0, clock.now, mode="set")) == ["not_in_flight"]
    assert core.metrics("q", clock.now).in_flight == 0
    # a never-claimed message is not in flight either
    send_group(core, "q", clock.now, "h", ["n1"])
    assert statuses(core.renew("q", [("n1", None)], 30.0, clock.now, mode="set")) == ["not_in_flight"]
    assert statuses(core.renew("q", [("nope", None)], 30.0, clock.now)) == ["gone"]


def test_renew_rejects_out_of_range_ttl() -> None:
    core = make_core()
    send_group(core, "q", T0, "g", ["m1"])
    d = core.receive("q", 1, None, "w", T0)[0]
    for ttl in (-1.0, 12 * 3600.0 + 1):
        with pytest.raises(InvalidArgument):
            core.renew("q", [("m1", d.token)], ttl, T0)


# ---------------------------------------------------------------------------- receive count, release
def test_receive_count_increments_and_first_receive_time_is_kept() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    seen = []
    for _ in range(3):
        d = core.receive("q", 1, 5.0, "w", clock.advance(1))[0]
        seen.append((d.receive_count, d.first_receive_at))
        clock.advance(5)
    assert seen == [(1, T0 + 1), (2, T0 + 1), (3, T0 + 1)]


def test_release_puts_messages_back_at_the_head_of_their_group() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1", "m2", "m3"])
    batch = core.receive("q", 2, None, "w", clock.advance(1))

    outcomes = core.release("q", [(d.message_id, d.token) for d in batch], clock.advance(1))
    assert statuses(outcomes) == ["ok", "ok"]
    again = core.receive("q", 10, None, "w", clock.advance(1))
    assert ids(again) == ["m1", "m2", "m3"]
    assert [d.receive_count for d in again] == [2, 2, 1]


def test_partial_release_keeps_the_group_blocked_until_the_claim_ends() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1", "m2", "m3"])
    batch = core.receive("q", 2, None, "w", clock.advance(1))

    assert statuses(core.release("q", [("m2", batch[1].token)], clock.advance(1))) == ["ok"]
    assert core.receive("q", 10, None, "w", clock.advance(1)) == []  # m1 is still in flight
    ack(core, "q", batch[:1], clock.advance(1))
    assert ids(core.receive("q", 10, None, "w", clock.advance(1))) == ["m2", "m3"]


def test_release_with_the_same_item_twice_is_handled_per_item() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    d = core.receive("q", 1, None, "w", clock.now)[0]
    outcomes = core.release("q", [("m1", d.token), ("m1", d.token)], clock.advance(1))
    assert statuses(outcomes) == ["ok", "ok"]
    assert core.metrics("q", clock.now).in_flight == 0
    again = core.receive("q", 10, None, "w", clock.now)
    assert ids(again) == ["m1"] and again[0].receive_count == 2


def test_release_answers_each_item_by_its_own_token() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    old = core.receive("q", 1, 5.0, "w", clock.now)[0]
    new = core.receive("q", 1, 5.0, "w", clock.advance(10))[0]
    outcomes = core.release("q", [("m1", old.token), ("m1", new.token)], clock.advance(1))
    # as ack does: the stale item is refused, the current one applies
    assert statuses(outcomes) == ["stale_claim", "ok"]
    assert core.metrics("q", clock.now).in_flight == 0


def test_unclaim_all_returns_every_claim_and_order_is_kept() -> None:
    clock = Clock()
    core = make_core()
    send(core, "q", clock.now, ("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"))
    core.receive("q", 10, 300.0, "w", clock.advance(1))
    core.drain_effects()

    assert core.unclaim_all("q", clock.advance(1)) == 4
    changed = [e for e in core.drain_effects() if isinstance(e, ClaimsChanged)]
    assert len(changed) == 1
    assert {exp for _, exp in changed[0].changes} == {clock.now}
    metrics = core.metrics("q", clock.now)
    assert (metrics.in_flight, metrics.visible) == (0, 4)
    assert ids(core.receive("q", 10, None, "w", clock.now)) == ["a1", "a2", "b1", "b2"]
    assert core.unclaim_all("q", clock.now) == 4


# -------------------------------------------------------------------------------------- dead letters
def dlq_core(max_receive_count: int) -> QueueCore:
    core = make_core("q-dlq")
    core.create_queue(
        "q",
        T0,
        {"max_receive_count": max_receive_count, "dead_letter_queue": "q-dlq", "visibility_timeout": 5},
    )
    return core


def test_dead_letter_after_max_receive_count_keeps_group_seq_and_sets_origin() -> None:
    clock = Clock()
    core = dlq_core(2)
    sent = send(core, "q", clock.now, ("m1", "g"), ("m2", "g"))
    for expected_count in (1, 2):
        d = core.receive("q", 1, None, "w", clock.advance(1))[0]
        assert (d.message_id, d.receive_count) == ("m1", expected_count)
        clock.advance(5)
    core.handle_timer(clock.now)
    moved = [e for e in core.drain_effects() if isinstance(e, MessagesMoved)]
    assert moved and moved[-1].origin == "q" and moved[-1].keys == (sent[0].seq,)

    assert "m1" not in core.queue("q").by_id
    assert core.metrics("q", clock.now).dead_lettered == 1
    assert ids(core.receive("q", 10, None, "w", clock.now)) == ["m2"]

    dead = core.receive("q-dlq", 10, None, "w", clock.now)
    assert ids(dead) == ["m1"]
    assert (dead[0].group, dead[0].seq, dead[0].origin) == ("g", sent[0].seq, "q")
    assert dead[0].receive_count == 3


def test_moving_dead_letters_back_restores_group_order() -> None:
    clock = Clock()
    core = dlq_core(1)
    send_group(core, "q", clock.now, "g", ["m1", "m2", "m3"])
    first = core.receive("q", 1, None, "w", clock.advance(1))
    assert statuses(core.release("q", [("m1", first[0].token)], clock.advance(1))) == ["ok"]
    assert list(core.queue("q-dlq").by_id) == ["m1"]

    move = core.start_move("q-dlq", "q", clock.advance(1))
    assert core.next_deadline() == 0.0
    core.handle_timer(clock.now)
    assert core.move_status(move.id).state == "done"
    assert core.move_status(move.id).moved == 1

    assert [m.id for m in core.queue("q").groups["g"].messages] == ["m1", "m2", "m3"]
    again = core.receive("q", 10, None, "w", clock.advance(1))
    assert ids(again) == ["m1", "m2", "m3"]
    assert again[0].token > first[0].token
    assert again[0].seq < again[1].seq < again[2].seq
    # Redriven messages count as new (SQS): their receive count restarts and the origin is cleared, so
    # one more failure does not send them straight back.
    assert (again[0].receive_count, again[0].origin) == (1, None)


def test_redrive_reset_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    store = SqliteStore(tmp_path / "q.sqlite3", clock=lambda: clock.now)
    epoch, snapshot = store.open(clock.now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, clock.now)
    core.create_queue("q-dlq", clock.now)
    core.create_queue("q", clock.now, {"max_receive_count": 1, "dead_letter_queue": "q-dlq"})
    send_group(core, "q", clock.now, "g", ["m1"])
    first = core.receive("q", 1, None, "w", clock.advance(1))
    core.release("q", [("m1", first[0].token)], clock.advance(1))
    core.start_move("q-dlq", "q", clock.now)
    core.handle_timer(clock.now)
    store.apply(core.drain_effects())
    store.close()

    epoch, snapshot = store.open(clock.advance(1))
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, clock.now)
    again = core.receive("q", 1, None, "w", clock.now)
    assert (ids(again), again[0].receive_count, again[0].origin) == (["m1"], 1, None)
    store.close()


# ------------------------------------------------------------------------------------ purge, delete
def test_purge_removes_everything() -> None:
    clock = Clock()
    core = make_core()
    send(core, "q", clock.now, ("a1", "A"), ("b1", "B"), ("c1", "C"))
    core.receive("q", 1, None, "w", clock.advance(1))
    core.drain_effects()

    assert core.purge("q", clock.advance(1)) == 3
    assert any(isinstance(e, QueuePurged) for e in core.drain_effects())
    metrics = core.metrics("q", clock.now)
    assert (metrics.total, metrics.visible, metrics.in_flight, metrics.groups) == (0, 0, 0, 0)
    assert core.receive("q", 10, None, "w", clock.now) == []
    send_group(core, "q", clock.now, "A", ["a2"])
    assert ids(core.receive("q", 10, None, "w", clock.advance(1))) == ["a2"]


def test_purge_with_in_flight_and_delayed_messages_keeps_counters_sane() -> None:
    clock = Clock()
    core = make_core()
    core.send("q", [SendRequest(b"a", group="g"), SendRequest(b"b", group="h", delay=5)], clock.now)
    core.receive("q", 1, 10.0, "w", clock.advance(1))
    core.purge("q", clock.advance(1))
    core.handle_timer(clock.advance(30))
    metrics = core.metrics("q", clock.now)
    assert (metrics.in_flight, metrics.delayed, metrics.visible, metrics.total) == (0, 0, 0, 0)


def test_delete_queue_drops_it() -> None:
    clock = Clock()
    core = make_core()
    send_group(core, "q", clock.now, "g", ["m1"])
    core.drain_effects()
    core.delete_queue("q", clock.now)
    assert any(isinstance(e, QueueDropped) for e in core.drain_effects())
    assert core.list_queues() == []
    with pytest.raises(QueueNotFound):
        core.receive("q", 1, None, "w", clock.now)
    with pytest.raises(QueueNotFound):
        core.send("q", [SendRequest(b"x")], clock.now)
    core.create_queue("q", clock.now)
    assert core.metrics("q", clock.now).total == 0


def test_delete_queue_with_in_flight_claim_and_dlq_then_timer() -> None:
    clock = Clock()
    core = dlq_core(1)
    send_group(core, "q", clock.now, "g", ["m1"])
    core.receive("q", 1, 5.0, "w", clock.now)
    core.delete_queue("q", clock.advance(1))
    core.handle_timer(clock.advance(10))
    assert core.metrics("q-dlq", clock.now).total == 0


# --------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "attributes",
    [
        {"visibility_timeout": -1},
        {"visibility_timeout": 12 * 3600 + 1},
        {"retention": 59},
        {"retention": 14 * 24 * 3600 + 1},
        {"delay": 901},
        {"delay": -0.5},
        {"dedup_window": 24 * 3600 + 1},
        {"max_message_size": 0},
        {"max_message_size": 1024 * 1024 + 1},
        {"max_receive_count": 1001},
        {"max_receive_count": 1.5},
        {"visibility_timeout": "30"},
        {"visibility_timeout": True},
        {"content_based_dedup": 1},
        {"dedup_scope": "partition"},
        {"kind": "stack"},
        {"dead_letter_queue": "bad name!"},
        {"no_such_attribute": 1},
    ],
)
def test_queue_attribute_validation(attributes: dict[str, object]) -> None:
    core = QueueCore()
    with pytest.raises(InvalidArgument):
        core.create_queue("q", T0, attributes)
    assert "q" not in core.queues
    core.create_queue("q", T0)
    with pytest.raises(InvalidArgument):
        core.set_attributes("q", attributes, T0)
    assert core.queue("q").attributes.to_dict() == QueueCore().create_queue("x", T0).attributes.to_dict()


def test_queue_name_validation() -> None:
    core = QueueCore()
    for name in ("", "a" * 129, "has space", "slash/y"):
        with pytest.raises(InvalidArgument):
            core.create_queue(name, T0)
    core.create_queue("a" * 128, T0)


@pytest.mark.parametrize("group", ["x" * 129, "has space", "tab\t", "ümlaut", "", "~auto.1.abc"])
def test_invalid_group_fails_only_its_own_entry(group: str) -> None:
    core = make_core()
    results = core.send("q", [SendRequest(b"bad", group=group), SendRequest(b"good", group="ok")], T0)
    assert isinstance(results[0], InvalidArgument)
    assert results[0].details.get("field") == "group"
    assert isinstance(results[1], SendResult) and results[1].group == "ok"
    assert len(core.queue("q").by_id) == 1


def test_valid_group_edge_cases_are_accepted() -> None:
    core = make_core()
    groups = ["x" * 128, "!#$%&()*+,-./:;<=>?@[]^_`{|}~", "~auto", "a~auto."]
    results = core.send("q", [SendRequest(b"b", group=g) for g in groups], T0)
    assert [r.group for r in results if isinstance(r, SendResult)] == groups


def test_too_large_body_is_refused_per_entry() -> None:
    core = make_core(attributes={"max_message_size": 10})
    results = core.send("q", [SendRequest(b"x" * 11, group="g"), SendRequest(b"x" * 10, group="g")], T0)
    assert isinstance(results[0], TooLarge)
    assert results[0].details == {"size": 11, "limit": 10}
    assert isinstance(results[1], SendResult)
    assert core.metrics("q", T0).total == 1


def test_receive_argument_validation() -> None:
    core = make_core()
    for limit in (0, 1001, True, 2.0):
        with pytest.raises(InvalidArgument):
            core.receive("q", limit, None, "w", T0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        core.receive("q", 1, -1.0, "w", T0)


# ------------------------------------------------------------------------------------------ restarts
@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(tmp_path / "queue.db")
    yield store
    store.close()


def open_core(store: SqliteStore, now: float) -> QueueCore:
    """A restart: close the store, reopen it (bumping the epoch) and restore a fresh core from it."""
    store.close()
    epoch, snapshot = store.open(now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, now)
    return core


def test_restart_keeps_claims_with_their_expiry_and_tokens_keep_rising(store: SqliteStore) -> None:
    clock = Clock()
    core = open_core(store, clock.now)
    core.create_queue("q", clock.now)
    send(core, "q", clock.now, ("a1", "A"), ("a2", "A"), ("b1", "B"))
    claim = core.receive("q", 2, 30.0, "w", clock.advance(1))
    store.apply(core.drain_effects())

    core = open_core(store, clock.advance(1))
    assert core.epoch == 2
    assert core.metrics("q", clock.now).in_flight == 2
    assert claim_expiry(core, "a1") == claim[0].claim_expires
    after = core.receive("q", 10, 30.0, "w", clock.now)
    assert ids(after) == ["b1"]
    assert after[0].token > max(d.token for d in claim)
    assert statuses(core.ack("q", [(d.message_id, d.token) for d in claim], clock.now)) == ["ok", "ok"]


def test_restart_with_claim_rows_of_different_expiries_expires_them_all(store: SqliteStore) -> None:
    clock = Clock()
    core = open_core(store, clock.now)
    core.create_queue("q", clock.now)
    send_group(core, "q", clock.now, "g", ["m1", "m2"])
    batch = core.receive("q", 10, 10.0, "w", clock.advance(1))
    core.renew("q", [("m2", batch[1].token)], 100.0, clock.advance(1))
    store.apply(core.drain_effects())

    core = open_core(store, clock.advance(1))
    core.handle_timer(clock.advance(50))  # m1's row expires here, m2's row is still live
    assert core.metrics("q", clock.now).in_flight == 1
    core.handle_timer(clock.advance(200))  # now m2's row is long expired too
    assert core.metrics("q", clock.now).in_flight == 0
    assert ids(core.receive("q", 10, None, "w", clock.now)) == ["m1", "m2"]


def test_restart_keeps_stale_tokens_stale(store: SqliteStore) -> None:
    clock = Clock()
    core = open_core(store, clock.now)
    core.create_queue("q", clock.now)
    send_group(core, "q", clock.now, "g", ["m1", "m2"])
    old = core.receive("q", 10, 5.0, "slow", clock.advance(1))  # claim t1 on m1, m2
    clock.advance(10)
    new = core.receive("q", 1, 5.0, "fast", clock.now)  # claim t2 on m1 only
    ack(core, "q", new, clock.advance(1))
    assert statuses(core.renew("q", [("m2", old[1].token)], 30.0, clock.now)) == ["stale_claim"]
    store.apply(core.drain_effects())

    core = open_core(store, clock.advance(1))
    assert statuses(core.renew("q", [("m2", old[1].token)], 30.0, clock.now)) == ["stale_claim"]


def test_restart_never_reuses_the_key_or_id_of_a_deleted_message(store: SqliteStore) -> None:
    core = open_core(store, T0)
    core.create_queue("q", T0)
    first = core.send("q", [SendRequest(b"1", group="g"), SendRequest(b"2", group="g", dedup_id="d")], T0)
    last = first[1]
    assert isinstance(last, SendResult)
    assert statuses(core.ack("q", [(last.message_id, None)], T0)) == ["ok"]
    store.apply(core.drain_effects())

    core = open_core(store, T0)  # same millisecond (or a wall clock stepped back)
    (fresh,) = core.send("q", [SendRequest(b"3", group="g")], T0)
    assert isinstance(fresh, SendResult)
    assert fresh.seq > last.seq
    assert fresh.message_id != last.message_id
