"""The EmoDB face's part of state transfer (docs/state-transfer.md): the `X-Strictq-Handover` header of a
poll answer naming the groups whose local state the worker should upload. Every backend serves state
transfer through the port (queue_core.backend: `export_requests`, `put_state`), so it works in one
process, behind `--queue-server` and in a cluster alike.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from protocol import headers
from queue_core.backend import QueueBackend

HANDOVER_HEADER = headers.HANDOVER
MAX_HEADER_BYTES = 4096  # the header's value, at most (groups past it are named on a later poll)


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
    """Name the groups `worker` should export now, if any."""
    groups = service.export_requests(queue, worker)
    if groups:
        response.headers[HANDOVER_HEADER] = encode_groups(groups)
