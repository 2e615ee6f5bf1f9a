"""The fence addon (`fencing.addons.fence`): is a worker fenced? Block it (403, no upstream socket, its
open connections closed, raw tunnels refused) or leave the mimic verdict on the flow.

Unit tests drive the addon with mitmproxy's test flows; end-to-end tests run a real `strictq proxy`
following a control stream, with real HTTP and HTTPS backends that count accepted sockets. Answering
from recordings (the mimic addon, fed by the verdict) is tests/test_proxy_mimic.py's.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import proxy_support
import pytest
from control_support import (
    fence_worker,
    proxy_caught_up,
    queue_server_in_process,
    unfence_worker,
    until,
)
from kit.inprocess import InProcessServer
from mitmproxy import http
from mitmproxy.test import taddons, tflow
from proxy_support import Backends, ProxyProcess, WorkerClient, make_tags, wait_records

from fencing.addons.fence import Fence
from fencing.answering import mimic_verdict
from fencing.context import METADATA_KEY, PROXY_ACTION_HEADER, CallContext
from fencing.control_client import ControlState, FenceInfo
from fencing.mimic import identity_from_url
from strictq.sdk.outbound import CallFenced, proxy_authorization

BACKEND = "https://api.example:8443"


def fenced(state: ControlState, worker: str, mode: str) -> None:
    state.set_fence(FenceInfo(worker, mode, "test", 1.0, None))


def call_flow(
    worker: str = "worker-1",
    *,
    method: str = "GET",
    url: str = f"{BACKEND}/status?job=1",
    body: bytes = b"",
    message_id: str | None = "m-1",
    call: int | None = 1,
    client: Any = None,
) -> http.HTTPFlow:
    """A flow as auth, tagging and redact leave it: the worker, the tags and the request identity."""
    request = http.Request.make(method, url, body)
    flow = tflow.tflow(req=request, client_conn=client) if client else tflow.tflow(req=request)
    identity = identity_from_url(method, url, hashlib.sha256(body).hexdigest())
    flow.metadata[METADATA_KEY] = CallContext(
        started=0.0, worker=worker, tenant="t1", queue="orders" if message_id else None,
        message_id=message_id, group="g1" if message_id else None, lease=1 if message_id else None,
        attempt=1 if message_id else None, call=call, tagged=message_id is not None,
        request_identity=identity,
    )  # fmt: skip
    return flow


async def run_request(addons: Sequence[Any], flow: http.HTTPFlow) -> None:
    """The requestheaders hook, then the request hook, through the addons in chain order, as mitmproxy
    runs them (a request hook may return an awaitable on the slow path)."""
    for addon in addons:
        if hasattr(addon, "requestheaders"):
            addon.requestheaders(flow)
    for addon in addons:
        if hasattr(addon, "request"):
            pending = addon.request(flow)
            if pending is not None:
                await pending


# ------------------------------------------------------------------------------------------- block
async def test_block_answers_403_tagged_and_untagged_and_counts() -> None:
    state = ControlState()
    fence = Fence(state)
    fenced(state, "worker-1", "block")
    for flow in (call_flow(), call_flow(message_id=None, call=None)):
        fence.requestheaders(flow)
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.response.headers[PROXY_ACTION_HEADER] == "block"
        body = orjson.loads(flow.response.content or b"")
        assert body["action"] == "block" and "fenced" in body["message"]
        assert flow.metadata[METADATA_KEY].action == "block"
    other = call_flow("worker-2")
    await run_request([fence], other)
    assert other.response is None  # only the fenced worker
    assert fence.blocked == 2


async def test_unfence_lets_calls_pass_again() -> None:
    state = ControlState()
    fence = Fence(state)
    fenced(state, "worker-1", "block")
    state.remove_fence("worker-1")
    flow = call_flow()
    await run_request([fence], flow)
    assert flow.response is None and flow.metadata[METADATA_KEY].action == "pass"


def test_running_enforces_lazy_connections_and_no_upstream_cert() -> None:
    from mitmproxy.addons.proxyserver import Proxyserver

    fence = Fence(ControlState())
    with taddons.context(Proxyserver(), fence) as tctx:
        assert tctx.options.connection_strategy == "eager" and tctx.options.upstream_cert
        fence.running()
        assert tctx.options.connection_strategy == "lazy" and not tctx.options.upstream_cert
        with pytest.raises(Exception, match="lazy"):
            tctx.options.update(connection_strategy="eager")
        assert tctx.options.connection_strategy == "lazy"


# ---------------------------------------------------------------------------------- the mimic verdict
async def test_a_mimic_fence_leaves_its_verdict_on_the_flow_and_answers_nothing() -> None:
    state = ControlState()
    fence = Fence(state)
    fenced(state, "worker-1", "mimic")
    flow, other = call_flow(), call_flow("worker-2")
    for f in (flow, other):
        await run_request([fence], f)
    verdict = mimic_verdict(flow)
    assert verdict is not None and (verdict.worker, verdict.mode) == ("worker-1", "mimic")
    assert flow.response is None and flow.request.stream is False  # the mimic addon answers, after us
    assert mimic_verdict(other) is None and other.response is None
    assert fence.blocked == 0


async def test_the_decision_is_taken_again_once_the_body_has_arrived() -> None:
    """A fence that comes (or goes) between the request headers and the body decides the call."""
    state = ControlState()
    fence = Fence(state)
    came, went, blocked = (call_flow(message_id=m) for m in ("m-1", "m-2", "m-3"))
    fence.requestheaders(came)
    fenced(state, "worker-1", "mimic")
    fence.request(came)
    assert mimic_verdict(came) is not None
    fence.requestheaders(went)
    state.remove_fence("worker-1")
    fence.request(went)
    assert mimic_verdict(went) is None and went.response is None
    fence.requestheaders(blocked)
    fenced(state, "worker-1", "block")
    fence.request(blocked)
    assert mimic_verdict(blocked) is None
    assert blocked.response is not None and blocked.response.status_code == 403


def test_replay_mode_is_read_from_the_mimic_addons_option() -> None:
    from fencing.addons.mimic import Mimic

    state = ControlState()
    fence = Fence(state)
    with taddons.context(fence, Mimic(state)) as tctx:
        assert not fence.replay
        tctx.options.update(strictq_replay=True)
        assert fence.replay
        flow = call_flow("worker-7")  # fenced by nobody: in replay mode every worker is mimicked
        fence.request(flow)
        verdict = mimic_verdict(flow)
        assert verdict is not None and (verdict.mode, verdict.reason) == ("mimic", "replay")


# ------------------------------------------------------------------------------------- end to end
# proxy_support's fixtures, registered for this module (conftest does not load them).
upstream_ca, backends = proxy_support.upstream_ca, proxy_support.backends
proxy_keys, proxy_factory = proxy_support.proxy_keys, proxy_support.proxy_factory
ADMIN_SECRET = proxy_support.credential("admin-1").secret


@pytest.fixture
async def core(tmp_path: Path, proxy_keys: Path) -> AsyncIterator[InProcessServer]:
    """The core's control stream and fence API, served in the test's loop: the proxy process is the point."""
    async with queue_server_in_process(tmp_path / "core", proxy_keys) as server:
        yield server


async def set_fence(core: InProcessServer, proxy: ProxyProcess, worker: str, mode: str | None) -> None:
    """Fence (mode) or unfence (None) through the core's admin API; return once the proxy knows."""
    if mode is None:
        await unfence_worker(core, ADMIN_SECRET, worker)
        await proxy_caught_up(core, proxy.admin_url, lambda s: worker not in s.fences)
    else:
        await fence_worker(core, ADMIN_SECRET, worker, mode)
        await proxy_caught_up(
            core, proxy.admin_url, lambda s: worker in s.fences and s.fences[worker].mode == mode
        )


