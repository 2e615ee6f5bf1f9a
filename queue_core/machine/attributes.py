"""Queue attributes with their SQS/EmoDB defaults and ranges, validated in one place."""

from __future__ import annotations

import dataclasses
import json
import re
import string
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InvalidArgument
from .routing import NO_ROUTING, RoutingTable, parse_routing
from .text import check_json

KIB = 1024
MAX_MESSAGE_SIZE_CEILING = 1024 * KIB
MAX_PROBE_PAYLOAD = 16 * KIB
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")

QueueKind = Literal["queue", "dedup"]
DedupScope = Literal["queue", "group"]
OnExhausted = Literal["park", "dead_letter_message", "dead_letter_group"]
ON_EXHAUSTED = ("park", "dead_letter_message", "dead_letter_group")
OnExpiry = Literal["drop", "dead_letter"]
ON_EXPIRY = ("drop", "dead_letter")
HandoverPolicy = Literal["proceed", "wait"]
HANDOVER_POLICIES = ("proceed", "wait")
MAX_HANDOVER_TIMEOUT = 24 * 3600.0
SECONDS_FIELDS = (
    "visibility_timeout",
    "retention",
    "delay",
    "dedup_window",
    "retry_backoff",
    "retry_backoff_max",
    "backpressure_age",
    "ttl",
    "sideline_age",
    "sideline_rate",
    "handover_timeout",
    "processing_estimate",
    "preprocessing_estimate",
)
RETRY_FIELDS = ("retry_same_worker", "retry_backoff", "retry_backoff_max", "max_attempts", "on_exhausted")


