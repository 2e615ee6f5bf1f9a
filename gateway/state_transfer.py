"""The EmoDB face's part of state transfer (docs/state-transfer.md): which backend can do it, and the
`X-Strictq-Handover` header of a poll answer naming the groups whose local state the worker should upload.

Only a core in this process keeps transferred state (queue_core.machine.handover); behind a remote queue
server or a cluster the upload route answers 501 and poll answers carry no header, so a worker declaring
`state` works there as before (its state just does not move).
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from protocol import headers
from protocol.errors import StrictqError
from queue_core.backend import QueueBackend
from queue_core.service import QueueService

HANDOVER_HEADER = headers.HANDOVER
MAX_HEADER_BYTES = 4096  # the header's value, at most (groups past it are named on a later poll)


class StateTransferUnsupported(StrictqError):
    status = 501
    code = "not_implemented"


def state_service(service: QueueBackend) -> QueueService:
    """The in-process core behind `service`; StateTransferUnsupported (501) for a remote one."""
    if not isinstance(service, QueueService):
        raise StateTransferUnsupported(
            "state transfer needs the queue core in the gateway's process (`strictq serve` without"
            " --queue-server or a cluster)"
        )
    return service


def encode_groups(groups: list[str], limit: int = MAX_HEADER_BYTES) -> str:
    """Percent-encoded names, comma-separated, cut to whole names within `limit` bytes."""
    parts: list[str] = []
    used = 0
    for group in groups:
        part = quote(group, safe="")
        if used + len(part) + 1 > limit:
            break
        parts.append(part)
        used += len(part) + 1
    return ",".join(parts)


def add_handover_header(response: web.StreamResponse, service: QueueBackend, queue: str, worker: str) -> None:
    """Name the groups `worker` should export now, if any (nothing for a remote core)."""
    if isinstance(service, QueueService) and queue in service.core.queues:
        groups = service.export_requests(queue, worker)
        if groups:
            response.headers[HANDOVER_HEADER] = encode_groups(groups)
