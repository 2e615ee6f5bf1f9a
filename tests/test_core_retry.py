"""Attempt results and the retry workflow in the core, with a fake clock (docs/failure-management.md §1, §2).

Partial batches in sequence order, the out-of-order refusal, same-worker-first then other workers,
backoff, park / dead-letter-message / dead-letter-group, release, redrive order, history carried to the
next delivery, claim expiry counted as a failed attempt, per-group overrides, and durability of all of it
across a restart on the real SQLite store.
"""

from __future__ import annotations

import heapq
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support import T0, ids, make_core, send_group, statuses

from queue_core.machine import InvalidArgument, NotFound, QueueCore, TooLarge
from queue_core.machine import heap as heap_module
from queue_core.machine.core import MAX_EXCLUDED_SKIPS, POLLER_WINDOW
from queue_core.machine.effects import AttemptRecorded, GroupEvent
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.records import Delivery, ReportOutcome
from queue_core.store import SqliteStore

NO_BACKOFF = {"retry_backoff": 0}


def result(d: Delivery, outcome: str, **fields: Any) -> AttemptResult:
    return AttemptResult(d.message_id, d.token, outcome, **fields)


def report(core: QueueCore, worker: str, now: float, *results: AttemptResult, queue: str = "q") -> list[str]:
    return statuses(core.report(queue, worker, list(results), now))


def attempts(core: QueueCore) -> list[AttemptRecorded]:
    return [e for e in core.drain_effects() if isinstance(e, AttemptRecorded)]


def events(core: QueueCore) -> list[GroupEvent]:
    return [e for e in core.drain_effects() if isinstance(e, GroupEvent)]


def failing_core(
    attributes: dict[str, Any] | None = None, group_ids: tuple[str, ...] = ("a1", "a2")
) -> QueueCore:
    core = make_core(attributes={"visibility_timeout": 30, **(attributes or {})})
    send_group(core, "q", T0, "A", group_ids)
    core.drain_effects()
    return core


def fail_head(core: QueueCore, worker: str, now: float, reason: str = "boom") -> Delivery:
    """`worker` takes group A's head alone and fails it."""
    (d,) = core.receive("q", 1, None, worker, now)
    assert report(core, worker, now, result(d, "failed", reason=reason)) == ["ok"]
    return d


# ------------------------------------------------------------------------------------- batch rule
def test_partial_batch_in_sequence_order_success_failure_not_attempted() -> None:
    core = failing_core(NO_BACKOFF, ("a1", "a2", "a3"))
    batch = core.receive("q", 10, None, "w1", T0)
    assert ids(batch) == ["a1", "a2", "a3"]
    core.drain_effects()
    # Reported out of sequence order on purpose: the core sorts each group's results by sequence.
    outcomes = core.report(
        "q",
        "w1",
        [
            result(batch[2], "not_attempted"),
            result(batch[1], "failed", reason="card declined", signature="POST pay 5xx"),
            result(batch[0], "succeeded"),
        ],
        T0 + 1,
    )
    assert statuses(outcomes) == ["ok", "ok", "ok"]
    assert all(isinstance(o, ReportOutcome) and o.group == "A" and o.attempt == 1 for o in outcomes)
    recorded = attempts(core)
    assert [(a.message_id, a.outcome, a.worker, a.attempt) for a in recorded] == [
        ("a1", "succeeded", "w1", 1),
        ("a2", "failed", "w1", 1),
    ]
    assert recorded[1].signature == "POST pay 5xx" and recorded[1].reason == "card declined"
    queue = core.queue("q")
    assert "a1" not in queue.by_id  # deleted
    assert queue.by_id["a3"].receive_count == 0 and queue.by_id["a3"].first_receive_at == 0.0
    assert queue.in_flight == 0
    again = core.receive("q", 10, None, "w1", T0 + 2)  # same worker first; no backoff here
    assert ids(again) == ["a2", "a3"]
    assert again[0].receive_count == 2 and again[1].receive_count == 1  # a3's was restored
    assert again[0].history is not None and again[0].history["last_reason"] == "card declined"
    assert again[1].history is None


