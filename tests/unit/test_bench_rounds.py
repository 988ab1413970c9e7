"""A topology named twice in --topologies runs twice; the report pools its rounds and shows each."""

import pytest

from tailguard.bench.goodput import phase_span_s
from tailguard.bench.loadgen import Sample
from tailguard.bench.report import build_report, render_text
from tailguard.bench.rounds import pool_ends, pool_engines, pool_host, round_label, run_order
from tailguard.bench.run import BenchConfig, _check_choices, _order, _specs, build_workload
from tailguard.bench.topology import FLEET, lanes_spec
from tailguard.bench.tuned import is_tuned
from tailguard.lanes.table import default_lanes_path, load_lanes


def ok(cls, e2e, sent, round_no=1, ttft=0.05, tokens=64):
    s = Sample(cls, tokens, arrival_s=sent, sent_s=sent, status="succeeded", ok=True,
               accepted=True, finished=True, job_id=f"{cls}-{sent}-{round_no}", ttft_s=ttft,
               e2e_s=e2e, completion_tokens=tokens, finish_reason="length")
    s.round = round_no
    return s


def test_a_topology_named_again_runs_again_as_its_next_round():
    assert run_order(["lanes", "fleet", "fleet", "lanes"], ["lanes", "fleet"]) == [
        ("lanes", 1), ("fleet", 1), ("fleet", 2), ("lanes", 2)]
    assert run_order(["lanes", "fleet"], ["lanes", "fleet"]) == [("lanes", 1), ("fleet", 1)]
    tuned = ["direct-tuned-512-128", "direct-tuned-1024-256"]
    assert run_order(["direct-tuned", "direct-tuned"], tuned,
                     lambda name, want: is_tuned(name) and want == "direct-tuned") == [
        (tuned[0], 1), (tuned[1], 1), (tuned[0], 2), (tuned[1], 2)]
    assert [round_label("lanes", n) for n in (1, 2, 3)] == ["lanes", "lanes.2", "lanes.3"]


def test_the_run_starts_each_round_from_the_topologies_given(table):
    cfg = BenchConfig(workload="mixed", topologies=("lanes", FLEET, FLEET, "lanes"))
    wl = build_workload(cfg, None, table)
    lanes = lanes_spec(table, default_lanes_path().read_text(), cores=[0, 1])
    specs = _specs(cfg, wl, table, lanes, "demo-small", 4096, kind="cpu", cores=[0, 1], engines=2)
    assert list(specs) == ["lanes", FLEET]  # each built once
    assert _order(cfg, wl, specs) == [("lanes", 1), (FLEET, 1), (FLEET, 2), ("lanes", 2)]


@pytest.mark.parametrize("workload", ["overload", "batch", "tenants"])
def test_workloads_with_a_probe_or_a_batch_refuse_a_topology_named_twice(workload):
    with pytest.raises(ValueError, match="once"):
        _check_choices(BenchConfig(workload=workload, topologies=("lanes", "lanes")))
    _check_choices(BenchConfig(workload="chat", topologies=("lanes", "lanes")))


def test_no_more_rounds_of_tailguards_topologies_than_redis_has_databases():
    _check_choices(BenchConfig(workload="chat", topologies=("lanes", FLEET) * 16))
    with pytest.raises(ValueError, match="at most 16 rounds"):
        _check_choices(BenchConfig(workload="chat", topologies=("lanes", "shared") * 9))


def test_the_span_of_pooled_rounds_is_their_spans_summed():
    # each round's times count from its own phase start: 0-10 s and 0-4 s, not 0-10 s
    first = [ok("short", 1.0, 0.0), ok("short", 1.0, 9.0)]
    second = [ok("short", 1.0, 0.0, round_no=2), ok("short", 1.0, 3.0, round_no=2)]
    assert phase_span_s(first) == 10.0 and phase_span_s(second) == 4.0
    assert phase_span_s(first + second) == 14.0


