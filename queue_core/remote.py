"""A queue server in another process, behind the same interface as the in-process `QueueService`.

`strictq serve --queue-server URL` puts this behind the gateway instead of a local core: every call
becomes one request to the internal API of `strictq queue-server` (queue_core/server.py), and the
server's typed JSON errors become the same `QueueError` subclasses the core raises, so the faces map
them exactly as they do in-process.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from protocol.errors import StrictqError
from protocol.headers import PARTITION

from . import figures as figures_wire
from . import wire
from .backend import DedupReach
from .fences import Fence
from .figures import Figures
from .internal_auth import InternalSecret
from .machine import (
    AckOutcome,
    GroupPolicy,
    MoveStatus,
    NotFound,
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
from .service import MAX_WAIT, Received

log = logging.getLogger("strictq.remote")
PROBE_INTERVAL = 1.0


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
        self.url = url.rstrip("/")
        self.partitions = partitions
        self.dedup_reach: DedupReach = "queue"  # one core holds every group (queue_core.backend)
        self.partition = partition
        self._headers = {} if partition is None else {PARTITION: str(partition)}
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
            async with self._session.get(
                self.url + "/readyz",
                headers=self._request_headers(),
                timeout=aiohttp.ClientTimeout(total=max(1.0, self._probe_interval)),
            ) as response:
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
    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        *,
        deadline: float | None = None,
        batch: bool = False,
        passed_on: bool = False,
    ) -> Any:
        """One request. Errors come back as the core's typed errors; with `batch`, a 4xx that still
        carries per-item results (every item failed) returns them instead of raising; with `passed_on`,
        a 4xx is `Refused`, carrying the queue server's status and error body unchanged (the admin
        routes a gateway serves from the queue server: queue_core.remote_admin)."""
        if self._session is None:
            raise Unavailable("the gateway's queue-server client is not started")
        data = None if body is None else orjson.dumps(body)
        try:
            async with self._session.request(
                method,
                self.url + path,
                data=data,
                params=params,
                headers=self._request_headers(json_body=data is not None),
                timeout=aiohttp.ClientTimeout(total=deadline or self._timeout),
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:  # never sent
            self._ready = False
            raise Unreachable(f"queue server {self.url} did not answer: {_why(exc)}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._ready = False
            raise Unavailable(f"queue server {self.url} did not answer: {_why(exc)}") from None
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
        if batch and isinstance(payload, dict) and isinstance(payload.get("results"), list):
            return payload
        error = payload.get("error") if isinstance(payload, dict) else None
        if status >= 500 or not isinstance(error, dict):
            raise Unavailable(f"queue server {self.url} answered HTTP {status}: {raw[:200]!r}")
        if passed_on:  # an admin route's refusal, as the queue server gave it (its status, its body)
            raise Refused(status, error)
        raise error_from_dict(error)

    def _request_headers(self, *, json_body: bool = False) -> dict[str, str]:
        """The headers of every request to the queue server, built in this one place (the partition of a
        cluster node; a JSON body's content type): `_call`, the probe and the control stream use it."""
        if not json_body:
            return self._headers
        return {**self._headers, "Content-Type": "application/json"}

    @staticmethod
    def _q(name: str) -> str:
        return "/v1/queues/" + quote(name, safe="")

    # ------------------------------------------------------------------------------------ queues
    async def create_queue(self, name: str, attributes: dict[str, Any] | None = None) -> QueueAttributes:
        payload = await self._call("PUT", self._q(name), {"attributes": attributes or {}})
        return wire.decode_attributes(payload)

    async def set_attributes(self, name: str, changes: dict[str, Any]) -> QueueAttributes:
        payload = await self._call("PATCH", self._q(name), {"attributes": changes})
        return wire.decode_attributes(payload)

    async def delete_queue(self, name: str) -> None:
        await self._call("DELETE", self._q(name))

    async def list_queues(self, prefix: str = "") -> list[str]:
        payload = await self._call("GET", "/v1/queues", params={"prefix": prefix})
        return list(payload["queues"])

    async def _info(self, name: str) -> wire.QueueInfo:
        return wire.decode_queue_info(await self._call("GET", self._q(name)))

    async def attributes(self, name: str) -> QueueAttributes:
        return (await self._info(name)).attributes

    async def created_at(self, name: str) -> float:
        return (await self._info(name)).created_at

    async def metrics(self, name: str) -> QueueMetrics:
        return (await self._info(name)).metrics

    async def group_metrics(self, name: str, group: str) -> dict[str, Any]:
        metrics: dict[str, Any] = await self._call("GET", self._q(name) + "/group", params={"name": group})
        return metrics

    async def figures(self, top: int = TOP_GROUPS, *, deadline: float | None = None) -> Figures:
        """The queue server's `GET /v1/figures` (queue_core.figures); `deadline`: seconds to wait at most
        (a scrape should not wait the full request timeout for one slow partition)."""
        payload = await self._call("GET", "/v1/figures", params={"top": top}, deadline=deadline)
        try:
            return figures_wire.decode(payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise Unavailable(
                f"queue server {self.url} answered figures that cannot be read: {exc}"
            ) from None

    # -------------------------------------------------------------------------------- messages
    async def send(
        self, queue: str, requests: Sequence[SendRequest], *, create: bool = False
    ) -> list[SendResult | QueueError]:
        body = wire.encode_send(requests, create)
        payload = await self._call("POST", self._q(queue) + "/send", body, batch=True)
        return [wire.decode_send_result(item) for item in payload["results"]]

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
        body = wire.encode_receive(wire.ReceiveRequest(limit, ttl, worker, wait, probes, capabilities))
        path = self._q(queue) + "/receive"
        if wait <= 0:
            payload = await self._call("POST", path, body)
        else:  # a long poll: shutting down cancels it (see stop_waiting)
            if self._stopping:
                return []
            task = asyncio.ensure_future(self._call("POST", path, body, deadline=self._timeout + wait))
            self._polls.add(task)
            try:
                payload = await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled() and not _current_task_cancelling():
                    return []
                task.cancel()  # our caller went away: so does its long poll
                raise
            finally:
                self._polls.discard(task)
        exports = payload.get("exports")
        if capabilities.state and worker and isinstance(exports, list) and exports:
            self._exports[(queue, worker)] = [str(group) for group in exports]
        return [wire.decode_received(item) for item in payload["messages"]]

    async def wait_ready(self, queue: str, wait: float, worker: str = "") -> bool:
        """The server's `POST .../wait` (QueueService.wait_ready): whether `queue` may have something to
        receive, waiting up to `wait` seconds; it claims nothing, so cancelling it is harmless."""
        wait = min(max(wait, 0.0), MAX_WAIT)
        body = {"timeout": wait, "worker": worker}
        payload = await self._call("POST", self._q(queue) + "/wait", body, deadline=self._timeout + wait)
        return payload.get("ready") is True

    async def _claims(
        self,
        queue: str,
        action: str,
        items: Sequence[tuple[str, int | None]],
        holder: str | None,
        **extra: Any,
    ) -> list[AckOutcome]:
        # With a holder, the server's core ends only claims that went to this worker.
        body = wire.encode_claims(items, holder, **extra)
        payload = await self._call("POST", self._q(queue) + "/" + action, body, batch=True)
        return [wire.decode_ack_outcome(r) for r in payload["results"]]

    async def ack(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        return await self._claims(queue, "ack", items, holder)

    async def renew(
        self,
        queue: str,
        items: Sequence[tuple[str, int | None]],
        ttl: float,
        mode: RenewMode = "extend",
        holder: str | None = None,
    ) -> list[AckOutcome]:
        return await self._claims(queue, "renew", items, holder, ttl=ttl, mode=mode)

    async def report(
        self, queue: str, worker: str, results: Sequence[AttemptResult], holder: str | None = None
    ) -> list[AckOutcome]:
        body = wire.encode_report(worker, results, holder)
        payload = await self._call("POST", self._q(queue) + "/results", body)
        return [wire.decode_report_outcome(item) for item in payload["results"]]

    async def release(
        self, queue: str, items: Sequence[tuple[str, int | None]], holder: str | None = None
    ) -> list[AckOutcome]:
        return await self._claims(queue, "release", items, holder)

    async def unclaim_all(self, queue: str) -> int:
        return int((await self._call("POST", self._q(queue) + "/unclaimall"))["released"])

    async def purge(self, queue: str) -> int:
        return int((await self._call("POST", self._q(queue) + "/purge"))["purged"])

    async def peek(self, queue: str, limit: int = 10) -> list[tuple[PeekItem, bytes, str, bytes]]:
        payload = await self._call("GET", self._q(queue) + "/peek", params={"limit": limit})
        return [wire.decode_peek(item) for item in payload["messages"]]

    async def fleet_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A worker's heartbeat for the queue server's fleet (queue_core.fleet_remote): its answer."""
        answer = await self._call("POST", "/v1/fleet/heartbeat", body)
        return answer if isinstance(answer, dict) else {}

    # ---------------------------------------------------------------------------- the retry workflow
    async def release_group(self, queue: str, group: str) -> int:
        payload = await self._call("POST", self._q(queue) + "/groups/release", params={"group": group})
        return int(payload["released"])

    async def redrive_group(self, queue: str, group: str) -> Redriven:
        payload = await self._call("POST", self._q(queue) + "/groups/redrive", params={"group": group})
        return wire.decode_redriven(payload)

    async def parked_groups(self, queue: str) -> list[str]:
        return [str(g) for g in (await self._call("GET", self._q(queue) + "/parked"))["groups"]]

    async def group_policy(self, queue: str, group: str) -> GroupPolicy:
        payload = await self._call("GET", self._q(queue) + "/groups/policy", params={"group": group})
        return wire.decode_group_policy(payload)

    async def set_group_policy(self, queue: str, group: str, override: dict[str, Any] | None) -> GroupPolicy:
        path = self._q(queue) + "/groups/policy"
        payload = await self._call("PUT", path, {"override": override}, params={"group": group})
        return wire.decode_group_policy(payload)

    async def group_log(self, queue: str, group: str, limit: int = 50) -> list[dict[str, Any]]:
        params = {"group": group, "limit": str(limit)}
        payload = await self._call("GET", self._q(queue) + "/groups/log", params=params)
        return list(payload["attempts"])

    # ------------------------------------------------------------------------------------ handovers
    async def hand_over(
        self, queue: str, groups: Sequence[str] | None, from_worker: str, policy: HandoverPolicy | None = None
    ) -> tuple[list[str], list[str]]:
        body = {"from": from_worker, "groups": None if groups is None else list(groups), "policy": policy}
        payload = await self._call("POST", self._q(queue) + "/handover", body)
        return list(payload["groups"]), list(payload["already"])

    async def release_handover(self, queue: str, groups: Sequence[str]) -> list[str]:
        payload = await self._call("POST", self._q(queue) + "/handover/release", {"groups": list(groups)})
        return list(payload["released"])

    async def handovers(self, queue: str) -> list[dict[str, Any]]:
        return list((await self._call("GET", self._q(queue) + "/handover"))["handovers"])

    def has_exports(self, queue: str, worker: str) -> bool:
        """Whether the last poll answer to `worker` named groups it has not been told of yet."""
        return (queue, worker) in self._exports

    def export_requests(self, queue: str, worker: str) -> list[str]:
        """What the server's last answer to `worker`'s poll named (once: a later poll names them again
        until they are uploaded)."""
        return self._exports.pop((queue, worker), [])

    async def version_figures(self, queue: str, recent: float) -> VersionFigures:
        payload = await self._call("GET", self._q(queue) + "/routing/figures", params={"recent": str(recent)})
        return VersionFigures.from_json(payload)

    async def put_state(self, queue: str, worker: str, states: dict[str, Any]) -> dict[str, str]:
        payload = await self._call("PUT", self._q(queue) + "/state", {"worker": worker, "states": states})
        return {str(group): str(status) for group, status in payload["results"].items()}

    # ------------------------------------------------------------------------------------ moves
    async def start_move(self, source: str, destination: str, move_id: str | None = None) -> MoveStatus:
        body = wire.encode_move_request(source, destination, move_id)
        return wire.decode_move(await self._call("POST", "/v1/moves", body))

    async def move_status(self, move_id: str) -> MoveStatus:
        return wire.decode_move(await self._call("GET", "/v1/moves/" + _move_segment(move_id)))

    async def cancel_move(self, move_id: str) -> MoveStatus:
        return wire.decode_move(await self._call("POST", "/v1/moves/" + _move_segment(move_id) + "/cancel"))

    # ------------------------------------------------------------- the queue server's admin state
    # Its internal admin routes (queue_core.admin_internal): every tenant's state by core names; the
    # gateway's admin routes (queue_core.remote_admin, queue_core.control_relay) scope it to their caller.
    async def admin(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """`METHOD /v1/admin/PATH`; a 4xx is `Refused` with the queue server's status and error body."""
        return await self._call(method, "/v1/admin/" + path, body, params, passed_on=True)

    async def fences(self) -> list[Fence]:
        payload = await self.admin("GET", "fences")
        return [Fence.from_dict(item) for item in payload["fences"]]

    async def put_fence(self, worker: str, mode: str, reason: str, ttl: float | None) -> Fence:
        body = {"mode": mode, "reason": reason, "ttl": ttl}
        return Fence.from_dict(await self.admin("PUT", "fences/" + segment(worker), body))

    async def delete_fence(self, worker: str, reason: str) -> Fence:
        return Fence.from_dict(
            await self.admin("DELETE", "fences/" + segment(worker), params={"reason": reason})
        )

    async def control_events(self, last_event_id: str | None, *, idle: float) -> AsyncIterator[ControlEvent]:
        """The queue server's whole control stream (docs/control-stream.md), after `last_event_id` (None:
        from a snapshot), as (id, event, data) until it ends; Unavailable when it cannot be read, or when
        nothing (not even a keepalive) came for `idle` seconds."""
        if self._session is None:
            raise Unavailable("the gateway's queue-server client is not started")
        headers = dict(self._request_headers())
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=idle)
        try:
            async with self._session.get(
                self.url + "/v1/admin/control", headers=headers, timeout=timeout
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
    """The pooled session of the internal API (TLS verified against `ca_file` when given). Every request
    of it carries `secret` (queue_core.internal_auth), set here once as the session's default header."""
    ssl_context: ssl.SSLContext | bool = True
    if ca_file:
        ssl_context = ssl.create_default_context(cafile=ca_file)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context, limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
        headers=None if secret is None else secret.headers,
    )


def segment(text: str) -> str:
    """`text` as one path segment (every `/` quoted)."""
    return quote(text, safe="")


def _move_segment(move_id: str) -> str:
    """A move reference as one path segment: quoted (`/` included), and never `.` or `..`, which quote()
    keeps and the URL would resolve (`/v1/moves/..` is `/v1/`): such a reference is no move, as locally."""
    if move_id in ("", ".", ".."):
        raise NotFound(f"no move {move_id!r}", reference=move_id)
    return quote(move_id, safe="")


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _why(exc: BaseException) -> str:
    """A connection failure in a few words for a client (not aiohttp's repr of its connection key)."""
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