def test_a_success_after_a_failure_of_the_same_group_refuses_the_groups_batch() -> None:
    core = failing_core(NO_BACKOFF, ("a1", "a2"))
    send_group(core, "q", T0, "B", ["b1"])
    batch = core.receive("q", 10, None, "w1", T0)
    a1, a2, b1 = batch
    core.drain_effects()
    outcomes = core.report(
        "q", "w1", [result(a1, "failed"), result(a2, "succeeded"), result(b1, "succeeded")], T0 + 1
    )
    assert statuses(outcomes) == ["out_of_order", "out_of_order", "ok"]
    assert "a1" in outcomes[1].message  # names the message it would have passed
    assert [a.message_id for a in attempts(core)] == ["b1"]  # nothing of group A was applied
    queue = core.queue("q")
    assert {m.id for m in queue.groups["A"].claimed} == {"a1", "a2"}  # still claimed, untouched
    assert queue.by_id["a1"].history is None


def test_a_later_success_may_not_pass_a_failed_message_across_calls() -> None:
    core = failing_core(NO_BACKOFF, ("a1", "a2"))
    a1, a2 = core.receive("q", 10, None, "w1", T0)
    assert report(core, "w1", T0 + 1, result(a1, "failed")) == ["ok"]
    # The failure ended the claim: a2 went back untouched, and a success for it would jump a1.
    assert core.queue("q").by_id["a2"].receive_count == 0
    assert report(core, "w1", T0 + 1, result(a2, "succeeded")) == ["out_of_order"]
    assert "a2" in core.queue("q").by_id


def test_statuses_for_gone_stale_and_not_in_flight_and_bad_input() -> None:
    core = failing_core({"visibility_timeout": 5, **NO_BACKOFF}, ("a1",))
    (d,) = core.receive("q", 1, None, "w1", T0)
    missing = AttemptResult("nope", d.token, "failed")
    stale = AttemptResult("a1", d.token - 1, "failed")
    assert report(core, "w1", T0, missing, stale) == ["gone", "stale_claim"]
    core.handle_timer(T0 + 6)  # expired: counted already
    assert report(core, "w1", T0 + 6, result(d, "failed")) == ["not_in_flight"]
    with pytest.raises(InvalidArgument):
        core.report("q", "w1", [AttemptResult("a1", None, "exploded")], T0 + 7)
    with pytest.raises(InvalidArgument):
        core.report("q", "w1", [result(d, "failed"), result(d, "failed")], T0 + 7)
    with pytest.raises(TooLarge):
        core.report("q", "w1", [result(d, "failed", reason="x" * 3000)], T0 + 7)
    with pytest.raises(InvalidArgument):
        core.report("q", "w1", [result(d, "failed")] * 1001, T0 + 7)


def test_succeeded_after_an_expired_claim_nobody_superseded_deletes_like_an_ack() -> None:
    core = failing_core({"visibility_timeout": 5}, ("a1",))
    (d,) = core.receive("q", 1, None, "w1", T0)
    core.handle_timer(T0 + 6)
    assert report(core, "w1", T0 + 6, result(d, "succeeded")) == ["ok"]
    assert core.metrics("q", T0 + 6).total == 0


# ---------------------------------------------------------------------------------- same worker first
def test_the_failing_worker_gets_its_retry_first_then_others_while_it_is_excluded() -> None:
    core = failing_core(NO_BACKOFF, ("a1",))
    send_group(core, "q", T0 + 1, "B", ["b1"])
    fail_head(core, "w1", T0 + 2)
    # w2 polls: group A is w1's for its one same-worker retry, so w2 gets the younger group B only.
    assert ids(core.receive("q", 10, None, "w2", T0 + 3)) == ["b1"]
    retry = core.receive("q", 10, None, "w1", T0 + 4)
    assert ids(retry) == ["a1"] and retry[0].history == {
        "attempts": 1,
        "last_outcome": "failed",
        "last_reason": "boom",
        "steps": [],
        "partial": None,
    }
    assert report(core, "w1", T0 + 5, result(retry[0], "failed", reason="boom again")) == ["ok"]
    # Same-worker retries used up: w1 is excluded from a1 while another worker (w2) is polling.
    assert core.receive("q", 10, None, "w1", T0 + 6) == []
    taken = core.receive("q", 10, None, "w2", T0 + 7)
    assert ids(taken) == ["a1"] and taken[0].history is not None and taken[0].history["attempts"] == 2


