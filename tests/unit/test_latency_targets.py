"""Per-request latency targets: the headers (llm-d's names and their aliases), a key's bounds,
the clamp and what it reports."""

import pytest

from tailguard.errors import ConfigError, InvalidField
from tailguard.lanes.latency_targets import (
    LatencyTarget,
    TargetBounds,
    clamp_target,
    clamp_vllm_priority,
    parse_target_headers,
)


@pytest.mark.parametrize("headers,targets", [
    ({}, (None, None)),
    ({"x-llm-d-slo-ttft-ms": "50"}, (50, None)),
    ({"X-LLM-D-SLO-TTFT-MS": "50", "X-Llm-D-Slo-Tpot-Ms": "20"}, (50, 20)),  # case-blind
    ({"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "40"}, (300, 40)),            # the aliases
    ({"x-llm-d-slo-ttft-ms": "50", "x-slo-ttft-ms": "900"}, (50, None)),     # llm-d's name wins
    ({"x-llm-d-slo-ttft-ms": " 12.6 "}, (13, None)),                          # rounded
    ({"x-llm-d-slo-ttft-ms": "0.2"}, (1, None)),                              # at least 1 ms
    ({"x-llm-d-slo-ttft-ms": "1e12"}, (86_400_000, None)),                    # at most a day
    ({"content-type": "application/json"}, (None, None)),
])
def test_target_headers(headers, targets):
    assert parse_target_headers(headers) == targets


@pytest.mark.parametrize("headers,field", [
    ({"x-llm-d-slo-ttft-ms": "fast"}, "x-llm-d-slo-ttft-ms"),
    ({"x-slo-tpot-ms": "0"}, "x-slo-tpot-ms"),
    ({"x-llm-d-slo-tpot-ms": "-3"}, "x-llm-d-slo-tpot-ms"),
    ({"x-llm-d-slo-ttft-ms": "nan"}, "x-llm-d-slo-ttft-ms"),
    ({"x-llm-d-slo-ttft-ms": "inf"}, "x-llm-d-slo-ttft-ms"),
])
def test_a_target_that_is_not_a_positive_number_is_a_400(headers, field):
    with pytest.raises(InvalidField) as exc:
        parse_target_headers(headers)
    assert exc.value.field == field and exc.value.http_status == 400


BOUNDS = TargetBounds(min_ttft_ms=200, max_ttft_ms=5000, min_tpot_ms=20)


@pytest.mark.parametrize("asked,bounds,applied,clamped", [
    ((None, None), BOUNDS, (None, None), False),      # none asked: none applied
    ((500, 30), BOUNDS, (500, 30), False),            # within the bounds
    ((50, 30), BOUNDS, (200, 30), True),              # tighter than the key may ask: raised
    ((9000, 5), BOUNDS, (5000, 20), True),            # looser lowered, tighter tpot raised
    ((50, 5), TargetBounds(), (50, 5), False),        # a key without bounds
])
def test_targets_are_clamped_into_the_keys_bounds(asked, bounds, applied, clamped):
    target = clamp_target(*asked, bounds)
    assert (target.ttft_ms, target.tpot_ms) == applied and target.clamped is clamped
    assert (target.asked_ttft_ms, target.asked_tpot_ms) == asked
    assert target.to_dict()["clamped"] is clamped


def test_no_target_reports_nothing_clamped():
    assert LatencyTarget().to_dict() == {"ttft_ms": None, "tpot_ms": None, "asked_ttft_ms": None,
                                         "asked_tpot_ms": None, "clamped": False}


@pytest.mark.parametrize("sent,floor,applied", [
    (None, 0, None), (-5, 0, 0), (3, 0, 3), (-5, None, -5), (-5, -10, -5),
])
def test_vllm_priority_is_never_more_urgent_than_the_key_may_ask(sent, floor, applied):
    assert clamp_vllm_priority(sent, TargetBounds(min_vllm_priority=floor)) == applied


@pytest.mark.parametrize("bounds", [
    TargetBounds(min_ttft_ms=0), TargetBounds(max_tpot_ms=-1),
    TargetBounds(min_ttft_ms=10, max_ttft_ms=5), TargetBounds(max_ttft_ms=86_400_001),
])
def test_bad_bounds_are_a_config_error(bounds):
    with pytest.raises(ConfigError):
        bounds.check()
