"""Request ids end to end (issue 17), through what production runs: a real `strictq serve` (TLS, the queue
core in-process, the egress proxy as its child, the wire log), the SDK's producer and worker, boto3, and a
backend the worker calls through the proxy.

A producer's X-Request-Id comes back on the answer, stays with the message, reaches the SDK worker with
its delivery, rides on the worker's outbound call (X-Strictq-Request-Id, stripped by the proxy) and is
written into the wire-log records of the delivery, the call and the worker's result; it survives a
restart of the server. The faces' details are in tests/test_request_ids.py.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import orjson
import pytest
from botocore.config import Config
from kit import until
from kit.backend import BackendThread
from replay_support import Serve, start_serve

from protocol import headers
from strictq.sdk import ClientConfig, Entry, Message, Producer, Worker
from wirelog.reader import RecordFilter, read_records

UUID_SHAPED = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMEOUT = 30.0


@dataclass
class System:
    serve: Serve
    backend: BackendThread

    @property
    def env(self) -> dict[str, str]:
        return self.serve.env

    @property
    def wirelog(self) -> Path:
        return self.serve.data_dir / "wirelog"

    def credential(self, role: str) -> tuple[str, str]:
        keys = tomllib.loads((self.serve.data_dir / "keys.toml").read_text())
        found = next(c for c in keys["credential"] if c["role"] == role)
        return str(found["id"]), str(found["secret"])

    def session(self, role: str) -> aiohttp.ClientSession:
        context = ssl.create_default_context(cafile=self.env["STRICTQ_CA_FILE"])
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            headers={headers.API_KEY: self.credential(role)[1]},
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        )

    def records(self, **where: Any) -> list[dict[str, Any]]:
        return list(read_records(self.wirelog, where=RecordFilter(**where)))


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    base = tmp_path_factory.mktemp("request-ids")
    (base / "serve").mkdir()
    backend = BackendThread().start()
    try:
        serve = start_serve(base / "serve")
        try:
            yield System(serve, backend)
        finally:
            serve.stop()
    finally:
        backend.stop()


async def run_until(worker: Worker, done: Any, what: str) -> None:
    """Run the worker until `done()` holds; stop it (grace 1 s) and wait for it."""
    task = asyncio.create_task(worker.run(), name="test-worker")
    try:
        await until(done, TIMEOUT, what=what)
    finally:
        worker.stop(1.0)
        async with asyncio.timeout(TIMEOUT):
            await task


async def test_a_producers_request_id_reaches_the_wire_log_record_of_the_workers_call(system: System) -> None:
    queue, mine = "rid-e2e", f"checkout-{uuid.uuid4().hex[:10]}/attempt=1"
    async with system.session("producer") as producer:
        url = f"{system.env['STRICTQ_URL']}/queue/1/{queue}/send?group=customer-1"
        async with producer.post(url, json={"order": 1}, headers={headers.REQUEST_ID: mine}) as answer:
            assert answer.status == 200, await answer.text()
            assert answer.headers[headers.REQUEST_ID] == mine

    handled: list[Message] = []

    async def handle(msg: Message) -> None:
        async with msg.http.post(f"{system.backend.url}/charge", json=msg.payload) as resp:
            resp.raise_for_status()
        handled.append(msg)

    worker = Worker(queue, handle, config=ClientConfig.from_env(system.env), wait=1.0)
    await run_until(worker, lambda: worker.stats.acked == 1, "the worker's success")
    (msg,) = handled
    assert msg.request_id == mine
    (call,) = [seen for seen in system.backend.backend.seen if seen.path == "/charge"]
    assert call.header(headers.REQUEST_ID_TAG) is None  # the proxy strips the tag like the others
    assert call.header(headers.MESSAGE_ID) is None

    def story() -> list[dict[str, Any]]:  # the proxy's and the gateway's writers flush within a second
        found = system.records(message_id=msg.id)
        kinds = sorted(r["kind"] for r in found)
        return found if {"http", "delivery", "log"} <= set(kinds) else []

    records = await until(story, TIMEOUT, what="the message's records in the wire log")
    (http,) = [r for r in records if r["kind"] == "http"]
    assert (http["request_id"], http["worker"], http["action"]) == (mine, worker.worker_id, "pass")
    assert http["request"]["url"].endswith("/charge") and http["response"]["status"] == 200
    assert all(r["request_id"] == mine for r in records if r["kind"] in ("http", "delivery", "log"))
    # ... and a search by the producer's request id finds that story.
    assert {r["message_id"] for r in system.records(request_id=mine)} == {msg.id}


async def test_the_producer_names_its_requests_and_the_gateway_names_the_others(system: System) -> None:
    queue = "rid-producer"
    async with Producer(config=ClientConfig.from_env(system.env)) as producer:
        results = await producer.send_batch([Entry(queue, {"n": n}, "g") for n in range(3)])
    assert all(r.ok for r in results) and len({r.request_id for r in results}) == 1
    sent = results[0].request_id
    assert sent is not None and UUID_SHAPED.fullmatch(sent)
    async with system.session("producer") as producer:
        url = f"{system.env['STRICTQ_URL']}/queue/1/{queue}/send?group=g"
        async with producer.post(url, json={"n": 3}, headers={headers.REQUEST_ID: "bad id"}) as answer:
            assert answer.status == 200
            made = answer.headers[headers.REQUEST_ID]
    assert made != "bad id" and UUID_SHAPED.fullmatch(made)
    async with system.session("worker") as worker:
        poll = f"{system.env['STRICTQ_URL']}/queue/1/{queue}/poll?ttl=30&limit=10"
        sdk = {headers.CAPABILITIES: "request_ids"}
        async with worker.get(poll, headers=sdk) as answer:
            items = orjson.loads(await answer.read())
    assert [(item["payload"]["n"], item["request_id"]) for item in items] == [
        (0, sent), (1, sent), (2, sent), (3, made),
    ]  # fmt: skip


def test_boto3_gets_the_request_id_as_sqs_gives_it(system: System) -> None:
    key_id, secret = system.credential("admin")
    sqs = boto3.client(
        "sqs",
        endpoint_url=system.env["STRICTQ_URL"],
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        verify=system.env["STRICTQ_CA_FILE"],
        config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=30),
    )
    url = sqs.create_queue(QueueName="rid-sqs")["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="hello")
    request_id = sent["ResponseMetadata"]["RequestId"]
    assert UUID_SHAPED.fullmatch(request_id) and "x-request-id" not in sent["ResponseMetadata"]["HTTPHeaders"]
    plain = sqs.receive_message(QueueUrl=url, AttributeNames=["All"], VisibilityTimeout=0)["Messages"]
    assert "StrictqRequestId" not in plain[0]["Attributes"]
    asked = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["StrictqRequestId"])["Messages"]
    assert asked[0]["Attributes"]["StrictqRequestId"] == request_id


def test_the_request_id_survives_a_restart(tmp_path: Path) -> None:
    """Kept in the store with the body: a message sent before a restart of `strictq serve` is delivered
    after it with the id of the request that sent it (a client's own id, and one the gateway made)."""
    import urllib.request

    from serve_support import start_serve as start_plain_serve

    data_dir = tmp_path / "var" / "strictq"

    def call(serve: Any, method: str, path: str, role: str, body: Any = None, **head: str) -> tuple[Any, Any]:
        data = None if body is None else orjson.dumps(body)
        request = urllib.request.Request(serve.url + path, data=data, method=method)
        request.add_header(headers.API_KEY, serve.secret(role))
        for name, value in head.items():
            request.add_header(name, value)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=serve.ssl_context()) as answer:
            return answer.headers, orjson.loads(answer.read())

    serve = start_plain_serve(data_dir, tls=True)
    try:
        named = {headers.REQUEST_ID: "mine-1"}
        call(serve, "POST", "/queue/1/kept/send?group=g", "producer", {"n": 1}, **named)
        answer, _ = call(serve, "POST", "/queue/1/kept/send?group=g", "producer", {"n": 2})
        made = answer[headers.REQUEST_ID]
    finally:
        serve.stop()
    serve = start_plain_serve(data_dir, tls=True)
    try:
        sdk = {headers.CAPABILITIES: "results, probes, request_ids"}
        _, items = call(serve, "GET", "/queue/1/kept/poll?ttl=30&limit=10", "worker", **sdk)
    finally:
        serve.stop()
    assert [(item["payload"]["n"], item["request_id"]) for item in items] == [(1, "mine-1"), (2, made)]


async def test_a_queue_server_keeps_the_id_across_a_restart(tmp_path: Path) -> None:
    """`strictq queue-server`: the internal API takes the id a gateway forwards with each message, keeps
    it in the store, and answers it with every delivery, after a restart too."""
    from conftest import start_server

    from queue_core.client import QueueClient

    made = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    server = await asyncio.to_thread(start_server, tmp_path / "data")
    try:
        async with QueueClient(server.url, timeout=TIMEOUT) as client:
            await client.send("q", [{"body": "a", "group": "g", "request_id": made},
                                    {"body": "b", "group": "g", "request_id": "client-7"},
                                    {"body": "c", "group": "g"}])  # fmt: skip
    finally:
        await asyncio.to_thread(server.stop)
    server = await asyncio.to_thread(start_server, tmp_path / "data")
    try:
        async with QueueClient(server.url, timeout=TIMEOUT) as client:
            items = await client.receive("q", limit=10, ttl=30)
    finally:
        await asyncio.to_thread(server.stop)
    assert [(item["body"], item.get("request_id")) for item in items] == [
        ("a", made), ("b", "client-7"), ("c", None),
    ]  # fmt: skip
