"""A queue server in another process, behind the same interface as the in-process `QueueService`.

`strictq serve --queue-server URL` puts this behind the gateway instead of a local core: every call
becomes one request to the internal API of `strictq queue-server` (queue_core/server.py), built from the
operations' table (queue_core.operations: `call` of an operation bound to its arguments, the one call
path), and the server's typed JSON errors become the same `QueueError` subclasses the core raises, so the
faces map them exactly as they do in-process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import aiohttp
import orjson

from protocol.errors import StrictqError
from protocol.headers import PARTITION

from . import internal_client
from . import operations as ops
from .backend import DedupReach
from .fences import Fence
from .figures import Figures
from .internal_auth import InternalSecret
from .machine import (
    AckOutcome,
    GroupPolicy,
    MoveStatus,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    Redriven,
    SendRequest,
    SendResult,
    Unavailable,
    error_from_dict,
)
from .machine.capabilities import PLAIN, Capabilities
from .machine.core import RenewMode
from .machine.gauges import TOP_GROUPS
from .machine.groups import DEFAULT_PARTITIONS
from .machine.handover import HandoverPolicy
from .machine.inputs import AttemptResult
from .machine.routing import VersionFigures
from .operations import Call
from .service import MAX_WAIT, Received

log = logging.getLogger("strictq.remote")
PROBE_INTERVAL = 1.0
R = TypeVar("R")


class Unreachable(Unavailable):
    """The queue server could not be reached: no connection was made, so the request never arrived and
    sending it again (there or to another node) cannot apply it twice. Same code as `Unavailable`."""


class Refused(StrictqError):
    """A queue server's 4xx on an admin call, passed on to the gateway's caller as it was: the same
    status and the same error object (code, message, details)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", "")))
        self.status = status
        self.code = str(error.get("code", "bad_request"))
        self.error = error

    def to_dict(self) -> dict[str, Any]:
        return self.error


class CredentialRefused(Unavailable):
    """The queue server refused this client's internal secret (401/403, queue_core.internal_auth): the
    request was not applied, and sending it again (anywhere) will not help until the secret is fixed. For
    the gateway's own clients a 503, as for any queue server that cannot serve them."""


