"""A cluster's names and shape on JetStream: the one record every node and gateway reads first.

The record (`strictq_cluster` bucket, key `layout`) is created once, by whoever comes first, with
compare-and-set, and never changes: its random `id` goes into every stream and bucket name, so a cluster
created anew over the same NATS servers never reuses a stream name (nats-server 2.9.10 lost acknowledged
data after a same-named stream was deleted and re-created during leader kills; docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ObjectStoreConfig, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
)
from nats.js.kv import KeyValue

# What JetStream answers while a just-created stream or bucket elects its leader, or a server restarts.
TRANSIENT = (NoStreamResponseError, NoRespondersError, NatsTimeoutError, TimeoutError, APIError)

LAYOUT_BUCKET = "strictq_cluster"
CLUSTER_ID = re.compile(r"[a-z0-9]{1,16}")
LAYOUT_KEY = "layout"
DEFAULT_PARTITIONS = 3
MAX_PARTITIONS = 256


class LayoutError(Exception):
    """The cluster's record is missing or unreadable, or a node asked for a different shape."""


async def retrying[T](operation: Callable[[], Awaitable[T]], what: str, within: float = 30.0) -> T:
    """`operation()`, retried every 0.25 s on JetStream's transient answers for up to `within` seconds;
    then LayoutError naming `what`."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await operation()
        except LayoutError:
            raise
        except TRANSIENT as exc:
            if isinstance(exc, KeyWrongLastSequenceError) or time.monotonic() > deadline:
                raise LayoutError(f"{what}: JetStream did not answer: {exc!r}") from None
            await asyncio.sleep(0.25)


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    id: str
    partitions: int  # cluster partitions: the unit of ownership and replication
    replicas: int  # JetStream replicas of each partition's stream and of the buckets (1 or 3)

    def stream(self, partition: int) -> str:
        return f"SQ_{self.id}_P{partition}"

    def subject(self, partition: int) -> str:
        return f"sq.{self.id}.p{partition}"

    @property
    def floors_subject(self) -> str:
        """Where owners publish fencing-token floors for the gateways' control streams (cluster.floors)."""
        return f"sq.{self.id}.floors"

    @property
    def floors_sync_subject(self) -> str:
        return f"sq.{self.id}.floors.sync"

    @property
    def nodes_bucket(self) -> str:
        return f"sq_{self.id}_nodes"

    @property
    def owners_bucket(self) -> str:
        return f"sq_{self.id}_owners"

    @property
    def master_bucket(self) -> str:
        return f"sq_{self.id}_master"

    @property
    def edges_bucket(self) -> str:
        """Each gateway's (edge's) report: its region, where its sends come from, its latency to each node
        (cluster.traffic; TTL EDGE_TTL, so a stopped edge drops out)."""
        return f"sq_{self.id}_edges"

    @property
    def placement_bucket(self) -> str:
        """The placement policy (key `policy`) and the moves placement made (key `history`):
        cluster.placement."""
        return f"sq_{self.id}_placement"

    @property
    def fleet_bucket(self) -> str:
        """The worker fleet's registry for every edge: workers' heartbeats, their pending controls and the
        queues' rebalancing policies (cluster.fleet_kv)."""
        return f"strictq_fleet_{self.id}"

    @property
    def control_bucket(self) -> str:
        """The cluster's one control state, created by the queue servers: fences and per-tenant limits for
        every edge (cluster.control_state), suspensions, blacklists and probes for every node's gates
        (cluster.control_keys)."""
        return f"strictq_control_{self.id}"

    @property
    def snapshots_bucket(self) -> str:
        """The object store holding each partition's latest snapshot (cluster.snapshots)."""
        return f"sq_{self.id}_snapshots"

    @property
    def decider_bucket(self) -> str:
        """The lease of failure management's decider (key `decider`, TTL DECIDER_TTL: cluster.decider)."""
        return f"sq_{self.id}_decider"

    @property
    def health_stream(self) -> str:
        """What every partition's gate saw (attempts, polls, probe hand-outs and results), for the decider."""
        return f"SQ_{self.id}_HEALTH"

    @property
    def health_subject(self) -> str:
        return f"sq.{self.id}.health"

    @property
    def events_stream(self) -> str:
        """The decider's events (fence, probe, suspend, ...), numbered by their stream sequence."""
        return f"SQ_{self.id}_EVENTS"

    @property
    def events_subject(self) -> str:
        return f"sq.{self.id}.events"

    @property
    def decider_subject(self) -> str:
        """Requests for the decider's holder (status, suspend, resume, unblacklist, alerts). Four tokens: an
        edge may publish here, not to the three-token subjects of partitions and reports."""
        return f"sq.{self.id}.decider.api"

    def to_json(self) -> bytes:
        return orjson.dumps({"id": self.id, "partitions": self.partitions, "replicas": self.replicas})

    @classmethod
    def from_json(cls, raw: bytes) -> ClusterLayout:
        try:
            data = orjson.loads(raw)
            return cls(str(data["id"]), int(data["partitions"]), int(data["replicas"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"the cluster's layout record is unreadable: {exc}") from None


async def layout_bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    try:
        return await js.key_value(LAYOUT_BUCKET)
    except BucketNotFoundError:
        return await js.create_key_value(bucket=LAYOUT_BUCKET, history=1, replicas=replicas)


async def read_layout(js: JetStreamContext) -> ClusterLayout | None:
    try:
        bucket = await js.key_value(LAYOUT_BUCKET)
        entry = await bucket.get(LAYOUT_KEY)
    except (BucketNotFoundError, KeyNotFoundError):
        return None
    return ClusterLayout.from_json(entry.value or b"")


async def ensure_layout(
    js: JetStreamContext,
    partitions: int,
    replicas: int,
    within: float = 30.0,
    cluster_id: str | None = None,
) -> ClusterLayout:
    """The cluster's layout: created with these values if there is none, else the existing one (the first
    creator wins). Retried while JetStream is still electing leaders or another node is creating the same
    bucket (NoStreamResponse, NoResponders), for up to `within` seconds. `cluster_id`: the id to create it
    with (the one the servers' permissions name, cluster.nats_roles); None: a random one."""
    return await retrying(
        lambda: _ensure_layout(js, partitions, replicas, cluster_id), "the cluster's layout", within
    )


async def _ensure_layout(
    js: JetStreamContext, partitions: int, replicas: int, cluster_id: str | None = None
) -> ClusterLayout:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise LayoutError(f"partitions must be 1-{MAX_PARTITIONS}, not {partitions}")
    if replicas not in (1, 3):
        raise LayoutError(f"replicas must be 1 or 3, not {replicas}")
    bucket = await layout_bucket(js, replicas)
    if cluster_id is not None and not CLUSTER_ID.fullmatch(cluster_id):
        raise LayoutError(f"a cluster id is 1-16 lowercase letters or digits, not {cluster_id!r}")
    wanted = ClusterLayout(cluster_id or secrets.token_hex(4), partitions, replicas)
    try:
        await bucket.create(LAYOUT_KEY, wanted.to_json())
        return wanted
    except KeyWrongLastSequenceError:
        entry = await bucket.get(LAYOUT_KEY)
        return ClusterLayout.from_json(entry.value or b"")


# How long a node's heartbeat, and the master's lease, outlive their last renewal. Above the pause a busy
# two-core machine can give a process, below the 5 s failover target (docs/cluster.md).
NODE_TTL = 2.5
MASTER_TTL = 2.5
DECIDER_TTL = 2.5  # the decider's lease, as the master's
HEALTH_MAX_AGE = 3600.0  # the health stream keeps an hour of reports (a takeover replays one window)
EVENTS_KEPT = 1000  # the events stream keeps the newest this many (the status routes' ring)
EDGE_TTL = 15.0  # an edge reports every second or so; one silent this long is gone
# JetStream's deduplication window for Nats-Msg-Id: an owner retrying an append whose acknowledgement it
# never saw (a stream leader failing over) gets the first append's sequence back, not a second copy.
DUPLICATE_WINDOW = 120.0
MAX_FRAME_BYTES = 4 * 1024 * 1024  # frames stay under the servers' max_payload (8 MiB in cluster up)


async def ensure_streams(js: JetStreamContext, layout: ClusterLayout, within: float = 30.0) -> None:
    """Each partition's stream and the cluster's buckets, created if missing (idempotent, any node; retried
    as ensure_layout is)."""
    await retrying(lambda: _ensure_streams(js, layout), "the cluster's streams", within)


async def _ensure_streams(js: JetStreamContext, layout: ClusterLayout) -> None:
    for partition in range(layout.partitions):
        name = layout.stream(partition)
        try:
            await js.stream_info(name)
        except NotFoundError:
            await js.add_stream(
                StreamConfig(
                    name=name,
                    subjects=[layout.subject(partition)],
                    storage=StorageType.FILE,
                    num_replicas=layout.replicas,
                    duplicate_window=DUPLICATE_WINDOW,
                    max_msg_size=MAX_FRAME_BYTES + 64 * 1024,
                )
            )
    await _bucket(js, layout.nodes_bucket, layout.replicas, ttl=NODE_TTL)
    await _bucket(js, layout.owners_bucket, layout.replicas)
    await _bucket(js, layout.master_bucket, layout.replicas, ttl=MASTER_TTL)
    await _bucket(js, layout.edges_bucket, layout.replicas, ttl=EDGE_TTL)
    await _bucket(js, layout.placement_bucket, layout.replicas)
    await _bucket(js, layout.fleet_bucket, layout.replicas)
    await _bucket(js, layout.decider_bucket, layout.replicas, ttl=DECIDER_TTL)
    await _bucket(js, layout.control_bucket, layout.replicas)
    for name, subject, limits in (
        (layout.health_stream, layout.health_subject, {"max_age": HEALTH_MAX_AGE}),
        (layout.events_stream, layout.events_subject, {"max_msgs": EVENTS_KEPT}),
    ):
        try:
            await js.stream_info(name)
        except NotFoundError:
            stream = StreamConfig(
                name=name, subjects=[subject], storage=StorageType.FILE, num_replicas=layout.replicas
            )
            for field, value in limits.items():
                setattr(stream, field, value)
            await js.add_stream(stream)
    try:
        await js.object_store(layout.snapshots_bucket)
    except BucketNotFoundError:
        config = ObjectStoreConfig(storage=StorageType.FILE, replicas=layout.replicas)
        await js.create_object_store(layout.snapshots_bucket, config=config)


async def _bucket(js: JetStreamContext, name: str, replicas: int, ttl: float | None = None) -> KeyValue:
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(bucket=name, history=1, replicas=replicas, ttl=ttl)
