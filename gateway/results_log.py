"""Wire-log `log` records: one per attempt result a worker reports through the gateway (schema v1,
docs/failure-management.md §1), written by the gateway's delivery log writer (gateway.deliveries), so a
message's story shows what the worker said it did beside the proxy's `http` records.

`request_id` is the id of the request that sent the message, as the delivery gave it to the worker and
the worker reported it back with its result (the SDK does), so a producer's request id finds what every
worker said it did. Fields beyond the schema's `outcome`, `reason`, `steps`, `partial`: `signature`,
`fields`, `duration_ms`, `status` (the core's answer: a refused result is recorded too, marked),
`tenant`, `face`, `position`. Steps, partial results and fields pass the same JSON redaction as delivered
bodies. Like deliveries, writing never fails or slows the request: errors are counted and logged by the
writer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from access.keys import Credential
from queue_core.machine import AckOutcome
from queue_core.machine.inputs import AttemptResult
from queue_core.machine.records import ReportOutcome
from wirelog.record import log_record

from .deliveries import deliveries_of


def log_results(
    request: web.Request,
    credential: Credential,
    face: str,
    queue: str,
    results: Sequence[AttemptResult],
    outcomes: Sequence[AckOutcome],
) -> None:
    """`queue`: the name the worker used. A no-op when the gateway runs without a delivery log."""
    deliveries = deliveries_of(request)
    if deliveries is None:
        return
    redact = deliveries.redactor.value
    now = time.time()
    for position, (result, outcome) in enumerate(zip(results, outcomes, strict=False)):
        known = isinstance(outcome, ReportOutcome) and bool(outcome.group)
        record: dict[str, Any] = log_record(
            outcome=result.outcome,
            reason=result.reason or None,
            steps=redact(list(result.steps)) if result.steps else None,
            partial=redact(result.partial) if result.partial is not None else None,
            worker=credential.id,
            queue=queue,
            message_id=result.message_id,
            group=outcome.group if known and isinstance(outcome, ReportOutcome) else None,
            lease=result.token,
            attempt=outcome.attempt if known and isinstance(outcome, ReportOutcome) else None,
            ts=now,
            request_id=result.request_id,  # the worker's word: the request id its delivery carried
        )
        record.update(
            signature=result.signature or None,
            fields=redact(result.fields) if result.fields is not None else None,
            duration_ms=result.duration_ms,
            status=outcome.status,
            tenant=credential.tenant,
            face=face,
            position=position,
        )
        deliveries._write(record)  # the writer's guarded write (counts errors, feeds its listener)
