"""An edge's way to the cluster's decider (cluster.decider): NATS request/reply on `sq.<id>.decider.api`,
with the cluster's credentials (the edge's own connection). During a takeover nobody answers for up to
the lease's TTL: requests are retried that long, then a retriable 503."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from protocol.errors import StrictqError

from .layout import DECIDER_TTL, ClusterLayout

REQUEST_TIMEOUT = 5.0
GIVE_UP = 3 * DECIDER_TTL  # a lease expiring, another node taking it and replaying the window


class DeciderUnavailable(StrictqError):
    """No node holds the decider right now (a takeover, or failure management is off on every node)."""

    status = 503
    code = "decider_unavailable"
    retriable = True


class DeciderClient:
    def __init__(self, nc: NatsClient, layout: ClusterLayout) -> None:
        self._nc = nc
        self._subject = layout.decider_subject

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """The holder's answer to one operation; DeciderUnavailable when none answers within GIVE_UP."""
        body = orjson.dumps({"op": op, **fields})
        deadline = time.monotonic() + GIVE_UP
        while True:
            try:
                msg = await self._nc.request(self._subject, body, timeout=REQUEST_TIMEOUT)
                answer = orjson.loads(msg.data)
            except (NoRespondersError, NatsTimeoutError, TimeoutError, orjson.JSONDecodeError):
                answer = None
            if isinstance(answer, dict):
                error = answer.get("error")
                if not (isinstance(error, dict) and error.get("code") == "not_decider"):
                    if isinstance(error, dict):
                        raise DeciderUnavailable(str(error.get("message") or "the decider failed"))
                    return answer
            if time.monotonic() >= deadline:
                raise DeciderUnavailable(
                    "no node holds failure management's decider (started with --no-health, or taking over)"
                )
            await asyncio.sleep(0.2)