def test_a_reservation_times_out_so_a_dead_worker_does_not_stall_its_group() -> None:
    core = failing_core({"visibility_timeout": 10, **NO_BACKOFF}, ("a1",))
    fail_head(core, "w1", T0)
    assert core.receive("q", 10, None, "w2", T0 + 9) == []
    assert core.next_deadline() == pytest.approx(T0 + 10)
    assert ids(core.receive("q", 10, None, "w2", T0 + 10)) == ["a1"]


def test_an_excluded_worker_still_gets_the_group_when_nobody_else_polls() -> None:
    core = failing_core({"retry_same_worker": 0, **NO_BACKOFF}, ("a1",))
    core.receive("q", 1, None, "w2", T0 - 100)  # w2 polled long ago: not present any more
    fail_head(core, "w1", T0)
    assert ids(core.receive("q", 10, None, "w1", T0 + POLLER_WINDOW / 2)) == ["a1"]


def test_forgetting_a_workers_reservations_frees_its_groups_at_once() -> None:
    core = failing_core(NO_BACKOFF, ("a1",))
    fail_head(core, "w1", T0)
    assert core.forget_reservations("w1", T0 + 1) == 1
    assert ids(core.receive("q", 10, None, "w2", T0 + 1)) == ["a1"]


def test_forgetting_a_workers_reservations_covers_retries_still_in_backoff() -> None:
    """A worker fenced while its retry waits out the backoff: when the backoff ends the retry is
    everyone's, not reserved for the fenced worker until the reservation times out."""
    core = failing_core({"retry_backoff": 5.0, "visibility_timeout": 30}, ("a1",))
    fail_head(core, "w1", T0)
    assert core.forget_reservations("w1", T0 + 1) == 1
    assert core.receive("q", 10, None, "w2", T0 + 2) == []  # still backing off
    assert ids(core.receive("q", 10, None, "w2", T0 + 5.5)) == ["a1"]


def test_groups_reserved_for_one_worker_cost_others_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    core = make_core(attributes=NO_BACKOFF)
    for i in range(2000):
        send_group(core, "q", T0, f"g{i:04d}", [f"m{i}"])
    for d in core.receive("q", 1000, None, "w1", T0 + 1):  # w1 fails a thousand groups
        core.report("q", "w1", [result(d, "failed")], T0 + 1)
    assert len(core.queue("q").ready) <= 2000

    class Counting:
        pops = 0

        def heappush(self, heap: list[Any], item: Any) -> None:
            heapq.heappush(heap, item)

        def heappop(self, heap: list[Any]) -> Any:
            self.pops += 1
            return heapq.heappop(heap)

    counter = Counting()
    monkeypatch.setattr(heap_module, "heapq", counter)
    got = core.receive("q", 10, None, "w2", T0 + 2)
    assert ids(got) == [f"m{i}" for i in range(1000, 1010)]  # w1's groups were never even looked at
    assert counter.pops <= 20


def test_one_receive_sets_aside_a_bounded_number_of_excluding_groups() -> None:
    core = make_core(attributes={"retry_same_worker": 0, **NO_BACKOFF})
    n = MAX_EXCLUDED_SKIPS + 10
    for i in range(n):
        send_group(core, "q", T0, f"g{i:04d}", [f"m{i}"])
    # w2 is around (it polled, and handed its message back untouched).
    core.report("q", "w2", [result(d, "not_attempted") for d in core.receive("q", 1, None, "w2", T0)], T0)
    for d in core.receive("q", n, None, "w1", T0 + 1):
        core.report("q", "w1", [result(d, "failed")], T0 + 1)
    assert core.receive("q", 10, None, "w1", T0 + 2) == []  # gave up after the bound, found nothing
    assert len(core.receive("q", n, None, "w2", T0 + 3)) == n  # every group set aside is back


