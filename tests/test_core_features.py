"""Dedup windows, idempotent ids, delays, metrics, retention, dedup queues, moves, peek, deadlines and the
cost of receive against a deep backlog."""

from __future__ import annotations

import heapq

import pytest
from support import T0, Clock, ack, ids, make_core, send, send_group, statuses

from queue_core.machine import (
    InvalidArgument,
    NotFound,
    NotInFlight,
    QueueCore,
    QueueNotFound,
    SendRequest,
    SendResult,
)
from queue_core.machine import heap as heap_module
from queue_core.machine.core import MOVE_CHUNK
from queue_core.machine.effects import DedupSaved, MessagesDeleted


def send_one(core: QueueCore, now: float, queue: str = "q", **fields: object) -> SendResult:
    fields.setdefault("body", b"body")
    (result,) = core.send(queue, [SendRequest(**fields)], now)  # type: ignore[arg-type]
    assert isinstance(result, SendResult), result
    return result


# ------------------------------------------------------------------------------------------------ dedup
def test_dedup_window_queue_scope_returns_the_original_until_the_window_ends() -> None:
    core = make_core(attributes={"dedup_window": 60})
    first = send_one(core, T0, group="A", dedup_id="d1", body=b"one")
    assert isinstance(core.drain_effects()[-1], DedupSaved)

    again = send_one(core, T0 + 30, group="B", dedup_id="d1", body=b"two")  # other group, same scope
    assert again.duplicate
    assert (again.message_id, again.group, again.seq) == (first.message_id, "A", first.seq)
    assert len(core.queue("q").by_id) == 1

    later = send_one(core, T0 + 61, group="A", dedup_id="d1")
    assert not later.duplicate and later.message_id != first.message_id
    assert len(core.queue("q").by_id) == 2


def test_dedup_holds_even_after_the_original_is_deleted() -> None:
    core = make_core()
    first = send_one(core, T0, group="A", dedup_id="d1")
    d = core.receive("q", 1, None, "w", T0 + 1)
    ack(core, "q", d, T0 + 2)
    again = send_one(core, T0 + 3, group="A", dedup_id="d1")
    assert again.duplicate and again.message_id == first.message_id
    assert core.metrics("q", T0 + 3).total == 0


def test_dedup_window_group_scope() -> None:
    core = make_core(attributes={"dedup_scope": "group"})
    a = send_one(core, T0, group="A", dedup_id="d1")
    b = send_one(core, T0, group="B", dedup_id="d1")
    a2 = send_one(core, T0, group="A", dedup_id="d1")
    assert not a.duplicate and not b.duplicate and a.message_id != b.message_id
    assert a2.duplicate and a2.message_id == a.message_id
    assert len(core.queue("q").by_id) == 2


def test_content_based_dedup() -> None:
    core = make_core(attributes={"content_based_dedup": True, "dedup_window": 120})
    first = send_one(core, T0, group="A", body=b"same")
    same = send_one(core, T0 + 1, group="A", body=b"same")
    other = send_one(core, T0 + 2, group="A", body=b"different")
    explicit = send_one(core, T0 + 3, group="A", body=b"same", dedup_id="explicit")
    assert same.duplicate and same.message_id == first.message_id
    assert not other.duplicate and not explicit.duplicate  # an explicit dedup id overrides the content
    expired = send_one(core, T0 + 121, group="A", body=b"same")
    assert not expired.duplicate
    assert len(core.queue("q").by_id) == 4


def test_dedup_id_validation() -> None:
    core = make_core()
    (result,) = core.send("q", [SendRequest(b"x", group="g", dedup_id="x" * 129)], T0)
    assert not isinstance(result, SendResult)
    assert result.code == "invalid_argument"


def test_caller_supplied_message_ids_are_idempotent() -> None:
    core = make_core()
    first = send_one(core, T0, group="g", message_id="order-1", body=b"v1")
    replay = send_one(core, T0 + 1, group="other", message_id="order-1", body=b"v2")
    assert replay.duplicate
    assert (replay.message_id, replay.group, replay.seq) == ("order-1", "g", first.seq)
    assert core.metrics("q", T0 + 1).total == 1

    ack(core, "q", core.receive("q", 1, None, "w", T0 + 2), T0 + 3)
    fresh = send_one(core, T0 + 4, group="g", message_id="order-1")  # gone: a new message
    assert not fresh.duplicate and fresh.seq > first.seq
    (bad,) = core.send("q", [SendRequest(b"x", message_id="no spaces")], T0)
    assert not isinstance(bad, SendResult)


