"""A small asyncio client for the queue server's internal API (tests, benchmarks, CLI, worker SDK).

Every method is an operation of the table (queue_core.operations) sent over the transport the gateway's
RemoteQueueService uses too (queue_core.internal_client); its answers are the server's JSON as it came.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from protocol.errors import BAD_RESPONSE, error_body, parse_error
from protocol.headers import API_KEY as API_KEY_HEADER

from . import operations as ops
from . import wire
from .internal_auth import InternalSecret, load_secret
from .internal_client import InternalClient, client_session
from .machine.errors import QueueError, error_class
from .operations import Call


class QueueClientError(Exception):
    """The server refused a request; `code` is the server's stable error code."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        results: list[dict[str, Any]] | None = None,
        *,
        retriable: bool = False,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.retriable = retriable  # the server says the same request may succeed later
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.results = results  # per-item results of a batch in which every item failed


DEFAULT_URL = "http://127.0.0.1:8470"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The client environment (docs/contracts.md): STRICTQ_URL, STRICTQ_CA_FILE, STRICTQ_API_KEY, ...;
    STRICTQ_INTERNAL_SECRET_FILE: the queue server's internal secret (queue_core.internal_auth)."""

    url: str = DEFAULT_URL
    ca_file: str | None = None
    api_key: str | None = None
    worker_id: str | None = None
    internal_secret: InternalSecret | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ClientConfig:
        env = os.environ if environ is None else environ
        return cls(
            url=env.get("STRICTQ_URL", DEFAULT_URL),
            ca_file=env.get("STRICTQ_CA_FILE") or None,
            api_key=env.get("STRICTQ_API_KEY") or None,
            worker_id=env.get("STRICTQ_WORKER_ID") or None,
            internal_secret=load_secret(None, env),
        )


