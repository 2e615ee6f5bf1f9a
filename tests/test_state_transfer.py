"""State transfer end to end: the real gateway over TLS (a trustme CA), real SQLite, real SDK workers
keeping a running count per group in `msg.state`, moves started through the admin route
(docs/state-transfer.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from gateway_support import Emo, Gateway, serve_gateway
from kit import until

from strictq.sdk import ClientConfig, EmoClient, Message, Worker

QUEUE = "counts"
CORE = f"t1.{QUEUE}"  # the EmoDB queue's name in the core (tenant t1)


def config(gw: Gateway, key_id: str) -> ClientConfig:
    secret = gw.credential(key_id).secret
    return ClientConfig(
        url=gw.url, ca_file=str(gw.ca_file), api_key=secret, worker_id=key_id, worker_secret=secret
    )


class Counter:
    """A handler keeping a running count per group in its local state; records (worker, n, count)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []
        self.gate: asyncio.Event | None = None  # set: the handler waits for it (a busy donor)

    async def __call__(self, msg: Message) -> None:
        if self.gate is not None:
            await self.gate.wait()
        msg.state["count"] = msg.state.get("count", 0) + 1
        self.seen.append((msg.worker_id, msg.payload["n"], msg.state["count"]))


def worker(gw: Gateway, key_id: str, handler: Any, state_limit: int = 64 * 1024) -> Worker:
    return Worker(QUEUE, handler, config=config(gw, key_id), ttl=10.0, wait=0.2, state_limit=state_limit)


