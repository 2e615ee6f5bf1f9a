"""The `strictq` client commands' calls to `strictq serve`: the gateway's EmoDB face (`/queue/1`) for send,
poll, ack, peek and size, and SQS ListQueues (SigV4, botocore's signer) to list queues, which the EmoDB
face cannot. Each command uses the key of the role it needs, as `<data-dir>/client.env` holds them
(`KEYS`). Poll answers carry a `receipt` in the queue server's form (`<token hex>.<id>`), so `strictq ack`
takes the same receipts whichever server printed them.

The worker SDK has its own EmoDB client (strictq.sdk.client): it keeps a session for a worker's life and
declares capabilities; this one makes a command's few calls and renders failures for a terminal.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from protocol import headers
from protocol.errors import BAD_RESPONSE, error_body, parse_error

from .cli_endpoint import CliError, Endpoint, ssl_context

PREFIX = "/queue/1"
SEND_CHUNK = 500  # messages per _sendbatch request (the edge caps the body)
# What each kind of call needs (access.permissions): the client.env variables holding such a key, in order.
KEYS: dict[str, tuple[str, ...]] = {
    "send": ("STRICTQ_API_KEY", "STRICTQ_ADMIN_KEY"),  # a producer (or an admin)
    "consume": ("STRICTQ_WORKER_SECRET", "STRICTQ_ADMIN_KEY"),  # a worker (or an admin)
    "admin": ("STRICTQ_ADMIN_KEY",),  # peek and size are admin-only on the EmoDB face
}
# SQS ListQueues is signed with an access key id (the credential id) and its secret.
SQS_KEYS = (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), ("STRICTQ_WORKER_ID", "STRICTQ_WORKER_SECRET"))
WHAT = {"send": "a producer's", "consume": "a worker's", "admin": "an admin's"}


class EdgeError(CliError):
    """A server refused a call: `strictq: <status> <code>: <message>` (exit 1)."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}", 1)
        self.status = status
        self.code = code
        self.body = body


