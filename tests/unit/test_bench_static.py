"""The `static` topology: `lanes` without the lane controller, and the report's lines against it."""

import tomllib

import pytest
from test_bench_report import ok, statuses

from tailguard import settings
from tailguard.bench.report import build_report, render_text
from tailguard.bench.run import BenchConfig
from tailguard.bench.topology import DEFAULT_TOPOLOGIES, STATIC, TOPOLOGIES, lanes_spec, static_spec
from tailguard.lanes.table import default_lanes_path, parse_lanes


def _lanes(moves: bool):
    """The `lanes` topology of the shipped lanes file, its long worker free to move to the short
    lane or not (whichever the shipped file says)."""
    text = "".join(line for line in default_lanes_path().read_text().splitlines(keepends=True)
                   if not line.startswith("moves_to"))
    if moves:
        text = text.replace('name = "long"\n', 'name = "long"\nmoves_to = ["short"]\n', 1)
    return lanes_spec(parse_lanes(tomllib.loads(text)), text, cores=[0, 1])


@pytest.fixture
def moving_lanes(monkeypatch):
    """Lanes whose long worker may move, the controller on (the unit tier's conftest turns it off)."""
    monkeypatch.setenv(settings.LANE_CONTROLLER_S.env, "1")
    spec = _lanes(moves=True)
    assert spec.table.workers[1].moves_to == ("short",)
    return spec


def test_static_is_lanes_without_the_controller(moving_lanes):
    static = static_spec(moving_lanes)
    assert static.name == STATIC and moving_lanes.name == "lanes"
    assert static.workers == moving_lanes.workers and static.lanes_toml == moving_lanes.lanes_toml
    assert static.workers_per_lane() == moving_lanes.workers_per_lane()
    assert static.frontend == moving_lanes.frontend
    assert moving_lanes.moves_workers and static.moves_workers  # the same lanes file...
    assert moving_lanes.runs_controller and not static.runs_controller  # ...one controller
    assert moving_lanes.to_dict()["controller"] and not static.to_dict()["controller"]


def test_lanes_runs_no_controller_when_it_is_off_or_nothing_moves(moving_lanes, monkeypatch):
    plain = _lanes(moves=False)
    assert not plain.moves_workers and not plain.runs_controller
    monkeypatch.setenv(settings.LANE_CONTROLLER_S.env, "0")
    assert not moving_lanes.runs_controller


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


def test_static_may_run_another_lanes_file_to_measure_one_mechanism_against_another():
    """`--static-lanes`: lane moves alone (`lanes`) against borrowing alone (`static`, the CPU
    file without the controller), on the same cores in one run."""
    from conftest import ROOT

    from tailguard.bench.run import _specs, build_workload
    from tailguard.lanes.table import cpu_lanes_path, load_lanes

    moves_only = ROOT / "benchmarks" / "lanes-cpu-moves-only.toml"
    cfg = BenchConfig(workload="mixed", topologies=("lanes", STATIC), lanes_file=moves_only,
                      static_lanes_file=cpu_lanes_path())
    table = load_lanes(moves_only)
    lanes = lanes_spec(table, moves_only.read_text(), cores=[0, 1])
    static = lanes_spec(load_lanes(cpu_lanes_path()), cpu_lanes_path().read_text(), cores=[0, 1])
    specs = _specs(cfg, build_workload(cfg, None, table), table, lanes, "demo-small", 4096,
                   kind="cpu", cores=[0, 1], engines=2, static_topo=static)
    assert list(specs) == ["lanes", STATIC] and specs[STATIC].controller is False
    lent = {w.name: (w.borrow.lanes, w.moves_to) for w in
            parse_lanes(tomllib.loads(specs[STATIC].lanes_toml)).workers}
    assert lent == {"short": (("long",), ()), "long": ((), ("short",))}  # borrows; never moves
    moved = {w.name: (w.borrow.lanes, w.moves_to) for w in
             parse_lanes(tomllib.loads(specs["lanes"].lanes_toml)).workers}
    assert moved == {"short": ((), ()), "long": ((), ("short",))}
    assert [w.pin for w in specs[STATIC].workers] == [w.pin for w in specs["lanes"].workers]
    # without it, static is the lanes topology's own file
    same = _specs(cfg, build_workload(cfg, None, table), table, lanes, "demo-small", 4096,
                  kind="cpu", cores=[0, 1], engines=2)
    assert same[STATIC].lanes_toml == lanes.lanes_toml
