"""The failover scenario's shape and names: its settings (failure management's flags of `strictq serve`
among them), the queue and tenant it uses, the headers its fake backend counts calls by."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

QUEUE = "orders"
TENANT = "dev"
WORKER_HEADER = "X-Demo-Worker"  # who made a call, for the backend's per-worker counts
KIND_HEADER = "X-Demo-Kind"  # order | probe | canary | startup
GOOD_BASE, BAD_BASE = "/v1", "/v0"
Say = Callable[[str], None]


class ScenarioError(Exception):
    """A phase did not happen within its bounded wait (the message says which and what was seen)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The scenario's shape and failure management's settings (flags of `strictq serve`)."""

    workers: int = 3
    faulty: int = 0  # index of the worker that turns faulty (default: the last one)
    groups: int = 12
    round_interval: float = 0.25  # the producer sends one order per group this often
    work: float = 0.02  # seconds a handler "works" before it charges
    concurrency: int = 2  # groups per worker at once
    ttl: float = 10.0
    poll_wait: float = 1.0  # the workers' long poll (a stop waits for the poll in flight)
    # strictq serve --health-window ... (docs/failure-management.md §3)
    window: float = 20.0
    fence_after: int = 4
    probe_interval: float = 1.0
    probe_backoff_max: float = 1.0  # = probe_interval: a suspended queue is probed at a steady pace
    probe_timeout: float = 3.0
    blacklist_after: int = 5
    shared_failure_workers: int = 2
    large_scale_fraction: float = 0.5
    # per-group retry policy (PUT /admin/v1/queues/orders/groups/policy)
    retry_backoff: float = 0.2
    retry_backoff_max: float = 1.0
    outages: int = 1
    outage_hold: float = 1.0  # the backend stays down this long once the queue is suspended
    outage_jitter: float = 0.0  # plus up to this much (random): recovery at any phase of the probe cycle
    canary_interval: float = 0.05
    phase_timeout: float = 30.0
    drain_timeout: float = 45.0

    @property
    def faulty_worker(self) -> str:
        return f"worker-{(self.faulty or self.workers)}"

    def serve_flags(self) -> list[str]:
        return [
            *("--health-window", f"{self.window:g}"),
            *("--fence-after", str(self.fence_after)),
            *("--probe-interval", f"{self.probe_interval:g}"),
            *("--probe-backoff-max", f"{max(self.probe_backoff_max, self.probe_interval):g}"),
            *("--probe-timeout", f"{self.probe_timeout:g}"),
            *("--blacklist-after", str(self.blacklist_after)),
            *("--shared-failure-workers", str(self.shared_failure_workers)),
            *("--large-scale-fraction", f"{self.large_scale_fraction:g}"),
        ]
