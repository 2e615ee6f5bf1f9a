"""Delivery records: the gateway's side of a message's story in the wire log (docs/wirelog.md).

The egress proxy records what a worker did for a message; only the gateway knows what the worker was
given and how its claim ended. So for every message handed to a worker (EmoDB poll, SQS ReceiveMessage)
the gateway writes a schema-v1 `delivery` record (body and attributes redacted with the same engine and
`redaction.key` as the proxy, so equal secrets give equal tokens on both sides), and for every claim a
worker ends an `event` record: `ack` (acknowledged / deleted) or `release` (handed back: EmoDB renew
with ttl 0, SQS visibility 0). Replay rebuilds messages from the former and outcomes from the latter.

Writing never slows or fails the receive path: the faces only hand over what they delivered (a list
append); the records are built, redacted and written right after the handler has returned, on the next
turn of the event loop, into the writer's buffer (flushed and fsynced by a 0.25 s timer, at most 1 s lost
on a crash). Order is kept (deliveries and events go through one queue), and a write error is logged and
counted, not raised. A delivery record's `request_id` is the id of the request that sent the message
(gateway.request_ids), which is what ties a producer's request to the message's whole story. Extra
fields beyond the schema (readers ignore what they do not know): `tenant`, `face`
(`emodb`, `dedupq`, `sqs`), `content_type`, `body_redacted` (the body was changed by redaction, so it
cannot be replayed as is), and on events `position` (the id's index in its request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from access.keys import Credential
from queue_core.machine import AckOutcome
from queue_core.machine.records import Received
from wirelog.record import delivery_record, event_record
from wirelog.redaction import RedactionConfig, Redactor, load_or_create_key
from wirelog.writer import FsyncPolicy, WireLogWriter

log = logging.getLogger("strictq.gateway.deliveries")

WRITER_NAME = "gateway"
TICK_INTERVAL = 0.25
Listener = Callable[[dict[str, Any]], None]


class DeliveryLog:
    """Owns the gateway's wire-log writer; the faces call `delivered` and `ended` (a few µs each)."""

    def __init__(
        self,
        directory: Path,
        *,
        key_dir: Path,
        redaction: Path | None = None,
        name: str = WRITER_NAME,
        fsync: FsyncPolicy = "interval",
        compress: bool = True,
        listener: Listener | None = None,
    ) -> None:
        config = RedactionConfig.load(redaction) if redaction is not None else RedactionConfig.default()
        self.redactor = Redactor(config, load_or_create_key(key_dir))
        self.max_body_bytes = config.max_body_bytes
        self.writer = WireLogWriter(directory, name, fsync=fsync, compress=compress)
        self.directory = directory
        self.listener = listener  # replay follows outcomes live through it
        self.errors = 0
        self._ticker: asyncio.Task[None] | None = None
        self._pending: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._scheduled = False
        self._draining = False

    # ------------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the flush timer (needs the running loop)."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_loop(), name="deliveries-tick")

    async def close(self) -> None:
        """Stop the timer, flush, fsync and close the writer (compression waited for off the loop)."""
        self._drain()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if not self.writer.closed:
            await asyncio.to_thread(self.writer.close)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            try:
                self.writer.tick(time.time())
            except Exception:
                self.errors += 1
                log.exception("delivery log: tick failed")

    def flush(self) -> None:
        """Write what is pending and hand the writer's buffer to the OS (tests, shutdown)."""
        self._drain()
        self.writer.flush()

    # ------------------------------------------------------------------------------- the faces' calls
    def delivered(self, credential: Credential, face: str, queue: str, received: Sequence[Received]) -> None:
        """One `delivery` record per message handed to the worker (`queue`: the name it polled)."""
        self._defer(self._deliveries, (time.time(), credential, face, queue, received))

    def ended(
        self,
        credential: Credential,
        face: str,
        queue: str,
        event: str,
        items: Sequence[tuple[str, int | None]],
        outcomes: Sequence[AckOutcome],
    ) -> None:
        """An `ack` or `release` event per claim the request ended (outcome ok; refusals change nothing)."""
        self._defer(self._ended, (time.time(), credential, face, queue, event, items, outcomes))

    def _defer(self, write: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._pending.append((write, args))
        if self._scheduled:
            return
        try:
            asyncio.get_running_loop().call_soon(self._drain)
        except RuntimeError:  # no loop (a synchronous caller): write now
            self._drain()
            return
        self._scheduled = True

    def _drain(self) -> None:
        self._scheduled = False
        self._draining = True
        try:
            while self._pending:
                pending, self._pending = self._pending, []
                for write, args in pending:
                    try:
                        write(*args)
                    except Exception:  # a record that cannot be built must not stop the others
                        self.errors += 1
                        log.exception("delivery log: cannot build a record")
        finally:
            self._draining = False

    # ----------------------------------------------------------------------------------------- records
    def _deliveries(
        self, now: float, credential: Credential, face: str, queue: str, received: Sequence[Received]
    ) -> None:
        redact = self.redactor.body
        max_bytes = self.max_body_bytes
        worker, tenant = credential.id, credential.tenant
        for item in received:
            delivery = item.delivery
            body = item.body
            content_type = item.content_type or None
            shown = redact(content_type, body) if body else body
            too_big = max_bytes is not None and len(shown) > max_bytes
            record = delivery_record(
                queue=queue,
                message_id=delivery.message_id,
                group=delivery.group,
                body=shown,
                keep_body=not too_big,
                attributes=self._attributes(item.extra),
                seq=delivery.seq,
                receive_count=delivery.receive_count,
                ts=now,
                worker=worker,
                lease=delivery.token,
                attempt=delivery.receive_count,
                request_id=item.request_id,  # the id of the request that sent the message
            )
            record["tenant"] = tenant
            record["face"] = face
            record["content_type"] = content_type
            record["body_redacted"] = shown is not body and shown != body
            self._write(record)

    def _ended(
        self,
        now: float,
        credential: Credential,
        face: str,
        queue: str,
        event: str,
        items: Sequence[tuple[str, int | None]],
        outcomes: Sequence[AckOutcome],
    ) -> None:
        worker, tenant = credential.id, credential.tenant
        for position, ((message_id, token), outcome) in enumerate(zip(items, outcomes, strict=False)):
            if outcome.status != "ok":
                continue
            record = event_record(
                event=event, ts=now, worker=worker, queue=queue, message_id=message_id, lease=token
            )
            record["tenant"] = tenant
            record["face"] = face
            record["position"] = position
            self._write(record)

    def note(
        self, event: str, *, queue: str, message_id: str, reason: str, tenant: str | None = None
    ) -> None:
        """Any other `event` about a message (replay writes its own timeouts through this)."""
        self._drain()  # after what was delivered before it
        record = event_record(event=event, reason=reason, queue=queue, message_id=message_id)
        record["tenant"] = tenant
        self._write(record)

    def _attributes(self, extra: bytes) -> Any:
        """The SQS message attributes kept in the core's extra bytes, redacted; None for other faces."""
        if not extra or not extra.startswith(b'{"sqs"'):
            return None
        try:
            data = orjson.loads(extra)
        except orjson.JSONDecodeError:
            return None
        attributes = (data.get("sqs") or {}).get("attributes") if isinstance(data, dict) else None
        return self.redactor.value(attributes) if attributes else None

    def _write(self, record: dict[str, Any]) -> None:
        """Write one record now (after anything still pending, so records keep their order)."""
        if self._pending and not self._draining:
            self._drain()
        try:
            record_id = self.writer.write(record)
        except Exception:  # a full disk must not fail a poll: the message was delivered regardless
            self.errors += 1
            log.exception("delivery log: cannot write a record")
            return
        if self.listener is not None:
            record["id"], record["writer"] = record_id, self.writer.name  # as it reads back
            try:
                self.listener(record)
            except Exception:
                log.exception("delivery log: listener failed")


DELIVERIES = web.AppKey("deliveries", DeliveryLog)


def deliveries_of(request: web.Request) -> DeliveryLog | None:
    """The app's delivery log, or None when the gateway runs without one (tests, benchmarks)."""
    return request.app.get(DELIVERIES)
