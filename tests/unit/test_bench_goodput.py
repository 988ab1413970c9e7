"""Goodput as vLLM bench serve defines it, the whole machine's throughput, streams, the burst."""

import pytest
from test_bench_report import fake_run, ok, report_of, statuses

from tailguard.bench.goodput import (
    DEFAULT_LONG_SLO,
    DEFAULT_SHORT_SLO,
    goodput,
    meets,
    parse_slo,
    phase_span_s,
    slo_text,
    tpot_s,
)
from tailguard.bench.loadgen import REFUSED, Sample
from tailguard.bench.report import (
    build_report,
    burst_figures,
    class_stats,
    phase_totals,
    render_text,
    slos,
    stream_stats,
)
from tailguard.bench.run import BenchConfig


@pytest.mark.parametrize("text,want", [
    ("ttft:1000 e2el:4000", (("ttft", 1000.0), ("e2el", 4000.0))),
    ("ttft:1000,e2el:4000", (("ttft", 1000.0), ("e2el", 4000.0))),
    ("tpot:50.5", (("tpot", 50.5),)),
    ("tpot:50 tpot:60", (("tpot", 60.0),)),  # the last one wins, as in vLLM's dict
])
def test_slos_are_vllms_key_value_pairs_in_ms(text, want):
    assert parse_slo(text) == want
    assert parse_slo(slo_text(want)) == want


@pytest.mark.parametrize("text", ["", "itl:5", "ttft", "ttft:x", "ttft:-1", "ttft:1:2"])
def test_a_bad_slo_is_refused(text):
    with pytest.raises(ValueError, match="SLO"):
        parse_slo(text)


def test_tpot_is_vllms_and_zero_for_one_token():
    s = ok("long", 11.0, tokens=501, ttft=1.0)
    assert tpot_s(s) == pytest.approx(10.0 / 500)
    assert tpot_s(ok("long", 2.0, tokens=1, ttft=1.0)) == 0.0
    assert tpot_s(Sample("long", 8, 0.0)) is None


def test_a_request_is_good_within_every_pair_and_only_when_it_succeeded():
    fast = ok("short", 3.9, ttft=0.9)
    assert meets(fast, DEFAULT_SHORT_SLO)
    assert not meets(ok("short", 4.1, ttft=0.9), DEFAULT_SHORT_SLO)  # e2el over
    assert not meets(ok("short", 1.0, ttft=1.1), DEFAULT_SHORT_SLO)  # ttft over
    assert meets(ok("short", 4.0, ttft=1.0), DEFAULT_SHORT_SLO)  # at the bound is within
    failed = Sample("short", 8, 0.0, sent_s=0.0, status="failed", ttft_s=0.1, e2e_s=0.2)
    assert not meets(failed, DEFAULT_SHORT_SLO)
    assert meets(ok("long", 60.0, tokens=512, ttft=5.0), DEFAULT_LONG_SLO)  # 55 s / 511 = 108 ms
    assert not meets(ok("long", 120.0, tokens=512, ttft=5.0), DEFAULT_LONG_SLO)  # 225 ms


def test_goodput_is_good_requests_over_the_phases_span_per_class():
    samples = [ok("short", 1.0, sent=0.0), ok("short", 5.0, sent=1.0),  # the second: e2el over
               ok("long", 9.0, sent=1.0, tokens=512, ttft=1.0),  # ends at 10 s: the span
               Sample("short", 64, 2.0, sent_s=2.0, status=REFUSED),
               ok("long", 4.0, sent=2.0, tokens=11, ttft=1.0)]  # 300 ms per token: over
    assert phase_span_s(samples) == 10.0
    g = goodput(samples, "short", DEFAULT_SHORT_SLO, DEFAULT_LONG_SLO)
    assert (g["requests"], g["good"], g["span_s"], g["goodput_rps"]) == (5, 2, 10.0, 0.2)
    assert g["by_class"]["short"] == {"slo": "ttft:1000,e2el:4000", "requests": 3, "good": 1,
                                      "goodput_rps": 0.1}
    assert g["by_class"]["long"]["good"] == 1 and g["by_class"]["long"]["slo"] == "tpot:200"
    assert goodput([], "short", DEFAULT_SHORT_SLO, DEFAULT_LONG_SLO)["goodput_rps"] is None


def test_streams_pool_the_gaps_and_count_tokens_per_chunk():
    one = ok("short", 1.05, tokens=64, ttft=0.05)  # 64 chunks of one token
    eight = ok("short", 1.05, tokens=64, ttft=0.05, per_chunk=8)  # 8 chunks of 8
    st = stream_stats([one, eight])
    assert st["chunks"] == 72 and st["tokens_per_chunk"] == pytest.approx(128 / 72)
    assert len(one.itl_s) == 63 and len(eight.itl_s) == 7
    assert st["itl_s"]["max"] == pytest.approx(1.0 / 7)  # the coarse stream's gaps are the tail
    assert st["itl_s"]["p50"] == pytest.approx(1.0 / 63)
    assert stream_stats([])["tokens_per_chunk"] is None


