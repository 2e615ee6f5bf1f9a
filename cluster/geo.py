"""Where a request comes from, as the edge that took it judged it: read by the cluster backend.

The gateway resolves each request's client region (gateway.client_region: a trusted header, the address
behind a trusted front proxy or the peer address looked up in a CIDR table, else the edge's own region) and
sets `CLIENT_REGION` for the request's task; cluster.backend reads it to measure where each partition's
sends come from (only `trusted` answers count: a client's own claim must not move other tenants'
partitions) and to offer a worker the partitions owned in its region first (any answer: it orders only
that caller's own polling). A context variable, because the faces call the backend through the
`QueueBackend` protocol, which single-process serving shares and which has no notion of regions.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

Source = Literal["header", "forwarded", "address", "edge", "claimed"]


@dataclass(frozen=True, slots=True)
class ClientRegion:
    region: str  # "" unknown
    source: Source  # how the edge knows: a trusted header, X-Forwarded-For, the CIDR table, its own region;
    #                 "claimed": the client's header on an edge that does not trust it

    @property
    def trusted(self) -> bool:
        return self.source != "claimed" and bool(self.region)


CLIENT_REGION: ContextVar[ClientRegion | None] = ContextVar("strictq_client_region", default=None)


def client_region() -> ClientRegion | None:
    return CLIENT_REGION.get()
