"""Processing-time estimates, shared by the queue core (which sends them with deliveries and learns them,
queue_core.machine.estimates) and the SDK's pipeline (which schedules with them and learns them too when
the queue gives none, strictq.sdk.pipeline): the estimate's wire form and the running least-squares fit.
Stdlib only, like the rest of protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FIELDS = ("processing", "preprocessing")
MAX_ESTIMATE = 12 * 3600.0  # seconds: the longest claim ttl
MIN_SAMPLES = 3.0  # weighted observations before a fit is believed
DECAY = 0.99  # weight kept by the past per new observation: about the last 100 attempts count


@dataclass(frozen=True, slots=True)
class Estimate:
    """Seconds to process and to pre-process one message; None: not known."""

    processing: float | None = None
    preprocessing: float | None = None

    @property
    def known(self) -> bool:
        return self.processing is not None or self.preprocessing is not None

    def to_json(self) -> dict[str, float]:
        """The poll item's `estimate` (known fields only), rounded to the millisecond."""
        return {name: round(value, 3) for name in FIELDS if (value := getattr(self, name)) is not None}

    @classmethod
    def from_json(cls, value: Any) -> Estimate | None:
        """The wire form back (lenient: what is not a number in range is dropped); None when empty."""
        if not isinstance(value, dict):
            return None
        fields = {name: _seconds_or_none(value.get(name)) for name in FIELDS}
        estimate = cls(**fields)
        return estimate if estimate.known else None

    def over(self, fallback: Estimate) -> Estimate:
        """This estimate's fields, with `fallback`'s where this one has none."""
        return Estimate(
            self.processing if self.processing is not None else fallback.processing,
            self.preprocessing if self.preprocessing is not None else fallback.preprocessing,
        )


UNKNOWN = Estimate()


def _seconds_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value <= MAX_ESTIMATE else None


class Regression:
    """Weighted least squares of y against x over running sums (O(1) memory), the past decaying by
    `decay` per observation."""

    __slots__ = ("decay", "n", "sx", "sxx", "sxy", "sy")

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.n = self.n * d + 1.0
        self.sx = self.sx * d + x
        self.sy = self.sy * d + y
        self.sxx = self.sxx * d + x * x
        self.sxy = self.sxy * d + x * y

    def coefficients(self) -> tuple[float, float] | None:
        """(intercept, slope per unit of x); None before MIN_SAMPLES observations. With (nearly) one
        size seen, the slope is 0 and the intercept the mean."""
        if self.n < MIN_SAMPLES:
            return None
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        var_x = self.sxx / self.n - mean_x * mean_x
        if var_x <= 1e-9 * max(1.0, mean_x * mean_x):
            return mean_y, 0.0
        slope = (self.sxy / self.n - mean_x * mean_y) / var_x
        return mean_y - slope * mean_x, slope

    def predict(self, x: float) -> float | None:
        fit = self.coefficients()
        if fit is None:
            return None
        intercept, slope = fit
        return min(max(intercept + slope * x, 0.0), MAX_ESTIMATE)
