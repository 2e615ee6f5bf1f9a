"""The retry workflow of QueueCore beside a reference model, driven by hypothesis (issue 12 item 5).

tests/test_core_stateful.py checks delivery order, claims and tokens; this machine adds what happens
after an attempt: `report` (succeeded / failed / partial / not_attempted, with tokens and a holder),
expired claims counted as failures, retry backoff, same-worker reservations and their timeout,
exclusion of workers that failed a message while others poll, `max_attempts` with each `on_exhausted`
(park, dead-letter the message, dead-letter the group), `max_receive_count` to the dead-letter queue,
release and redrive of groups, and fencing a worker (its reservations forgotten, its claims released).

The model states docs/failure-management.md §1-2 on its own terms: per group a list of message ids in
send order, per message its receive count, newest token, claim expiry, backoff and attempt history
(attempts, failures, failed workers, parked, reservation), plus the dead-letter queue's contents. It
never calls the core. After every step the invariants compare the two and check the rules that matter
to users: nothing lost, one claim per group, group order, parked groups and backoffs deliver nothing,
reservations go to their worker only.

Further machines: fixed retry profiles (park only; each on_exhausted with a dead-letter queue;
max_receive_count), opt-in per worker through the supervisor's poll (a plain client's lapse is an
ordinary redelivery), and the latter on a real SqliteStore with restarts. The two defects the model found
(a renew recreating the claim of a message in its retry backoff; a restart forgetting who holds an ended
claim) are fixed; their minimal examples stay at the end as regression tests.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support import T0

from queue_core.machine import NotFound, QueueCore, SendRequest, SendResult
from queue_core.machine.inputs import AttemptResult

try:  # issue 12's supervisor: polls (with the worker's declaration) go through it when it exists
    from queue_core.machine.capabilities import PLAIN, SDK
    from queue_core.machine.supervisor import Supervisor
except ImportError:  # pragma: no cover - an older core: the opt-in machine is left out
    Supervisor = None  # type: ignore[assignment,misc]
try:
    from queue_core.store import SqliteStore
except ImportError:  # pragma: no cover - without the store the restart machine is left out
    SqliteStore = None  # type: ignore[assignment,misc]

Q = "q"
DLQ = "dlq"
GROUPS = ["A", "B", "C"]
WORKERS = ["w1", "w2", "w3"]
VISIBILITY = 4.0  # the queue's visibility_timeout: also how long a reserved retry waits for its worker
BACKOFF_MAX = 4.0
POLLER_WINDOW = 60.0  # a worker that received within this many seconds counts as polling
OUTCOMES = ["failed", "failed", "partial", "succeeded", "succeeded", "not_attempted"]


# ------------------------------------------------------------------------------------ the reference
@dataclass
class History:
    attempts: int = 0  # failed attempts ever
    failures: int = 0  # the retry budget used (release and redrive reset it)
    last_outcome: str = ""
    failed_workers: tuple[str, ...] = ()
    exclude: bool = False  # same-worker retries used up: its failed workers wait while others poll
    parked: bool = False
    reserved_for: str = ""  # the worker a retry waits for ("" once anyone may take it)
    reserve_until: float = 0.0

    def reset_budget(self) -> None:
        self.failures = 0
        self.failed_workers = ()
        self.exclude = False
        self.parked = False
        self.reserved_for = ""
        self.reserve_until = 0.0


@dataclass
class Msg:
    id: str
    order: int  # position in the send order (= receipt key order)
    group: str
    rc: int = 0  # receive count
    token: int = 0  # newest claim token on it (0: never delivered)
    expires: float = 0.0  # claim expiry (0: not claimed)
    available_at: float = 0.0  # end of a retry backoff (0: available)
    history: History | None = None
    origin: str | None = None  # the queue it was dead-lettered from
    row_worker: str = ""  # the worker its newest claim by a receive went to (the store's claim row)


@dataclass
class Group:
    ids: list[str] = field(default_factory=list)  # in send order
    floor: int = 0  # newest token issued for the group
    worker: str = ""  # who got the newest claim
    claimed: list[str] = field(default_factory=list)  # the live claim's messages, in the order they joined


@dataclass
class Config:
    retry_same_worker: int
    retry_backoff: float
    max_attempts: int
    max_receive_count: int
    dead_letter: bool  # whether the queue names a dead-letter queue
    on_exhausted: dict[str, str]  # group -> its policy's on_exhausted

    def backoff(self, failures: int) -> float:
        """Docs: the retry waits retry_backoff, doubling per failure, capped at retry_backoff_max."""
        if self.retry_backoff <= 0 or failures < 1:
            return 0.0
        return min(self.retry_backoff * 2.0 ** (failures - 1), BACKOFF_MAX)


class Model:
    def __init__(self, config: Config, opt_in: bool) -> None:
        self.config = config
        self.opt_in = opt_in
        self.participants: set[str] = set()  # workers whose latest poll declared `results`
        self.now = T0
        self.msgs: dict[str, Msg] = {}  # every message still in q or the DLQ
        self.queues: dict[str, dict[str, Group]] = {Q: {}, DLQ: {}}
        self.where: dict[str, str] = {}  # id -> Q | DLQ
        self.deleted: set[str] = set()
        self.pollers: dict[str, float] = {}
        self.events: list[str] = []  # what happened in the current step, for hypothesis' statistics

    def participates(self, worker: str) -> bool:
        """Failure management is opt-in per worker (issue 12): without opt-in everyone takes part."""
        return not self.opt_in or worker in self.participants

    # -------------------------------------------------------------------------------- structure
    def group_of(self, message_id: str) -> Group:
        msg = self.msgs[message_id]
        return self.queues[self.where[message_id]][msg.group]

    def add(self, msg: Msg, queue: str) -> Group:
        group = self.queues[queue].setdefault(msg.group, Group())
        group.ids.append(msg.id)
        group.ids.sort(key=lambda i: self.msgs[i].order)
        self.where[msg.id] = queue
        return group

    def take_out(self, message_id: str) -> None:
        """Out of its group and claim; an emptied group is forgotten (its floor with it)."""
        msg = self.msgs[message_id]
        queue = self.where.pop(message_id)
        group = self.queues[queue][msg.group]
        group.ids.remove(message_id)
        if message_id in group.claimed:
            group.claimed.remove(message_id)
        msg.expires = 0.0
        msg.available_at = 0.0
        if not group.ids:
            del self.queues[queue][msg.group]

    def delete(self, message_id: str) -> None:
        self.take_out(message_id)
        del self.msgs[message_id]
        self.deleted.add(message_id)

    def live(self, message_id: str) -> bool:
        return self.msgs[message_id].expires > 0

    def end_claim(self, message_id: str) -> None:
        self.msgs[message_id].expires = 0.0
        self.group_of(message_id).claimed.remove(message_id)

    # ------------------------------------------------------------------------------ dead letters
    def dead_letter_queue(self) -> bool:
        return self.config.dead_letter

    def to_dlq(self, ids: list[str]) -> None:
        """Dead-lettered: id, order, token and history kept, claim and backoff and reservation not."""
        for message_id in ids:
            msg = self.msgs[message_id]
            self.take_out(message_id)
            msg.origin = Q
            if msg.history is not None:
                msg.history.reserved_for = ""
            group = self.add(msg, DLQ)
            group.floor = max(group.floor, msg.token)
            self.events.append("dead-lettered")

    def over_receive_count(self, msg: Msg) -> bool:
        mrc = self.config.max_receive_count
        return bool(mrc) and msg.rc >= mrc and self.dead_letter_queue()

    # -------------------------------------------------------------------------------- attempts
    def failed(self, message_id: str, worker: str, outcome: str, *, expired: bool = False) -> None:
        """A failed attempt (its claim has ended): count it, then exhaust, dead-letter, or back off."""
        msg = self.msgs[message_id]
        history = msg.history = msg.history or History()
        history.attempts += 1
        history.failures += 1
        history.last_outcome = outcome
        if worker not in history.failed_workers:
            history.failed_workers = (*history.failed_workers, worker)
        config = self.config
        history.exclude = history.failures > config.retry_same_worker
        history.reserved_for = ""
        if config.max_attempts and history.failures >= config.max_attempts:
            self.exhausted(msg)
        elif self.over_receive_count(msg):
            self.to_dlq([message_id])
        elif not expired:  # an expired claim's wait was the visibility timeout: no backoff, no reservation
            delay = config.backoff(history.failures)
            if delay > 0:
                msg.available_at = self.now + delay
            if not history.exclude and self.participates(worker):  # reserved only among participants
                history.reserved_for = worker
                history.reserve_until = (msg.available_at or self.now) + VISIBILITY

    def exhausted(self, msg: Msg) -> None:
        assert msg.history is not None
        action = self.config.on_exhausted[msg.group]
        if not self.dead_letter_queue():
            action = "park"  # never dropped
        self.events.append(f"exhausted: {action}")
        if action == "park":
            msg.history.parked = True
        elif action == "dead_letter_message":
            self.to_dlq([msg.id])
        else:
            self.to_dlq(list(self.queues[Q][msg.group].ids))

    def not_attempted(self, message_id: str) -> None:
        msg = self.msgs[message_id]
        self.end_claim(message_id)
        msg.rc = max(0, msg.rc - 1)

    def unclaim(self, message_id: str) -> None:
        """A release (or a receive with ttl 0): no attempt counted; dead-lettered at max receive count."""
        self.end_claim(message_id)
        if self.over_receive_count(self.msgs[message_id]):
            self.to_dlq([message_id])

    # ---------------------------------------------------------------------------------------- time
    def advance(self, now: float) -> None:
        self.now = now
        for group in list(self.queues[Q].values()):
            worker = group.worker
            expired = [i for i in group.claimed if self.msgs[i].expires <= now]
            if not self.participates(worker):
                # A plain client's lapse is an ordinary redelivery, as in SQS: no attempt counted, no
                # backoff, no reservation (max_receive_count still applies, the receive count went up).
                for message_id in expired:
                    self.events.append("plain client's claim lapsed")
                    self.unclaim(message_id)
                continue
            for message_id in expired:
                self.end_claim(message_id)
            for message_id in expired:
                if self.where.get(message_id) == Q:  # dead-lettered with its group just now: not counted
                    self.events.append("claim expired")
                    self.failed(message_id, worker, "expired", expired=True)
        for msg in self.msgs.values():
            if msg.available_at and msg.available_at <= now:
                msg.available_at = 0.0
            history = msg.history
            if history is not None and history.reserved_for and history.reserve_until <= now:
                history.reserved_for = ""
                self.events.append("reservation timed out")

    def restart(self, downtime: float) -> None:
        """What survives a restart (docs/failure-management.md §1-2 "Store"): messages, receive counts,
        attempt histories (parked, failures, failed workers), backoffs still running, policies and
        participants. Not kept: reservations (any worker may take the retry), who polled lately, and
        claims that ran out while the server was down (not counted). Tokens come back from the rows of
        delivered messages (receive count above 0), floors as the newest of them, and a group's claim
        worker as the worker of that newest row, whether its claim is live or ended."""
        self.now += downtime
        self.pollers.clear()
        for queue in self.queues.values():
            for group in queue.values():
                for message_id in [i for i in group.claimed if self.msgs[i].expires <= self.now]:
                    self.end_claim(message_id)
                    self.events.append("claim ran out while down")
                for message_id in group.ids:
                    msg = self.msgs[message_id]
                    if msg.history is not None:
                        if msg.history.reserved_for:
                            self.events.append("restart forgot a reservation")
                        msg.history.reserved_for = ""
                        if msg.history.parked:
                            self.events.append("parked across a restart")
                    if msg.available_at and msg.available_at <= self.now:
                        msg.available_at = 0.0
                    elif msg.available_at:
                        self.events.append("backoff across a restart")
                    if not msg.rc:
                        msg.token = 0
                group.floor = max((self.msgs[i].token for i in group.ids), default=0)
                # Claims are restored from rows, in key order.
                group.claimed.sort(key=lambda i: self.msgs[i].order)
                # The group's worker is who got the claim of the newest token the rows still hold, live
                # or ended (docs: claims): a late ack of one's own expired claim works after a restart.
                delivered = [i for i in group.ids if self.msgs[i].token]
                newest = max(delivered, key=lambda i: self.msgs[i].token, default=None)
                group.worker = self.msgs[newest].row_worker if newest is not None else ""

    # ------------------------------------------------------------------------------------ delivery
    def others_polling(self, history: History) -> bool:
        return any(
            at >= self.now - POLLER_WINDOW and w not in history.failed_workers
            for w, at in self.pollers.items()
        )

    def takeable(self, worker: str) -> list[str]:
        """Groups `worker` may claim now, oldest head first: nothing claimed, the head out of its backoff,
        not parked, not reserved for another worker, and not excluding this worker while others poll."""
        out: list[tuple[int, str]] = []
        for name, group in self.queues[Q].items():
            if group.claimed:
                continue
            head = self.msgs[group.ids[0]]
            history = head.history
            if head.available_at:
                continue
            if history is not None:
                if history.parked or history.reserved_for not in ("", worker):
                    continue
                if history.exclude and worker in history.failed_workers and self.others_polling(history):
                    self.events.append("excluded a worker that failed it")
                    continue
            out.append((head.order, name))
        return [name for _, name in sorted(out)]

    def plan(self, worker: str, limit: int) -> list[tuple[str, list[str]]]:
        """What a receive delivers: whole claimable prefixes of the oldest groups, up to `limit`."""
        batches: list[tuple[str, list[str]]] = []
        taken = 0
        for name in self.takeable(worker):
            if taken >= limit:
                break
            ids: list[str] = []
            for message_id in self.queues[Q][name].ids:
                msg = self.msgs[message_id]
                if taken + len(ids) >= limit or msg.available_at:
                    break
                if msg.history is not None and msg.history.parked:
                    break
                ids.append(message_id)
            batches.append((name, ids))
            taken += len(ids)
        return batches

    def claim(self, worker: str, name: str, ids: list[str], token: int, ttl: float) -> None:
        group = self.queues[Q][name]
        head = self.msgs[group.ids[0]].history
        if head is not None and head.reserved_for == worker:
            head.reserved_for = ""  # the retry is taken
            self.events.append("reserved retry taken by its worker")
        group.floor = token
        group.worker = worker
        group.claimed = list(ids)
        for message_id in group.ids:
            msg = self.msgs[message_id]
            if message_id in ids:
                msg.token = token
                msg.expires = self.now + ttl
                msg.rc += 1
                msg.row_worker = worker
            elif msg.token:  # a new claim supersedes every earlier delivery in the group
                msg.token = token

    # ------------------------------------------------------------------------------- permissions
    def status(self, message_id: str, token: int | None, holder: str | None) -> str:
        """ack/renew/release/report: only the newest claim's token, and only the worker it went to."""
        if message_id not in self.msgs or self.where[message_id] != Q:
            return "gone"
        msg = self.msgs[message_id]
        group = self.group_of(message_id)
        if token is not None and not (token == msg.token == group.floor):
            return "stale_claim"
        if holder is not None and not (msg.token and msg.token == group.floor and group.worker == holder):
            return "stale_claim"
        return "ok"


