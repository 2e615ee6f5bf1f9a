"""The mimic addon (`fencing.addons.mimic`, `fencing.answering`, `fencing.mimic`): calls the fence marked
for mimicry are answered from recorded responses, or 503 `unmatched`; never forwarded.

- On its own, through real mitmproxy: an in-process `Master` with only mitmproxy's proxy-server addons,
  a stand-in for the addons before it (the worker, tags and request identity from test headers, the
  mimic verdict for the workers the test marks) and the mimic addon, with real HTTP and HTTPS backends
  that count accepted sockets. No fence addon: the verdict on the flow is the whole contract.
- With the fence addon before it (`guards`): the unit tests on mitmproxy's test flows, fed a wire log
  written by wirelog's writer.
- End to end: a real `strictq proxy` following a queue server's control stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import proxy_support
import pytest
from control_support import QueueServer, running_queue_server
from mitmproxy import http
from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.addons.tlsconfig import TlsConfig
from mitmproxy.master import Master
from mitmproxy.options import Options
from mitmproxy.test import taddons
from proxy_support import Backends, ProxyProcess, UpstreamCA, WorkerClient, make_tags, wait_records
from test_proxy_fence import BACKEND, call_flow, fenced, run_request, set_fence

from fencing.addons import ordered_addons
from fencing.addons.fence import Fence
from fencing.addons.mimic import Mimic
from fencing.answering import mark_mimic, mimic_verdict
from fencing.ca import ca_cert_path, confdir
from fencing.context import METADATA_KEY, PROXY_ACTION_HEADER, context_of, ensure_context
from fencing.control_client import ControlState, FenceInfo
from fencing.mimic import RecordingIndex, identity_from_url, recording_from_record
from fencing.runtime import ProxyRuntime
from wirelog.record import http_record, http_request, http_response
from wirelog.writer import WireLogWriter


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


def guards(state: ControlState | None = None) -> tuple[Fence, Mimic]:
    """The fence and the mimic addon right after it, on one control state, as `ordered_addons` has them."""
    state = state if state is not None else ControlState()
    return Fence(state), Mimic(state)


def test_the_mimic_addon_comes_right_after_the_fence() -> None:
    """The verdict is read by the next addon; a fenced call nobody answered would be forwarded."""
    kinds = [type(addon) for addon in ordered_addons(ProxyRuntime())]
    assert kinds[kinds.index(Fence) + 1] is Mimic


# ------------------------------------------------------------------------------------ the verdict only
async def test_the_mimic_addon_answers_only_calls_that_carry_the_verdict() -> None:
    mimic = Mimic(ControlState())  # no fence addon, no fence in the state: the flow's verdict decides
    mimic.index = index_of(recorded("r1", 1.0, 200, "recorded"))
    marked, unmarked = call_flow(), call_flow()
    mark_mimic(marked, FenceInfo("worker-1", "mimic", "test", 1.0, None))
    for flow in (marked, unmarked):
        await run_request([mimic], flow)
    assert answer_of(marked) == "recorded" and marked.metadata[METADATA_KEY].replayed_from == "r1"
    assert unmarked.response is None and unmarked.metadata[METADATA_KEY].action == "pass"
    assert (mimic.mimicked, mimic.unmatched) == (1, 0)


async def test_a_call_already_answered_is_left_alone() -> None:
    mimic = Mimic(ControlState())
    mimic.index = index_of(recorded("r1", 1.0, 200, "recorded"))
    flow = call_flow()
    mark_mimic(flow, FenceInfo("worker-1", "mimic", "test", 1.0, None))
    flow.response = http.Response.make(409, b"earlier guard")
    await run_request([mimic], flow)
    assert flow.response.content == b"earlier guard" and mimic.mimicked == 0


# -------------------------------------------------------------------------- with the fence before it
def mimic_guards(index: RecordingIndex, *workers: str) -> tuple[Fence, Mimic]:
    fence, mimic = guards()
    for worker in workers:
        fenced(fence.state, worker, "mimic")
    mimic.index = index
    return fence, mimic


async def test_mimic_replays_a_recorded_sequence_in_order_then_repeats_the_last() -> None:
    index = index_of(
        recorded("r2", 2.0, 200, "running"),
        recorded("r1", 1.0, 202, "queued"),  # out of order on disk: recording time decides
        recorded("r3", 3.0, 200, "done"),
        recorded("x", 4.0, 500, "other endpoint", url=f"{BACKEND}/other"),
        recorded("y", 5.0, 200, "not passed", action="mimic"),
    )
    addons = mimic_guards(index, "worker-1")
    seen = []
    for call in range(1, 6):
        flow = call_flow(call=call)
        await run_request(addons, flow)
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
    addons = mimic_guards(index, "worker-1")
    flows = [
        call_flow(message_id="m-7", call=2, **post),  # this message's own call 2
        call_flow(message_id="m-7", call=3, **post),  # and its call 3
        call_flow(message_id="m-8", call=2, **post),  # another message: by request identity
        call_flow(message_id="m-7", call=2, method="POST", url=f"{BACKEND}/charge", body=b'{"amount": 6}'),
    ]
    for flow in flows:
        await run_request(addons, flow)
    assert [f.metadata[METADATA_KEY].replayed_from for f in flows[:3]] == ["m7-c2", "m7-c3", "any-1"]
    # A different body is a different request: nothing matches.
    last = flows[3]
    assert last.response is not None and last.response.status_code == 503
    assert last.response.headers[PROXY_ACTION_HEADER] == "unmatched"
    assert "no recording matched" in orjson.loads(last.response.content or b"")["message"]
    assert last.metadata[METADATA_KEY].action == "unmatched"


async def test_two_mimicked_workers_each_get_the_whole_sequence() -> None:
    index = index_of(*(recorded(f"r{i}", float(i), 200, f"step {i}") for i in range(1, 5)))
    addons = mimic_guards(index, "worker-1", "worker-2")

    async def worker(name: str) -> list[str]:
        answers = []
        for call in range(1, 5):
            flow = call_flow(name, call=call)
            await run_request(addons, flow)
            answers.append(answer_of(flow))
            await asyncio.sleep(0)  # interleave the two workers
        return answers

    one, two = await asyncio.gather(worker("worker-1"), worker("worker-2"))
    assert one == two == ["step 1", "step 2", "step 3", "step 4"]


async def test_sequences_are_per_message_and_restart_on_a_new_fence() -> None:
    index = index_of(recorded("r1", 1.0, 200, "first"), recorded("r2", 2.0, 200, "second"))
    fence, mimic = addons = mimic_guards(index, "worker-1")
    answers = []
    for message_id in ("m-1", "m-2", "m-1"):
        flow = call_flow(message_id=message_id)
        await run_request(addons, flow)
        answers.append(answer_of(flow))
    assert answers == ["first", "first", "second"]
    fenced(fence.state, "worker-1", "mimic")  # fenced anew (another reason): sequences start over
    mimic.index = index
    flow = call_flow(message_id="m-1")
    await run_request(addons, flow)
    assert answer_of(flow) == "first"


async def test_mimic_loads_the_wire_log_lazily_and_rereads_on_a_miss(tmp_path: Path) -> None:
    directory = tmp_path / "wirelog"
    writer = WireLogWriter(directory, "proxy", fsync="never", compress=False)
    first = writer.write(without_id(recorded("r1", 1.0, 200, "from disk")))
    writer.flush()
    fence, mimic = addons = guards()
    state = fence.state
    with taddons.context(fence, mimic) as tctx:
        tctx.options.update(strictq_mimic_wirelog=str(directory), strictq_mimic_refresh=0.0)
        fenced(state, "worker-1", "mimic")  # starts loading in the background
        flow = call_flow()
        await run_request(addons, flow)
        assert answer_of(flow) == "from disk"
        assert flow.metadata[METADATA_KEY].replayed_from == first
        # Recorded after the first load: a miss re-reads the new part of the log.
        writer.write(without_id(recorded("r9", 9.0, 200, "later", url=f"{BACKEND}/later")))
        writer.flush()
        later = call_flow(url=f"{BACKEND}/later")
        await run_request(addons, later)
        assert answer_of(later) == "later"
        assert mimic.index is not None and len(mimic.index) == 2
        # Nobody left to mimic for: the index is dropped.
        state.remove_fence("worker-1")
        assert mimic.index is None
    writer.close()


async def test_replay_mode_mimics_every_worker_and_says_so_when_nothing_matches() -> None:
    fence, mimic = addons = guards()
    with taddons.context(fence, mimic) as tctx:
        tctx.options.update(strictq_replay=True)  # the mimic addon's option; the fence reads it
        assert fence.replay and mimic.replay
        mimic.index = index_of(recorded("r1", 1.0, 200, "recorded"))  # (a ReplayIndex in the proxy)
        flow, other = call_flow("worker-7"), call_flow("worker-7", url=f"{BACKEND}/never")
        for f in (flow, other):
            await run_request(addons, f)
        assert answer_of(flow) == "recorded"  # nobody is fenced: replay mode marks everyone
        assert other.response is not None and other.response.status_code == 503
        message = orjson.loads(other.response.content or b"")["message"]
        assert "is replay mode and no recording matched" in message


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


# ------------------------------------------------------------------- on its own, through real mitmproxy
upstream_ca, backends = proxy_support.upstream_ca, proxy_support.backends
proxy_keys, proxy_factory = proxy_support.proxy_keys, proxy_support.proxy_factory

WORKER, MESSAGE, CALL = "X-Test-Worker", "X-Test-Message", "X-Test-Call"


class StandIn:
    """What auth, tagging, redact and the fence leave on a flow before the mimic addon, from test
    headers: the worker, message id and call ordinal, the request identity, and the mimic verdict for
    the workers `marked` names (or everyone: replay)."""

    def __init__(self) -> None:
        self.marked: set[str] = set()
        self.everyone = False

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        call = ensure_context(flow)
        headers = flow.request.headers
        call.worker = headers.get(WORKER)
        call.message_id = headers.get(MESSAGE)
        call.call = int(headers[CALL]) if CALL in headers else None

    def request(self, flow: http.HTTPFlow) -> None:
        call = context_of(flow)
        assert call is not None
        body = flow.request.raw_content or b""
        call.request_identity = identity_from_url(
            flow.request.method, flow.request.url, hashlib.sha256(body).hexdigest()
        )
        if call.worker is not None and (self.everyone or call.worker in self.marked):
            mark_mimic(flow, FenceInfo(call.worker, "mimic", "test", 1.0, None))


class MitmProxy:
    """mitmproxy's own `Master` on a thread and event loop of its own (as the proxy never shares the
    loop of anything else), with Proxyserver, NextLayer, TlsConfig and the given addons."""

    def __init__(self, data_dir: Path, addons: Sequence[Any], options: dict[str, Any]) -> None:
        self.data_dir, self.addons, self.options = data_dir, addons, options
        self.url = ""
        self.ca = ca_cert_path(data_dir)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.master: Master | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mitmproxy", daemon=True)

    def start(self) -> MitmProxy:
        self._thread.start()
        assert self._ready.wait(30), "mitmproxy did not start"
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if self.master is not None:
            self.master.shutdown()
        self._thread.join(15)
        assert not self._thread.is_alive(), "mitmproxy did not stop"

    async def on_loop(self, action: Callable[[], object]) -> None:
        """Run `action` on the proxy's loop (where the control stream would change its state)."""
        assert self.loop is not None

        async def run() -> None:
            action()

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        opts = Options(confdir=str(confdir(self.data_dir)))
        master = self.master = Master(opts, with_termlog=False)
        master.addons.add(Proxyserver(), NextLayer(), TlsConfig(), *self.addons)
        opts.update(
            mode=["regular"], listen_host="127.0.0.1", listen_port=0,
            connection_strategy="lazy", upstream_cert=False, **self.options,
        )  # fmt: skip
        task = asyncio.create_task(master.run())
        proxyserver = master.addons.get("proxyserver")
        for _ in range(1500):  # until it listens (bounded: 30 s)
            if proxyserver.listen_addrs() or task.done():
                break
            await asyncio.sleep(0.02)
        addrs = proxyserver.listen_addrs()
        assert addrs, "mitmproxy is not listening"
        self.url = f"http://127.0.0.1:{addrs[0][1]}"
        self._ready.set()
        await task