# ----------------------------------------------------------------------------------------- backoff
def test_backoff_doubles_per_failure_up_to_the_maximum() -> None:
    core = failing_core({"retry_backoff": 2, "retry_backoff_max": 5, "retry_same_worker": 0}, ("a1",))
    now = T0
    for expected_delay in (2, 4, 5, 5):
        fail_head(core, "w1", now)
        assert core.metrics("q", now).delayed == 1
        assert core.receive("q", 1, None, "w1", now + expected_delay - 0.01) == []
        assert core.next_deadline() == pytest.approx(now + expected_delay)
        now += expected_delay
        core.handle_timer(now)
        assert core.metrics("q", now).visible == 1
    assert core.queue("q").by_id["a1"].history.attempts == 4  # type: ignore[union-attr]


def test_nothing_behind_a_waiting_message_is_delivered() -> None:
    core = failing_core({"retry_backoff": 10}, ("a1", "a2", "a3"))
    fail_head(core, "w1", T0)
    assert core.receive("q", 10, None, "w1", T0 + 5) == []
    assert core.receive("q", 10, None, "w2", T0 + 5) == []
    assert ids(core.receive("q", 10, None, "w1", T0 + 10)) == ["a1", "a2", "a3"]


# ------------------------------------------------------------------------------------- exhaustion
def test_park_holds_the_group_until_released_and_other_groups_go_on() -> None:
    core = failing_core({"max_attempts": 2, **NO_BACKOFF}, ("a1", "a2"))
    send_group(core, "q", T0, "B", ["b1"])
    fail_head(core, "w1", T0)
    fail_head(core, "w1", T0 + 1)
    assert [(e.event, e.group, e.message_id) for e in events(core)] == [("park", "A", "a1")]
    assert core.parked_groups("q") == ["A"]
    assert ids(core.receive("q", 10, None, "w2", T0 + 2)) == ["b1"]
    assert core.receive("q", 10, None, "w1", T0 + 3) == []
    assert core.metrics("q", T0 + 3).total == 3  # nothing lost
    assert core.release_group("q", "A", T0 + 4) == 1
    assert [e.event for e in events(core)] == ["release"]
    assert core.parked_groups("q") == []
    retry = core.receive("q", 10, None, "w2", T0 + 5)
    assert ids(retry) == ["a1", "a2"]
    assert retry[0].history is not None and retry[0].history["attempts"] == 2  # the log data stays
    history = core.queue("q").by_id["a1"].history
    assert history is not None and history.failures == 0  # a fresh budget
    with pytest.raises(NotFound):
        core.release_group("q", "nope", T0 + 6)


def test_dead_letter_message_and_continue_then_redrive_puts_it_back_at_the_head() -> None:
    core = failing_core(
        {"max_attempts": 1, "on_exhausted": "dead_letter_message", "dead_letter_queue": "dlq", **NO_BACKOFF},
        ("a1", "a2", "a3"),
    )
    core.create_queue("dlq", T0)
    fail_head(core, "w1", T0)
    assert [(e.event, e.message_id) for e in events(core)] == [("dead_letter", "a1")]
    assert ids(core.peek("dlq", 10, T0)) == ["a1"]  # type: ignore[arg-type]
    assert core.queue("dlq").by_id["a1"].origin == "q"
    (a2,) = core.receive("q", 1, None, "w2", T0 + 1)  # the group continues
    assert a2.message_id == "a2"
    assert report(core, "w2", T0 + 1, result(a2, "succeeded")) == ["ok"]
    assert core.redrive("q", "A", T0 + 2) == (1, 0)
    assert [m.id for m in core.queue("q").groups["A"].messages] == ["a1", "a3"]
    back = core.receive("q", 10, None, "w2", T0 + 3)
    assert ids(back) == ["a1", "a3"]
    assert back[0].receive_count == 1 and back[0].history is not None  # counts afresh, history kept


