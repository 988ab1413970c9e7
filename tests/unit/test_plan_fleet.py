"""tailguard plan's fleets: tailguard's central queue per lane with per-engine limits, a router's
replicas (tailguard/plan/sim.py, "Dispatch"), `--compare-fleet`'s rows and `--keda`'s sizing."""

import pytest
from click.testing import CliRunner

from tailguard.lanes import dispatch
from tailguard.lanes.table import Lane, default_lanes_path, load_lanes
from tailguard.plan import azure, keda, sim
from tailguard.plan.command import plan
from tailguard.plan.compare import (
    FLEET_SETUP,
    ROUTER_SETUP,
    SETUPS,
    SHARED,
    STATIC,
    Point,
    Row,
    alone_s,
    compare,
    limit_sweep,
    render,
    setup,
    static_layout,
    verdict,
)
from tailguard.plan.sim import FLEET, ROUTER, EngineGroup, Simulation, simulate
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad, Lengths

#: one second a step whatever it holds: times below are counted in steps
UNIT = StepModel(a_s=1.0, decode_s=0.0, prefill_s=0.0, max_batched_tokens=1 << 20)
GPU = StepModel(a_s=0.008, decode_s=1e-4, prefill_s=1e-4, context_s=2.5e-7, overhead_s=0.02)
CLASSES = [ClassLoad(n, 0.0, Lengths.fixed(1), Lengths.fixed(1))
           for n in ("short", "long", "batch")]
TABLE = load_lanes(default_lanes_path())  # the GPU host's lanes file


def lanes(long_limit: int | None = None, slots: int = 4) -> list[Lane]:
    return [Lane(name="short", max_cost=100, max_tokens=100, max_num_seqs=slots),
            Lane(name="long", max_tokens=1000, max_num_seqs=slots, max_running=long_limit),
            Lane(name="batch", priority="batch", max_tokens=1000, max_num_seqs=slots)]


def fleet(engines: int = 1, slots: int = 4, long_limit: int | None = None,
          how: str = FLEET) -> Simulation:
    ls = lanes(long_limit, slots)
    return Simulation([*CLASSES[:2], ClassLoad("batch", 0.0, Lengths.fixed(1), Lengths.fixed(1),
                                               priority="batch")],
                      ls, [EngineGroup(tuple(l.name for l in ls), engines, slots, dispatch=how)],
                      UNIT)


def test_the_simulator_runs_the_workers_own_dispatch_rule():
    assert sim.next_lane is dispatch.next_lane


def test_a_lane_at_its_per_engine_limit_waits_and_a_short_request_still_finds_a_slot():
    s = fleet(long_limit=2)
    by = {c.name: c for c in s.classes}
    for _ in range(4):
        s.arrive(0.0, by["long"], 200, 50)
    [e] = s.engines
    assert e.running == {"long": 2} and s.queued("long") == 2  # two slots left free
    s.arrive(0.1, by["short"], 3, 5)
    assert e.running == {"long": 2, "short": 1} and s.queued("short") == 0


def test_an_engine_with_short_requests_at_longs_max_ahead_leaves_long_to_another():
    ls = [lanes(slots=4)[0], Lane(name="long", max_tokens=1000, max_num_seqs=4, max_ahead=2)]
    s = Simulation(CLASSES[:2], ls, [EngineGroup(("short", "long"), 2, 4, dispatch=FLEET)], UNIT)
    a, b = s.engines
    for _ in range(2):  # two short requests decoding on engine a
        s.take(a, sim._Req("short", "short", 0.0, 3, 5), 0.0)
    b.turn = a.turn + 1  # a has waited longest: Redis would answer it first
    s.arrive(0.1, s.classes[1], 200, 50)
    assert a.running == {"short": 2} and b.running == {"long": 1}


def test_batch_runs_only_while_no_interactive_request_waits():
    s = fleet(slots=2, long_limit=1)
    by = {c.name: c for c in s.classes}
    s.arrive(0.0, by["long"], 200, 50)
    s.arrive(0.0, by["long"], 200, 50)  # long at its limit: waits
    s.arrive(0.0, by["batch"], 200, 50)
    [e] = s.engines
    assert e.running == {"long": 1} and s.queued("batch") == 1  # a free slot, and batch waits
    s.pop("long", 0.0)  # the waiting long request leaves (expired, say)
    s.refill(e, 0.0)
    assert e.running == {"long": 1, "batch": 1}


