"""Pipelining (docs/pipelining.md): processing-time estimates in the core (given per queue or per message,
learned by a least-squares fit against message size, with a fake clock), carried only to pollers that
declare `estimates`; the SDK's pipeline (strictq.sdk.pipeline) against the real in-process gateway over
TLS: the scheduling arithmetic, an overlap that is proven (not timed), hand-back on stop, a pre-processing
failure reported as the attempt's, and a hypothesis run over random group mixes and random times in which
every group's messages are processed in send order, exactly once, never two of a group at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from gateway_support import Emo, Gateway, serve_gateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kit import T0, FakeClock, until
from serve_support import start_serve
from support import make_core
from test_rate_limits import run_cli
from test_sdk import config, running, send, size

from protocol.estimates import Estimate
from queue_core import wire
from queue_core.machine import Delivery, InvalidArgument, QueueAttributes, SendRequest
from queue_core.machine.capabilities import parse_list
from queue_core.machine.estimates import MAX_SIZES, encode_extra, parse_header
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.records import Received
from strictq.sdk import Entry, Message, Producer, Worker
from strictq.sdk.pipeline import start_at

T = TypeVar("T")
TEST_TIMEOUT = 20.0


# ------------------------------------------------------------------------------- the schedule's arithmetic
def test_start_at_is_the_slots_free_time_minus_the_preprocessing() -> None:
    # The patent's example: processing the current message takes 2.0 s, pre-processing the next 0.3 s.
    assert start_at(100.0, [102.0], 0, [], 0.3) == pytest.approx(101.7)
    assert start_at(100.0, [], 1, [], 0.3) == 100.0  # a slot is free: at once
    assert start_at(100.0, [100.5], 0, [], 2.0) == 100.0  # never before now
    assert start_at(100.0, [99.0], 0, [], 0.3) == 100.0  # an overdue handler: any moment now
    # Two slots, busy until 101 and 103; one message waits ahead (1.5 s of processing): it takes the slot
    # freeing at 101 (busy to 102.5), so the next slot is that one, at 102.5.
    assert start_at(100.0, [103.0, 101.0], 0, [1.5], 0.5) == pytest.approx(102.0)
    assert start_at(100.0, [103.0, 101.0], 0, [1.5, 4.0], 0.5) == pytest.approx(102.5)
    assert start_at(100.0, [], 0, [], 1.0) == 100.0  # no slot at all (a degenerate call): at once


# --------------------------------------------------------------------------------- estimates in the core
def deliver_and_report(core: Any, clock: FakeClock, sizes_ms: list[tuple[int, float]]) -> None:
    """Send one message per (size, duration ms), deliver it to a reporting worker, report it succeeded."""
    for index, (body_size, duration) in enumerate(sizes_ms):
        clock.advance(1)
        core.send("q", [SendRequest(b"x" * body_size, group=f"g{index}")], clock.now)
        (delivery,) = core.receive("q", 1, 30, "w1", clock.now)
        core.estimates_for("q", [(delivery.message_id, body_size, b"")], clock.now)
        result = AttemptResult(
            delivery.message_id, delivery.token, "succeeded", duration_ms=duration, preprocess_ms=duration / 2
        )
        assert [o.status for o in core.report("q", "w1", [result], clock.now)] == ["ok"]


def test_the_core_learns_duration_against_size_by_least_squares() -> None:
    clock = FakeClock(T0)
    core = make_core()
    (nothing,) = core.estimates_for("q", [("m", 100, b"")], clock.now, record=False)
    assert nothing == Estimate()  # nothing given, nothing learned: the delivery carries no estimate
    # 10 ms + 1 ms per KiB, exactly: the fit finds the line.
    deliver_and_report(core, clock, [(kib * 1024, 10 + kib) for kib in (1, 4, 2, 8, 16, 3)])
    (learned,) = core.estimates_for("q", [("m", 32 * 1024, b"")], clock.now, record=False)
    assert learned.processing == pytest.approx(0.042, abs=1e-6)
    assert learned.preprocessing == pytest.approx(0.021, abs=1e-6)
    described = core.queue("q").estimates.describe()["processing"]
    assert described["per_kib_s"] == pytest.approx(0.001) and described["intercept_s"] == pytest.approx(0.01)
    # Only successful, taken results teach it; each size is used once (then forgotten: bounded memory).
    assert core.queue("q").estimates.sizes == {}


def test_given_estimates_win_over_learned_ones_message_first() -> None:
    clock = FakeClock(T0)
    core = make_core(attributes={"processing_estimate": 0.5})
    deliver_and_report(core, clock, [(100, 20.0)] * 4)
    (queue_level,) = core.estimates_for("q", [("m", 100, b"")], clock.now, record=False)
    assert queue_level == Estimate(0.5, 0.01)  # the attribute, and the learned pre-processing
    own = encode_extra(parse_header("preprocessing=0.25"))
    (message_level,) = core.estimates_for("q", [("m", 100, own)], clock.now, record=False)
    assert message_level == Estimate(0.5, 0.25)
    both = encode_extra(parse_header("processing=2, preprocessing=0.125"))
    assert core.estimates_for("q", [("m", 100, both)], clock.now, record=False) == [Estimate(2.0, 0.125)]


def test_delivered_sizes_are_bounded_and_failures_teach_nothing() -> None:
    clock = FakeClock(T0)
    core = make_core()
    learned = core.queue("q").estimates
    for index in range(MAX_SIZES + 5):
        learned.delivered(f"m{index}", index)
    assert len(learned.sizes) == MAX_SIZES and "m0" not in learned.sizes
    core.send("q", [SendRequest(b"abc", group="g")], clock.now)
    (delivery,) = core.receive("q", 1, 30, "w1", clock.now)
    core.estimates_for("q", [(delivery.message_id, 3, b"")], clock.now)
    failed = AttemptResult(delivery.message_id, delivery.token, "failed", duration_ms=5.0)
    core.report("q", "w1", [failed], clock.now)
    assert learned.processing.n == 0 and delivery.message_id not in learned.sizes


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"processing_estimate": -1}, "processing_estimate"),
        ({"preprocessing_estimate": 50_000}, "preprocessing_estimate"),
        ({"processing_estimate": "fast"}, "processing_estimate"),
        ({"preprocessing_estimate": True}, "preprocessing_estimate"),
    ],
)
def test_bad_estimate_attributes_are_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        QueueAttributes().updated(changes)
    assert refused.value.details.get("field") == field, refused.value.details


@pytest.mark.parametrize(
    "header",
    [
        "processing",
        "speed=1",
        "processing=-1",
        "processing=nan",
        "processing=1, processing=2",
        "processing=1e9",
    ],
)
def test_bad_estimate_headers_are_refused_naming_the_header(header: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_header(header)
    assert refused.value.details.get("field") == "X-Strictq-Estimate"


# ---------------------------------------------------------------------- the gateway: opt-in, admin route
async def poll(worker: Emo, queue: str, capabilities: str | None) -> list[dict[str, Any]]:
    headers = {} if capabilities is None else {"X-Strictq-Capabilities": capabilities}
    params = {"limit": "10", "ttl": "0.05"}
    async with worker.session.get(
        f"{worker.url}/queue/1/{queue}/poll", params=params, headers=headers
    ) as got:
        assert got.status == 200
        items: list[dict[str, Any]] = await got.json()
        return items


async def test_estimates_go_only_to_pollers_that_declare_them(tmp_path: Path) -> None:
    async with serve_gateway(tmp_path) as gw:
        admin, worker, producer_http = Emo(gw, "admin-1"), Emo(gw, "worker-1"), Emo(gw, "producer-1")
        try:
            async with Producer(config(gw, "producer-1")) as producer:
                sent = await producer.send_batch(
                    [
                        Entry("est", {"n": 1}, "a"),
                        Entry("est", {"n": 2}, "b", Estimate(processing=2.5, preprocessing=0.5)),
                    ]
                )
                assert [r.status for r in sent] == ["sent", "sent"]
            status, _, body = await admin.call(
                "PUT", "/admin/v1/queues/est/estimates", {"processing_estimate": 0.75}
            )
            assert status == 200 and body == {
                "queue": "est",
                "processing_estimate": 0.75,
                "preprocessing_estimate": 0.0,
            }
            plain = await poll(worker, "est", None)
            assert len(plain) == 2 and all("estimate" not in item for item in plain)  # EmoDB's shape
            await asyncio.sleep(0.1)  # the 0.05 s claims lapse
            others = await poll(worker, "est", "results, probes, request_ids")
            assert len(others) == 2 and all("estimate" not in item for item in others)
            await asyncio.sleep(0.1)
            opted = {item["group"]: item for item in await poll(worker, "est", "estimates")}
            assert opted["a"]["estimate"] == {"processing": 0.75}  # the queue's; nothing learned yet
            assert opted["b"]["estimate"] == {"processing": 2.5, "preprocessing": 0.5}  # its producer's
            status, _, body = await admin.call(
                "PUT", "/admin/v1/queues/est/estimates", {"preprocessing_estimate": -2}
            )
            assert status == 400 and body["error"]["details"]["field"] == "preprocessing_estimate", body
            status, _, body = await admin.call("PUT", "/admin/v1/queues/est/estimates", {"ttl": 5})
            assert status == 400 and "processing_estimate" in body["error"]["message"]
            assert (await worker.call("GET", "/admin/v1/queues/est/estimates"))[0] == 403
            bad = {"X-Strictq-Estimate": "fast", "Content-Type": "application/json"}
            url = f"{gw.url}/queue/1/est/send"
            async with producer_http.session.post(url, data=b'{"n": 3}', headers=bad) as answer:
                refused = await answer.json()
                assert answer.status == 400 and refused["error"]["details"]["field"] == "X-Strictq-Estimate"
            assert await size(gw, "est") == 2  # nothing of the refused send was stored
        finally:
            for client in (admin, worker, producer_http):
                await client.close()


def test_the_estimate_crosses_the_internal_api() -> None:
    """A remote queue server's deliveries (queue_core.wire) carry the estimate, and the capability."""
    delivery = Delivery(0x1F, "000000000000001f", "g", 1, 7, "7.000000000000001f", 1, T0, T0, T0 + 30)
    item = Received(delivery, b"{}", "application/json", b"", estimate=Estimate(0.25, 0.125))
    assert wire.decode_received(orjson.loads(orjson.dumps(wire.encode_received(item)))) == item
    plain = Received(delivery, b"{}", "application/json", b"")
    assert "estimate" not in wire.encode_received(plain)
    assert parse_list(["results", "estimates"]).estimates and not parse_list(["results"]).estimates