async def test_block_answers_403_and_the_backends_see_no_connection_at_all(
    core: InProcessServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url)
    await set_fence(core, proxy, "worker-1", "block")
    for backend in backends.all():
        # Tagged, through the SDK: the refusal cancels the handler.
        async with WorkerClient(proxy, "worker-1", tags=make_tags(lease=1)) as tagged:
            with pytest.raises(CallFenced) as fenced:
                await tagged.call("POST", f"{backend.url}/charge", json={"amount": 5})
        assert (fenced.value.action, fenced.value.status) == ("block", 403)
        # Untagged: blocked too, a JSON 403 naming the action.
        async with WorkerClient(proxy, "worker-1") as untagged:
            for _ in range(2):  # also on a kept-alive connection / tunnel
                reply = await untagged.call("GET", f"{backend.url}/anything?x=1")
                assert reply.status == 403 and reply.headers.get(PROXY_ACTION_HEADER) == "block"
                assert reply.json()["action"] == "block"
    # Not one socket reached either backend: no CONNECT dial, no certificate sniffing.
    assert (backends.http.accepted, backends.https.accepted) == (0, 0)
    # Another worker is not affected.
    async with WorkerClient(proxy, "worker-2", tags=make_tags(lease=1)) as other:
        for backend in backends.all():
            assert (await other.call("GET", f"{backend.url}/ok")).status == 200
            assert backend.accepted >= 1
    records = await wait_records(proxy.wirelog_dir, lambda rs: sum(r["action"] == "block" for r in rs) >= 6)
    blocked = [r for r in records if r["action"] == "block" and r["request"]["method"] != "CONNECT"]
    assert {r["worker"] for r in blocked} == {"worker-1"}
    assert all(r["response"]["status"] == 403 for r in blocked)


