"""`strictq serve --queue-server URL`: the gateway in front of a separate `strictq queue-server`.

The module's `gateway` fixture replaces the in-process core with a queue server reached over its internal API
(its real app on a loopback socket, served in process by kit.inprocess), and re-runs a cross-section of the
faces' own tests against it (imported below, so they are collected here a second time). The tests written here
cover what only exists remotely, with a real `strictq queue-server` process: the queue server going away and
coming back, `--queue-server`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web
from conftest import ServerProcess, running_server, start_server
from gateway_support import CREDENTIALS, Gateway
from kit.inprocess import InProcessServer, serve_in_process
from kit.process import CLIENT_ENV, LISTENING, launch, strictq
from kit.secret import internal_secret
from test_gateway_emodb import emo, session
from test_gateway_emodb import test_bad_input_is_a_json_4xx_and_serving_goes_on as test_remote_emodb_bad_input
from test_gateway_emodb import test_bodies_cross_faces as test_remote_bodies_cross_faces
from test_gateway_emodb import test_every_rest_call_of_the_page_over_curl as test_remote_emodb_rest_calls
from test_gateway_emodb import test_move_runs_to_completion as test_remote_emodb_move
from test_gateway_sqs import test_auction_groups_go_to_one_consumer_each as test_remote_auction
from test_gateway_sqs import test_batches_answer_per_entry as test_remote_batches
from test_gateway_sqs import test_cancel_message_move_task_stops_a_running_redrive as test_remote_cancel_move
from test_gateway_sqs import test_dead_letter_queue_and_redrive_restore_group_order as test_remote_redrive
from test_gateway_sqs import test_message_attributes_round_trip_with_sqs_md5s as test_remote_attributes
from test_gateway_sqs import test_queue_management as test_remote_queue_management
from test_gateway_sqs import (
    test_receive_request_attempt_id_retry_returns_the_same_messages as test_remote_attempt_id,
)
from test_gateway_sqs_errors import test_every_error_is_the_one_sqs_returns as test_remote_sqs_errors
from test_gateway_sqs_errors import test_tenants_never_see_each_others_queues as test_remote_tenants

from access.keys import KeyRing
from gateway.app import make_gateway_app
from queue_core.remote import RemoteQueueService

__all__ = [
    "emo",
    "session",
    "test_remote_attempt_id",
    "test_remote_attributes",
    "test_remote_auction",
    "test_remote_batches",
    "test_remote_bodies_cross_faces",
    "test_remote_cancel_move",
    "test_remote_emodb_bad_input",
    "test_remote_emodb_move",
    "test_remote_emodb_rest_calls",
    "test_remote_queue_management",
    "test_remote_redrive",
    "test_remote_sqs_errors",
    "test_remote_tenants",
]


@pytest.fixture
def queue_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path / "queue-server") as proc:
        yield proc


async def _serve_gateway(tmp_path: Path, backend: RemoteQueueService) -> tuple[web.AppRunner, str, Path]:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    runner = web.AppRunner(make_gateway_app(backend, KeyRing(list(CREDENTIALS))), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return runner, f"https://127.0.0.1:{runner.addresses[0][1]}", ca_file


@pytest.fixture
async def internal_api(tmp_path: Path) -> AsyncIterator[InProcessServer]:
    """The queue server's internal API (its real app over a real loopback socket) served in this process:
    the remote faces' tests are about the gateway talking HTTP to it, not about its process (the tests
    below that stop and restart it, or start `strictq serve --queue-server`, use a real process)."""
    async with serve_in_process(tmp_path / "queue-server") as served:
        yield served


@pytest.fixture
async def gateway(tmp_path: Path, internal_api: InProcessServer) -> AsyncIterator[Gateway]:
    """The faces' fixture, with the core behind its internal API (RemoteQueueService over HTTP)."""
    backend = RemoteQueueService(internal_api.url, probe_interval=0.2, secret=internal_secret())
    await backend.start()
    runner, url, ca_file = await _serve_gateway(tmp_path, backend)
    try:
        yield Gateway(url, ca_file, backend, KeyRing(list(CREDENTIALS)))  # type: ignore[arg-type]
    finally:
        backend.stop_waiting()
        await runner.cleanup()
        await backend.close()


async def _eventually(check: object, what: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_queue_server_down_is_503_and_readiness_follows_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "queue-server"
    server = start_server(data_dir)
    backend = RemoteQueueService(server.url, probe_interval=0.1, secret=internal_secret())
    await backend.start()
    runner, url, ca_file = await _serve_gateway(tmp_path, backend)
    key = {"X-BV-API-Key": CREDENTIALS[0].secret}
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file)))
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=10)
        ) as http:

            async def ready() -> bool:
                async with http.get(url + "/readyz") as response:
                    return response.status == 200

            async def not_ready() -> bool:
                return not await ready()

            await _eventually(ready, "the gateway to report ready")
            async with http.post(url + "/queue/1/jobs/send", json={"n": 1}, headers=key) as response:
                assert response.status == 200, await response.text()

            server.terminate()
            async with http.post(url + "/queue/1/jobs/send", json={"n": 2}, headers=key) as response:
                assert response.status == 503
                body = await response.json()
                assert body["error"]["code"] == "unavailable" and "did not answer" in body["error"]["message"]
            await _eventually(not_ready, "readiness to follow the queue server down")

            # Same data dir, new process (new port): a gateway pointed at it sees what was acknowledged.
            server = start_server(data_dir)
            backend.url = server.url
            await _eventually(ready, "readiness to come back")
            async with http.get(url + "/queue/1/jobs/poll", headers=key) as response:
                assert [m["payload"] for m in await response.json()] == [{"n": 1}]
    finally:
        await runner.cleanup()
        await backend.close()
        server.terminate()


