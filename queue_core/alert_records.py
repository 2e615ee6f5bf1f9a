"""Known-error-case alerts read from the wire log: the `event: alert` records `strictq errors`' alert rules
write (writer `spark-alerts`), as failure management acts on them (docs/failure-management.md).

Why a module of its own: one process's failure manager follows its data dir's wire log beside the core
(queue_core.failures), and a cluster's edge follows its own and hands each alert to the decider
(strictq.cluster_health); both read the records, and turn one into an alert, with the code here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from access.tenancy import core_name

log = logging.getLogger("strictq.health")
ALERT_POLL = 2.0  # seconds between looks for new alert records in the wire log
ALERT_WRITER = "spark-alerts"  # spark.alerts.WRITER (not imported: that package pulls in pyspark)


@dataclass(frozen=True, slots=True)
class WireAlert:
    """One alert record: its reason, the queue it names (as written: the tenant's name when `tenant` is
    set) or None, its signatures, and the tenant whose queues alone it reaches (None: any queue)."""

    reason: str
    queue: str | None
    signatures: list[str]
    tenant: str | None

    def core_queue(self, exists: Callable[[str], bool]) -> str | None:
        """The core name of the queue it names: as written when `exists` knows it, else the tenant's."""
        if self.queue is None or exists(self.queue) or not self.tenant:
            return self.queue
        return core_name(self.tenant, self.queue)


def wire_alert(record: dict[str, Any], fresh_after: float) -> WireAlert | None:
    """The alert of an `event: alert` record written after `fresh_after` (older ones were acted on
    before), or None for any other record."""
    ts = record.get("ts")
    if record.get("event") != "alert" or not isinstance(ts, int | float) or ts < fresh_after:
        return None
    alert = record.get("alert")
    details: dict[str, Any] = alert if isinstance(alert, dict) else {}
    signatures = [s for s in [details.get("signature"), *(details.get("signatures") or [])] if s]
    queue = record.get("queue")
    tenant = record.get("tenant")
    return WireAlert(
        str(record.get("reason") or details.get("rule") or "alert"),
        queue if isinstance(queue, str) else None,
        [str(s) for s in signatures],
        # A record of one tenant reaches only that tenant's queues; one without: any (the operator's rule).
        tenant if isinstance(tenant, str) and tenant else None,
    )


class AlertFollower:
    """New records of the alert writer's segments only (the proxy's busy segments are never read)."""

    def __init__(self, directory: Path) -> None:
        from wirelog.reader import Follower, RecordFilter

        self.directory = directory
        self._follower = Follower(directory, where=RecordFilter(kind="event"))

    def poll(self) -> list[dict[str, Any]]:
        from wirelog.layout import TMP, parse_segment_name

        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        names: dict[tuple[str, int, str], Any] = {}
        for entry in entries:
            name = parse_segment_name(entry)
            if name is not None and name.writer == ALERT_WRITER and name.state != TMP:
                names.setdefault(name.key, name)
        found: list[dict[str, Any]] = []
        for key in sorted(names):
            found.extend(self._follower.read_segment(names[key]))
        return found


async def follow_alerts(
    directory: Path, fresh_after: float, poll: float, act: Callable[[WireAlert], Awaitable[None]]
) -> None:
    """Act on every fresh alert record of `directory`'s wire log, looking every `poll` seconds, until
    cancelled; a record that cannot be read or acted on is logged, and the next one is read."""
    follower = AlertFollower(directory)
    while True:
        try:
            records = await asyncio.to_thread(follower.poll)
        except Exception:
            log.exception("cannot read alert records in %s", directory)
            records = []
        for record in records:
            alert = wire_alert(record, fresh_after)
            if alert is None:
                continue
            try:
                await act(alert)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the decider away, a queue gone: one line, the next record
                log.warning("alert %r not acted on: %s", alert.reason, exc)
        await asyncio.sleep(poll)