def test_estimates_cli_against_a_real_serve(tmp_path: Path) -> None:
    serve = start_serve(tmp_path / "serve")
    try:
        env = {"STRICTQ_URL": serve.url, "STRICTQ_ADMIN_KEY": serve.secret("admin")}
        assert serve.call("POST", "/queue/1/orders/send", serve.secret("producer"), {"i": 1})[0] == 200
        done = run_cli("estimates", "orders", env=env)
        assert (done.returncode, done.stdout) == (0, "orders: processing learned, pre-processing learned\n")
        done = run_cli("estimates", "orders", "--processing", "0.03", "--preprocessing", "0.02", env=env)
        assert (done.returncode, done.stdout) == (0, "orders: processing 0.03 s, pre-processing 0.02 s\n")
        done = run_cli("estimates", "orders", "--processing", "-1", env=env)
        assert done.returncode == 2 and "--processing -1: give seconds, 0 or more" in done.stderr
        done = run_cli("estimates", "orders", "--preprocessing", "50000", env=env)
        assert done.returncode == 1 and "400 invalid_argument" in done.stderr, done.stderr
        assert "preprocessing_estimate must be between 0 and 43200" in done.stderr
        done = run_cli("estimates", "nosuch", "--json", env=env)
        assert done.returncode == 1 and "404 queue_not_found" in done.stderr, done.stderr
        done = run_cli("estimates", "--help", env=env)
        assert done.returncode == 0 and "minus the next one's pre-processing estimate" in done.stdout
    finally:
        serve.stop()