# ----------------------------------------------------------------------------------- delays, metrics
def test_per_message_delay_and_metrics() -> None:
    clock = Clock()
    core = make_core()
    send_one(core, clock.now, group="g", body=b"late", delay=10, message_id="late")
    send_one(core, clock.now, group="h", body=b"now", message_id="now")

    metrics = core.metrics("q", clock.now)
    assert (metrics.visible, metrics.delayed, metrics.in_flight, metrics.total) == (1, 1, 0, 2)
    assert core.next_deadline() == T0 + 10
    assert ids(core.receive("q", 10, None, "w", clock.advance(9.9))) == ["now"]
    metrics = core.metrics("q", clock.now)
    assert (metrics.visible, metrics.delayed, metrics.in_flight) == (0, 1, 1)
    assert metrics.age_of_first_attempt == pytest.approx(9.9)

    clock.now = T0 + 10
    assert ids(core.receive("q", 10, None, "w", clock.now)) == ["late"]
    metrics = core.metrics("q", clock.now)
    assert (metrics.visible, metrics.delayed, metrics.in_flight) == (0, 0, 2)
    assert metrics.age_of_first_attempt == pytest.approx(10.0)
    assert (metrics.sent, metrics.received, metrics.groups) == (2, 2, 2)


def test_queue_default_delay_and_per_message_override() -> None:
    core = make_core(attributes={"delay": 30})
    send_one(core, T0, group="g", message_id="default")
    send_one(core, T0, group="h", message_id="zero", delay=0)
    assert ids(core.receive("q", 10, None, "w", T0 + 1)) == ["zero"]
    assert core.receive("q", 10, None, "w", T0 + 29) == []
    assert ids(core.receive("q", 10, None, "w", T0 + 30)) == ["default"]
    (bad,) = core.send("q", [SendRequest(b"x", delay=901)], T0)
    assert isinstance(bad, InvalidArgument) and bad.details == {"field": "delay"}


def test_a_delayed_head_holds_its_whole_group() -> None:
    core = make_core()
    send_one(core, T0, group="g", message_id="m1", delay=10)
    send_one(core, T0, group="g", message_id="m2")
    send_one(core, T0, group="h", message_id="n1")
    assert ids(core.receive("q", 10, None, "w", T0 + 1)) == ["n1"]
    assert ids(core.receive("q", 10, None, "w", T0 + 10)) == ["m1", "m2"]


def test_a_delayed_message_behind_the_head_cuts_the_batch() -> None:
    core = make_core()
    send_one(core, T0, group="g", message_id="m1")
    send_one(core, T0, group="g", message_id="m2", delay=10)
    send_one(core, T0, group="g", message_id="m3")
    first = core.receive("q", 10, None, "w", T0 + 1)
    assert ids(first) == ["m1"]
    ack(core, "q", first, T0 + 2)
    assert core.receive("q", 10, None, "w", T0 + 3) == []  # m2 is still delayed and holds m3
    assert ids(core.receive("q", 10, None, "w", T0 + 10)) == ["m2", "m3"]


# ---------------------------------------------------------------------------------------- retention
def test_retention_deletes_old_messages_on_the_timer() -> None:
    core = make_core(attributes={"retention": 60})
    send_one(core, T0, group="g", message_id="old")
    send_one(core, T0 + 30, group="g", message_id="young")
    core.drain_effects()

    assert core.next_deadline() == T0 + 60
    core.handle_timer(T0 + 59.999)
    assert core.metrics("q", T0 + 59.999).total == 2
    core.handle_timer(T0 + 60)
    deleted = [e for e in core.drain_effects() if isinstance(e, MessagesDeleted)]
    assert len(deleted) == 1 and len(deleted[0].keys) == 1
    assert list(core.queue("q").by_id) == ["young"]
    assert core.next_deadline() == T0 + 90
    core.handle_timer(T0 + 90)
    assert core.metrics("q", T0 + 90).total == 0


