"""Per-request latency targets: the headers (llm-d's names and their aliases), a key's bounds,
the clamp and what it reports; the decisions on the TTFT target: placement prefers a lane that
meets it, admission refuses a wait that already misses it."""

import pytest

from tailguard.errors import ConfigError, InvalidField, WaitPastTarget
from tailguard.gateway.target_headers import parse_target_headers
from tailguard.lanes.latency_targets import (
    LatencyTarget,
    TargetBounds,
    admit_target,
    clamp_target,
    clamp_vllm_priority,
    meets_ttft,
    preferring_lanes_in_time,
    target_outcome,
)
from tailguard.lanes.placement import place
from tailguard.lanes.table import default_lanes_path, load_lanes


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


@pytest.mark.parametrize("ttft_ms,wait_s,meets", [
    (None, 1e6, True), (50, 0.0, True), (50, 0.05, True), (50, 0.051, False), (1000, 2.5, False),
])
def test_a_target_is_met_by_a_wait_within_it(ttft_ms, wait_s, meets):
    assert meets_ttft(LatencyTarget(ttft_ms=ttft_ms), wait_s) is meets


LANES = load_lanes(default_lanes_path()).lanes  # short: max_cost 1024; long takes the rest


@pytest.mark.parametrize("prompt,asked,ttft_ms,waits,lane", [
    # fits both short and long
    (9, 64, None, {"short": 5.0, "long": 0.0}, "short"),   # no target: first fit, as ever
    (9, 64, 500, {"short": 0.2, "long": 9.0}, "short"),    # short meets it, long cannot: short
    (9, 64, 500, {"short": 0.2, "long": 0.0}, "short"),    # both meet it: table order
    (9, 64, 500, {"short": 3.0, "long": 0.1}, "long"),     # only long meets it
    (9, 64, 500, {"short": 3.0, "long": 9.0}, "short"),    # none: first fit (admission refuses)
    # fits long only: the target does not make short take it
    (900, 256, 500, {"short": 0.0, "long": 9.0}, "long"),
])
def test_placement_prefers_the_first_lane_whose_wait_meets_the_target(prompt, asked, ttft_ms,
                                                                      waits, lane):
    prefer = preferring_lanes_in_time(LatencyTarget(ttft_ms=ttft_ms), lambda p: waits[p.lane])
    placed = place(LANES, priority="interactive", prompt_tokens=prompt,
                   requested_max_tokens=asked, prefer=prefer)
    assert placed.lane == lane


def test_a_wait_that_misses_the_target_is_refused_at_once_with_the_predicted_wait():
    admit_target(LatencyTarget(ttft_ms=50), "short", 0.05)
    admit_target(LatencyTarget(), "short", 100.0)
    with pytest.raises(WaitPastTarget) as refused:
        admit_target(LatencyTarget(ttft_ms=50, asked_ttft_ms=50), "long", 2.5)
    err = refused.value
    assert (err.http_status, err.code, err.lane, err.retry_after_s) == (429, "wait_past_target",
                                                                        "long", 3)
    assert "2500 ms" in err.message and "50 ms" in err.message


def test_a_target_is_judged_on_the_predicted_first_token_not_the_wait_alone():
    from tailguard.lanes.admission import AdmissionPolicy

    policy = AdmissionPolicy(prefill_tokens_per_s=1000.0, first_step_s=0.02)
    first = policy.first_token_s(100)  # 0.1 s of prefill, then a step
    assert first == pytest.approx(0.12)
    admit_target(LatencyTarget(ttft_ms=500), "short", 0.0, first)
    with pytest.raises(WaitPastTarget) as refused:  # an idle lane cannot give 1 ms
        admit_target(LatencyTarget(ttft_ms=1), "short", 0.0, first)
    assert refused.value.retry_after_s == 1 and "120 ms" in refused.value.message


@pytest.mark.parametrize("job,outcome", [
    # queued: nothing known
    ({"slo_ttft_ms": 500, "submitted_at": 100.0}, (None, None)),
    # started 0.2 s after submission, first token 0.1 s later: 300 ms <= 500
    ({"slo_ttft_ms": 500, "submitted_at": 100.0, "running_at": 100.2, "ttft_s": 0.1}, (True, None)),
    ({"slo_ttft_ms": 250, "submitted_at": 100.0, "running_at": 100.2, "ttft_s": 0.1}, (False, None)),
    # 11 tokens: 10 after the first in 1.0 s of decode, 100 ms each
    ({"slo_ttft_ms": 500, "slo_tpot_ms": 100, "submitted_at": 100.0, "running_at": 100.2,
      "ttft_s": 0.1, "succeeded_at": 101.3, "completion_tokens": 11}, (True, True)),
    ({"slo_tpot_ms": 99, "submitted_at": 100.0, "running_at": 100.2, "ttft_s": 0.1,
      "succeeded_at": 101.3, "result": {"completion_tokens": 11}}, (None, False)),
    ({"slo_tpot_ms": 99, "submitted_at": 100.0, "running_at": 100.2, "ttft_s": 0.1,
      "succeeded_at": 101.3, "completion_tokens": 1}, (None, None)),  # one token: no TPOT
])
def test_the_outcome_says_whether_each_target_was_met(job, outcome):
    got = target_outcome(job)
    assert (got["ttft_met"], got["tpot_met"]) == outcome
    assert (got["ttft_ms"], got["tpot_ms"]) == (job.get("slo_ttft_ms"), job.get("slo_tpot_ms"))
