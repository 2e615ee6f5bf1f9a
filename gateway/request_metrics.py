"""`strictq_http_requests_total{face,status_class}`: the gateway's requests counted by a middleware.

The hot path pays one path test and one list increment: counts sit in a list per face indexed by
`status // 100`, and label values are made only when Prometheus scrapes (the collector below).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, Metric

FACES = ("sqs", "emodb", "admin", "other")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def face_of(path: str) -> str:
    """SQS JSON at `POST /`, EmoDB under /queue/1 and /dedupq/1, admin routes and /metrics; the rest other."""
    if path == "/":
        return "sqs"
    if path.startswith(("/queue/", "/dedupq/")):
        return "emodb"
    if path.startswith("/admin/") or path == "/metrics":
        return "admin"
    return "other"


class RequestCounter:
    """Counts per face and status class; a collector for the app's registry."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {face: [0] * 10 for face in FACES}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        row = self.counts[face_of(request.path)]
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            row[exc.status // 100] += 1
            raise
        except asyncio.CancelledError:
            raise  # the client went away: no answer to count
        except Exception:
            row[5] += 1  # aiohttp answers it 500
            raise
        row[response.status // 100] += 1
        return response

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "strictq_http_requests",
            "Requests the gateway answered, by face (sqs, emodb, admin, other) and status class (2xx...).",
            labels=["face", "status_class"],
        )
        for face, row in self.counts.items():
            for index, n in enumerate(row):
                if n:
                    family.add_metric([face, f"{index}xx"], n)
        yield family
