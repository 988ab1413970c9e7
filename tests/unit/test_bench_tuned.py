"""The tuned plain vLLM: its sweep, its flags, the best-of-sweep rule and its report lines."""

import tomllib

import pytest
from lanes_shapes import partitioned_default
from test_bench_report import ok, statuses

from tailguard.bench.report import build_report, render_text
from tailguard.bench.topology import DIRECT, TOPOLOGIES, direct_spec, lanes_spec, tuned_specs
from tailguard.bench.tuned import (
    BEST_RULE,
    TUNED,
    best_of_sweep,
    is_tuned,
    parse_sweep,
    sweep_text,
    tuned_name,
)
from tailguard.host.cores import Pinning
from tailguard.lanes.table import parse_lanes


def test_the_sweep_parses_and_prints_back():
    sweep = parse_sweep("1024:256, 2048:512,512:128")
    assert sweep == ((1024, 256), (2048, 512), (512, 128))
    assert parse_sweep(sweep_text(sweep)) == sweep


@pytest.mark.parametrize("text", ["", "1024", "1024:x", "0:0", "256:1024", "512:128,512:128"])
def test_a_bad_sweep_is_refused(text):
    with pytest.raises(ValueError):
        parse_sweep(text)


@pytest.mark.parametrize("runs, best", [
    # the lowest P99 wins among the runs within 5% of the best goodput...
    ({"a": (3.0, 10.0), "b": (2.0, 9.6), "c": (1.0, 9.0)}, "b"),
    # ...and a run far below it in goodput never does, however low its P99
    ({"a": (3.0, 10.0), "c": (0.5, 5.0)}, "a"),
    ({"a": (2.0, 10.0), "b": (2.0, 9.8)}, "a"),  # a tie: the higher goodput
    ({"a": (None, 10.0), "b": (5.0, 4.0)}, "b"),  # a run missing a figure is not chosen
    ({"a": (None, None)}, None),
    ({}, None),
])
def test_best_of_sweep(runs, best):
    assert best_of_sweep(runs) == best


def test_tuned_servers_are_direct_plus_chunked_prefill_flags():
    table = parse_lanes(tomllib.loads(partitioned_default()))
    lanes = lanes_spec(table, "", cores=[0, 1])
    direct = direct_spec(Pinning(cores=(0, 1)), lanes.workers, table, max_model_len=2048)
    tuned = tuned_specs(direct, ((1024, 256), (512, 128)))
    assert [t.name for t in tuned] == ["direct-tuned-1024-256", "direct-tuned-512-128"]
    argv = list(tuned[0].argv("m", 8000, python="py"))
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "1024"
    assert argv[argv.index("--long-prefill-token-threshold") + 1] == "256"
    assert "--enable-chunked-prefill" in argv
    assert not any("partial-prefills" in a for a in argv)  # no-ops in vLLM V1
    assert tuned[0].to_dict()["extra_args"][-4:] == ["--max-num-batched-tokens", "1024",
                                                     "--long-prefill-token-threshold", "256"]
    assert all(is_tuned(t.name) for t in tuned) and not is_tuned(DIRECT) and TUNED in TOPOLOGIES
    with pytest.raises(ValueError, match="max-num-seqs"):  # vLLM would refuse it at start
        tuned_specs(direct, ((16, 8),))
    with pytest.raises(ValueError, match="max-model-len"):
        tuned_specs(direct, ((8192, 4096),))


def test_the_report_names_the_best_tuned_run_and_compares_lanes_with_it():
    def run(short_p99, long_ttft=1.0, n=10):
        return ([ok("short", 0.1, sent=i) for i in range(n - 1)] + [ok("short", short_p99, 9)]
                + [ok("long", 10.0, sent=0, tokens=512, ttft=long_ttft, lane="long")])

    fast, slow = tuned_name(1024, 256), tuned_name(512, 128)
    samples = {"lanes": {"mixed": run(1.0, long_ttft=1.5)}, fast: {"mixed": run(4.0)},
               slow: {"mixed": run(3.0, n=5)}}  # fewer requests met the SLO: not eligible
    flags = ["--enable-chunked-prefill", "--max-num-batched-tokens", "1024",
             "--long-prefill-token-threshold", "256"]
    r = build_report(
        config={"metric": "e2e_s"},
        workload={"name": "mixed", "classes": ["short", "long"], "short_class": "short",
                  "long_class": "long", "params": {}},
        topologies={fast: {"extra_args": flags}, slow: {"extra_args": []}}, samples=samples)
    assert r["tuned"]["best"] == fast and r["tuned"]["flags"] == flags
    assert r["tuned"]["rule"] == BEST_RULE and set(r["tuned"]["runs"]) == {fast, slow}
    assert r["ratios"]["e2e_s"]["lanes_short_p99_over_tuned"] == pytest.approx(0.25)
    s = statuses(r)
    assert s["tuned"] == "INFO" and s["lanes_vs_tuned_e2e"] == "PASS"
    assert s["lanes_vs_tuned_ttft"] == s["goodput_vs_tuned"] == "PASS"
    assert s["long_ttft_vs_tuned"] == "PASS"  # 1.5 s <= 2 x 1.0 s
    text = render_text(r)
    assert f"best tuned vLLM ({fast})" in text and "--long-prefill-token-threshold 256" in text
