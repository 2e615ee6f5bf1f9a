"""The `strictq` client commands' calls to `strictq serve`: the gateway's EmoDB face (`/queue/1`) for send,
poll, ack, peek and size, and SQS ListQueues (SigV4, botocore's signer) to list queues, which the EmoDB
face cannot. Each command uses the key of the role it needs, as `<data-dir>/client.env` holds them
(`KEYS`). Poll answers carry a `receipt` in the queue server's form (`<token hex>.<id>`), so `strictq ack`
takes the same receipts whichever server printed them.

The EmoDB calls go through the SDK's client (strictq.sdk.client.EmoClient, one per role key, trusting the
CLI's STRICTQ_CA_FILE): one client of the face, one error path. What is the CLI's own lives here: the keys,
the receipts, chunking a send, the SigV4 ListQueues, and turning the SDK's errors into one line for a
terminal (`EdgeError` for a refusal, cli_endpoint.explain for no answer).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from protocol.errors import BAD_RESPONSE, error_body

from .cli_endpoint import CliError, EdgeError, Endpoint, explain, refusal, ssl_context
from .sdk.client import EmoClient, PollItem
from .sdk.config import ClientConfig
from .sdk.errors import ConfigError, GatewayError

__all__ = ["KEYS", "EdgeClient", "EdgeError", "key_for", "parse_receipt", "receipt", "sqs_key"]

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


def receipt(item: PollItem) -> str:
    return f"{item.token or 0:x}.{item.id}"


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
    """A command's calls to `strictq serve`: the EmoDB face through one SDK client per key, SQS beside."""

    def __init__(self, found: Endpoint, *, timeout: float = 60.0) -> None:
        self.endpoint = found
        self._ssl = ssl_context(found)  # CliError naming STRICTQ_CA_FILE before anything is sent
        self._timeout = timeout
        self._clients: dict[str, EmoClient] = {}
        self._session: aiohttp.ClientSession | None = None  # the SQS call's, opened on first use

    async def __aenter__(self) -> EdgeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _emo(self, key: str) -> EmoClient:
        """The SDK client that calls with `key` (a command uses one role's key; one client per key)."""
        client = self._clients.get(key)
        if client is None:
            try:
                region = os.environ.get("STRICTQ_REGION", "").strip() or None  # the SDK's X-Strictq-Region
                config = ClientConfig(url=self.endpoint.url, ca_file=self.endpoint.ca_file, region=region)
            except ConfigError as exc:
                raise CliError(str(exc), 2) from None
            client = EmoClient(config, key, timeout=self._timeout, ssl_context=self._ssl)
            client.open()
            self._clients[key] = client
        return client

    @asynccontextmanager
    async def _one_line(self) -> AsyncIterator[None]:
        """The SDK's errors as the CLI's: a refusal is `EdgeError` (`<status> <code>: <message>`), no
        answer is cli_endpoint.explain's line (the aiohttp error the SDK chained), anything else its text."""
        try:
            yield
        except GatewayError as exc:
            if exc.status >= 400:
                body = exc.body
                if isinstance(body, str):  # the SDK keeps a body that is not JSON as text
                    body = error_body(BAD_RESPONSE, body[:200])
                raise refusal(exc.status, body) from None
            cause = exc.__cause__ or exc.__context__  # TLSFailed is raised `from None`: its context
            if exc.status == 0 and cause is not None:
                raise CliError(await explain(cause, self.endpoint)) from None
            raise CliError(str(exc)) from None

    # --------------------------------------------------------------------------------- EmoDB face
    async def send(self, queue: str, payloads: Sequence[Any], group: str | None, key: str) -> None:
        async with self._one_line():
            for start in range(0, len(payloads), SEND_CHUNK):
                chunk = list(payloads[start : start + SEND_CHUNK])
                await self._emo(key).send_batch({queue: chunk}, group=group)

    async def poll(
        self, queue: str, limit: int, ttl: float | None, wait: float, key: str
    ) -> list[dict[str, Any]]:
        async with self._one_line():
            items = await self._emo(key).poll(queue, ttl=ttl, limit=limit, wait=wait)
        return [{**item.raw, "receipt": receipt(item)} for item in items]

    async def ack(self, queue: str, ids: Sequence[str], token: int | None, key: str) -> list[dict[str, Any]]:
        """Per-id results. With a token the gateway refuses superseded claims (409 naming them); without
        one it answers EmoDB's success whatever happened to each id: `accepted`."""
        try:
            async with self._one_line():
                await self._emo(key).ack(queue, ids, token)
        except EdgeError as exc:
            results = exc.body.get("results") if isinstance(exc.body, dict) else None
            if exc.status != 409 or not isinstance(results, list):
                raise
            return [r for r in results if isinstance(r, dict)]
        return [{"id": i, "status": "ok" if token is not None else "accepted"} for i in ids]

    async def peek(self, queue: str, limit: int, key: str) -> list[dict[str, Any]]:
        async with self._one_line():
            return await self._emo(key).peek(queue, limit)

    async def size(self, queue: str, key: str) -> dict[str, Any]:
        async with self._one_line():
            client = self._emo(key)
            total = await client.size(queue)
            return {"name": queue, "total": total, "in_flight": await client.claimcount(queue)}

    # ------------------------------------------------------------------------------------ SQS face
    async def sqs(self, action: str, params: Mapping[str, Any], key_id: str, secret: str) -> dict[str, Any]:
        """One SQS JSON-protocol call, SigV4-signed as boto3 would sign it."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
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