def test_a_central_queue_never_leaves_a_short_request_behind_one_engines_long_work():
    """Two engines of one slot: a 50-step and a 10-step long request, then two short ones. A
    router commits each short request to a replica on arrival, so one waits out the 50 steps;
    the fleet's short requests wait for the first free slot anywhere."""
    arrivals = [(0.0, "long", 200, 50), (0.0, "long", 200, 10),
                (0.5, "short", 3, 2), (0.6, "short", 3, 2)]
    out = {}
    for how in (FLEET, ROUTER):
        groups = [EngineGroup(("short", "long"), 2, 1, dispatch=how)]
        out[how] = simulate(CLASSES[:2], lanes(slots=1)[:2], groups, UNIT, duration_s=1,
                            arrivals=arrivals)["short"].e2e["max"]
    assert out[FLEET] < 20 < 45 < out[ROUTER]


def test_a_router_commits_to_the_replica_with_fewest_running_and_waiting():
    s = fleet(engines=2, slots=1, how=ROUTER)
    by = {c.name: c for c in s.classes}
    for _ in range(3):
        s.arrive(0.0, by["long"], 200, 50)
    a, b = s.engines
    assert sorted([len(a.reqs) + len(a.waiting), len(b.reqs) + len(b.waiting)]) == [1, 2]
    s.arrive(0.0, by["long"], 200, 50)
    assert len(a.reqs) + len(a.waiting) == len(b.reqs) + len(b.waiting) == 2


def test_a_replica_takes_its_waiting_requests_in_vllm_priority_order():
    s = fleet(slots=1, how=ROUTER)
    by = {c.name: c for c in s.classes}
    s.arrive(0.0, by["long"], 200, 2)  # runs
    s.arrive(0.1, by["long"], 200, 2)  # waits
    s.arrive(0.2, by["short"], 3, 2)  # waits, ahead of the older long one
    s.run()
    _, later_long, short = sorted(s.done, key=lambda r: r.arrival)
    assert short.start < later_long.start


def test_engines_of_one_lane_are_fed_one_way():
    with pytest.raises(ValueError, match="one dispatch"):
        Simulation(CLASSES[:2], lanes()[:2], [EngineGroup(("short", "long"), 1, 4),
                                              EngineGroup(("short", "long"), 1, 4,
                                                          dispatch=ROUTER)], UNIT)


def test_alone_is_what_the_simulator_gives_a_request_alone():
    model = StepModel(a_s=0.01, decode_s=1e-3, prefill_s=1e-4, context_s=1e-6,
                      max_batched_tokens=512, overhead_s=0.02)
    single = simulate(CLASSES[:1], lanes()[:1], [EngineGroup(("short",), 1, 4)], model,
                      duration_s=1, arrivals=[(0.0, "short", 90, 7)])
    assert alone_s(model, 90, 7) == pytest.approx(single["short"].e2e["max"])
    assert alone_s(model, 1200, 1) == pytest.approx(
        3 * model.a_s + 1200 * model.prefill_s + model.overhead_s)  # 512 + 512 + 176


def test_the_comparison_on_a_small_fleet_gives_its_four_setups():
    arrivals = azure.arrivals(list(TABLE), rate=8.0, duration_s=10.0)
    unloaded, rows = compare(arrivals, TABLE, GPU, gpus=2, sweep=[{}, {"long": 2}])
    assert [r.name for r in rows] == [FLEET_SETUP, "fleet long<=2", SHARED, ROUTER_SETUP, STATIC]
    assert unloaded is not None and unloaded > 0
    for r in rows:
        assert r.gpus == 2 and r.requests == 80 and r.output_tokens_per_s > 0
        assert r.short_p99_s is not None and r.goodput_rps > 0
        assert r.queues == (r.short_p99_s > 2 * unloaded)
    text = render([Point(2, 4.0, unloaded, rows)])
    assert all(name in text for name in SETUPS) and "unloaded short P99" in text