# ------------------------------------------------------------------------------- the SDK's pipeline, e2e
async def test_the_next_group_is_preprocessed_while_the_current_one_is_processed(gateway: Gateway) -> None:
    """One processing slot. A's handler waits (bounded) for B's pre-processing to begin: it can only begin
    during A's processing if the worker claimed B ahead, so A seeing it proves the overlap. The queue's
    estimates (1.0 s processing, 0.9 s pre-processing) schedule B's pre-processing 0.1 s into A's."""
    await gateway.service.create_queue("t1.pipe", {"processing_estimate": 1.0, "preprocessing_estimate": 0.9})
    await send(gateway, "pipe", [{"n": "a"}], "A")
    await send(gateway, "pipe", [{"n": "b"}], "B")
    loop = asyncio.get_running_loop()
    b_preprocessing = asyncio.Event()
    marks: dict[str, float] = {}
    overlapped: list[bool] = []

    async def prepare(msg: Message) -> str:
        marks[f"pre-{msg.group}"] = loop.time()
        if msg.group == "B":
            b_preprocessing.set()
        return f"prepared {msg.payload['n']}"

    async def handle(msg: Message) -> None:
        assert msg.prepared == f"prepared {msg.payload['n']}"
        marks[f"run-{msg.group}"] = loop.time()
        if msg.group == "A":
            try:
                await asyncio.wait_for(b_preprocessing.wait(), 5.0)
                overlapped.append(True)
            except TimeoutError:
                overlapped.append(False)

    worker = Worker("pipe", handle, config=config(gateway), concurrency=1, preprocess=prepare, ttl=5)
    async with asyncio.timeout(TEST_TIMEOUT), running(worker):
        await until(lambda: worker.stats.acked == 2, what="both messages processed")
    assert overlapped == [True], marks
    assert marks["run-A"] < marks["pre-B"] < marks["run-B"]
    assert marks["pre-B"] - marks["run-A"] >= 0.09  # the schedule: 1.0 - 0.9 s into A's processing
    assert worker.capabilities[-1] == "estimates"
    assert worker._pipeline is not None and worker._pipeline.stats.prefetched >= 1


