"""The fence addon (`fencing.addons.fence`, `fencing.mimic`): block and mimic fenced workers.

Unit tests drive the addon with mitmproxy's test flows and a wire log written by wirelog's writer;
end-to-end tests run a real `strictq proxy` following a control stream, with real HTTP and HTTPS
backends that count accepted sockets.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import proxy_support
import pytest
from control_support import (
    QueueServer,
    fence_worker,
    proxy_caught_up,
    running_queue_server,
    unfence_worker,
    until,
)
from mitmproxy import http
from mitmproxy.test import taddons, tflow
from proxy_support import Backends, ProxyProcess, WorkerClient, make_tags, wait_records

from fencing.addons.fence import Fence
from fencing.context import METADATA_KEY, PROXY_ACTION_HEADER, CallContext
from fencing.control_client import ControlState, FenceInfo
from fencing.mimic import RecordingIndex, identity_from_url, recording_from_record
from strictq.sdk.outbound import CallFenced, proxy_authorization
from wirelog.record import http_record, http_request, http_response
from wirelog.writer import WireLogWriter

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


def recorded(
    rid: str,
    ts: float,
    status: int,
    answer: str,
    *,
    method: str = "GET",
    url: str = f"{BACKEND}/status?job=1",
    body: bytes = b"",
    message_id: str | None = None,
    call: int | None = None,
    action: str = "pass",
) -> dict[str, Any]:
    record = http_record(
        request=http_request(method=method, url=url, headers=[["Host", "api.example"]], body=body),
        response=http_response(
            status=status, headers=[["Content-Type", "application/json"], ["Content-Length", "99"]],
            body=orjson.dumps({"answer": answer}),
        ),
        action=action, ts=ts, worker="worker-9", message_id=message_id, call=call,
    )  # fmt: skip
    record["id"] = rid
    return record


def without_id(record: dict[str, Any]) -> dict[str, Any]:
    """For wirelog's writer, which assigns ids itself."""
    return {k: v for k, v in record.items() if k != "id"}


def index_of(*records: dict[str, Any]) -> RecordingIndex:
    index = RecordingIndex()
    for record in records:
        recording = recording_from_record(record)
        if recording is not None:
            index.add(recording)
    return index


def answer_of(flow: http.HTTPFlow) -> str:
    assert flow.response is not None
    return str(orjson.loads(flow.response.content or b"")["answer"])


async def run_request(fence: Fence, flow: http.HTTPFlow) -> None:
    """Both hooks, as mitmproxy runs them (request may return an awaitable on the slow path)."""
    fence.requestheaders(flow)
    pending = fence.request(flow)
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
    await run_request(fence, other)
    assert other.response is None  # only the fenced worker
    assert fence.blocked == 2


async def test_unfence_lets_calls_pass_again() -> None:
    state = ControlState()
    fence = Fence(state)
    fenced(state, "worker-1", "block")
    state.remove_fence("worker-1")
    flow = call_flow()
    await run_request(fence, flow)
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


# ------------------------------------------------------------------------------------------- mimic
def mimic_fence(index: RecordingIndex, *workers: str) -> Fence:
    state = ControlState()
    fence = Fence(state)
    for worker in workers:
        fenced(state, worker, "mimic")
    fence.index = index
    return fence


async def test_mimic_replays_a_recorded_sequence_in_order_then_repeats_the_last() -> None:
    index = index_of(
        recorded("r2", 2.0, 200, "running"),
        recorded("r1", 1.0, 202, "queued"),  # out of order on disk: recording time decides
        recorded("r3", 3.0, 200, "done"),
        recorded("x", 4.0, 500, "other endpoint", url=f"{BACKEND}/other"),
        recorded("y", 5.0, 200, "not passed", action="mimic"),
    )
    fence = mimic_fence(index, "worker-1")
    seen = []
    for call in range(1, 6):
        flow = call_flow(call=call)
        await run_request(fence, flow)
        assert flow.response is not None
        assert flow.response.headers[PROXY_ACTION_HEADER] == "mimic"
        assert "content-length" not in {k.lower() for k in flow.response.headers if k != "content-length"}
        ctx = flow.metadata[METADATA_KEY]
        assert ctx.action == "mimic"
        seen.append((flow.response.status_code, answer_of(flow), ctx.replayed_from))
    assert seen == [
        (202, "queued", "r1"),
        (200, "running", "r2"),
        (200, "done", "r3"),
        (200, "done", "r3"),
        (200, "done", "r3"),
    ]


