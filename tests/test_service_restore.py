"""Restoring a large backlog: what the service does after the store hands the core its rows."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_core import service as service_module
from queue_core.machine import SendRequest
from queue_core.service import QueueService


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Give the objects a test froze back to the collector (other tests share the process)."""
    yield
    gc.unfreeze()


async def _restart_with(tmp_path: Path, count: int) -> tuple[QueueService, int]:
    first = QueueService(tmp_path)
    await first.start()
    await first.create_queue("q")
    await first.send("q", [SendRequest(b"body %d" % i, group=f"g{i % 3}") for i in range(count)])
    await first.close()
    gc.unfreeze()
    service = QueueService(tmp_path)
    await service.start()
    return service, gc.get_freeze_count()


async def test_a_restored_backlog_is_frozen_out_of_the_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen: None
) -> None:
    monkeypatch.setattr(service_module, "FREEZE_AFTER_RESTORE", 50)
    service, frozen = await _restart_with(tmp_path, 60)
    try:
        restored = [m for q in service.core.queues.values() for m in q.by_id.values()]
        assert len(restored) == 60
        assert frozen >= len(restored)  # the messages (and everything else alive then) are frozen
        # Frozen objects are still freed by reference counting: receiving and acking works as ever.
        got = await service.receive("q", 10, 30.0, "w")
        assert [r.body for r in got] == [b"body %d" % i for i in range(0, 30, 3)]
        outcomes = await service.ack("q", [(r.delivery.message_id, r.delivery.token) for r in got])
        assert {o.status for o in outcomes} == {"ok"}
    finally:
        await service.close()


async def test_a_small_restore_freezes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfrozen: None
) -> None:
    monkeypatch.setattr(service_module, "FREEZE_AFTER_RESTORE", 50)
    service, frozen = await _restart_with(tmp_path, 10)
    try:
        assert frozen == 0
    finally:
        await service.close()