async def test_a_stop_hands_back_what_was_claimed_ahead_and_a_failed_preprocess_is_the_attempt(
    gateway: Gateway,
) -> None:
    await send(gateway, "stop", [{"n": "a"}], "A")
    await send(gateway, "stop", [{"n": "b"}], "B")
    await send(gateway, "stop", [{"n": "c"}], "C")
    b_prepared = asyncio.Event()
    handled: list[str] = []

    async def prepare(msg: Message) -> None:
        if msg.group == "B":
            b_prepared.set()
        if msg.group == "C":
            raise RuntimeError("inputs missing")

    async def handle(msg: Message) -> None:
        handled.append(msg.group)
        if msg.group == "A":  # B is claimed ahead and pre-processed meanwhile; then the worker stops
            await asyncio.wait_for(b_prepared.wait(), 5.0)
            first.stop(5.0)

    first = Worker("stop", handle, config=config(gateway), concurrency=1, preprocess=prepare, ttl=5)
    async with asyncio.timeout(TEST_TIMEOUT), running(first) as tasks:
        await asyncio.wait(tasks)  # it stops by itself
    # B was claimed ahead and pre-processed, never processed: handed back untouched at the stop.
    assert handled == ["A"] and first.stats.acked == 1 and first.stats.released >= 1
    assert first._pipeline is not None and first._pipeline.stats.released >= 1
    seen: dict[str, Message] = {}

    async def record(msg: Message) -> None:
        seen[msg.group] = msg

    second = Worker("stop", record, config=config(gateway, "worker-2"), preprocess=prepare, ttl=5)
    async with asyncio.timeout(TEST_TIMEOUT), running(second):
        await until(lambda: "B" in seen and second.stats.failed >= 1, what="B processed and C failed")
    assert seen["B"].history.attempts == 0  # the hand-back was no attempt
    # C's pre-processing raised: reported failed like a handler failure, its handler never ran.
    assert "C" not in seen and second.stats.failed >= 1
    log = await gateway.service.group_log("t1.stop", "C")
    assert log and log[0]["outcome"] == "failed" and "inputs missing" in log[0]["reason"], log


