"""tailguard plan with the lane controller: the simulator calls tailguard/lanes/rebalance.py's own
policy (tailguard/plan/sim.py, "Lanes that follow the load"), and `--compare-follow`'s rows."""

import pytest

from tailguard.lanes.rebalance import HOME, TARGET_MISSED, RebalancePolicy
from tailguard.lanes.table import Lane, default_lanes_path, load_lanes
from tailguard.plan import azure
from tailguard.plan.compare import FOLLOW, SHARED, STATIC, compare, lanes_layout, render, verdict
from tailguard.plan.sim import EngineGroup, Follow, Simulation, simulate
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad, Lengths

SHORT = Lane(name="short", max_cost=100, max_tokens=50, max_num_seqs=2, queue_ttl_s=60,
             max_wait_s=1.0)                                  # target 0.5 s
LONG = Lane(name="long", max_tokens=500, max_num_seqs=2, queue_ttl_s=600, target_wait_s=10.0,
            min_workers=0)
LANES = [SHORT, LONG]
CLASSES = [ClassLoad("short", 0.0, Lengths.fixed(1), Lengths.fixed(1)),
           ClassLoad("long", 0.0, Lengths.fixed(1), Lengths.fixed(1))]
MODEL = StepModel(a_s=0.01, decode_s=0.0, prefill_s=0.0)
GROUPS = [EngineGroup(("short",), 1, 2, name="short"),
          EngineGroup(("long",), 1, 2, moves_to=("short",), name="long")]
FOLLOW_FAST = Follow(policy=RebalancePolicy(min_dwell_s=1.0, home_after_s=5.0))

# 3 s of 40 short requests/s (two slots do ~9/s), then one long request at 30 s
FLOOD = [(i / 40, "short", 10, 20) for i in range(120)] + [(30.0, "long", 10, 100)]


def run(follow, arrivals=FLOOD, groups=GROUPS):
    sim = Simulation(CLASSES, LANES, groups, MODEL, follow=follow)
    sim.replay(arrivals)
    return sim, sim.run()


def test_the_idle_long_engine_goes_to_the_flooded_short_lane_and_home_again():
    sim, results = run(FOLLOW_FAST)
    (t1, there), (t2, back) = sim.moves
    assert (there.worker, there.from_, there.to, there.reason) == \
        ("long", ("long",), ("short",), TARGET_MISSED)
    assert (back.worker, back.to, back.reason) == ("long", ("long",), HOME)
    assert 0 < t1 < 3 < t2 < 30  # during the flood; home once it is over, before long arrives
    [_, long_engine] = sim.owners
    assert long_engine.lanes == ("long",) and not long_engine.draining
    assert len(sim.move_s) == 2 and all(s >= FOLLOW_FAST.notice_s for s in sim.move_s)
    assert results["short"].statuses == {"succeeded": 120}
    assert results["long"].statuses == {"succeeded": 1}
    # the second engine shortened the flood's tail
    _, static = run(None)
    assert results["short"].e2e["p99"] < static["short"].e2e["p99"]


def test_a_move_hands_back_what_its_drain_did_not_finish():
    # four long requests of 500 steps (5 s) fill both long engines; a flood then needs one
    arrivals = [(0.0, "long", 10, 500)] * 4 + [(1 + i / 40, "short", 10, 20) for i in range(200)]
    lanes = [SHORT, Lane(name="long", max_tokens=500, max_num_seqs=2, queue_ttl_s=600,
                         target_wait_s=1000.0, min_workers=0)]  # long can spare one, work or not
    groups = [GROUPS[0], EngineGroup(("long",), 2, 2, moves_to=("short",), name="long")]
    sim = Simulation(CLASSES, lanes, groups, MODEL, follow=FOLLOW_FAST)
    sim.replay(arrivals)
    results = sim.run()
    assert sim.moves[0][1].to == ("short",)
    assert results["long"].reclaimed == 2  # handed back after the 2 s drain, output kept
    assert results["long"].statuses == {"succeeded": 4}
    assert results["long"].output_tokens == 4 * 500  # none generated twice
    assert sim.move_s[0] == pytest.approx(FOLLOW_FAST.notice_s + FOLLOW_FAST.drain_s, abs=0.02)


def test_with_the_controller_off_moves_to_changes_nothing():
    plain = [EngineGroup(("short",), 1, 2), EngineGroup(("long",), 1, 2)]
    old = simulate(CLASSES, LANES, plain, MODEL, duration_s=0, arrivals=FLOOD)
    assert simulate(CLASSES, LANES, GROUPS, MODEL, duration_s=0, arrivals=FLOOD) == old
    # a controller with no engine it may move decides nothing and changes nothing
    sim, results = run(FOLLOW_FAST, groups=plain)
    assert results == old and sim.moves == []


def test_the_comparison_on_a_small_fleet_gives_its_three_rows():
    table = load_lanes(default_lanes_path())  # the GPU host's (a CPU host runs lanes-cpu.toml)
    assert [(g.name, g.count) for g in lanes_layout(table, 3)] == [("short", 1), ("long", 2)]
    arrivals = azure.arrivals(list(table), rate=8.0, duration_s=10.0)
    assert len(arrivals) == 80 and {a[1] for a in arrivals} <= {"short", "long"}
    rows = compare(arrivals, table, StepModel(a_s=0.008, decode_s=1e-4, prefill_s=1e-4,
                                              context_s=2.5e-7, overhead_s=0.02), gpus=2)
    assert [r.name for r in rows] == [STATIC, FOLLOW, SHARED]
    for r in rows:
        assert r.gpus == 2 and r.requests == 80 and r.output_tokens_per_s > 0
        assert r.short_p99_s is not None and r.goodput_rps > 0
    assert rows[0].moves == rows[2].moves == 0
    text = render({(2, 4.0): rows})
    assert FOLLOW in text and text.splitlines()[-1].startswith("Following the load")


def test_the_verdict_names_the_loads_where_following_gains_under_5_percent():
    def rows(static_p99, follow_p99, gpus):
        return [compare_row(STATIC, static_p99, gpus), compare_row(FOLLOW, follow_p99, gpus)]

    said = verdict({(8, 1.0): rows(10.0, 9.8, 8), (8, 3.0): rows(10.0, 5.0, 8),
                    (64, 1.0): rows(10.0, 5.0, 64), (64, 3.0): rows(10.0, 9.0, 64)})
    assert "at 8 GPUs at 3 and not at 1;" in said
    assert "at 64 GPUs at every load scanned (1, 3)" in said
    assert "at 8 GPUs at no load scanned (1)" in verdict({(8, 1.0): rows(10.0, 9.8, 8)})


def compare_row(name, p99, gpus):
    from tailguard.plan.compare import Row

    return Row(name, gpus, 100, p99, 1.0, 1.0, 10.0, 100.0, 0, 0, 0)


def test_the_command_prints_the_rows_and_the_verdict(tmp_path):
    from click.testing import CliRunner

    from tailguard.plan.command import plan

    model = tmp_path / "gpu.json"
    StepModel(a_s=0.008, decode_s=1e-4, prefill_s=1e-4, overhead_s=0.02).save(model)
    out = CliRunner().invoke(plan, ["--step-model", str(model), "--compare-follow", "2",
                                    "--per-gpu", "4", "--duration", "10"])
    assert out.exit_code == 0, out.output
    assert STATIC in out.output and SHARED in out.output and "Following the load" in out.output