# ------------------------------------------------------------------------------------------ the test
@dataclass
class Issued:
    """A claim the core issued, as its worker saw it."""

    worker: str
    group: str
    token: int
    ids: list[str]


def pick(data: st.DataObject, options: list[Any], label: str) -> Any:
    return data.draw(st.sampled_from(options), label=label)


class RetryMachine(RuleBasedStateMachine):
    profile: Config | None = None  # a fixed configuration; None: drawn per example
    opt_in = False  # QueueCore(opt_in=True): only workers that declared `results` take part
    durable = False  # effects go to a real SqliteStore, and a restart rule restores from it
    store: Any = None
    tmp: Path | None = None

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[Issued] = []
        self.sent: set[str] = set()
        self.max_token = 0
        self.counter = 0

    @initialize(
        same_worker=st.sampled_from([0, 1, 2]),
        backoff=st.sampled_from([0.0, 1.0]),
        max_attempts=st.sampled_from([0, 2, 2, 3]),
        max_receive_count=st.sampled_from([0, 3, 5]),
        dead_letter=st.booleans(),
        on_exhausted=st.lists(
            st.sampled_from(["park", "dead_letter_message", "dead_letter_group"]),
            min_size=len(GROUPS),
            max_size=len(GROUPS),
        ),
    )
    def configure(
        self,
        same_worker: int,
        backoff: float,
        max_attempts: int,
        max_receive_count: int,
        dead_letter: bool,
        on_exhausted: list[str],
    ) -> None:
        config = Config(
            same_worker,
            backoff,
            max_attempts,
            max_receive_count,
            dead_letter,
            dict(zip(GROUPS, on_exhausted, strict=True)),
        )
        if self.profile is not None:
            config = self.profile
        self.model = Model(config, self.opt_in)
        if self.durable:
            self.tmp = Path(tempfile.mkdtemp(prefix="strictq-retry-"))
            self.store = SqliteStore(self.tmp / "queue.db")
            self.open_core()
        else:
            self.core = QueueCore(opt_in=True) if self.opt_in else QueueCore()
            self.supervisor = Supervisor(self.core) if Supervisor is not None else None
        now = self.model.now
        self.core.create_queue(DLQ, now)
        attributes: dict[str, Any] = {
            "visibility_timeout": VISIBILITY,
            "retry_same_worker": config.retry_same_worker,
            "retry_backoff": config.retry_backoff,
            "retry_backoff_max": BACKOFF_MAX,
            "max_attempts": config.max_attempts,
            "max_receive_count": config.max_receive_count,
        }
        if config.dead_letter:
            attributes["dead_letter_queue"] = DLQ
        self.core.create_queue(Q, now, attributes)
        for group, action in config.on_exhausted.items():
            self.core.set_group_policy(Q, group, {"on_exhausted": action}, now)
        if self.profile is None:
            event(f"config: same_worker={same_worker} backoff={backoff} max_attempts={max_attempts}")
            event(f"config: max_receive_count={max_receive_count} dead_letter={dead_letter}")
        self.step_done()

    def open_core(self) -> None:
        """Open the store (the epoch goes up) and restore a fresh core from what it kept."""
        epoch, snapshot = self.store.open(self.model.now)
        self.core = QueueCore(epoch=epoch, opt_in=self.opt_in)
        self.core.restore(snapshot, self.model.now)
        self.supervisor = Supervisor(self.core) if Supervisor is not None else None

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def step_done(self) -> None:
        effects = self.core.drain_effects()
        if self.store is not None:
            self.store.apply(effects)
        for name in set(self.model.events):
            event(name)
        self.model.events.clear()

    def _issued_with_present(self) -> list[Issued]:
        return [c for c in self.issued if any(i in self.model.msgs for i in c.ids)]

    # ----------------------------------------------------------------------------------------- rules
    @rule(group=st.sampled_from(GROUPS), count=st.integers(1, 3))
    def send(self, group: str, count: int) -> None:
        requests = []
        for _ in range(count):
            self.counter += 1
            requests.append(
                SendRequest(f"m{self.counter}".encode(), group=group, message_id=f"m{self.counter}")
            )
        results = self.core.send(Q, requests, self.model.now)
        for request, result in zip(requests, results, strict=True):
            assert isinstance(result, SendResult) and not result.duplicate, result
            assert result.message_id == request.message_id
            msg = Msg(result.message_id, len(self.sent), group)
            self.model.msgs[msg.id] = msg
            self.model.add(msg, Q)
            self.sent.add(msg.id)
        self.step_done()

    @rule(
        worker=st.sampled_from(WORKERS),
        limit=st.integers(1, 4),
        ttl=st.sampled_from([0.0, 2.0, 5.0, 10.0]),
        plain=st.booleans(),
    )
    def receive(self, worker: str, limit: int, ttl: float, plain: bool) -> None:
        """A poll; with opt-in, `plain` is a client that never declared anything (boto3, curl)."""
        self.do_receive(worker, limit, ttl, plain=plain)
        self.step_done()

    @rule(data=st.data(), rounds=st.integers(1, 6), limit=st.integers(1, 3))
    def attempts(self, data: st.DataObject, rounds: int, limit: int) -> None:
        """Workers' turns in a row: receive, report results for the first claim, let a little time pass.
        Failures repeat quickly this way, which is how backoffs, reservations, exclusion, exhaustion and
        dead letters are reached within a few steps."""
        for _ in range(rounds):
            worker = pick(data, WORKERS, "worker")
            plain = self.opt_in and pick(data, [False, False, True], "plain")
            claims = self.do_receive(worker, limit, pick(data, [5.0, 10.0], "ttl"), plain=plain)
            self.step_done()
            if claims:
                self.do_report(data, claims[0], claims[0].ids)
                self.step_done()
            self.advance(pick(data, [0.0, 0.5, 1.0, 2.0, 4.0], "dt"))

    def do_receive(self, worker: str, limit: int, ttl: float, *, plain: bool = False) -> list[Issued]:
        model = self.model
        issued: list[Issued] = []
        if self.opt_in:  # the poll's declaration counts from this poll on, until one declares otherwise
            if plain:
                model.participants.discard(worker)
            else:
                model.participants.add(worker)
        model.pollers[worker] = model.now
        expected = model.plan(worker, limit)
        if self.supervisor is not None:
            capabilities = PLAIN if plain else SDK
            poll = self.supervisor.poll(Q, limit, ttl, worker, capabilities, model.now)
            assert poll.probe is None and not poll.held  # no health monitor: nothing holds a poll
            got = poll.deliveries
        else:
            got = self.core.receive(Q, limit, ttl, worker, model.now)
        assert [(d.group, d.message_id) for d in got] == [(g, i) for g, ids in expected for i in ids], (
            worker,
            expected,
        )
        for name, ids in expected:
            deliveries = [d for d in got if d.group == name]
            (token,) = {d.token for d in deliveries}  # one claim per group per receive
            assert token > self.max_token  # fencing tokens strictly increase
            self.max_token = token
            group = model.queues[Q][name]
            assert not group.claimed  # never two claims of one group at once
            assert group.ids[: len(ids)] == ids  # in order: no earlier message of the group left out
            head = model.msgs[ids[0]]
            history = head.history
            assert not head.available_at  # nothing before its backoff ends
            assert history is None or not history.parked  # a parked group delivers nothing
            assert history is None or history.reserved_for in ("", worker)  # a reserved retry: its worker's
            model.claim(worker, name, ids, token, ttl)
            for delivery in deliveries:
                msg = model.msgs[delivery.message_id]
                assert delivery.receive_count == msg.rc  # the attempt number
                seen = msg.history.attempts if msg.history is not None else 0
                assert (delivery.history or {}).get("attempts", 0) == seen
                if seen:
                    event("delivered with history")
            issued.append(Issued(worker, name, token, ids))
        self.issued.extend(issued)
        if ttl == 0:  # SQS VisibilityTimeout=0: claimed and visible again at once, no attempt counted
            for _, ids in expected:
                for message_id in ids:
                    if model.where.get(message_id) == Q and model.live(message_id):
                        model.unclaim(message_id)
        event(f"receive: {len(got)} message(s)")
        return issued

    def _token(self, data: st.DataObject, claim: Issued, message_id: str) -> int:
        use = pick(data, ["claim", "claim", "claim", "floor", "older"], "token")
        if use == "floor" and message_id in self.model.msgs and self.model.where[message_id] == Q:
            return self.model.group_of(message_id).floor
        if use == "older":
            older = [c.token for c in self.issued if c.group == claim.group and c.token < claim.token]
            if older:
                return int(pick(data, older, "older token"))
        return claim.token

    def _holder(self, data: st.DataObject, claim: Issued) -> tuple[str, str | None]:
        """(worker, holder): mostly the claim's own worker; sometimes another worker posing as the
        holder, or an unnamed holder (a face that proved the claim otherwise)."""
        who = pick(data, ["own", "own", "own", "other", "none"], "holder")
        if who == "other":
            other = pick(data, [w for w in WORKERS if w != claim.worker], "other worker")
            return other, other
        if who == "none":
            return claim.worker, None
        return claim.worker, claim.worker

    @precondition(lambda self: self._issued_with_present())
    @rule(data=st.data())
    def report(self, data: st.DataObject) -> None:
        """A worker reports attempt results for some messages of one of its claims."""
        claim = pick(data, self._issued_with_present(), "claim")
        present = [i for i in claim.ids if i in self.model.msgs]
        ids = data.draw(st.lists(st.sampled_from(present), min_size=1, unique=True), label="items")
        self.do_report(data, claim, ids)
        self.step_done()

    def do_report(self, data: st.DataObject, claim: Issued, ids: list[str]) -> None:
        model = self.model
        worker, holder = self._holder(data, claim)
        results = [
            AttemptResult(i, self._token(data, claim, i), pick(data, OUTCOMES, "outcome"), "boom", "sig")
            for i in ids
        ]
        expected = self.expect_report(worker, holder, results)
        api = self.supervisor or self.core
        outcomes = api.report(Q, worker, results, model.now, holder=holder)
        assert [(o.message_id, o.status) for o in outcomes] == [
            (r.message_id, s) for r, s in zip(results, expected, strict=True)
        ]
        for result, status in zip(results, expected, strict=True):
            event(f"report {result.outcome}: {status}")

    def expect_report(self, worker: str, holder: str | None, results: list[AttemptResult]) -> list[str]:
        """docs/failure-management.md §1 applied to the model; returns each item's status."""
        model = self.model
        statuses = [""] * len(results)
        batches: dict[str, list[tuple[int, AttemptResult]]] = {}
        for index, result in enumerate(results):
            status = model.status(result.message_id, result.token, holder)
            if status == "ok" and result.outcome != "succeeded" and not model.live(result.message_id):
                status = "not_in_flight"  # its claim ended (an expiry was already counted for it)
            if status == "ok":
                batches.setdefault(model.msgs[result.message_id].group, []).append((index, result))
            statuses[index] = status
        for name, items in batches.items():
            items.sort(key=lambda item: model.msgs[item[1].message_id].order)
            if self.out_of_order(name, [r for _, r in items]):
                for index, _ in items:
                    statuses[index] = "out_of_order"
                continue
            succeeded = [r.message_id for _, r in items if r.outcome == "succeeded"]
            for message_id in succeeded:
                model.delete(message_id)
            first_failure: Msg | None = None
            for index, result in items:
                if result.outcome == "succeeded":
                    continue
                message_id = result.message_id
                if model.where.get(message_id) != Q:
                    statuses[index] = "gone"  # dead-lettered with its group by this very batch
                    continue
                if not model.live(message_id):  # put back as not attempted after an earlier failure
                    continue
                if result.outcome == "not_attempted":
                    model.not_attempted(message_id)
                    continue
                msg = model.msgs[message_id]
                model.end_claim(message_id)
                model.failed(message_id, worker, result.outcome)
                if first_failure is None:
                    first_failure = msg
            if first_failure is not None and name in model.queues[Q]:
                # The claim ends: its later messages cannot be processed in order now.
                group = model.queues[Q][name]
                for message_id in list(group.claimed):
                    if model.msgs[message_id].order > first_failure.order:
                        model.not_attempted(message_id)
        return statuses

    def out_of_order(self, name: str, items: list[AttemptResult]) -> bool:
        """A success may follow no non-success of its group in the batch, nor pass an earlier message of
        the group that waits outside any claim."""
        model = self.model
        blocked = False
        for result in items:
            if result.outcome != "succeeded":
                blocked = True
            elif blocked:
                return True
        succeeded = {r.message_id for r in items if r.outcome == "succeeded"}
        if not succeeded:
            return False
        last = max(model.msgs[i].order for i in succeeded)
        for message_id in model.queues[Q][name].ids:
            if model.msgs[message_id].order >= last:
                break
            if message_id not in succeeded and not model.live(message_id):
                return True
        return False

    @precondition(lambda self: self._issued_with_present())
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        model = self.model
        claim = pick(data, self._issued_with_present(), "claim")
        message_id = pick(data, [i for i in claim.ids if i in model.msgs], "message")
        _, holder = self._holder(data, claim)
        token: int | None = self._token(data, claim, message_id)
        if holder is None and data.draw(st.booleans(), label="operator delete"):
            token = None  # neither token nor holder: an operator's delete by id
        expected = model.status(message_id, token, holder)
        (outcome,) = self.core.ack(Q, [(message_id, token)], model.now, holder=holder)
        assert outcome.status == expected, (outcome, expected)
        if expected == "ok":
            model.delete(message_id)
        event(f"ack: {expected}")
        self.step_done()

    @precondition(lambda self: self._issued_with_present())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """A worker hands messages of its claim back (EmoDB renew ttl=0): no attempt counted."""
        model = self.model
        claim = pick(data, self._issued_with_present(), "claim")
        present = [i for i in claim.ids if i in model.msgs]
        ids = data.draw(st.lists(st.sampled_from(present), min_size=1, unique=True), label="items")
        _, holder = self._holder(data, claim)
        items = [(i, self._token(data, claim, i)) for i in ids]
        expected = [model.status(i, t, holder) for i, t in items]
        outcomes = self.core.release(Q, items, model.now, holder=holder)
        assert [o.status for o in outcomes] == expected
        for (message_id, _), status in zip(items, expected, strict=True):
            if status == "ok" and model.where.get(message_id) == Q and model.live(message_id):
                model.unclaim(message_id)
            event(f"release: {status}")
        self.step_done()

    @precondition(lambda self: self._issued_with_present())
    @rule(data=st.data(), ttl=st.sampled_from([2.0, 8.0]), mode=st.sampled_from(["extend", "set"]))
    def renew(self, data: st.DataObject, ttl: float, mode: str) -> None:
        """Extend or set a claim; `extend` recreates an expired claim nobody superseded."""
        model = self.model
        claim = pick(data, self._issued_with_present(), "claim")
        candidates = [i for i in claim.ids if i in model.msgs]
        message_id = pick(data, candidates, "message")
        _, holder = self._holder(data, claim)
        token = self._token(data, claim, message_id)
        expected = model.status(message_id, token, holder)
        if expected == "ok" and not model.live(message_id):
            msg = model.msgs[message_id]
            in_backoff = bool(msg.available_at)  # its attempt ended with a reported failure
            if mode == "set" or not msg.token or msg.token != model.group_of(message_id).floor or in_backoff:
                expected = "not_in_flight"
        (outcome,) = self.core.renew(Q, [(message_id, token)], ttl, model.now, mode=mode, holder=holder)  # type: ignore[arg-type]
        assert outcome.status == expected, (outcome, expected)
        if expected == "ok":
            msg = model.msgs[message_id]
            if model.live(message_id):
                new = model.now + ttl
                msg.expires = max(msg.expires, new) if mode == "extend" else new
            else:
                msg.expires = model.now + ttl
                model.group_of(message_id).claimed.append(message_id)
                event("renew recreated an expired claim")
        event(f"renew {mode}: {expected}")
        self.step_done()

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 4.0, 12.0]))
    def time_passes(self, dt: float) -> None:
        self.advance(dt)

    def advance(self, dt: float) -> None:
        self.model.advance(self.model.now + dt)
        self.core.handle_timer(self.model.now)
        self.step_done()

    @rule(worker=st.sampled_from(WORKERS))
    def fence(self, worker: str) -> None:
        """At the core a fence means: the worker's reserved retries go to everyone at once, and every
        claim it holds is released (what the service's release_worker does)."""
        model = self.model
        now = model.now
        self.core.forget_reservations(worker, now)
        for msg in model.msgs.values():
            if msg.history is not None and msg.history.reserved_for == worker:
                msg.history.reserved_for = ""
                event("fence freed a reserved retry")
        queue = self.core.queue(Q)
        items: list[tuple[str, int | None]] = [
            (m.id, g.floor)
            for g in queue.groups.values()
            if g.claimed and g.claim_worker == worker
            for m in g.claimed
        ]
        held = [i for g in model.queues[Q].values() if g.claimed and g.worker == worker for i in g.claimed]
        assert sorted(i for i, _ in items) == sorted(held)
        outcomes = self.core.release(Q, items, now)
        assert all(o.status == "ok" for o in outcomes), outcomes
        for message_id in held:
            if model.where.get(message_id) == Q and model.live(message_id):
                model.unclaim(message_id)
        if held:
            event("fence released claims")
        self.step_done()

    def _interesting_group(self, data: st.DataObject) -> str:
        """Mostly a group with a parked or dead-lettered message; sometimes any (even an absent) one."""
        model = self.model
        held = {
            name
            for name, group in model.queues[Q].items()
            if any((h := model.msgs[i].history) is not None and h.parked for i in group.ids)
        }
        held |= set(model.queues[DLQ])
        if held and data.draw(st.integers(0, 3), label="interesting") > 0:
            return str(pick(data, sorted(held), "group"))
        return str(pick(data, GROUPS, "group"))

    @rule(data=st.data())
    def release_group(self, data: st.DataObject) -> None:
        """An operator lets a (parked) group go on: fresh retry budgets, no backoff, nobody excluded."""
        model = self.model
        group = self._interesting_group(data)
        if group not in model.queues[Q]:
            try:
                self.core.release_group(Q, group, model.now)
            except NotFound:
                event("release_group: no such group")
                self.step_done()
                return
            raise AssertionError(f"release_group of a group the model does not hold: {group}")
        expected = self.model_release_group(group)
        assert self.core.release_group(Q, group, model.now) == expected
        event(f"release_group: {min(expected, 1)} parked released")
        self.step_done()

    def model_release_group(self, group: str) -> int:
        released = 0
        for message_id in self.model.queues[Q][group].ids:
            msg = self.model.msgs[message_id]
            if msg.history is None:
                continue
            released += msg.history.parked
            msg.history.reset_budget()
            msg.available_at = 0.0
        return released

    @rule(data=st.data())
    def redrive(self, data: st.DataObject) -> None:
        """The group's dead-lettered messages come back at its head, in order, as new; then released."""
        model = self.model
        group = self._interesting_group(data)
        restored = 0
        if model.config.dead_letter and group in model.queues[DLQ]:
            for message_id in list(model.queues[DLQ][group].ids):
                msg = model.msgs[message_id]
                if msg.origin != Q or msg.expires:
                    continue
                model.take_out(message_id)
                msg.origin = None
                msg.rc = 0
                if msg.history is not None:
                    msg.history.reset_budget()
                target = model.add(msg, Q)
                target.floor = max(target.floor, msg.token)
                restored += 1
        if group not in model.queues[Q]:
            try:
                self.core.redrive(Q, group, model.now)
            except NotFound:
                event("redrive: nothing there")
                self.step_done()
                return
            raise AssertionError(f"redrive of a group the model does not hold: {group}")
        released = self.model_release_group(group)
        assert self.core.redrive(Q, group, model.now) == (restored, released)
        event(f"redrive: {min(restored, 1)} restored, {min(released, 1)} released")
        self.step_done()

    # ------------------------------------------------------------------------------------ invariants
    @invariant()
    def nothing_lost(self) -> None:
        """Every message sent is in the queue, in the dead-letter queue, or was deleted by an ack or a
        succeeded result; never two of these."""
        if not hasattr(self, "core"):
            return
        in_q = set(self.core.queue(Q).by_id)
        in_dlq = set(self.core.queue(DLQ).by_id)
        assert not in_q & in_dlq
        assert not (in_q | in_dlq) & self.model.deleted
        assert in_q | in_dlq | self.model.deleted == self.sent
        assert in_q == {i for i, q in self.model.where.items() if q == Q}
        assert in_dlq == {i for i, q in self.model.where.items() if q == DLQ}

    @invariant()
    def groups_claims_and_histories_match(self) -> None:
        if not hasattr(self, "core"):
            return
        model = self.model
        for name in (Q, DLQ):
            queue = self.core.queue(name)
            core_groups = {g: [m.id for m in group.messages] for g, group in queue.groups.items()}
            assert core_groups == {g: group.ids for g, group in model.queues[name].items()}, name
            for g, group in queue.groups.items():
                mine = model.queues[name][g]
                assert group.floor == mine.floor, (name, g)
                assert [m.id for m in group.claimed] == mine.claimed, (name, g)
                assert {m.token for m in group.claimed} <= {group.floor}  # one claim per group in flight
                if group.claimed:
                    assert group.claim_worker == mine.worker
                for message in group.messages:
                    msg = model.msgs[message.id]
                    state = (
                        message.receive_count,
                        message.token,
                        message.claim_expires,
                        message.available_at,
                    )
                    assert state == (msg.rc, msg.token, msg.expires, msg.available_at), (
                        message.id,
                        state,
                        msg,
                    )
                    assert message.origin == msg.origin
                    assert _history(message.history) == _model_history(msg.history), message.id

    @invariant()
    def parked_and_counts(self) -> None:
        if not hasattr(self, "core"):
            return
        model = self.model
        parked = sorted(
            name
            for name, group in model.queues[Q].items()
            if any((h := model.msgs[i].history) is not None and h.parked for i in group.ids)
        )
        assert self.core.parked_groups(Q) == parked
        metrics = self.core.metrics(Q, model.now)
        in_q = [m for i, m in model.msgs.items() if model.where[i] == Q]
        assert metrics.in_flight == sum(1 for m in in_q if m.expires)
        assert metrics.delayed == sum(1 for m in in_q if m.available_at)
        assert metrics.total == len(in_q)


