"""Snapshots of a partition's store, and trimming the partition's stream behind them.

A partition's stream would otherwise grow forever, and a new node would replay it from its first frame.
Instead (issue 15: "a new node catches up from a snapshot plus the stream's tail"):

- the owner of a partition copies its store now and then (`Snapshotter`: every SNAPSHOT_EVERY frames or
  SNAPSHOT_SECONDS, one at a time) with SQLite's online backup API, from a read connection of its own in
  a worker thread, so the writer is not blocked; the copy's `stream_seq` is the stream position it
  covers. It goes to the cluster's JetStream object store (`sq_<id>_snapshots`, object `p<N>`, replicated
  as the streams are), replacing the previous one, with its position and epoch in the object's headers;
- the master purges each stream up to the snapshot's position at most (`Trimmer`), and never past a live
  node still following that stream from its own store, unless that node is so far behind (FAR_BEHIND) that
  the snapshot is the quicker way for it anyway;
- a follower whose store is behind the stream's first frame (`PartitionFollower` notices it at start, and
  as a gap while following) downloads the snapshot, checks it and puts it in its store's place
  (`CatchUp`), then follows from the snapshot's position on. Without a usable snapshot it applies nothing:
  a gap in a store would be silent data loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nats.errors import Error as NatsError
from nats.js.api import ObjectInfo, ObjectMeta
from nats.js.client import JetStreamContext
from nats.js.errors import BadObjectMetaError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from wirelog.files import create_private

from .layout import ClusterLayout
from .ownership import Assignment, NodeInfo

log = logging.getLogger("strictq.cluster")

SNAPSHOT_EVERY = 5_000  # frames appended since the last snapshot
SNAPSHOT_SECONDS = 60.0  # or this long since it, whichever comes first (only when something was appended)
CHECK_SECONDS = 1.0  # how often an owner looks whether a snapshot is due
TRIM_SECONDS = 5.0  # how often the master trims the streams
FAR_BEHIND = 100_000  # frames: a follower this far behind its owner catches up from the snapshot instead
RESTORE_RETRY = 5.0  # seconds between a follower's attempts while no usable snapshot exists
DOWNLOAD_SECONDS = 600.0  # a download that has not finished by then is abandoned (and tried again)
POSITION_HEADER = "Strictq-Position"
EPOCH_HEADER = "Strictq-Epoch"
OUTGOING = "snapshot-out.sqlite3"  # next to the store: where an owner's copy is made before the upload
INCOMING = "snapshot-in.sqlite3"  # and where a follower's download lands before it is checked and moved


class SnapshotError(Exception):
    """A snapshot that cannot be used: none yet, unreadable, corrupt, or older than the stream's start."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    partition: int
    position: int  # the stream sequence of the last frame the copy holds
    epoch: int
    size: int


def object_name(partition: int) -> str:
    return f"p{partition}"


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


def _remove(path: Path) -> None:
    for stale in (path, *_sidecars(path)):
        stale.unlink(missing_ok=True)


def _meta(db: sqlite3.Connection) -> tuple[int, int]:
    rows = dict(db.execute("SELECT name, value FROM meta WHERE name IN ('stream_seq', 'epoch')").fetchall())
    return int(rows.get("stream_seq", 0)), int(rows.get("epoch", 0))