def test_engines_and_host_figures_pool_over_rounds():
    a = {"series": {"e0": [[1.0, 2]]}, "served": {"e0": 5},
         "prefix_cache": {"e0": {"queries": 100, "hits": 60}}}
    b = {"series": {"e0": [[9.0, 1]]}, "served": {"e0": None},
         "prefix_cache": {"e0": {"queries": 50, "hits": 10}}}
    pooled = pool_engines(a, b)
    assert pooled["series"]["e0"] == [[1.0, 2], [9.0, 1]]
    assert pooled["served"] == {"e0": None}  # unread in one round: unknown in all
    assert pooled["prefix_cache"]["e0"] == {"queries": 150, "hits": 70}
    assert pool_engines(None, None) is None and pool_engines(a, None) == a
    host = pool_host({"wall_s": 10.0, "frontend_cpu_s": 3.0, "others_share": 0.1,
                      "disturbed": False, "engines": a},
                     {"wall_s": 30.0, "frontend_cpu_s": 6.0, "others_share": 0.3,
                      "disturbed": True, "engines": b})
    assert (host["wall_s"], host["frontend_cpu_s"]) == (40.0, 9.0)
    assert host["others_share"] == pytest.approx(0.25) and host["disturbed"] is True
    assert host["engines"]["prefix_cache"]["e0"]["hits"] == 70
    assert pool_ends({"j1": 1}, {"j2": 1, "j1": 1}) == {"j1": 2, "j2": 1}
    assert pool_ends({"j1": 1}, None) is None


def test_the_report_pools_the_rounds_and_shows_each_with_its_position():
    def cache(queries, hits):
        return {"e0": {"queries": queries, "hits": hits}}

    lanes = [ok("short", 0.5, i, ttft=0.1) for i in range(10)] + \
        [ok("short", 0.5, i, round_no=2, ttft=0.3) for i in range(10)]
    fleet = [ok("short", 0.5, i, ttft=0.2) for i in range(10)]
    topologies = {
        "lanes": {"host": {"mixed": {"engines": {"prefix_cache": cache(300, 150)}}},
                  "rounds": [{"round": 1, "position": 1, "prefix_cache": {"mixed": {
                      "queries": 100, "hits": 80, "hit_rate": 0.8, "unread": []}}},
                             {"round": 2, "position": 3, "prefix_cache": {"mixed": {
                                 "queries": 200, "hits": 70, "hit_rate": 0.35, "unread": []}}}]},
        FLEET: {"rounds": [{"round": 1, "position": 2, "prefix_cache": {}}]}}
    r = build_report(config={"metric": "ttft_s"},
                     workload={"name": "chat", "classes": ["short"], "short_class": "short",
                               "long_class": None, "params": {"duration_s": 10}},
                     topologies=topologies, samples={"lanes": {"mixed": lanes},
                                                     FLEET: {"mixed": fleet}})
    # pooled: 20 requests, the P99 the second round's; the hit rate over both rounds' tokens
    assert r["topologies"]["lanes"]["phases"]["mixed"]["short"]["count"] == 20
    assert r["topologies"]["lanes"]["phases"]["mixed"]["short"]["ttft_s"]["p99"] == 0.3
    assert r["prefix_cache"]["lanes"]["mixed"]["hit_rate"] == 0.5
    rows = {(x["topology"], x["round"]): x for x in r["rounds"]}
    assert set(rows) == {("lanes", 1), ("lanes", 2)}  # the fleet ran once: no rows
    assert rows["lanes", 1]["short_ttft_p99_s"] == 0.1 and rows["lanes", 2]["position"] == 3
    assert rows["lanes", 2]["sent"] == 10 and rows["lanes", 2]["prefix_cache"]["hit_rate"] == 0.35
    text = render_text(r)
    assert "| lanes | 2 | 3 | mixed | 10 | 10 | 0.300 | 0.300 |" in text and "35.0%" in text


@pytest.fixture
def table():
    return load_lanes(default_lanes_path())
