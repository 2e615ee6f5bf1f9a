"""A cluster edge's fences: one set for the whole cluster, in its control bucket (cluster.control_state).

`ClusterFenceRegistry` is the `FenceRegistry` a cluster edge's ControlHub holds. Its view follows the
bucket through a watch (cluster.kv_mirror), so a fence set through another edge, or written by failure
management, is in force here within the watch's delay; the hub hears such a change through
`FenceRegistry.listeners` and emits the same `fence` / `unfence` event as for one made here, so a proxy
following any edge's control stream refuses a worker fenced through any edge.

Writes are compare-and-set against the revision this view holds (KV create when it holds none): a write
racing another edge's write of the same worker re-reads the key and tries again, so neither is lost.
Watched changes are applied under the registry's lock, in revision order, and a change the view already
holds (the echo of this edge's own write) emits nothing: a fence set here gives one event, not two.

A `fences.json` left in the edge's data dir by an earlier version (fences per edge) is migrated at start:
each fence the bucket does not already hold is written to it (the bucket's wins), and the file is renamed
`fences.json.migrated`; a damaged one stops the start (FenceFileError), as it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from protocol.errors import StrictqError
from queue_core.fences import MIGRATED_SUFFIX, Fence, FenceError, FenceRegistry, NotFenced

from .control_state import FENCE_PREFIX, control_bucket, decode_fence, encode_fence, fence_key, fence_worker
from .kv_mirror import KvMirror
from .layout import ClusterLayout, retrying

log = logging.getLogger("strictq.control")
CAS_ATTEMPTS = 20  # re-reads after a lost compare-and-set before giving up (each: progress elsewhere)


class ControlStateUnavailable(StrictqError, OSError):
    """The cluster's control bucket did not take a change (JetStream unreachable, or the key kept
    changing under it): nothing changed here; retry. An OSError, so the hub's expiry retries too."""

    status = 503
    retriable = True
    code = "control_state_unavailable"


