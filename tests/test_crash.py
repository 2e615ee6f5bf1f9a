"""Crash safety: SIGKILL the real server at random moments under concurrent load, restart it on the same
data directory, and check from the client side that nothing acknowledged was lost, duplicated or reordered.

The client keeps a ledger:
  * acknowledged sends: every send that got a response (id, group, client seq); bodies are "group:seq";
  * unacknowledged sends: in flight at a kill; they may or may not exist, but at most once. Half of them
    are retried after the restart with the same dedup ids (then they are acknowledged, exactly once);
  * acknowledged deletes: acks that returned status ok; acks in flight at a kill may or may not have
    happened;
  * every delivery (group, seqs, token) and every token seen before each kill.
After each restart and at the end (a full drain) it checks: every acknowledged send is present exactly once
or was deleted, never both; no acknowledged delete comes back; within a group the present messages are in
seq order, a delivery always starts at the group's oldest undeleted message and acks succeed in seq order;
tokens issued after a restart exceed every token seen before it; long claims taken right before a kill are
still held after the restart; the dedup window survives every kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import ServerProcess, start_server

from queue_core.client import QueueClient

pytestmark = pytest.mark.crash

WORK, HOLDS, DEDUP = "work", "holds", "dedup"
GROUPS = [f"g{i}" for i in range(16)]
PRODUCERS = [GROUPS[i : i + 4] for i in range(0, len(GROUPS), 4)]
CONSUMERS = 4
ITERATIONS = 22
CLAIM_TTL = 1.5
HOLD_TTL = 600.0
MAX_BACKLOG = 300  # producers pause above this many live messages, so one peek sees everything
REQUEST_TIMEOUT = 5.0
CONNECTION_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)

Key = tuple[str, int]  # (group, client seq)


def parse(body: str) -> Key:
    group, seq = body.split(":")
    return group, int(seq)


@dataclass
class Delivery:
    iteration: int
    group: str
    seqs: list[int]
    token: int


class KillSwitch:
    """SIGKILL at a random moment, or (when armed) the instant a send or an ack gets its answer: the
    answer promises durability, so a kill right after it is the sharpest test of that promise."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.armed: str | None = None
        self.fired = asyncio.Event()

    def answered(self, kind: str) -> None:
        if self.armed == kind:
            self.armed = None
            os.kill(self.server.pid, signal.SIGKILL)
            self.fired.set()


@dataclass
class Ledger:
    sent: dict[str, Key] = field(default_factory=dict)  # acknowledged sends: id -> key
    id_of: dict[Key, str] = field(default_factory=dict)  # every key whose id we learned (send or delivery)
    next_seq: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0))
    in_flight_sends: dict[int, list[Key]] = field(default_factory=dict)
    unacked_batches: list[list[Key]] = field(default_factory=list)  # to retry (or not) after a restart
    unacked_keys: set[Key] = field(default_factory=set)  # never acknowledged: present at most once
    deleted: set[str] = field(default_factory=set)  # acknowledged deletes
    maybe_deleted: set[str] = field(default_factory=set)  # ack sent, no answer (killed)
    ack_order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    deliveries: list[Delivery] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))  # iteration -> tokens
    holds: list[tuple[str, str]] = field(default_factory=list)  # (group, receipt) of long claims
    dedup_ids: dict[str, str] = field(default_factory=dict)  # dedup id -> message id
    violations: list[str] = field(default_factory=list)
    switch: KillSwitch | None = None
    stats: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def learn(self, key: Key, message_id: str, where: str) -> None:
        known = self.id_of.setdefault(key, message_id)
        if known != message_id:
            self.violations.append(f"{where}: {key} has two ids {known} and {message_id} (duplicate copy)")

    def live(self) -> int:
        return len(self.sent) - len(self.deleted & self.sent.keys())


