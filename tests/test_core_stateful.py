"""QueueCore run beside a deliberately dumb reference model, driven by hypothesis.

The model is per-group deques of message ids in send order plus a map group -> live claim. It predicts
every delivery (SQS FIFO rules 1-3) and every per-item status of ack/renew/release; the invariants
compare it with the core's internals after every step. When `queue_core.store.SqliteStore` exists, a
restart rule closes the store, reopens it and restores a fresh core with the bumped epoch.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import T0

from queue_core.machine import QueueCore, SendRequest, SendResult

try:
    from queue_core.store import SqliteStore
except ImportError:  # the store is optional for this test: without it the restart rule is left out
    SqliteStore = None  # type: ignore[assignment,misc]

GROUPS = ["A", "B", "C", "D", None]
Q = "q"


# ------------------------------------------------------------------------------------ the reference
@dataclass
class Claim:
    token: int
    expires: dict[str, float]  # id -> claim expiry (renews may give messages of one claim different ones)


@dataclass
class Model:
    now: float = T0
    groups: dict[str, deque[str]] = field(default_factory=dict)  # group -> ids in send order
    group_of: dict[str, str] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # id -> position in the global send order
    claims: dict[str, Claim] = field(default_factory=dict)  # group -> its live claim
    floor: dict[str, int] = field(default_factory=dict)  # group -> newest token issued
    token_of: dict[str, int] = field(default_factory=dict)  # id -> newest claim token it was delivered under

    def add(self, message_id: str, group: str) -> None:
        self.groups.setdefault(group, deque()).append(message_id)
        self.group_of[message_id] = group
        self.order[message_id] = len(self.order)

    def expire(self) -> None:
        for group, claim in list(self.claims.items()):
            claim.expires = {i: at for i, at in claim.expires.items() if at > self.now}
            if not claim.expires:
                del self.claims[group]

    def deliverable(self, limit: int) -> list[tuple[str, list[str]]]:
        """Rule 1: oldest head of an unclaimed group; rule 2: as many of it as fit; rule 3: repeat."""
        heads = sorted((self.order[q[0]], g) for g, q in self.groups.items() if g not in self.claims)
        batches: list[tuple[str, list[str]]] = []
        taken = 0
        for _, group in heads:
            if taken >= limit:
                break
            ids = list(self.groups[group])[: limit - taken]
            batches.append((group, ids))
            taken += len(ids)
        return batches

    def claim(self, group: str, ids: list[str], token: int, expires: float) -> None:
        self.claims[group] = Claim(token, dict.fromkeys(ids, expires))
        self.floor[group] = token
        # A new claim supersedes every earlier delivery in the group, also of messages it does not hold.
        for message_id in self.groups[group]:
            if message_id in self.token_of or message_id in ids:
                self.token_of[message_id] = token

    def status(self, message_id: str, token: int | None) -> str:
        if message_id not in self.group_of:
            return "gone"
        group = self.group_of[message_id]
        if token is None or (token == self.token_of.get(message_id, 0) == self.floor.get(group, 0)):
            return "ok"
        return "stale_claim"

    def live(self, message_id: str) -> bool:
        claim = self.claims.get(self.group_of[message_id])
        return claim is not None and message_id in claim.expires

    def unclaim(self, message_id: str) -> None:
        group = self.group_of[message_id]
        claim = self.claims[group]
        del claim.expires[message_id]
        if not claim.expires:
            del self.claims[group]

    def delete(self, message_id: str) -> None:
        if self.live(message_id):
            self.unclaim(message_id)
        group = self.group_of.pop(message_id)
        self.token_of.pop(message_id, None)
        self.groups[group].remove(message_id)
        if not self.groups[group]:  # the core forgets an empty group, floor included
            del self.groups[group]
            self.floor.pop(group, None)


# ------------------------------------------------------------------------------------------ the test
class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.history: list[tuple[str, int, list[str]]] = []  # every claim issued: (group, token, ids)
        self.max_token = 0
        self.max_seq = 0
        self.restarts = 0
        self.since_restart = 0
        self.tmp: Path | None = None
        self.store: Any = None
        if SqliteStore is not None:
            self.tmp = Path(tempfile.mkdtemp(prefix="strictq-stateful-"))
            self.store = SqliteStore(self.tmp / "queue.db")
            epoch, snapshot = self.store.open(self.model.now)
            self.core = QueueCore(epoch=epoch)
            self.core.restore(snapshot, self.model.now)
        else:
            self.core = QueueCore()
        self.core.create_queue(Q, self.model.now, {"visibility_timeout": 5})
        self.flush()

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def flush(self) -> None:
        self.since_restart += 1
        effects = self.core.drain_effects()
        if self.store is not None:
            self.store.apply(effects)

    # ----------------------------------------------------------------------------------------- rules
    @rule(group=st.sampled_from(GROUPS), body=st.binary(min_size=1, max_size=4))
    def send(self, group: str | None, body: bytes) -> None:
        (result,) = self.core.send(Q, [SendRequest(body, group=group)], self.model.now)
        assert isinstance(result, SendResult) and not result.duplicate
        assert result.message_id not in self.model.order  # ids are never reused, not even after restarts
        assert result.seq > self.max_seq  # receipt keys keep rising, also across restarts
        self.max_seq = result.seq
        if group is not None:
            assert result.group == group
        else:
            assert result.group.startswith("~auto.") and result.group not in self.model.groups
        self.model.add(result.message_id, result.group)
        self.flush()

    @rule(limit=st.integers(1, 5), ttl=st.sampled_from([1.0, 3.0, 10.0]))
    def receive(self, limit: int, ttl: float) -> None:
        model = self.model
        expected = model.deliverable(limit)
        got = self.core.receive(Q, limit, ttl, "w", model.now)
        assert [(d.group, d.message_id) for d in got] == [(g, i) for g, ids in expected for i in ids]
        for group, ids in expected:
            tokens = {d.token for d in got if d.group == group}
            assert len(tokens) == 1  # one claim per group per batch
            (token,) = tokens
            assert token > self.max_token  # fencing tokens strictly increase
            self.max_token = token
            # Never delivered while an earlier message of its group is neither deleted nor in this claim.
            assert list(model.groups[group])[: len(ids)] == ids
            model.claim(group, ids, token, model.now + ttl)
            self.history.append((group, token, ids))
        self.flush()

    def _token(self, data: st.DataObject, group: str, token: int) -> int | None:
        """The claim's own token, none, the group's newest, or any token the group ever had."""
        use = data.draw(st.sampled_from(["claim", "none", "floor", "group"]), label="token")
        if use == "none":
            return None
        if use == "floor":
            return self.model.floor.get(group, token)
        if use == "group":
            return data.draw(st.sampled_from([t for g, t, _ in self.history if g == group]), label="any")
        return token

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        group, token, ids = data.draw(st.sampled_from(self.history), label="claim")
        message_id = data.draw(st.sampled_from(ids), label="message")
        token_used = self._token(data, group, token)
        expected = self.model.status(message_id, token_used)
        (outcome,) = self.core.ack(Q, [(message_id, token_used)], self.model.now)
        assert outcome.status == expected, (outcome, expected)
        event(f"ack: {expected}")
        if expected == "ok":
            self.model.delete(message_id)
        elif expected == "stale_claim":
            assert message_id in self.core.queue(Q).by_id  # refused, and the message remains
        self.flush()

    def _claim_items(self, data: st.DataObject) -> tuple[list[str], int | None]:
        """Some still-present messages of one claim ever issued, with a token for them."""
        group, token, ids = data.draw(st.sampled_from(self.history), label="claim")
        present = [i for i in ids if i in self.model.group_of]
        chosen = data.draw(st.lists(st.sampled_from(present), unique=True), label="items") if present else []
        return chosen, self._token(data, group, token)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ids, token = self._claim_items(data)
        expected = [self.model.status(i, token) for i in ids]
        outcomes = self.core.release(Q, [(i, token) for i in ids], self.model.now)
        assert [o.status for o in outcomes] == expected
        for status in set(expected):
            event(f"release: {status}")
        for message_id, status in zip(ids, expected, strict=True):
            if status == "ok" and self.model.live(message_id):
                self.model.unclaim(message_id)
        self.flush()

    @precondition(lambda self: self.history)
    @rule(data=st.data(), ttl=st.sampled_from([0.0, 2.0, 8.0]), mode=st.sampled_from(["extend", "set"]))
    def renew(self, data: st.DataObject, ttl: float, mode: str) -> None:
        model = self.model
        ids, token = self._claim_items(data)
        expected: list[str] = []
        for message_id in ids:
            status = model.status(message_id, token)
            if status == "ok" and ttl > 0 and not model.live(message_id):
                # set needs a live claim; extend recreates an expired claim nobody superseded, which
                # needs a claim to recreate (a token, given or not, that is the group's newest).
                group = model.group_of[message_id]
                current = model.token_of.get(message_id, 0)
                if mode == "set" or not current or current != model.floor.get(group, 0):
                    status = "not_in_flight"
            expected.append(status)
        outcomes = self.core.renew(Q, [(i, token) for i in ids], ttl, model.now, mode=mode)  # type: ignore[arg-type]
        assert [o.status for o in outcomes] == expected
        for message_id, status in zip(ids, expected, strict=True):
            live = "live" if model.live(message_id) else "expired"
            event(f"renew {mode} ttl={'0' if ttl == 0 else '>0'} {live}: {status}")
        new_expiry = model.now + ttl
        for message_id, status in zip(ids, expected, strict=True):
            if status != "ok":
                continue
            group = model.group_of[message_id]
            if ttl == 0:
                if model.live(message_id):
                    model.unclaim(message_id)
            elif model.live(message_id):
                expires = model.claims[group].expires
                old = expires[message_id]
                expires[message_id] = max(old, new_expiry) if mode == "extend" else new_expiry
            else:  # recreate, under the group's newest token
                claim = model.claims.setdefault(group, Claim(model.floor[group], {}))
                assert claim.token == model.token_of[message_id]
                claim.expires[message_id] = new_expiry
        self.flush()

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 5.0, 12.0]))
    def advance(self, dt: float) -> None:
        self.model.now += dt
        self.core.handle_timer(self.model.now)
        self.model.expire()
        self.flush()

    @precondition(lambda self: self.store is not None and self.since_restart >= 4)
    @rule(downtime=st.sampled_from([0.0, 0.01, 1.0, 4.0]))
    def restart(self, downtime: float) -> None:
        """Close the store, reopen it (the epoch is bumped) and restore a fresh core from it.

        The clock may stand still across the restart (same millisecond): keys must still never repeat."""
        self.flush()
        self.store.close()
        self.model.now += downtime
        self.model.expire()  # claims that ran out while the process was down
        epoch, snapshot = self.store.open(self.model.now)
        self.core = QueueCore(epoch=epoch)
        self.core.restore(snapshot, self.model.now)
        self.restarts += 1
        self.since_restart = 0
        event(f"restart with {len(self.model.claims)} live claim(s)")
        assert epoch == self.restarts + 1  # tokens issued from here on exceed all before (see receive)

    # ------------------------------------------------------------------------------------ invariants
    @invariant()
    def nothing_lost_and_group_order_is_send_order(self) -> None:
        queue = self.core.queue(Q)
        assert set(queue.by_id) == set(self.model.group_of)
        core_groups = {name: [m.id for m in g.messages] for name, g in queue.groups.items()}
        assert core_groups == {g: list(ids) for g, ids in self.model.groups.items()}

    @invariant()
    def claims_match_the_model_and_one_token_per_group(self) -> None:
        queue = self.core.queue(Q)
        core_claims = {}
        for name, group in queue.groups.items():
            if not group.claimed:
                continue
            tokens = {m.token for m in group.claimed}
            assert tokens == {group.floor}  # at most one claim (token) per group in flight
            core_claims[name] = (group.floor, {m.id: m.claim_expires for m in group.claimed})
        model_claims = {g: (c.token, c.expires) for g, c in self.model.claims.items()}
        assert core_claims == model_claims

    @invariant()
    def every_message_in_exactly_one_state(self) -> None:
        queue = self.core.queue(Q)
        claimed = delayed = visible = 0
        for message in queue.by_id.values():
            states = [bool(message.claim_expires), bool(message.available_at)]
            assert sum(states) <= 1
            claimed += states[0]
            delayed += states[1]
            visible += not any(states)
            assert (message in message.group.claimed) == states[0]
        metrics = self.core.metrics(Q, self.model.now)
        assert (metrics.in_flight, metrics.delayed, metrics.visible) == (claimed, delayed, visible)
        assert metrics.total == len(self.model.group_of)


QueueMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, derandomize=True
)
TestQueueMachine = QueueMachine.TestCase
