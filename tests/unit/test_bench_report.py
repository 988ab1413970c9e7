"""Benchmark report: nearest-rank percentiles, per-class stats, ratios, PASS/FAIL/SKIP lines."""

import json

import pytest
from click.testing import CliRunner

from tailguard.bench.loadgen import Client, Sample
from tailguard.bench.report import build_report, class_stats, render_text, summarize
from tailguard.plan.sim import percentile


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 99) == 99 and percentile(values, 50) == 50
    assert percentile(values, 100) == 100 and percentile([7.0], 99) == 7.0
    assert percentile(list(range(1, 11)), 99) == 10
    assert percentile([], 50) is None


def test_summarize():
    assert summarize([3, None, 1, 2]) == {"avg": 2, "p50": 2, "p95": 3, "p99": 3, "max": 3}
    assert summarize([None]) == {"avg": None, "p50": None, "p95": None, "p99": None, "max": None}


def ok(cls, e2e, sent=0.0, tokens=64, lane="short", ttft=0.05, queue=0.01, per_chunk=1):
    """A request that streamed `tokens` in chunks of `per_chunk`, evenly spaced after its TTFT."""
    chunks = -(-tokens // per_chunk)
    gap = (e2e - ttft) / (chunks - 1) if chunks > 1 else 0.0
    return Sample(cls, tokens, arrival_s=sent, sent_s=sent, status="succeeded", ok=True,
                  accepted=True, finished=True, job_id="j", lane=lane, queued_s=queue, ttft_s=ttft,
                  e2e_s=e2e, completion_tokens=tokens, finish_reason="length", chunks=chunks,
                  itl_s=[gap] * (chunks - 1))


def test_class_stats_counts_errors_and_throughput():
    samples = [ok("short", 1.0, sent=0.0), ok("short", 2.0, sent=1.0),
               Sample("short", 64, 2.0, sent_s=2.2, status="expired", accepted=True, finished=True,
                      lane="short"),
               Sample("short", 64, 3.0, sent_s=3.0, status="timeout", accepted=True, finished=False)]
    st = class_stats(samples)
    assert (st["count"], st["ok"], st["errors"], st["accepted"], st["finished"]) == (4, 2, 2, 4, 3)
    assert st["error_kinds"] == {"expired": 1, "timeout": 1}
    assert st["e2e_s"]["max"] == 2.0 and st["e2e_s"]["avg"] == 1.5
    assert st["throughput_tok_s"] == pytest.approx(128 / 3.0)  # 128 tokens from t=0 to t=3
    assert st["lanes"] == {"short": 3}
    assert st["max_lag_s"] == pytest.approx(0.2) and st["late_sends"] == 1
    assert st["decode_tok_s"]["avg"] == pytest.approx((63 / 0.95 + 63 / 1.95) / 2)


def fake_run(shared_short, shared_base, lanes_short, lanes_base, long_shared=10.0,
             long_lanes=10.0, lost=False, direct_short=6.0, long_direct=10.0):
    """Ten short requests per phase (P99 = the slowest); two long ones of 512 tokens."""
    def short(p99, lane):
        return [ok("short", 0.1 * p99, sent=i, lane=lane) for i in range(9)] + [ok("short", p99, 9, lane=lane)]

    def long(e2e, lane):
        return [ok("long", e2e, sent=0, tokens=512, lane=lane),
                ok("long", e2e, sent=0, tokens=512, lane=lane)]

    lanes_mixed = short(lanes_short, "short") + long(long_lanes, "long")
    if lost:
        lanes_mixed.append(Sample("short", 64, 5.0, sent_s=5.0, status="timeout", accepted=True))
    return {"shared": {"baseline": short(shared_base, "shared"),
                       "mixed": short(shared_short, "shared") + long(long_shared, "shared")},
            "lanes": {"baseline": short(lanes_base, "short"), "mixed": lanes_mixed},
            "direct": {"mixed": short(direct_short, None) + long(long_direct, None)}}


def report_of(samples, metric="e2e_s"):
    return build_report(
        config={"metric": metric, "model_label": "m", "engines": 2, "cores_per_engine": "1 core"},
        workload={"name": "mixed", "classes": ["short", "long"], "short_class": "short",
                  "long_class": "long", "params": {"duration_s": 10}},
        topologies={"shared": {"engines": []}}, samples=samples)


def statuses(report):
    return {t["name"]: t["status"] for t in report["targets"]}


def test_targets_pass():
    r = report_of(fake_run(shared_short=10.0, shared_base=1.0, lanes_short=1.2, lanes_base=1.0,
                           long_shared=10.0, long_lanes=11.0))
    assert r["ratios"]["e2e_s"]["lanes_short_p99_over_shared"] == pytest.approx(0.12)
    assert r["ratios"]["e2e_s"]["shared_short_p99_over_baseline"] == pytest.approx(10.0)
    assert r["ratios"]["e2e_s"]["lanes_long_tok_s_over_shared"] == pytest.approx(
        (1024 / 11) / (1024 / 10))
    assert r["ratios"]["e2e_s"]["lanes_short_p99_over_direct"] == pytest.approx(0.2)
    assert r["ratios"]["e2e_s"]["lanes_long_tok_s_over_direct"] == pytest.approx(10 / 11)
    assert set(statuses(r).values()) == {"PASS", "INFO"}
    assert set(statuses(r)) == {"load", "lanes_vs_shared", "lanes_vs_baseline", "lanes_vs_direct",
                                "long_throughput", "no_errors_shared", "no_errors_lanes",
                                "no_errors_direct", "slo", "goodput_vs_direct", "goodput_vs_shared",
                                "total_throughput", "long_e2e_p50", "stream_itl"}
    assert statuses(r)["slo"] == "INFO"
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "vs direct's 102.4 tok/s: 90.9% (reported only)" in lines["long_throughput"]
    assert r["topologies"]["shared"]["engines"] == []  # topology facts are kept
    json.dumps(r)


def test_targets_fail_and_say_when_the_load_is_too_light():
    r = report_of(fake_run(shared_short=2.0, shared_base=1.0, lanes_short=1.6, lanes_base=1.0,
                           long_lanes=20.0, lost=True, direct_short=2.0))
    s = statuses(r)
    assert s["lanes_vs_direct"] == "FAIL"  # 1.6 / 2.0 > 1/4
    assert s["load"] == "FAIL" and s["lanes_vs_shared"] == "FAIL"
    assert s["lanes_vs_baseline"] == "FAIL" and s["long_throughput"] == "FAIL"
    assert s["no_errors_shared"] == "PASS" and s["no_errors_lanes"] == "FAIL"
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "[load condition not met]" in lines["lanes_vs_shared"]
    assert "1 lost" in lines["no_errors_lanes"]


def test_targets_skip_what_was_not_measured():
    samples = fake_run(10.0, 1.0, 1.2, 1.0)
    del samples["shared"], samples["direct"]
    s = statuses(report_of(samples))
    assert s["load"] == s["lanes_vs_shared"] == s["long_throughput"] == "SKIP"
    assert s["lanes_vs_direct"] == "SKIP"
    assert s["lanes_vs_baseline"] == "PASS"
    assert s["goodput_vs_direct"] == s["goodput_vs_shared"] == s["total_throughput"] == "SKIP"
    assert s["long_e2e_p50"] == s["stream_itl"] == "SKIP"


def test_ttft_metric_and_text():
    r = report_of(fake_run(10.0, 1.0, 1.2, 1.0), metric="ttft_s")
    assert statuses(r)["load"] == "FAIL"  # every TTFT is 0.05 s: no interference in TTFT
    text = render_text(r)
    assert "| shared | mixed | short | 10 | 0 |" in text and "SKIP" not in text
    assert "| lanes | mixed | 12 | 12 | " in text  # the goodput table: 12 requests, 12 met the SLO
    assert "TTFT" in text and "lanes / shared" in text


def test_sample_round_trip_and_decode_rate():
    s = ok("long", 11.0, tokens=512, ttft=1.0)
    assert Sample.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.decode_tok_s == pytest.approx(511 / 10.0)
    assert Sample("short", 64, 0.0).decode_tok_s is None and Sample("short", 64, 0.0).lag_s is None


def test_the_load_generator_only_drives_a_local_system():
    Client("http://127.0.0.1:8000", "m")
    with pytest.raises(ValueError, match="local"):
        Client("http://example.com:8000", "m")


def test_cli_has_bench():
    from tailguard.cli import main

    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0 and "--long-share" in result.output


@pytest.fixture
def bench_config(monkeypatch):
    """The BenchConfig `tailguard bench ARGS` builds (the benchmark itself is not run)."""
    import tailguard.cli
    from tailguard.cli import main

    seen = []

    def fake_run(cfg):
        seen.append(cfg)
        raise ValueError("not run here")

    monkeypatch.setattr(tailguard.cli, "run_bench", fake_run)

    def build(*args):
        result = CliRunner().invoke(main, ["bench", *args])
        assert seen, result.output
        return seen.pop()
    return build


def test_bench_options_default_to_the_configs_defaults(bench_config):
    from tailguard.bench.run import BenchConfig

    assert bench_config() == BenchConfig()


def test_bench_options_set_the_configs_fields(bench_config, tmp_path):
    cfg = bench_config("--topologies", "lanes", "--cores", "0,1", "--metric", "ttft", "--no-baseline",
                       "--duration", "5", "--drain", "7", "--lanes", str(tmp_path / "l.toml"),
                       "--out", str(tmp_path / "out"), "--engines", "3", "--long-share", "0.5")
    assert (cfg.topologies, cfg.cores, cfg.metric, cfg.baseline) == (("lanes",), (0, 1), "ttft_s", False)
    assert (cfg.duration_s, cfg.drain_s, cfg.engines, cfg.long_share) == (5.0, 7.0, 3, 0.5)
    assert (cfg.lanes_file, cfg.out_dir) == (tmp_path / "l.toml", tmp_path / "out")


def test_bench_rejects_a_bad_core_list():
    from tailguard.cli import main

    result = CliRunner().invoke(main, ["bench", "--cores", "0,x"])
    assert result.exit_code == 2 and "--cores" in result.output


def test_a_disturbed_phase_is_noted():
    r = report_of(fake_run(10.0, 1.0, 1.2, 1.0))
    r["topologies"]["shared"]["host"] = {"mixed": {"disturbed": True, "others_share": 0.4,
                                                    "others_heaviest": [["pytest", 30.0]]}}
    assert "note: shared/mixed was disturbed: other processes used 40% of the CPU (heaviest: " \
           "pytest 30.0 s)" in render_text(r)


def test_overhead_lines_compare_lanes_with_direct():
    def phase(ttft, e2e):
        return {"overhead": [ok("short", e2e * (1 + i / 100), sent=i, ttft=ttft + i / 1000)
                             for i in range(100)]}

    r = build_report(
        config={"metric": "e2e_s"},
        workload={"name": "overhead", "classes": ["short"], "short_class": "short",
                  "long_class": None, "params": {}},
        topologies={}, samples={"lanes": phase(0.044, 0.6), "direct": phase(0.040, 0.58)})
    o = r["overhead"]
    assert o["ttft_p50_s"] == pytest.approx(0.004) and o["ttft_p99_s"] == pytest.approx(0.004)
    assert o["e2e_p50_share"] == pytest.approx(0.02 / 0.58)
    assert statuses(r) == {"overhead_ttft_p50": "PASS", "overhead_ttft_p99": "PASS",
                           "overhead_e2e_p50": "PASS", "no_errors_lanes": "PASS",
                           "no_errors_direct": "PASS"}
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "TTFT overhead P50 +4.0 ms" in lines["overhead_ttft_p50"]
    text = render_text(r)
    assert "| direct | overhead | short | 100 |" in text


def test_the_front_ends_cpu_is_reported_per_phase():
    r = report_of(fake_run(10.0, 1.0, 1.2, 1.0))
    r["topologies"]["lanes"]["host"] = {
        "baseline": {"wall_s": 90.0, "frontend_cpu_s": 9.0, "engine_cpu_s": 80.0},
        "mixed": {"wall_s": 120.0, "frontend_cpu_s": 30.0, "engine_cpu_s": 200.0}}
    assert ("front end's CPU (all but the engines), lanes: baseline 9 s in 90 s (0.10 cores), "
            "mixed 30 s in 120 s (0.25 cores)") in render_text(r)


def test_burst_figures_take_the_short_requests_that_arrived_during_the_long_prefill():
    from tailguard.bench.report import burst_figures

    def long_one(sent, ttft):
        return ok("long", 5.0, sent=sent, tokens=16, lane="long", ttft=ttft)

    # long prompts land at 1.0 s; their first tokens come at 1.5 s and 3.0 s: the prefill ends then
    mixed = [long_one(1.0, 0.5), long_one(1.0, 2.0),
             ok("short", 0.2, sent=0.5, ttft=0.05),   # before the burst: not counted
             ok("short", 2.0, sent=1.5, ttft=1.2),    # during it
             ok("short", 0.9, sent=2.5, ttft=0.4),    # during it
             ok("short", 0.1, sent=3.5, ttft=0.03)]   # after the last first token
    baseline = [ok("short", 0.1, sent=t, ttft=0.04) for t in (0.5, 1.5, 2.5, 3.5)]
    b = burst_figures({"mixed": mixed, "baseline": baseline}, "short", "long", burst_at_s=1.0)
    assert (b["longs"], b["long_first_tokens"], b["prefill_end_s"]) == (2, 2, 3.0)
    assert b["mixed"]["short"] == 2 and b["mixed"]["ttft_max_s"] == 1.2
    assert b["baseline"]["short"] == 2 and b["baseline"]["ttft_max_s"] == 0.04


def test_a_long_prompt_that_never_started_stretches_the_burst_to_the_phase_end():
    from tailguard.bench.report import burst_figures

    never = Sample("long", 16, arrival_s=1.0, sent_s=1.0, status="failed")
    mixed = [never, ok("short", 0.5, sent=1.2, ttft=0.3), ok("short", 0.5, sent=4.0, ttft=0.3)]
    b = burst_figures({"mixed": mixed}, "short", "long", burst_at_s=1.0)
    assert b["long_first_tokens"] == 0 and b["mixed"]["short"] == 2