# ------------------------------------------------------------------------------------------ workload
async def producer(
    client: QueueClient, ledger: Ledger, groups: list[str], rng: random.Random, halt: asyncio.Event
) -> None:
    retries = [b for b in ledger.unacked_batches if b[0][0] in groups]
    for batch in retries:
        ledger.unacked_batches.remove(batch)
    retries = [b for b in retries if rng.random() < 0.5]  # the others stay unacknowledged for good
    while not halt.is_set():
        await asyncio.sleep(rng.uniform(0.0, 0.01))
        if retries:
            batch = retries.pop(0)
            ledger.stats["retried batches"] += 1
        elif ledger.live() > MAX_BACKLOG:
            continue
        else:
            batch = []
            for _ in range(rng.randint(1, 6)):
                group = rng.choice(groups)
                batch.append((group, ledger.next_seq[group]))
                ledger.next_seq[group] += 1
        entries = [{"body": f"{g}:{s}", "group": g, "dedup_id": f"{g}:{s}"} for g, s in batch]
        token = id(batch)
        ledger.in_flight_sends[token] = batch
        try:
            results = await client.send(WORK, entries, create=False)
        except CONNECTION_ERRORS:
            return  # the batch stays in flight: unacknowledged
        if ledger.switch is not None:
            ledger.switch.answered("send")
        del ledger.in_flight_sends[token]
        for key, result in zip(batch, results, strict=True):
            if "error" in result:
                ledger.violations.append(f"send {key} refused: {result}")
                continue
            ledger.sent[result["id"]] = key
            ledger.unacked_keys.discard(key)
            ledger.learn(key, result["id"], "send")
            ledger.stats["acknowledged sends"] += 1
            ledger.stats["duplicate answers"] += result["duplicate"]


async def consumer(
    client: QueueClient, ledger: Ledger, iteration: int, rng: random.Random, halt: asyncio.Event
) -> None:
    while not halt.is_set():
        try:
            messages = await client.receive(
                WORK, limit=rng.randint(1, 4), ttl=CLAIM_TTL, wait=rng.choice([0.0, 0.1])
            )
        except CONNECTION_ERRORS:
            return
        if not messages:
            await asyncio.sleep(0.01)
            continue
        by_group: dict[str, list[dict[str, Any]]] = {}
        for message in messages:
            key = parse(message["body"])
            if key[0] != message["group"]:
                ledger.violations.append(f"body {message['body']} delivered in group {message['group']}")
            if message["id"] in ledger.deleted:
                ledger.violations.append(f"deleted message {key} {message['id']} delivered again")
            ledger.learn(key, message["id"], "delivery")
            ledger.tokens[iteration].append(message["token"])
            by_group.setdefault(message["group"], []).append(message)
        for group, batch in by_group.items():
            seqs = [parse(m["body"])[1] for m in batch]
            if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
                ledger.violations.append(f"group {group} batch out of order: {seqs}")
            if len({m["token"] for m in batch}) != 1:
                ledger.violations.append(f"group {group} batch with several tokens")
            ledger.deliveries.append(Delivery(iteration, group, seqs, batch[0]["token"]))
            ledger.stats["deliveries"] += len(batch)
        for group, batch in by_group.items():
            if not await handle(client, ledger, group, batch, rng):
                return


async def handle(
    client: QueueClient, ledger: Ledger, group: str, batch: list[dict[str, Any]], rng: random.Random
) -> bool:
    """Ack a prefix of a group's batch (in order), then release or abandon the rest. False: server gone."""
    roll = rng.random()
    try:
        if roll < 0.1:
            ledger.stats["abandoned claims"] += 1
            return True  # the claim expires after CLAIM_TTL (possibly across a restart)
        if roll < 0.2:
            outcomes = await client.renew(WORK, [m["receipt"] for m in batch], CLAIM_TTL)
            if any(o["status"] != "ok" for o in outcomes) and time.time() < batch[0]["claim_expires"] - 0.1:
                ledger.violations.append(f"renew of a live claim failed: {outcomes}")
        count = len(batch) if rng.random() < 0.7 else rng.randint(0, len(batch))
        done = batch[:count]
        if done:
            ledger.maybe_deleted.update(m["id"] for m in done)
            outcomes = await client.ack(WORK, [m["receipt"] for m in done])
            if ledger.switch is not None and any(o["status"] == "ok" for o in outcomes):
                ledger.switch.answered("ack")
            for message, outcome in zip(done, outcomes, strict=True):
                if outcome["id"] != message["id"]:
                    ledger.violations.append(f"ack answered for {outcome['id']}, asked {message['id']}")
                if outcome["status"] == "ok":
                    ledger.deleted.add(message["id"])
                    ledger.ack_order[group].append(parse(message["body"])[1])
                    ledger.stats["acknowledged deletes"] += 1
                elif time.time() < message["claim_expires"] - 0.1:
                    ledger.violations.append(f"ack of a live claim refused: {message['body']} {outcome}")
        rest = batch[count:]
        if rest and rng.random() < 0.6:
            await client.release(WORK, [m["receipt"] for m in rest])
            ledger.stats["releases"] += 1
    except CONNECTION_ERRORS:
        return False
    return True