async def test_unfence_restores_pass_through(
    core: InProcessServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url)
    await set_fence(core, proxy, "worker-1", "block")
    async with WorkerClient(proxy, "worker-1") as worker:
        assert (await worker.call("GET", f"{backends.https.url}/a")).status == 403
        await set_fence(core, proxy, "worker-1", None)
        reply = await worker.call("GET", f"{backends.https.url}/a")
        assert reply.status == 200 and PROXY_ACTION_HEADER not in reply.headers
    assert [s.path for s in backends.https.seen] == ["/a"]


# ------------------------------------------------------------------ fencing closes open connections
class StreamBackend:
    """A minimal HTTP/1.1 server that knows which of its connections are open: `/stream` sends chunks
    until the connection is closed under it, anything else answers `ok` and keeps the connection alive."""

    def __init__(self) -> None:
        self.url = ""
        self.open = 0
        self.accepted = 0
        self.closed = 0
        self.streaming = 0  # /stream responses being sent
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, ssl_context: ssl.SSLContext | None) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=ssl_context)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length:
                    await reader.readexactly(length)
                if path.startswith(b"/stream"):
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    self.streaming += 1
                    while True:  # until the proxy closes the connection under us
                        writer.write(b"5\r\ntick\n\r\n")
                        await writer.drain()
                        await asyncio.sleep(0.05)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.LimitOverrunError):
            pass
        finally:
            self.open -= 1
            self.closed += 1
            writer.close()
            self._tasks.discard(task)


@pytest.fixture
async def stream_backends(upstream_ca: proxy_support.UpstreamCA) -> AsyncIterator[list[StreamBackend]]:
    plain, secure = StreamBackend(), StreamBackend()
    await plain.start(None)
    await secure.start(upstream_ca.server_context())
    try:
        yield [plain, secure]
    finally:
        await plain.stop()
        await secure.stop()