@asynccontextmanager
async def running(w: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        w.stop(1.0)
        async with asyncio.timeout(10):
            await task


async def send(gw: Gateway, numbers: range, group: str = "g") -> None:
    async with EmoClient(config(gw, "producer-1"), gw.credential("producer-1").secret) as client:
        await client.send_batch({QUEUE: [{"n": n} for n in numbers]}, group=group)


async def admin(
    gw: Gateway, method: str, path: str, body: Any = None, key: str = "admin-1"
) -> tuple[int, Any]:
    emo = Emo(gw, key)
    try:
        status, _, answer = await emo.call(method, f"/admin/v1/queues/{QUEUE}/handover{path}", body)
        return status, answer
    finally:
        await emo.close()


async def phases(gw: Gateway) -> dict[str, str]:
    status, answer = await admin(gw, "GET", "")
    assert status == 200, answer
    return {row["group"]: row["phase"] for row in answer["handovers"]}


async def setup(gw: Gateway, **attributes: Any) -> None:
    await gw.service.create_queue(CORE, {"handover_timeout": 30.0, **attributes})


async def test_a_running_count_continues_exactly_on_the_worker_the_group_moved_to(gateway: Gateway) -> None:
    await setup(gateway)
    one, two = Counter(), Counter()
    donor = worker(gateway, "worker-1", one)
    async with running(donor):
        await send(gateway, range(1, 6))
        await until(lambda: len(one.seen) == 5)
        status, answer = await admin(gateway, "POST", "", {"from": "worker-1", "groups": ["g"]})
        assert status == 200 and answer["groups"] == ["g"], answer
        await until(lambda: "g" not in donor.local_state.groups if donor.local_state else False)
        assert (await phases(gateway)) == {"g": "arrived"}
    async with running(worker(gateway, "worker-2", two)):
        await send(gateway, range(6, 11))
        await until(lambda: len(two.seen) == 5)
    assert [c for _, _, c in one.seen] == [1, 2, 3, 4, 5]
    assert two.seen == [("worker-2", n, n) for n in range(6, 11)]  # the count went on from 5
    assert await phases(gateway) == {}  # used, then dropped


async def test_a_busy_donor_finishes_its_batch_before_the_group_moves(gateway: Gateway) -> None:
    await setup(gateway)
    one, two = Counter(), Counter()
    one.gate = asyncio.Event()
    await send(gateway, range(1, 4))
    async with running(worker(gateway, "worker-1", one)):
        await until(lambda: gateway.service.core.queue(CORE).groups["g"].claimed)
        await admin(gateway, "POST", "", {"from": "worker-1", "groups": ["g"]})
        assert await phases(gateway) == {"g": "draining"}
        async with running(worker(gateway, "worker-2", two)):
            await asyncio.sleep(0.3)
            assert two.seen == []  # held while the donor works
            one.gate.set()
            await until(lambda: len(one.seen) == 3)
            await send(gateway, range(4, 6))
            await until(lambda: len(two.seen) + len(one.seen) == 5)
    done = sorted(one.seen + two.seen, key=lambda s: s[1])
    assert [c for _, _, c in done] == [1, 2, 3, 4, 5]  # whoever got it, from the right count


@pytest.mark.parametrize("policy", ["proceed", "wait"])
async def test_a_donor_gone_times_out_and_the_policy_decides(gateway: Gateway, policy: str) -> None:
    await setup(gateway, handover_timeout=0.3, handover_policy=policy)
    one, two = Counter(), Counter()
    async with running(worker(gateway, "worker-1", one)):
        await send(gateway, range(1, 3))
        await until(lambda: len(one.seen) == 2)
    await admin(gateway, "POST", "", {"from": "worker-1", "groups": ["g"]})  # worker-1 is gone
    await send(gateway, range(3, 5))
    async with running(worker(gateway, "worker-2", two)):
        if policy == "wait":
            await asyncio.sleep(0.6)
            assert two.seen == [] and await phases(gateway) == {"g": "waiting"}
            status, answer = await admin(gateway, "POST", "/release", {"groups": ["g"]})
            assert status == 200 and answer["released"] == ["g"], answer
        await until(lambda: len(two.seen) == 2)
    assert [c for _, _, c in two.seen] == [1, 2]  # delivered without the state: counting starts again


async def test_state_over_the_limit_fails_the_attempt_with_a_clear_reason(gateway: Gateway) -> None:
    await setup(gateway)

    async def grow(msg: Message) -> None:
        msg.state["blob"] = "x" * 500

    w = worker(gateway, "worker-1", grow, state_limit=100)
    async with running(w):
        await send(gateway, range(1, 2))
        await until(lambda: w.stats.failed >= 1)
    assert any("over this worker's state_limit of 100 bytes" in r for r in w.stats.reasons), w.stats.reasons

    emo = Emo(gateway, "worker-1")
    try:
        status, _, answer = await emo.call("PUT", f"/queue/1/{QUEUE}/state", {"g": {"blob": "y" * (1 << 20)}})
        assert status == 413 and answer["error"]["details"]["field"] == "g", answer
        status, _, answer = await emo.call("PUT", f"/queue/1/{QUEUE}/state", {"g": [1]})
        assert status == 400 and answer["error"]["details"]["field"] == "g", answer
        status, _, answer = await emo.call("PUT", f"/queue/1/{QUEUE}/state", [1])
        assert status == 400 and "JSON object" in answer["error"]["message"], answer
    finally:
        await emo.close()


async def test_uploads_and_moves_are_scoped_to_the_donor_and_its_tenant(gateway: Gateway) -> None:
    await setup(gateway)
    await send(gateway, range(1, 2))
    assert (await admin(gateway, "POST", "", {"from": "worker-1", "groups": ["g"]}))[0] == 200
    status, _ = await admin(gateway, "POST", "", {"from": "worker-1", "groups": ["g"]}, key="other-1")
    assert status == 404  # another tenant's queue is not there for t2
    status, answer = await admin(gateway, "POST", "", {"groups": ["g"]})
    assert status == 400 and answer["error"]["details"]["field"] == "from", answer
    for key in ("worker-2", "other-1"):  # not the donor; another tenant (its own, empty queue)
        emo = Emo(gateway, key)
        try:
            status, _, answer = await emo.call("PUT", f"/queue/1/{QUEUE}/state", {"g": {"count": 99}})
            assert status == 200 and answer["results"] == [{"group": "g", "status": "not_requested"}], answer
        finally:
            await emo.close()
    assert await phases(gateway) == {"g": "awaiting"}


async def test_plain_clients_see_nothing_new(gateway: Gateway) -> None:
    await setup(gateway)
    await send(gateway, range(1, 2))
    await admin(gateway, "POST", "", {"from": "worker-1", "groups": ["g"]})
    emo = Emo(gateway, "worker-1")  # the donor, polling as a plain EmoDB client
    try:
        status, headers, items = await emo.call("GET", f"/queue/1/{QUEUE}/poll?limit=10")
        assert status == 200 and items == [] and "X-Strictq-Handover" not in headers
        await gateway.service.put_state(CORE, "worker-1", {"g": {"count": 7}})
        status, headers, items = await emo.call("GET", f"/queue/1/{QUEUE}/poll?limit=10")
        assert [set(i) for i in items] == [{"id", "payload", "group", "seq", "token", "attempt", "queue_ref"}]
    finally:
        await emo.close()


async def test_a_transfer_pending_survives_a_restart_of_the_server(tmp_path: Path) -> None:
    one, two = Counter(), Counter()
    async with serve_gateway(tmp_path) as gw:
        await setup(gw)
        donor = worker(gw, "worker-1", one)
        async with running(donor):
            await send(gw, range(1, 4))
            await until(lambda: len(one.seen) == 3)
            await admin(gw, "POST", "", {"from": "worker-1", "groups": ["g"]})
            await until(lambda: "g" not in donor.local_state.groups if donor.local_state else False)
        await send(gw, range(4, 5), group="h")
        await admin(gw, "POST", "", {"from": "worker-1", "groups": ["h"]})  # never answered: awaiting
    async with serve_gateway(tmp_path) as gw:
        assert await phases(gw) == {"g": "arrived", "h": "awaiting"}
        async with running(worker(gw, "worker-2", two)):
            await send(gw, range(4, 6))
            await until(lambda: len(two.seen) == 2)
    assert two.seen == [("worker-2", 4, 4), ("worker-2", 5, 5)]


async def test_a_pin_moving_a_group_takes_its_state_along(gateway: Gateway) -> None:
    """Group routing (queue_core.machine.routing) moving a group away from the worker that kept its state:
    the move is a handover by itself (the donor declared `state`), and the count goes on exactly where the
    pinned worker picks the group up; the donor never gets the group again."""
    await setup(gateway)
    one, two = Counter(), Counter()
    async with running(worker(gateway, "worker-1", one)) as donor, running(worker(gateway, "worker-2", two)):
        await send(gateway, range(1, 4))
        await until(lambda: len(one.seen) + len(two.seen) == 3)
        holder = "worker-1" if one.seen else "worker-2"
        other = "worker-2" if holder == "worker-1" else "worker-1"
        pin = {"pins": [{"name": "moved", "prefix": "g", "workers": [other]}]}
        await gateway.service.set_attributes(CORE, {"routing": pin})
        await send(gateway, range(4, 7))
        await until(lambda: len(one.seen) + len(two.seen) == 6)
        assert donor is not None
    done = sorted(one.seen + two.seen, key=lambda s: s[1])
    assert [count for _, _, count in done] == [1, 2, 3, 4, 5, 6]  # the count went on across the move
    assert {w for w, n, _ in done if n >= 4} == {other}  # after the pin, only the pinned worker
    assert await phases(gateway) == {}