def key_for(kind: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(variable, secret) of the first client.env variable set for `kind`; CliError (exit 2) if none."""
    env = os.environ if environ is None else environ
    for name in KEYS[kind]:
        if env.get(name):
            return name, env[name]
    names = " or ".join(KEYS[kind])
    raise CliError(
        f"no API key: this command needs {WHAT[kind]} key in {names} (`strictq serve` writes them to "
        "<data-dir>/client.env: set -a; . var/strictq/client.env; set +a)",
        2,
    )


def sqs_key(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    env = os.environ if environ is None else environ
    for id_name, secret_name in SQS_KEYS:
        if env.get(id_name) and env.get(secret_name):
            return env[id_name], env[secret_name]
    return None


def receipt(message: Mapping[str, Any]) -> str:
    return f"{int(message['token']):x}.{message['id']}"


def parse_receipt(text: str) -> tuple[str, int] | None:
    """(message id, token) of a receipt `<token hex>.<id>`, or None if it is not one."""
    token_hex, dot, message_id = text.partition(".")
    if not dot or not message_id:
        return None
    try:
        return message_id, int(token_hex, 16)
    except ValueError:
        return None


class EdgeClient:
    def __init__(self, found: Endpoint, *, timeout: float = 60.0) -> None:
        self.endpoint = found
        self._ssl = ssl_context(found)  # CliError naming STRICTQ_CA_FILE before anything is sent
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EdgeClient:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl), timeout=self._timeout
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None

    async def call(
        self,
        method: str,
        path: str,
        key: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        extra: Mapping[str, str] | None = None,
    ) -> Any:
        """One EmoDB-face call; EdgeError for a 4xx/5xx answer."""
        assert self._session is not None, "use `async with EdgeClient(...)`"
        sent = {headers.API_KEY: key, **(extra or {})}
        data = None
        if body is not None:
            data = orjson.dumps(body)
            sent["Content-Type"] = "application/json"
        url = self.endpoint.url + PREFIX + path
        async with self._session.request(method, url, params=params, data=data, headers=sent) as answer:
            raw = await answer.read()
            status, reason = answer.status, answer.reason or ""
        try:
            payload = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            payload = error_body(BAD_RESPONSE, raw[:200].decode(errors="replace"))
        if status >= 400:
            error = parse_error(payload)
            raise EdgeError(status, error.code, error.message or reason, payload)
        return payload

    # --------------------------------------------------------------------------------- EmoDB face
    async def send(self, queue: str, payloads: Sequence[Any], group: str | None, key: str) -> None:
        params = {"group": group} if group is not None else None
        for start in range(0, len(payloads), SEND_CHUNK):
            chunk = list(payloads[start : start + SEND_CHUNK])
            await self.call("POST", "/_sendbatch", key, params=params, body={queue: chunk})

    async def poll(
        self, queue: str, limit: int, ttl: float | None, wait: float, key: str
    ) -> list[dict[str, Any]]:
        params = {"limit": str(limit), "wait": f"{wait:g}"}
        if ttl is not None:
            params["ttl"] = f"{ttl:g}"
        answer = await self.call("GET", f"/{_path(queue)}/poll", key, params=params)
        return [{**m, "receipt": receipt(m)} for m in answer]

    async def ack(self, queue: str, ids: Sequence[str], token: int | None, key: str) -> list[dict[str, Any]]:
        """Per-id results. With a token the gateway refuses superseded claims (409 naming them); without
        one it answers EmoDB's success whatever happened to each id: `accepted`."""
        extra = {headers.LEASE: str(token)} if token is not None else None
        try:
            await self.call("POST", f"/{_path(queue)}/ack", key, body=list(ids), extra=extra)
        except EdgeError as exc:
            results = exc.body.get("results") if isinstance(exc.body, dict) else None
            if exc.status != 409 or not isinstance(results, list):
                raise
            return [r for r in results if isinstance(r, dict)]
        return [{"id": i, "status": "ok" if token is not None else "accepted"} for i in ids]

    async def peek(self, queue: str, limit: int, key: str) -> list[dict[str, Any]]:
        return list(await self.call("GET", f"/{_path(queue)}/peek", key, params={"limit": str(limit)}))

    async def size(self, queue: str, key: str) -> dict[str, Any]:
        total = await self.call("GET", f"/{_path(queue)}/size", key)
        in_flight = await self.call("GET", f"/{_path(queue)}/claimcount", key)
        return {"name": queue, "total": total, "in_flight": in_flight}

    # ------------------------------------------------------------------------------------ SQS face
    async def sqs(self, action: str, params: Mapping[str, Any], key_id: str, secret: str) -> dict[str, Any]:
        """One SQS JSON-protocol call, SigV4-signed as boto3 would sign it."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        assert self._session is not None, "use `async with EdgeClient(...)`"
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        body = orjson.dumps(dict(params))
        request = AWSRequest(
            method="POST",
            url=self.endpoint.url + "/",
            data=body,
            headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": f"AmazonSQS.{action}",
            },
        )
        SigV4Auth(Credentials(key_id, secret), "sqs", region).add_auth(request)
        sent = {name: str(value) for name, value in request.headers.items()}
        async with self._session.post(self.endpoint.url + "/", data=body, headers=sent) as answer:
            raw = await answer.read()
            status = answer.status
        try:
            payload = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        if status >= 400:
            code = str(payload.get("__type", "error")).rsplit("#", 1)[-1]
            text = payload.get("message") or payload.get("Message") or raw[:200].decode(errors="replace")
            message = str(text)
            raise EdgeError(status, code, message, payload)
        return payload

    async def list_queues(self, prefix: str = "") -> list[str]:
        """The names the SQS face lists for the key in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (client.env),
        else STRICTQ_WORKER_ID/STRICTQ_WORKER_SECRET: the tenant's queues, page by page."""
        found = sqs_key()
        if found is None:
            raise CliError(
                "listing queues signs SQS ListQueues: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(`strictq serve` writes them to <data-dir>/client.env)",
                2,
            )
        names: list[str] = []
        params: dict[str, Any] = {"MaxResults": 1000}
        if prefix:
            params["QueueNamePrefix"] = prefix
        for _ in range(10_000):  # bounded: 10 million queues
            page = await self.sqs("ListQueues", params, *found)
            names += [str(url).rstrip("/").rsplit("/", 1)[-1] for url in page.get("QueueUrls", [])]
            token = page.get("NextToken")
            if not token:
                break
            params["NextToken"] = token
        return names

    async def exists(self, queue: str) -> bool | None:
        """Whether the queue exists (the EmoDB face answers an unknown queue as an empty one); None when
        that cannot be told (no SQS key, or the SQS face refused)."""
        if sqs_key() is None:
            return None
        try:
            return queue in await self.list_queues(queue)
        except EdgeError:
            return None


def _path(queue: str) -> str:
    from urllib.parse import quote

    return quote(queue, safe="")