def test_static_lanes_split_the_gpus_by_cost_when_the_file_has_one_worker_entry():
    one_entry = load_lanes(default_lanes_path())
    one_entry = type(one_entry)(lanes=one_entry.lanes, workers=one_entry.workers[1:2])
    arrivals = [(0.0, "short", 100, 100), (0.0, "long", 2000, 1000), (0.0, "long", 2000, 1000)]
    groups = static_layout(one_entry, 10, arrivals)
    assert [(g.lanes, g.count) for g in groups] == [(("short",), 1), (("long",), 9)]
    assert sum(g.count for g in static_layout(one_entry, 2, arrivals)) == 2
    # the shipped file's two entries: short on one GPU, long on the rest
    assert [(g.name, g.count) for g in static_layout(TABLE, 3, arrivals)] == [("short", 1),
                                                                             ("long", 2)]


def row(name: str, goodput: float, p99: float, queues: bool = False) -> Row:
    return Row(name, 8, 100, goodput, p99, 0.5, 1.0, 100.0, 0, queues)


@pytest.mark.parametrize("fleet_row, router_row, missed", [
    (row(FLEET_SETUP, 10.0, 3.0), row(ROUTER_SETUP, 9.0, 4.0), []),
    (row(FLEET_SETUP, 8.0, 3.0), row(ROUTER_SETUP, 9.0, 4.0), ["goodput"]),
    (row(FLEET_SETUP, 10.0, 5.0), row(ROUTER_SETUP, 9.0, 4.0), ["short P99"]),
    # where the router queues, half its P99 is the bound
    (row(FLEET_SETUP, 10.0, 3.0), row(ROUTER_SETUP, 9.0, 4.0, queues=True), ["short P99"]),
    (row(FLEET_SETUP, 10.0, 2.0), row(ROUTER_SETUP, 9.0, 4.0, queues=True), []),
])
def test_the_check_reads_the_issues_lines(fleet_row, router_row, missed):
    point = Point(8, 2.0, 1.0, [fleet_row, row(SHARED, 9.5, 5.0), router_row])
    got = point.check(fleet_row)
    assert [m.split(" ")[0] + (" P99" if m.startswith("short") else "") for m in got] == missed
    said = verdict([point])
    assert said.startswith(f"{FLEET_SETUP}: goodput >=") if not missed else "misses" in said


def test_a_limit_sweep_is_every_combination():
    assert limit_sweep({}) == [{}]
    assert limit_sweep({"long": [2, 4], "short": [8]}) == [{"long": 2, "short": 8},
                                                           {"long": 4, "short": 8}]


def test_the_command_compares_the_fleets(tmp_path):
    model = tmp_path / "gpu.json"
    GPU.save(model)
    out = CliRunner().invoke(plan, ["--step-model", str(model), "--compare-fleet", "2",
                                    "--per-gpu", "4", "--duration", "10",
                                    "--max-running", "long=2,4"])
    assert out.exit_code == 0, out.output
    assert "fleet long<=2" in out.output and "fleet long<=4" in out.output
    assert ROUTER_SETUP in out.output and STATIC in out.output
    bad = CliRunner().invoke(plan, ["--step-model", str(model), "--compare-fleet", "2",
                                    "--max-running", "nosuch=2"])
    assert bad.exit_code == 2 and "nosuch" in bad.output


def test_the_command_sweeps_max_ahead_with_each_limit(tmp_path):
    model = tmp_path / "gpu.json"
    GPU.save(model)
    out = CliRunner().invoke(plan, ["--step-model", str(model), "--compare-fleet", "2",
                                    "--per-gpu", "4", "--duration", "10",
                                    "--max-running", "long=4", "--max-ahead", "long=1,3"])
    assert out.exit_code == 0, out.output
    assert "fleet long<=4 long:ahead<1" in out.output and "fleet long<=4 long:ahead<3" in out.output
    bad = CliRunner().invoke(plan, ["--step-model", str(model), "--compare-fleet", "2",
                                    "--max-ahead", "long=0"])
    assert bad.exit_code == 2 and "--max-ahead" in bad.output


