"""A standby's copy of one partition: follows the partition's stream into a local store.

The patent's secondary and tertiary: every node that does not own a partition applies its frames, in
stream order, to its own SQLite store for it (with the stream position in the same transaction), so that a
promotion only has to apply the last few frames before opening the store as a `QueueService`. A node that
restarts resumes right after the position its store recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from queue_core.machine.effects import Effect
from queue_core.store import SqliteStore

from .codec import CodecError, EffectsFrame, EpochMarker, decode_frame

log = logging.getLogger("strictq.cluster")
MAX_FRAMES_PER_COMMIT = 256


class PartitionFollower:
    def __init__(self, store_path: Path, js: JetStreamContext, subject: str) -> None:
        self._path = store_path
        self._js = js
        self._subject = subject
        self._store: SqliteStore | None = None
        self.position = 0
        self.epoch = 0
        self.frames = 0
        self._advanced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None

    async def start(self) -> None:
        store = self._store
        if store is None:  # a retried start keeps the store it opened
            store = SqliteStore(self._path)
            await asyncio.to_thread(store.open, time.time())
            self._store = store
        self.position = store.position()
        self.epoch = store.epoch()
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        if self.position:
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.position + 1
            )
        subscription = await self._js.subscribe(self._subject, ordered_consumer=True, config=config)
        self._task = asyncio.create_task(self._follow(subscription), name=f"strictq-follow-{self._subject}")

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
        next_msg = subscription.next_msg  # type: ignore[attr-defined]
        try:
            while True:
                try:
                    first: Msg = await next_msg(timeout=1.0)
                except NatsTimeoutError:
                    continue
                batch = [first]
                while len(batch) < MAX_FRAMES_PER_COMMIT:
                    try:
                        batch.append(await next_msg(timeout=0))
                    except (NatsTimeoutError, TimeoutError):
                        break
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
            if sequence <= self.position:
                continue  # already applied (the consumer re-delivered after a reconnect)
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