# ------------------------------------------------------------------------- local files (worker threads)
def copy_store(store_path: Path, into: Path) -> tuple[int, int]:
    """A consistent copy of the store at `store_path` in `into` (one file, no -wal), and its (position,
    epoch). SQLite's backup from a read-only connection: one read transaction, which in WAL mode never
    blocks the store's writer."""
    _remove(into)
    create_private(into)  # 0600 like the store itself
    source = sqlite3.connect(f"{store_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        target = sqlite3.connect(into, isolation_level=None)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # a self-contained file: nothing left in a -wal
            return _meta(target)
        finally:
            target.close()
    finally:
        source.close()


def check_copy(path: Path) -> tuple[int, int]:
    """The (position, epoch) of a downloaded snapshot, after SQLite's quick_check; SnapshotError when it is
    not a store."""
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            verdict = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
            if verdict != ["ok"]:
                raise SnapshotError(f"the snapshot fails SQLite's check: {'; '.join(map(str, verdict[:3]))}")
            db.execute("PRAGMA journal_mode=DELETE")
            return _meta(db)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise SnapshotError(f"the snapshot is not a readable store: {exc}") from None


def install(copy: Path, store_path: Path) -> None:
    """Put a checked copy in the store's place, atomically (the store is closed). The old store's -wal
    and -shm go first: SQLite would otherwise replay them into the new file."""
    with open(copy, "rb") as handle:
        os.fsync(handle.fileno())
    for stale in _sidecars(store_path):
        stale.unlink(missing_ok=True)
    os.replace(copy, store_path)
    directory = os.open(store_path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


# ------------------------------------------------------------------------------------ the bucket
class SnapshotBucket:
    """The cluster's snapshot object store (created by cluster.layout.ensure_streams)."""

    def __init__(self, js: JetStreamContext, layout: ClusterLayout) -> None:
        self._js = js
        self.layout = layout
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self._js.object_store(self.layout.snapshots_bucket)
        return self._store

    async def info(self, partition: int) -> SnapshotInfo | None:
        """The partition's snapshot as its record describes it; None when there is none."""
        try:
            info = await (await self._bucket()).get_info(object_name(partition))
        except ObjectNotFoundError:
            return None
        except BadObjectMetaError:
            raise SnapshotError(f"partition {partition}'s snapshot record is unreadable") from None
        return _described(partition, info)

    async def upload(self, partition: int, path: Path, position: int, epoch: int) -> SnapshotInfo:
        """Store the copy at `path` as the partition's snapshot, streamed in the object store's chunks;
        an older copy than the stored one is not uploaded (a deposed owner's late snapshot)."""
        with contextlib.suppress(SnapshotError):  # an unreadable record is replaced
            current = await self.info(partition)
            if current is not None and current.position >= position:
                return current
        meta = ObjectMeta(
            name=object_name(partition),
            description=f"partition {partition} at stream position {position}, epoch {epoch}",
            headers={POSITION_HEADER: [str(position)], EPOCH_HEADER: [str(epoch)]},
        )
        bucket = await self._bucket()
        handle = await asyncio.to_thread(path.open, "rb")
        try:
            info = await bucket.put(object_name(partition), handle, meta=meta)
        finally:
            handle.close()
        return _described(partition, info)

    async def download(self, partition: int, into: Path, within: float = DOWNLOAD_SECONDS) -> SnapshotInfo:
        """The partition's snapshot written to `into` (the object store checks its SHA-256); SnapshotError
        when there is none or it cannot be fetched."""
        info = await self.info(partition)
        if info is None:
            raise SnapshotError(f"partition {partition} has no snapshot in {self.layout.snapshots_bucket}")
        _remove(into)
        create_private(into)
        bucket = await self._bucket()
        handle = await asyncio.to_thread(into.open, "wb")
        try:
            await asyncio.wait_for(bucket.get(object_name(partition), writeinto=handle), within)
            await asyncio.to_thread(os.fsync, handle.fileno())
        except (NatsError, TimeoutError) as exc:
            handle.close()
            _remove(into)
            raise SnapshotError(f"partition {partition}'s snapshot could not be fetched: {exc!r}") from None
        finally:
            handle.close()
        return info


def _described(partition: int, info: ObjectInfo) -> SnapshotInfo:
    headers = info.headers or {}
    try:
        position = int(_header(headers, POSITION_HEADER))
        epoch = int(_header(headers, EPOCH_HEADER))
    except (KeyError, IndexError, TypeError, ValueError):
        raise SnapshotError(f"partition {partition}'s snapshot record has no readable position") from None
    return SnapshotInfo(partition, position, epoch, int(info.size or 0))


def _header(headers: Mapping[str, object], name: str) -> str:
    value = headers[name]
    if isinstance(value, list):
        return str(value[0])
    return str(value)


# -------------------------------------------------------------------------------- the owner's side
class Snapshotter:
    """Takes the snapshots of the partitions this node serves, one at a time.

    `serving()`: partition -> (store path, stream position of its last commit) for every partition this
    node serves now."""

    def __init__(
        self,
        bucket: SnapshotBucket,
        serving: Callable[[], Mapping[int, tuple[Path, int]]],
        *,
        every: int = SNAPSHOT_EVERY,
        seconds: float = SNAPSHOT_SECONDS,
        interval: float = CHECK_SECONDS,
    ) -> None:
        self.bucket = bucket
        self._serving = serving
        self.every = every
        self.seconds = seconds
        self.interval = interval
        self._last: dict[int, tuple[int, float]] = {}  # partition -> (position of its snapshot, when)
        self._not_before: dict[int, float] = {}  # after a failure
        self.taken = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("snapshots")

    async def check(self) -> None:
        """Take every snapshot that is due now."""
        serving = dict(self._serving())
        for partition in set(self._last) - set(serving):
            del self._last[partition]  # served elsewhere meanwhile: read its snapshot again if it returns
        for partition, (store_path, position) in serving.items():
            now = time.monotonic()
            if now < self._not_before.get(partition, 0.0):
                continue
            try:
                if await self._due(partition, position, now):
                    await self.take(partition, store_path)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._not_before[partition] = now + min(self.seconds, 10.0)
                log.warning("partition %d: the snapshot failed: %s", partition, exc)

    async def _due(self, partition: int, position: int, now: float) -> bool:
        if partition not in self._last:
            with contextlib.suppress(SnapshotError):  # an unreadable record: the next snapshot replaces it
                stored = await self.bucket.info(partition)
                self._last[partition] = (stored.position if stored else 0, now)
            self._last.setdefault(partition, (0, now))
        last, when = self._last[partition]
        return position - last >= self.every or (position > last and now - when >= self.seconds)

    async def take(self, partition: int, store_path: Path) -> SnapshotInfo:
        """Copy the partition's store and upload it as its snapshot now."""
        started = time.monotonic()
        outgoing = store_path.parent / OUTGOING
        try:
            position, epoch = await asyncio.to_thread(copy_store, store_path, outgoing)
            info = await self.bucket.upload(partition, outgoing, position, epoch)
        finally:
            await asyncio.to_thread(_remove, outgoing)
        self._last[partition] = (info.position, time.monotonic())
        self.taken += 1
        log.info(
            "partition %d: snapshot at stream position %d (%d bytes, %.2fs)",
            partition,
            info.position,
            info.size,
            time.monotonic() - started,
        )
        return info


# ---------------------------------------------------------------------------- the follower's side
class CatchUp:
    """A follower's way back when the stream was trimmed past its store: the partition's snapshot."""

    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        partition: int,
        *,
        retry_seconds: float = RESTORE_RETRY,
        download_seconds: float = DOWNLOAD_SECONDS,
    ) -> None:
        self._js = js
        self.bucket = SnapshotBucket(js, layout)
        self.partition = partition
        self.stream = layout.stream(partition)
        self.retry_seconds = retry_seconds
        self.download_seconds = download_seconds

    async def first_sequence(self) -> int:
        """The stream's first frame still kept (last + 1 when it is purged empty)."""
        return int((await self._js.stream_info(self.stream)).state.first_seq)

    async def fetch(self, store_path: Path, needed: int) -> tuple[Path, SnapshotInfo]:
        """The partition's snapshot downloaded next to `store_path` and checked: it must be a sound SQLite
        store reaching at least stream position `needed`. SnapshotError otherwise (nothing is kept)."""
        incoming = store_path.parent / INCOMING
        info = await self.bucket.download(self.partition, incoming, self.download_seconds)
        try:
            # Its own meta is what counts (the record may be a newer one's, replaced during the download).
            position, epoch = await asyncio.to_thread(check_copy, incoming)
            if position < needed:
                raise SnapshotError(
                    f"the snapshot reaches stream position {position}; the stream {self.stream} now starts "
                    f"after {needed}: the frames between are gone until a newer snapshot is taken"
                )
        except BaseException:
            await asyncio.to_thread(_remove, incoming)
            raise
        return incoming, SnapshotInfo(self.partition, position, epoch, info.size)


# ----------------------------------------------------------------------------------- the master's side
def trim_floor(
    snapshot: int | None,
    owner_position: int | None,
    followers: Iterable[int],
    first_seq: int,
    far_behind: int = FAR_BEHIND,
) -> int:
    """The highest stream position that may be purged now (0: nothing): never past the snapshot, nor
    past a follower within `far_behind` frames of the owner that still follows from its own store
    (one already behind the stream's start needs the snapshot whatever happens)."""
    if snapshot is None or owner_position is None:
        return 0
    floor = snapshot
    for applied in followers:
        if applied < first_seq - 1 or owner_position - applied > far_behind:
            continue
        floor = min(floor, applied)
    return max(floor, 0)


class Trimmer:
    """The master's trimming of the partition streams, each at most every `interval` seconds."""

    def __init__(
        self,
        js: JetStreamContext,
        layout: ClusterLayout,
        *,
        interval: float = TRIM_SECONDS,
        far_behind: int = FAR_BEHIND,
    ) -> None:
        self._js = js
        self.layout = layout
        self.bucket = SnapshotBucket(js, layout)
        self.interval = interval
        self.far_behind = far_behind
        self._next: dict[int, float] = {}
        self._cursor = 0

    async def tick(self, nodes: Mapping[str, NodeInfo], assignments: Mapping[int, Assignment]) -> None:
        """From the master's decide loop: trim the next partition's stream in turn if its last trim is
        `interval` ago. One partition a tick (two JetStream requests): failover decisions never wait for
        a round over hundreds of streams."""
        partition = self._cursor % self.layout.partitions
        now = time.monotonic()
        if now < self._next.get(partition, 0.0):
            return
        self._cursor += 1
        self._next[partition] = now + self.interval
        try:
            await self.trim(partition, nodes, assignments.get(partition))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("trimming partition %d's stream: %s", partition, exc)

    async def trim(self, partition: int, nodes: Mapping[str, NodeInfo], assignment: Assignment | None) -> int:
        """Purge the partition's stream as far as `trim_floor` allows; the stream's first sequence after."""
        stream = self.layout.stream(partition)
        first_seq = int((await self._js.stream_info(stream)).state.first_seq)
        owner = nodes.get(assignment.node) if assignment is not None else None
        if owner is None or assignment is None or owner.incarnation != assignment.incarnation:
            return first_seq  # nobody serves it now: leave it alone
        if partition not in owner.serving:
            return first_seq
        snapshot = await self.bucket.info(partition)
        followers = [info.applied.get(partition, 0) for name, info in nodes.items() if name != owner.node]
        floor = trim_floor(
            snapshot.position if snapshot else None,
            owner.applied.get(partition, 0),
            followers,
            first_seq,
            self.far_behind,
        )
        if floor + 1 <= first_seq:
            return first_seq
        await self._js.purge_stream(stream, seq=floor + 1)  # keeps floor + 1 on
        log.info(
            "partition %d: stream trimmed to start at %d (its snapshot is at %d)",
            partition,
            floor + 1,
            snapshot.position if snapshot else 0,
        )
        return floor + 1
