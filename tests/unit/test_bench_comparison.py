"""tailguard against its peers per class: served, within target, refused, refused with a free slot
(tailguard/bench/comparison.py), and the report's lines and table."""

import json

import pytest
from test_bench_report import ok, statuses

from tailguard.bench.comparison import LONG_TTFT_TARGET_S, better_fleet, class_row, targets
from tailguard.bench.goodput import DEFAULT_LONG_SLO, DEFAULT_SHORT_SLO
from tailguard.bench.loadgen import REFUSED, Sample
from tailguard.bench.report import build_report, render_text
from tailguard.bench.topology import FLEET, FLEET_P2
from tailguard.bench.tuned import tuned_name

TUNED = tuned_name(1024, 256)


def refused(cls, t, status=429, attempts=1):
    return Sample(cls, 64, t, sent_s=t, status=REFUSED, http_status=status,
                  refused_at=[100.0 + t], attempts=attempts)


def test_the_targets_are_the_bench_slos_and_a_long_first_token_within_10_s():
    short, long = targets(DEFAULT_SHORT_SLO, DEFAULT_LONG_SLO)
    assert short == DEFAULT_SHORT_SLO == (("ttft", 1000.0), ("e2el", 4000.0))
    assert dict(long) == {"tpot": 200.0, "ttft": LONG_TTFT_TARGET_S * 1e3}
    assert dict(targets(DEFAULT_SHORT_SLO, (("ttft", 5000.0),))[1]) == {"ttft": 5000.0}


def test_a_class_row_counts_429_and_503_apart():
    slo = DEFAULT_SHORT_SLO
    row = class_row([ok("short", 0.5), ok("short", 5.0), refused("short", 1),
                     refused("short", 2, status=503, attempts=3)], slo, free_slot=1)
    assert {k: row[k] for k in ("sent", "served", "within_target", "refused_429", "refused_503",
                                "refused_free_slot", "retried")} == \
        {"sent": 4, "served": 2, "within_target": 1, "refused_429": 1, "refused_503": 1,
         "refused_free_slot": 1, "retried": 1}
    assert row["e2e_p99_s"] == 5.0


@pytest.mark.parametrize("within, tok_s, best", [
    ({FLEET: 10, FLEET_P2: 12}, {}, FLEET_P2),
    ({FLEET: 12, FLEET_P2: 12}, {FLEET: 100.0, FLEET_P2: 90.0}, FLEET),  # a tie: output tok/s
    ({FLEET: 3}, {}, FLEET),
    ({}, {}, None),
])
def test_the_better_fleet(within, tok_s, best):
    rows = {f: {"classes": {"short": {"within_target": n}}} for f, n in within.items()}
    assert better_fleet({**rows, "lanes": {"classes": {"short": {"within_target": 99}}}},
                        tok_s) == best


def _engines(running_a, running_b):
    """One phase's EngineWatch figures: two engines, each at one level the whole phase."""
    return {"series": {"a": [[0.0, running_a]], "b": [[0.0, running_b]]},
            "served": {"a": 7, "b": 3}}


def _report(samples, topologies, retries=0):
    return build_report(
        config={"metric": "e2e_s", "retries": retries},
        workload={"name": "mixed", "classes": ["short", "long"], "short_class": "short",
                  "long_class": "long", "params": {"duration_s": 10}},
        topologies=topologies, samples=samples)


def _run(short_ok, short_refused=0, long_ttft=1.0):
    shorts = [ok("short", 0.5, sent=i) for i in range(short_ok)]
    return {"mixed": shorts + [refused("short", 20 + i) for i in range(short_refused)]
            + [ok("long", 20.0, sent=0, tokens=512, ttft=long_ttft, lane="long")]}


def _info(running_a, running_b, class_engines=None):
    return {"engine_slots": {"a": 4, "b": 4}, "class_engines": class_engines,
            "host": {"mixed": {"engines": _engines(running_a, running_b)}}}


