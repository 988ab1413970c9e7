"""A mergeable log-bucket histogram: percentiles in bounded memory.

Values land in buckets whose bounds grow by GROWTH (2^(1/8), ~9%), so a
percentile read from the buckets is within ~4.5% of the true value (the
bucket's geometric middle is returned), whatever the range. Two histograms
merge by adding counts, which is how per-minute histograms in Redis become
the histogram of any time window. Memory: a few dozen integers per metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GROWTH = 2 ** (1 / 8)
_LOG_GROWTH = math.log(GROWTH)


def bucket_of(value: float, unit: float) -> int:
    """Index of the bucket holding `value`; bucket i covers (unit*G^(i-1), unit*G^i]."""
    if value <= unit:
        return 0
    return math.ceil(math.log(value / unit) / _LOG_GROWTH - 1e-9)


def bucket_middle(index: int, unit: float) -> float:
    """The value a bucket stands for: the geometric middle of its bounds."""
    if index <= 0:
        return unit
    return unit * GROWTH ** (index - 0.5)


@dataclass
class Histogram:
    """Counts per bucket, plus exact count, sum, min and max."""

    unit: float  # smallest distinguished value: 1e-3 s for times, 1 token for lengths
    buckets: dict[int, int] = field(default_factory=dict)
    count: int = 0
    total: float = 0.0
    max: float = 0.0
    min: float = math.inf

    def add(self, value: float) -> None:
        i = bucket_of(value, self.unit)
        self.buckets[i] = self.buckets.get(i, 0) + 1
        self.count += 1
        self.total += value
        self.max = max(self.max, value)
        self.min = min(self.min, value)

    def merge(self, other: Histogram) -> Histogram:
        for i, n in other.buckets.items():
            self.buckets[i] = self.buckets.get(i, 0) + n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
        self.min = min(self.min, other.min)
        return self

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0-100), by nearest rank over the buckets, kept within the
        exact [min, max] (so identical values come back exactly)."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q / 100 * self.count))
        seen = 0
        for i in sorted(self.buckets):
            seen += self.buckets[i]
            if seen >= rank:
                return min(max(bucket_middle(i, self.unit), self.min), self.max)
        return self.max  # pragma: no cover - counts always add up

    def summary(self) -> dict[str, float | int | None]:
        return {"count": self.count, "avg": self.mean, "p50": self.percentile(50),
                "p95": self.percentile(95), "p99": self.percentile(99),
                "max": self.max if self.count else None}
