"""A cluster's control state on JetStream: one KV bucket (`ClusterLayout.control_bucket`) that every edge
watches, so a fence or a tenant's limit set through any edge (or written by failure management) is in
force at all of them, and every egress proxy, whichever edge's control stream it follows, sees it.

The keys are a contract with whoever else writes the bucket (the failure-management decider):
- `fence.<worker, urlsafe base64 without padding>`: the JSON of the `queue_core.fences.Fence`
  (`Fence.to_dict`); a delete or purge of the key lifts the fence.
- `limits`: the operators' per-tenant send limits (strictq.cluster_limits), one JSON document.
Writers use compare-and-set (KV create / update with the last revision), so two edges changing the state
at once never lose one another's change.
"""

from __future__ import annotations

import asyncio
import base64
import time

import orjson
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from queue_core.fences import Fence

from .layout import ClusterLayout, LayoutError, retrying

FENCE_PREFIX = "fence."
LIMITS_KEY = "limits"


def fence_key(worker: str) -> str:
    """The bucket key of `worker`'s fence (base64: a worker id may hold characters no KV key may)."""
    return FENCE_PREFIX + base64.urlsafe_b64encode(worker.encode()).decode().rstrip("=")


def fence_worker(key: str) -> str | None:
    """The worker a `fence.` key names; None for another key or one that does not decode."""
    if not key.startswith(FENCE_PREFIX):
        return None
    text = key[len(FENCE_PREFIX) :]
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def encode_fence(fence: Fence) -> bytes:
    return orjson.dumps(fence.to_dict())


def decode_fence(raw: bytes) -> Fence:
    """The fence a value holds; ValueError (or a FenceError) when it is not one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    return Fence.from_dict(data)


async def create_control_bucket(js: JetStreamContext, layout: ClusterLayout) -> KeyValue:
    """The cluster's control bucket, created if missing (idempotent). The queue servers create it with
    the other buckets (cluster.layout.ensure_streams): an edge's NATS user may not create streams."""
    try:
        return await js.key_value(layout.control_bucket)
    except BucketNotFoundError:
        return await js.create_key_value(bucket=layout.control_bucket, history=1, replicas=layout.replicas)


async def control_bucket(js: JetStreamContext, layout: ClusterLayout, within: float = 30.0) -> KeyValue:
    """The cluster's control bucket as an edge opens it: waiting up to `within` seconds for the queue
    servers to create it (a cluster just created), then LayoutError saying who creates it."""

    async def opened() -> KeyValue | None:
        try:
            return await js.key_value(layout.control_bucket)
        except BucketNotFoundError:  # an APIError, which `retrying` would take for a transient one
            return None

    deadline = time.monotonic() + within
    while (bucket := await retrying(opened, "the cluster's control bucket", within)) is None:
        if time.monotonic() > deadline:
            raise LayoutError(
                f"the cluster has no control bucket ({layout.control_bucket}): its queue servers create it "
                "when they start; start (or upgrade) them first (docs/cluster.md)"
            )
        await asyncio.sleep(0.25)
    return bucket
