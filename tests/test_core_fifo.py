"""The scenarios of the AWS blog post "Solving Complex Ordering Challenges with Amazon SQS FIFO Queues",
played literally against the state machine, plus the group rules they imply.

Delivery rules under test (from the post):
  1. Return the oldest message where no other message in the same message group is in flight.
  2. Return as many messages from the same message group as possible.
  3. If a message batch is still not full, go back to rule 1.
"""

from __future__ import annotations

from support import Clock, ack, ids, make_core, send, send_group

from queue_core.machine import QueueCore


def fifo(clock: Clock) -> QueueCore:
    return make_core("bids", {"visibility_timeout": 30.0}, now=clock.now)


# ------------------------------------------------------------------------------------- the simple case
def test_three_bids_one_group_batch_of_ten_gets_all_three_in_order() -> None:
    clock = Clock()
    core = fifo(clock)
    send_group(core, "bids", clock.now, "auction", ["A1", "A2", "A3"])

    batch = core.receive("bids", 10, None, "consumer", clock.advance(1))

    assert ids(batch) == ["A1", "A2", "A3"]  # starts with the oldest, fills until the queue is empty
    assert len({d.token for d in batch}) == 1  # one batch = one claim
    assert core.metrics("bids", clock.now).in_flight == 3
    assert core.receive("bids", 10, None, "consumer", clock.advance(1)) == []
    ack(core, "bids", batch, clock.advance(1))
    assert core.metrics("bids", clock.now).total == 0


def eleven_bid_burst(core: QueueCore, now: float) -> None:
    """A burst of 11 bids sent to the queue, the two bids for Auction A arriving last."""
    send_group(core, "bids", now, "auction", [f"B{i}" for i in range(1, 10)] + ["A1", "A2"])


def test_burst_of_eleven_first_batch_is_b1_to_a1_and_a2_waits_for_the_delete() -> None:
    clock = Clock()
    core = fifo(clock)
    eleven_bid_burst(core, clock.now)

    first = core.receive("bids", 10, None, "consumer", clock.advance(1))
    assert len(first) == 10
    assert first[0].message_id == "B1"
    assert first[-1].message_id == "A1"
    assert ids(first) == [f"B{i}" for i in range(1, 10)] + ["A1"]

    # SQS won't release the next batch until the first batch has been deleted.
    assert core.receive("bids", 10, None, "consumer", clock.advance(1)) == []
    # Deleting all but one is not enough either: the group still has a message in flight.
    ack(core, "bids", first[:9], clock.advance(1))
    assert core.receive("bids", 10, None, "consumer", clock.advance(1)) == []

    ack(core, "bids", first[9:], clock.advance(1))
    second = core.receive("bids", 10, None, "consumer", clock.advance(1))
    assert ids(second) == ["A2"]
    assert second[0].token > first[0].token


def test_burst_batch_that_times_out_is_redelivered_from_b1_not_a2() -> None:
    clock = Clock()
    core = fifo(clock)
    eleven_bid_burst(core, clock.now)
    first = core.receive("bids", 10, 30.0, "consumer", clock.advance(1))

    clock.advance(30.0)  # the batch's visibility timer expires without a delete
    again = core.receive("bids", 10, None, "consumer", clock.now)

    assert ids(again) == ids(first)
    assert all(d.receive_count == 2 for d in again)


# ------------------------------------------------------------------------------ multiple message groups
def test_two_groups_b1_first_batch_has_all_b_then_all_a() -> None:
    clock = Clock()
    core = fifo(clock)
    send(
        core, "bids", clock.now, ("B1", "B"), ("A1", "A"), ("B2", "B"), ("A2", "A"), ("B3", "B"), ("A3", "A")
    )

    batch = core.receive("bids", 10, None, "consumer", clock.advance(1))

    assert ids(batch) == ["B1", "B2", "B3", "A1", "A2", "A3"]
    assert batch[0].token != batch[3].token  # one claim per group


def eleven_a_and_eleven_b_interleaved(core: QueueCore, now: float) -> None:
    items = []
    for i in range(1, 12):
        items += [(f"A{i}", "A"), (f"B{i}", "B")]
    send(core, "bids", now, *items)


def test_two_consumers_each_get_ten_of_one_group_then_the_remaining_a_and_b() -> None:
    clock = Clock()
    core = fifo(clock)
    eleven_a_and_eleven_b_interleaved(core, clock.now)

    consumer1 = core.receive("bids", 10, None, "consumer-1", clock.advance(1))
    assert ids(consumer1) == [f"A{i}" for i in range(1, 11)]
    # Group A is in flight, so consumer 2 gets Group B.
    consumer2 = core.receive("bids", 10, None, "consumer-2", clock.advance(1))
    assert ids(consumer2) == [f"B{i}" for i in range(1, 11)]

    ack(core, "bids", consumer1, clock.advance(1))
    ack(core, "bids", consumer2, clock.advance(1))

    nxt = core.receive("bids", 10, None, "consumer-1", clock.advance(1))
    assert ids(nxt) == ["A11", "B11"]  # A11 is older than B11
    assert core.metrics("bids", clock.now).visible == 0


