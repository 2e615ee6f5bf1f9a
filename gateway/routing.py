"""Which queue server owns a group: the one component the cluster will replace.

A stable 64-bit hash of the group picks a partition (queue_core.machine.groups); a table maps partitions
to owners. The embedded default has one owner, the in-process core, for every partition.
"""

from __future__ import annotations

from queue_core.backend import QueueBackend
from queue_core.machine.groups import DEFAULT_PARTITIONS, partition_of


class PartitionRouter:
    def __init__(self, local: QueueBackend, partitions: int = DEFAULT_PARTITIONS) -> None:
        self.partitions = partitions
        self._owners: list[QueueBackend] = [local] * partitions

    def for_group(self, group: str) -> QueueBackend:
        return self._owners[partition_of(group, self.partitions)]

    def for_queue(self, queue: str) -> QueueBackend:
        """Queue-wide operations (poll, size, purge) go to the owner of every partition; one owner now."""
        return self._owners[0]
