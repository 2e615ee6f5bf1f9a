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
    GroupPolicy,
    MoveStatus,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    Redriven,
    SendRequest,
    SendResult,
)
from .machine.capabilities import PLAIN, Capabilities
from .machine.core import RenewMode
from .machine.gauges import TOP_GROUPS
from .machine.handover import HandoverPolicy
from .machine.inputs import AttemptResult
from .machine.records import Received
from .machine.routing import VersionFigures

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

    # Moves between queues. `move_id`: the id a cluster gives one move over all its partitions (each
    # partition runs it under that id; machine.moves); None: the core names it. A cluster serves moves on
    # every partition at once and merges their statuses (cluster.backend).
    async def start_move(self, source: str, destination: str, move_id: str | None = None) -> MoveStatus: ...
    async def move_status(self, move_id: str) -> MoveStatus: ...
    async def cancel_move(self, move_id: str) -> MoveStatus: ...

    # The retry workflow (docs/failure-management.md §2; queue_core.retry_http serves it). A cluster serves
    # each by the group's partition, `parked_groups` on every partition, merged and sorted.
    async def release_group(self, queue: str, group: str) -> int: ...
    async def redrive_group(self, queue: str, group: str) -> Redriven: ...
    async def parked_groups(self, queue: str) -> list[str]: ...
    async def group_policy(self, queue: str, group: str) -> GroupPolicy: ...
    async def set_group_policy(
        self, queue: str, group: str, override: dict[str, Any] | None
    ) -> GroupPolicy: ...
    async def group_log(self, queue: str, group: str, limit: int = 50) -> list[dict[str, Any]]: ...

    # Handovers of groups between workers (docs/state-transfer.md; queue_core.handover_http serves them). A
    # cluster serves named groups on their partitions, `groups=None` (every group of the donor) and the
    # queue's list on every partition, merged.
    async def hand_over(
        self, queue: str, groups: Sequence[str] | None, from_worker: str, policy: HandoverPolicy | None = None
    ) -> tuple[list[str], list[str]]: ...
    async def release_handover(self, queue: str, groups: Sequence[str]) -> list[str]: ...
    async def handovers(self, queue: str) -> list[dict[str, Any]]: ...
    # State transfer's two halves on the wire (docs/state-transfer.md). `export_requests`: the groups whose
    # state `worker` should upload now, read right after answering its poll; a remote backend takes them
    # from that poll's answer (no call of its own), a cluster from every partition that poll asked.
    # `put_state`: the donor's upload, each group on its partition, answered once durable.
    def export_requests(self, queue: str, worker: str) -> list[str]: ...
    # Group routing's figures (docs/rollouts.md; queue_core.routing_http): a cluster sums its partitions'.
    async def version_figures(self, queue: str, recent: float) -> VersionFigures: ...
    async def put_state(self, queue: str, worker: str, states: dict[str, Any]) -> dict[str, str]: ...
