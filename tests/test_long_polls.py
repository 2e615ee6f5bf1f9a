"""Long polls woken one at a time (queue_core.long_polls): a send or an ack wakes one waiting receive that
may take something, which passes the wake on; nothing is left waiting while something it may take is
ready, and the chain always ends. First the wait list alone, then a real QueueService (real SQLite)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from queue_core.long_polls import WOKEN_BY_ALL, LongPolls, Waiter
from queue_core.machine import SendRequest
from queue_core.machine.capabilities import Capabilities
from queue_core.service import QueueService, Received

pytestmark = pytest.mark.timeout(60)


def anyone(_: Waiter) -> bool:
    return True


async def waiting(polls: LongPolls, queue: str, worker: str, within: float = 5.0) -> asyncio.Task[int | None]:
    """A receive's wait, started and registered before returning."""
    task = asyncio.create_task(polls.wait(queue, worker, "", within))
    await asyncio.sleep(0)
    return task


async def test_a_send_wakes_the_oldest_waiter_that_may_take_and_no_other() -> None:
    polls = LongPolls()
    a, b, c = [await waiting(polls, "q", w) for w in ("a", "b", "c")]
    polls.wake_one("q", lambda w: w.worker != "a")  # a may not take it (its route, its gate)
    assert await b == 3  # three tries to pass on: three were waiting
    await asyncio.sleep(0.01)
    assert not a.done() and not c.done()
    polls.wake_all("q")
    assert (await a, await c) == (WOKEN_BY_ALL, WOKEN_BY_ALL)
    assert "q" not in polls


async def test_a_wake_is_passed_on_until_one_takes_and_ends_when_the_tries_are_used() -> None:
    polls = LongPolls()
    first, second, third = [await waiting(polls, "q", w) for w in ("a", "b", "c")]
    polls.wake_one("q", anyone)
    tries = await first
    assert tries == 3
    polls.pass_on("q", tries, took=False, may_take=anyone)  # it found nothing: one try fewer
    tries = await second
    assert tries == 2
    polls.pass_on("q", tries, took=True, may_take=anyone)  # it took something: there may be more
    assert await third == 2
    # Nobody may take anything: the chain ends, nobody else is woken.
    late = await waiting(polls, "q", "d")
    polls.pass_on("q", 2, took=True, may_take=lambda _: False)
    await asyncio.sleep(0.01)
    assert not late.done()
    # A wake that found nothing with its last try is not passed on either.
    polls.pass_on("q", 1, took=False, may_take=anyone)
    await asyncio.sleep(0.01)
    assert not late.done()
    late.cancel()


async def test_a_wake_given_to_a_receive_cancelled_meanwhile_goes_to_the_next() -> None:
    polls = LongPolls()
    doomed, next_one = [await waiting(polls, "q", w) for w in ("a", "b")]
    polls.wake_one("q", anyone)
    doomed.cancel()  # its client went away in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert await next_one == 2


async def test_a_wait_that_times_out_is_forgotten_and_watchers_hear_every_change() -> None:
    polls = LongPolls()
    assert await polls.wait("q", "a", "", 0.01) is None
    assert "q" not in polls
    watcher = asyncio.create_task(polls.watch("q", 5.0))
    await asyncio.sleep(0)
    assert "q" in polls
    polls.wake_one("q", anyone)  # no receive waiting: the watcher is woken all the same
    assert await watcher is True
    assert await polls.watch("q", 0.01) is False


# ------------------------------------------------------------------------------ a real QueueService
@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[QueueService]:
    service = QueueService(tmp_path)
    await service.start()
    await service.create_queue("q")
    try:
        yield service
    finally:
        await service.close()


async def until_waiting(service: QueueService, queue: str) -> None:
    for _ in range(200):
        if service.has_waiters(queue):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"no long poll waiting on {queue}")