Mitm = Callable[..., tuple[MitmProxy, StandIn, Mimic]]


@pytest.fixture
def mitm(tmp_path: Path, upstream_ca: UpstreamCA) -> Iterator[Mitm]:
    """Start in-process mitmproxies (a stand-in, then the mimic addon) with mimic options; all stopped."""
    started: list[MitmProxy] = []

    def start(**options: Any) -> tuple[MitmProxy, StandIn, Mimic]:
        stand_in, mimic = StandIn(), Mimic(ControlState())
        options.setdefault("ssl_verify_upstream_trusted_ca", str(upstream_ca.path))
        proxy = MitmProxy(tmp_path / f"mitm{len(started)}", [stand_in, mimic], options)
        started.append(proxy)
        return proxy.start(), stand_in, mimic

    yield start
    for proxy in started:
        proxy.stop()


def call_headers(worker: str, message_id: str | None = None, call: int | None = None) -> dict[str, str]:
    headers = {WORKER: worker}
    if message_id is not None:
        headers[MESSAGE] = message_id
    if call is not None:
        headers[CALL] = str(call)
    return headers


async def test_through_mitmproxy_marked_calls_are_answered_from_the_wire_log_and_never_dialled(
    tmp_path: Path, backends: Backends, mitm: Mitm
) -> None:
    directory = tmp_path / "recordings"
    writer = WireLogWriter(directory, "proxy", fsync="never", compress=False)
    for backend in backends.all():
        for step, status in ((1, 202), (2, 200)):
            url = f"{backend.url}/status?job=1"
            writer.write(without_id(recorded(f"r{step}", float(step), status, f"step {step}", url=url)))
    writer.close()
    proxy, stand_in, mimic = mitm(strictq_mimic_wirelog=str(directory))
    stand_in.marked.add("worker-1")
    marked = call_headers("worker-1")
    async with WorkerClient(proxy.url, None, proxy_ca=proxy.ca) as worker:
        for backend in backends.all():  # plain HTTP and intercepted HTTPS alike
            seen = []
            for _ in range(3):
                reply = await worker.call("GET", f"{backend.url}/status?job=1", headers=marked)
                assert reply.headers.get(PROXY_ACTION_HEADER) == "mimic"
                assert int(reply.headers["Content-Length"]) == len(reply.body)  # not the recorded 99
                seen.append((reply.status, reply.json()["answer"]))
            assert seen == [(202, "step 1"), (200, "step 2"), (200, "step 2")]
            missing = await worker.call("POST", f"{backend.url}/never", headers=marked)
            assert missing.status == 503 and missing.headers.get(PROXY_ACTION_HEADER) == "unmatched"
            body = missing.json()
            assert body["code"] == "unmatched"
            assert "worker worker-1 is fenced (mimic) and no recording matched POST" in body["message"]
    assert (backends.http.accepted, backends.https.accepted) == (0, 0)  # not one socket reached a backend
    assert (mimic.mimicked, mimic.unmatched) == (6, 2)
    # A call without the verdict is none of the mimic's business: the backend answers it.
    async with WorkerClient(proxy.url, None, proxy_ca=proxy.ca) as other:
        for backend in backends.all():
            reply = await other.call("GET", f"{backend.url}/status?job=1", headers=call_headers("worker-2"))
            assert reply.status == 200 and PROXY_ACTION_HEADER not in reply.headers
            assert reply.json()["path"] == "/status"
            assert [s.path for s in backend.seen] == ["/status"]


