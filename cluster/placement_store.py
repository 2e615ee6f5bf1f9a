"""The placement bucket (cluster.layout.placement_bucket): the policy and the history of placement's moves.

Key `policy` holds a PlacementPolicy (missing: mode off); key `history` the MoveRecords of the last two
days (cluster.placement.trim_history), which the budget and the cooldown count. Both the master (each
placement move) and `strictq cluster plan --apply` append to the history, so every append is
compare-and-set on the revision read, retried on a conflict: neither loses the other's record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from .layout import ClusterLayout, LayoutError, retrying
from .ownership import RecordError
from .placement import MoveRecord, PlacementPolicy, history_from_json, history_to_json, trim_history

log = logging.getLogger("strictq.cluster")
POLICY_KEY = "policy"
HISTORY_KEY = "history"
CAS_ATTEMPTS = 20


async def placement_bucket(js: JetStreamContext, layout: ClusterLayout) -> KeyValue:
    """The bucket; LayoutError when the cluster has none (its nodes create it when they start)."""

    async def bucket() -> KeyValue:
        try:
            return await js.key_value(layout.placement_bucket)
        except BucketNotFoundError:
            raise LayoutError(
                f"the cluster has no placement bucket ({layout.placement_bucket}) yet: its queue servers "
                "create it when they start"
            ) from None

    return await retrying(bucket, "the placement bucket")


def policy_of(raw: bytes | None) -> PlacementPolicy:
    """The policy in a `policy` value; missing: the default (off). PolicyError when unreadable."""
    return PlacementPolicy() if raw is None else PlacementPolicy.from_json(raw)


def history_of(raw: bytes | None) -> tuple[MoveRecord, ...]:
    """The records in a `history` value; an unreadable one counts as empty (logged): it only feeds the
    budget and the cooldown, and the next record written replaces it."""
    if raw is None:
        return ()
    try:
        return history_from_json(raw)
    except RecordError as exc:
        log.warning("ignoring the placement history: %s", exc)
        return ()


async def _get(bucket: KeyValue, key: str) -> tuple[bytes | None, int]:
    """(value, revision); (None, 0) when missing, (None, revision) when deleted."""
    try:
        entry = await bucket.get(key)
    except KeyDeletedError as exc:
        return None, (exc.entry.revision or 0) if exc.entry is not None else 0
    except KeyNotFoundError:
        return None, 0
    if entry.value is None or entry.operation in ("DEL", "PURGE"):
        return None, entry.revision or 0
    return entry.value, entry.revision or 0


async def read_placement(
    js: JetStreamContext, layout: ClusterLayout
) -> tuple[PlacementPolicy, tuple[MoveRecord, ...]]:
    """The policy (PolicyError when unreadable) and the moves recorded, oldest first."""
    bucket = await placement_bucket(js, layout)
    policy, _ = await retrying(lambda: _get(bucket, POLICY_KEY), "reading the placement policy")
    history, _ = await retrying(lambda: _get(bucket, HISTORY_KEY), "reading the placement history")
    return policy_of(policy), history_of(history)


async def write_policy(js: JetStreamContext, layout: ClusterLayout, policy: PlacementPolicy) -> None:
    """Replace the policy (the master reads it within a second)."""
    bucket = await placement_bucket(js, layout)
    await retrying(lambda: bucket.put(POLICY_KEY, policy.to_json()), "writing the placement policy")


async def record_moves(
    js: JetStreamContext,
    layout: ClusterLayout,
    records: Iterable[MoveRecord],
    now: float | None = None,
    bucket: KeyValue | None = None,
) -> tuple[MoveRecord, ...]:
    """Append `records` to the history (compare-and-set on its revision, read again and retried on a
    conflict); returns the history written. `bucket`: a handle already open (the master's mirror's)."""
    added = tuple(records)
    kv = bucket if bucket is not None else await placement_bucket(js, layout)
    at = time.time() if now is None else now
    for _ in range(CAS_ATTEMPTS):
        raw, revision = await retrying(lambda: _get(kv, HISTORY_KEY), "reading the placement history")
        history = trim_history((*history_of(raw), *added), at)
        try:
            if revision:
                await kv.update(HISTORY_KEY, history_to_json(history), last=revision)
            else:
                await kv.create(HISTORY_KEY, history_to_json(history))
            return history
        except KeyWrongLastSequenceError:
            continue  # someone else appended in between: read theirs and append again
    raise LayoutError(f"recording placement moves: the history kept changing ({CAS_ATTEMPTS} attempts)")