async def test_one_send_wakes_one_of_many_waiting_receives(service: QueueService) -> None:
    polls: list[str] = []
    poll = service.supervisor.poll

    def counted(*args: object, **kwargs: object) -> object:
        polls.append(str(args[3]))  # the worker
        return poll(*args, **kwargs)  # type: ignore[arg-type]

    service.supervisor.poll = counted  # type: ignore[method-assign]
    receives = [asyncio.create_task(service.receive("q", 1, 30.0, f"w{i}", wait=5.0)) for i in range(8)]
    await until_waiting(service, "q")
    await asyncio.sleep(0.02)
    assert len(polls) == 8  # each looked once, found nothing, waits
    await service.send("q", [SendRequest(b"one", group="g")])
    done, pending = await asyncio.wait(receives, timeout=2.0, return_when=asyncio.FIRST_COMPLETED)
    (winner,) = done
    assert [r.body for r in winner.result()] == [b"one"]
    await asyncio.sleep(0.05)
    # One woken, it took the message, passed the wake on: nobody may take anything, so no one else looked.
    assert len(polls) == 9 and all(not r.done() for r in pending)
    # A same-group message is not deliverable while "one" is claimed: its send wakes nobody who polls.
    await service.send("q", [SendRequest(b"two", group="g")])
    await asyncio.sleep(0.05)
    assert len(polls) == 9 and all(not r.done() for r in pending)
    # Its ack frees the group: exactly one more receive gets "two".
    (delivery,) = [r.delivery for r in winner.result()]
    await service.ack("q", [(delivery.message_id, delivery.token)], holder=f"w{receives.index(winner)}")
    done, pending = await asyncio.wait(pending, timeout=2.0, return_when=asyncio.FIRST_COMPLETED)
    assert [[r.body for r in task.result()] for task in done] == [[b"two"]]
    # Sends of three groups at once: three receives (of one message each) get one each, the chain passing
    # the wake along.
    await service.send("q", [SendRequest(b"x%d" % i, group=f"h{i}") for i in range(3)])
    got: list[bytes] = []
    for _ in range(100):
        got = sorted(r.body for task in pending if task.done() for r in task.result())
        if len(got) == 3:
            break
        await asyncio.sleep(0.01)
    assert got == [b"x0", b"x1", b"x2"]
    service.stop_waiting()
    await asyncio.gather(*receives)


@pytest.mark.parametrize("seed", range(5))
async def test_no_receive_waits_while_something_is_ready_for_it(service: QueueService, seed: int) -> None:
    """Twelve workers, each with one batch at a time (receive, later ack or release it all, receive again);
    random sends of up to four groups at once (some in flight), batches ended, receives given up by their
    clients. Whenever things settle, either nothing is ready or no receive is waiting: a wake lost on the
    way (given to a receive that went away, or a chain that stopped early) would leave an idle worker
    waiting beside a ready group until its wait ended."""
    rng = random.Random(seed)
    busy: dict[str, list[Received]] = {}  # worker -> the batch it holds
    receives: dict[asyncio.Task[list[Received]], str] = {}

    def poll(worker: str) -> None:
        receive = service.receive("q", rng.randint(1, 2), 30.0, worker, wait=10.0)
        receives[asyncio.create_task(receive)] = worker

    def collect() -> None:
        for task in [t for t in receives if t.done()]:
            worker = receives.pop(task)
            if task.cancelled() or not task.result():
                poll(worker)  # the client polls again
            else:
                busy[worker] = task.result()

    for n in range(12):
        poll(f"w{n}")
    idle_checks = 0  # checks with a worker waiting (the test must not pass because all were busy)
    for step in range(300):
        action = rng.random()
        if action < 0.3:
            count = rng.randint(1, 4)
            await service.send(
                "q", [SendRequest(b"%d.%d" % (step, i), group=f"g{rng.randrange(8)}") for i in range(count)]
            )
        elif action < 0.9 and busy:
            worker = rng.choice(list(busy))
            items = [(r.delivery.message_id, r.delivery.token) for r in busy.pop(worker)]
            ends = service.ack if rng.random() < 0.8 else service.release
            await ends("q", items, holder=worker)
            poll(worker)
        elif receives:
            rng.choice(list(receives)).cancel()  # its client went away (and comes back)
        await asyncio.sleep(0)
        collect()
        if step % 10 == 9:
            for _ in range(3):  # settle: every wake handed on has been acted upon
                await asyncio.sleep(0.01)
                collect()
            waiting = sorted(w for t, w in receives.items() if not t.done())
            assert not (service.core.queue("q").has_ready("") and waiting), (step, waiting)
            idle_checks += bool(waiting)
    assert idle_checks >= 10
    service.stop_waiting()
    await asyncio.gather(*receives, return_exceptions=True)


async def test_a_donor_acking_its_last_claim_of_a_handed_over_group_is_answered_at_once(
    service: QueueService,
) -> None:
    """The donor's waiting long poll answers with its export request as soon as its claim ends, even with
    another worker waiting ahead of it (which the group, held for its state, cannot go to yet)."""
    state = Capabilities(state=True)
    await service.send("q", [SendRequest(b"m1", group="g")])
    (claimed,) = await service.receive("q", 10, 30.0, "D", capabilities=state)
    assert (await service.hand_over("q", ["g"], "D"))[0] == ["g"]
    other = asyncio.create_task(service.receive("q", 10, 30.0, "W", wait=10.0))  # the oldest waiter
    await until_waiting(service, "q")
    donor = asyncio.create_task(service.receive("q", 10, 30.0, "D", wait=10.0, capabilities=state))
    await asyncio.sleep(0.05)
    await service.ack("q", [(claimed.delivery.message_id, claimed.delivery.token)], holder="D")
    assert service.export_requests("q", "D") == ["g"]
    assert await asyncio.wait_for(donor, 2.0) == []  # answered at once (its wait was 10 s): it exports
    assert not other.done()
    service.stop_waiting()
    assert await other == []
