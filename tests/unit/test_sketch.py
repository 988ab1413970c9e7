"""The mergeable histogram behind `tailguard stats`: percentiles within the bucket error."""

import random

import pytest

from tailguard.observe.sketch import GROWTH, Histogram, bucket_middle, bucket_of

REL_ERROR = (GROWTH ** 0.5) - 1  # half a bucket, geometrically: ~4.4%


def exact_percentile(values, q):
    ordered = sorted(values)
    return ordered[max(1, -(-len(ordered) * q // 100)) - 1]


@pytest.mark.parametrize("value", [0.0005, 0.001, 0.0011, 0.05, 1.0, 17.3, 3600.0])
def test_bucket_contains_its_value(value):
    i = bucket_of(value, 1e-3)
    lower = 1e-3 * GROWTH ** (i - 1) if i > 0 else 0
    assert lower < value <= 1e-3 * GROWTH ** i + 1e-12


@pytest.mark.parametrize("q", [50, 95, 99])
def test_percentiles_match_exact_ones_within_the_bucket_error(q):
    rng = random.Random(7)
    values = [rng.lognormvariate(-1, 1.2) for _ in range(5000)]
    h = Histogram(unit=1e-3)
    for v in values:
        h.add(v)
    exact = exact_percentile(values, q)
    assert h.percentile(q) == pytest.approx(exact, rel=REL_ERROR * 1.01)


def test_known_small_data():
    h = Histogram(unit=1.0)
    for v in [1, 2, 3, 4, 100]:
        h.add(v)
    assert (h.count, h.total, h.max, h.mean) == (5, 110, 100, 22)
    assert h.percentile(50) == pytest.approx(3, rel=REL_ERROR)
    assert h.percentile(99) == 100  # capped at the true max, not the bucket's middle
    assert Histogram(unit=1.0).percentile(50) is None


def test_merge_equals_one_histogram_of_everything():
    rng = random.Random(3)
    a, b, both = Histogram(1e-3), Histogram(1e-3), Histogram(1e-3)
    for i in range(2000):
        v = rng.expovariate(2)
        (a if i % 3 else b).add(v)
        both.add(v)
    merged = a.merge(b)
    assert merged.buckets == both.buckets and merged.count == both.count
    assert merged.total == pytest.approx(both.total) and merged.max == both.max


def test_memory_is_bounded_by_the_range_not_the_count():
    h = Histogram(unit=1e-3)
    rng = random.Random(1)
    for _ in range(50_000):
        h.add(rng.uniform(0.001, 60))
    assert len(h.buckets) <= 130  # log_G(60/0.001) buckets at most
    assert bucket_middle(0, 1.0) == 1.0


def test_identical_values_come_back_exactly():
    h = Histogram(unit=1.0)
    for _ in range(30):
        h.add(512)
    assert h.percentile(50) == h.percentile(99) == 512
    other = Histogram(unit=1.0)
    other.add(3)
    assert h.merge(other).min == 3