async def test_fencing_closes_the_workers_open_upstream_connections(
    core: InProcessServer, stream_backends: list[StreamBackend], proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url)
    async with (
        WorkerClient(proxy, "worker-1") as streaming_worker,
        WorkerClient(proxy, "worker-1") as idle_worker,
        WorkerClient(proxy, "worker-2") as other_worker,
    ):
        for backend in stream_backends:
            # worker-1: a streaming response in flight (the backend would send forever) and a finished
            # call whose upstream connection the proxy keeps alive; worker-2: a kept-alive one too.
            stream = asyncio.create_task(streaming_worker.call("GET", f"{backend.url}/stream"))
            await until(lambda b=backend: b.streaming == 1, what="the stream started")
            assert (await idle_worker.call("GET", f"{backend.url}/ok")).body == b"ok"
            assert (await other_worker.call("GET", f"{backend.url}/ok")).body == b"ok"
            assert (backend.open, backend.closed) == (3, 0)
            await set_fence(core, proxy, "worker-1", "block")
            # Both of worker-1's upstream connections are closed at once; worker-2's stays open.
            await until(lambda b=backend: (b.open, b.closed) == (1, 2), what="worker-1's connections closed")
            # The in-flight call ends with the proxy's error instead of streaming on.
            try:
                async with asyncio.timeout(10):
                    reply = await stream
                assert reply.status == 502, reply
            except aiohttp.ClientError:
                pass  # the worker's own connection went down with it: closed, too
            assert (await other_worker.call("GET", f"{backend.url}/ok")).body == b"ok"
            assert backend.accepted == 3  # worker-2 reused its kept-alive connection
            await set_fence(core, proxy, "worker-1", None)


async def raw_tunnel(proxy: ProxyProcess, worker: str, target: str, payload: bytes) -> bytes:
    """CONNECT to `target` as `worker`, then send bytes that are neither TLS nor HTTP; return what came
    back before the proxy closed the tunnel (or 2 s of silence)."""
    host, port = proxy.url.split("://", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        auth = proxy_authorization(worker, proxy_support.credential(worker).secret)["Proxy-Authorization"]
        writer.write(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        writer.write(payload)
        await writer.drain()
        received = b""
        try:
            async with asyncio.timeout(2):
                while chunk := await reader.read(65536):
                    received += chunk
        except TimeoutError:
            pass
        return received
    finally:
        writer.close()


async def test_a_fenced_workers_raw_tunnel_never_dials_the_backend(
    core: InProcessServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url)
    backend = backends.http
    payload = b"\x00\x01 not tls, not http\r\n\r\n"
    # Unfenced, such bytes are relayed raw (mitmproxy's rawtcp): the backend gets a connection...
    await raw_tunnel(proxy, "worker-2", backend.host_port, payload)
    await until(lambda: backend.accepted == 1, what="the raw relay reached the backend")
    # ...fenced, the tunnel is closed instead and nothing is dialled.
    await set_fence(core, proxy, "worker-1", "block")
    assert await raw_tunnel(proxy, "worker-1", backend.host_port, payload) == b""
    assert backend.accepted == 1


async def test_with_two_proxy_processes_each_one_blocks_a_fenced_worker(
    core: InProcessServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url, "--processes", "2")
    assert len(proxy.urls) == 2 and len(proxy.admin_urls) == 2
    await fence_worker(core, ADMIN_SECRET, "worker-1", "block")
    for admin_url in proxy.admin_urls:  # each process follows the control stream on its own
        await proxy_caught_up(core, admin_url, lambda s: "worker-1" in s.fences)
    for url in proxy.urls:
        async with WorkerClient(url, "worker-1", proxy_ca=proxy.ca_file) as worker:
            for backend in backends.all():
                reply = await worker.call("GET", f"{backend.url}/x")
                assert reply.status == 403 and reply.headers.get(PROXY_ACTION_HEADER) == "block"
    assert (backends.http.accepted, backends.https.accepted) == (0, 0)
