"""The shift workload (a mix that moves: short-heavy, long-heavy, short-heavy again), its
per-window report, and the lane moves read from /metrics."""

import pytest
from test_bench_report import ok, statuses

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


def test_the_report_gives_each_window_its_figures():
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
    r = build_report(config={"metric": "e2e_s"},
                     workload={"name": SHIFT, "classes": ["short", "long"], "short_class": "short",
                               "long_class": "long", "params": params},
                     topologies={}, samples=samples)
    lanes = r["shift"]["lanes"]["windows"]
    assert [w["name"] for w in lanes] == ["1-short-heavy", "2-long-heavy", "3-short-heavy"]
    assert lanes[1]["short_e2e_p99_s"] == 0.6 and lanes[1]["short_p99_over_baseline"] == 1.2
    assert (lanes[1]["long_ttft_p99_s"], lanes[1]["long_queued_p99_s"]) == (2.0, 1.5)
    assert lanes[0]["long"] == 0 and lanes[1]["goodput_rps"] is not None
    s = statuses(r)
    assert s["shift_short_lanes"] == "PASS" and s["shift_short_shared"] == "FAIL"
    assert "| lanes | 2-long-heavy |" in render_text(r)


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
