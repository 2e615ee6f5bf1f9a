"""Small shared helpers for the state-machine tests: a fake clock and terse send/receive/ack wrappers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kit.clock import T0
from kit.clock import FakeClock as Clock

from queue_core.machine import AckOutcome, Delivery, QueueCore, SendRequest, SendResult

__all__ = ["T0", "Clock"]  # the kit's one fake clock, under the name the core tests use


def make_core(queue: str = "q", attributes: dict[str, Any] | None = None, now: float = T0) -> QueueCore:
    core = QueueCore()
    core.create_queue(queue, now, attributes)
    return core


def send(core: QueueCore, queue: str, now: float, *items: tuple[str, str | None]) -> list[SendResult]:
    """Send `(message_id, group)` pairs in one batch; the body is the id, so bodies differ."""
    requests = [SendRequest(body=mid.encode(), group=group, message_id=mid) for mid, group in items]
    results = core.send(queue, requests, now)
    for result in results:
        assert isinstance(result, SendResult), result
    return results  # type: ignore[return-value]


def send_group(core: QueueCore, queue: str, now: float, group: str | None, ids: Iterable[str]) -> None:
    send(core, queue, now, *[(mid, group) for mid in ids])


def ids(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.message_id for d in deliveries]


def ack(core: QueueCore, queue: str, deliveries: Sequence[Delivery], now: float) -> list[AckOutcome]:
    outcomes = core.ack(queue, [(d.message_id, d.token) for d in deliveries], now)
    assert [o.status for o in outcomes] == ["ok"] * len(deliveries), outcomes
    return outcomes


def statuses(outcomes: Sequence[AckOutcome]) -> list[str]:
    return [o.status for o in outcomes]
