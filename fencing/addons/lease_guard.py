"""Lease guard addon: a worker that lost its claim cannot cause side effects (Kleppmann's fencing).

A tagged call carries the fencing token of the worker's claim (`X-Strictq-Lease`). Only the newest
token of a (queue, group) is valid: its floor, published by the core on the control stream. The queue is
the core's name built from the worker credential's tenant and the tag's queue reference (`orders` ->
`<tenant>.orders`, `dedupq/orders` -> `<tenant>_dedupq.orders`; `CallContext.internal_queue`). A call
tagged below the floor is refused with 409 (action `stale-lease`, code `stale_lease`; the SDK cancels
the handler); while the control stream is not synchronised the proxy cannot know the floors, so every
tagged call gets 503 `unsynced` (fail closed). Untagged calls are not the guard's business (the fence
addon handles those of fenced workers). Either way the call never reaches the backend.

The check runs at `requestheaders` (before any body is read or any upstream connection considered)
and again at `request` for contexts completed later; both are two dict lookups.
"""

from __future__ import annotations

from mitmproxy import http

from fencing.context import context_of, refuse
from fencing.control_client import ControlState
from protocol import errors
from wirelog.record import ACTION_STALE_LEASE, ACTION_UNSYNCED


class LeaseGuard:
    """409 `stale_lease` below the floor, 503 `unsynced` while the control stream is not synchronised."""

    def __init__(self, state: ControlState) -> None:
        self.state = state
        self.refused_stale = 0
        self.refused_unsynced = 0

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._check(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        self._check(flow)

    def _check(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return  # already answered (an earlier guard, a 400 for bad tags, ...)
        ctx = context_of(flow)
        if ctx is None or not ctx.tagged:
            return
        state = self.state
        if not state.synced:
            self.refused_unsynced += 1
            refuse(
                flow,
                ctx,
                status=503,
                action=ACTION_UNSYNCED,
                code=errors.UNSYNCED,
                message="the proxy is not synchronised with the queue core's control stream; "
                "tagged calls are refused until it is (retry shortly)",
                extra_headers={"Retry-After": "1"},
            )
            flow.request.stream = False
            return
        lease, group, queue = ctx.lease, ctx.group, ctx.internal_queue
        if lease is None or group is None or queue is None:
            return  # tagging refuses malformed tags itself; nothing to compare against
        floor = state.floors.get((queue, group))
        if floor is not None and lease < floor:
            self.refused_stale += 1
            refuse(
                flow,
                ctx,
                status=409,
                action=ACTION_STALE_LEASE,
                code=errors.STALE_LEASE,
                message=f"lease {lease} of group {group!r} in queue {ctx.queue_ref!r} is below the group's "
                f"floor {floor}: a newer claim holds the group, this worker's claim is gone",
            )
            flow.request.stream = False