@dataclass(frozen=True, slots=True)
class QueueAttributes:
    """Per-queue settings; times are float seconds. `labels` carries face-specific extras (e.g. FifoQueue)."""

    visibility_timeout: float = 30.0
    max_receive_count: int = 0  # 0: never dead-letter
    dead_letter_queue: str | None = None
    retention: float = 4 * 24 * 3600.0
    delay: float = 0.0
    dedup_window: float = 300.0
    dedup_scope: DedupScope = "queue"
    content_based_dedup: bool = False
    max_message_size: int = 256 * KIB
    kind: QueueKind = "queue"
    labels: dict[str, str] = field(default_factory=dict)
    # Retry workflow (docs/failure-management.md §2); groups may override these five (RetryPolicy).
    retry_same_worker: int = 1  # retries offered only to the worker that failed, before anyone else
    retry_backoff: float = 1.0  # delay before a retry of a reported failure, doubling per attempt
    retry_backoff_max: float = 60.0
    max_attempts: int = 0  # 0: off (max_receive_count / DLQ rules only)
    on_exhausted: OnExhausted = "park"
    log_retention_attempts: int = 50  # attempts of log data the store keeps per group (0: none)
    # Failure management (docs/failure-management.md §3): the payload of the probes (dummy messages) its
    # workers get (JSON; None: {"probe": true}), and whether the proxy may let a fenced worker's probe
    # calls reach the backends (else it answers them by mimicry).
    probe_payload: Any = None
    probe_safe: bool = False
    # Backpressure (gateway.backpressure): past either threshold the edge slows this queue's producers in
    # proportion to the backlog; 0 turns a threshold off (the default: a queue accepts whatever comes).
    backpressure_age: float = 0.0  # seconds: the age of the oldest message
    backpressure_depth: int = 0  # messages in the queue
    # TTL (docs/protections.md): messages older than `ttl` seconds (0: only `retention` applies) leave the
    # queue in order, group head by group head: dropped, or moved to the dead-letter queue with
    # on_expiry="dead_letter" (dropped when the queue has none). Counted (`expired`) and logged.
    ttl: float = 0.0
    on_expiry: OnExpiry = "drop"
    # Fairness (queue_core/machine/scheduling.py, docs/protections.md): a queue shared by tenants names
    # each group `<tenant><separator><rest>`; with a separator, tenants take turns at delivery instead of
    # oldest head first, and the caps, pools and sidelining below apply per tenant. All off by default.
    tenant_separator: str = ""
    tenant_concurrency: int = 0  # a tenant's groups claimed at once, at most (0: no cap)
    group_in_flight: int = 0  # messages of one group in one claim, at most (0: as many as the batch)
    worker_pools: int = 0  # shuffle-sharding: pools of workers (0: one pool, every worker takes all)
    pools_per_tenant: int = 2  # pools each tenant is hashed onto
    sideline_age: float = 0.0  # seconds: an older head sends its group to the spillover lane (0: off)
    sideline_rate: float = 0.0  # messages/s per tenant: sends over it sideline their group (0: off)
    # Group routing (queue_core/machine/routing.py, docs/rollouts.md): pins of group ranges to workers and a
    # rollout's canary share by worker version, as JSON ({"pins": [...], "canary": {...}}); None: off.
    routing: Any = None
    # The queue's rollout as `strictq rollout` last wrote it ({version, steps, step, state, ...}; None: none):
    # kept with the attributes so `strictq rollout status` and a restarted controller find it.
    rollout: Any = None
    # State transfer (docs/state-transfer.md): how long a group moving between workers is held for its
    # donor's local state, and what then: `proceed` (delivered without it) or `wait` (held until released).
    handover_timeout: float = 30.0
    handover_policy: HandoverPolicy = "proceed"
    # Pipelining (machine/estimates.py, docs/pipelining.md): seconds to process / pre-process a message,
    # sent with deliveries to workers that declare `estimates`; 0: not given (learned from attempts).
    processing_estimate: float = 0.0
    preprocessing_estimate: float = 0.0

    def validate(self) -> QueueAttributes:
        _check_range("visibility_timeout", self.visibility_timeout, 0, 12 * 3600)
        _check_range("retention", self.retention, 60, 14 * 24 * 3600)
        _check_range("delay", self.delay, 0, 900)
        _check_range("dedup_window", self.dedup_window, 0, 24 * 3600)
        _check_range("max_message_size", self.max_message_size, 1, MAX_MESSAGE_SIZE_CEILING)
        _check_range("max_receive_count", self.max_receive_count, 0, 1000)
        if self.dedup_scope not in ("queue", "group"):
            raise InvalidArgument("dedup_scope must be 'queue' or 'group'", field="dedup_scope")
        if self.kind not in ("queue", "dedup"):
            raise InvalidArgument("kind must be 'queue' or 'dedup'", field="kind")
        if self.dead_letter_queue is not None:
            validate_queue_name(self.dead_letter_queue)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()):
            raise InvalidArgument("labels must map strings to strings", field="labels")
        check_json(self.labels, "labels")  # stored as JSON text: valid Unicode only
        _check_range("log_retention_attempts", self.log_retention_attempts, 0, 10_000)
        _check_probe_payload(self.probe_payload)
        _check_range("backpressure_age", self.backpressure_age, 0, 14 * 24 * 3600)
        _check_range("backpressure_depth", self.backpressure_depth, 0, 1_000_000_000)
        _check_range("ttl", self.ttl, 0, 14 * 24 * 3600)
        if self.on_expiry not in ON_EXPIRY:
            raise InvalidArgument(f"on_expiry must be one of {', '.join(ON_EXPIRY)}", field="on_expiry")
        _check_scheduling(self)
        _check_routing(self)
        _check_range("handover_timeout", self.handover_timeout, 0.001, MAX_HANDOVER_TIMEOUT)
        if self.handover_policy not in HANDOVER_POLICIES:
            raise InvalidArgument(
                f"handover_policy must be one of {', '.join(HANDOVER_POLICIES)}", field="handover_policy"
            )
        _check_range("processing_estimate", self.processing_estimate, 0, 12 * 3600)
        _check_range("preprocessing_estimate", self.preprocessing_estimate, 0, 12 * 3600)
        self.retry_policy().validate()
        return self

    @property
    def scheduled(self) -> bool:
        """Whether ready groups are scheduled in lanes (scheduling.py) rather than oldest head first."""
        return bool(
            self.tenant_separator
            or self.worker_pools
            or self.tenant_concurrency
            or self.sideline_age
            or self.sideline_rate
        )

    @property
    def routing_table(self) -> RoutingTable:
        """The parsed `routing` (NO_ROUTING when off); validate() has checked it."""
        return parse_routing(self.routing)

    @property
    def lifetime(self) -> float:
        """How long a message stays: the TTL when set and shorter, else the retention period."""
        return min(self.ttl, self.retention) if self.ttl > 0 else self.retention

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            self.retry_same_worker,
            self.retry_backoff,
            self.retry_backoff_max,
            self.max_attempts,
            self.on_exhausted,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueueAttributes:
        return cls().updated(data)

    def updated(self, changes: dict[str, Any]) -> QueueAttributes:
        """A copy with `changes` applied and validated; unknown names are refused, not ignored."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidArgument(f"unknown queue attribute(s): {', '.join(unknown)}", fields=unknown)
        try:
            new = dataclasses.replace(self, **_coerce(changes))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad queue attribute value: {exc}") from exc
        return new.validate()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What happens after a failed attempt: the queue's retry attributes, or a group's override of them."""

    retry_same_worker: int = 1
    retry_backoff: float = 1.0
    retry_backoff_max: float = 60.0
    max_attempts: int = 0
    on_exhausted: OnExhausted = "park"

    def validate(self) -> RetryPolicy:
        _check_range("retry_same_worker", self.retry_same_worker, 0, 100)
        _check_range("retry_backoff", self.retry_backoff, 0, 3600)
        _check_range("retry_backoff_max", self.retry_backoff_max, 0, 12 * 3600)
        _check_range("max_attempts", self.max_attempts, 0, 1000)
        if self.on_exhausted not in ON_EXHAUSTED:
            raise InvalidArgument(
                f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}", field="on_exhausted"
            )
        return self

    def with_override(self, override: dict[str, Any]) -> RetryPolicy:
        """This policy with a group's override applied; the override is checked like attribute changes."""
        unknown = sorted(set(override) - set(RETRY_FIELDS))
        if unknown:
            raise InvalidArgument(
                f"unknown retry policy field(s): {', '.join(unknown)} (known: {', '.join(RETRY_FIELDS)})",
                fields=unknown,
            )
        try:
            return dataclasses.replace(self, **_coerce(override)).validate()
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad retry policy value: {exc}") from exc

    def backoff(self, failures: int) -> float:
        """Delay before the retry after the `failures`-th failure: doubling, capped."""
        if failures < 1 or self.retry_backoff <= 0:
            return 0.0
        return min(self.retry_backoff * 2.0 ** min(failures - 1, 40), self.retry_backoff_max)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """A group's effective retry policy and its override of the queue's ({} when it follows the queue)."""

    effective: RetryPolicy
    override: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"override": dict(self.override), "effective": self.effective.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupPolicy:
        return cls(RetryPolicy(**data["effective"]), dict(data["override"]))