# --------------------------------------------------------------------------------------------- checks
async def check_state(client: QueueClient, ledger: Ledger, when: str) -> list[dict[str, Any]]:
    """Compare what the server holds now with the ledger; returns the present messages of WORK."""
    present = await client.peek(WORK, limit=1000)
    assert len(present) < 1000, "data set too big for one peek"
    v = ledger.violations
    ids = [m["id"] for m in present]
    keys = [parse(m["body"]) for m in present]
    if len(set(ids)) != len(ids) or len(set(keys)) != len(keys):
        v.append(f"{when}: duplicates present: {sorted(keys)}")
    for message, key in zip(present, keys, strict=True):
        if message["id"] in ledger.deleted:
            v.append(f"{when}: acknowledged delete {key} {message['id']} came back")
        ledger.learn(key, message["id"], when)
        if message["id"] not in ledger.sent and key not in ledger.unacked_keys:
            v.append(f"{when}: {key} present but never sent")
    present_ids = set(ids)
    for message_id, key in ledger.sent.items():
        if message_id not in present_ids and message_id not in ledger.deleted | ledger.maybe_deleted:
            v.append(f"{when}: acknowledged send {key} {message_id} lost")

    # Order: present messages of a group are in client seq order by server seq.
    by_group: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for message, (group, seq) in zip(present, keys, strict=True):
        by_group[group].append((message["seq"], seq))
    for group, pairs in by_group.items():
        seqs = [s for _, s in sorted(pairs)]
        if seqs != sorted(seqs):
            v.append(f"{when}: group {group} stored out of order: {seqs}")
    # A delivery starts at the group's oldest undeleted message and takes consecutive ones: whatever of
    # the group is still present below the batch's last seq must be part of the batch.
    present_seqs = {g: {s for _, s in pairs} for g, pairs in by_group.items()}
    for delivery in ledger.deliveries:
        below = {s for s in present_seqs.get(delivery.group, ()) if s <= delivery.seqs[-1]}
        if not below <= set(delivery.seqs):
            v.append(f"{when}: delivery {delivery.group} {delivery.seqs} skipped present {sorted(below)}")
    # Acks succeed in seq order within a group (a consumer acks a prefix of what it was given, in order).
    for group, acked in ledger.ack_order.items():
        if any(a >= b for a, b in itertools.pairwise(acked)):
            v.append(f"{when}: group {group} acked out of order: {acked}")
    return present


async def check_after_restart(client: QueueClient, ledger: Ledger, iteration: int) -> None:
    when = f"after restart {iteration}"
    await check_state(client, ledger, when)
    v = ledger.violations
    # Long claims taken right before the kill are still held.
    if ledger.holds:
        claimed = await client.claim_count(HOLDS)
        if claimed < len(ledger.holds):
            v.append(f"{when}: claimcount({HOLDS}) {claimed} < {len(ledger.holds)} held claims")
        stolen = await client.receive(HOLDS, limit=100, ttl=HOLD_TTL)
        if stolen:
            v.append(f"{when}: held groups delivered again: {[m['group'] for m in stolen]}")
        group, _ = ledger.holds[-1]
        info = await client.group(HOLDS, group)
        if info["in_flight"] != 1:
            v.append(f"{when}: last held group {group} not claimed: {info}")
    # The dedup window survives: every earlier dedup id is still a duplicate with its original id.
    if ledger.dedup_ids:
        results = await client.send(DEDUP, [{"body": "again", "dedup_id": d} for d in ledger.dedup_ids])
        for (dedup_id, message_id), result in zip(ledger.dedup_ids.items(), results, strict=True):
            if not result.get("duplicate") or result.get("id") != message_id:
                v.append(f"{when}: dedup id {dedup_id} forgotten: {result} (was {message_id})")