def test_retention_also_drops_claimed_messages_and_frees_the_group() -> None:
    core = make_core(attributes={"retention": 60})
    send_one(core, T0, group="g", message_id="old")
    send_one(core, T0 + 30, group="g", message_id="young")
    claim = core.receive("q", 1, 3600.0, "w", T0 + 31)
    assert ids(claim) == ["old"]
    core.handle_timer(T0 + 60)
    assert core.metrics("q", T0 + 60).in_flight == 0
    assert statuses(core.ack("q", [("old", claim[0].token)], T0 + 61)) == ["gone"]
    assert ids(core.receive("q", 10, None, "w", T0 + 61)) == ["young"]


# -------------------------------------------------------------------------------------- dedup queue
def dedup_queue() -> QueueCore:
    return make_core("dq", {"kind": "dedup"})


def test_dedup_queue_m1_m1_p1_sees_m1_once_but_peek_shows_both() -> None:
    core = dedup_queue()
    core.send("dq", [SendRequest(b"M1"), SendRequest(b"M1")], T0)
    assert len(core.peek("dq", 10, T0 + 1)) == 2  # peek still shows duplicates

    p1 = core.receive("dq", 10, None, "w", T0 + 1)
    assert len(p1) == 1
    assert core.metrics("dq", T0 + 1).total == 1
    assert core.receive("dq", 10, None, "w", T0 + 2) == []


def test_dedup_queue_m1_p1_m1_p2_both_polls_see_m1() -> None:
    core = dedup_queue()
    core.send("dq", [SendRequest(b"M1")], T0)
    p1 = core.receive("dq", 10, None, "w", T0 + 1)
    core.send("dq", [SendRequest(b"M1")], T0 + 2)
    p2 = core.receive("dq", 10, None, "w", T0 + 3)
    assert len(p1) == 1 and len(p2) == 1
    assert p1[0].message_id != p2[0].message_id
    assert core.metrics("dq", T0 + 3).in_flight == 2


def test_dedup_queue_keeps_different_bodies() -> None:
    core = dedup_queue()
    core.send("dq", [SendRequest(b"M1"), SendRequest(b"M2"), SendRequest(b"M1")], T0)
    p1 = core.receive("dq", 10, None, "w", T0 + 1)
    assert len(p1) == 2
    assert core.metrics("dq", T0 + 1).total == 2


def test_dedup_queue_collapses_identical_bodies_within_one_group() -> None:
    core = dedup_queue()
    core.send("dq", [SendRequest(b"M1", group="g"), SendRequest(b"M1", group="g")], T0)
    p1 = core.receive("dq", 10, None, "w", T0 + 1)
    assert len(p1) == 1


def test_dedup_queue_three_copies_across_groups() -> None:
    core = dedup_queue()
    core.send(
        "dq",
        [SendRequest(b"M1", group="g"), SendRequest(b"M1", group="g"), SendRequest(b"M1", group="h")],
        T0,
    )
    p1 = core.receive("dq", 10, None, "w", T0 + 1)
    assert len(p1) == 1


# ------------------------------------------------------------------------------------------- moves
def test_move_runs_in_chunks_to_done_and_keeps_per_group_order() -> None:
    clock = Clock()
    core = make_core("src")
    per_group = 100
    n_groups = MOVE_CHUNK // per_group + 10  # more than one chunk's worth
    for g in range(n_groups):
        send_group(core, "src", clock.now, f"g{g}", [f"g{g}-m{i}" for i in range(per_group)])
    total = n_groups * per_group

    move = core.start_move("src", "dst", clock.advance(1))
    status = core.move_status(move.id)
    assert (status.state, status.moved, status.remaining) == ("running", 0, total)
    assert "dst" in core.queues
    assert core.next_deadline() == 0.0

    core.handle_timer(clock.now)
    status = core.move_status(move.id)
    assert status.state == "running"
    assert status.moved == MOVE_CHUNK and status.remaining == total - MOVE_CHUNK

    steps = 1
    while core.move_status(move.id).state == "running":
        core.handle_timer(clock.advance(0.001))
        steps += 1
        assert steps < 10
    status = core.move_status(move.id)
    assert (status.state, status.moved, status.remaining) == ("done", total, 0)
    assert status.to_dict()["from"] == "src" and status.finished_at == clock.now
    assert core.metrics("src", clock.now).total == 0

    for g in range(n_groups):
        got = [m.id for m in core.queue("dst").groups[f"g{g}"].messages]
        assert got == [f"g{g}-m{i}" for i in range(per_group)]
    batch = core.receive("dst", per_group, None, "w", clock.now)
    assert ids(batch) == [f"g0-m{i}" for i in range(per_group)]


