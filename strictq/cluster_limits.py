"""A cluster edge's per-tenant limits: one document for the whole cluster, key `limits` of its control
bucket (cluster.control_state), so `strictq limits` through one edge applies at every edge.

`ClusterLimits` is the edge's `gateway.rate_limits.LimitStore`: a watch (cluster.kv_mirror) keeps the
limiter's overrides equal to the bucket's, and a change is a compare-and-set on the key's revision
(create when there is none), re-read and re-applied when another edge changed it first, so two operators
changing two tenants' limits through two edges at once both keep theirs. The value is the limits file's
JSON (gateway.rate_limits.encode_overrides).

A `limits.json` left in the edge's data dir by an earlier version is migrated at start: written to the
bucket when the bucket has no limits yet (else the bucket's win), then renamed `limits.json.migrated`.
Here, not in cluster/: the limits are the gateway's (the layers: gateway above cluster).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from cluster.control_fences import CAS_ATTEMPTS, ControlStateUnavailable
from cluster.control_state import LIMITS_KEY, control_bucket
from cluster.kv_mirror import KvMirror
from cluster.layout import ClusterLayout, retrying
from gateway.rate_limits import Overrides, TenantRateLimiter, decode_overrides, encode_overrides

log = logging.getLogger("strictq.limits")
MIGRATED_SUFFIX = ".migrated"


class ClusterLimits:
    """The limits of the cluster `layout` names, kept in `limiter` (which `start` points at this store);
    `legacy`: the edge's old limits.json, already read into `limiter` by TenantRateLimiter.load."""

    def __init__(
        self, js: JetStreamContext, layout: ClusterLayout, limiter: TenantRateLimiter, legacy: Path
    ) -> None:
        self._js = js
        self._layout = layout
        self.limiter = limiter
        self.legacy = legacy
        self._bucket: KeyValue | None = None
        self._mirror: KvMirror | None = None
        self._revision = 0  # of the `limits` key, as last applied here
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        layout = self._layout
        file_limits = dict(self.limiter.overrides)  # before the watch replaces them with the bucket's
        self._bucket = await control_bucket(self._js, layout)
        self._mirror = KvMirror(self._bucket, "control-limits", self._js, f"KV_{layout.control_bucket}")
        self._mirror.listeners.append(self._heard)
        await retrying(self._mirror.start, "the cluster's control state")
        stored = self._mirror.entries.get(LIMITS_KEY)
        self.limiter.path = None  # no longer the edge's file: the cluster's bucket
        self.limiter.store = self
        if stored is not None:
            self._apply(stored.value, stored.revision)
        else:
            self.limiter.overrides = {}
        if self.legacy.exists():
            await self._migrate(file_limits, had_stored=stored is not None)

    async def close(self) -> None:
        if self._mirror is not None:
            await self._mirror.stop()

    async def change(self, edit: Callable[[Overrides], Overrides]) -> None:
        """`edit` applied to the cluster's limits with compare-and-set; the limiter has the result."""
        async with self._lock:  # one change of this edge at a time: each builds on the last
            for _ in range(CAS_ATTEMPTS):
                wanted = edit(dict(self.limiter.overrides))
                value = encode_overrides(wanted)
                try:
                    if self._revision:
                        revision = await self._kv.update(LIMITS_KEY, value, last=self._revision)
                    else:
                        revision = await self._kv.create(LIMITS_KEY, value)
                except KeyWrongLastSequenceError:
                    await self._reread()
                    continue
                except (NatsError, TimeoutError) as exc:
                    raise ControlStateUnavailable(
                        f"the cluster's control bucket did not take the limit: {exc!r}"
                    ) from None
                if revision > self._revision:  # else the watch already brought a newer change
                    self._revision = revision
                    self.limiter.overrides = wanted
                return
        raise ControlStateUnavailable("the cluster's limits kept changing elsewhere; try again")

    @property
    def _kv(self) -> KeyValue:
        if self._bucket is None:
            raise RuntimeError("ClusterLimits used before start()")
        return self._bucket

    async def _reread(self) -> None:
        try:
            entry = await self._kv.get(LIMITS_KEY)
        except KeyNotFoundError as exc:  # deleted: recreated from nothing
            marker = getattr(exc, "entry", None)
            self._revision = 0 if marker is None else marker.revision or 0
            self.limiter.overrides = {}
            return
        except (NatsError, TimeoutError) as exc:
            raise ControlStateUnavailable(f"cannot read the cluster's control bucket: {exc!r}") from None
        self._apply(entry.value, entry.revision or 0, force=True)

    def _heard(self, key: str, value: bytes | None, revision: int) -> None:
        if key == LIMITS_KEY:
            self._apply(value, revision)

    def _apply(self, value: bytes | None, revision: int, *, force: bool = False) -> None:
        if not force and revision <= self._revision:
            return  # the echo of a change made here, or a replay
        self._revision = revision
        if value is None:
            self.limiter.overrides = {}
            return
        try:
            self.limiter.overrides = decode_overrides(value)
        except ValueError as exc:
            log.error("ignoring unreadable limits in the cluster's control bucket: %s", exc)

    async def _migrate(self, file_limits: Overrides, *, had_stored: bool) -> None:
        if file_limits and not had_stored:
            try:
                revision = await self._kv.create(LIMITS_KEY, encode_overrides(file_limits))
            except KeyWrongLastSequenceError:
                await self._reread()  # another edge was first: its limits win
            else:
                if revision > self._revision:
                    self._revision = revision
                    self.limiter.overrides = file_limits
        elif file_limits:
            log.warning("%s: the cluster already has limits, which win over this edge's file", self.legacy)
        target = self.legacy.with_name(self.legacy.name + MIGRATED_SUFFIX)
        await asyncio.to_thread(os.replace, self.legacy, target)
        log.info("moved %s to the cluster's control bucket (renamed %s)", self.legacy, target)