def _history(history: Any) -> tuple[Any, ...] | None:
    if history is None:
        return None
    reserved = (history.reserved_for, history.reserve_until if history.reserved_for else 0.0)
    return (
        history.attempts,
        history.failures,
        history.last_outcome,
        tuple(history.failed_workers),
        history.exclude,
        history.parked,
        reserved,
    )


def _model_history(history: History | None) -> tuple[Any, ...] | None:
    if history is None:
        return None
    reserved = (history.reserved_for, history.reserve_until if history.reserved_for else 0.0)
    return (
        history.attempts,
        history.failures,
        history.last_outcome,
        history.failed_workers,
        history.exclude,
        history.parked,
        reserved,
    )


EVERY_ACTION = {"A": "park", "B": "dead_letter_message", "C": "dead_letter_group"}


class ParkMachine(RetryMachine):
    """Exhaustion without a dead-letter queue: every on_exhausted parks (never drops)."""

    profile = Config(1, 1.0, 2, 0, False, EVERY_ACTION)


class DeadLetterMachine(RetryMachine):
    """Exhaustion with a dead-letter queue: each group its own on_exhausted; no backoff, no reservation."""

    profile = Config(0, 0.0, 2, 0, True, EVERY_ACTION)


class ReceiveCountMachine(RetryMachine):
    """No max_attempts: max_receive_count sends messages to the dead-letter queue; two same-worker
    retries with backoff before other workers get a failing message."""

    profile = Config(2, 1.0, 0, 3, True, EVERY_ACTION)