def test_the_report_compares_lanes_with_the_better_fleet_and_tuned_vllm():
    samples = {"lanes": _run(8, short_refused=2), FLEET: _run(6, long_ttft=12.0),
               FLEET_P2: _run(7), TUNED: _run(5)}
    topologies = {
        # b, the only engine serving short, is full; a has room but takes only long
        "lanes": _info(1, 4, {"short": ["b"], "long": ["a"]}),
        FLEET: _info(4, 4), FLEET_P2: _info(2, 4), TUNED: {}}
    r = _report(samples, topologies, retries=2)
    p = r["peers"]
    assert p["better_fleet"] == FLEET_P2 and p["tuned"] == TUNED and p["retries"] == 2
    assert p["targets"] == {"short": "ttft:1000,e2el:4000", "long": "tpot:200,ttft:10000"}
    lanes = p["rows"]["lanes"]["classes"]
    assert (lanes["short"]["served"], lanes["short"]["within_target"],
            lanes["short"]["refused_429"], lanes["short"]["refused_free_slot"]) == (8, 8, 2, 0)
    assert p["rows"][FLEET]["classes"]["long"]["within_target"] == 0  # its first token past 10 s
    assert p["rows"][TUNED]["classes"]["short"]["refused_free_slot"] is None  # not watched
    assert p["rows"][FLEET_P2]["engine_served"] == {"a": 7, "b": 3}
    assert p["vs_fleet"]["short"]["served"] == pytest.approx(8 / 7)
    assert p["vs_fleet"]["short"]["within_target"] == pytest.approx(8 / 7)
    assert p["vs_tuned"]["short"]["within_target"] == pytest.approx(8 / 5)
    assert p["vs_fleet"]["long"]["within_target"] == pytest.approx(1.0)
    assert set(p["vs_fleet"]["short"]) >= {"e2e_p99_s", "ttft_p99_s"}
    assert set(p["output_vs"]) == {p["better_fleet"], TUNED}
    s = statuses(r)
    assert (s["within_target_vs_fleet_short"], s["within_target_vs_fleet_long"],
            s["short_refused_free_slot"]) == ("PASS", "PASS", "PASS")
    assert s["peers_vs_fleet"] == s["peers_vs_tuned"] == s["engine_split_fleet"] == "INFO"
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "(client retries 2)" in lines["within_target_vs_fleet_short"]
    assert "e2e p99 s" in lines["peers_vs_fleet"] and "output tok/s" in lines["peers_vs_fleet"]
    text = render_text(r)
    assert "client retries of a 429/503: 2" in text
    assert f"| {FLEET_P2} | short | 7 | 7 | 7 | 0 | 0 | 0 | 0 | 0.500 | 0.050 | a 7, b 3 |" in text
    # a long refusal is not judged by the gauges: they count every request against the short
    # lane's slots, and the long lane's limit on an engine is lower
    assert lanes["long"]["refused_free_slot"] is None
    assert f"| {FLEET_P2} | long | 1 | 1 | 1 | 0 | 0 | n/a | 0 | 20.000 | 1.000 |  |" in text
    assert "| lanes | short | 10 | 8 | 8 | 2 | 0 | 0 | 0 |" in text
    json.dumps(r)


def test_a_short_refusal_while_its_engine_had_room_fails_the_line():
    samples = {"lanes": _run(8, short_refused=1), FLEET: _run(9)}
    r = _report(samples, {"lanes": _info(1, 4, {"short": ["a", "b"], "long": ["a"]}),
                          FLEET: _info(0, 0)})
    short = r["peers"]["rows"]["lanes"]["classes"]["short"]
    assert short["refused_free_slot"] == 1
    assert [e["engine"] for e in short["refused_free_slot_evidence"]] == ["a"]  # and its scrapes
    s = statuses(r)
    assert s["short_refused_free_slot"] == "FAIL" and s["within_target_vs_fleet_short"] == "FAIL"
    assert "peers_vs_tuned" not in s


def test_without_a_fleet_the_table_is_printed_and_no_line_added():
    r = _report({"lanes": _run(3)}, {"lanes": {}})
    assert r["peers"]["better_fleet"] is None and r["peers"]["vs_fleet"] is None
    assert not any(t["name"].startswith(("within_target_vs", "short_refused", "peers_"))
                   for t in r["targets"])
    assert "| lanes | short | 3 | 3 | 3 | 0 | 0 | n/a | 0 |" in render_text(r)


def test_a_fleet_without_lanes_skips_the_lines():
    r = _report({FLEET: _run(4)}, {FLEET: _info(0, 0)})
    s = statuses(r)
    assert (s["within_target_vs_fleet_short"], s["short_refused_free_slot"]) == ("SKIP", "SKIP")
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "lanes short requests within target n/a >= fleet's 4" in lines[
        "within_target_vs_fleet_short"]


def test_the_report_gives_each_topologys_prefix_cache_hit_rate():
    """From the engines' counters over the phase (EngineWatch's prefix_cache), every engine of a
    topology together; a topology not watched has none."""
    samples = {"lanes": _run(4), FLEET: _run(4), TUNED: _run(4)}
    lanes, fleet = _info(0, 0), _info(0, 0)
    lanes["host"]["mixed"]["engines"]["prefix_cache"] = {
        "a": {"queries": 3000.0, "hits": 2400.0}, "b": {"queries": 1000.0, "hits": 600.0}}
    fleet["host"]["mixed"]["engines"]["prefix_cache"] = {
        "a": {"queries": 2000.0, "hits": 500.0}, "b": None}
    r = _report(samples, {"lanes": lanes, FLEET: fleet, TUNED: {}})
    assert r["prefix_cache"]["lanes"]["mixed"]["hit_rate"] == pytest.approx(0.75)
    assert r["prefix_cache"][FLEET]["mixed"]["unread"] == ["b"]
    assert TUNED not in r["prefix_cache"]
    assert r["peers"]["rows"]["lanes"]["prefix_cache"]["hits"] == 3000.0
    assert r["peers"]["rows"][TUNED]["prefix_cache"] is None
    text = render_text(r)
    assert "  lanes: mixed 75.0% (3000 of 4000)" in text
    assert f"  {FLEET}: mixed 25.0% (some engines unread) (500 of 2000)" in text
    assert "| a 7, b 3 | 75.0% |" in text and "| n/a |" in text  # the table's column
    json.dumps(r)