async def test_mimic_matches_the_message_and_call_first_then_the_request() -> None:
    post = {"method": "POST", "url": f"{BACKEND}/charge", "body": b'{"amount": 5}'}
    index = index_of(
        recorded("any-1", 1.0, 201, "generic charge", **post),
        recorded("m7-c2", 2.0, 201, "m-7 call 2", message_id="m-7", call=2, **post),
        recorded("m7-c3", 3.0, 409, "m-7 call 3", message_id="m-7", call=3, **post),
    )
    fence = mimic_fence(index, "worker-1")
    flows = [
        call_flow(message_id="m-7", call=2, **post),  # this message's own call 2
        call_flow(message_id="m-7", call=3, **post),  # and its call 3
        call_flow(message_id="m-8", call=2, **post),  # another message: by request identity
        call_flow(message_id="m-7", call=2, method="POST", url=f"{BACKEND}/charge", body=b'{"amount": 6}'),
    ]
    for flow in flows:
        await run_request(fence, flow)
    assert [f.metadata[METADATA_KEY].replayed_from for f in flows[:3]] == ["m7-c2", "m7-c3", "any-1"]
    # A different body is a different request: nothing matches.
    last = flows[3]
    assert last.response is not None and last.response.status_code == 503
    assert last.response.headers[PROXY_ACTION_HEADER] == "unmatched"
    assert "no recording matched" in orjson.loads(last.response.content or b"")["message"]
    assert last.metadata[METADATA_KEY].action == "unmatched"


async def test_two_mimicked_workers_each_get_the_whole_sequence() -> None:
    index = index_of(*(recorded(f"r{i}", float(i), 200, f"step {i}") for i in range(1, 5)))
    fence = mimic_fence(index, "worker-1", "worker-2")

    async def worker(name: str) -> list[str]:
        answers = []
        for call in range(1, 5):
            flow = call_flow(name, call=call)
            await run_request(fence, flow)
            answers.append(answer_of(flow))
            await asyncio.sleep(0)  # interleave the two workers
        return answers

    one, two = await asyncio.gather(worker("worker-1"), worker("worker-2"))
    assert one == two == ["step 1", "step 2", "step 3", "step 4"]


async def test_sequences_are_per_message_and_restart_on_a_new_fence() -> None:
    index = index_of(recorded("r1", 1.0, 200, "first"), recorded("r2", 2.0, 200, "second"))
    fence = mimic_fence(index, "worker-1")
    answers = []
    for message_id in ("m-1", "m-2", "m-1"):
        flow = call_flow(message_id=message_id)
        await run_request(fence, flow)
        answers.append(answer_of(flow))
    assert answers == ["first", "first", "second"]
    fenced(fence.state, "worker-1", "mimic")  # fenced anew (another reason): sequences start over
    fence.index = index
    flow = call_flow(message_id="m-1")
    await run_request(fence, flow)
    assert answer_of(flow) == "first"


async def test_mimic_loads_the_wire_log_lazily_and_rereads_on_a_miss(tmp_path: Path) -> None:
    directory = tmp_path / "wirelog"
    writer = WireLogWriter(directory, "proxy", fsync="never", compress=False)
    first = writer.write(without_id(recorded("r1", 1.0, 200, "from disk")))
    writer.flush()
    state = ControlState()
    fence = Fence(state)
    with taddons.context(fence) as tctx:
        tctx.options.update(strictq_mimic_wirelog=str(directory), strictq_mimic_refresh=0.0)
        fenced(state, "worker-1", "mimic")  # starts loading in the background
        flow = call_flow()
        await run_request(fence, flow)
        assert answer_of(flow) == "from disk"
        assert flow.metadata[METADATA_KEY].replayed_from == first
        # Recorded after the first load: a miss re-reads the new part of the log.
        writer.write(without_id(recorded("r9", 9.0, 200, "later", url=f"{BACKEND}/later")))
        writer.flush()
        later = call_flow(url=f"{BACKEND}/later")
        await run_request(fence, later)
        assert answer_of(later) == "later"
        assert fence.index is not None and len(fence.index) == 2
        # Nobody left to mimic for: the index is dropped.
        state.remove_fence("worker-1")
        assert fence.index is None
    writer.close()


def test_index_is_bounded_and_forgets_the_oldest() -> None:
    index = RecordingIndex(max_records=3)
    for i in range(1, 6):
        recording = recording_from_record(recorded(f"r{i}", float(i), 200, f"s{i}"))
        assert recording is not None
        index.add(recording)
    assert len(index) == 3 and index.evicted == 2
    found = index.candidates(
        identity_from_url("GET", f"{BACKEND}/status?job=1", hashlib.sha256().hexdigest()), None, None
    )
    assert found is not None and [r.record_id for r in found[1]] == ["r3", "r4", "r5"]


def test_unusable_records_are_skipped() -> None:
    base = recorded("r", 1.0, 200, "x")
    errored = {**base, "error": "connection reset"}
    no_response = {**base, "response": None}
    metadata_only = {**base, "response": {**base["response"], "body": None, "body_b64": None}}
    refused = {**base, "action": "block"}
    for record in (errored, no_response, metadata_only, refused):
        assert recording_from_record(record) is None
    assert recording_from_record(base) is not None