class RemoteQueueService:
    """The internal API of a `strictq queue-server`, spoken with one pooled aiohttp session.

    `partition`: a cluster node's partition this client speaks to (every request carries it in the
    X-Strictq-Partition header; a node that does not serve it answers 421 `not_owner`). `session`: a
    session shared with other clients (one connection pool for a cluster gateway's many partitions);
    it is used from construction on and left open by `close()`."""

    def __init__(
        self,
        url: str,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        ca_file: str | None = None,
        timeout: float = 30.0,
        probe_interval: float = PROBE_INTERVAL,
        partition: int | None = None,
        session: aiohttp.ClientSession | None = None,
        secret: InternalSecret | None = None,
    ) -> None:
        self.partitions = partitions
        self.dedup_reach: DedupReach = "queue"  # one core holds every group (queue_core.backend)
        self.partition = partition
        # Every request: an operation of the table over the one transport (queue_core.internal_client).
        headers = {} if partition is None else {PARTITION: str(partition)}
        self._client = internal_client.InternalClient(url, headers)
        self.calls: Counter[str] = Counter()  # requests sent, by operation (how a cluster spread its calls)
        self._ca_file = ca_file
        self._secret = secret  # sent by the session it makes (a shared session carries its own)
        self.refused: str | None = None  # why the server refuses our internal secret (None: it does not)
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._session: aiohttp.ClientSession | None = session
        self._own_session = session is None
        self._ready = False
        self._stopping = False
        self._probe: asyncio.Task[None] | None = None
        self._polls: set[asyncio.Task[Any]] = set()
        # State transfer: the groups the last poll answer to a donor named for upload, by (queue, worker);
        # set only when named, taken by `export_requests` right after that poll (so it stays small).
        self._exports: dict[tuple[str, str], list[str]] = {}

    @property
    def url(self) -> str:
        """The queue server's base URL (a test points the client at a restarted server by setting it)."""
        return self._client.url

    @url.setter
    def url(self, url: str) -> None:
        self._client.url = url.rstrip("/")

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._own_session:
            self._session = client_session(self._ca_file, self._secret)
        await self._check_ready()
        if not self._ready:
            log.warning("queue server %s is not ready yet; /readyz answers 503 until it is", self.url)
        self._probe = asyncio.create_task(self._probe_forever(), name="strictq-queue-server-probe")

    @property
    def healthy(self) -> bool:
        """Ready as of the last probe (at most `probe_interval` old); failed calls mark it unready."""
        return self._ready and not self._stopping

    def stop_waiting(self) -> None:
        """Shutting down: long polls in flight end now with nothing (their claims expire on the server)."""
        self._stopping = True
        for task in list(self._polls):
            task.cancel("strictq: gateway stopping")

    async def close(self) -> None:
        self.stop_waiting()
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
            self._probe = None
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self._probe_interval)
            await self._check_ready()

    async def _check_ready(self) -> None:
        try:
            assert self._session is not None
            timeout = aiohttp.ClientTimeout(total=max(1.0, self._probe_interval))
            async with self._client.request(self._session, ops.READYZ.bind(), timeout=timeout) as response:
                ready = response.status == 200
                if response.status in (401, 403):
                    self._refused(response.status)
                else:
                    self.refused = None
        except (aiohttp.ClientError, TimeoutError, OSError):
            ready = False
        if ready != self._ready:
            log.info("queue server %s is %s", self.url, "ready" if ready else "not ready")
        self._ready = ready

    def _refused(self, status: int) -> CredentialRefused:
        """The server refuses our internal secret (401: none sent, 403: another): one ERROR line when
        this starts, and the caller's error: 503 for the gateway's clients (their request was fine)."""
        why = (
            f"queue server {self.url} refuses this client's internal secret (HTTP {status}): give the "
            "gateway the file of the queue server's internal secret (--internal-secret / "
            "STRICTQ_INTERNAL_SECRET_FILE)"
        )
        if self.refused is None:
            log.error("%s", why)
        self.refused = why
        self._ready = False
        return CredentialRefused(f"queue server {self.url} refused the gateway's internal credential")

    # ---------------------------------------------------------------------------------- plumbing
    async def call(self, call: Call[R], *, deadline: float | None = None) -> R:
        """The one call path: an operation of the table (queue_core.operations) bound to its arguments,
        sent, and its answer decoded by the operation. `deadline`: seconds to wait at most (default: the
        client's timeout)."""
        return call.operation.decode(await self._payload(call, deadline))

    async def _payload(self, call: Call[Any], deadline: float | None) -> Any:
        """One request; its JSON answer. Errors come back as the core's typed errors; for a `batch`
        operation, a 4xx that still carries per-item results (every item failed) returns them instead of
        raising; for a `passed_on` one, a 4xx is `Refused`, carrying the queue server's status and error
        body unchanged (the admin routes a gateway serves from the queue server: queue_core.health_view,
        queue_core.fleet_remote)."""
        if self._session is None:
            raise Unavailable("the gateway's queue-server client is not started")
        operation = call.operation
        self.calls[operation.name] += 1
        timeout = aiohttp.ClientTimeout(total=deadline or self._timeout)
        try:
            answer = await self._client.exchange(self._session, call, limit=timeout)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:  # never sent
            self._ready = False
            raise Unreachable(f"queue server {self.url} did not answer: {_why(exc)}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._ready = False
            raise Unavailable(f"queue server {self.url} did not answer: {_why(exc)}") from None
        status, raw = answer.status, answer.raw
        try:
            payload = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            raise Unavailable(
                f"queue server {self.url} answered HTTP {status} without JSON: {raw[:200]!r}"
            ) from None
        if status < 400:
            return payload
        if status in (401, 403):  # the internal API's credential, not the gateway client's request
            raise self._refused(status)
        if operation.batch and isinstance(payload, dict) and isinstance(payload.get("results"), list):
            return payload
        error = payload.get("error") if isinstance(payload, dict) else None
        if status >= 500 or not isinstance(error, dict):
            raise Unavailable(f"queue server {self.url} answered HTTP {status}: {raw[:200]!r}")
        if operation.passed_on:  # an admin route's refusal, as the queue server gave it (status, body)
            raise Refused(status, error)
        raise error_from_dict(error)

    # ------------------------------------------------------------------------------------ queues
    async def create_queue(self, name: str, attributes: dict[str, Any] | None = None) -> QueueAttributes:
        return await self.call(ops.CREATE_QUEUE.bind(name, attributes))

    async def set_attributes(self, name: str, changes: dict[str, Any]) -> QueueAttributes:
        return await self.call(ops.SET_ATTRIBUTES.bind(name, changes))

    async def delete_queue(self, name: str) -> None:
        await self.call(ops.DELETE_QUEUE.bind(name))

    async def list_queues(self, prefix: str = "") -> list[str]:
        return await self.call(ops.LIST_QUEUES.bind(prefix))

    async def attributes(self, name: str) -> QueueAttributes:
        return (await self.call(ops.GET_QUEUE.bind(name))).attributes

    async def created_at(self, name: str) -> float:
        return (await self.call(ops.GET_QUEUE.bind(name))).created_at

    async def metrics(self, name: str) -> QueueMetrics:
        return (await self.call(ops.GET_QUEUE.bind(name))).metrics

    async def group_metrics(self, name: str, group: str) -> dict[str, Any]:
        return await self.call(ops.GROUP_METRICS.bind(name, group))

    async def figures(self, top: int = TOP_GROUPS, *, deadline: float | None = None) -> Figures:
        """The queue server's figures (queue_core.figures); `deadline`: seconds to wait at most (a scrape
        should not wait the full request timeout for one slow partition)."""
        call = ops.FIGURES.bind(top)
        payload = await self._payload(call, deadline)
        try:
            return call.operation.decode(payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise Unavailable(
                f"queue server {self.url} answered figures that cannot be read: {exc}"
            ) from None

    # -------------------------------------------------------------------------------- messages
    async def send(
        self, queue: str, requests: Sequence[SendRequest], *, create: bool = False
    ) -> list[SendResult | QueueError]:
        return await self.call(ops.SEND.bind(queue, requests, create))

    async def receive(
        self,
        queue: str,
        limit: int = 10,
        ttl: float | None = None,
        worker: str = "",
        wait: float = 0.0,
        probes: bool = True,
        capabilities: Capabilities = PLAIN,
    ) -> list[Received]:
        wait = min(max(wait, 0.0), MAX_WAIT)
        call = ops.RECEIVE.bind(queue, limit, ttl, worker, wait, probes, capabilities)
        if wait <= 0:
            polled = await self.call(call)
        else:  # a long poll: shutting down cancels it (see stop_waiting)
            if self._stopping:
                return []
            task = asyncio.ensure_future(self.call(call, deadline=self._timeout + wait))
            self._polls.add(task)
            try:
                polled = await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled() and not _current_task_cancelling():
                    return []
                task.cancel()  # our caller went away: so does its long poll
                raise
            finally:
                self._polls.discard(task)
        if capabilities.state and worker and polled.exports:
            self._exports[(queue, worker)] = polled.exports
        return polled.messages

    async def wait_ready(self, queue: str, wait: float, worker: str = "") -> bool:
        """The server's `wait_ready` (QueueService.wait_ready): whether `queue` may have something to
        receive, waiting up to `wait` seconds; it claims nothing, so cancelling it is harmless."""
        wait = min(max(wait, 0.0), MAX_WAIT)
        return await self.call(ops.WAIT_READY.bind(queue, wait, worker), deadline=self._timeout + wait)

    async def ack(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        # With a holder, the server's core ends only claims that went to this worker.
        return await self.call(ops.ACK.bind(queue, items, holder))

    async def renew(
        self,
        queue: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]:
        return await self.call(ops.RENEW.bind(queue, items, ttl, mode, holder))

    async def report(
        self, queue: str, worker: str, results: Sequence[AttemptResult], holder: str | None = None
    ) -> list[AckOutcome]:
        return await self.call(ops.REPORT.bind(queue, worker, results, holder))

    async def release(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        return await self.call(ops.RELEASE.bind(queue, items, holder))

    async def unclaim_all(self, queue: str) -> int:
        return await self.call(ops.UNCLAIM_ALL.bind(queue))

    async def purge(self, queue: str) -> int:
        return await self.call(ops.PURGE.bind(queue))

    async def peek(self, queue: str, limit: int = 10) -> list[tuple[PeekItem, bytes, str, bytes]]:
        return await self.call(ops.PEEK.bind(queue, limit))

    async def fleet_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A worker's heartbeat for the queue server's fleet (queue_core.fleet_remote): its answer."""
        return await self.call(ops.FLEET_HEARTBEAT.bind(body))

    # ---------------------------------------------------------------------------- the retry workflow
    async def release_group(self, queue: str, group: str) -> int:
        return await self.call(ops.RELEASE_GROUP.bind(queue, group))

    async def redrive_group(self, queue: str, group: str) -> Redriven:
        return await self.call(ops.REDRIVE_GROUP.bind(queue, group))

    async def parked_groups(self, queue: str) -> list[str]:
        return await self.call(ops.PARKED_GROUPS.bind(queue))

    async def group_policy(self, queue: str, group: str) -> GroupPolicy:
        return await self.call(ops.GROUP_POLICY.bind(queue, group))

    async def set_group_policy(self, queue: str, group: str, override: dict[str, Any] | None) -> GroupPolicy:
        return await self.call(ops.SET_GROUP_POLICY.bind(queue, group, override))

    async def group_log(self, queue: str, group: str, limit: int = 50) -> list[dict[str, Any]]:
        return await self.call(ops.GROUP_LOG.bind(queue, group, limit))

    # ------------------------------------------------------------------------------------ handovers
    async def hand_over(
        self, queue: str, groups: Sequence[str] | None, from_worker: str, policy: HandoverPolicy | None = None
    ) -> tuple[list[str], list[str]]:
        return await self.call(ops.HAND_OVER.bind(queue, groups, from_worker, policy))

    async def release_handover(self, queue: str, groups: Sequence[str]) -> list[str]:
        return await self.call(ops.RELEASE_HANDOVER.bind(queue, groups))

    async def handovers(self, queue: str) -> list[dict[str, Any]]:
        return await self.call(ops.HANDOVERS.bind(queue))

    def has_exports(self, queue: str, worker: str) -> bool:
        """Whether the last poll answer to `worker` named groups it has not been told of yet."""
        return (queue, worker) in self._exports

    def export_requests(self, queue: str, worker: str) -> list[str]:
        """What the server's last answer to `worker`'s poll named (once: a later poll names them again
        until they are uploaded)."""
        return self._exports.pop((queue, worker), [])

    async def version_figures(self, queue: str, recent: float) -> VersionFigures:
        return await self.call(ops.VERSION_FIGURES.bind(queue, recent))

    async def put_state(self, queue: str, worker: str, states: dict[str, Any]) -> dict[str, str]:
        return await self.call(ops.PUT_STATE.bind(queue, worker, states))

    # ------------------------------------------------------------------------------------ moves
    async def start_move(self, source: str, destination: str, move_id: str | None = None) -> MoveStatus:
        return await self.call(ops.START_MOVE.bind(source, destination, move_id))

    async def move_status(self, move_id: str) -> MoveStatus:
        return await self.call(ops.MOVE_STATUS.bind(move_id))

    async def cancel_move(self, move_id: str) -> MoveStatus:
        return await self.call(ops.CANCEL_MOVE.bind(move_id))

    # ------------------------------------------------------------- the queue server's admin state
    # Its internal admin operations (queue_core.admin_internal): every tenant's state by core names; the
    # gateway's admin routes (queue_core.health_view, queue_core.fleet_remote, queue_core.control_relay)
    # scope it to their caller,
    # calling them with `call` (a 4xx is `Refused`, with the queue server's status and error body).
    async def fences(self) -> list[Fence]:
        return await self.call(ops.FENCES.bind())

    async def put_fence(self, worker: str, mode: str, reason: str, ttl: float | None) -> Fence:
        return await self.call(ops.PUT_FENCE.bind(worker, mode, reason, ttl))

    async def delete_fence(self, worker: str, reason: str) -> Fence:
        return await self.call(ops.DELETE_FENCE.bind(worker, reason))

    async def control_events(self, last_event_id: str | None, *, idle: float) -> AsyncIterator[ControlEvent]:
        """The queue server's whole control stream (docs/control-stream.md), after `last_event_id` (None:
        from a snapshot), as (id, event, data) until it ends; Unavailable when it cannot be read, or when
        nothing (not even a keepalive) came for `idle` seconds."""
        if self._session is None:
            raise Unavailable("the gateway's queue-server client is not started")
        extra = {"Last-Event-ID": last_event_id} if last_event_id else None
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=idle)
        self.calls[ops.CONTROL.name] += 1
        try:
            async with self._client.request(
                self._session, ops.CONTROL.bind(), timeout=timeout, extra=extra
            ) as response:
                if response.status != 200:
                    raw = await response.read()
                    raise Unavailable(
                        f"queue server {self.url} answered HTTP {response.status} to the control stream: "
                        f"{raw[:200]!r}"
                    )
                parser = _EventParser()
                async for chunk in response.content.iter_any():
                    for event in parser.feed(chunk):
                        yield event
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"queue server {self.url}'s control stream: {_why(exc)}") from None


ControlEvent = tuple[str, str, bytes]  # (id, event, the JSON of its data line)


class _EventParser:
    """Server-sent events out of the bytes as they come (one `data:` line each: control.py writes
    them so); comment lines (keepalives) are skipped. No line-length limit of its own: a snapshot of
    many floors is one long line."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline: each byte is searched once
        self._id = ""
        self._event = ""
        self._data = b""

    def feed(self, chunk: bytes) -> list[ControlEvent]:
        self._buffer += chunk
        events: list[ControlEvent] = []
        start = 0
        while True:
            end = self._buffer.find(b"\n", max(start, self._scanned))
            if end < 0:
                del self._buffer[:start]
                self._scanned = len(self._buffer)
                return events
            line = bytes(self._buffer[start:end]).rstrip(b"\r")
            start = end + 1
            if not line:
                if self._event:
                    events.append((self._id, self._event, self._data))
                self._event, self._data = "", b""
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"id":
                self._id = value.decode("utf-8", "replace")
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
            elif name == b"data":
                self._data = value


def client_session(ca_file: str | None = None, secret: InternalSecret | None = None) -> aiohttp.ClientSession:
    """The pooled session of the internal API (queue_core.internal_client.client_session): TLS verified
    against `ca_file` when given, `secret` on every request."""
    return internal_client.client_session(ca_file, secret=secret)


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _why(exc: BaseException) -> str:
    """A connection failure in a few words for a client (not aiohttp's repr of its connection key)."""
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
