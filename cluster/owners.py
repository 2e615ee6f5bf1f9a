"""Who owns each cluster partition now: the owner map a cluster gateway routes by (cluster/backend.py).

The real map follows the owners bucket of the cluster's JetStream KV (the master changes it with
compare-and-set); `StaticOwnerMap` is a fixed layout (partition i on urls[i]) for tests and for clusters
whose partitions never move.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol


class OwnerMap(Protocol):
    """Partition -> the URL of the queue server that owns it now (None: nobody, e.g. mid-failover)."""

    partitions: int

    def owner_url(self, partition: int) -> str | None: ...

    async def changed(self, seconds: float, /) -> None:
        """Return once the map has changed, or after `seconds`."""
        ...

    async def refresh(self) -> None:
        """Re-read the map now (an owner answered 421 `not_owner`: the map this process holds is old)."""
        ...


class StaticOwnerMap:
    """A fixed layout: partition i is owned by `urls[i]` (None: a partition without an owner). `set`
    changes an entry and wakes `changed()` waiters, so tests can move a partition by hand."""

    def __init__(self, urls: Sequence[str | None]) -> None:
        if not urls:
            raise ValueError("a cluster has at least one partition")
        self._urls: list[str | None] = list(urls)
        self.partitions = len(self._urls)
        self._changed = asyncio.Event()

    def owner_url(self, partition: int) -> str | None:
        return self._urls[partition]

    def set(self, partition: int, url: str | None) -> None:
        self._urls[partition] = url
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, seconds: float, /) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), max(seconds, 0.0))
        except TimeoutError:
            pass

    async def refresh(self) -> None:
        """Nothing to re-read: the layout is what it was given."""