# ------------------------------------------------------------------------------------- end to end
# proxy_support's fixtures, registered for this module (conftest does not load them).
upstream_ca, backends = proxy_support.upstream_ca, proxy_support.backends
proxy_keys, proxy_factory = proxy_support.proxy_keys, proxy_support.proxy_factory
ADMIN_SECRET = proxy_support.credential("admin-1").secret


@pytest.fixture
def core(tmp_path: Path, proxy_keys: Path) -> Iterator[QueueServer]:
    with running_queue_server(tmp_path / "core", proxy_keys) as server:
        yield server


async def set_fence(core: QueueServer, proxy: ProxyProcess, worker: str, mode: str | None) -> None:
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
    core: QueueServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
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
    core: QueueServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url)
    await set_fence(core, proxy, "worker-1", "block")
    async with WorkerClient(proxy, "worker-1") as worker:
        assert (await worker.call("GET", f"{backends.https.url}/a")).status == 403
        await set_fence(core, proxy, "worker-1", None)
        reply = await worker.call("GET", f"{backends.https.url}/a")
        assert reply.status == 200 and PROXY_ACTION_HEADER not in reply.headers
    assert [s.path for s in backends.https.seen] == ["/a"]


async def record_sequence(proxy: ProxyProcess, backend: proxy_support.Backend, steps: int) -> list[str]:
    """worker-2, unfenced, polls a job status `steps` times; the backend answers a new step each time.
    Returns the wire-log ids of those recorded calls, in order."""
    async with WorkerClient(proxy, "worker-2", tags=make_tags(message_id="m-rec")) as worker:
        for step in range(1, steps + 1):
            backend.respond = {"step": step}
            reply = await worker.call("GET", f"{backend.url}/status?job=1")
            assert reply.status == 200 and reply.json()["step"] == step
    backend.respond = {}
    records = await wait_records(
        proxy.wirelog_dir,
        lambda rs: sum(r["message_id"] == "m-rec" and r["response"] is not None for r in rs) == steps,
    )
    recorded = [r for r in records if r["message_id"] == "m-rec"]
    return [r["id"] for r in sorted(recorded, key=lambda r: r["call"])]


async def test_mimic_replays_recorded_sequences_per_worker_without_mixing(
    core: QueueServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
) -> None:
    proxy = proxy_factory("--control", core.url)
    backend = backends.https
    recorded_ids = await record_sequence(proxy, backend, 3)
    await set_fence(core, proxy, "worker-1", "mimic")
    await set_fence(core, proxy, "worker-2", "mimic")
    backends.reset()

    async def poll(worker: str, message_id: str) -> list[tuple[int, str | None, int]]:
        seen = []
        async with WorkerClient(proxy, worker, tags=make_tags(message_id=message_id)) as client:
            for _ in range(3):
                reply = await client.call("GET", f"{backend.url}/status?job=1")
                seen.append((reply.status, reply.headers.get(PROXY_ACTION_HEADER), reply.json()["step"]))
                await asyncio.sleep(0)
        return seen

    # Two fenced workers at once, each processing its own message: each sees the whole sequence.
    one, two = await asyncio.gather(poll("worker-1", "m-a"), poll("worker-2", "m-b"))
    expected = [(200, "mimic", 1), (200, "mimic", 2), (200, "mimic", 3)]
    assert one == expected and two == expected
    # A request nobody recorded: 503 unmatched.
    async with WorkerClient(proxy, "worker-1") as client:
        reply = await client.call("POST", f"{backend.url}/never", json={"x": 1})
        assert reply.status == 503 and reply.headers.get(PROXY_ACTION_HEADER) == "unmatched"
        assert "no recording matched" in reply.json()["message"]
    assert backend.accepted == 0 and backend.seen == []  # mimicry never touches the backend
    records = await wait_records(proxy.wirelog_dir, lambda rs: sum(r["action"] == "mimic" for r in rs) == 6)
    for worker in ("worker-1", "worker-2"):
        mimicked = sorted(
            (r for r in records if r["action"] == "mimic" and r["worker"] == worker), key=lambda r: r["call"]
        )
        assert [r["replayed_from"] for r in mimicked] == recorded_ids
    # Unfenced: the real backend answers again.
    await set_fence(core, proxy, "worker-1", None)
    async with WorkerClient(proxy, "worker-1") as client:
        reply = await client.call("GET", f"{backend.url}/status?job=1")
        assert reply.status == 200 and PROXY_ACTION_HEADER not in reply.headers
    assert len(backend.seen) == 1


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
    core: QueueServer, stream_backends: list[StreamBackend], proxy_factory: Callable[..., ProxyProcess]
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
    core: QueueServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
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
    core: QueueServer, backends: Backends, proxy_factory: Callable[..., ProxyProcess]
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
