"""A tiny in-memory stand-in for the durable store, used only by tests.

It applies drained effects to plain dicts exactly as a store would (only what the effects say is kept)
and hands back a `Snapshot`, so restart behaviour of `QueueCore.restore` can be tested without I/O.
"""

from __future__ import annotations

from typing import Any

from queue_core.machine import Snapshot
from queue_core.machine.effects import (
    ClaimsChanged,
    DedupSaved,
    MessageInserted,
    MessagesClaimed,
    MessagesDeleted,
    MessagesMoved,
    QueueDropped,
    QueuePurged,
    QueueSaved,
)


class MemoryStore:
    def __init__(self) -> None:
        self.epoch = 0
        self.queues: dict[int, tuple[int, str, dict[str, Any], float]] = {}
        self.messages: dict[int, dict[str, Any]] = {}
        self.dedup: dict[tuple[int, str], tuple[int, str, str, int, str, float]] = {}
        self.key_high_water = 0

    def open(self, now: float) -> tuple[int, Snapshot]:
        self.epoch += 1
        rows = [
            (
                key,
                m["qid"],
                m["id"],
                m["group"],
                m["available_at"],
                m["receive_count"],
                m["first_receive_at"],
                m["token"],
                m["expires"],
                m["worker"],
                m["origin"],
                m["digest"],
            )
            for key, m in sorted(self.messages.items())
        ]
        snapshot = Snapshot(
            queues=list(self.queues.values()),
            messages=rows,
            dedup=list(self.dedup.values()),
            key_high_water=self.key_high_water,
        )
        return self.epoch, snapshot

    def apply(self, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case QueueSaved(qid, name, attributes, created_at):
                    self.queues[qid] = (qid, name, dict(attributes), created_at)
                case QueueDropped(qid) | QueuePurged(qid):
                    if isinstance(effect, QueueDropped):
                        self.queues.pop(qid, None)
                    for key in [k for k, m in self.messages.items() if m["qid"] == qid]:
                        del self.messages[key]
                case MessageInserted():
                    self.key_high_water = max(self.key_high_water, effect.key)
                    self.messages[effect.key] = {
                        "qid": effect.qid,
                        "id": effect.message_id,
                        "group": effect.group,
                        "available_at": effect.available_at,
                        "receive_count": 0,
                        "first_receive_at": 0.0,
                        "token": 0,
                        "expires": 0.0,
                        "worker": "",
                        "origin": None,
                        "digest": effect.digest,
                    }
                case DedupSaved(qid, dedup_key, message_id, seq, group, expires):
                    self.dedup[(qid, dedup_key)] = (qid, dedup_key, message_id, seq, group, expires)
                case MessagesClaimed(claims, worker):
                    for row in claims:
                        m = self.messages[row.key]
                        m.update(
                            token=row.token,
                            expires=row.expires,
                            receive_count=row.receive_count,
                            first_receive_at=row.first_receive_at,
                            worker=worker,
                        )
                case ClaimsChanged(changes):
                    for key, expires in changes:
                        if key in self.messages:
                            self.messages[key]["expires"] = expires
                case MessagesDeleted(keys):
                    for key in keys:
                        self.messages.pop(key, None)
                case MessagesMoved(keys, qid, origin):
                    for key in keys:
                        m = self.messages[key]
                        m["qid"] = qid
                        if origin is not None:
                            m["origin"] = origin
                case _:
                    pass  # FloorRaised and friends are not durable

    def close(self) -> None:
        pass
