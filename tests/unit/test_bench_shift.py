"""The shift workload (a mix that moves: short-heavy, long-heavy, short-heavy again), its
per-window report, and the lane moves read from /metrics."""

import pytest
from test_bench_report import ok, statuses

from tailguard.bench.lane_moves import between, bucket_quantile, describe, parse
from tailguard.bench.loadgen import Sample
from tailguard.bench.report import build_report, render_text
from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.bench.workload import LONG, SHIFT, SHORT, shift_workload, split_shift
from tailguard.lanes.table import default_lanes_path


def test_the_mix_moves_window_by_window():
    wl = shift_workload(4.0, (0.05, 0.5, 0.05), 100.0, seed=1)
    assert wl.name == SHIFT and wl.params["duration_s"] == 300.0
    names = [w["name"] for w in wl.params["windows"]]
    assert names == ["1-short-heavy", "2-long-heavy", "3-short-heavy"]
    by_window = split_shift(wl.requests, wl.params)
    longs = {n: sum(r.cls == LONG for r in rs) for n, rs in by_window.items()}
    shorts = {n: sum(r.cls == SHORT for r in rs) for n, rs in by_window.items()}
    assert longs["2-long-heavy"] > 5 * max(longs["1-short-heavy"], longs["3-short-heavy"], 1)
    assert shorts["1-short-heavy"] > shorts["2-long-heavy"]
    assert all(0 <= r.arrival_s < 300 for r in wl.requests)
    assert list(wl.requests) == sorted(wl.requests, key=lambda r: (r.arrival_s, r.cls))
    # the baseline phase is the same short arrivals without the long ones
    assert list(phases_of(wl, baseline=True)) == ["baseline", "mixed"]
    assert shift_workload(4.0, (0.05, 0.5, 0.05), 100.0, seed=1) == wl  # reproducible


@pytest.mark.parametrize("args", [(0.0, (0.1,), 10.0), (1.0, (0.1,), 0.0), (1.0, (), 10.0),
                                  (1.0, (1.5,), 10.0)])
def test_a_bad_shift_is_refused(args):
    with pytest.raises(ValueError):
        shift_workload(*args)


def test_the_bench_builds_it_from_its_options():
    cfg = BenchConfig(workload=SHIFT, rate=2.0, shift_long_shares=(0.0, 0.5), shift_window_s=20,
                      lanes_file=default_lanes_path())
    wl = build_workload(cfg, None)
    assert [w["long_rate"] for w in wl.params["windows"]] == [0.0, 1.0]
    assert "shift: 20 s windows" in wl.params["described"]
    # the long class's wait target: the comparison's fixed long TTFT target, 10 s
    assert wl.params["long_target_wait_s"] == 10


METRICS_BEFORE = """# TYPE tailguard_lane_moves_total counter
tailguard_lane_moves_total{from="short",to="long",reason="long_behind"} 1.0
# TYPE tailguard_lane_move_seconds histogram
tailguard_lane_move_seconds_bucket{le="1.0"} 0.0
tailguard_lane_move_seconds_bucket{le="5.0"} 1.0
tailguard_lane_move_seconds_bucket{le="+Inf"} 1.0
tailguard_lane_move_seconds_count 1.0
tailguard_lane_move_seconds_sum 2.0
# TYPE tailguard_lane_move_drain_seconds histogram
tailguard_lane_move_drain_seconds_bucket{le="1.0"} 0.0
tailguard_lane_move_drain_seconds_bucket{le="2.5"} 1.0
tailguard_lane_move_drain_seconds_bucket{le="+Inf"} 1.0
"""
METRICS_AFTER = """# TYPE tailguard_lane_moves_total counter
tailguard_lane_moves_total{from="short",to="long",reason="long_behind"} 2.0
tailguard_lane_moves_total{from="long",to="short",reason="short_behind"} 2.0
# TYPE tailguard_lane_move_seconds histogram
tailguard_lane_move_seconds_bucket{le="1.0"} 2.0
tailguard_lane_move_seconds_bucket{le="5.0"} 3.0
tailguard_lane_move_seconds_bucket{le="+Inf"} 4.0
tailguard_lane_move_seconds_count 4.0
tailguard_lane_move_seconds_sum 30.0
# TYPE tailguard_lane_move_drain_seconds histogram
tailguard_lane_move_drain_seconds_bucket{le="1.0"} 2.0
tailguard_lane_move_drain_seconds_bucket{le="2.5"} 4.0
tailguard_lane_move_drain_seconds_bucket{le="+Inf"} 4.0
"""


