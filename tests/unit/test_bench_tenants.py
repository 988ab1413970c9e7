"""The tenants benchmark's pure parts (issue 35): its workload, phases, figures and report lines."""

import json

from tailguard.bench.loadgen import REFUSED, Sample
from tailguard.bench.report import TENANT_P99_MAX, build_report, render_text, tenants_figures
from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.bench.workload import (
    A_ALONE,
    ARRIVAL_ORDER,
    FAIR,
    TENANT_A,
    TENANT_B,
    TENANTS,
    add_flood,
)


def test_key_a_alone_then_with_bs_flood_at_a_multiple_of_the_measured_capacity():
    wl = build_workload(BenchConfig(workload=TENANTS, rate=2.0, duration_s=50.0,
                                    overload_factor=3.0), None)
    assert wl.classes == [TENANT_A] and wl.short_class == TENANT_A
    flooded = add_flood(wl, capacity_rps=10.0)
    b = [r for r in flooded.requests if r.cls == TENANT_B]
    assert 1200 < len(b) < 1800  # 30 req/s for 50 s, Poisson
    assert [r for r in flooded.requests if r.cls == TENANT_A] == list(wl.requests)
    phases = phases_of(flooded, baseline=True)
    assert list(phases) == [A_ALONE, FAIR, ARRIVAL_ORDER]
    assert {r.cls for r in phases[A_ALONE].requests} == {TENANT_A}
    assert phases[FAIR].requests == phases[ARRIVAL_ORDER].requests == flooded.requests


def sample(cls, e2e=None, refusal=None, retry_after=1.0):
    if refusal:
        return Sample(cls, 64, 0.0, status=REFUSED, refusal=refusal, retry_after_s=retry_after)
    return Sample(cls, 64, 0.0, sent_s=0.0, status="succeeded", ok=True, accepted=True,
                  finished=True, e2e_s=e2e, ttft_s=e2e / 2, completion_tokens=64)


def run(fair_a_e2e, fifo_a_e2e, b_retry_after=1.0):
    a = lambda e2e: [sample(TENANT_A, e2e) for _ in range(100)]
    b = [sample(TENANT_B, 0.5) for _ in range(50)] + [
        sample(TENANT_B, refusal="over_fair_share", retry_after=b_retry_after) for _ in range(30)]
    samples = {A_ALONE: a(1.0), FAIR: a(fair_a_e2e) + b,
               ARRIVAL_ORDER: a(fifo_a_e2e)[:90] + [sample(TENANT_A, refusal="wait_too_long")
                                                    for _ in range(10)] + b}
    return build_report(
        config={"metric": "e2e_s", "model_label": "m", "engines": 2, "cores_per_engine": "1 core"},
        workload={"name": TENANTS, "classes": [TENANT_A, TENANT_B], "short_class": TENANT_A,
                  "long_class": None, "params": {"described": "tenants"}},
        topologies={"lanes": {}}, samples={"lanes": samples})


def statuses(report):
    return {t["name"]: t["status"] for t in report["targets"]}


def test_fair_order_passes_when_as_tail_stays_within_the_target_and_b_is_refused_politely():
    r = run(fair_a_e2e=1.2, fifo_a_e2e=5.0)
    s = statuses(r)
    assert (s["tenant_a_p99_lanes"], s["tenant_a_refused_lanes"], s["tenant_b_refused_lanes"],
            s["tenant_arrival_order_lanes"], s["no_errors_lanes"]) == \
        ("PASS", "PASS", "PASS", "INFO", "PASS")
    f = r["tenants"]["lanes"]
    assert f[FAIR]["a_p99_over_alone"] == 1.2 and f[ARRIVAL_ORDER]["a_p99_over_alone"] == 5.0
    assert f[ARRIVAL_ORDER]["a_refused"] == 10 and f[FAIR]["b_refusals"] == {"over_fair_share": 30}
    assert "| lanes | fair | tenant-b |" in render_text(r)
    json.dumps(r)


def test_a_tail_past_the_target_or_a_refusal_without_retry_after_fails():
    s = statuses(run(fair_a_e2e=TENANT_P99_MAX * 1.01, fifo_a_e2e=5.0, b_retry_after=None))
    assert s["tenant_a_p99_lanes"] == "FAIL" and s["tenant_b_refused_lanes"] == "FAIL"


def test_figures_without_a_phase_are_none_not_an_error():
    f = tenants_figures({A_ALONE: [sample(TENANT_A, 1.0)]}, "e2e_s")
    assert f["a_alone_p99_s"] == 1.0 and f[FAIR]["a_p99_s"] is None and f[FAIR]["a_sent"] == 0
