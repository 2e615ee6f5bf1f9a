"""Failure management's state as the operator's dashboard reads it, wherever failure management runs.

Why a port of its own: the dashboard shows the workers' states, the suspended queues, the latest events
and the top error cases; failure management runs beside the core in one process, inside the queue server
behind `--queue-server`, and as a cluster's decider on one queue server. Each place answers `status` (the
document of `GET /admin/v1/status`, already cut to the caller's scope) and, where it keeps them, the failed
attempts of its window by signature; the dashboard depends on this protocol only, so its failure panel
is the same page in every topology.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .failures import FailureManager
from .health_http import scoped_status
from .scope import Scope


@dataclass(frozen=True, slots=True)
class ErrorCases:
    """Failed attempts still in failure management's window (`window` seconds), by signature: count,
    workers, queues, the latest reason and time (HealthMonitor.failure_signatures' rows)."""

    window: float
    cases: list[dict[str, Any]]


class HealthView(Protocol):
    async def status(self, scope: Scope, latest: int) -> dict[str, Any]: ...

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        """None where failure management keeps no such tally for this caller to read."""
        ...


class LocalHealthView:
    """Failure management beside the core, in this process."""

    def __init__(self, manager: FailureManager) -> None:
        self.manager = manager

    async def status(self, scope: Scope, latest: int) -> dict[str, Any]:
        return scoped_status(self.manager, scope, latest)

    async def error_cases(self, scope: Scope, now: float) -> ErrorCases | None:
        within = None if scope.operator else scope.sees_queue
        found = self.manager.monitor.failure_signatures(now, within)
        return ErrorCases(self.manager.settings.window, found)