def check_tokens(ledger: Ledger, iteration: int) -> None:
    before = [t for i, tokens in ledger.tokens.items() if i < iteration for t in tokens]
    now = ledger.tokens.get(iteration, [])
    if before and now and min(now) <= max(before):
        ledger.violations.append(
            f"iteration {iteration}: token {min(now):x} not above {max(before):x} seen before the restart"
        )


def assert_clean(ledger: Ledger, seed: int) -> None:
    assert not ledger.violations, f"seed {seed}:\n" + "\n".join(ledger.violations[:30])


# ---------------------------------------------------------------------------------------------- test
async def one_round(server: ServerProcess, ledger: Ledger, iteration: int, rng: random.Random) -> None:
    """Run the load, take a long claim and a dedup send right before the moment, then SIGKILL."""
    halt = asyncio.Event()  # set right after the kill: nothing new is started, in-flight calls fail
    switch = ledger.switch = KillSwitch(server)
    mode = rng.choice(["timer", "timer", "send", "ack"])
    ledger.stats[f"kills on {mode}"] += 1
    async with QueueClient(server.url, timeout=REQUEST_TIMEOUT) as client:
        tasks = [
            asyncio.create_task(producer(client, ledger, groups, random.Random(rng.random()), halt))
            for groups in PRODUCERS
        ] + [
            asyncio.create_task(consumer(client, ledger, iteration, random.Random(rng.random()), halt))
            for _ in range(CONSUMERS)
        ]
        try:
            await asyncio.sleep(rng.uniform(0.1, 0.6))
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            hold_group = f"hold-{iteration}"
            await client.send(HOLDS, [{"body": hold_group, "group": hold_group}])
            held = await client.receive(HOLDS, limit=100, ttl=HOLD_TTL)
            assert [m["group"] for m in held] == [hold_group], held
            ledger.holds.append((hold_group, held[0]["receipt"]))
            ledger.tokens[iteration].append(held[0]["token"])
            dedup = await client.send_one(DEDUP, f"once-{iteration}", dedup_id=f"dd-{iteration}")
            ledger.dedup_ids[f"dd-{iteration}"] = dedup["id"]
            if mode != "timer":
                switch.armed = mode
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(switch.fired.wait(), 1.0)
        finally:
            switch.armed = None
            server.kill()
            halt.set()
            done, pending = await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT + 2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    for batch in ledger.in_flight_sends.values():
        ledger.unacked_batches.append(batch)
        ledger.unacked_keys.update(batch)
        ledger.stats["unacknowledged batches"] += 1
    ledger.in_flight_sends.clear()


async def drain(client: QueueClient, ledger: Ledger, present: list[dict[str, Any]]) -> None:
    """Receive and ack everything left; each present message exactly once, each group in order."""
    expected = {m["id"] for m in present}
    got: dict[str, Key] = {}
    last: dict[str, int] = {}
    deadline = time.monotonic() + CLAIM_TTL + 8
    while time.monotonic() < deadline:
        messages = await client.receive(WORK, limit=100, ttl=30, wait=0.3)
        for message in messages:
            group, seq = parse(message["body"])
            if message["id"] in got:
                ledger.violations.append(f"drain: {message['body']} delivered twice")
            if seq <= last.get(group, -1):
                ledger.violations.append(f"drain: group {group} went back to {seq} after {last[group]}")
            last[group] = seq
            got[message["id"]] = (group, seq)
        if messages:
            outcomes = await client.ack(WORK, [m["receipt"] for m in messages])
            if any(o["status"] != "ok" for o in outcomes):
                ledger.violations.append(f"drain: ack refused {outcomes}")
        elif await client.size(WORK) == 0:
            break
    if set(got) != expected:
        ledger.violations.append(
            f"drain: delivered {len(got)} != present {len(expected)}; "
            f"missing {sorted(expected - set(got))[:10]}, extra {sorted(set(got) - expected)[:10]}"
        )
    assert await client.size(WORK) == 0, "drain did not empty the queue"
    for message_id, key in ledger.sent.items():
        if message_id not in got and message_id not in ledger.deleted | ledger.maybe_deleted:
            ledger.violations.append(f"drain: acknowledged send {key} never delivered")
        if message_id in got and message_id in ledger.deleted:
            ledger.violations.append(f"drain: {key} both deleted and delivered")


