"""A small asyncio client for the queue server's internal API (tests, benchmarks, CLI, worker SDK)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from protocol.errors import BAD_RESPONSE, error_body, parse_error
from protocol.headers import API_KEY as API_KEY_HEADER

from .internal_auth import InternalSecret, load_secret
from .machine.errors import error_class
from .wire import ReceiveRequest, encode_move_request, encode_receive
from .wire import held as _held


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
        self.url = (url or self.config.url).rstrip("/")
        self._own_session = session is None
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout)

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
            ssl_context: ssl.SSLContext | bool = True
            if self.config.ca_file:
                ssl_context = ssl.create_default_context(cafile=self.config.ca_file)
            headers = {API_KEY_HEADER: self.config.api_key} if self.config.api_key else {}
            if self.config.internal_secret is not None:  # every request: the internal API's credential
                headers.update(self.config.internal_secret.headers)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_context, limit=0),
                timeout=self._timeout,
                headers=headers,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        return self._session

    async def request(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        async with self._get_session().request(
            method, self.url + path, data=data, params=params, headers=headers
        ) as response:
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

    async def batch(self, path: str, body: Any) -> list[dict[str, Any]]:
        """Per-item results of a batch call, also when every item failed (the server then answers 4xx)."""
        try:
            result = await self.request("POST", path, body)
        except QueueClientError as exc:
            if exc.results is None:
                raise
            return exc.results
        return list(result["results"])

    # ----------------------------------------------------------------------------------- queues
    async def create_queue(self, queue: str, **attributes: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("PUT", f"/v1/queues/{queue}", {"attributes": attributes})
        return result

    async def queue_info(self, queue: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", f"/v1/queues/{queue}")
        return result

    async def set_attributes(self, queue: str, **attributes: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PATCH", f"/v1/queues/{queue}", {"attributes": attributes}
        )
        return result

    async def delete_queue(self, queue: str) -> None:
        await self.request("DELETE", f"/v1/queues/{queue}")

    async def list_queues(self, prefix: str = "") -> list[str]:
        result = await self.request("GET", "/v1/queues", params={"prefix": prefix} if prefix else None)
        return list(result["queues"])

    # --------------------------------------------------------------------------------- messages
    async def send(
        self, queue: str, messages: Sequence[dict[str, Any]], *, create: bool = True
    ) -> list[dict[str, Any]]:
        """Send a batch of {"body"|"json"|"body_b64", "group"?, "dedup_id"?, "id"?, "delay"?} entries."""
        return await self.batch(f"/v1/queues/{queue}/send", {"messages": list(messages), "create": create})

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
        polled = ReceiveRequest(limit, ttl, worker or self.config.worker_id or "", wait)
        body = encode_receive(polled)
        if capabilities is not None:  # as given: the server decides what it makes of them
            body["capabilities"] = list(capabilities)
        result = await self.request("POST", f"/v1/queues/{queue}/receive", body)
        return list(result["messages"])

    # `holder`: act as that worker, so the server ends or extends only claims that went to it (what the
    # gateway does for its worker credentials); None: as an operator, by receipt or id.
    async def ack(
        self, queue: str, receipts: Sequence[str], holder: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.batch(f"/v1/queues/{queue}/ack", _held({"receipts": list(receipts)}, holder))

    async def ack_ids(
        self, queue: str, ids: Sequence[str], token: int | None = None, holder: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.batch(f"/v1/queues/{queue}/ack", _held({"ids": list(ids), "token": token}, holder))

    async def renew(
        self, queue: str, receipts: Sequence[str], ttl: float, mode: str = "extend", holder: str | None = None
    ) -> list[dict[str, Any]]:
        body = {"receipts": list(receipts), "ttl": ttl, "mode": mode}
        return await self.batch(f"/v1/queues/{queue}/renew", _held(body, holder))

    async def release(
        self, queue: str, receipts: Sequence[str], holder: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.batch(f"/v1/queues/{queue}/release", _held({"receipts": list(receipts)}, holder))

    async def unclaim_all(self, queue: str) -> int:
        return int((await self.request("POST", f"/v1/queues/{queue}/unclaimall"))["released"])

    async def purge(self, queue: str) -> int:
        return int((await self.request("POST", f"/v1/queues/{queue}/purge"))["purged"])

    async def peek(self, queue: str, limit: int = 10) -> list[dict[str, Any]]:
        result = await self.request("GET", f"/v1/queues/{queue}/peek", params={"limit": limit})
        return list(result["messages"])

    async def size(self, queue: str) -> int:
        return int((await self.request("GET", f"/v1/queues/{queue}/size"))["size"])

    async def claim_count(self, queue: str) -> int:
        return int((await self.request("GET", f"/v1/queues/{queue}/claimcount"))["claimcount"])

    async def group(self, queue: str, group: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "GET", f"/v1/queues/{queue}/group", params={"name": group}
        )
        return result

    async def start_move(self, source: str, destination: str) -> dict[str, Any]:
        body = encode_move_request(source, destination)
        result: dict[str, Any] = await self.request("POST", "/v1/moves", body)
        return result

    async def move_status(self, move_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", f"/v1/moves/{move_id}")
        return result

    async def ready(self) -> bool:
        try:
            await self.request("GET", "/readyz")
        except (QueueClientError, aiohttp.ClientError):
            return False
        return True
