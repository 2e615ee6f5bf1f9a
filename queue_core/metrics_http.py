"""`GET /metrics`: the app's Prometheus registry, scoped to the caller, on the gateway and the queue server.

Series name queues, and queue names are a tenant's business, so a scrape needs a key-file credential (in
`X-BV-API-Key`, or `Authorization: Bearer <secret>`, which Prometheus' `authorization` scrape setting sends):
an `operator` sees every series; an `admin` only series of its own tenant's queues and workers (within its
prefixes; queues of no tenant too on the queue server), never the process-wide ones (no `tenant` label);
other roles 403, none 401, as the one JSON error body (queue_core.admin_http).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from access import tenancy
from access.keys import KeyRing
from access.permissions import READ_ROLES

from .admin_http import ADMIN_KEYS, errors_as_json, scope_of
from .scope import Scope


class Collector(Protocol):
    """What generate_latest reads: prometheus_client's registries and collectors."""

    def collect(self) -> Iterable[Metric]: ...


# A scrape's asynchronous read (the queues' figures through the backend port, queue_core.metrics_export):
# awaited once per scrape, it gives the collector over what it read.
ScrapeSource = Callable[[], Awaitable[Collector]]
METRICS_REGISTRY = web.AppKey("strictq_metrics_registry", CollectorRegistry)
METRICS_SOURCES = web.AppKey("strictq_metrics_sources", list[ScrapeSource])


class Scrape:
    """The app's registry and what this scrape's sources read, as one collector."""

    def __init__(self, registry: CollectorRegistry, collectors: Sequence[Collector]) -> None:
        self.registry = registry
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        for collector in self.collectors:
            yield from collector.collect()


class ScopedView:
    """The registry's families with only the samples `scope` may see (a collector for generate_latest)."""

    def __init__(self, registry: Collector, scope: Scope) -> None:
        self.registry = registry
        self.scope = scope

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if self.sees(s.labels)]
            if not samples:
                continue
            shown = Metric(family.name, family.documentation, family.type, family.unit)
            shown.samples = samples
            yield shown

    def sees(self, labels: dict[str, str]) -> bool:
        scope = self.scope
        tenant = labels.get("tenant")
        if tenant is None:
            return False  # process-wide (request counts of every tenant): operators only
        queue = labels.get("queue")
        if queue is None:  # a tenant's workers or fences
            return tenant == scope.credential.tenant if tenant else scope.untenanted
        if not tenant:
            return scope.sees_queue(queue)
        return scope.sees_queue(tenancy.core_name(tenant, queue, labels.get("face", tenancy.DEFAULT_FACE)))


def add_metrics_route(
    app: web.Application, registry: CollectorRegistry, keys: KeyRing, sources: Sequence[ScrapeSource] = ()
) -> None:
    """Serve `registry` and what `sources` read at each scrape at GET /metrics; `keys` authenticate
    scrapes (the admin routes' key ring if set)."""
    app[METRICS_REGISTRY] = registry
    app[METRICS_SOURCES] = list(sources)
    if ADMIN_KEYS not in app:
        app[ADMIN_KEYS] = keys
    app.router.add_get("/metrics", metrics)


@errors_as_json
async def metrics(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request, READ_ROLES)
    collectors = [await source() for source in request.app[METRICS_SOURCES]]
    scrape = Scrape(request.app[METRICS_REGISTRY], collectors)
    body = generate_latest(scrape if scope.operator else ScopedView(scrape, scope))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