def test_move_waits_for_claimed_groups_and_skips_later_messages() -> None:
    clock = Clock()
    core = make_core("src")
    send(core, "src", clock.now, ("a1", "A"), ("a2", "A"), ("b1", "B"))
    claim = core.receive("src", 1, 60.0, "w", clock.advance(1))
    assert ids(claim) == ["a1"]

    move = core.start_move("src", "dst", clock.advance(1))
    send(core, "src", clock.advance(1), ("b2", "B"))  # sent after the move started: stays
    core.handle_timer(clock.now)
    status = core.move_status(move.id)
    assert status.state == "running" and status.remaining == 2
    assert core.next_deadline() != 0.0  # nothing to do until the claim ends

    ack(core, "src", claim, clock.advance(1))
    assert core.next_deadline() == 0.0
    core.handle_timer(clock.now)
    assert core.move_status(move.id).state == "done"
    assert ids(core.receive("dst", 10, None, "w", clock.now)) == ["a2", "b1"]
    assert ids(core.receive("src", 10, None, "w", clock.now)) == ["b2"]


def test_cancelled_move_keeps_what_it_moved_and_moves_nothing_more() -> None:
    clock = Clock()
    core = make_core("src")
    send(core, "src", clock.now, ("a1", "A"), ("a2", "A"), ("b1", "B"))
    claim = core.receive("src", 1, 60.0, "w", clock.advance(1))  # group A in flight: the move waits for it
    move = core.start_move("src", "dst", clock.advance(1))
    core.handle_timer(clock.now)
    assert (core.move_status(move.id).state, core.move_status(move.id).moved) == ("running", 1)

    cancelled = core.cancel_move(move.id, clock.advance(1))
    assert (cancelled.state, cancelled.moved, cancelled.finished_at) == ("cancelled", 1, clock.now)
    ack(core, "src", claim, clock.advance(1))  # the claim ends: a running move would take a2 now
    core.handle_timer(clock.now)
    assert ids(core.receive("src", 10, None, "w", clock.now)) == ["a2"]
    assert ids(core.receive("dst", 10, None, "w", clock.now)) == ["b1"]
    with pytest.raises(NotInFlight):  # only a running move can be cancelled
        core.cancel_move(move.id, clock.now)
    with pytest.raises(NotFound):
        core.cancel_move("mv-nope", clock.now)


def test_move_validation() -> None:
    core = make_core("src")
    with pytest.raises(InvalidArgument):
        core.start_move("src", "src", T0)
    with pytest.raises(NotFound):
        core.move_status("mv-nope")
    with pytest.raises(QueueNotFound):
        core.start_move("missing", "dst", T0)
    assert core.moves == {}


# ------------------------------------------------------------------------------- peek and deadlines
def test_peek_ignores_claims() -> None:
    core = make_core()
    send(core, "q", T0, ("a1", "A"), ("b1", "B"), ("a2", "A"))
    core.receive("q", 1, None, "w", T0 + 1)
    items = core.peek("q", 10, T0 + 2)
    assert [(i.message_id, i.claimed) for i in items] == [("a1", True), ("b1", False), ("a2", False)]
    assert items[0].receive_count == 1
    assert core.metrics("q", T0 + 2).in_flight == 1  # peeking claims nothing
    assert len(core.peek("q", 2, T0 + 2)) == 2


def test_next_deadline_is_the_earliest_claim_expiry() -> None:
    core = make_core(attributes={"retention": 3600})
    assert core.next_deadline() is None or core.next_deadline() >= T0
    send(core, "q", T0, ("a1", "A"), ("b1", "B"), ("c1", "C"))
    core.receive("q", 1, 30.0, "w", T0)
    core.receive("q", 1, 10.0, "w", T0 + 1)
    c = core.receive("q", 1, 20.0, "w", T0 + 2)
    assert core.next_deadline() == T0 + 11

    core.handle_timer(T0 + 11)
    assert core.next_deadline() == T0 + 22
    ack(core, "q", c, T0 + 12)
    assert core.next_deadline() == T0 + 30
    core.handle_timer(T0 + 30)
    assert core.next_deadline() == T0 + 3600  # only retention is left
    assert core.metrics("q", T0 + 30).in_flight == 0


