"""A live local copy of a JetStream KV bucket, kept by a watch (no polling of the servers).

Each entry keeps the revision (for compare-and-set) and when this process last heard of it: nats-server
2.9 sends no watch event when a key expires, so a heartbeat bucket's liveness is judged here, from the age
of the last put (cluster.layout.NODE_TTL), not from the key's disappearance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

log = logging.getLogger("strictq.cluster")
STALL_CHECK = 2.0


@dataclass(frozen=True, slots=True)
class MirroredEntry:
    value: bytes
    revision: int
    heard_at: float  # time.monotonic() of the put, as heard here


class KvMirror:
    def __init__(
        self, bucket: KeyValue, name: str, js: JetStreamContext | None = None, stream: str = ""
    ) -> None:
        self.bucket = bucket
        self.name = name
        self.entries: dict[str, MirroredEntry] = {}
        self._changed = asyncio.Event()
        self._heard = asyncio.Event()  # set at every revision heard (for `heard`; `changed` clears its own)
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._guard: asyncio.Task[None] | None = None
        self._js = js
        self._stream = stream  # the bucket's stream (KV_<bucket>), for the stall check below
        self._revision = 0  # the newest revision heard
        self.restarts = 0
        # Hear each change as the watch applies it: (key, value or None when gone, revision; for a key
        # dropped at the end of the initial values, the newest revision heard). Must not block.
        self.listeners: list[Callable[[str, bytes | None, int], None]] = []

    @classmethod
    async def open(cls, js: JetStreamContext, bucket: str, name: str) -> KvMirror:
        return cls(await js.key_value(bucket), name, js, f"KV_{bucket}")

    async def start(self, within: float = 10.0) -> None:
        if self._task is None:  # the watch retries by itself; a second start only waits again
            self._task = asyncio.create_task(self._watch_forever(), name=f"strictq-kv-{self.name}")
        if self._guard is None and self._js is not None:
            self._guard = asyncio.create_task(self._guard_forever(), name=f"strictq-kv-guard-{self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), within)
        except TimeoutError:
            if not self._revision:  # nothing at all heard: the caller retries or gives up
                raise
            log.info("watch of %s: values arriving, no end-of-initial-values marker yet; going on", self.name)

    async def stop(self) -> None:
        for task in (self._guard, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._guard = None

    async def _guard_forever(self) -> None:
        """A watch can stop delivering without an error (seen after a JetStream outage: its consumer was
        lost and the client never noticed). Every STALL_CHECK seconds, compare the newest revision heard
        with the bucket stream's last sequence; behind on two looks in a row: watch again from scratch."""
        assert self._js is not None
        behind_at = -1
        while True:
            await asyncio.sleep(STALL_CHECK)
            try:
                last = (await self._js.stream_info(self._stream)).state.last_seq
            except Exception:
                continue  # JetStream unreachable: nothing to judge now
            if last <= self._revision:
                behind_at = -1
                continue
            if behind_at != -1 and self._revision <= behind_at:
                log.warning(
                    "watch of %s stalled at revision %d (bucket at %d); watching again",
                    self.name,
                    self._revision,
                    last,
                )
                await self._restart()
                behind_at = -1
            else:
                behind_at = self._revision

    async def _restart(self) -> None:
        self.restarts += 1
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = asyncio.create_task(self._watch_forever(), name=f"strictq-kv-{self.name}")

    async def changed(self, within: float) -> bool:
        """Wait until an entry changes (True) or `within` seconds pass (False)."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), within)
        except TimeoutError:
            return False
        return True

    async def refresh(self, key: str) -> None:
        """Read `key` from the bucket now, past the watch (a compare-and-set just failed on the revision
        this copy had: the copy is behind, whatever the watch says)."""
        try:
            entry = await self.bucket.get(key)
        except KeyNotFoundError:
            self.entries.pop(key, None)
            return
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            self.entries.pop(key, None)
        else:
            self.entries[key] = MirroredEntry(entry.value, entry.revision or 0, time.monotonic())

    @property
    def revision(self) -> int:
        """The newest revision (the bucket stream's sequence) this copy has heard: every change up to it is
        in `entries` (a watch delivers in order)."""
        return self._revision

    async def heard(self, revision: int, within: float) -> bool:
        """Wait until this copy has heard `revision` (a write of this process); False after `within`."""
        deadline = time.monotonic() + within
        while True:
            self._heard.clear()
            if self._revision >= revision:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heard.wait(), remaining)

    async def caught_up(self, within: float) -> bool:
        """Wait until this copy has heard every revision the bucket held when called (another process's
        write just acknowledged is then here: read-your-writes across processes); False after `within`
        seconds, or when the bucket's stream cannot be asked."""
        if self._js is None:
            return False
        try:
            last = (await self._js.stream_info(self._stream)).state.last_seq
        except Exception:  # JetStream unreachable now: the copy is what there is
            return False
        return await self.heard(last, within)

    def poke(self) -> None:
        """Wake whoever waits in `changed` (a local event that calls for another look)."""
        self._changed.set()

    def fresh(self, max_age: float) -> dict[str, MirroredEntry]:
        """Entries put within the last `max_age` seconds (a heartbeat bucket's live members)."""
        now = time.monotonic()
        return {key: entry for key, entry in self.entries.items() if now - entry.heard_at <= max_age}

    async def _watch_forever(self) -> None:
        while True:
            try:
                watcher = await self.bucket.watchall()
                try:
                    await self._drain(watcher)
                finally:
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection dropped or the stream moved: watch again
                log.warning("watch of %s interrupted (%s); watching again", self.name, exc)
            await asyncio.sleep(0.2)

    async def _drain(self, watcher: KeyValue.KeyWatcher) -> None:
        """Every update goes straight into `entries` (a busy bucket, heartbeats every half second from
        each node, may keep the watch's end-of-initial-values marker from ever coming, and the mirror must
        not freeze waiting for it); the marker, when it comes, drops keys this watch never delivered
        (deleted or expired while no watch ran)."""
        delivered: set[str] | None = set()
        while True:
            try:
                entry = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
            except NatsTimeoutError:
                continue
            if entry is None:  # the end of the initial values
                if delivered is not None:
                    for key in set(self.entries) - delivered:
                        del self.entries[key]
                        self._tell(key, None, self._revision)
                    delivered = None
                    self._ready.set()
                    self._changed.set()
                continue
            self._revision = max(self._revision, entry.revision or 0)
            self._heard.set()
            if delivered is not None:
                delivered.add(entry.key)
            if entry.operation in ("DEL", "PURGE") or entry.value is None:
                self.entries.pop(entry.key, None)
                self._tell(entry.key, None, entry.revision or 0)
            else:
                revision = entry.revision or 0
                known = self.entries.get(entry.key)
                # A restarted watch delivers every key's last value again: the same revision is not news,
                # so it keeps the time it was first heard (a dead node's last heartbeat must not look fresh).
                same = known is not None and known.revision == revision
                heard = known.heard_at if known is not None and same else time.monotonic()
                self.entries[entry.key] = MirroredEntry(entry.value, revision, heard)
                self._tell(entry.key, entry.value, revision)
            self._changed.set()

    def _tell(self, key: str, value: bytes | None, revision: int) -> None:
        for listener in list(self.listeners):
            try:
                listener(key, value, revision)
            except Exception:  # a listener's bug must not stop the watch
                log.exception("listener of %s failed on %s", self.name, key)