def test_nuance_consumer2_not_deleted_yet_consumer1_gets_only_remaining_a() -> None:
    clock = Clock()
    core = fifo(clock)
    eleven_a_and_eleven_b_interleaved(core, clock.now)
    consumer1 = core.receive("bids", 10, None, "consumer-1", clock.advance(1))
    consumer2 = core.receive("bids", 10, None, "consumer-2", clock.advance(1))

    # Consumer 1 is faster and deletes its batch before consumer 2 deletes its own.
    ack(core, "bids", consumer1, clock.advance(1))
    nxt = core.receive("bids", 10, None, "consumer-1", clock.advance(1))
    assert ids(nxt) == ["A11"]  # Group B is still in flight: no more B
    assert core.receive("bids", 10, None, "consumer-1", clock.advance(1)) == []

    ack(core, "bids", consumer2, clock.advance(1))
    last = core.receive("bids", 10, None, "consumer-1", clock.advance(1))
    assert ids(last) == ["B11"]


# -------------------------------------------------------------------------------- group rules in general
def test_ungrouped_messages_get_distinct_auto_groups_and_never_wait_behind_a_claim() -> None:
    clock = Clock()
    core = fifo(clock)
    results = send(core, "bids", clock.now, ("u1", None), ("u2", None), ("u3", None))

    groups = [r.group for r in results]
    assert len(set(groups)) == 3
    assert all(g.startswith("~auto.") for g in groups)

    first = core.receive("bids", 1, None, "w", clock.advance(1))
    second = core.receive("bids", 1, None, "w", clock.advance(1))
    rest = core.receive("bids", 10, None, "w", clock.advance(1))
    assert ids(first) == ["u1"]
    assert ids(second) == ["u2"]  # u1 is in flight, but it does not hold u2 back
    assert ids(rest) == ["u3"]


def test_ungrouped_message_is_delivered_past_a_blocked_group() -> None:
    clock = Clock()
    core = fifo(clock)
    send(core, "bids", clock.now, ("g1", "g"), ("g2", "g"), ("u1", None))

    assert ids(core.receive("bids", 1, None, "w", clock.advance(1))) == ["g1"]
    assert ids(core.receive("bids", 10, None, "w", clock.advance(1))) == ["u1"]  # g2 is held


def test_group_with_anything_in_flight_delivers_nothing_more() -> None:
    clock = Clock()
    core = fifo(clock)
    send_group(core, "bids", clock.now, "g", [f"m{i}" for i in range(1, 6)])

    claim = core.receive("bids", 2, None, "w", clock.advance(1))
    assert ids(claim) == ["m1", "m2"]  # rule 2 is bounded by the batch size
    assert core.receive("bids", 10, None, "w", clock.advance(1)) == []

    ack(core, "bids", claim[:1], clock.advance(1))
    assert core.receive("bids", 10, None, "w", clock.advance(1)) == []  # m2 is still in flight

    ack(core, "bids", claim[1:], clock.advance(1))
    assert ids(core.receive("bids", 10, None, "w", clock.advance(1))) == ["m3", "m4", "m5"]


def test_rule_one_picks_the_oldest_message_whose_group_is_idle() -> None:
    clock = Clock()
    core = fifo(clock)
    send(core, "bids", clock.now, ("A1", "A"), ("B1", "B"), ("A2", "A"), ("C1", "C"), ("B2", "B"))

    assert ids(core.receive("bids", 1, None, "w", clock.advance(1))) == ["A1"]
    # A is in flight, so the batch starts at B1, takes all of B, then goes back to rule 1 for C.
    assert ids(core.receive("bids", 10, None, "w", clock.advance(1))) == ["B1", "B2", "C1"]


def test_batch_limit_stops_mid_group_and_the_rest_waits_for_the_claim() -> None:
    clock = Clock()
    core = fifo(clock)
    send(core, "bids", clock.now, ("A1", "A"), ("A2", "A"), ("A3", "A"), ("B1", "B"))

    batch = core.receive("bids", 2, None, "w", clock.advance(1))
    assert ids(batch) == ["A1", "A2"]
    assert ids(core.receive("bids", 10, None, "w", clock.advance(1))) == ["B1"]
    ack(core, "bids", batch, clock.advance(1))
    assert ids(core.receive("bids", 10, None, "w", clock.advance(1))) == ["A3"]
