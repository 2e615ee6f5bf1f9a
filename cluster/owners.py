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

    def owner_node(self, partition: int) -> str | None:
        """The owner's node name (None: no owner, or not known): a gateway's `reach` rewrites by it."""
        ...

    def owner_region(self, partition: int) -> str:
        """The owner's region ("" unknown): a worker is offered its own region's partitions first."""
        ...

    async def changed(self, seconds: float, /) -> None:
        """Return once the map has changed, or after `seconds`."""
        ...

    async def refresh(self) -> None:
        """Re-read the map now (an owner answered 421 `not_owner`: the map this process holds is old)."""
        ...


class StaticOwnerMap:
    """A fixed layout: partition i is owned by `urls[i]` (None: a partition without an owner), node
    `nodes[i]` in `regions[i]` when given. `set` changes an entry and wakes `changed()` waiters, so tests
    can move a partition by hand."""

    def __init__(
        self,
        urls: Sequence[str | None],
        nodes: Sequence[str | None] | None = None,
        regions: Sequence[str] | None = None,
    ) -> None:
        if not urls:
            raise ValueError("a cluster has at least one partition")
        for name, given in (("nodes", nodes), ("regions", regions)):
            if given is not None and len(given) != len(urls):
                raise ValueError(f"{name}: one per partition ({len(urls)}), not {len(given)}")
        self._urls: list[str | None] = list(urls)
        self._nodes: list[str | None] = list(nodes) if nodes is not None else [None] * len(urls)
        self._regions: list[str] = list(regions) if regions is not None else [""] * len(urls)
        self.partitions = len(self._urls)
        self._changed = asyncio.Event()

    def owner_url(self, partition: int) -> str | None:
        return self._urls[partition]

    def owner_node(self, partition: int) -> str | None:
        return self._nodes[partition] if self._urls[partition] is not None else None

    def owner_region(self, partition: int) -> str:
        return self._regions[partition] if self._urls[partition] is not None else ""

    def set(self, partition: int, url: str | None, node: str | None = None, region: str = "") -> None:
        """Partition `partition` is now at `url` (node `node` in `region`)."""
        self._urls[partition] = url
        self._nodes[partition] = node
        self._regions[partition] = region
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, seconds: float, /) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), max(seconds, 0.0))
        except TimeoutError:
            pass

    async def refresh(self) -> None:
        """Nothing to re-read: the layout is what it was given."""