def test_lane_moves_of_a_phase_from_two_reads_of_metrics():
    moves = between(parse(METRICS_BEFORE), parse(METRICS_AFTER))
    assert moves["exposed"] and moves["moves"] == 3 and moves["timed"] == 3
    assert {(m["from"], m["to"], m["count"]) for m in moves["by_move"]} == {
        ("short", "long", 1), ("long", "short", 2)}
    # the phase's 3 moves: 2 within 1 s, none more within 5 s, 1 past the last bound
    assert moves["move_p50_s"] == 1.0 and moves["move_p99_s"] is None
    assert "3 moves" in describe(moves) and "P50 <= 1 s" in describe(moves)
    # their drains, apart: 2 within 1 s, the third within 2.5 s
    assert (moves["drain_p50_s"], moves["drain_p99_s"]) == (1.0, 2.5)
    assert "the drain (old lanes' running jobs) P50 <= 1 s, P99 <= 2.5 s" in describe(moves)


def test_no_metric_or_no_move_says_no_moves():
    nothing = between(parse(""), parse("# TYPE other counter\nother_total 1.0\n"))
    assert nothing == {"exposed": False, "moves": 0} and describe(nothing).startswith("no moves")
    same = between(parse(METRICS_BEFORE), parse(METRICS_BEFORE))
    assert describe(same) == "no moves"


def test_bucket_quantile_is_the_bound_the_rank_falls_in():
    assert bucket_quantile({0.5: 1, 1.0: 9, 2.0: 10, float("inf"): 10}, 50) == 1.0
    assert bucket_quantile({0.5: 1, 1.0: 9, 2.0: 10, float("inf"): 10}, 99) == 2.0
    assert bucket_quantile({1.0: 0, float("inf"): 0}, 50) is None


def test_the_report_gives_each_window_its_figures_and_the_moves():
    wl = shift_workload(1.0, (0.0, 0.5, 0.0), 10.0)
    params = wl.params

    def run(slow_window_p99):
        ss = [ok("short", 0.5, sent=t) for t in (1, 2, 11, 12, 21, 22)]
        ss.append(ok("short", slow_window_p99, sent=13))  # in the long-heavy window
        ss.append(ok("long", 8.0, sent=14, tokens=512, lane="long", ttft=2.0, queue=1.5))
        for s in ss:
            s.arrival_s = s.sent_s
        return ss

    base = [s for s in run(0.5) if s.cls == "short"]
    samples = {"lanes": {"baseline": base, "mixed": run(0.6)},
               "shared": {"baseline": base, "mixed": run(5.0)}}
    moves = between(parse(METRICS_BEFORE), parse(METRICS_AFTER))
    r = build_report(config={"metric": "e2e_s"},
                     workload={"name": SHIFT, "classes": ["short", "long"], "short_class": "short",
                               "long_class": "long", "params": params},
                     topologies={"lanes": {"host": {"mixed": {"lane_moves": moves}}}},
                     samples=samples)
    lanes = r["shift"]["lanes"]["windows"]
    assert [w["name"] for w in lanes] == ["1-short-heavy", "2-long-heavy", "3-short-heavy"]
    assert lanes[1]["short_e2e_p99_s"] == 0.6 and lanes[1]["short_p99_over_baseline"] == 1.2
    assert (lanes[1]["long_ttft_p99_s"], lanes[1]["long_queued_p99_s"]) == (2.0, 1.5)
    assert lanes[0]["long"] == 0 and lanes[1]["goodput_rps"] is not None
    s = statuses(r)
    assert s["shift_short_lanes"] == "PASS" and s["shift_short_shared"] == "FAIL"
    assert s["lane_moves_lanes"] == "INFO" and "lane_moves_shared" not in s
    text = render_text(r)
    assert "| lanes | 2-long-heavy |" in text and "3 moves" in text


@pytest.mark.parametrize(("queue_s", "failed", "status"), [
    (9.0, False, "PASS"),   # every window's long queue wait P99 within the lane's 10 s
    (12.0, False, "FAIL"),  # one window's past it
    (1.0, True, "FAIL"),    # within it, but a long request failed there
])
def test_long_requests_served_within_their_lanes_target_in_every_window(queue_s, failed, status):
    params = {**shift_workload(1.0, (0.0, 0.5, 0.0), 10.0).params, "long_target_wait_s": 10}
    ss = [ok("short", 0.5, sent=t) for t in (1, 11, 21)]
    ss.append(ok("long", 8.0, sent=12, tokens=512, lane="long", queue=queue_s))
    if failed:
        ss.append(Sample("long", 512, 13.0, sent_s=13.0, status="failed", accepted=True,
                         finished=True, lane="long"))
    for s in ss:
        s.arrival_s = s.sent_s
    r = build_report(config={"metric": "e2e_s"},
                     workload={"name": SHIFT, "classes": ["short", "long"], "short_class": "short",
                               "long_class": "long", "params": params},
                     topologies={}, samples={"lanes": {"mixed": ss}})
    assert statuses(r)["shift_long_lanes"] == status
    # windows without long requests have nothing to serve: only the long-heavy one is named
    line = next(x["line"] for x in r["targets"] if x["name"] == "shift_long_lanes")
    assert "2-long-heavy" in line and "1-short-heavy" not in line
