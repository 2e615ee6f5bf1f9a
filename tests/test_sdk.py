"""The worker SDK against the real in-process gateway (TLS with a trustme CA) and real aiohttp servers on
127.0.0.1 standing in for backends and for the egress proxy."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gateway_support import Gateway
from kit import until

from strictq.sdk import (
    TAG_HEADERS,
    CallFenced,
    ClientConfig,
    ConfigError,
    EmoClient,
    Entry,
    Message,
    Producer,
    Worker,
)

TEST_TIMEOUT = 20.0


# ------------------------------------------------------------------------------------------ helpers
def config(gw: Gateway, key_id: str = "worker-1", *, proxy_url: str | None = None) -> ClientConfig:
    secret = gw.credential(key_id).secret
    return ClientConfig(
        url=gw.url,
        ca_file=str(gw.ca_file),
        api_key=secret,
        worker_id=key_id,
        worker_secret=secret,
        proxy_url=proxy_url,
    )


@asynccontextmanager
async def running(*workers: Worker) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Run workers for a block; stop them (grace 1 s) and wait for them at the end."""
    tasks = [asyncio.create_task(w.run(), name=f"test-worker-{i}") for i, w in enumerate(workers)]
    try:
        yield tasks
    finally:
        for w in workers:
            w.stop(1.0)
        async with asyncio.timeout(10):
            await asyncio.gather(*tasks)


