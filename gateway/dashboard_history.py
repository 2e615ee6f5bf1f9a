"""A short in-memory history of every queue's backlog age for the dashboard's charts.

The gateway samples the queues' figures through the backend port (`QueueBackend.figures`, the figures
`/metrics` exposes: in process, from a queue server, or summed over a cluster's partitions) every `interval`
seconds and keeps the latest `samples` of each queue's oldest-message age and AgeOfFirstAttempt: with the
defaults (5 s, 120 samples) the last ten minutes. Memory is bounded: at most `max_queues` queues have a
history (those seen first keep theirs; a queue that disappears loses its history), so at most
`max_queues * samples` pairs of floats. Nothing is kept on disk: a restart starts the charts afresh.

`sparkline` turns one series into the points of a small SVG polyline (server-side: the page needs no
charting library).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from queue_core.backend import QueueBackend
from queue_core.figures import Figures
from queue_core.machine import QueueError

log = logging.getLogger("strictq.dashboard")
INTERVAL = 5.0
SAMPLES = 120
MAX_QUEUES = 2000


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # the core's clock (wall time)
    oldest_age: float
    unattempted_age: float


class BacklogHistory:
    def __init__(
        self,
        figures: Callable[[], Awaitable[Figures]],
        *,
        interval: float = INTERVAL,
        samples: int = SAMPLES,
        max_queues: int = MAX_QUEUES,
    ) -> None:
        self._figures = figures
        self.interval = interval
        self.samples = samples
        self.max_queues = max_queues
        self._series: dict[str, deque[Sample]] = {}
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, backend: QueueBackend, *, interval: float = INTERVAL) -> BacklogHistory:
        """Sampling `backend`'s queues (their figures without their groups)."""
        return cls(lambda: backend.figures(top=0), interval=interval)

    async def sample(self) -> None:
        """Take one sample of every queue now (the sampler calls it every `interval`); nothing while
        the store is not open."""
        figures = await self._figures()
        if not figures.ready:
            return
        at = figures.at
        seen = set()
        for gauge in (q.gauges for q in figures.queues):
            seen.add(gauge.name)
            series = self._series.get(gauge.name)
            if series is None:
                if len(self._series) >= self.max_queues:
                    continue
                series = self._series[gauge.name] = deque(maxlen=self.samples)
            series.append(Sample(at, gauge.oldest_age, gauge.oldest_unattempted_age))
        for gone in [name for name in self._series if name not in seen]:
            del self._series[gone]

    def series(self, queue: str) -> Sequence[Sample]:
        return tuple(self._series.get(queue, ()))

    # ------------------------------------------------------------------------------------- the sampler
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except QueueError as exc:  # a queue server or partition unreachable: no sample this time
                log.debug("dashboard: no backlog sample: %s", exc)
            except Exception:  # a bug here must not end the charts for good, nor the process
                log.exception("dashboard: cannot sample the queues' backlog")
            await asyncio.sleep(self.interval)


def sparkline(
    values: Sequence[float], width: float, height: float, top: float | None = None, pad: float = 1.5
) -> str:
    """The `points` of an SVG polyline drawing `values` left to right in a width x height box, `top`
    (default: the largest value) at the top, 0 at the bottom ("" when there is nothing to draw)."""
    if not values:
        return ""
    top = max(max(values) if top is None else top, 1e-9)
    if len(values) == 1:
        values = [values[0], values[0]]
    step = (width - 2 * pad) / (len(values) - 1)
    points = []
    for i, value in enumerate(values):
        x = pad + i * step
        y = height - pad - (max(value, 0.0) / top) * (height - 2 * pad)
        points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points)