async def test_through_mitmproxy_a_miss_rereads_the_log_and_the_index_goes_with_the_last_fence(
    tmp_path: Path, backends: Backends, mitm: Mitm
) -> None:
    directory = tmp_path / "recordings"
    writer = WireLogWriter(directory, "proxy", fsync="never", compress=False)
    url = f"{backends.http.url}/status?job=1"
    writer.write(without_id(recorded("r1", 1.0, 200, "first", url=url)))
    writer.flush()
    proxy, stand_in, mimic = mitm(strictq_mimic_wirelog=str(directory), strictq_mimic_refresh=0.0)
    stand_in.marked.add("worker-1")
    state = mimic.state
    await proxy.on_loop(lambda: state.set_fence(FenceInfo("worker-1", "mimic", "test", 1.0, None)))
    async with WorkerClient(proxy.url, None, proxy_ca=proxy.ca) as worker:
        reply = await worker.call("GET", url, headers=call_headers("worker-1"))
        assert reply.json()["answer"] == "first"
        later = f"{backends.http.url}/later"
        writer.write(without_id(recorded("r2", 2.0, 201, "recorded later", url=later)))
        writer.flush()
        reply = await worker.call("GET", later, headers=call_headers("worker-1"))
        assert (reply.status, reply.json()["answer"]) == (201, "recorded later")
    writer.close()
    assert mimic.index is not None and len(mimic.index) == 2
    await proxy.on_loop(lambda: state.remove_fence("worker-1"))
    assert mimic.index is None  # nobody mimic-fenced any more: the memory is freed
    assert backends.http.accepted == 0