@asynccontextmanager
async def serve(handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """A low-level aiohttp server on 127.0.0.1 (every request, any path or absolute-form target)."""
    runner = web.ServerRunner(web.Server(handler, access_log=None))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def send(gw: Gateway, queue: str, payloads: list[Any], group: str | None) -> None:
    async with EmoClient(config(gw, "producer-1"), gw.credential("producer-1").secret) as client:
        await client.send_batch({queue: payloads}, group=group)


async def size(gw: Gateway, queue: str) -> int:
    async with EmoClient(config(gw, "admin-1"), gw.credential("admin-1").secret) as client:
        return int(await client._call("GET", f"/{queue}/size"))


# ------------------------------------------------------------------------------------------- config
def test_config_from_environment() -> None:
    env = {
        "STRICTQ_URL": "https://127.0.0.1:8443/",
        "STRICTQ_CA_FILE": "/tmp/ca.pem",
        "STRICTQ_API_KEY": "",
        "STRICTQ_WORKER_ID": "worker-1",
        "STRICTQ_WORKER_SECRET": "s3cret-s3cret-s3cret",
        "STRICTQ_PROXY_URL": "http://127.0.0.1:8080",
        "STRICTQ_PROXY_CA_FILE": "/tmp/proxy-ca.pem",
    }
    cfg = ClientConfig.from_env(env)
    assert cfg.url == "https://127.0.0.1:8443"
    assert (cfg.ca_file, cfg.worker_id, cfg.proxy_url) == ("/tmp/ca.pem", "worker-1", "http://127.0.0.1:8080")
    assert cfg.api_key is None  # empty counts as unset
    assert cfg.worker_key() == "s3cret-s3cret-s3cret"
    assert "s3cret" not in repr(cfg)
    with pytest.raises(ConfigError, match="STRICTQ_API_KEY"):
        cfg.producer_key()
    with pytest.raises(ConfigError, match="STRICTQ_URL"):
        ClientConfig.from_env({})
    # A worker's missing settings are raised by run() (strictq.sdk.run: one line, exit 2), not by Worker()
    worker = Worker("q", handle_nothing, config=ClientConfig.from_env({"STRICTQ_URL": "http://x"}))
    with pytest.raises(ConfigError, match="STRICTQ_WORKER_SECRET"):
        asyncio.run(worker.run())


async def handle_nothing(message: Message) -> None:
    return None


# ------------------------------------------------------------------------------------------ workers
async def test_slow_handler_outlives_the_ttl_by_heartbeating(gateway: Gateway) -> None:
    """ttl 1.5 s, handler 3.5 s: heartbeats keep the claim; processed exactly once; the other worker never
    sees it. (Not sub-second: the gateway shares the test's event loop, and on a loaded CI machine a
    renew round trip can take a good part of a second.)"""
    seen: list[tuple[str, str, int]] = []

    async def slow(msg: Message) -> None:
        seen.append(("w1", msg.id, msg.attempt))
        await asyncio.sleep(3.5)

    async def other(msg: Message) -> None:
        seen.append(("w2", msg.id, msg.attempt))

    await send(gateway, "slow", [{"n": 1}], "g")
    w1 = Worker("slow", slow, config=config(gateway, "worker-1"), ttl=1.5)
    w2 = Worker("slow", other, config=config(gateway, "worker-2"), ttl=1.5)
    async with asyncio.timeout(TEST_TIMEOUT), running(w1):
        await until(lambda: bool(seen), what="the slow handler to start")
        async with running(w2):
            await until(lambda: w1.stats.acked == 1, what="the ack")
            polls = w2.stats.polls
            await until(lambda: w2.stats.polls >= polls + 2, what="w2 to poll again")
    assert [s[0] for s in seen] == ["w1"], seen
    assert w1.stats.heartbeats >= 2 and w1.stats.lost == 0 and w2.stats.received == 0
    assert await size(gateway, "slow") == 0


async def test_a_claim_whose_poll_answered_late_is_still_renewed(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded gateway answers the poll 2.2 s of a 3 s ttl late: the heartbeat must try a renew in the
    time left (0.65 s before its safety margin) rather than give the claim up unrenewed (a regression: it
    slept a whole heartbeat interval, 1 s, past that deadline)."""
    real_poll = EmoClient.poll

    async def late_poll(self: EmoClient, *args: Any, **kwargs: Any) -> Any:
        answer = await real_poll(self, *args, **kwargs)
        if answer:
            await asyncio.sleep(2.2)
        return answer

    monkeypatch.setattr(EmoClient, "poll", late_poll)
    done: list[str] = []

    async def slow(msg: Message) -> None:
        await asyncio.sleep(1.0)
        done.append(msg.id)

    await send(gateway, "late", [{"n": 1}], "g")
    w1 = Worker("late", slow, config=config(gateway, "worker-1"), ttl=3.0)
    async with asyncio.timeout(TEST_TIMEOUT), running(w1):
        await until(lambda: w1.stats.acked == 1 or w1.stats.lost > 0, what="the ack or a loss")
    assert w1.stats.lost == 0 and w1.stats.heartbeats >= 1 and len(done) == 1
    assert await size(gateway, "late") == 0


async def test_failed_message_is_released_and_redelivered_in_group_order(gateway: Gateway) -> None:
    order: list[str] = []
    failed_once: set[int] = set()

    async def handler(msg: Message) -> None:
        n = msg.payload["n"]
        if n == 2 and n not in failed_once:
            failed_once.add(n)
            order.append(f"m{n}(fail)")
            raise RuntimeError("first attempt of m2 fails")
        order.append(f"m{n}")

    await send(gateway, "crashy", [{"n": 1}, {"n": 2}, {"n": 3}], "g")
    worker = Worker("crashy", handler, config=config(gateway), ttl=30.0)
    async with asyncio.timeout(TEST_TIMEOUT), running(worker):
        await until(lambda: worker.stats.acked == 3, what="three acks")
    assert order == ["m1", "m2(fail)", "m2", "m3"]
    assert worker.stats.failed == 1 and worker.stats.released == 2  # m2 and m3, untouched m3 included
    assert any("handler raised RuntimeError" in r for r in worker.stats.reasons)
    assert await size(gateway, "crashy") == 0


async def test_a_poison_message_backs_off_instead_of_spinning(gateway: Gateway) -> None:
    attempts: list[float] = []

    async def handler(msg: Message) -> None:
        attempts.append(time.monotonic())
        raise RuntimeError("always fails")

    await send(gateway, "poison", [{"n": 1}], "g")
    # The worker reports each failure; the core's retry policy spaces the retries (default 1 s doubling):
    # 0.1 s doubling to 0.4 s here (the worker's retry_backoff is the same for a gateway without results).
    await gateway.service.set_attributes("t1.poison", {"retry_backoff": 0.1, "retry_backoff_max": 0.4})
    worker = Worker("poison", handler, config=config(gateway), ttl=30.0, retry_backoff=(0.1, 0.4))
    async with asyncio.timeout(TEST_TIMEOUT), running(worker):
        await until(lambda: len(attempts) >= 4, what="four attempts")
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    # Retried after 0.1, 0.2, then 0.4 s (capped): spaced out, never a hot loop.
    assert all(gap >= expected * 0.9 for gap, expected in zip(gaps, (0.1, 0.2, 0.4), strict=False)), gaps
    assert worker.stats.acked == 0 and worker.stats.failed == len(attempts)


async def test_two_workers_never_run_one_group_at_once(gateway: Gateway) -> None:
    groups, per_group = 4, 6
    intervals: dict[str, list[tuple[float, float, int, str]]] = {f"g{i}": [] for i in range(groups)}
    rng = random.Random(7)

    def handler_for(name: str) -> Callable[[Message], Awaitable[None]]:
        async def handler(msg: Message) -> None:
            start = time.monotonic()
            await asyncio.sleep(rng.uniform(0.0, 0.03))
            intervals[msg.group].append((start, time.monotonic(), msg.payload["n"], name))

        return handler

    for g in intervals:
        await send(gateway, "shared", [{"n": n} for n in range(per_group)], g)
    workers = [
        Worker("shared", handler_for(key), config=config(gateway, key), limit=2, concurrency=3)
        for key in ("worker-1", "worker-2")
    ]
    async with asyncio.timeout(TEST_TIMEOUT), running(*workers):
        await until(lambda: sum(w.stats.acked for w in workers) == groups * per_group, what="all acks")
    for group, spans in intervals.items():
        assert [n for _, _, n, _ in spans] == list(range(per_group)), (group, spans)
        for (_, end, _, _), (start, _, _, _) in itertools.pairwise(spans):
            assert end <= start, f"two messages of {group} overlapped"
    assert {name for spans in intervals.values() for *_, name in spans} == {"worker-1", "worker-2"}


async def test_superseded_claim_cancels_the_handler(gateway: Gateway) -> None:
    """An admin unclaims everything and worker-2 claims the group with a newer token: worker-1's next
    heartbeat is refused (409), so its handler is cancelled, and nothing of it is acked or released."""
    events: list[str] = []

    async def stuck(msg: Message) -> None:
        events.append("w1 started")
        try:
            await asyncio.Event().wait()  # runs until cancelled
        except asyncio.CancelledError:
            events.append("w1 cancelled")
            raise

    async def holds_on(msg: Message) -> None:
        events.append("w2 started")  # keeps its claim until worker-1 has noticed it lost its own
        await until(lambda: "w1 cancelled" in events, within=5.0, what="worker-1's handler to stop")

    await send(gateway, "superseded", [{"n": 1}], "g")
    # worker-1 is busy (concurrency 1: no polls meanwhile) and heartbeats every 2 s; worker-2 polls
    # at least every 0.5 s, so it claims the released group before worker-1's heartbeat could renew it.
    w1 = Worker(
        "superseded",
        stuck,
        config=config(gateway, "worker-1"),
        ttl=4.0,
        heartbeat_fraction=0.5,
        concurrency=1,
    )
    w2 = Worker("superseded", holds_on, config=config(gateway, "worker-2"), ttl=30.0)
    async with asyncio.timeout(TEST_TIMEOUT), running(w1):
        await until(lambda: events == ["w1 started"], what="worker-1's handler")
        async with running(w2):
            async with EmoClient(config(gateway, "admin-1"), gateway.credential("admin-1").secret) as admin:
                await admin._call("POST", "/superseded/unclaimall")
            await until(lambda: w2.stats.acked == 1, what="worker-2 to finish")
    assert events == ["w1 started", "w2 started", "w1 cancelled"]
    assert (w1.stats.acked, w1.stats.released, w1.stats.lost, w1.stats.failed) == (0, 0, 1, 1)
    assert await size(gateway, "superseded") == 0


# ----------------------------------------------------------------------------------------- outbound
async def test_outbound_calls_carry_the_tags_and_count_calls(gateway: Gateway) -> None:
    received: list[dict[str, str]] = []

    async def backend(request: web.BaseRequest) -> web.Response:
        received.append(dict(request.headers))
        return web.json_response({"ok": True})

    handled: list[Message] = []
    async with serve(backend) as backend_url:

        async def handler(msg: Message) -> None:
            for _ in range(2):
                async with msg.http.post(backend_url + "/charge", json=msg.payload) as resp:
                    assert resp.status == 200
            async with worker.http.get(backend_url + "/status") as resp:  # the shared session, by context
                assert resp.status == 200
            handled.append(msg)

        await send(gateway, "tagged", [{"n": 1}], "cust-9")
        worker = Worker("tagged", handler, config=config(gateway))
        async with asyncio.timeout(TEST_TIMEOUT), running(worker):
            await until(lambda: worker.stats.acked == 1, what="the ack")
    [msg] = handled
    assert len(received) == 3
    for ordinal, headers in enumerate(received, start=1):
        assert all(name in headers for name in TAG_HEADERS), headers
        assert headers["X-Strictq-Queue"] == "tagged"
        assert headers["X-Strictq-Message-Id"] == msg.id
        assert headers["X-Strictq-Group"] == "cust-9"
        assert headers["X-Strictq-Lease"] == str(msg.token)
        assert headers["X-Strictq-Attempt"] == "1"
        assert headers["X-Strictq-Call"] == str(ordinal)
        assert "Proxy-Authorization" not in headers  # no proxy configured: straight to the backend


@pytest.mark.parametrize(
    ("action", "ttl", "scheme"),
    [("stale-lease", 1.0, "http"), ("block", 30.0, "http"), ("block", 30.0, "https")],
)
async def test_proxy_verdict_cancels_the_handler(
    gateway: Gateway, action: str, ttl: float, scheme: str
) -> None:
    """The 'proxy' answers the tagged call itself with a 409 and the action header: the handler is
    cancelled (even though it catches the error) and the message is not acked. After stale-lease the
    claim is left to expire (it is someone else's); after block it is released at once. For an https
    target the proxy refuses the CONNECT (the tags would be inside the tunnel; the credential is on it)."""
    proxied: list[tuple[str, str, dict[str, str]]] = []

    async def proxy(request: web.BaseRequest) -> web.Response:
        proxied.append((request.method, request.raw_path, dict(request.headers)))
        return web.json_response(
            {"code": action.replace("-", "_")}, status=409, headers={"X-Strictq-Proxy-Action": action}
        )

    events: list[str] = []

    tokens: list[int] = []

    async def handler(msg: Message) -> None:
        tokens.append(int(msg.token))
        try:
            async with msg.http.get(f"{scheme}://127.0.0.1:9/side-effect") as resp:
                events.append(f"answered {resp.status}")
        except CallFenced as exc:
            events.append(f"fenced {exc.action}")
        try:
            await asyncio.Event().wait()  # runs until cancelled
            events.append("went on")
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    redelivered: list[tuple[Message, float]] = []

    async def second(msg: Message) -> None:
        redelivered.append((msg, time.monotonic()))

    await send(gateway, "fenced", [{"n": 1}], "g")
    async with serve(proxy) as proxy_url:
        w1 = Worker("fenced", handler, config=config(gateway, proxy_url=proxy_url), ttl=ttl)
        async with asyncio.timeout(TEST_TIMEOUT), running(w1):
            await until(lambda: "cancelled" in events, what="the handler to be cancelled")
            cancelled_at = time.monotonic()
        assert events == [f"fenced {action}", "cancelled"]
        assert w1.stats.acked == 0 and w1.stats.failed == 1
        [(method, target, headers)] = proxied
        assert headers["Proxy-Authorization"] == aiohttp.encode_basic_auth(
            "worker-1", gateway.credential("worker-1").secret
        )
        if scheme == "http":  # absolute-form to the proxy, tags on the request
            assert (method, target) == ("GET", "http://127.0.0.1:9/side-effect")
            assert headers["X-Strictq-Call"] == "1" and headers["X-Strictq-Lease"] == str(tokens[0])
        else:
            assert (method, target) == ("CONNECT", "127.0.0.1:9")
        first_token = tokens[0]

    w2 = Worker("fenced", second, config=config(gateway, "worker-2"), ttl=30.0)
    async with asyncio.timeout(TEST_TIMEOUT), running(w2):
        await until(lambda: w2.stats.acked == 1, what="redelivery to the second worker")
    [(msg, at)] = redelivered
    assert int(msg.token) > first_token
    if action == "block":
        # Released at once, not left to expire (ttl 30 s); seconds of slack for a loaded CI machine.
        assert w1.stats.released == 1 and at - cancelled_at < 5.0
    else:
        assert w1.stats.released == 0 and w1.stats.lost == 1


# ------------------------------------------------------------------------------------------ stopping
async def test_sigterm_stops_gracefully_and_releases_claims(gateway: Gateway) -> None:
    started: list[int] = []

    async def handler(msg: Message) -> None:
        started.append(msg.payload["n"])
        await asyncio.sleep(0.3 if msg.group == "fast" else 30)

    await send(gateway, "graceful", [{"n": 1}, {"n": 2}, {"n": 3}], "slow")
    await send(gateway, "graceful", [{"n": 10}], "fast")
    w1 = Worker("graceful", handler, config=config(gateway), ttl=30.0, grace=1.0)
    async with asyncio.timeout(TEST_TIMEOUT):
        before = signal.getsignal(signal.SIGTERM)
        w1.install_signal_handlers((signal.SIGTERM,))
        task = asyncio.create_task(w1.run())
        await until(lambda: sorted(started) == [1, 10], what="both handlers to start")
        os.kill(os.getpid(), signal.SIGTERM)
        begun = time.monotonic()
        await task
        assert time.monotonic() - begun < 2.0
    assert w1.stats.acked == 1  # the fast one finished within the grace period
    assert w1.stats.released == 3  # the slow one was cancelled; its group's claims were handed back
    assert signal.getsignal(signal.SIGTERM) == before  # given back

    got: list[int] = []

    async def second(msg: Message) -> None:
        got.append(msg.payload["n"])

    w2 = Worker("graceful", second, config=config(gateway, "worker-2"), ttl=30.0)
    async with asyncio.timeout(TEST_TIMEOUT), running(w2):
        await until(lambda: len(got) == 3, within=3.0, what="the released claims (ttl is 30 s)")
    assert got == [1, 2, 3]


# ----------------------------------------------------------------------------------------- producer
async def test_producer_batches_and_reports_per_entry_results(gateway: Gateway) -> None:
    big = "x" * (300 * 1024)  # beyond the queue's 256 KiB message limit: refused, the others go in
    async with Producer(config(gateway, "producer-1"), max_batch=3) as producer:
        results = await producer.send_batch(
            [
                Entry("orders", {"n": 1}, "c1"),
                Entry("orders", {"n": 2}, "c2"),
                Entry("audit", {"n": 3}, "c1"),
                Entry("orders", {"n": 4}, "c1"),
                Entry("orders", {"n": 5}),
            ]
        )
        assert [r.status for r in results] == ["sent"] * 5
        assert producer.requests == 3  # group c1 (two queues, one request), c2, no group

        results = await producer.send_batch(
            [Entry("orders", {"n": 6}, "c3"), Entry("orders", big, "c3"), Entry("orders", {"n": 7}, "c3")]
        )
        assert [r.status for r in results] == ["sent", "failed", "sent"]
        assert results[1].error is not None and results[1].error.status == 413

        results = await producer.send_batch(
            [Entry("no such queue!", {"n": 8}, "c4")] + [Entry("orders", {"n": n}, "c4") for n in (9, 10, 11)]
        )
        # the first request is refused whole; the group's later request is not sent (order)
        assert [r.status for r in results] == ["failed", "failed", "failed", "skipped"]

        requests = producer.requests
        buffered = await asyncio.gather(
            *(producer.send("orders", {"n": n}, group="c5") for n in range(12, 15))
        )
        assert [r.status for r in buffered] == ["sent"] * 3 and producer.requests == requests + 1

    async with EmoClient(config(gateway), gateway.credential("worker-1").secret) as client:
        polled = await client.poll("orders", ttl=30, limit=100)
    by_group: dict[str, list[int]] = {}
    for m in polled:
        by_group.setdefault(m.group, []).append(m.payload["n"])
    assert by_group.pop("c1") == [1, 4] and by_group.pop("c2") == [2] and by_group.pop("c3") == [6, 7]
    assert by_group.pop("c5") == [12, 13, 14]
    assert list(by_group.values()) == [[5]]  # its own group


EXAMPLE_WORKER = Path(__file__).resolve().parent.parent / "examples" / "worker.py"


async def test_the_example_worker_runs_against_the_gateway(gateway: Gateway) -> None:
    """examples/worker.py (the README's) sends two customers' orders and processes them in order."""
    producer, worker = gateway.credential("producer-1"), gateway.credential("worker-1")
    env = {
        **os.environ,
        "STRICTQ_URL": gateway.url,
        "STRICTQ_CA_FILE": str(gateway.ca_file),
        "STRICTQ_API_KEY": producer.secret,
        "STRICTQ_WORKER_ID": worker.id,
        "STRICTQ_WORKER_SECRET": worker.secret,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE_WORKER), env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TEST_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = out.decode().splitlines()
    assert proc.returncode == 0, lines
    assert lines[0] == "sent: ['sent', 'sent', 'sent', 'sent']"
    for customer in ("customer-1", "customer-2"):
        steps = [line.split()[2] for line in lines if line.startswith(customer)]
        assert steps == ["1", "2"], lines
    assert lines[-1] == "acked 4, failed 0"