def test_strictq_serve_with_queue_server_flag(tmp_path: Path, queue_server: ServerProcess) -> None:
    """The command line: `strictq serve --queue-server URL` prints the contract lines and serves."""
    data_dir = tmp_path / "edge"
    remote = ("--queue-server", queue_server.url, "--no-proxy")
    proc = launch(
        strictq("serve", "--port", "0", "--data-dir", str(data_dir), *remote),
        tmp_path / "serve.log",
        wait_for=(CLIENT_ENV,),
    )
    try:
        first, *lines = proc.lines
        assert first.startswith("strictq: listening on https://127.0.0.1:"), first
        url = proc.value(LISTENING)
        assert url is not None
        assert [line.split(" ", 2)[1] for line in lines] == ["ca", "keys", "client"], lines
        ca = lines[0].split("ca ", 1)[1].strip()
        keys = KeyRing.load(Path(lines[1].split("keys ", 1)[1].strip()))
        admin = next(c for c in keys.credentials if c.role == "admin")

        async def roundtrip() -> list[object]:
            connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca))
            async with aiohttp.ClientSession(connector=connector) as http:
                headers = {"X-BV-API-Key": admin.secret}
                async with http.post(url + "/queue/1/jobs/send", json="hello", headers=headers) as r:
                    assert r.status == 200, await r.text()
                async with http.get(url + "/queue/1/jobs/peek", headers=headers) as r:
                    peeked = await r.json()
                assert isinstance(peeked, list), peeked
                return [m["payload"] for m in peeked]

        assert asyncio.run(roundtrip()) == ["hello"]
    finally:
        assert proc.terminate(timeout=10) == 0


async def test_a_remote_long_poll_answers_when_a_message_arrives(gateway: Gateway) -> None:
    """The poll waits on the queue server, not in the gateway: a send wakes it long before its wait ends."""
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(gateway.ca_file)))
    key = {"X-BV-API-Key": CREDENTIALS[0].secret}
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:

        async def poll() -> list[object]:
            async with http.get(gateway.url + "/queue/1/lp/poll", params={"wait": "20"}, headers=key) as r:
                return [m["payload"] for m in await r.json()]

        async with http.post(gateway.url + "/queue/1/lp/send", json="warm", headers=key) as r:
            assert r.status == 200  # EmoDB queues exist once sent to; a poll of an unknown one is empty
        assert await poll() == ["warm"]
        polling = asyncio.create_task(poll(), name="long-poll")
        await asyncio.sleep(0.3)  # let the poll reach the queue server and wait there
        assert not polling.done()
        async with http.post(gateway.url + "/queue/1/lp/send", json={"n": 1}, headers=key) as r:
            assert r.status == 200
        # Bounded well below the poll's 20 s wait: it must answer because of the send.
        assert await asyncio.wait_for(polling, timeout=5) == [{"n": 1}]


async def test_a_rollout_step_stands_where_the_queue_server_has_no_failure_management(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind `--queue-server` without `--health` there is no event stream to record the step in: the
    step is applied and answered 200 (a client must not retry a change that took effect), one WARNING."""
    from queue_core.control_relay import RelayHub
    from strictq.serve import make_edge_app

    server = start_server(tmp_path / "queue-server", "--no-health")
    backend = RemoteQueueService(server.url, probe_interval=0.2, secret=internal_secret())
    await backend.start()
    keys = KeyRing(list(CREDENTIALS))
    app = make_edge_app(backend, keys, control=RelayHub(backend), remote=backend)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    headers = {"X-BV-API-Key": "admin-secret-0123456789"}
    producer = {"X-BV-API-Key": "producer-secret-0123456789"}
    try:
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(
                url + "/queue/1/canary/send?group=g", json={"n": 1}, headers=producer
            ) as answer:
                assert answer.status in (200, 201), await answer.text()
            step = {"version": "2.0", "percent": 25, "state": "running", "reason": "canary"}
            with caplog.at_level("WARNING", logger="strictq.gateway"):
                async with http.put(url + "/admin/v1/queues/canary/rollout", json=step) as answer:
                    body = await answer.json()
                    assert answer.status == 200, body
            assert body["routing"]["canary"] == {"version": "2.0", "percent": 25}, body
            assert any("its event rollout-running not recorded" in r.getMessage() for r in caplog.records)
            async with http.get(url + "/admin/v1/queues/canary/routing") as answer:
                assert (await answer.json())["rollout"]["state"] == "running"
    finally:
        backend.stop_waiting()
        await runner.cleanup()
        await backend.close()
        server.stop()
