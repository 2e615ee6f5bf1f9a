"""A queue server in another process, behind the same interface as the in-process `QueueService`.

`strictq serve --queue-server URL` puts this behind the gateway instead of a local core: every call
becomes one request to the internal API of `strictq queue-server` (queue_core/server.py), and the
server's typed JSON errors become the same `QueueError` subclasses the core raises, so the faces map
them exactly as they do in-process.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from .machine import (
    AckOutcome,
    Delivery,
    MoveStatus,
    NotFound,
    PeekItem,
    QueueAttributes,
    QueueError,
    QueueMetrics,
    SendRequest,
    SendResult,
    Unavailable,
    error_from_dict,
)
from .machine.capabilities import PLAIN, Capabilities
from .machine.core import RenewMode
from .machine.groups import DEFAULT_PARTITIONS
from .machine.inputs import AttemptResult
from .results import outcome_from_json, result_json
from .service import MAX_WAIT, Received

log = logging.getLogger("strictq.remote")
PROBE_INTERVAL = 1.0


class RemoteQueueService:
    """The internal API of a `strictq queue-server`, spoken with one pooled aiohttp session."""

    def __init__(
        self,
        url: str,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        ca_file: str | None = None,
        timeout: float = 30.0,
        probe_interval: float = PROBE_INTERVAL,
    ) -> None:
        self.url = url.rstrip("/")
        self.partitions = partitions
        self._ca_file = ca_file
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._session: aiohttp.ClientSession | None = None
        self._ready = False
        self._stopping = False
        self._probe: asyncio.Task[None] | None = None
        self._polls: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        ssl_context: ssl.SSLContext | bool = True
        if self._ca_file:
            ssl_context = ssl.create_default_context(cafile=self._ca_file)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
        )
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
        if self._session is not None:
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
                self.url + "/readyz", timeout=aiohttp.ClientTimeout(total=max(1.0, self._probe_interval))
            ) as response:
                ready = response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            ready = False
        if ready != self._ready:
            log.info("queue server %s is %s", self.url, "ready" if ready else "not ready")
        self._ready = ready

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
    ) -> Any:
        """One request. Errors come back as the core's typed errors; with `batch`, a 4xx that still
        carries per-item results (every item failed) returns them instead of raising."""
        if self._session is None:
            raise Unavailable("the gateway's queue-server client is not started")
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self._session.request(
                method,
                self.url + path,
                data=data,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=deadline or self._timeout),
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._ready = False
            raise Unavailable(f"queue server {self.url} did not answer: {exc!r}") from None
        try:
            payload = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            raise Unavailable(
                f"queue server {self.url} answered HTTP {status} without JSON: {raw[:200]!r}"
            ) from None
        if status < 400:
            return payload
        if batch and isinstance(payload, dict) and isinstance(payload.get("results"), list):
            return payload
        error = payload.get("error") if isinstance(payload, dict) else None
        if status >= 500 or not isinstance(error, dict):
            raise Unavailable(f"queue server {self.url} answered HTTP {status}: {raw[:200]!r}")
        raise error_from_dict(error)

    @staticmethod
    def _q(name: str) -> str:
        return "/v1/queues/" + quote(name, safe="")

    # ------------------------------------------------------------------------------------ queues
    async def create_queue(self, name: str, attributes: dict[str, Any] | None = None) -> QueueAttributes:
        payload = await self._call("PUT", self._q(name), {"attributes": attributes or {}})
        return QueueAttributes.from_dict(payload["attributes"])

    async def set_attributes(self, name: str, changes: dict[str, Any]) -> QueueAttributes:
        payload = await self._call("PATCH", self._q(name), {"attributes": changes})
        return QueueAttributes.from_dict(payload["attributes"])

    async def delete_queue(self, name: str) -> None:
        await self._call("DELETE", self._q(name))

    async def list_queues(self, prefix: str = "") -> list[str]:
        payload = await self._call("GET", "/v1/queues", params={"prefix": prefix})
        return list(payload["queues"])

    async def _info(self, name: str) -> dict[str, Any]:
        info: dict[str, Any] = await self._call("GET", self._q(name))
        return info

    async def attributes(self, name: str) -> QueueAttributes:
        return QueueAttributes.from_dict((await self._info(name))["attributes"])

    async def created_at(self, name: str) -> float:
        return float((await self._info(name))["created_at"])

    async def metrics(self, name: str) -> QueueMetrics:
        return QueueMetrics(**(await self._info(name))["metrics"])

    async def group_metrics(self, name: str, group: str) -> dict[str, Any]:
        metrics: dict[str, Any] = await self._call("GET", self._q(name) + "/group", params={"name": group})
        return metrics

    # -------------------------------------------------------------------------------- messages
    async def send(
        self, queue: str, requests: Sequence[SendRequest], *, create: bool = False
    ) -> list[SendResult | QueueError]:
        payload = await self._call(
            "POST",
            self._q(queue) + "/send",
            {"messages": [_send_json(r) for r in requests], "create": create},
            batch=True,
        )
        return [_send_result(item) for item in payload["results"]]

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
        body: dict[str, Any] = {"limit": limit, "ttl": ttl, "worker": worker, "wait": wait}
        if not probes:
            body["probes"] = False
        if capabilities != PLAIN:  # the poller's declaration, forwarded as it was made
            body["capabilities"] = capabilities.tokens()
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
        return [_received(item) for item in payload["messages"]]

    async def _claims(
        self,
        queue: str,
        action: str,
        items: Sequence[tuple[str, int | None]],
        holder: str | None,
        **extra: Any,
    ) -> list[AckOutcome]:
        body = {"items": [[message_id, token] for message_id, token in items], **extra}
        if holder is not None:  # the server's core then ends only claims that went to this worker
            body["holder"] = holder
        payload = await self._call("POST", self._q(queue) + "/" + action, body, batch=True)
        return [AckOutcome(r["id"], r["status"], r.get("message", "")) for r in payload["results"]]

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
        body: dict[str, Any] = {"worker": worker, "results": [result_json(r) for r in results]}
        if holder is not None:
            body["holder"] = holder
        payload = await self._call("POST", self._q(queue) + "/results", body)
        return [outcome_from_json(item) for item in payload["results"]]

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
        out = []
        for item in payload["messages"]:
            peeked = PeekItem(
                _key_of(item["id"]),
                item["id"],
                item["group"],
                item["seq"],
                item["sent_at"],
                item["receive_count"],
                item["claimed"],
            )
            out.append((peeked, *_body_of(item)))
        return out

    # ------------------------------------------------------------------------------------ moves
    async def start_move(self, source: str, destination: str) -> MoveStatus:
        return _move(await self._call("POST", "/v1/moves", {"from": source, "to": destination}))

    async def move_status(self, move_id: str) -> MoveStatus:
        return _move(await self._call("GET", "/v1/moves/" + _move_segment(move_id)))

    async def cancel_move(self, move_id: str) -> MoveStatus:
        return _move(await self._call("POST", "/v1/moves/" + _move_segment(move_id) + "/cancel"))


def _move_segment(move_id: str) -> str:
    """A move reference as one path segment: quoted (`/` included), and never `.` or `..`, which quote()
    keeps and the URL would resolve (`/v1/moves/..` is `/v1/`): such a reference is no move, as locally."""
    if move_id in ("", ".", ".."):
        raise NotFound(f"no move {move_id!r}", reference=move_id)
    return quote(move_id, safe="")


# ------------------------------------------------------------------------------------ JSON <-> records
def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _send_json(request: SendRequest) -> dict[str, Any]:
    entry: dict[str, Any] = {"content_type": request.content_type or "text/plain"}
    try:
        entry["body"] = request.body.decode()
    except UnicodeDecodeError:
        entry["body_b64"] = base64.b64encode(request.body).decode()
    if request.extra:
        entry["attributes"] = orjson.loads(request.extra)
    for name, value in (
        ("group", request.group),
        ("dedup_id", request.dedup_id),
        ("id", request.message_id),
        ("delay", request.delay),
    ):
        if value is not None:
            entry[name] = value
    return entry


def _send_result(item: dict[str, Any]) -> SendResult | QueueError:
    if "error" in item:
        return error_from_dict(item["error"])
    return SendResult(item["id"], item["group"], item["seq"], item["partition"], item["duplicate"])


def _key_of(message_id: str) -> int:
    """The core's key is the id in hex for ids it made; faces never use it, so others get 0."""
    try:
        return int(message_id, 16)
    except ValueError:
        return 0


def _body_of(item: dict[str, Any]) -> tuple[bytes, str, bytes]:
    if "body_b64" in item:
        body = base64.b64decode(item["body_b64"])
    else:
        body = str(item.get("body", "")).encode()
    attributes = item.get("attributes")
    return body, item.get("content_type", ""), orjson.dumps(attributes) if attributes else b""


def _received(item: dict[str, Any]) -> Received:
    delivery = Delivery(
        _key_of(item["id"]),
        item["id"],
        item["group"],
        item["seq"],
        item["token"],
        item["receipt"],
        item["receive_count"],
        item["sent_at"],
        item["first_receive_at"],
        item["claim_expires"],
        item.get("origin"),
        item.get("history"),
    )
    return Received(delivery, *_body_of(item), probe=item.get("probe") is True)


def _move(data: dict[str, Any]) -> MoveStatus:
    return MoveStatus(
        id=data["id"],
        source=data["from"],
        destination=data["to"],
        moved=data["moved"],
        remaining=data["remaining"],
        state=data["state"],
        error=data["error"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
    )