@pytest.mark.timeout(150)
async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    seed = int(os.environ.get("STRICTQ_CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"crash test seed {seed} (set STRICTQ_CRASH_SEED to replay the schedule)")
    started = time.monotonic()
    data_dir = tmp_path / "data"
    ledger = Ledger()
    server = await asyncio.to_thread(start_server, data_dir)
    try:
        async with QueueClient(server.url, timeout=REQUEST_TIMEOUT) as client:
            for name in (WORK, HOLDS, DEDUP):
                await client.create_queue(name, dedup_window=3600)
        for iteration in range(ITERATIONS):
            await one_round(server, ledger, iteration, rng)
            server = await asyncio.to_thread(start_server, data_dir)
            async with QueueClient(server.url, timeout=REQUEST_TIMEOUT) as client:
                await check_after_restart(client, ledger, iteration)
            check_tokens(ledger, iteration)
            assert_clean(ledger, seed)
            print(f"iteration {iteration} ok at {time.monotonic() - started:.1f}s: {dict(ledger.stats)}")

        async with QueueClient(server.url, timeout=REQUEST_TIMEOUT) as client:
            final_tokens_floor = max(t for tokens in ledger.tokens.values() for t in tokens)
            present = await check_state(client, ledger, "final")
            await drain(client, ledger, present)
            # The held claims outlived every restart, and their receipts still work.
            receipts = [receipt for _, receipt in ledger.holds]
            outcomes = await client.ack(HOLDS, receipts)
            if [o["status"] for o in outcomes] != ["ok"] * len(receipts):
                ledger.violations.append(f"held claims lost across restarts: {outcomes}")
            assert await client.size(HOLDS) == 0
            await client.send(WORK, [{"body": "z:0", "group": "z"}])
            (fresh,) = await client.receive(WORK, ttl=30)
            assert fresh["token"] > final_tokens_floor
        assert_clean(ledger, seed)
        assert await asyncio.to_thread(server.terminate) == 0
    finally:
        if server.running():
            server.kill()
    stats = dict(ledger.stats)
    busy = len({d.iteration for d in ledger.deliveries})
    print(
        f"crash test: {ITERATIONS} kills ({busy} with deliveries)"
        f" in {time.monotonic() - started:.1f}s; {stats}"
    )
    # The load must really have been there, or the test proves nothing.
    assert stats["acknowledged sends"] > 100 and stats["acknowledged deletes"] > 50, stats
    assert len(ledger.holds) == ITERATIONS


async def test_acknowledged_send_and_ack_survive_an_immediate_kill(tmp_path: Path) -> None:
    """The smallest case: the response means durable, even if the process dies right after it."""
    data_dir = tmp_path / "data"
    server = await asyncio.to_thread(start_server, data_dir)
    try:
        async with QueueClient(server.url, timeout=REQUEST_TIMEOUT) as client:
            kept = await client.send(WORK, [{"body": f"k:{i}", "group": "k"} for i in range(3)])
            await client.send(WORK, [{"body": "d:0", "group": "d"}])
            (claim,) = await client.receive(WORK, limit=1, ttl=30)  # k (oldest group), k:0 only
            assert claim["body"] == "k:0"
            assert [o["status"] for o in await client.ack(WORK, [claim["receipt"]])] == ["ok"]
        server.kill()
        server = await asyncio.to_thread(start_server, data_dir)
        async with QueueClient(server.url, timeout=REQUEST_TIMEOUT) as client:
            assert [m["body"] for m in await client.peek(WORK, 100)] == ["k:1", "k:2", "d:0"]
            assert [m["id"] for m in await client.peek(WORK, 100)][:2] == [r["id"] for r in kept[1:]]
            got = await client.receive(WORK, limit=10, ttl=30)
            assert [m["body"] for m in got] == ["k:1", "k:2", "d:0"]
            assert min(m["token"] for m in got) > claim["token"]
        assert await asyncio.to_thread(server.terminate) == 0
    finally:
        if server.running():
            server.kill()
