"""What an API face needs from a queue server, in-process or remote.

`QueueService` (the core in this process) and `RemoteQueueService` (a `strictq queue-server` over its
internal API) both satisfy this protocol, so the gateway's faces and router never know which one they
talk to: `strictq serve` uses the first, `strictq serve --queue-server URL` the second.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from .figures import Figures
from .machine import (
    AckOutcome,
    MoveStatus,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    SendRequest,
    SendResult,
)
from .machine.capabilities import PLAIN, Capabilities
from .machine.core import RenewMode
from .machine.gauges import TOP_GROUPS
from .machine.inputs import AttemptResult
from .machine.records import Received

# How far a FIFO send's deduplication reaches: the whole queue (one core holds every group: in process, a
# queue server), or only the groups of the send's partition (a cluster: each partition is its own core).
DedupReach = Literal["queue", "partition"]


class QueueBackend(Protocol):
    partitions: int
    dedup_reach: DedupReach  # what the SQS face reports as DeduplicationScope (gateway.sqs_queues)

    @property
    def healthy(self) -> bool: ...

    async def start(self) -> None: ...
    def stop_waiting(self) -> None: ...
    async def close(self) -> None: ...

    async def create_queue(self, name: str, attributes: dict[str, Any] | None = None) -> QueueAttributes: ...
    async def set_attributes(self, name: str, changes: dict[str, Any]) -> QueueAttributes: ...
    async def delete_queue(self, name: str) -> None: ...
    async def list_queues(self, prefix: str = "") -> list[str]: ...
    async def attributes(self, name: str) -> QueueAttributes: ...
    async def created_at(self, name: str) -> float: ...
    async def metrics(self, name: str) -> QueueMetrics: ...
    async def group_metrics(self, name: str, group: str) -> dict[str, Any]: ...
    # Every queue's figures for the dashboard and /metrics (queue_core.figures); in a cluster, merged
    # over the partitions that answered and kept per partition with its owner.
    async def figures(self, top: int = TOP_GROUPS) -> Figures: ...

    async def send(
        self, queue: str, requests: Sequence[SendRequest], *, create: bool = False
    ) -> list[SendResult | QueueError]: ...
    async def receive(
        self,
        queue: str,
        limit: int = 10,
        ttl: float | None = None,
        worker: str = "",
        wait: float = 0.0,
        probes: bool = True,  # False: a face that cannot hand out failure management's probes (SQS)
        # What the poller declared (machine.capabilities): without `results`, plain queue semantics.
        capabilities: Capabilities = PLAIN,
    ) -> list[Received]: ...
    # `holder`: the caller's worker identity; it may then end or extend only claims that went to it
    # (QueueCore._refusal). None: an operator, or a caller that proved the claim otherwise.
    async def ack(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]: ...
    async def renew(
        self,
        queue: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]: ...
    async def release(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]: ...
    async def report(
        self, queue: str, worker: str, results: Sequence[AttemptResult], holder: str | None = None
    ) -> list[AckOutcome]: ...
    async def unclaim_all(self, queue: str) -> int: ...
    async def purge(self, queue: str) -> int: ...
    async def peek(self, queue: str, limit: int = 10) -> list[tuple[PeekItem, bytes, str, bytes]]: ...

    async def start_move(self, source: str, destination: str) -> MoveStatus: ...
    async def move_status(self, move_id: str) -> MoveStatus: ...
    async def cancel_move(self, move_id: str) -> MoveStatus: ...