def _coerce(changes: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name in SECONDS_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"{name} must be a number of seconds", field=name)
            value = float(value)
        elif name in (
            "max_receive_count",
            "max_message_size",
            "retry_same_worker",
            "max_attempts",
            "log_retention_attempts",
            "backpressure_depth",
            "tenant_concurrency",
            "group_in_flight",
            "worker_pools",
            "pools_per_tenant",
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgument(f"{name} must be an integer", field=name)
        elif name in ("content_based_dedup", "probe_safe"):
            if not isinstance(value, bool):
                raise InvalidArgument(f"{name} must be a boolean", field=name)
        elif name == "labels":
            if not isinstance(value, dict):
                raise InvalidArgument("labels must be an object", field=name)
            value = dict(value)
        out[name] = value
    return out


SCHEDULING_FIELDS = (
    "tenant_separator",
    "tenant_concurrency",
    "group_in_flight",
    "worker_pools",
    "pools_per_tenant",
    "sideline_age",
    "sideline_rate",
)


def _check_scheduling(attrs: QueueAttributes) -> None:
    separator = attrs.tenant_separator
    punctuation = isinstance(separator, str) and (separator == "" or separator in string.punctuation)
    if not punctuation or len(separator) > 1:
        raise InvalidArgument(
            "tenant_separator must be one ASCII punctuation character (e.g. ':'), or '' for no tenants",
            field="tenant_separator",
        )
    _check_range("tenant_concurrency", attrs.tenant_concurrency, 0, 100_000)
    _check_range("group_in_flight", attrs.group_in_flight, 0, 10_000)
    _check_range("worker_pools", attrs.worker_pools, 0, 1024)
    _check_range("pools_per_tenant", attrs.pools_per_tenant, 1, 1024)
    _check_range("sideline_age", attrs.sideline_age, 0, 14 * 24 * 3600)
    _check_range("sideline_rate", attrs.sideline_rate, 0, 1_000_000)
    for name in ("tenant_concurrency", "worker_pools", "sideline_rate"):
        if getattr(attrs, name) and not separator:
            raise InvalidArgument(
                f"{name} works per tenant: set tenant_separator too (groups named <tenant>:<rest>)",
                field=name,
            )


ROUTING_FIELDS = ("routing",)
MAX_ROLLOUT = 4096


def _check_routing(attrs: QueueAttributes) -> None:
    if attrs.rollout is not None:
        if not isinstance(attrs.rollout, dict):
            raise InvalidArgument("rollout must be an object", field="rollout")
        check_json(attrs.rollout, "rollout")
        if len(json.dumps(attrs.rollout, allow_nan=False)) > MAX_ROLLOUT:
            raise InvalidArgument(f"rollout must be at most {MAX_ROLLOUT} bytes of JSON", field="rollout")
    table = parse_routing(attrs.routing)
    if table != NO_ROUTING and attrs.scheduled:
        # Routes and tenant lanes are two different splits of the ready groups; combining them (lanes per
        # route) is not built yet, so the combination is refused rather than half-honoured.
        raise InvalidArgument(
            "routing (pins, canary) cannot be combined with tenant fairness settings on one queue yet",
            field="routing",
        )


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}, got {value}", field=name)


def _check_probe_payload(value: Any) -> None:
    """Any JSON value up to MAX_PROBE_PAYLOAD bytes serialised (it travels in every probe)."""
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")))
    except (TypeError, ValueError):
        raise InvalidArgument("probe_payload must be a JSON value", field="probe_payload") from None
    check_json(value, "probe_payload")  # stored with the attributes as UTF-8 JSON
    if size > MAX_PROBE_PAYLOAD:
        message = f"probe_payload must be at most {MAX_PROBE_PAYLOAD} bytes"
        raise InvalidArgument(message, field="probe_payload")


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise InvalidArgument(
            "queue names are 1-128 characters of letters, digits, '_', '-' and '.'", field="queue"
        )
    return name
