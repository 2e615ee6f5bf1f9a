"""A partition owner's commit log: each group commit goes to the partition's JetStream stream first.

`QueueService` writes through this instead of `queue_core.durability.DurableLog` on a partition's owner:
the effects of everything submitted since the last append travel as one frame (or a few, under
MAX_FRAME_BYTES), appended with `Nats-Expected-Last-Sequence`; once the stream's quorum has acknowledged it,
the same effects commit to the local store (with the stream position) and the requests' futures resolve.
So an answer to a client always means "on a quorum of the stream", and the local store is always a prefix
of the stream, which is what a standby or a restarted node resumes from (cluster.follower).

One append in flight at a time, by design: the expected-last-sequence check needs the previous append's
sequence, and it is what fences a deposed owner at the storage (Kleppmann's rule): after a new owner's
epoch marker, this owner's next append is refused by JetStream itself (err_code 10071), and it steps down.
While an append is in flight, the next batch accumulates, so the rate stays high under load; under load
the sender also lingers a few milliseconds before the next append (LINGER), so a frame carries several
group commits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

from queue_core.durability import NO_BODIES, Bodies, CommitLog, DurableLog, LogFactory
from queue_core.machine import Unavailable
from queue_core.machine.effects import DURABLE_EFFECTS, Effect
from queue_core.store import SqliteStore

from .codec import EffectsFrame, encode_frame, split_effects
from .layout import MAX_FRAME_BYTES

log = logging.getLogger("strictq.cluster")

WRONG_LAST_SEQUENCE = 10071  # JetStream's err_code when Nats-Expected-Last-Sequence does not hold
# How long an append is retried (same Nats-Msg-Id, so at most one copy lands) before the owner gives up
# and steps down: a stream leader's failover measured 4-9 s here.
APPEND_RETRY_SECONDS = 12.0
APPEND_TIMEOUT = 2.0
# Under load (the previous append ended less than BUSY_GAP ago) the sender lets submissions gather for
# LINGER more before the next append: several group commits per frame, so fewer frames for JetStream's
# replicas, the standbys and nats-py to handle per message. Idle, an append goes at once.
LINGER = 0.005
BUSY_GAP = 0.02


Submission = tuple[list[Effect], list[int], "asyncio.Future[Bodies]"]  # effects, keys to fetch, answer


class Deposed(Exception):
    """JetStream refused an append: another owner wrote to the partition's stream since."""


