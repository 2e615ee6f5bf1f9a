"""The producer helper: batched sends to the gateway's EmoDB face, with a result per entry.

    async with Producer() as producer:                      # STRICTQ_URL, STRICTQ_CA_FILE, STRICTQ_API_KEY
        results = await producer.send_batch([Entry("orders", {"n": 1}, group="c-1"), ...])
        result = await producer.send("orders", {"n": 2}, group="c-1")   # buffered: joins the next batch

`_sendbatch` takes one group (or none) per request and answers `{"success": true}` or the first failed
message's error (EmoDB: not atomic; the face adds `queue`, `index` and `failed` to the error's details).
So entries are split by group into requests of at most `max_batch` messages, a group's requests go out
one after another in order, and each entry's `SendResult.status` is:

- `sent`: the gateway accepted it;
- `failed`: refused (the request was refused before anything was sent, or this is the entry the error
  names), or not sent at all (the connection was refused for `retry_for` seconds);
- `unknown`: the request failed in a way that leaves this entry's fate open (no answer, a server error, or
  several failures of which only the first is named): it may have been sent;
- `skipped`: not sent because an earlier entry of the same group did not go through (sending it would
  break the group's order).

Each request gets a request id made here (`X-Request-Id`, protocol.request_ids), the same on every retry
of that request; every message the request sent keeps it, its deliveries carry it to workers and the wire
log's records of the message name it, so `SendResult.request_id` is what to log to find them later
(`strictq search --request-id`).

Entries without a group are sent without one: the queue gives each its own group (unordered traffic).
A request that cannot have been applied (the connection was refused, 429, an answer marked retriable) is
retried with full jitter for up to `retry_for` seconds (strictq.sdk.retry); one whose fate is open (no
answer after sending, a 5xx) is not: its entries are `unknown`. Settings that cannot work raise instead
of giving a status per entry, one error naming the setting: `ConfigError` (STRICTQ_URL, STRICTQ_API_KEY,
STRICTQ_CA_FILE missing or invalid), `AuthRefused` (the gateway does not take STRICTQ_API_KEY: 401/403),
`TLSFailed` (the gateway's certificate cannot be verified with STRICTQ_CA_FILE); all are `SetupError`s.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from protocol.estimates import Estimate
from protocol.request_ids import new_request_id

from .client import EmoClient
from .config import ClientConfig
from .errors import GatewayError, SetupError
from .retry import Retry

Status = Literal["sent", "failed", "unknown", "skipped"]


@dataclass(frozen=True, slots=True)
class Entry:
    """`estimate`: seconds to process / pre-process this message (pipelining, opt-in), sent as
    `X-Strictq-Estimate`; entries with different estimates go in different requests, in order."""

    queue: str
    payload: Any
    group: str | None = None
    estimate: Estimate | None = None


@dataclass(frozen=True, slots=True)
class SendResult:
    index: int  # the entry's position in the batch given to send_batch
    entry: Entry
    status: Status
    error: GatewayError | None = None
    request_id: str | None = None  # the X-Request-Id of the request the entry went out (or was tried) in

    @property
    def ok(self) -> bool:
        return self.status == "sent"


class Producer:
    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        api_key: str | None = None,
        max_batch: int = 100,
        linger: float = 0.005,
        timeout: float = 30.0,
        retry_for: float = 5.0,
    ) -> None:
        """`retry_for`: how long a request that cannot have been applied is retried (0: not at all)."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if retry_for < 0:
            raise ValueError("retry_for must not be negative")
        self.retry_for = retry_for
        self.config = config or ClientConfig.from_env()
        self.max_batch = max_batch
        self.linger = linger
        self._client = EmoClient(self.config, api_key or self.config.producer_key(), timeout=timeout)
        self._buffer: list[tuple[Entry, asyncio.Future[SendResult]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self.requests = 0  # _sendbatch requests made (for callers who want to see the batching)

    async def __aenter__(self) -> Producer:
        self._client.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send what is buffered, then close the connection pool."""
        await self.flush()
        await self._client.close()

    # --------------------------------------------------------------------------------- explicit batches

    async def send_batch(
        self, entries: Iterable[Entry | tuple[str, Any] | tuple[str, Any, str | None]]
    ) -> list[SendResult]:
        """Send the entries in as few requests as their groups allow; one result per entry, in order."""
        self._client.open()
        items = [e if isinstance(e, Entry) else Entry(*e) for e in entries]
        results: list[SendResult | None] = [None] * len(items)
        by_group: dict[str | None, list[int]] = {}
        for index, entry in enumerate(items):
            by_group.setdefault(entry.group, []).append(index)
        try:
            async with asyncio.TaskGroup() as tg:
                for group, indexes in by_group.items():
                    name = f"strictq-send-{group}"
                    tg.create_task(self._send_group(group, indexes, items, results), name=name)
        except* SetupError as failed:  # every request fails alike: one error, not a status per entry
            raise failed.exceptions[0] from None
        sent = [r for r in results if r is not None]
        assert len(sent) == len(results)  # every group's task filled its entries
        return sent

    async def _send_group(
        self, group: str | None, indexes: list[int], items: list[Entry], results: list[SendResult | None]
    ) -> None:
        for start, chunk in _chunks(indexes, items, self.max_batch):
            by_queue: dict[str, list[int]] = {}
            for index in chunk:
                by_queue.setdefault(items[index].queue, []).append(index)
            self.requests += 1
            batch = {queue: [items[i].payload for i in idx] for queue, idx in by_queue.items()}
            retry = Retry(f"send to {', '.join(by_queue)}", 0.05, 1.0, idempotent=False)
            deadline = asyncio.get_running_loop().time() + self.retry_for
            request_id = new_request_id()  # one per request, kept across its retries
            try:
                estimate = items[chunk[0]].estimate  # one per request (the chunks split where it changes)
                send = functools.partial(
                    self._client.send_batch, batch, group=group, request_id=request_id, estimate=estimate
                )
                await retry.call(send, deadline=deadline)
            except SetupError:
                raise
            except GatewayError as exc:
                for index, status in _statuses(exc, chunk, by_queue):
                    results[index] = SendResult(index, items[index], status, exc, request_id)
                if group is not None:  # the rest of this group would overtake what did not go through
                    for index in indexes[start + len(chunk) :]:
                        results[index] = SendResult(index, items[index], "skipped", exc)
                    return
                continue
            for index in chunk:
                results[index] = SendResult(index, items[index], "sent", request_id=request_id)

    # ------------------------------------------------------------------------------------ buffered sends

    async def send(
        self, queue: str, payload: Any, *, group: str | None = None, estimate: Estimate | None = None
    ) -> SendResult:
        """Buffer one message; it goes out with others after `linger` seconds or when `max_batch` are
        waiting. Returns its result (`index` is its position in the batch it went out with). `estimate`:
        its processing-time estimate (pipelining; see Entry)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SendResult] = loop.create_future()
        self._buffer.append((Entry(queue, payload, group, estimate), future))
        if len(self._buffer) >= self.max_batch:
            self._start_flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self._start_flush)
        return await future

    async def flush(self) -> None:
        """Send everything buffered now and wait for every flush in progress."""
        self._start_flush()
        # Only the flushes still running: a finished one may wait for its discard callback, and gather of
        # done tasks completes without yielding (Python 3.12), which would spin here forever.
        while pending := [task for task in self._flushes if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        task = asyncio.get_running_loop().create_task(self._flush(batch), name="strictq-producer-flush")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[tuple[Entry, asyncio.Future[SendResult]]]) -> None:
        try:
            results = await self.send_batch([entry for entry, _ in batch])
        except Exception as exc:  # surfaced to every waiting caller (a bug, not a refusal: those are results)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