def test_dead_letter_group_moves_it_whole_and_redrive_restores_the_order() -> None:
    core = failing_core(
        {"max_attempts": 1, "on_exhausted": "dead_letter_group", "dead_letter_queue": "dlq", **NO_BACKOFF},
        ("a1", "a2", "a3"),
    )
    core.create_queue("dlq", T0)
    send_group(core, "q", T0, "B", ["b1"])
    fail_head(core, "w1", T0)
    assert [m.id for m in core.queue("dlq").groups["A"].messages] == ["a1", "a2", "a3"]
    assert "A" not in core.queue("q").groups
    assert core.metrics("q", T0).dead_lettered == 3
    send_group(core, "q", T0 + 1, "A", ["a4"])  # later traffic of the group
    assert core.redrive("q", "A", T0 + 2) == (3, 0)
    assert [m.id for m in core.queue("q").groups["A"].messages] == ["a1", "a2", "a3", "a4"]
    assert core.queue("dlq").by_id == {}
    assert ids(core.receive("q", 10, None, "w2", T0 + 3)) == ["a1", "a2", "a3", "a4", "b1"]


def test_dead_letter_without_a_dead_letter_queue_parks_instead() -> None:
    core = failing_core({"max_attempts": 1, "on_exhausted": "dead_letter_message"}, ("a1",))
    fail_head(core, "w1", T0)
    (event,) = events(core)
    assert event.event == "park" and "no dead-letter queue" in event.reason
    assert core.parked_groups("q") == ["A"]


def test_redrive_of_a_parked_group_releases_it() -> None:
    core = failing_core({"max_attempts": 1}, ("a1",))
    fail_head(core, "w1", T0)
    assert core.redrive("q", "A", T0 + 1) == (0, 1)
    assert ids(core.receive("q", 1, None, "w2", T0 + 2)) == ["a1"]
    with pytest.raises(NotFound):
        core.redrive("q", "Z", T0 + 3)


# --------------------------------------------------------------------------------------- history
def test_history_carries_reason_steps_and_partial_results_to_the_next_delivery() -> None:
    core = failing_core({**NO_BACKOFF, "retry_same_worker": 0}, ("a1",))
    (d,) = core.receive("q", 1, None, "w1", T0)
    steps = [{"name": "reserved", "result": {"id": 7}}, {"name": "charged", "result": {"tx": "t1"}}]
    report(core, "w1", T0, result(d, "partial", reason="ship failed", steps=steps, partial={"tx": "t1"}))
    (d,) = core.receive("q", 1, None, "w2", T0 + 1)
    assert d.history == {
        "attempts": 1,
        "last_outcome": "partial",
        "last_reason": "ship failed",
        "steps": steps,
        "partial": {"tx": "t1"},
    }
    # The retry re-verifies "charged" and gets one step further; steps merge by name.
    more = [{"name": "charged", "result": {"tx": "t1", "verified": True}}, {"name": "packed", "result": 1}]
    report(core, "w2", T0 + 1, result(d, "failed", reason="label printer", steps=more))
    (d,) = core.receive("q", 1, None, "w3", T0 + 2)
    assert d.history is not None
    assert [s["name"] for s in d.history["steps"]] == ["reserved", "charged", "packed"]
    assert d.history["steps"][1]["result"]["verified"] is True
    assert d.history["partial"] == {"tx": "t1"} and d.history["attempts"] == 2


def test_an_expired_claim_is_a_failed_attempt_of_the_claiming_worker_for_each_message() -> None:
    core = failing_core({"visibility_timeout": 5}, ("a1", "a2"))
    core.receive("q", 10, None, "w1", T0)
    core.drain_effects()
    core.handle_timer(T0 + 5)
    expired = attempts(core)
    assert [(a.message_id, a.worker, a.outcome, a.reason, a.attempt) for a in expired] == [
        ("a1", "w1", "expired", "claim expired", 1),
        ("a2", "w1", "expired", "claim expired", 1),
    ]
    # No backoff and no reservation after an expiry: anyone may take it at once.
    again = core.receive("q", 10, None, "w2", T0 + 5)
    assert ids(again) == ["a1", "a2"]
    assert again[0].history is not None and again[0].history["last_outcome"] == "expired"


