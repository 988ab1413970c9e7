"""The overload benchmark's pure parts: its timeline, the burst, capacity, recovery, its lines."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tailguard.bench.loadgen import REFUSED, Client, Sample
from tailguard.bench.report import (
    OVERLOAD_P99_MAX,
    build_report,
    capacity_rps,
    recovery,
    render_text,
)
from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.bench.workload import (
    LONG,
    OVERLOAD,
    SHORT,
    WINDOWS,
    BenchRequest,
    add_burst,
    overload_workload,
    split_windows,
    window_of,
)


def timeline(**kw):
    args = {"rate": 2.5, "long_share": 0.2, "reference_s": 100, "burst_s": 100, "recovery_s": 100,
            "seed": 3}
    return overload_workload(**{**args, **kw})


def test_the_timeline_is_the_mixed_load_in_three_windows():
    wl = timeline()
    p = wl.params
    assert (p["burst_start_s"], p["burst_end_s"], p["duration_s"]) == (100, 200, 300)
    assert wl.name == OVERLOAD and wl.classes == [SHORT, LONG]
    assert abs(wl.counts()[SHORT] - 600) < 100 and abs(wl.counts()[LONG] - 150) < 50
    assert [window_of(t, p) for t in (0, 99.9, 100, 199.9, 200, 299)] == \
        ["reference", "reference", "burst", "burst", "recovery", "recovery"]
    phases = phases_of(wl, baseline=True)
    assert list(phases) == list(WINDOWS)
    assert sum(len(w.requests) for w in phases.values()) == len(wl.requests)
    with pytest.raises(ValueError):
        timeline(burst_s=0)


def test_the_burst_adds_short_requests_to_factor_x_capacity_and_keeps_the_usual_ones():
    wl = timeline()
    burst = add_burst(wl, capacity_rps=10.0)
    assert burst.params["capacity_rps"] == 10.0
    assert burst.params["burst_short_rate"] == pytest.approx(30.0)  # 3 x 10, usual 2/s included
    by_window = split_windows(burst.requests, burst.params)
    shorts = [r for r in by_window["burst"] if r.cls == SHORT]
    assert abs(len(shorts) - 3000) < 250  # 30/s for 100 s
    assert all(r.max_tokens == wl.params["short_tokens"] for r in shorts)
    assert set(wl.requests) <= set(burst.requests)  # the usual arrivals are all still there
    outside = [r for r in burst.requests if window_of(r.arrival_s, burst.params) != "burst"]
    assert outside == [r for r in wl.requests if window_of(r.arrival_s, wl.params) != "burst"]
    assert add_burst(wl, 0.1).requests == wl.requests  # capacity below the usual rate: no extra


def test_bench_config_builds_the_overload_timeline():
    cfg = BenchConfig(workload="overload", duration_s=40, burst_s=60, recovery_s=30,
                      overload_factor=2.0)
    wl = build_workload(cfg, None)
    assert wl.name == OVERLOAD
    assert (wl.params["reference_s"], wl.params["burst_end_s"], wl.params["factor"]) == (40, 100, 2.0)


def done(cls="short", sent=0.0, e2e=0.5, arrival=None):
    return Sample(cls, 64, sent if arrival is None else arrival, sent_s=sent, status="succeeded",
                  ok=True, accepted=True, finished=True, job_id="j", lane=cls, e2e_s=e2e,
                  ttft_s=0.05, completion_tokens=64)


def refused(arrival, retry_after=3.0, code="wait_too_long", cls="short"):
    return Sample(cls, 64, arrival, sent_s=arrival, status=REFUSED, http_status=429,
                  refusal=code, retry_after_s=retry_after)


def test_capacity_counts_what_finished_after_the_ramp_up():
    # one request finishes every 0.5 s from t=1 to t=15.5 (a 15 s probe: counted from t=5)
    samples = [done(sent=t - 1.0, e2e=1.0) for t in [1 + i / 2 for i in range(30)]]
    samples.append(Sample("short", 64, 3.0, sent_s=3.0, status="failed"))
    assert capacity_rps(samples, 15.0) == pytest.approx(20 / 10)  # t = 5 ... 14.5
    assert capacity_rps([], 15.0) is None


def test_recovery_is_the_last_abnormal_short_request_after_the_burst():
    after = [done(sent=100 + i, e2e=0.4) for i in range(20)]
    assert recovery(after, 100, 0.6) == {"recovery_s": 0.0, "recovered": True,
                                         "requests_after": 20, "not_normal_after": 0,
                                         "last_refused_after_s": None}
    late = [refused(100.5), done(sent=102.0, e2e=5.0)] + after[3:]
    r = recovery(late, 100, 0.6)
    assert (r["recovery_s"], r["recovered"], r["not_normal_after"]) == (2.0, True, 2)
    assert r["last_refused_after_s"] == 0.5
    r = recovery(after[:-1] + [refused(119.0)], 100, 0.6)
    assert r["recovered"] is False and r["recovery_s"] == 19.0
    assert recovery([], 100, 0.6)["recovered"] is False


def overload_run(burst_p99=0.7, expired=False, missing_retry_after=False, lost=False,
                 fleet=None):
    """Reference and recovery: 20 short requests of 0.5 s (P99 0.5 s); the burst: 20 accepted
    with the slowest at `burst_p99` and 10 refused; a long request in each window."""
    ref = [done(sent=i, e2e=0.5 if i != 3 else 0.45) for i in range(20)] + [done(LONG, 1, 20.0)]
    burst = ([done(sent=100 + i, e2e=0.4) for i in range(19)] + [done(sent=120, e2e=burst_p99)]
             + [refused(121 + i, retry_after=None if missing_retry_after and i == 0 else 2.0 + i)
                for i in range(10)] + [done(LONG, 130, 25.0)])
    rec = [refused(200.5, code="lane_full"), done(sent=201, e2e=3.0)]
    rec += [done(sent=203 + i, e2e=0.5) for i in range(20)] + [done(LONG, 210, 20.0)]
    if expired:
        burst.append(Sample("short", 64, 140, sent_s=140, status="expired", accepted=True,
                            finished=True, job_id="x"))
    if lost:
        rec.append(Sample("short", 64, 250, sent_s=250, status="timeout", accepted=True, job_id="y"))
    probe = [done(sent=i / 4, e2e=1.0) for i in range(40)]
    params = {**timeline(reference_s=100, burst_s=100, recovery_s=100).params,
              "capacity_rps": 4.0, "burst_short_rate": 12.0}
    samples = {"lanes": {"probe": probe, "reference": ref, "burst": burst, "recovery": rec}}
    if fleet is not None:
        samples["fleet"] = fleet
    return build_report(
        config={"metric": "e2e_s", "model_label": "m", "engines": 2, "cores_per_engine": "1 core"},
        workload={"name": OVERLOAD, "classes": [SHORT, LONG], "short_class": SHORT,
                  "long_class": LONG, "params": params},
        topologies={"lanes": {"probe": {"concurrency": 32, "duration_s": 15}}},
        samples=samples), samples


def test_overload_picture(tmp_path):
    pytest.importorskip("matplotlib")
    from tailguard.bench.plot import make_plot

    assert make_plot(*overload_run(), tmp_path / "o.png").stat().st_size > 0


def statuses(report):
    return {t["name"]: t["status"] for t in report["targets"]}


def test_overload_lines_pass():
    r, _ = overload_run()
    o = r["overload"]["lanes"]
    assert (o["reference_p99_s"], o["burst_accepted_p99_s"]) == (0.5, 0.7)
    assert o["burst_p99_over_reference"] == pytest.approx(1.4)
    assert o["short_sent"] == {"reference": 20, "burst": 30, "recovery": 22}
    assert o["short_refused"] == {"reference": 0, "burst": 10, "recovery": 1}
    assert o["burst_refused_share"] == pytest.approx(1 / 3)
    assert o["refused_by_code"] == {"wait_too_long": 10, "lane_full": 1}
    assert (o["refused"], o["refused_with_retry_after"]) == (11, 11)
    assert (o["expired"], o["errors"], o["accepted"], o["finished"]) == (0, 0, 104, 104)
    assert o["recovery_s"] == pytest.approx(1.0) and o["recovered"]
    assert o["recovery_limit_s"] == pytest.approx(OVERLOAD_P99_MAX * 0.5)
    assert statuses(r) == {"capacity_lanes": "INFO", "refusals_lanes": "PASS",
                           "overload_p99_lanes": "PASS", "no_expired_lanes": "PASS",
                           "accepted_finished_lanes": "PASS", "recovery_lanes": "INFO"}
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "refused 10 of 30 short requests in the burst (33.3%)" in lines["refusals_lanes"]
    assert "11 of 11 refusals are 429 with Retry-After (2-11 s)" in lines["refusals_lanes"]
    assert "from 1.0 s after the burst" in lines["recovery_lanes"]
    text = render_text(r)
    assert "| lanes | burst | short | 30 | 0 | 10 |" in text and "lanes / shared" not in text
    json.dumps(r)


def test_overload_lines_fail():
    s = statuses(overload_run(burst_p99=0.8, expired=True, missing_retry_after=True, lost=True)[0])
    assert s["overload_p99_lanes"] == "FAIL"  # 0.8 / 0.5 > 1.5
    assert s["refusals_lanes"] == s["no_expired_lanes"] == s["accepted_finished_lanes"] == "FAIL"


def test_the_same_timeline_sent_to_a_fleet_is_compared_within_target():
    # the fleet refuses nothing and serves every short request, the burst's too late (5 s)
    fleet = {"reference": [done(sent=i, e2e=0.5) for i in range(20)] + [done(LONG, 1, 20.0)],
             "burst": [done(sent=100 + i, e2e=5.0) for i in range(30)] + [done(LONG, 130, 25.0)],
             "recovery": [done(sent=200 + i, e2e=0.5) for i in range(22)] + [done(LONG, 210, 20.0)]}
    r, _ = overload_run(fleet=fleet)
    assert set(r["overload"]) == {"lanes"}  # admission's lines: the fleet has none to test
    peers = r["peers"]
    assert peers["phase"] == "overload" and peers["better_fleet"] == "fleet"
    lanes, theirs = peers["rows"]["lanes"]["classes"], peers["rows"]["fleet"]["classes"]
    assert (lanes["short"]["sent"], theirs["short"]["sent"]) == (72, 72)
    # lanes: 20 + 20 + 21 served, the 3.0 s one in recovery still within the 4 s target
    assert (lanes["short"]["within_target"], theirs["short"]["within_target"]) == (61, 42)
    assert (lanes["short"]["refused_429"], theirs["short"]["refused_429"]) == (11, 0)
    st = statuses(r)
    assert st["within_target_vs_fleet_short"] == "PASS" and st["refusals_lanes"] == "PASS"
    assert "refusals_fleet" not in st
    assert "per class, overload phase" in render_text(r)
    json.dumps(r)
    slow = {**fleet, "burst": [done(sent=100 + i, e2e=0.5) for i in range(30)]}
    assert statuses(overload_run(fleet=slow)[0])["within_target_vs_fleet_short"] == "FAIL"


def test_mixed_load_lines_count_refusals_apart():
    st = build_report(
        config={"metric": "e2e_s"},
        workload={"name": "mixed", "classes": [SHORT], "short_class": SHORT, "long_class": None,
                  "params": {}},
        topologies={}, samples={"lanes": {"mixed": [done(sent=1), refused(2)]}})
    c = st["topologies"]["lanes"]["phases"]["mixed"][SHORT]
    assert (c["count"], c["ok"], c["errors"], c["refused"]) == (2, 1, 0, 1)
    line = next(t for t in st["targets"] if t["name"] == "no_errors_lanes")
    assert line["status"] == "FAIL" and "0 errors, 1 refused at admission" in line["line"]


@pytest.fixture
def refusing_api():
    """A stand-in API that answers every completion 429, with Retry-After unless told not to."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            body = json.dumps({"error": {"message": "busy", "type": "rate_limit_error",
                                         "param": None, "code": "wait_too_long"}}).encode()
            self.send_response(429)
            if "no-retry" not in self.server.mode:
                self.send_header("Retry-After", "7")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.mode = set()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_load_generator_records_a_429_and_its_retry_after(refusing_api):
    client = Client(f"http://127.0.0.1:{refusing_api.server_port}", "m")
    sample = Sample(SHORT, 8, 0.0)
    client.stream(BenchRequest(SHORT, "p", 8, 0.0), sample, 0.0, float("inf"))
    assert (sample.status, sample.http_status, sample.refusal, sample.retry_after_s) == \
        (REFUSED, 429, "wait_too_long", 7.0)
    assert not sample.accepted and not sample.ok and sample.error is None
    refusing_api.mode.add("no-retry")
    sample = Sample(SHORT, 8, 0.0)
    client.stream(BenchRequest(SHORT, "p", 8, 0.0), sample, 0.0, float("inf"))
    assert sample.status == REFUSED and sample.retry_after_s is None
