"""An in-process gateway over real TLS (a trustme CA) on 127.0.0.1, with two tenants' credentials.

boto3 and other blocking clients must be called through `asyncio.to_thread`: the gateway runs on the
test's own event loop.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import orjson
import pytest
import trustme
from aiohttp import web
from botocore.config import Config
from kit.prometheus import parse_series

from access.keys import Credential, KeyRing
from gateway.app import make_gateway_app
from gateway.deliveries import DeliveryLog
from gateway.rate_limits import TenantRateLimiter
from queue_core.control import ControlHub
from queue_core.service import QueueService

CREDENTIALS = [
    Credential("admin-1", "admin-secret-0123456789", "admin", "t1"),
    Credential("producer-1", "producer-secret-0123456789", "producer", "t1"),
    Credential("worker-1", "worker-secret-0123456789", "worker", "t1"),
    Credential("worker-2", "worker-secret-9876543210", "worker", "t1"),
    Credential("limited-1", "limited-secret-0123456789", "admin", "t1", ("orders",)),
    Credential("other-1", "other-secret-0123456789", "admin", "t2"),
]


@dataclass
class Gateway:
    url: str  # https://127.0.0.1:PORT
    ca_file: Path  # PEM of the CA that signed the server certificate
    service: QueueService
    keys: KeyRing
    deliveries: DeliveryLog | None = None  # with `delivery_gateway`: the gateway's wire-log records

    def credential(self, key_id: str) -> Credential:
        credential = self.keys.by_id(key_id)
        assert credential is not None, key_id
        return credential


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with serve_gateway(tmp_path) as gw:
        yield gw


@pytest.fixture
async def delivery_gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """The same gateway writing delivery records (gateway.deliveries) to <tmp>/wirelog, key in <tmp>."""
    deliveries = DeliveryLog(tmp_path / "wirelog", key_dir=tmp_path, compress=False)
    deliveries.start()
    try:
        async with serve_gateway(tmp_path, deliveries) as gw:
            yield gw
    finally:
        await deliveries.close()


@contextlib.asynccontextmanager
async def serve_gateway(
    tmp_path: Path,
    deliveries: DeliveryLog | None = None,
    receipt_key: Path | None = None,
    sqs_regions: frozenset[str] | None = None,
    limiter: TenantRateLimiter | None = None,
    credentials: list[Credential] | None = None,
) -> AsyncIterator[Gateway]:
    """`receipt_key`: the SQS receipt-handle key file (as `strictq serve` keeps it); None: in memory.
    `sqs_regions`: the regions SQS requests may be signed for (gateway.sqs_regions); None: any.
    `limiter`: per-tenant send limits (gateway.rate_limits); None: unlimited. `credentials`: the key file
    (default CREDENTIALS)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    service = QueueService(tmp_path / "queue")
    await service.start()
    keys = KeyRing(list(CREDENTIALS if credentials is None else credentials))
    app = make_gateway_app(
        service,
        keys,
        control=ControlHub(service),  # the core's fences and control stream, as `strictq serve` composes it
        deliveries=deliveries,
        receipt_key=receipt_key,
        sqs_regions=sqs_regions,
        limiter=limiter,
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Gateway(f"https://127.0.0.1:{port}", ca_file, service, keys, deliveries)
    finally:
        service.stop_waiting()
        await runner.cleanup()
        await service.close()


def sqs_client(gw: Gateway, key_id: str) -> Any:
    """boto3's SQS client for `key_id` against the gateway, no retries (a refusal is seen as it is); call
    it through `asyncio.to_thread`."""
    credential = gw.credential(key_id)
    return boto3.client(
        "sqs",
        endpoint_url=gw.url,
        region_name="us-east-1",
        aws_access_key_id=credential.id,
        aws_secret_access_key=credential.secret,
        verify=str(gw.ca_file),
        config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=30),
    )


class Emo:
    """An aiohttp client of the gateway's HTTP routes (EmoDB face, admin routes) with one credential:
    `call` answers (status, headers, JSON body)."""

    def __init__(self, gw: Gateway, key_id: str) -> None:
        context = ssl.create_default_context(cafile=str(gw.ca_file))
        self.url = gw.url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            headers={"X-BV-API-Key": gw.credential(key_id).secret},
        )

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
        data = None if body is None else orjson.dumps(body)
        content = {} if data is None else {"Content-Type": "application/json"}
        async with self.session.request(method, self.url + path, data=data, headers=content) as answer:
            raw = await answer.read()
            return answer.status, dict(answer.headers), orjson.loads(raw) if raw else None

    async def close(self) -> None:
        await self.session.close()

    async def samples(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The gateway's /metrics samples called `name`, by their sorted labels (this credential's view)."""
        async with self.session.get(self.url + "/metrics") as answer:
            assert answer.status == 200, await answer.text()
            text = await answer.text()
        return {labels: found for (sample, labels), found in parse_series(text).items() if sample == name}