def test_expiries_exhaust_max_attempts_too() -> None:
    core = failing_core({"visibility_timeout": 5, "max_attempts": 2}, ("a1",))
    for k in range(2):
        assert ids(core.receive("q", 1, None, f"w{k}", T0 + 10 * k)) == ["a1"]
        core.handle_timer(T0 + 10 * k + 5)
    assert core.parked_groups("q") == ["A"]


# ------------------------------------------------------------------------------- group overrides
def test_a_group_override_changes_that_groups_policy_only() -> None:
    core = make_core(attributes=NO_BACKOFF)
    send_group(core, "q", T0, "A", ["a1"])
    send_group(core, "q", T0, "B", ["b1"])
    effective = core.set_group_policy("q", "A", {"max_attempts": 1}, T0)
    assert effective.max_attempts == 1 and effective.retry_backoff == 0
    assert core.group_policy("q", "A")[1] == {"max_attempts": 1}
    for d in core.receive("q", 10, None, "w1", T0):
        core.report("q", "w1", [result(d, "failed")], T0)
    assert core.parked_groups("q") == ["A"]
    with pytest.raises(InvalidArgument):
        core.set_group_policy("q", "B", {"on_exhausted": "explode"}, T0)
    with pytest.raises(InvalidArgument):
        core.set_group_policy("q", "B", {"visibility_timeout": 3}, T0)
    core.set_group_policy("q", "A", None, T0)
    assert core.group_policy("q", "A") == (core.queue("q").attributes.retry_policy(), {})


def test_retry_attributes_are_validated() -> None:
    for bad in (
        {"on_exhausted": "drop"},
        {"max_attempts": -1},
        {"retry_backoff": "1"},
        {"retry_same_worker": 1.5},
        {"log_retention_attempts": 10**6},
    ):
        with pytest.raises(InvalidArgument):
            make_core(attributes=bad)


# ------------------------------------------------------------------------------------ durability
def apply(core: QueueCore, store: SqliteStore) -> None:
    store.apply(core.drain_effects())


def reopen(store: SqliteStore, now: float) -> QueueCore:
    store.close()
    epoch, snapshot = store.open(now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, now)
    return core


def test_history_parking_backoff_and_overrides_survive_a_restart(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "q.db")
    epoch, snapshot = store.open(T0)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, T0)
    core.create_queue("q", T0, {"max_attempts": 2, "retry_backoff": 30, "retry_same_worker": 0})
    send_group(core, "q", T0, "A", ["a1", "a2"])
    send_group(core, "q", T0, "B", ["b1"])
    send_group(core, "q", T0, "C", ["c1", "c2"])
    core.set_group_policy("q", "B", {"retry_backoff": 100, "retry_backoff_max": 100}, T0)
    core.set_group_policy("q", "C", {"retry_backoff": 0}, T0)
    apply(core, store)
    a1, _, b1, c1, c2 = core.receive("q", 10, None, "w1", T0)
    core.report(
        "q",
        "w1",
        [
            result(a1, "failed", reason="first", steps=[{"name": "s1"}], partial={"p": 1}),
            result(b1, "failed", reason="b down"),
            result(c1, "not_attempted"),
            result(c2, "not_attempted"),
        ],
        T0 + 1,
    )
    apply(core, store)
    (a1,) = core.receive("q", 1, None, "w2", T0 + 31)
    core.report("q", "w2", [result(a1, "failed", reason="second")], T0 + 32)
    apply(core, store)
    assert core.parked_groups("q") == ["A"]

    core = reopen(store, T0 + 33)
    queue = core.queue("q")
    assert core.parked_groups("q") == ["A"]
    history = queue.by_id["a1"].history
    assert history is not None
    assert (history.attempts, history.failures, history.last_reason) == (2, 2, "second")
    assert history.steps == [{"name": "s1"}] and history.partial == {"p": 1}
    assert history.failed_workers == ("w1", "w2")
    assert queue.by_id["b1"].available_at == pytest.approx(T0 + 101)  # b1's backoff is still on
    assert queue.by_id["c1"].receive_count == 0  # not attempted: restored, also on disk
    assert core.group_policy("q", "C")[1] == {"retry_backoff": 0.0}
    # After the restart: group C goes, B waits out its backoff, A stays parked.
    assert ids(core.receive("q", 10, 1000, "w3", T0 + 33)) == ["c1", "c2"]
    assert ids(core.receive("q", 10, None, "w3", T0 + 100)) == []
    assert ids(core.receive("q", 10, None, "w3", T0 + 101)) == ["b1"]
    assert core.release_group("q", "A", T0 + 102) == 1
    apply(core, store)
    core = reopen(store, T0 + 103)
    assert core.parked_groups("q") == []
    assert ids(core.receive("q", 1, None, "w3", T0 + 103)) == ["a1"]
    store.close()