# Bounded for CI and reproducible (derandomize): about 10 s for the four machines together.
SETTINGS = settings(max_examples=120, stateful_step_count=50, deadline=None, derandomize=True)
TestRetryMachine = RetryMachine.TestCase
TestRetryMachine.settings = settings(SETTINGS, max_examples=150)
TestParkMachine = ParkMachine.TestCase
TestParkMachine.settings = SETTINGS
TestDeadLetterMachine = DeadLetterMachine.TestCase
TestDeadLetterMachine.settings = SETTINGS
TestReceiveCountMachine = ReceiveCountMachine.TestCase
TestReceiveCountMachine.settings = SETTINGS

if Supervisor is not None:

    class OptInMachine(RetryMachine):
        """Failure management opt-in per worker (issue 12): polls declare through the supervisor; a plain
        client's lapses are ordinary redeliveries and nothing is reserved for it."""

        opt_in = True
        profile = Config(1, 1.0, 3, 4, True, EVERY_ACTION)

    TestOptInMachine = OptInMachine.TestCase
    TestOptInMachine.settings = SETTINGS

if Supervisor is not None and SqliteStore is not None:

    class RestartMachine(RetryMachine):
        """The opt-in machine on a real SQLite store, restarted now and then: parked groups, attempt
        counts, backoffs, policies and participants survive; reservations and lapses while down do not."""

        opt_in = True
        durable = True
        profile = Config(1, 1.0, 3, 4, True, EVERY_ACTION)

        @rule(downtime=st.sampled_from([0.0, 0.5, 3.0, 12.0]))
        def restart(self, downtime: float) -> None:
            self.step_done()
            self.store.close()
            self.model.restart(downtime)
            self.open_core()
            self.step_done()

    TestRestartMachine = RestartMachine.TestCase
    TestRestartMachine.settings = SETTINGS


