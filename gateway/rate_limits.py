"""Per-tenant send rate limits at the edge: one token bucket per tenant, refilled at the tenant's rate up
to its burst (the backlog article's first protection: one tenant's flood must not become everyone's
backlog).

Sans-I/O like the core: `admit(tenant, cost, now)` takes the clock as an argument and answers how long to
wait (0: admitted); the faces (gateway.sqs_data, gateway.emodb) call it with the messages of each send and
render a refusal in their own dialect (SQS `RequestThrottled`, EmoDB 429 with Retry-After), through the one
error `Throttled`. A refused send takes no tokens, so a client that backs off as told gets in.

Written by hand because it is a dozen lines of arithmetic over state this module must also persist and
change at run time; the token-bucket libraries on PyPI own their clocks or their storage.

Limits are messages per second. A request costs its message count, capped at the burst, so a full batch
still passes when the bucket is full. The default (`strictq serve --tenant-rate/--tenant-burst`) applies
to every tenant without its own limit; per-tenant limits are set at run time by an operator (the admin
routes, gateway.limits_http) and kept in `<data-dir>/limits.json` (0600) across restarts; at an edge of a
cluster, in the cluster's control bucket instead (a `LimitStore`, strictq.cluster_limits), so a limit set
through one edge applies at every edge. Each edge process limits the sends it sees: a cluster with N
edges admits up to N times a tenant's rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from protocol.errors import THROTTLED, StrictqError
from wirelog.files import StartupError, write_private

MAX_RATE = 1_000_000.0  # msg/s: above any one edge's capacity; a typo like 1e12 is refused, not obeyed
LIMITS_VERSION = 1


class Throttled(StrictqError):
    """A tenant's sends over its rate: 429, retriable after `retry_after` seconds."""

    status = 429
    retriable = True
    code = THROTTLED


class InvalidLimit(StrictqError):
    """A limit that is not a positive rate and a burst of at least one message."""

    status = 400
    code = "invalid_limit"


class UnknownTenant(StrictqError):
    """A limit for a tenant the key file does not serve."""

    status = 404
    code = "unknown_tenant"


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """`rate` messages per second on average, `burst` at once after a quiet spell."""

    rate: float
    burst: float

    @classmethod
    def parse(cls, rate: Any, burst: Any = None) -> TenantLimit:
        """From JSON or flags: rate > 0 (at most MAX_RATE); burst >= 1, default max(rate, 1)."""
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= MAX_RATE:
            raise InvalidLimit(f"rate must be a number of messages per second, 0 < rate <= {MAX_RATE:g}")
        if burst is None:
            burst = max(float(rate), 1.0)
        if isinstance(burst, bool) or not isinstance(burst, int | float) or not 1 <= burst <= MAX_RATE:
            raise InvalidLimit(f"burst must be a number of messages, 1 <= burst <= {MAX_RATE:g}")
        return cls(float(rate), float(burst))

    def to_dict(self) -> dict[str, float]:
        return {"rate": self.rate, "burst": self.burst}


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    limit: TenantLimit


@dataclass(slots=True)
class TenantCounters:
    """What a tenant's limit did, for status and metrics."""

    admitted: int = 0  # messages
    throttled_requests: int = 0
    throttled_messages: int = 0


type Overrides = dict[str, TenantLimit | None]


class LimitStore(Protocol):
    """Where an edge's per-tenant limits live when not in its limits.json (a cluster's control bucket):
    `change` applies `edit` to the stored overrides (read-modify-write, retried on a concurrent change)
    and sets the limiter's `overrides` to the result before it returns."""

    async def change(self, edit: Callable[[Overrides], Overrides]) -> None: ...


def encode_overrides(overrides: Overrides) -> bytes:
    """The limits file's JSON (also the cluster bucket's `limits` value): version and tenants."""
    tenants = {t: (None if v is None else v.to_dict()) for t, v in sorted(overrides.items())}
    return orjson.dumps({"version": LIMITS_VERSION, "tenants": tenants}, option=orjson.OPT_INDENT_2)


def decode_overrides(raw: bytes) -> Overrides:
    """The overrides `encode_overrides` wrote; ValueError naming what is wrong."""
    overrides: Overrides = {}
    try:
        data = orjson.loads(raw)
        tenants = data["tenants"]
        if not isinstance(tenants, dict):
            raise TypeError("tenants is not an object")
        for tenant, value in tenants.items():
            if value is None:
                overrides[str(tenant)] = None
            else:
                overrides[str(tenant)] = TenantLimit.parse(value.get("rate"), value.get("burst"))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, InvalidLimit) as exc:
        raise ValueError(str(exc)) from None
    return overrides