def test_log_data_is_stored_per_group_and_bounded(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "q.db")
    epoch, snapshot = store.open(T0)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, T0)
    core.create_queue("q", T0, {"log_retention_attempts": 3, "retention": 600, **NO_BACKOFF})
    send_group(core, "q", T0, "A", ["a1"])
    send_group(core, "q", T0, "B", ["b1"])
    for k in range(5):
        for d in core.receive("q", 10, None, "w1", T0 + k):
            outcome = "succeeded" if (k == 4 and d.group == "B") else "failed"
            core.report("q", "w1", [result(d, outcome, reason=f"try {k}", fields={"k": k})], T0 + k)
        core.forget_reservations("w1", T0 + k)
        apply(core, store)
    db = sqlite3.connect(tmp_path / "q.db")
    rows = db.execute("SELECT grp, reason, outcome, attempt FROM attempt_log ORDER BY id").fetchall()
    assert [r for r in rows if r[0] == "A"] == [("A", f"try {k}", "failed", k + 1) for k in (2, 3, 4)]
    assert [r for r in rows if r[0] == "B"][-1] == ("B", "try 4", "succeeded", 5)
    # b1 is gone: so is its history row; a1's remains.
    assert [r[0] for r in db.execute("SELECT id FROM message_history")] == ["a1"]
    db.close()
    from queue_core.store import read_attempt_log

    log = read_attempt_log(tmp_path / "q.db", core.queue("q").qid, "A", 10)
    assert [item["reason"] for item in log] == ["try 4", "try 3", "try 2"]
    assert log[0]["fields"] == {"k": 4} and log[0]["worker"] == "w1"
    # Age-bounded too: a reopen after the queue's retention drops them.
    core = reopen(store, T0 + 700)
    count = sqlite3.connect(tmp_path / "q.db").execute("SELECT count(*) FROM attempt_log").fetchone()[0]
    assert count == 0
    store.close()


def test_a_receive_with_no_visibility_time_is_no_failed_attempt() -> None:
    core = failing_core(group_ids=("a1",))
    (d,) = core.receive("q", 1, 0, "w1", T0)  # SQS VisibilityTimeout=0: visible again at once
    assert d.receive_count == 1
    assert attempts(core) == []
    (again,) = core.receive("q", 1, None, "w2", T0)
    assert again.message_id == "a1" and again.history is None


def test_release_also_ends_a_backoff() -> None:
    core = failing_core({"retry_backoff": 100, "retry_same_worker": 0}, ("a1",))
    fail_head(core, "w1", T0)
    assert core.receive("q", 1, None, "w2", T0 + 1) == []
    assert core.release_group("q", "A", T0 + 1) == 0  # nothing was parked
    assert core.metrics("q", T0 + 1).delayed == 0
    assert ids(core.receive("q", 1, None, "w2", T0 + 1)) == ["a1"]
