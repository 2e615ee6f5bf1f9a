"""A standby's copy of one partition: follows the partition's stream into a local store.

The patent's secondary and tertiary: every node that does not own a partition applies its frames, in
stream order, to its own SQLite store for it (with the stream position in the same transaction), so that a
promotion only has to apply the last few frames before opening the store as a `QueueService`. A node that
restarts resumes right after the position its store recorded; when the stream was trimmed past it (or it
is new), it first puts the partition's snapshot in its store's place (cluster.snapshots).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from queue_core.machine.effects import Effect
from queue_core.store import SqliteStore

from .codec import CodecError, EffectsFrame, EpochMarker, decode_frame
from .snapshots import CatchUp, SnapshotInfo, install

log = logging.getLogger("strictq.cluster")
MAX_FRAMES_PER_COMMIT = 256
# A standby lets frames gather this long before applying them in one transaction: under load several
# frames per commit (one thread hop, one commit for them all); a promotion waits for it at most once.
GATHER_SECONDS = 0.05
INBOX_FRAMES = 4 * MAX_FRAMES_PER_COMMIT  # delivered, not yet applied: past it nats-py's own queue holds them
# A standby opens its store without bumping its epoch (SqliteStore.open: "at least 1" keeps the stored one):
# only epoch markers move it, so an owner's epoch is the master's number unless a store says otherwise.
KEEP_EPOCH = 1


class StreamGap(Exception):
    """The stream skips frames this store lacks: they were trimmed (cluster.snapshots). Never skipped."""


class PartitionFollower:
    def __init__(
        self, store_path: Path, js: JetStreamContext, subject: str, catch_up: CatchUp | None = None
    ) -> None:
        self._path = store_path
        self._js = js
        self._subject = subject
        self._catch_up = catch_up  # how to get past a trimmed stream: its snapshot (None: stop at a gap)
        self.restored: SnapshotInfo | None = None  # the snapshot this follower caught up from, if any
        self._store: SqliteStore | None = None
        self.position = 0
        self.epoch = 0
        self.frames = 0
        self._advanced = asyncio.Event()
        # Frames nats-py delivered (its callback), not yet applied: the follow task takes them in batches.
        self._inbox: list[Msg] = []
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None

    async def start(self) -> None:
        store = self._store
        if store is None:  # a retried start keeps the store it opened
            store = SqliteStore(self._path)
            await asyncio.to_thread(store.open, time.time(), KEEP_EPOCH)
            store.rely_on_stream()
            self._store = store
        self.position = store.position()
        self.epoch = store.epoch()
        if self._catch_up is not None and self.position < await self._catch_up.first_sequence() - 1:
            # The stream no longer holds the frames this store lacks: the partition's snapshot first.
            self._task = asyncio.create_task(
                self._restore_then_follow(self._catch_up), name=f"strictq-restore-{self._subject}"
            )
            return
        subscription = await self._subscribe()
        self._task = asyncio.create_task(self._follow(subscription), name=f"strictq-follow-{self._subject}")

    async def _subscribe(self) -> object:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        if self.position:
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.position + 1
            )
        return await self._js.subscribe(
            self._subject, ordered_consumer=True, config=config, cb=self._delivered
        )

    async def _delivered(self, message: Msg) -> None:
        """nats-py's callback, one frame at a time: into the inbox (a callback, not `next_msg`, which makes
        a task per message). While the inbox is full it waits, and the subscription's own queue fills."""
        while len(self._inbox) >= INBOX_FRAMES:
            self._room.clear()
            await self._room.wait()
        self._inbox.append(message)
        self._arrived.set()

    async def _restore_then_follow(self, catch_up: CatchUp) -> None:
        """Replace the store by the partition's snapshot, then follow the stream's tail from its position.
        Without a usable snapshot: say so once, apply nothing, and try again every retry_seconds (the
        owner takes a new one within cluster.snapshots.SNAPSHOT_SECONDS)."""
        reported = False
        while True:
            try:
                needed = await catch_up.first_sequence() - 1
                if self.position < needed:
                    await self._restore(catch_up, needed)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed = exc  # caught_up() answers at once meanwhile: a promotion gives up, for now
                if not reported:
                    reported = True
                    log.error(
                        "%s was trimmed past this store (at position %d) and it cannot catch up from the "
                        "partition's snapshot: %s; applying nothing, trying again every %gs",
                        self._subject,
                        self.position,
                        exc,
                        catch_up.retry_seconds,
                    )
            await asyncio.sleep(catch_up.retry_seconds)
        self.failed = None
        try:
            subscription = await self._subscribe()
        except Exception as exc:  # JetStream unreachable: the node follows again (cluster.node._refollow)
            self.failed = exc
            log.error("following %s stopped: %s", self._subject, exc)
            return
        await self._follow(subscription)

    async def _restore(self, catch_up: CatchUp, needed: int) -> None:
        copy, info = await catch_up.fetch(self._path, needed)  # checked before the store is touched
        if self._store is not None:
            self._store.close()
            self._store = None
        await asyncio.to_thread(install, copy, self._path)
        store = SqliteStore(self._path)
        await asyncio.to_thread(store.open, time.time(), KEEP_EPOCH)
        store.rely_on_stream()
        self._store = store
        self.position = store.position()
        self.epoch = store.epoch()
        self.restored = info
        self._advanced.set()
        log.info(
            "%s: caught up from the partition's snapshot at position %d; following from there",
            self._subject,
            self.position,
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Stop following and close the store (a promotion opens it as a QueueService next)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._store is not None:
            self._store.close()
            self._store = None

    async def caught_up(self, position: int, within: float) -> bool:
        """Whether this copy reached `position` within `within` seconds."""
        deadline = time.monotonic() + within
        while self.position < position:
            if self.failed is not None:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._advanced.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._advanced.wait(), min(remaining, 0.5))
        return True

    async def _follow(self, subscription: object) -> None:
        inbox = self._inbox
        try:
            while True:
                if not inbox:
                    self._arrived.clear()
                    await self._arrived.wait()
                    if len(inbox) < MAX_FRAMES_PER_COMMIT:
                        await asyncio.sleep(GATHER_SECONDS)
                batch = inbox[:MAX_FRAMES_PER_COMMIT]
                del inbox[:MAX_FRAMES_PER_COMMIT]
                self._room.set()
                await self._apply(batch)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()  # type: ignore[attr-defined]
            raise
        except Exception as exc:  # a frame this version cannot read, or the store failed
            self.failed = exc
            log.error("following %s stopped: %s", self._subject, exc)
            # Let go of the consumer: else it keeps buffering the stream here, and its heartbeat task
            # re-creates it on the server, for as long as the connection lives (a re-follow makes another).
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()  # type: ignore[attr-defined]

    async def _apply(self, messages: list[Msg]) -> None:
        store = self._store
        assert store is not None
        effects: list[Effect] = []
        position = self.position
        for message in messages:
            sequence = message.metadata.sequence.stream
            if sequence <= position:
                continue  # already applied or in this batch (the consumer re-delivered after a reset)
            if sequence > position + 1:
                raise StreamGap(
                    f"{self._subject} goes on at frame {sequence} after this store's {position}: the frames "
                    "between were trimmed; the partition's snapshot has them"
                )
            try:
                frame = decode_frame(message.data)
            except CodecError as exc:
                raise CodecError(f"frame {sequence} of {self._subject}: {exc}") from None
            if isinstance(frame, EffectsFrame):
                effects.extend(frame.effects)
                position = sequence
            elif isinstance(frame, EpochMarker):
                if effects:
                    await asyncio.to_thread(store.apply, effects, position)
                    effects = []
                await asyncio.to_thread(store.mark, sequence, frame.epoch)
                self.epoch = max(self.epoch, frame.epoch)
                position = sequence
                self.position = position
        if effects or position != self.position:
            await asyncio.to_thread(store.apply, effects, position)
        self.frames += len(messages)
        self.position = position
        self._advanced.set()