# ------------------------------------------------------------- minimal examples of defects the model found
def test_renew_during_a_retry_backoff_keeps_counts() -> None:
    """A reported failure puts the message into its backoff; `extend` then recreates its claim (the
    claim is the newest, nobody superseded it), and a second failure under that claim counts it as
    delayed a second time: `delayed` 2 of 1 message, `visible` -1, for good."""
    now = T0
    core = QueueCore()
    core.create_queue(Q, now, {"visibility_timeout": VISIBILITY, "retry_backoff": 1.0})
    core.send(Q, [SendRequest(b"x", group="A", message_id="m1")], now)
    (delivery,) = core.receive(Q, 1, 5.0, "w1", now)
    failed = AttemptResult("m1", delivery.token, "failed", "boom")
    assert [o.status for o in core.report(Q, "w1", [failed], now, holder="w1")] == ["ok"]
    core.renew(Q, [("m1", delivery.token)], 2.0, now, mode="extend", holder="w1")
    core.report(Q, "w1", [failed], now, holder="w1")
    metrics = core.metrics(Q, now)
    assert (metrics.total, metrics.delayed, metrics.in_flight) == (1, 1, 0), metrics
    assert metrics.visible == 0, metrics


def test_restart_keeps_the_holder_of_an_ended_claim(tmp_path: Path) -> None:
    """docs/failure-management.md: with a holder, the newest claim must have gone to that worker,
    "whether or not it is still live (a late ack of an expired claim nobody took since still works)".
    Across a restart it does not: the restore takes the claim worker only from live claim rows."""
    if SqliteStore is None:  # pragma: no cover
        return
    store = SqliteStore(tmp_path / "queue.db")
    now = T0
    epoch, snapshot = store.open(now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, now)
    core.create_queue(Q, now, {"visibility_timeout": VISIBILITY})
    core.send(Q, [SendRequest(b"x", group="A", message_id="m1")], now)
    (delivery,) = core.receive(Q, 1, 2.0, "w1", now)
    now += 3.0
    core.handle_timer(now)  # the claim expired; nobody took the message since
    store.apply(core.drain_effects())
    store.close()
    epoch, snapshot = store.open(now)
    core = QueueCore(epoch=epoch)
    core.restore(snapshot, now)
    try:
        (outcome,) = core.ack(Q, [("m1", delivery.token)], now, holder="w1")
        assert outcome.status == "ok", outcome  # as it is without the restart
    finally:
        store.close()