class ClusterFenceRegistry(FenceRegistry):
    """The fences of the cluster whose control bucket `layout` names; `legacy` is this edge's old
    fences.json (migrated by `start`). Start it before the hub (`await registry.start()`); close it after."""

    def __init__(self, js: JetStreamContext, layout: ClusterLayout, legacy: str | Path) -> None:
        super().__init__(legacy)
        self._js = js
        self._layout = layout
        self._bucket: KeyValue | None = None
        self._mirror: KvMirror | None = None
        self._revisions: dict[str, int] = {}  # worker -> the newest revision of its key applied here
        self._heard: asyncio.Queue[tuple[str, bytes | None, int]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open (or create) the bucket, fill the view from it, follow it, then migrate a legacy file."""
        layout = self._layout
        self._bucket = await control_bucket(self._js, layout)
        self._mirror = KvMirror(self._bucket, "control", self._js, f"KV_{layout.control_bucket}")
        self._mirror.listeners.append(self._on_heard)
        await retrying(self._mirror.start, "the cluster's control state")
        async with self.lock:  # the initial values, before anyone reads the view
            self._apply_heard()
        self._task = asyncio.create_task(self._follow(), name="strictq-control-fences")
        await self._migrate()

    def load(self) -> None:
        """Nothing to read: the view follows the bucket since `start`."""

    @property
    def mirror(self) -> KvMirror:
        """This edge's one copy of the control bucket (started with the registry): the probe bridge reads
        the decider's probes from it rather than watching the bucket a second time."""
        if self._mirror is None:
            raise RuntimeError("the control registry has not started")
        return self._mirror

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._mirror is not None:
            await self._mirror.stop()

    # ------------------------------------------------------------------------------------- writes
    async def put(self, fence: Fence) -> None:
        """Add or replace a worker's fence in the bucket (caller holds `lock`), then in the view."""
        worker, value = fence.worker, encode_fence(fence)
        for _ in range(CAS_ATTEMPTS):
            try:
                if worker in self._fences:
                    revision = await self._kv.update(fence_key(worker), value, last=self._revisions[worker])
                else:  # a create: fails if another edge fenced the worker since this view last heard
                    revision = await self._kv.create(fence_key(worker), value)
            except KeyWrongLastSequenceError:
                await self._reread(worker)
                continue
            except (NatsError, TimeoutError) as exc:
                raise ControlStateUnavailable(
                    f"the cluster's control bucket did not take the fence: {exc!r}"
                ) from None
            self._revisions[worker] = max(self._revisions.get(worker, 0), revision)
            self._fences = {**self._fences, worker: fence}
            return
        raise ControlStateUnavailable(f"the fence of {worker!r} kept changing elsewhere; try again")

    async def remove(self, worker: str) -> Fence:
        """Lift a worker's fence (caller holds `lock`); NotFenced if this view has none. Lifted meanwhile
        elsewhere counts as lifted (expiry runs at every edge: the first one's delete wins)."""
        fence = self._fences.get(worker)
        if fence is None:
            raise NotFenced(f"worker {worker!r} is not fenced")
        for _ in range(CAS_ATTEMPTS):
            try:
                await self._kv.delete(fence_key(worker), last=self._revisions.get(worker, 0))
            except KeyWrongLastSequenceError:
                if not await self._reread(worker, tell_if_gone=False):
                    return fence
                continue
            except (NatsError, TimeoutError) as exc:
                raise ControlStateUnavailable(
                    f"the cluster's control bucket did not lift the fence: {exc!r}"
                ) from None
            self._fences = {w: f for w, f in self._fences.items() if w != worker}
            return fence
        raise ControlStateUnavailable(f"the fence of {worker!r} kept changing elsewhere; try again")

    @property
    def _kv(self) -> KeyValue:
        if self._bucket is None:
            raise RuntimeError("ClusterFenceRegistry used before start()")
        return self._bucket

    async def _reread(self, worker: str, *, tell_if_gone: bool = True) -> bool:
        """A compare-and-set lost: read the worker's key past the watch and apply it (listeners told);
        True if the worker is fenced now."""
        try:
            entry = await self._kv.get(fence_key(worker))
        except KeyNotFoundError as exc:  # none, or deleted: the delete marker's revision when there is one
            marker = getattr(exc, "entry", None)
            revision = (marker.revision if marker is not None else None) or 0
            self._apply(worker, None, revision, tell=tell_if_gone, force=True)
            return False
        except (NatsError, TimeoutError) as exc:
            raise ControlStateUnavailable(f"cannot read the cluster's control bucket: {exc}") from None
        self._apply(worker, entry.value, entry.revision or 0, force=True)
        return worker in self._fences

    # ------------------------------------------------------------------------------------- watch
    def _on_heard(self, key: str, value: bytes | None, revision: int) -> None:
        """From the watch, which must not block: queued, applied under the lock by `_follow`."""
        if key.startswith(FENCE_PREFIX):
            self._heard.put_nowait((key, value, revision))

    async def _follow(self) -> None:
        while True:
            first = await self._heard.get()
            async with self.lock:  # never between a write and its event (the hub emits under the lock)
                self._apply_key(*first)
                self._apply_heard()

    def _apply_heard(self) -> None:
        while not self._heard.empty():
            self._apply_key(*self._heard.get_nowait())

    def _apply_key(self, key: str, value: bytes | None, revision: int) -> None:
        worker = fence_worker(key)
        if worker is None:
            log.error("ignoring control key %r: not a base64 worker id", key)
            return
        self._apply(worker, value, revision)

    def _apply(
        self, worker: str, value: bytes | None, revision: int, *, tell: bool = True, force: bool = False
    ) -> None:
        """The bucket's state of `worker` at `revision` into the view, unless the view holds a newer one
        (`force`: a direct read, newer than anything the watch has told). Listeners hear real changes."""
        if not force and revision and revision <= self._revisions.get(worker, 0):
            return  # the echo of a write made here, or a stale replay after a re-watch
        self._revisions[worker] = max(self._revisions.get(worker, 0), revision)
        fence: Fence | None = None
        if value is not None:
            try:
                fence = decode_fence(value)
            except (ValueError, FenceError) as exc:
                log.error("ignoring an unreadable fence of %r in the control bucket: %s", worker, exc)
                return
            if fence.worker != worker:
                log.error("ignoring the fence of %r filed under %r's key", fence.worker, worker)
                return
        before = self._fences.get(worker)
        if before == fence:
            return
        if fence is None:
            self._fences = {w: f for w, f in self._fences.items() if w != worker}
        else:
            self._fences = {**self._fences, worker: fence}
        if tell:
            for listener in list(self.listeners):
                try:
                    listener(worker, before, fence)
                except Exception:  # a listener's bug must not stop the watch
                    log.exception("fence listener failed on %s", worker)

    # ------------------------------------------------------------------------------------- legacy
    async def _migrate(self) -> None:
        """This edge's fences.json of an earlier version into the bucket, then renamed `*.migrated`."""
        if not self.path.exists():
            return
        legacy = FenceRegistry(self.path)
        legacy.load()  # FenceFileError for a damaged file: the start stops, as before
        moved = 0
        async with self.lock:
            for worker, fence in sorted(legacy.fences.items()):
                if worker in self._fences:
                    continue  # the cluster's state wins over one edge's old file
                value = encode_fence(fence)
                try:
                    revision = await self._kv.create(fence_key(worker), value)
                except KeyWrongLastSequenceError:
                    continue  # fenced meanwhile elsewhere: that one wins too
                self._apply(worker, value, revision)
                moved += 1
        target = self.path.with_name(self.path.name + MIGRATED_SUFFIX)
        await asyncio.to_thread(os.replace, self.path, target)
        log.info(
            "migrated %d fence(s) from %s to the cluster's control bucket (renamed %s)",
            moved,
            self.path,
            target,
        )