def test_a_fleet_rows_max_ahead_reaches_its_engines():
    arrivals = azure.arrivals(list(TABLE), rate=8.0, duration_s=10.0)
    lanes, _ = setup(FLEET_SETUP, TABLE, 2, arrivals, ahead={"long": 1})
    assert {l.name: l.max_ahead for l in lanes}["long"] == 1
    with pytest.raises(ValueError, match="--max-ahead"):
        setup(FLEET_SETUP, TABLE, 2, arrivals, ahead={"nosuch": 1})


# -- --keda


def test_engines_needed_is_the_fewest_that_meet_the_target():
    calls = []

    def simulate_n(n: int) -> Row:
        calls.append(n)
        return row(FLEET_SETUP, 1.0, 10.0 / n)  # P99 10 s / engines

    n, rows = keda.engines_needed(simulate_n, target_s=2.0)
    assert n == 5 and set(calls) == set(rows) and len(calls) == len(set(calls))
    assert keda.engines_needed(simulate_n, target_s=0.001, max_engines=8)[0] is None


@pytest.mark.parametrize("loads, expected", [
    # with N engines 100 and 300 tokens per worker; with one fewer 900 and 500: 300 holds both
    ([keda.Load(8, 2, 100.0, 900.0, 1.0), keda.Load(32, 6, 300.0, 500.0, 1.0)], (300.0, 2)),
    # no one value holds both: the least of those that hold the most
    ([keda.Load(8, 2, 100.0, 300.0, 1.0), keda.Load(32, 6, 400.0, 900.0, 1.0)], (100.0, 1)),
    # a load where one fewer engine queued no more (blind) is left out
    ([keda.Load(8, 2, 100.0, 900.0, 1.0), keda.Load(32, 6, 600.0, 500.0, 1.0)], (100.0, 1)),
    ([keda.Load(8, 1, 0.0, None, 1.0)], (None, 0)),
])
def test_the_threshold_holds_n_engines_and_adds_one_where_n_minus_one_miss(loads, expected):
    assert keda.threshold(loads) == expected
    t, _ = expected
    if t is not None:
        assert all(keda.holds(l, t) == (l.fits <= t < l.short) for l in loads)


def test_a_load_is_blind_where_one_fewer_engine_queues_no_more():
    assert keda.Load(8, 3, 0.0, 0.0, 1.0).blind and not keda.Load(8, 3, 0.0, 5.0, 1.0).blind
    assert not keda.Load(8, 1, 0.0, None, 1.0).blind


@pytest.mark.parametrize("p99, long_ttft, failed, ok", [
    (3.0, 5.0, 0, True), (5.0, 5.0, 0, False), (3.0, 11.0, 0, False), (3.0, 5.0, 1, False),
    (3.0, None, 0, True)])
def test_a_fleet_meets_the_targets_with_short_p99_long_ttft_and_nothing_failed(
        p99, long_ttft, failed, ok):
    r = Row(FLEET_SETUP, 8, 100, 1.0, p99, 0.5, long_ttft, 100.0, failed, False)
    assert keda.meets(r, target_s=4.0) is ok


def test_the_query_sums_the_interactive_lanes_once_per_lane():
    q = keda.query(TABLE)
    assert q == 'sum(max by (lane) (tailguard_lane_backlog_tokens{lane=~"short|long"}))'


def test_the_command_prints_engines_per_load_and_a_threshold(tmp_path):
    model = tmp_path / "gpu.json"
    GPU.save(model)
    out = CliRunner().invoke(plan, ["--step-model", str(model), "--keda", "4,16",
                                    "--duration", "10", "--target", "short:4"])
    assert out.exit_code == 0, out.output
    assert "minReplicaCount" in out.output and keda.SERIES in out.output
    js = CliRunner().invoke(plan, ["--step-model", str(model), "--keda", "4,16",
                                   "--duration", "10", "--json"])
    import json

    data = json.loads(js.output)
    engines = [l["engines"] for l in data["loads"]]
    assert engines == sorted(engines) and data["min_replicas"] == engines[0]
    assert data["max_replicas"] == engines[-1]
