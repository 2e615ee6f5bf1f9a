"""The failover scenario's report: what happened, with its timings read back from the wire log."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wirelog.reader import read_records


@dataclass(slots=True)
class Outage:
    """One backend outage: when it began, was judged shared, suspended the queue, ended, and resumed."""

    at: float
    shared_failure: float | None = None
    suspended: float | None = None
    recovered: float = 0.0
    resumed: float | None = None
    first_delivery: float | None = None  # the first real message delivered after `recovered`


@dataclass(slots=True)
class Report:
    """What happened, with the timings read back from the wire log (float seconds since the epoch)."""

    sent: int = 0
    done: int = 0
    lost: int = 0
    duplicates: int = 0
    order_violations: int = 0
    overlaps: list[str] = field(default_factory=list)
    superseded: int = 0  # handlers still running when their claim was taken away (harmless: fenced)
    workers: int = 0
    faulty_worker: str = ""
    faulty_at: float = 0.0
    first_failure: float | None = None  # the faulty worker's first failed call or attempt
    fence_decided: float | None = None  # the fence event
    fence_effective: float | None = None  # its first call the proxy blocked
    unfenced: float | None = None
    calls_while_fenced: int = 0  # the faulty worker's order/canary calls that reached the backend meanwhile
    blocked_while_fenced: int = 0  # its calls the proxy refused meanwhile
    failed_elsewhere: int = 0  # messages it failed that other workers finished
    faulty_failed: list[tuple[str, int]] = field(default_factory=list)  # (group, order) it failed, faulty
    outages: list[Outage] = field(default_factory=list)
    fences_during_outage: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    duration: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.order_violations == 0 and self.duplicates == 0 and not self.overlaps

    def _span(self, start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else end - start

    @property
    def time_to_fence(self) -> float | None:
        """First failure -> the fence in force at the proxy (its first blocked call)."""
        return self._span(self.first_failure, self.fence_effective)

    @property
    def time_to_fence_decision(self) -> float | None:
        return self._span(self.first_failure, self.fence_decided)

    @property
    def recovery_to_resume(self) -> list[float]:
        return [o.resumed - o.recovered for o in self.outages if o.resumed is not None]

    @property
    def recovery_to_delivery(self) -> list[float]:
        """Backend recovery -> the first real message delivered again (the gateway's delivery record)."""
        return [o.first_delivery - o.recovered for o in self.outages if o.first_delivery is not None]

    def figures(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "acked": self.done,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "order_violations": self.order_violations,
            "overlaps": len(self.overlaps),
            "superseded": self.superseded,
            "workers": self.workers,
            "time_to_fence_s": self.time_to_fence,
            "time_to_fence_decision_s": self.time_to_fence_decision,
            "recovery_to_resume_s": self.recovery_to_resume,
            "recovery_to_delivery_s": self.recovery_to_delivery,
            "outage_to_suspend_s": [o.suspended - o.at for o in self.outages if o.suspended is not None],
            "calls_while_fenced": self.calls_while_fenced,
            "blocked_while_fenced": self.blocked_while_fenced,
            "fences_during_outage": len(self.fences_during_outage),
            "probe_interval_s": self.settings.get("probe_interval"),
            "duration_s": self.duration,
        }


def read_timings(report: Report, wirelogs: list[Path]) -> None:
    """Fill the wire-log timings from every wire log of the system (a cluster's edges' each): every time
    is a record's `ts` (or an event's `at`), none a local guess."""
    faulty = report.faulty_worker
    records = (record for wirelog in wirelogs for record in read_records(wirelog))
    for record in records:
        kind, ts, worker = record.get("kind"), record.get("ts"), record.get("worker")
        if not isinstance(ts, int | float):
            continue
        if worker == faulty and ts >= report.faulty_at:
            response = record.get("response") or {}
            failed = (
                kind == "http"
                and record.get("action") == "pass"
                and (record.get("error") or (response.get("status") or 0) >= 400)
            ) or (kind == "log" and record.get("outcome") in ("failed", "partial"))
            if failed and (report.first_failure is None or ts < report.first_failure):
                report.first_failure = ts
            if kind == "http" and record.get("action") == "block":
                if report.fence_effective is None or ts < report.fence_effective:
                    report.fence_effective = ts
        if kind == "delivery" and not str(record.get("message_id") or "").startswith("probe-"):
            for outage in report.outages:
                if (
                    outage.recovered
                    and ts >= outage.recovered
                    and (outage.first_delivery is None or ts < outage.first_delivery)
                ):
                    outage.first_delivery = ts
