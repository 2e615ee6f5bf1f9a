"""Synthetic wire-log traffic with realistic entropy, written by the real wire-log writer.

Used by the tests, the benchmark and demos: uuid message ids, per-group order, deliveries and
retries, outbound calls to varied hosts and paths with JSON bodies (~600 bytes a record), worker
logs, fence events, and a known mix of failures (so error grouping has something to find). The
same seed gives the same records. Messages go out three to a send request: deliveries, calls and
logs carry that request's id (`request_id_of`; fence events carry none, as the gateway writes them).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from wirelog.record import (
    delivery_record,
    event_record,
    http_record,
    http_request,
    http_response,
    log_record,
)

BASE_TS = 1_795_341_600.0  # 2026-11-22T10:00:00Z

# (weight, method, host, path template, status, error template): the known failure cases.
FAILURES: tuple[tuple[int, str, str, str, int | None, str | None], ...] = (
    (5, "POST", "api.payments.example", "/v1/charges/{id}/capture", 502, None),
    (3, "GET", "inventory.internal:8443", "/v2/items/{id}", 503, None),
    (
        2,
        "POST",
        "db-gateway.internal",
        "/query",
        None,
        "connection refused to '{host}' port {port} after {ms} ms",
    ),
    (2, "PUT", "api.shipping.example", "/v1/orders/{id}/label", 500, None),
)
LOG_FAILURES = (
    "card_declined for order {n}: code '{code}'",
    "timeout after {ms} ms waiting for lock {hex}",
)
HOSTS = tuple(f"api-{i}.{dom}" for i in range(8) for dom in ("example.com", "example.net", "svc.internal"))
PATHS = (
    "/v1/customers/{id}",
    "/v1/orders/{id}/items",
    "/v2/search",
    "/v1/notify",
    "/v3/accounts/{id}/balance",
)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo")


@dataclass(frozen=True, slots=True)
class SampleSpec:
    messages: int = 200
    groups: int = 40
    workers: int = 6
    queues: tuple[str, ...] = ("orders", "payments", "emails")
    failure_rate: float = 0.15  # share of attempts whose first call fails in a known way
    seed: int = 7
    start: float = BASE_TS
    spacing: float = 0.05  # seconds between messages


class Traffic:
    """Generates records message by message; `write_to` sends them through WireLogWriters."""

    def __init__(self, spec: SampleSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.message_ids: list[str] = []
        self.bytes_written = 0  # uncompressed record bytes handed to the writers

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _hex(self, n: int) -> str:
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))

    def _body(self, size: int) -> bytes:
        rng = self.rng
        doc: dict[str, Any] = {"request_id": self._uuid(), "amount": rng.randint(1, 100_000) / 100}
        while len(orjson.dumps(doc)) < size:
            doc[rng.choice(WORDS) + str(rng.randint(0, 99))] = rng.choice(
                (rng.randint(0, 10**9), " ".join(rng.choices(WORDS, k=rng.randint(1, 4))), rng.random() < 0.5)
            )
        return orjson.dumps(doc)

    def request_id_of(self, n: int) -> str:
        """The id of the send request of the n-th message (three messages a request; no randomness drawn,
        so the other records are what they were before request ids)."""
        return f"00000000-0000-4000-8000-{self.spec.seed % 0x10000:04x}{n // 3:08x}"

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(writer name, record) pairs in time order."""
        spec, rng = self.spec, self.rng
        for n in range(spec.messages):
            request_id = self.request_id_of(n)
            message_id = self._uuid()
            self.message_ids.append(message_id)
            group = f"customer-{rng.randrange(spec.groups)}"
            queue = rng.choice(spec.queues)
            ts = spec.start + n * spec.spacing
            attempts = 1
            if rng.random() < spec.failure_rate:
                attempts = rng.choice((2, 2, 3))
            lease = (rng.randint(1, 50) << 32) + n
            for attempt in range(1, attempts + 1):
                worker = f"w{rng.randrange(spec.workers) + 1}"
                failing = attempt < attempts
                ts += 0.001
                yield (
                    "gateway",
                    delivery_record(
                        queue=queue,
                        message_id=message_id,
                        group=group,
                        body=self._body(70),
                        attributes={"trace": self._hex(16)},
                        seq=n + 1,
                        receive_count=attempt,
                        ts=ts,
                        worker=worker,
                        lease=lease + attempt,
                        attempt=attempt,
                        request_id=request_id,
                    ),
                )
                calls = rng.randint(1, 3)
                for call in range(1, calls + 1):
                    ts += rng.uniform(0.002, 0.05)
                    yield (
                        f"proxy-{rng.randrange(2)}",
                        self._call(
                            message_id,
                            group,
                            queue,
                            worker,
                            lease + attempt,
                            attempt,
                            call,
                            ts,
                            fail=failing and call == calls,
                            request_id=request_id,
                        ),
                    )
                if failing:
                    ts += 0.001
                    if rng.random() < 0.5:
                        reason = rng.choice(LOG_FAILURES).format(
                            n=rng.randint(1000, 99999),
                            code=rng.choice(("insufficient_funds", "expired_card")),
                            ms=rng.randint(100, 9000),
                            hex=self._hex(12),
                        )
                    else:
                        reason = "outbound call failed"
                    yield (
                        "gateway",
                        log_record(
                            outcome="failed",
                            reason=reason,
                            steps=["validate", "charge"],
                            ts=ts,
                            worker=worker,
                            queue=queue,
                            message_id=message_id,
                            group=group,
                            lease=lease + attempt,
                            attempt=attempt,
                            request_id=request_id,
                        ),
                    )
                    if rng.random() < 0.3:
                        yield (
                            "gateway",
                            event_record(
                                event="fenced",
                                reason="operator: repeated failures",
                                ts=ts + 0.0005,
                                worker=worker,
                                queue=queue,
                                message_id=message_id,
                                group=group,
                                lease=lease + attempt,
                            ),
                        )
                else:
                    ts += 0.001
                    yield (
                        "gateway",
                        log_record(
                            outcome="done",
                            reason=None,
                            steps=["validate", "charge"],
                            ts=ts,
                            worker=worker,
                            queue=queue,
                            message_id=message_id,
                            group=group,
                            lease=lease + attempt,
                            attempt=attempt,
                            request_id=request_id,
                        ),
                    )

    def _call(
        self, message_id: str, group: str, queue: str, worker: str, lease: int, attempt: int, call: int,
        ts: float, *, fail: bool, request_id: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        rng = self.rng
        error = None
        response: dict[str, Any] | None
        if fail:
            _, method, host, path, status, error_text = rng.choices(
                FAILURES, weights=[f[0] for f in FAILURES]
            )[0]
            url = f"https://{host}{path.format(id=self._id())}"
            if status is None:
                error = (error_text or "").format(
                    host=f"db-{rng.randint(1, 9)}.internal", port=5432, ms=rng.randint(50, 5000)
                )
                response = None
            else:
                body = orjson.dumps(
                    {"error": "upstream failed", "trace": self._uuid(), "retry_after": rng.randint(1, 30)}
                )
                response = http_response(
                    status=status, headers=[["content-type", "application/json"]], body=body
                )
        else:
            method = rng.choice(("GET", "GET", "POST", "PUT"))
            url = f"https://{rng.choice(HOSTS)}{rng.choice(PATHS).format(id=self._id())}"
            if rng.random() < 0.3:
                url += f"?page={rng.randint(1, 50)}&q={rng.choice(WORDS)}"
            response = http_response(
                status=rng.choice((200, 200, 200, 201, 204)),
                headers=[["content-type", "application/json"], ["x-request-id", self._hex(16)]],
                body=self._body(rng.randint(30, 100)),
            )
        request = http_request(
            method=method,
            url=url,
            headers=[
                ["content-type", "application/json"],
                ["authorization", f"Bearer redacted:{self._hex(16)}"],
            ],
            body=self._body(rng.randint(20, 80)) if method != "GET" else None,
        )
        return http_record(
            request=request,
            response=response,
            error=error,
            latency_ms=round(rng.lognormvariate(3, 0.8), 2),
            action="pass",
            ts=ts,
            worker=worker,
            queue=queue,
            message_id=message_id,
            group=group,
            lease=lease,
            attempt=attempt,
            call=call,
            request_id=request_id,
        )

    def _id(self) -> str:
        rng = self.rng
        kind = rng.random()
        if kind < 0.4:
            return str(rng.randint(1, 10**7))
        if kind < 0.7:
            return f"ch_{self._hex(14)}"
        return self._uuid()

    def write_to(
        self,
        directory: Path,
        *,
        max_segment_bytes: int = 64 * 1024 * 1024,
        compress: bool = True,
        limit: int | None = None,
        suffix: str = "",
    ) -> int:
        """Write the records (at most `limit`) through one WireLogWriter per writer name (+ `suffix`, so
        several generating processes can share a directory); returns the record count."""
        from wirelog.writer import WireLogWriter

        writers: dict[str, WireLogWriter] = {}
        count = 0
        try:
            for name, record in self.records():
                if limit is not None and count >= limit:
                    break
                name += suffix
                writer = writers.get(name)
                if writer is None:
                    writer = writers[name] = WireLogWriter(
                        directory,
                        name,
                        max_segment_bytes=max_segment_bytes,
                        max_segment_age=10**9,
                        fsync="never",
                        compress=compress,
                    )
                writer.write(record)
                count += 1
        finally:
            for writer in writers.values():
                writer.close(wait=True)
                self.bytes_written += writer.counters()["bytes"]
        return count


def write_sample(directory: Path, spec: SampleSpec | None = None, **writer_options: Any) -> Traffic:
    traffic = Traffic(spec or SampleSpec())
    traffic.write_to(Path(directory), **writer_options)
    return traffic
