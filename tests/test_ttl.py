"""TTL (queue attributes `ttl`, `on_expiry`): messages older than their queue's TTL leave it in order, group
head by group head, dropped or dead-lettered, counted (`expired`) and logged; only old messages go.

The core with a fake clock (sans-I/O), then the real queue service on SQLite: the dead-lettered messages
are in the DLQ in order after a restart, and the log line names the queue and a count, never a body.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from support import T0, ids, make_core

from queue_core.machine import InvalidArgument, QueueCore, SendRequest, SendResult
from queue_core.machine.effects import MessagesDeleted, MessagesExpired
from queue_core.service import QueueService


def send_at(core: QueueCore, now: float, group: str, message_id: str, queue: str = "q") -> None:
    (result,) = core.send(
        queue, [SendRequest(body=message_id.encode(), group=group, message_id=message_id)], now
    )
    assert isinstance(result, SendResult), result


def test_the_ttl_drops_only_the_old_messages_in_order_and_counts_them() -> None:
    core = make_core(attributes={"ttl": 10})
    for at, group, message_id in (
        (0, "g", "m0"),
        (1, "h", "h0"),
        (2, "g", "m1"),
        (4, "g", "m2"),
        (9, "g", "m3"),
    ):
        send_at(core, T0 + at, group, message_id)
    core.drain_effects()
    assert core.next_deadline() == T0 + 10
    core.handle_timer(T0 + 11.5)  # m0 and h0 are past 10 s; m1 (9.5 s) is not
    effects = core.drain_effects()
    expired = [e for e in effects if isinstance(e, MessagesExpired)]
    assert sorted((e.queue, e.count, e.dead_letter_queue) for e in expired) == [
        ("q", 1, None),
        ("q", 1, None),
    ]
    assert sum(len(e.keys) for e in effects if isinstance(e, MessagesDeleted)) == 2
    assert ids(core.receive("q", 1, 30.0, "w", T0 + 11.5)) == ["m1"]  # the group's head is now m1
    core.handle_timer(T0 + 14.5)  # m1 expired while claimed: its claim ends with it; m2 too
    assert list(core.queue("q").by_id) == ["m3"]
    assert core.metrics("q", T0 + 14.5).expired == 4
    assert ids(core.receive("q", 10, 30.0, "w", T0 + 14.5)) == ["m3"]


def test_the_shorter_of_ttl_and_retention_applies_and_ttl_zero_is_off() -> None:
    core = make_core(attributes={"retention": 60, "ttl": 300})
    send_at(core, T0, "g", "a")
    assert core.next_deadline() == T0 + 60
    core.set_attributes("q", {"ttl": 0}, T0 + 1)
    assert core.queue("q").attributes.lifetime == 60
    with pytest.raises(InvalidArgument, match="ttl"):
        core.set_attributes("q", {"ttl": -1}, T0 + 1)
    with pytest.raises(InvalidArgument, match="on_expiry"):
        core.set_attributes("q", {"on_expiry": "archive"}, T0 + 1)


def test_dead_letter_on_expiry_moves_them_in_order_to_the_dlq() -> None:
    core = QueueCore()
    core.create_queue("dlq", T0)
    core.create_queue("q", T0, {"ttl": 5, "on_expiry": "dead_letter", "dead_letter_queue": "dlq"})
    for i in range(3):
        send_at(core, T0 + i * 0.1, "g", f"m{i}")
    send_at(core, T0 + 3, "g", "young")
    claim = core.receive("q", 1, 60.0, "w", T0 + 1)
    assert ids(claim) == ["m0"]
    core.drain_effects()
    core.handle_timer(T0 + 5.3)
    expired = [e for e in core.drain_effects() if isinstance(e, MessagesExpired)]
    assert [(e.count, e.dead_letter_queue) for e in expired] == [(3, "dlq")]
    assert list(core.queue("q").by_id) == ["young"]
    assert ids(core.receive("dlq", 10, 30.0, "w", T0 + 5.3)) == ["m0", "m1", "m2"]  # in order, one group
    assert core.metrics("q", T0 + 5.3).dead_lettered == 3
    assert ids(core.receive("q", 10, 30.0, "w2", T0 + 5.3)) == ["young"]  # the group was freed
    # Without a dead-letter queue the same setting drops them.
    lone = make_core(attributes={"ttl": 5, "on_expiry": "dead_letter"})
    send_at(lone, T0, "g", "x")
    lone.handle_timer(T0 + 5)
    assert lone.metrics("q", T0 + 5).total == 0 and lone.metrics("q", T0 + 5).expired == 1


async def test_expired_messages_are_logged_and_dead_lettered_durably(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = QueueService(tmp_path / "queue")
    await service.start()
    try:
        await service.create_queue("dlq")
        await service.create_queue("q", {"ttl": 0.3, "on_expiry": "dead_letter", "dead_letter_queue": "dlq"})
        bodies = [SendRequest(body=f"secret-{i}".encode(), group="g", message_id=f"m{i}") for i in range(3)]
        await service.send("q", bodies)
        with caplog.at_level(logging.INFO, logger="strictq.queue"):
            for _ in range(100):  # bounded: the timer fires 0.3 s after the sends
                metrics = await service.metrics("q")
                if metrics.expired == 3:
                    break
                await asyncio.sleep(0.05)
        assert metrics.expired == 3 and metrics.total == 0
        lines = [r.getMessage() for r in caplog.records if "past its TTL" in r.getMessage()]
        assert lines == ["queue q: 3 message(s) past its TTL or retention moved to dlq"]
        assert not any("secret-" in r.getMessage() for r in caplog.records)
    finally:
        await service.close()
    again = QueueService(tmp_path / "queue")
    await again.start()
    try:
        claims = await again.receive("dlq", 10, 30.0, "w")
        assert [c.delivery.message_id for c in claims] == ["m0", "m1", "m2"]
        assert (await again.metrics("q")).total == 0
    finally:
        await again.close()
