"""A priority queue whose entries may go stale (lazy deletion) without ever pinning memory."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

MIN_COMPACT_SIZE = 1024


class LazyHeap[E: tuple[Any, ...]]:
    """Entries are never removed when they go stale (that would cost O(n)); stale ones are skipped at the
    top, and once the heap has doubled since its last compaction every stale entry is dropped. That keeps
    the cost amortised O(log n) and the size within twice the live entries: without it, entries of dead
    groups (one per group ever created) piled up for the whole retention period."""

    __slots__ = ("_compact_at", "_entries", "_is_live")

    def __init__(self, is_live: Callable[[E], bool]) -> None:
        self._entries: list[E] = []
        self._is_live = is_live
        self._compact_at = MIN_COMPACT_SIZE

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, entry: E) -> None:
        heapq.heappush(self._entries, entry)
        if len(self._entries) > self._compact_at:
            self.compact()

    def compact(self) -> None:
        live = [entry for entry in self._entries if self._is_live(entry)]
        heapq.heapify(live)
        self._entries = live
        self._compact_at = max(MIN_COMPACT_SIZE, 2 * len(live))

    def peek(self) -> E | None:
        """The smallest live entry, dropping stale ones above it."""
        entries = self._entries
        while entries:
            if self._is_live(entries[0]):
                return entries[0]
            heapq.heappop(entries)
        return None

    def pop(self) -> E | None:
        """Remove and return the smallest live entry."""
        entry = self.peek()
        if entry is not None:
            heapq.heappop(self._entries)
        return entry

    def clear(self) -> None:
        self._entries.clear()

    def live_entries(self) -> list[E]:
        """Every live entry, in no particular order (O(n): for rare maintenance, not hot paths)."""
        return [entry for entry in self._entries if self._is_live(entry)]