def _chunks(indexes: list[int], items: list[Entry], size: int) -> list[tuple[int, list[int]]]:
    """A group's entries as requests, in order: at most `size` each, split where the estimate changes
    (a request carries one). (position of the chunk's first entry in `indexes`, the chunk)."""
    out: list[tuple[int, list[int]]] = []
    start = 0
    for position, index in enumerate(indexes):
        if position > start and (
            position - start >= size or items[index].estimate != items[indexes[start]].estimate
        ):
            out.append((start, indexes[start:position]))
            start = position
    if start < len(indexes):
        out.append((start, indexes[start:]))
    return out


def _statuses(
    exc: GatewayError, chunk: list[int], by_queue: dict[str, list[int]]
) -> list[tuple[int, Status]]:
    details: dict[str, Any] = {}
    if isinstance(exc.body, dict) and isinstance(exc.body.get("error"), dict):
        details = exc.body["error"].get("details") or {}
    queue, position, failed = details.get("queue"), details.get("index"), details.get("failed")
    if queue in by_queue and isinstance(position, int) and 0 <= position < len(by_queue[queue]):
        # The request was sent: the named entry failed; the others went through when it was the only one.
        named = by_queue[queue][position]
        others: Status = "sent" if failed == 1 else "unknown"
        return [(i, "failed" if i == named else others) for i in chunk]
    if not exc.sent or (400 <= exc.status < 500 and exc.status not in (408, 429)):
        return [(i, "failed") for i in chunk]  # refused before anything was sent
    return [(i, "unknown") for i in chunk]
