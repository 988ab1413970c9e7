"""tailguard plan's model of work-conserving lanes: borrowing, the idle-priority engine, reclaim."""

import dataclasses

import pytest

from tailguard.lanes.borrowing import BorrowPolicy
from tailguard.lanes.table import default_lanes_path, load_lanes
from tailguard.plan.search import SIM_ENGINES, Targets, evaluate, least_engines, topology
from tailguard.plan.sim import NO_BORROWING, EngineGroup, simulate
from tailguard.plan.stepmodel import StepModel, slowdown
from tailguard.plan.workload import ClassLoad, Lengths, parse_class

TABLE = load_lanes(default_lanes_path())
LANES = list(TABLE)
CPU = StepModel(a_s=0.004, decode_s=0.0003, prefill_s=0.00025, context_s=1e-6)
#: one second a step whatever it holds: times below are counted in steps
UNIT = StepModel(a_s=1.0, decode_s=0.0, prefill_s=0.0)
SHORT = ClassLoad("short", 0.0, Lengths.fixed(3), Lengths.fixed(3))
LONG = ClassLoad("long", 0.0, Lengths.fixed(1500), Lengths.fixed(10))  # cost > 1024: long lane


def lend(engine: str, headroom: int = 2, max_borrowed: int = 4) -> BorrowPolicy:
    return BorrowPolicy(("long",), headroom=headroom, max_borrowed=max_borrowed, engine=engine)


def groups(borrow: BorrowPolicy | None = None, short_slots: int = 16,
           long_slots: int = 8) -> list[EngineGroup]:
    short = EngineGroup(("short",), 1, short_slots)
    return [dataclasses.replace(short, borrow=borrow) if borrow else short,
            EngineGroup(("long", "batch"), 1, long_slots)]


def run(gs, model=CPU, **kw):
    classes = kw.pop("classes", [parse_class("short:2:3:64"), parse_class("long:0.5:2000:512")])
    return {k: v.to_dict() for k, v in simulate(classes, LANES, gs, model, duration_s=kw.pop(
        "duration_s", 120), **kw).items()}


@pytest.mark.parametrize("engine", ["own", "idle"])
def test_a_borrower_that_may_take_nothing_changes_nothing(engine):
    """B = 0 (or R as large as the engine): the results of the simulator without borrowing."""
    model = dataclasses.replace(CPU, borrow_slowdown=0.5)
    plain = run(groups(), model)
    assert run(groups(lend(engine, max_borrowed=0)), model) == plain
    assert run(groups(lend(engine, headroom=16)), model) == plain


@pytest.mark.parametrize("engine", ["own", "idle"])
def test_an_idle_short_lane_serves_long_jobs(engine):
    """No short traffic, more long work than the long engine does: the short engine takes its
    share of the long lane's queue and long output rises."""
    classes = [parse_class("long:1:2000:512")]
    plain = run(groups(), classes=classes)["long"]
    lent = run(groups(lend(engine)), classes=classes)["long"]
    assert plain["borrowed"] == 0 and lent["borrowed"] > 0
    assert lent["tokens_per_s"] > plain["tokens_per_s"] * 1.2
    assert lent["statuses"] == {"succeeded": lent["n"]}


def test_the_idle_engine_runs_only_while_the_own_engine_has_nothing():
    """Preemptive priority: a short request arriving mid-step suspends the idle engine's step,
    which resumes where it stopped once the short one is done; without the measured slowdown
    the short request is as fast as with no borrowing at all."""
    arrivals = [(0.0, "long", 1500, 10), (0.0, "long", 1500, 10), (2.5, "short", 3, 3)]
    gs = groups(lend("idle"), long_slots=1)  # the second long request waits: it is borrowed
    r = simulate([SHORT, LONG], LANES, gs, UNIT, duration_s=10, arrivals=arrivals)
    assert r["short"].e2e["max"] == pytest.approx(3.0)  # 3 steps, none shared with it
    assert r["long"].borrowed == 1
    assert r["long"].e2e["max"] == pytest.approx(13.0)  # its 10 steps + the 3 it yielded
    slow = simulate([SHORT, LONG], LANES, gs, dataclasses.replace(UNIT, borrow_slowdown=0.5),
                    duration_s=10, arrivals=arrivals)
    assert slow["short"].e2e["max"] == pytest.approx(4.5)
    assert slow["long"].e2e["max"] == pytest.approx(14.5)


def test_short_results_with_an_idle_borrower_are_those_without_borrowing_but_the_slowdown():
    assert run(groups(lend("idle")))["short"] == run(groups())["short"]
    slowed = dataclasses.replace(CPU, borrow_slowdown=0.5)
    assert (run(groups(lend("idle")), slowed)["short"]["e2e"]["p99"]
            > run(groups(), slowed)["short"]["e2e"]["p99"])