@dataclass
class TenantRateLimiter:
    """The edge's limits: a default for every tenant (None: unlimited) and operators' per-tenant ones
    (a tenant mapped to None is unlimited whatever the default). `path`: where per-tenant limits persist;
    `store`: where they live instead (a cluster's; then `update`/`reset`, not `set`/`clear`)."""

    default: TenantLimit | None = None
    path: Path | None = None
    store: LimitStore | None = None
    overrides: dict[str, TenantLimit | None] = field(default_factory=dict)
    counters: dict[str, TenantCounters] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def limit_of(self, tenant: str) -> TenantLimit | None:
        return self.overrides[tenant] if tenant in self.overrides else self.default

    def admit(self, tenant: str, cost: int, now: float) -> float:
        """Take `cost` messages' tokens for `tenant` at `now`: 0.0 when admitted, else the seconds until
        they would be there (nothing taken)."""
        limit = self.limit_of(tenant)
        counters = self.counters.get(tenant)
        if counters is None:
            counters = self.counters[tenant] = TenantCounters()
        if limit is None:
            counters.admitted += cost
            return 0.0
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.limit != limit:  # new, or its limit changed: start full
            bucket = self._buckets[tenant] = _Bucket(limit.burst, now, limit)
        bucket.tokens = min(limit.burst, bucket.tokens + max(0.0, now - bucket.updated) * limit.rate)
        bucket.updated = now
        need = min(float(cost), limit.burst)
        if bucket.tokens >= need:
            bucket.tokens -= need
            counters.admitted += cost
            return 0.0
        counters.throttled_requests += 1
        counters.throttled_messages += cost
        return (need - bucket.tokens) / limit.rate

    def check(self, tenant: str, cost: int, now: float) -> None:
        """`admit`, raising Throttled (with its Retry-After) when refused."""
        wait = self.admit(tenant, cost, now)
        if wait > 0:
            limit = self.limit_of(tenant)
            assert limit is not None  # only a limited tenant waits
            error = Throttled(
                f"tenant {tenant!r} is over its send rate of {limit.rate:g} messages/s (burst "
                f"{limit.burst:g}): retry in {wait:.2f} s",
                tenant=tenant,
                rate=limit.rate,
                burst=limit.burst,
                retry_after=round(wait, 3),
            )
            error.retry_after = max(wait, 0.001)
            raise error

    # -- run-time changes, persisted ------------------------------------------------------------------
    def set(self, tenant: str, limit: TenantLimit | None) -> None:
        """An operator's limit for `tenant` (None: unlimited), written to `path` before it applies."""
        overrides = {**self.overrides, tenant: limit}
        self._save(overrides)
        self.overrides = overrides

    def clear(self, tenant: str) -> bool:
        """Back to the default; whether the tenant had a limit of its own."""
        if tenant not in self.overrides:
            return False
        overrides = {t: v for t, v in self.overrides.items() if t != tenant}
        self._save(overrides)
        self.overrides = overrides
        return True

    async def update(self, tenant: str, limit: TenantLimit | None) -> None:
        """`set`, through the store when there is one (the admin routes call this)."""
        if self.store is None:
            self.set(tenant, limit)
            return
        await self.store.change(lambda overrides: {**overrides, tenant: limit})

    async def reset(self, tenant: str) -> bool:
        """`clear`, through the store when there is one."""
        if self.store is None:
            return self.clear(tenant)
        had = tenant in self.overrides
        await self.store.change(lambda overrides: {t: v for t, v in overrides.items() if t != tenant})
        return had

    def describe(self, tenant: str) -> dict[str, Any]:
        """The tenant's effective limit, where it comes from, and its counters (admin routes, status)."""
        limit = self.limit_of(tenant)
        counters = self.counters.get(tenant, TenantCounters())
        return {
            "tenant": tenant,
            "limit": None if limit is None else limit.to_dict(),
            "source": "tenant" if tenant in self.overrides else "default",
            "admitted": counters.admitted,
            "throttled_requests": counters.throttled_requests,
            "throttled_messages": counters.throttled_messages,
        }

    def _save(self, overrides: dict[str, TenantLimit | None]) -> None:
        if self.path is None:
            return
        write_private(self.path, encode_overrides(overrides))

    @classmethod
    def load(cls, path: Path, default: TenantLimit | None) -> TenantRateLimiter:
        """The limits kept in `path` (none when it does not exist); a StartupError (one line, exit 2) when it
        is damaged or unreadable: refuse to start rather than forget an operator's limits."""
        limiter = cls(default=default, path=path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return limiter
        except OSError as exc:
            raise StartupError(path, f"cannot read it: {exc.strerror or exc}", "fix its mode") from None
        try:
            limiter.overrides = decode_overrides(raw)
        except ValueError as exc:
            raise StartupError(
                path, f"not a limits file ({exc})", "fix or remove it (then set limits again: strictq limits)"
            ) from None
        return limiter