class QueueClient:
    def __init__(
        self,
        url: str | None = None,
        *,
        config: ClientConfig | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.config = config or ClientConfig.from_env()
        self._client = InternalClient(url or self.config.url)  # the transport RemoteQueueService shares
        self._own_session = session is None
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    @property
    def url(self) -> str:
        return self._client.url

    async def __aenter__(self) -> QueueClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {API_KEY_HEADER: self.config.api_key} if self.config.api_key else {}
            self._session = client_session(
                self.config.ca_file, headers, secret=self.config.internal_secret, timeout=self._timeout
            )
        return self._session

    async def call(self, call: Call[Any]) -> Any:
        """The one call path: an operation of the table (queue_core.operations) with its request, sent
        over the transport RemoteQueueService uses too; the server's JSON answer, or QueueClientError."""
        async with self._client.request(self._get_session(), call) as response:
            return await _answer(response)

    async def request(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """A request of the caller's own making (a test's malformed input), on the same transport."""
        async with self._client.send(self._get_session(), method, path, body, params) as response:
            return await _answer(response)

    async def batch(self, call: Call[Any]) -> list[dict[str, Any]]:
        """Per-item results of a batch call, also when every item failed (the server then answers 4xx)."""
        try:
            result = await self.call(call)
        except QueueClientError as exc:
            if exc.results is None:
                raise
            return exc.results
        return list(result["results"])

    # ----------------------------------------------------------------------------------- queues
    async def create_queue(self, queue: str, **attributes: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.CREATE_QUEUE.bind(queue, attributes))
        return result

    async def queue_info(self, queue: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.GET_QUEUE.bind(queue))
        return result

    async def set_attributes(self, queue: str, **attributes: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.SET_ATTRIBUTES.bind(queue, attributes))
        return result

    async def delete_queue(self, queue: str) -> None:
        await self.call(ops.DELETE_QUEUE.bind(queue))

    async def list_queues(self, prefix: str = "") -> list[str]:
        call = ops.LIST_QUEUES.raw(prefix=prefix) if prefix else ops.LIST_QUEUES.raw()
        result = await self.call(call)
        return list(result["queues"])

    # --------------------------------------------------------------------------------- messages
    # The bodies below carry the callers' JSON as they gave it (`raw`, with the tool forms of queue_core.
    # wire): the server, not this client, checks it, and tests send it malformed on purpose.
    async def send(
        self, queue: str, messages: Sequence[dict[str, Any]], *, create: bool = True
    ) -> list[dict[str, Any]]:
        """Send a batch of {"body"|"json"|"body_b64", "group"?, "dedup_id"?, "id"?, "delay"?} entries."""
        return await self.batch(ops.SEND.raw({"queue": queue}, wire.encode_entries(messages, create)))

    async def send_one(
        self, queue: str, body: str, group: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"body": body, **fields}
        if group is not None:
            entry["group"] = group
        (result,) = await self.send(queue, [entry])
        if "error" in result:
            error = parse_error(result)
            status = error_class(error.code).status  # the status the item's error carries
            raise QueueClientError(
                status, error.code, error.message, error.details, retriable=error.retriable
            )
        return result

    async def receive(
        self,
        queue: str,
        limit: int = 10,
        ttl: float | None = None,
        worker: str = "",
        wait: float = 0.0,
        capabilities: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """`capabilities`: what this poller declares (["results", "probes"]: it takes part in failure
        management, docs/failure-management.md); None: plain queue semantics."""
        polled = wire.ReceiveRequest(limit, ttl, worker or self.config.worker_id or "", wait)
        result = await self.call(
            ops.RECEIVE.raw({"queue": queue}, wire.encode_declared(polled, capabilities))
        )
        return list(result["messages"])

    # `holder`: act as that worker, so the server ends or extends only claims that went to it (what the
    # gateway does for its worker credentials); None: as an operator, by receipt or id.
    async def ack(
        self, queue: str, receipts: Sequence[str], holder: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.batch(ops.ACK.raw({"queue": queue}, wire.encode_receipts(receipts, holder)))

    async def ack_ids(
        self, queue: str, ids: Sequence[str], token: int | None = None, holder: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.batch(ops.ACK.raw({"queue": queue}, wire.encode_ids(ids, token, holder)))

    async def renew(
        self, queue: str, receipts: Sequence[str], ttl: float, mode: str = "extend", holder: str | None = None
    ) -> list[dict[str, Any]]:
        body = wire.encode_receipts(receipts, holder, ttl=ttl, mode=mode)
        return await self.batch(ops.RENEW.raw({"queue": queue}, body))

    async def release(
        self, queue: str, receipts: Sequence[str], holder: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.batch(ops.RELEASE.raw({"queue": queue}, wire.encode_receipts(receipts, holder)))

    async def unclaim_all(self, queue: str) -> int:
        return int((await self.call(ops.UNCLAIM_ALL.bind(queue)))["released"])

    async def purge(self, queue: str) -> int:
        return int((await self.call(ops.PURGE.bind(queue)))["purged"])

    async def peek(self, queue: str, limit: int = 10) -> list[dict[str, Any]]:
        return list((await self.call(ops.PEEK.bind(queue, limit)))["messages"])

    async def size(self, queue: str) -> int:
        return int((await self.call(ops.SIZE.bind(queue)))["size"])

    async def claim_count(self, queue: str) -> int:
        return int((await self.call(ops.CLAIM_COUNT.bind(queue)))["claimcount"])

    async def group(self, queue: str, group: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.GROUP_METRICS.bind(queue, group))
        return result

    async def start_move(self, source: str, destination: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(ops.START_MOVE.bind(source, destination))
        return result

    async def move_status(self, move_id: str) -> dict[str, Any]:
        try:
            call = ops.MOVE_STATUS.bind(move_id)
        except QueueError as exc:  # a reference no move can have ('.', '..'): as the server answers it
            raise QueueClientError(exc.status, exc.code, exc.message, exc.to_dict().get("details")) from None
        result: dict[str, Any] = await self.call(call)
        return result

    async def ready(self) -> bool:
        try:
            await self.call(ops.READYZ.bind())
        except (QueueClientError, aiohttp.ClientError):
            return False
        return True


async def _answer(response: aiohttp.ClientResponse) -> Any:
    """The server's JSON answer; a 4xx or 5xx as QueueClientError (its code, message, details, results)."""
    raw = await response.read()
    try:
        payload = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        payload = error_body(BAD_RESPONSE, raw[:200].decode(errors="replace"))
    if response.status >= 400:
        error = parse_error(payload)
        raise QueueClientError(
            response.status,
            error.code,
            error.message or response.reason or "",
            error.details,
            payload.get("results") if isinstance(payload, dict) else None,
            retriable=error.retriable,
        )
    return payload
