"""The `static` topology: the same lanes as a partition of the engines, and the report's lines
against it."""

import tomllib

import pytest
from test_bench_report import ok, statuses

from tailguard.bench.report import build_report, render_text
from tailguard.bench.run import BenchConfig
from tailguard.bench.topology import DEFAULT_TOPOLOGIES, STATIC, TOPOLOGIES, lanes_spec, static_spec
from tailguard.lanes.table import parse_lanes


def _fleet():
    """The `lanes` topology of the CPU host's shipped file: one engine per core, each serving
    every lane."""
    from tailguard.lanes.table import cpu_lanes_path

    text = cpu_lanes_path().read_text()
    return lanes_spec(parse_lanes(tomllib.loads(text)), text, cores=[0, 1])


def test_static_is_the_same_lanes_as_a_partition_on_the_same_engines():
    fleet = _fleet()
    static = static_spec(fleet, cores=[0, 1])
    assert static.name == STATIC and fleet.name == "lanes"
    assert [(w.name, w.lanes) for w in fleet.workers] == [
        ("engine", ("short", "long", "batch")), ("engine-2", ("short", "long", "batch"))]
    assert [(w.name, w.lanes) for w in static.workers] == [("short", ("short",)),
                                                            ("long", ("long", "batch"))]
    assert [w.pin for w in static.workers] == [w.pin for w in fleet.workers]
    assert static.table.lanes == fleet.table.lanes
    assert static.frontend == fleet.frontend


def test_a_file_that_already_partitions_is_run_as_it_is():
    from lanes_shapes import partitioned_default

    text = partitioned_default()
    lanes = lanes_spec(parse_lanes(tomllib.loads(text)), text, cores=[0, 1])
    static = static_spec(lanes, cores=[0, 1])
    assert static.lanes_toml == lanes.lanes_toml and static.workers == lanes.workers


def test_static_is_a_choice_but_not_a_default():
    assert STATIC in TOPOLOGIES and STATIC not in DEFAULT_TOPOLOGIES
    assert STATIC not in BenchConfig().topologies


def _run(short_p99, short_ttft=0.05, long_ttft=1.0, n=10, long_tokens=512):
    """`n` short requests (the last the slowest) and one long one."""
    return ([ok("short", 0.1, sent=i, ttft=0.01) for i in range(n - 1)]
            + [ok("short", short_p99, 9, ttft=short_ttft)]
            + [ok("long", 10.0, sent=0, tokens=long_tokens, ttft=long_ttft, lane="long")])


def _report(samples):
    return build_report(
        config={"metric": "e2e_s"},
        workload={"name": "mixed", "classes": ["short", "long"], "short_class": "short",
                  "long_class": "long", "params": {}},
        topologies={}, samples=samples)


LINES = ("lanes_vs_static_e2e", "lanes_vs_static_ttft", "goodput_vs_static",
         "total_throughput_vs_static", "long_ttft_vs_static")


def test_lanes_better_than_static_on_every_line_passes():
    r = _report({"lanes": {"mixed": _run(1.0, short_ttft=0.2, long_ttft=1.5)},
                 STATIC: {"mixed": _run(4.0, short_ttft=0.3, long_ttft=2.0)}})
    assert r["static"]["phase"] == "mixed"
    assert r["static"]["lanes"]["short_e2e_p99_s"] == 1.0
    assert r["static"][STATIC]["short_e2e_p99_s"] == 4.0
    assert r["ratios"]["e2e_s"]["lanes_short_p99_over_static"] == pytest.approx(0.25)
    s = statuses(r)
    assert {name: s[name] for name in LINES} == dict.fromkeys(LINES, "PASS")
    text = render_text(r)
    assert "lanes / static lanes (no controller) 0.25x" in text
    assert "PASS  lanes short end-to-end P99 1.000 s <= static lanes' 4.000 s: ratio 0.25x" in text


def test_lanes_worse_than_static_on_a_line_fails_it():
    # static: a faster short tail, more requests met their SLO, more tokens out, a faster long TTFT
    r = _report({"lanes": {"mixed": _run(4.0, short_ttft=0.3, long_ttft=2.0, n=5, long_tokens=64)},
                 STATIC: {"mixed": _run(1.0, short_ttft=0.2, long_ttft=1.5)}})
    s = statuses(r)
    assert {name: s[name] for name in LINES} == dict.fromkeys(LINES, "FAIL")


def test_equal_figures_pass():
    r = _report({"lanes": {"mixed": _run(2.0)}, STATIC: {"mixed": _run(2.0)}})
    s = statuses(r)
    assert {name: s[name] for name in LINES} == dict.fromkeys(LINES, "PASS")


def test_no_static_lines_when_static_did_not_run():
    r = _report({"lanes": {"mixed": _run(1.0)}})
    assert r["static"] is None
    assert not set(LINES) & set(statuses(r))
    assert "static lanes" not in render_text(r)


def test_a_static_run_without_lanes_skips_the_lines():
    s = statuses(_report({STATIC: {"mixed": _run(1.0)}}))
    assert {name: s[name] for name in LINES} == dict.fromkeys(LINES, "SKIP")


def test_static_may_run_another_lanes_file():
    """`--static-lanes`: static runs that file's workers, on the same cores, in one run."""
    from lanes_shapes import partitioned_default

    from tailguard.bench.run import _specs, build_workload
    from tailguard.lanes.table import cpu_lanes_path, load_lanes

    cfg = BenchConfig(workload="mixed", topologies=("lanes", STATIC), lanes_file=cpu_lanes_path())
    table = load_lanes(cpu_lanes_path())
    lanes = lanes_spec(table, cpu_lanes_path().read_text(), cores=[0, 1])
    text = partitioned_default()
    other = lanes_spec(parse_lanes(tomllib.loads(text)), text, cores=[0, 1])
    specs = _specs(cfg, build_workload(cfg, None, table), table, lanes, "demo-small", 4096,
                   kind="cpu", cores=[0, 1], engines=2, static_topo=other)
    assert list(specs) == ["lanes", STATIC]
    assert [w.name for w in specs[STATIC].workers] == ["short", "long"]
    assert [w.pin for w in specs[STATIC].workers] == [w.pin for w in specs["lanes"].workers]