def test_next_deadline_follows_renewed_claims_without_expiring_them_early() -> None:
    core = make_core()
    send(core, "q", T0, ("a1", "A"))
    d = core.receive("q", 1, 10.0, "w", T0)[0]
    core.renew("q", [("a1", d.token)], 100.0, T0 + 1)  # extend to T0 + 101

    # The deadline may wake the shell early (a superseded timer) but never late, and waking early
    # never expires the extended claim.
    for _ in range(5):
        deadline = core.next_deadline()
        assert deadline is not None and deadline <= T0 + 101
        if deadline == T0 + 101:
            break
        core.handle_timer(deadline)
        assert core.metrics("q", deadline).in_flight == 1
    assert core.next_deadline() == T0 + 101

    core.renew("q", [("a1", d.token)], 5.0, T0 + 2, mode="set")  # shorten to T0 + 7
    assert core.next_deadline() == T0 + 7
    core.handle_timer(T0 + 7)
    assert core.metrics("q", T0 + 7).in_flight == 0


# -------------------------------------------------------------------------- receive cost vs. backlog
class CountingHeapq:
    """Stands in for `heapq` inside queue.py and counts pops from the ready heap."""

    def __init__(self) -> None:
        self.pops = 0

    def heappush(self, heap: list, item: object) -> None:  # type: ignore[type-arg]
        heapq.heappush(heap, item)

    def heappop(self, heap: list) -> object:  # type: ignore[type-arg]
        self.pops += 1
        return heapq.heappop(heap)


@pytest.fixture(scope="module")
def deep_backlog() -> QueueCore:
    core = make_core()
    for r in range(20):  # 200k messages in 10k groups, 20 per group
        core.send("q", [SendRequest(b"x", group=f"g{i:05d}") for i in range(10_000)], T0 + r)
        core.drain_effects()
    return core


def test_receive_work_does_not_grow_with_the_backlog(
    deep_backlog: QueueCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = deep_backlog
    queue = core.queue("q")
    assert len(queue.by_id) == 200_000
    assert len(queue.ready) == 10_000  # one ready entry per group, not per message

    counter = CountingHeapq()
    monkeypatch.setattr(heap_module, "heapq", counter)
    now = T0 + 100
    batch = core.receive("q", 10, 60.0, "w", now)
    assert [d.group for d in batch] == ["g00000"] * 10  # rule 2: one group fills the batch
    assert counter.pops == 1
    assert len(queue.ready) == 9_999

    # Batches that span groups pop one entry per group they touch.
    counter.pops = 0
    batch = core.receive("q", 30, 60.0, "w", now)
    assert [d.group for d in batch] == ["g00001"] * 20 + ["g00002"] * 10
    assert counter.pops == 2

    # Ending a claim pushes its group back once; the heap stays O(groups).
    assert len(queue.ready) == 9_997
    ack(core, "q", batch[20:], now)  # g00002 still has 10 messages, now newer than g00003's head
    assert len(queue.ready) == 9_998
    counter.pops = 0
    assert [d.group for d in core.receive("q", 10, 60.0, "w", now)] == ["g00003"] * 10
    assert counter.pops == 1
    core.drain_effects()


def test_heaps_do_not_keep_dead_groups_alive() -> None:
    """Every group ever created used to leave a retention entry (4 days) and a claim entry behind."""
    from queue_core.machine.heap import MIN_COMPACT_SIZE

    core = make_core()
    now = T0
    for round_ in range(200):  # 20,000 messages, each in its own group, each received and acked
        core.send("q", [SendRequest(b"x", group=f"g{round_}-{i}") for i in range(100)], now)
        while batch := core.receive("q", 10, 30.0, "w", now):
            assert all(o.status == "ok" for o in core.ack("q", [(d.message_id, d.token) for d in batch], now))
        core.drain_effects()
        now += 0.01
    queue = core.queue("q")
    assert (len(queue.by_id), len(queue.groups)) == (0, 0)
    for heap in (core.state.retention, core.state.claims, queue.ready):
        assert len(heap) <= 2 * MIN_COMPACT_SIZE
    assert core.next_deadline() is None
