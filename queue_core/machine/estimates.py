"""Processing-time estimates for pipelining workers (issue 18; the patent's per-queue and per-message
estimates of processing and pre-processing time, docs/pipelining.md).

A delivery to a poller that declares the `estimates` capability carries
`estimate: {"processing": s, "preprocessing": s}`, each field, in order of precedence:

1. the message's own, given by its producer at send (the EmoDB face's `X-Strictq-Estimate` header, kept in
   the message's extra bytes as `{"estimate": {...}}`, so it is durable and travels with the body);
2. the queue's attribute (`processing_estimate`, `preprocessing_estimate`; 0: not set);
3. learned: a least-squares fit of past attempts' durations against the message's size in bytes, per queue,
   from the attempt results workers report (`duration_ms`, and `preprocess_ms` when they pre-processed).

A field nobody knows is left out (an `estimate` with neither is not sent at all). The fit keeps running
sums only (bounded memory whatever the traffic), with a forgetting factor per observation so that it
follows a workload that changes. Sizes are known when bodies are joined in (the shell tells the core, see
`QueueEstimates.delivered`), and kept, bounded, until the attempt's result comes back.

Nothing here is durable: after a restart a queue learns again (given estimates are kept with the bodies).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from protocol import headers
from protocol.estimates import FIELDS, MAX_ESTIMATE, Estimate, Regression

from .errors import InvalidArgument
from .inputs import AttemptResult

HEADER = headers.ESTIMATE
MAX_SIZES = 10_000  # delivered messages whose size is remembered until their result comes, per queue
EXTRA_KEY = "estimate"


# ------------------------------------------------------------------------------ the producer's estimate
def parse_header(text: str) -> Estimate:
    """`X-Strictq-Estimate: processing=0.03, preprocessing=0.02` (seconds; either may be left out);
    InvalidArgument naming the header otherwise."""
    fields: dict[str, float] = {}
    for part in text.split(","):
        name, sep, raw = part.strip().partition("=")
        name = name.strip().lower()
        if not sep or name not in FIELDS:
            raise InvalidArgument(
                f"{HEADER} is 'processing=<seconds>, preprocessing=<seconds>' (either may be left out), "
                f"got {part.strip()[:40]!r}",
                field=HEADER,
            )
        if name in fields:
            raise InvalidArgument(f"{HEADER} names {name} twice", field=HEADER)
        try:
            value = float(raw.strip())
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 <= value <= MAX_ESTIMATE):
            raise InvalidArgument(
                f"{HEADER}: {name} must be a number of seconds from 0 to {MAX_ESTIMATE:g}, "
                f"got {raw.strip()[:40]!r}",
                field=HEADER,
            )
        fields[name] = value
    return Estimate(**fields)


def encode_extra(estimate: Estimate) -> bytes:
    """The message's extra bytes for a producer's estimate (the EmoDB face's messages have no others)."""
    return json.dumps({EXTRA_KEY: estimate.to_json()}, separators=(",", ":")).encode()


def from_extra(extra: bytes) -> Estimate | None:
    """The producer's estimate kept in a message's extra bytes; None for any other extras."""
    if not extra or not extra.startswith(b'{"estimate"'):
        return None
    try:
        data = json.loads(extra)
    except ValueError:
        return None
    return Estimate.from_json(data.get(EXTRA_KEY)) if isinstance(data, dict) else None


class QueueEstimates:
    """One queue's learned fits and the sizes of its delivered messages awaiting a result."""

    __slots__ = ("preprocessing", "processing", "sizes")

    def __init__(self) -> None:
        self.processing = Regression()
        self.preprocessing = Regression()
        self.sizes: dict[str, int] = {}  # message id -> body size, in delivery order (bounded)

    def delivered(self, message_id: str, size: int) -> None:
        sizes = self.sizes
        sizes.pop(message_id, None)  # a redelivery goes to the back
        sizes[message_id] = size
        if len(sizes) > MAX_SIZES:
            del sizes[next(iter(sizes))]  # the oldest: its result never came (an ack, a lapsed claim)

    def observe(self, results: Sequence[AttemptResult], statuses: Sequence[str]) -> int:
        """Learn from the results the core took (`statuses`: each one's outcome status, `ok` when taken);
        returns how many observations were added."""
        added = 0
        for result, status in zip(results, statuses, strict=False):
            size = self.sizes.pop(result.message_id, None)
            if size is None or status != "ok" or result.outcome != "succeeded":
                continue  # a failed attempt's duration says little about a successful one's
            if result.duration_ms is not None:
                self.processing.add(size, result.duration_ms / 1000.0)
                added += 1
            if result.preprocess_ms is not None:
                self.preprocessing.add(size, result.preprocess_ms / 1000.0)
        return added

    def learned(self, size: int) -> Estimate:
        return Estimate(self.processing.predict(size), self.preprocessing.predict(size))

    def describe(self) -> dict[str, Any]:
        """The fits, for operators (`strictq estimates`)."""
        out: dict[str, Any] = {}
        for name in FIELDS:
            fit: Regression = getattr(self, name)
            coefficients = fit.coefficients()
            out[name] = {
                "samples": round(fit.n, 2),
                "intercept_s": None if coefficients is None else round(coefficients[0], 6),
                "per_kib_s": None if coefficients is None else round(coefficients[1] * 1024, 6),
            }
        return out


def estimate(queue: QueueEstimates, configured: Estimate, size: int, extra: bytes = b"") -> Estimate:
    """A delivery's estimate: the message's own, else the queue's attributes, else the learned fit."""
    given = from_extra(extra)
    chosen = configured if given is None else given.over(configured)
    if chosen.processing is None or chosen.preprocessing is None:
        chosen = chosen.over(queue.learned(size))
    return chosen
