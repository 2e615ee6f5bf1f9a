"""Canary rollouts and pins end to end (strictq rollout / strictq routing, queue_core.routing_http,
queue_core.machine.routing): a real gateway with failure management over TLS, SDK workers of two versions,
producers sending all along, and the real CLI as a subprocess driving the steps.

A rollout whose canary does as well as the rest passes every step to 100 %; one whose canary fails its
messages reverts by itself at the first step, its version then takes nothing and nothing is lost; each step
is an event. A pinned range never reaches another worker.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from health_support import QUEUE, Health, until

from queue_core.machine.routing import in_share
from strictq.sdk import ClientConfig, Message, Worker

GROUPS = 60


def config(h: Health, worker: str) -> ClientConfig:
    secret = h.secret(worker)
    return ClientConfig(
        url=h.url, ca_file=str(h.ca_file), api_key=secret, worker_id=worker, worker_secret=secret
    )


def cli_env(h: Health) -> dict[str, str]:
    return {
        **os.environ,
        "STRICTQ_URL": h.url,
        "STRICTQ_CA_FILE": str(h.ca_file),
        "STRICTQ_ADMIN_KEY": h.secret("admin-1"),
    }


async def cli(h: Health, *args: str, within: float = 60.0) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "strictq", *args,
        env=cli_env(h), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(within):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@asynccontextmanager
async def producing(h: Health, sent: list[tuple[str, int]]) -> AsyncIterator[None]:
    """Send one message to each of GROUPS groups in turn, all along the block."""

    async def produce() -> None:
        n = 0
        while True:
            group = f"g{n % GROUPS}"
            await h.send(group, {"n": n})
            sent.append((group, n))
            n += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(produce())
    try:
        yield
    finally:
        task.cancel()
        with_cancel = asyncio.gather(task, return_exceptions=True)
        await with_cancel


@asynccontextmanager
async def running(*workers: Worker) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        for w in workers:
            w.stop(1.0)
        async with asyncio.timeout(10):
            await asyncio.gather(*tasks, return_exceptions=True)


def recorder(
    seen: dict[str, list[tuple[str, int]]], name: str, fail: bool = False
) -> Callable[[Message], Awaitable[None]]:
    async def handle(msg: Message) -> None:
        if fail:
            raise RuntimeError("the new version is broken")
        if not msg.probe:
            seen[name].append((msg.group or "", msg.payload["n"]))

    return handle


async def test_a_rollout_that_passes_its_gates_reaches_every_group(health: Health) -> None:
    h = health
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    old = Worker(QUEUE, recorder(seen, "old"), config=config(h, "worker-1"), version="1.0", ttl=5, wait=0.2)
    new = Worker(QUEUE, recorder(seen, "new"), config=config(h, "worker-2"), version="2.0", ttl=5, wait=0.2)
    sent: list[tuple[str, int]] = []
    async with running(old, new), producing(h, sent):
        versions = h.service.core.queue(f"t1.{QUEUE}").worker_versions
        await until(lambda: len(versions) == 2, what="both workers polling")  # the baseline is who polls
        code, out, err = await cli(
            h, "rollout", "start", QUEUE, "--version", "2.0", "--steps", "10,50,100",
            "--step-seconds", "0.5", "--min-attempts", "3", "--poll", "0.1",
        )  # fmt: skip
        assert code == 0, (out, err)
        mark = len(sent)
        await until(lambda: len(seen["new"]) > 0 and any(n >= mark for _, n in seen["new"]), what="new work")
    lines = out.splitlines()
    assert lines[0] == f"rollout of 2.0 on {QUEUE}: the other groups stay with 1.0"
    assert lines[1] == "step 1/3: 10% of groups -> 2.0" and lines[-1].startswith("rollout of 2.0 completed")
    assert sum(line.startswith("  passed:") for line in lines) == 3
    assert not any(n >= mark for _, n in seen["old"])  # completed: the old version takes nothing new
    names = [e["event"] for e in await h.events()]
    assert names.count("rollout-running") == 4 and names[-1] == "rollout-completed", names  # prepare + 3
    code, out, _ = await cli(h, "rollout", "status", QUEUE)
    assert code == 0 and "canary: 100% of groups -> version 2.0" in out and "rollout of 2.0: completed" in out


async def test_a_failing_canary_is_reverted_and_its_groups_go_back(health: Health) -> None:
    h = health
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    old = Worker(QUEUE, recorder(seen, "old"), config=config(h, "worker-1"), version="1.0", ttl=5, wait=0.2)
    bad = Worker(
        QUEUE, recorder(seen, "bad", fail=True), config=config(h, "worker-2"), version="2.0", ttl=5, wait=0.2
    )
    sent: list[tuple[str, int]] = []
    async with running(old, bad):
        async with producing(h, sent):
            code, out, err = await cli(
                h, "rollout", "start", QUEUE, "--version", "2.0", "--steps", "25,100",
                "--step-seconds", "5", "--min-attempts", "2", "--poll", "0.1",
            )  # fmt: skip
        assert code == 1, (out, err)
        assert "step 1/2 25%: REVERTED: " in out, out
        assert "canary failure rate" in out or "fenced" in out, out
        # Reverted: version 2.0 takes nothing; everything sent is done by the old version, in group order.
        await until(
            lambda: {n for _, n in seen["old"]} >= {n for _, n in sent},
            within=30,
            what="the old version to catch up",
        )
    per_group: dict[str, list[int]] = defaultdict(list)
    for group, n in seen["old"]:
        if n not in per_group[group]:  # at-least-once: a claim that lapsed on a loaded machine repeats one
            per_group[group].append(n)
    assert all(ns == sorted(ns) for ns in per_group.values())  # each group in order
    assert sorted(n for ns in per_group.values() for n in ns) == [n for _, n in sent]  # nothing lost
    names = [e["event"] for e in await h.events()]
    assert "rollout-running" in names and "rollout-reverted" in names, names
    assert any(in_share(g, 25) for g, _ in sent)  # the share was not empty: the revert mattered


async def test_a_pinned_range_never_leaves_its_workers_and_bad_pins_are_refused(health: Health) -> None:
    h = health
    code, out, err = await cli(
        h, "routing", QUEUE, "--pin", "vip", "--prefix", "vip:", "--workers", "worker-3"
    )
    assert code == 0 and "pin vip: prefix 'vip:' -> worker-3" in out, (out, err)
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    workers = [
        Worker(QUEUE, recorder(seen, name), config=config(h, name), ttl=5, wait=0.2)
        for name in ("worker-1", "worker-2", "worker-3")
    ]
    for n in range(40):
        await h.send(f"vip:{n % 4}" if n % 2 else f"plain{n % 5}", {"n": n})
    async with running(*workers):
        await until(lambda: sum(map(len, seen.values())) == 40, within=30, what="every message")
    assert all(g.startswith("vip:") for g, _ in seen["worker-3"] if g.startswith("vip:"))
    assert not any(g.startswith("vip:") for name in ("worker-1", "worker-2") for g, _ in seen[name])
    assert len([1 for g, _ in seen["worker-3"] if g.startswith("vip:")]) == 20
    # Bad input: one line, the field named; another tenant cannot see the queue.
    code, out, err = await cli(h, "routing", QUEUE, "--pin", "x", "--buckets", "9:3", "--workers", "w")
    assert code == 1 and "routing.pins[1].buckets" in err and "Traceback" not in err, err
    code, _, err = await cli(h, "routing", QUEUE, "--pin", "x", "--workers", "w")
    assert code == 2 and "--pin needs --prefix and/or --buckets" in err
    status, body = await h.call("GET", f"/admin/v1/queues/{QUEUE}/routing", "other-1")
    assert status == 404, body


@pytest.mark.parametrize("steps", ["5,2", "0,10", "a,b"])
async def test_bad_steps_are_a_usage_error(health: Health, steps: str) -> None:
    code, _, err = await cli(health, "rollout", "start", QUEUE, "--version", "2", "--steps", steps)
    assert code == 2 and err.startswith("strictq: --steps") and "Traceback" not in err, err


async def test_a_big_message_goes_to_the_worker_that_declared_it_takes_it(health: Health) -> None:
    """Selection by message size over the real face: `Worker(max_message_bytes=...)`, declared on polls."""
    h = health
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    heavy = Worker(QUEUE, recorder(seen, "heavy"), config=config(h, "worker-1"), ttl=5, wait=0.2)
    light = Worker(
        QUEUE, recorder(seen, "light"), config=config(h, "worker-2"), ttl=5, wait=0.2, max_message_bytes=2000
    )
    queue = h.service.core.queue(f"t1.{QUEUE}")
    async with running(heavy):
        await until(lambda: "worker-1" in queue.pollers, what="the heavy worker polling")
        async with running(light):
            await until(lambda: queue.worker_capacity.get("worker-2") == 2000, what="the light one polling")
            for n in range(20):
                await h.send(f"g{n % 5}", {"n": n, "pad": "x" * (5000 if n == 7 else 0)})
            await until(lambda: sum(map(len, seen.values())) == 20, within=30, what="every message")
    assert 7 in [n for _, n in seen["heavy"]] and 7 not in [n for _, n in seen["light"]]
    status, body = await h.call(
        "GET", f"/queue/1/{QUEUE}/poll", "worker-2", headers={"X-Strictq-Worker-Max-Bytes": "lots"}
    )
    assert status == 400 and "X-Strictq-Worker-Max-Bytes" in str(body), body