class ReplicatedLog:
    """`queue_core.durability.CommitLog` for a partition's owner (see the module docstring)."""

    def __init__(
        self,
        inner: DurableLog,
        js: JetStreamContext,
        subject: str,
        *,
        last_sequence: int,
        epoch: int,
        on_failed: Callable[[BaseException], None],
        loop: asyncio.AbstractEventLoop,
        retry_seconds: float = APPEND_RETRY_SECONDS,
    ) -> None:
        self._inner = inner
        self._js = js
        self._subject = subject
        self.last_sequence = last_sequence
        self._epoch = epoch
        self._on_failed = on_failed
        self._loop = loop
        self._retry_seconds = retry_seconds
        self._queue: list[Submission] = []
        self._last: asyncio.Future[Bodies] | None = None
        self._failed: BaseException | None = None
        self._appends = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._abandoned = False
        self._stopped = threading.Event()
        self._last_append = 0.0  # monotonic time the previous append ended
        self._sender = loop.create_task(self._send_forever(), name=f"strictq-append-{subject}")
        self.frames = 0

    @property
    def failed(self) -> BaseException | None:
        return self._failed or self._inner.failed

    def submit(self, effects: Sequence[Effect], fetch: Sequence[int] = ()) -> asyncio.Future[Bodies]:
        durable: list[Effect] = [e for e in effects if isinstance(e, DURABLE_EFFECTS)]
        future: asyncio.Future[Bodies] = self._loop.create_future()
        if self.failed is not None:
            future.set_exception(self._refusal())
            return future
        if not durable and not fetch:
            last = self._last
            if last is None or last.done():
                future.set_result(NO_BODIES)
                return future
            return last
        self._queue.append((durable, list(fetch), future))
        self._last = future
        self._wake.set()
        return future

    def close(self) -> None:
        """From a worker thread (QueueService.close): let the sender finish what is queued, then commit."""
        self._loop.call_soon_threadsafe(self._begin_close)
        if not self._stopped.wait(timeout=self._retry_seconds + 5):
            # Still retrying an append (a batch of several frames can outlast the wait): whatever it
            # finishes now must not reach the closed store; its requests fail as a lost ownership does.
            self._abandoned = True
        self._inner.close()

    def _begin_close(self) -> None:
        self._closing = True
        self._wake.set()

    def _refusal(self) -> Unavailable:
        return Unavailable(f"this node no longer owns the partition ({self._failed}); retry")

    async def _send_forever(self) -> None:
        try:
            while True:
                if not self._queue:
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._closing and time.monotonic() - self._last_append < BUSY_GAP:
                    await asyncio.sleep(LINGER)
                batch, self._queue = self._queue, []
                try:
                    await self._replicate(batch)
                except Exception as exc:
                    self._fail(batch, exc)
                    return
        finally:
            self._stopped.set()

    async def _replicate(self, batch: list[Submission]) -> None:
        effects = [effect for durable, _, _ in batch for effect in durable]
        position = 0
        for frame in split_effects(effects, MAX_FRAME_BYTES) if effects else ():
            position = await self._append(frame)
        self._last_append = time.monotonic()
        if self._abandoned:  # closed meanwhile (see close): on the stream, but not answered here
            raise Unavailable("the partition was closed while its append was retried")
        # The local commit, in the same order; the last submission carries the stream position.
        for index, (durable, fetch, future) in enumerate(batch):
            last = index == len(batch) - 1
            inner = self._inner.submit(durable, fetch, position if last else 0)
            inner.add_done_callback(functools.partial(_copy, target=future))

    async def _append(self, frame: EffectsFrame) -> int:
        payload = encode_frame(frame)
        self._appends += 1
        headers = {
            "Nats-Msg-Id": f"e{self._epoch}.{self._appends}",
            "Nats-Expected-Last-Sequence": str(self.last_sequence),
        }
        deadline = time.monotonic() + self._retry_seconds
        while True:
            try:
                ack = await self._js.publish(self._subject, payload, timeout=APPEND_TIMEOUT, headers=headers)
            except APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    raise Deposed(f"another owner appended to {self._subject}") from None
                if time.monotonic() > deadline:
                    raise
                log.warning("append to %s refused (%s); retrying", self._subject, exc)
            except (NatsTimeoutError, NoRespondersError, NoStreamResponseError, TimeoutError) as exc:
                # No stream leader right now (an election after a server died): the same append again.
                if time.monotonic() > deadline:
                    raise Unavailable(f"the partition's stream did not acknowledge: {exc!r}") from None
            except ConnectionClosedError:
                raise
            else:
                self.last_sequence = ack.seq
                self.frames += 1
                return ack.seq
            await asyncio.sleep(0.1)

    def _fail(self, batch: list[Submission], exc: Exception) -> None:
        self._failed = exc
        log.error("partition stream %s: %s; stepping down", self._subject, exc)
        pending = batch + self._queue
        self._queue = []
        for _, _, future in pending:
            if not future.done():
                future.set_exception(self._refusal())
        self._on_failed(exc)


def _copy(source: asyncio.Future[Bodies], target: asyncio.Future[Bodies]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def replicated_logs(
    js: JetStreamContext,
    subject: str,
    *,
    last_sequence: int,
    epoch: int,
    on_failed: Callable[[BaseException], None],
    made: Callable[[ReplicatedLog], None],
    retry_seconds: float = APPEND_RETRY_SECONDS,
) -> LogFactory:
    """The `log_factory` of a partition owner's QueueService: its store's DurableLog behind a ReplicatedLog
    appending to `subject` after `last_sequence` (the owner's epoch marker); `made` gets the log."""

    def factory(
        store: SqliteStore, loop: asyncio.AbstractEventLoop, on_commit: Callable[[int], None]
    ) -> CommitLog:
        store.rely_on_stream()  # the stream is the durable record: no fsync per local commit
        log = ReplicatedLog(
            DurableLog(store, loop, on_commit),
            js,
            subject,
            last_sequence=last_sequence,
            epoch=epoch,
            on_failed=on_failed,
            loop=loop,
            retry_seconds=retry_seconds,
        )
        made(log)
        return log

    return factory