async def test_through_mitmproxy_replay_mode_answers_from_the_recording_by_message_and_endpoint(
    tmp_path: Path, backends: Backends, mitm: Mitm
) -> None:
    directory = tmp_path / "recording"
    writer = WireLogWriter(directory, "proxy", fsync="never", compress=False)
    charge = f"{backends.https.url}/charge"
    first = recorded("c", 1.0, 201, "charged m-7", method="POST", url=charge, body=b'{"amount": 5}',
                     message_id="m-7", call=2)  # fmt: skip
    writer.write(without_id(first))
    writer.close()
    proxy, stand_in, _ = mitm(strictq_mimic_wirelog=str(directory), strictq_replay=True)
    stand_in.everyone = True  # as the fence does in replay mode
    async with WorkerClient(proxy.url, None, proxy_ca=proxy.ca) as candidate:
        # The same message's call 2 with another body: replay still answers what the recording had
        # (matching rule 3; a mimic fence would answer 503 unmatched).
        reply = await candidate.call(
            "POST", charge, data=b'{"amount": 6}', headers=call_headers("candidate", "m-7", 2)
        )
        assert (reply.status, reply.json()["answer"]) == (201, "charged m-7")
        missing = await candidate.call("GET", f"{backends.https.url}/x", headers=call_headers("candidate"))
        assert missing.status == 503
        assert "is replay mode and no recording matched" in missing.json()["message"]
    assert backends.https.accepted == 0


# ------------------------------------------------------------------------------------- end to end
@pytest.fixture
def core(tmp_path: Path, proxy_keys: Path) -> Iterator[QueueServer]:
    with running_queue_server(tmp_path / "core", proxy_keys) as server:
        yield server


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


def test_verdict_helpers_round_trip() -> None:
    flow = call_flow()
    assert mimic_verdict(flow) is None
    fence = FenceInfo("worker-1", "mimic", "test", 1.0, None)
    mark_mimic(flow, fence)
    assert mimic_verdict(flow) is fence
    mark_mimic(flow, None)
    assert mimic_verdict(flow) is None
