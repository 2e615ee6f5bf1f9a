"""Rebuilding the state machine from the store's snapshot after a restart.

It fills the shared `CoreState` (state.py) directly, which `QueueCore.restore` hands it: restart speed is
a target (1M messages in well under 5 s), so the hot loop appends rows in key order instead of replaying
sends.
"""

from __future__ import annotations

from .attributes import QueueAttributes
from .groups import partition_of
from .inputs import Snapshot
from .queue import QueueState, tiebreak
from .records import AttemptHistory, GroupState, Message
from .state import CoreState


def restore_into(core: CoreState, snapshot: Snapshot, now: float) -> None:
    """Claims keep their expiry, floors come back from the rows' tokens, and keys never repeat."""
    by_qid: dict[int, QueueState] = {}
    for qid, name, attributes, created_at in snapshot.queues:
        queue = QueueState(qid, name, QueueAttributes.from_dict(attributes), created_at)
        core.queues[name] = queue
        by_qid[qid] = queue
        core.next_qid = max(core.next_qid, qid + 1)
    last_key = snapshot.key_high_water
    partitions = core.partitions
    delays = core.delays
    groups_of = {queue.qid: queue.groups for queue in by_qid.values()}
    # The hot loop of a restart (1M rows: keep it lean); rows arrive in key order, so appending to
    # each group's deque keeps receipt order without QueueState.insert's ordering check.
    for row in snapshot.messages:
        (
            key,
            qid,
            message_id,
            group_name,
            available_at,
            receive_count,
            first_at,
            token,
            expires,
            worker,
            origin,
            digest,
            size,
        ) = row
        queue = by_qid[qid]
        group = groups_of[qid].get(group_name)
        if group is None:
            group = GroupState(group_name, queue, partition_of(group_name, partitions))
            queue.groups[group_name] = group
        message = Message(key, message_id, group, available_at if available_at > now else 0.0, size)
        group.messages.append(message)
        queue.by_id[message_id] = message
        if receive_count:
            message.receive_count = receive_count
            message.first_receive_at = first_at
            message.token = token
            message.origin = origin
            if token > group.floor:
                # The newest claim's worker holds the group, live or expired: a late ack of one's own
                # expired claim that nobody took since still works after a restart (docs: claims).
                group.floor = token
                group.claim_worker = worker or ""
            if expires > now:
                message.claim_expires = expires
                group.claimed.append(message)
                queue.in_flight += 1
        elif origin is not None:
            message.origin = origin
        if digest is not None:
            queue.index_content(message, digest)
        if message.available_at:
            queue.delayed += 1
            delays.push((message.available_at, next(tiebreak), message))
        if key > last_key:
            last_key = key
    core.last_key = last_key
    # Attempt histories before the groups are made ready: a parked head keeps its group out of the heap.
    for key, qid, message_id, state in snapshot.histories:
        owner = by_qid.get(qid)
        found = None if owner is None else owner.by_id.get(message_id)
        if owner is None or found is None or found.key != key:
            continue  # the store drops such orphans when it opens
        history = found.history = AttemptHistory.from_state(state)
        if history.parked:
            owner.parked.add(found.group.name)
    core.participants.update(snapshot.participants)
    for qid, group_name, override in snapshot.policies:
        owner = by_qid.get(qid)
        if owner is not None:
            owner.policies[group_name] = dict(override)
    for queue in core.queues.values():
        for group in queue.groups.values():
            # A claim row whose token is not the group's newest belongs to a superseded claim.
            for message in [m for m in group.claimed if m.token != group.floor]:
                message.claim_expires = 0.0
                group.claimed.remove(message)
                queue.in_flight -= 1
            if group.claimed:
                expires = min(m.claim_expires for m in group.claimed)
                core.claims.push((expires, next(tiebreak), group, group.floor))
            else:
                queue.push_ready(group)
            core.push_retention(group)
        if queue.scheduler is not None:
            queue.scheduler.rebuild()  # pools placed and loads counted from the restored groups
    for qid, dedup_key, message_id, seq, group_name, expires in snapshot.dedup:
        owner = by_qid.get(qid)
        if owner is None or expires <= now:
            continue
        owner.dedup[dedup_key] = (message_id, seq, group_name, expires)
        owner.dedup_order.append((expires, dedup_key))
    for queue in core.queues.values():
        queue.dedup_order = type(queue.dedup_order)(sorted(queue.dedup_order))