def test_borrowed_jobs_in_the_own_engine_slow_its_steps():
    """borrow_engine = own (a GPU's): long contexts join the short requests' batch."""
    assert (run(groups(lend("own")))["short"]["e2e"]["p99"]
            > run(groups())["short"]["e2e"]["p99"] * 1.1)


@pytest.mark.parametrize("engine", ["own", "idle"])
def test_own_work_with_free_slots_below_r_reclaims_the_youngest(engine):
    """4 slots, R = 1, B = 2: two long jobs borrowed at t = 0, two short ones at t = 2.5 leave
    no slot free: one borrowed job goes back to the long queue with its output so far, and
    every long job still ends with exactly its tokens (none lost, none generated twice)."""
    arrivals = [(0.0, "long", 1500, 10)] * 3 + [(2.5, "short", 3, 3)] * 2
    r = simulate([SHORT, LONG], LANES,
                 groups(lend(engine, headroom=1, max_borrowed=2), short_slots=4, long_slots=1),
                 UNIT, duration_s=10, arrivals=arrivals)
    assert r["long"].reclaimed == 1
    assert r["long"].statuses == {"succeeded": 3} and r["long"].output_tokens == 30
    assert r["short"].statuses == {"succeeded": 2}


def test_no_reclaim_while_r_slots_stay_free():
    arrivals = [(0.0, "long", 1500, 10)] * 3 + [(2.5, "short", 3, 3)]
    r = simulate([SHORT, LONG], LANES,
                 groups(lend("idle", headroom=1, max_borrowed=2), short_slots=4, long_slots=1),
                 UNIT, duration_s=10, arrivals=arrivals)
    assert r["long"].reclaimed == 0 and r["long"].borrowed == 2


def test_topology_borrows_as_the_workers_would_on_the_device():
    _, gs = topology(TABLE, "lanes", borrow_on="cpu")
    short = next(g for g in gs if g.lanes == ("short",))
    assert short.borrow.lanes == ("long",) and short.borrow.engine == "idle"
    # on a GPU "auto" borrows nothing: the short engine keeps its device to itself
    assert all(not g.borrow.lanes for g in topology(TABLE, "lanes", borrow_on="cuda")[1])
    assert all(not g.borrow.lanes for g in topology(TABLE, "lanes")[1])
    assert all(not g.borrow.lanes for d in ("cpu", "cuda")
               for g in topology(TABLE, "shared", borrow_on=d)[1])


def test_an_unresolved_borrow_engine_is_refused():
    with pytest.raises(ValueError, match="engine_for"):
        EngineGroup(("short",), 1, 16, borrow=BorrowPolicy(("long",)))


def test_slowdown_is_the_median_ratio():
    assert slowdown([(1, 0.010, 0.015), (2, 0.010, 0.012), (4, 0.010, 0.020)]) == pytest.approx(0.5)
    assert slowdown([(1, 0.010, 0.009)]) == 0.0


def test_an_engine_stepping_slows_its_neighbours_steps():
    """neighbour_slowdown: the engines of one simulation share a host; a short request whose
    steps all start while the long engine steps takes that much longer, alone it does not."""
    model = dataclasses.replace(UNIT, neighbour_slowdown=0.5)
    short_only = [(2.5, "short", 3, 3)]
    both = [(0.0, "long", 1500, 10), *short_only]
    alone = simulate([SHORT, LONG], LANES, groups(), model, duration_s=10, arrivals=short_only)
    beside = simulate([SHORT, LONG], LANES, groups(), model, duration_s=10, arrivals=both)
    assert alone["short"].e2e["max"] == pytest.approx(3.0)
    assert beside["short"].e2e["max"] == pytest.approx(4.5)


def test_the_search_sizes_groups_without_borrowing_and_a_split_is_simulated_with_it():
    classes = [parse_class("short:2:3:64"), parse_class("long:1:2000:512")]
    _, gs = topology(TABLE, "lanes", borrow_on="cpu")
    targets = Targets({"short": 1.0}, max_queue_s=1e9)
    assert (least_engines(classes, LANES, gs[0], CPU, targets, duration_s=60)
            == least_engines(classes, LANES, dataclasses.replace(gs[0], borrow=NO_BORROWING), CPU,
                             targets, duration_s=60))
    split = evaluate(classes, LANES, gs, CPU, targets, duration_s=60)
    assert split.results["long"].borrowed > 0
    with pytest.raises(ValueError, match="at most"):
        evaluate(classes, LANES, [dataclasses.replace(g, count=SIM_ENGINES) for g in gs], CPU,
                 targets, duration_s=60)