# --------------------------------------------------------------------- hypothesis: order, once, overlap
class LoopThread:
    """One event loop in a thread for the whole hypothesis run (one gateway for every example)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopThread, Gateway]]:
    runner = LoopThread()
    started: asyncio.Event | None = None
    context = serve_gateway(tmp_path_factory.mktemp("pipeline"))
    gw = runner.run(context.__aenter__())
    try:
        yield runner, gw
    finally:
        runner.run(context.__aexit__(None, None, None))
        runner.close()
    del started


OVERLAP: list[float] = []  # seconds of pre-processing overlapping another group's processing, per example
EXAMPLES = iter(range(1_000_000))

mixes = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 12), st.integers(0, 12)),  # (group, process ms, prep ms)
    min_size=1,
    max_size=14,
)


@pytest.mark.xdist_group("pipeline-hypothesis")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mix=mixes, concurrency=st.integers(1, 2), prefetch=st.integers(1, 2))
def test_pipelining_keeps_every_groups_order_and_processes_each_message_once(
    shared_gateway: tuple[LoopThread, Gateway],
    mix: list[tuple[int, int, int]],
    concurrency: int,
    prefetch: int,
) -> None:
    runner, gw = shared_gateway
    queue = f"mix{next(EXAMPLES)}"
    OVERLAP.append(runner.run(_run_mix(gw, queue, mix, concurrency, prefetch)))


async def _run_mix(
    gw: Gateway, queue: str, mix: list[tuple[int, int, int]], concurrency: int, prefetch: int
) -> float:
    loop = asyncio.get_running_loop()
    async with Producer(config(gw, "producer-1")) as producer:
        entries = [Entry(queue, {"i": i, "p": p, "q": q}, f"g{g}") for i, (g, p, q) in enumerate(mix)]
        assert all(r.ok for r in await producer.send_batch(entries))
    processed: list[tuple[str, int]] = []
    running_groups: set[str] = set()
    prep: list[tuple[str, float, float]] = []
    proc: list[tuple[str, float, float]] = []
    violations: list[str] = []

    async def prepare(msg: Message) -> int:
        started = loop.time()
        await asyncio.sleep(msg.payload["q"] / 1000)
        prep.append((msg.group, started, loop.time()))
        return int(msg.payload["i"])

    async def handle(msg: Message) -> None:
        if msg.group in running_groups:
            violations.append(f"{msg.group} ran twice at once")
        running_groups.add(msg.group)
        started = loop.time()
        try:
            assert msg.prepared == msg.payload["i"]
            await asyncio.sleep(msg.payload["p"] / 1000)
        finally:
            running_groups.discard(msg.group)
        proc.append((msg.group, started, loop.time()))
        processed.append((msg.group, msg.prepared))

    worker = Worker(
        queue,
        handle,
        config=config(gw),
        concurrency=concurrency,
        prefetch=prefetch,
        preprocess=prepare,
        ttl=5,
    )
    async with asyncio.timeout(TEST_TIMEOUT), running(worker):
        await until(lambda: len(processed) >= len(mix), what="every message processed")
        await until(lambda: worker.stats.acked >= len(mix), what="every message acked")
    assert not violations, violations
    assert sorted(i for _, i in processed) == list(range(len(mix)))  # each exactly once
    for group in {f"g{g}" for g, _, _ in mix}:
        sent = [i for i, (g, _, _) in enumerate(mix) if f"g{g}" == group]
        assert [i for g, i in processed if g == group] == sent, (group, processed)  # in send order
    assert await size(gw, queue) == 0
    return sum(
        max(0.0, min(p_end, r_end) - max(p_start, r_start))
        for p_group, p_start, p_end in prep
        for r_group, r_start, r_end in proc
        if p_group != r_group
    )


@pytest.mark.xdist_group("pipeline-hypothesis")
def test_the_hypothesis_run_overlapped(shared_gateway: tuple[LoopThread, Gateway]) -> None:
    """Across the examples above, pre-processing of one group really overlapped the processing of another:
    the pipeline does not merely run. (Run alone, this test makes its own examples: several groups, 15 ms
    of processing and pre-processing each.)"""
    runner, gw = shared_gateway
    while len(OVERLAP) < 5:
        mix = [(index % 3, 15, 15) for index in range(6)]
        OVERLAP.append(runner.run(_run_mix(gw, f"mix{next(EXAMPLES)}", mix, 1, 1)))
    assert sum(1 for seconds in OVERLAP if seconds > 0) >= 3, OVERLAP
