"""The core as a facade over its parts (issue 13): reads that advance time are drained like any call.

`metrics`, `group_metrics`, `peek` and a scrape's `gauges` run the core's timer (claims expire, retention
drops messages on the way). Their effects must reach the shell in the same step: heard by failure
management and made durable, not left in the core until some later call. A real `QueueService` on a real
store, with the kit's fake clock; a restart proves the effects were persisted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kit.clock import FakeClock

from queue_core.machine import SendRequest
from queue_core.machine.capabilities import SDK
from queue_core.machine.core import QueueCore
from queue_core.machine.effects import AttemptRecorded
from queue_core.service import QueueService


async def scrape(service: QueueService) -> Any:
    """A Prometheus scrape's read (queue_core.metrics_export): synchronous, every queue at once."""
    return service.gauges()


READS: dict[str, Callable[[QueueService], Awaitable[Any]]] = {
    "gauges": scrape,
    "metrics": lambda service: service.metrics("q"),
    "group_metrics": lambda service: service.group_metrics("q", "g"),
    "peek": lambda service: service.peek("q", 10),
}


@pytest.mark.parametrize("read", sorted(READS))
async def test_a_read_that_expires_a_claim_drains_and_persists_it(tmp_path: Path, read: str) -> None:
    clock = FakeClock()
    service = QueueService(tmp_path, clock=clock)
    await service.start()
    try:
        await service.create_queue("q", {"visibility_timeout": 5})
        await service.send("q", [SendRequest(b"x", group="g", message_id="m1")])
        (item,) = await service.receive("q", 1, ttl=5.0, worker="w1", capabilities=SDK)
        heard: list[object] = []
        service.failure_listeners.append(heard.append)
        clock.advance(10.0)  # the claim lapses; no timer ran (the loop's timer is real time, far off)
        await READS[read](service)
        assert service.core.effects == []  # nothing left behind for a later call to carry
        attempts = [e for e in heard if isinstance(e, AttemptRecorded)]
        assert [(a.message_id, a.worker, a.outcome) for a in attempts] == [("m1", "w1", "expired")]
        await service.settled()
    finally:
        await service.close()
    # The failed attempt the read counted is on disk: the next delivery carries its history.
    again = QueueService(tmp_path, clock=clock)
    await again.start()
    try:
        (redelivered,) = await again.receive("q", 1, worker="w2", capabilities=SDK)
        assert redelivered.delivery.message_id == "m1"
        assert redelivered.delivery.token > item.delivery.token
        history = redelivered.delivery.history
        assert history is not None and history["attempts"] == 1
    finally:
        await again.close()


def test_the_facade_advances_time_once_per_call_and_a_redrive_counts_what_it_restored() -> None:
    """`redrive` releases the group through the retries part, not through the facade again."""
    core = QueueCore()
    now = 1_000.0
    core.create_queue("dlq", now)
    core.create_queue(
        "q", now, {"dead_letter_queue": "dlq", "max_attempts": 1, "on_exhausted": "dead_letter_group"}
    )
    core.send(
        "q", [SendRequest(b"a", group="g", message_id="a"), SendRequest(b"b", group="g", message_id="b")], now
    )
    (first, _) = core.receive("q", 10, 30.0, "w", now)
    from queue_core.machine.inputs import AttemptResult

    core.report("q", "w", [AttemptResult("a", first.token, "failed", "boom")], now)
    assert sorted(core.queue("dlq").by_id) == ["a", "b"]
    assert core.redrive("q", "g", now) == (2, 0)
    assert [m.id for m in core.queue("q").groups["g"].messages] == ["a", "b"]