def test_a_class_reports_the_lengths_asked_for_and_produced():
    stopped = ok("short", 1.0, tokens=64)
    stopped.completion_tokens, stopped.finish_reason = 20, "stop"  # the model's own end
    st = class_stats([ok("short", 1.0, tokens=64), stopped])
    assert st["requested_tokens"] == 128 and st["output_tokens"] == 84
    assert st["requested_len"]["avg"] == 64 and st["output_len"]["avg"] == 42
    assert st["finish_reasons"] == {"length": 1, "stop": 1}
    assert st["tpot_s"]["max"] == pytest.approx(0.95 / 19)


def test_phase_totals_count_every_class():
    samples = [ok("short", 1.0, sent=0.0), ok("long", 9.0, sent=1.0, tokens=512, ttft=1.0)]
    t = phase_totals(samples, "short", DEFAULT_SHORT_SLO, DEFAULT_LONG_SLO)
    assert t["output_tokens"] == 576 and t["output_tok_s"] == pytest.approx(57.6)
    assert t["goodput"]["good"] == 2 and t["chunks"] == 576


def test_the_config_carries_the_slos_the_run_was_judged_by():
    cfg = BenchConfig(goodput_short=parse_slo("ttft:500"), goodput_long=parse_slo("tpot:80"))
    assert slos(cfg.to_dict()) == ((("ttft", 500.0),), (("tpot", 80.0),))
    assert slos({}) == (DEFAULT_SHORT_SLO, DEFAULT_LONG_SLO)


def serving_run(lanes_long=10.0, direct_long=10.0, shared_long=10.0, lanes_chunk=1):
    """Passing isolation; the long class's end-to-end and the lanes' chunking set per test."""
    samples = fake_run(shared_short=10.0, shared_base=1.0, lanes_short=1.2, lanes_base=1.0,
                       long_shared=shared_long, long_lanes=lanes_long, long_direct=direct_long)
    samples["lanes"]["mixed"] = [ok(s.cls, s.e2e_s, sent=s.sent_s, tokens=s.completion_tokens,
                                    lane=s.lane, per_chunk=lanes_chunk)
                                 for s in samples["lanes"]["mixed"]]
    return samples


def test_serving_lines_pass():
    r = report_of(serving_run())
    sv = r["serving"]
    assert sv["good"] == {"shared": 11, "lanes": 12, "direct": 11}
    assert sv["output_tok_s_over_direct"]["direct"] == 1.0
    assert sv["lanes_long_e2e_p50_over_shared"] == 1.0
    s = statuses(r)
    assert [s[k] for k in ("goodput_vs_direct", "goodput_vs_shared", "total_throughput",
                           "long_e2e_p50", "stream_itl")] == ["PASS"] * 5


def test_serving_lines_fail():
    # long requests twice as slow in lanes: its P50 is 2x shared's, its output rate and goodput
    # drop; coarse lanes chunks make its streamed gaps 8x direct's
    r = report_of(serving_run(lanes_long=20.0, shared_long=10.0, lanes_chunk=8))
    s = statuses(r)
    assert s["long_e2e_p50"] == "FAIL" and s["stream_itl"] == "FAIL"
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "(8.0 tokens per chunk)" in lines["stream_itl"]
    assert "lanes long P50 end-to-end 20.000 s <= 1.5x shared's 10.000 s: ratio 2.00x" in \
        lines["long_e2e_p50"]
    slow = report_of(serving_run(lanes_long=200.0))  # 390 ms per token: the long SLO missed
    assert statuses(slow)["goodput_vs_direct"] == "FAIL"
    assert statuses(slow)["total_throughput"] == "FAIL"  # its span is 200 s: 8 tok/s


def test_the_burst_figures_take_the_short_requests_that_waited_on_its_prefill():
    def short(t, ttft):
        return ok("short", ttft + 0.5, sent=t, ttft=ttft)

    mixed = [short(1.0, 0.1), short(10.0, 3.0), short(12.0, 1.0), short(20.0, 0.1),
             ok("long", 30.0, sent=10.0, tokens=512, ttft=2.0),
             ok("long", 30.0, sent=10.0, tokens=512, ttft=4.0)]  # the last first token: 14 s
    baseline = [short(1.0, 0.1), short(10.0, 0.1), short(12.0, 0.2), short(20.0, 0.1)]
    b = burst_figures({"mixed": mixed, "baseline": baseline}, "short", "long", 10.0)
    assert b["prefill_end_s"] == 14.0 and b["long_first_tokens"] == 2
    assert b["mixed"] == {"short": 2, "ok": 2, "ttft_p99_s": 3.0, "ttft_max_s": 3.0}
    assert b["baseline"]["ttft_p99_s"] == 0.2
    never = [*mixed[:4], Sample("long", 512, 10.0, sent_s=10.0, status="timeout")]
    assert burst_figures({"mixed": never}, "short", "long", 10.0)["mixed"]["short"] == 3

    r = build_report(config={"metric": "e2e_s"},
                     workload={"name": "burst", "classes": ["short", "long"], "short_class": "short",
                               "long_class": "long", "params": {"burst_at_s": 10.0,
                                                                "described": "burst: test"}},
                     topologies={}, samples={"lanes": {"mixed": mixed, "baseline": baseline}})
    line = next(t["line"] for t in r["targets"] if t["name"] == "burst_lanes")
    assert line.startswith("INFO  lanes: 2 short requests arrived during the burst's prefill "
                           "(10.0-14.0 s; 2 of 2 long requests got a first token): TTFT P99 3.000 s")
    assert render_text(r).startswith("workload: burst: test\n")
