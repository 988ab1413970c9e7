"""tailguard plan's simulator, one rule at a time: the methods of `Simulation` on a fleet set up
by hand (the whole runs are in test_plan.py, test_plan_fleet.py, test_plan_frontend.py)."""

import dataclasses

import pytest

from tailguard.lanes.table import Lane, default_lanes_path, load_lanes
from tailguard.plan.sim import (
    FLEET,
    FRONTEND_WINDOW_S,
    MAX_FRONTEND_SHARE,
    EngineGroup,
    Simulation,
    simulate,
)
from tailguard.plan.stepmodel import StepModel, slowdown
from tailguard.plan.workload import ClassLoad, Lengths

C = ClassLoad("c", 0.0, Lengths.fixed(1), Lengths.fixed(1))
MODEL = StepModel(a_s=1.0, decode_s=0.0, prefill_s=0.0, max_batched_tokens=12)


def sim(slots: int = 1, ttl: float = 1e9, engines: int = 1, frontend: bool = False) -> Simulation:
    lane = Lane(name="only", max_tokens=100000, deadline_s=1e9, queue_ttl_s=ttl,
                max_model_len=1 << 20, max_num_seqs=slots)
    return Simulation([C], [lane], [EngineGroup(("only",), engines, slots, frontend=frontend)],
                      MODEL)


def test_a_request_waits_only_when_no_engine_of_its_lane_has_a_free_slot():
    s = sim(slots=1)
    s.arrive(0.0, C, 3, 5)
    s.arrive(0.1, C, 3, 5)
    [e] = s.engines
    assert len(e.reqs) == 1 and e.busy and s.queued("only") == 1


def test_pop_ends_the_heads_past_their_queue_ttl_and_returns_the_first_within_it():
    s = sim(slots=1, ttl=1.0)
    for t in (0.0, 0.1, 0.5):
        s.arrive(t, C, 3, 5)  # the first runs, the others queue
    r = s.pop("only", 1.3)  # waited 1.2 s and 0.8 s
    assert r is not None and r.arrival == 0.5
    [expired] = s.done
    assert (expired.status, expired.arrival, expired.end) == ("expired", 0.1, pytest.approx(1.1))
    assert s.pop("only", 1.3) is None and s.queued("only") == 0


def _two_lanes(slots: int = 4) -> Simulation:
    lanes = [Lane(name="short", max_tokens=100, max_cost=100, max_num_seqs=slots),
             Lane(name="long", max_tokens=1000, max_num_seqs=slots)]
    classes = [ClassLoad("short", 0.0, Lengths.fixed(1), Lengths.fixed(1)),
               ClassLoad("long", 0.0, Lengths.fixed(1), Lengths.fixed(1))]
    return Simulation(classes, lanes, [EngineGroup(("short", "long"), 1, slots)], MODEL)


def test_a_batch_decodes_every_prefilled_request_then_prompts_in_vllm_priority_order():
    s = _two_lanes()
    by = {c.name: c for c in s.classes}
    for t, cls, prompt in ((0.0, "short", 8), (0.1, "long", 200), (0.2, "short", 8)):
        s.arrive(t, by[cls], prompt, 5)
    [e] = s.engines
    first, long_, short = e.reqs
    first.prefilled = 8  # its prompt is done: it decodes
    prefill = s.batch(e, [first])
    # 12 tokens: one decoding, then 8 of the later short prompt (short first), 3 of the long one
    assert e.batch == [(first, 0), (short, 8), (long_, 3)] and prefill == 11


def test_the_front_ends_share_is_its_cpu_over_the_window_at_most_the_kernels_share():
    s = sim(frontend=True)
    s.charge(0.0, 0.5)
    s.charge(1.0, 0.5)
    assert s.frontend_share(1.5) == pytest.approx(1.0 / FRONTEND_WINDOW_S)
    assert s.frontend_share(FRONTEND_WINDOW_S + 0.5) == pytest.approx(0.5 / FRONTEND_WINDOW_S)
    s.charge(3.0, 100.0)
    assert s.frontend_share(3.0) == MAX_FRONTEND_SHARE
    no_front = sim()
    no_front.charge(0.0, 1.0)
    assert no_front.frontend_share(0.5) == 0.0


def test_only_the_engine_on_the_front_ends_cores_steps_longer_by_its_share():
    s = sim(engines=2, frontend=True)
    s.charge(0.0, FRONTEND_WINDOW_S / 2)  # half the core
    other, front = s.engines
    assert s.front is front
    assert s.step_s(front, 0.5, [], 0) == pytest.approx(2 * MODEL.a_s)
    assert s.step_s(other, 0.5, [], 0) == MODEL.a_s


def test_slowdown_is_the_median_ratio():
    assert slowdown([(1, 0.010, 0.015), (2, 0.010, 0.012), (4, 0.010, 0.020)]) == pytest.approx(0.5)
    assert slowdown([(1, 0.010, 0.009)]) == 0.0


def test_an_engine_stepping_slows_its_neighbours_steps():
    """neighbour_slowdown: the engines of one simulation share a host; a short request whose
    steps all start while the long engine steps takes that much longer, alone it does not."""
    lanes = list(load_lanes(default_lanes_path()))
    model = dataclasses.replace(MODEL, max_batched_tokens=2048, neighbour_slowdown=0.5)
    classes = [ClassLoad("short", 0.0, Lengths.fixed(3), Lengths.fixed(3)),
               ClassLoad("long", 0.0, Lengths.fixed(1500), Lengths.fixed(10))]
    groups = [EngineGroup(("short",), 1, 16), EngineGroup(("long", "batch"), 1, 8)]
    short_only = [(2.5, "short", 3, 3)]
    both = [(0.0, "long", 1500, 10), *short_only]
    alone = simulate(classes, lanes, groups, model, duration_s=10, arrivals=short_only)
    beside = simulate(classes, lanes, groups, model, duration_s=10, arrivals=both)
    assert alone["short"].e2e["max"] == pytest.approx(3.0)
    assert beside["short"].e2e["max"] == pytest.approx(4.5)


def test_the_backlog_is_the_queued_cost_tokens_averaged_over_the_run():
    s = sim(slots=1)
    s.replay([(0.0, "c", 3, 2), (0.0, "c", 3, 2)])  # one step each token: 2 s apiece
    s.run()
    # the second (cost 5) waits 2 s of the 4 s run
    assert s.backlog == 0 and s.now == pytest.approx(4.0)
    assert s.backlog_mean == pytest.approx(5 * 2.0 / 4.0)


def _fair_sim(fair):
    lane = Lane(name="only", max_tokens=100000, deadline_s=1e9, queue_ttl_s=1e9,
                max_model_len=1 << 20, max_num_seqs=1)
    classes = [ClassLoad(n, 0.0, Lengths.fixed(1), Lengths.fixed(1)) for n in ("flood", "quiet")]
    s = Simulation(classes, [lane], [EngineGroup(("only",), 1, 1)], MODEL, fair=fair)
    return s, {c.name: c for c in classes}


@pytest.mark.parametrize("fair, quiet_after", [(None, 10), ({}, 1)])
def test_by_key_a_quiet_keys_request_is_dispatched_next_not_behind_the_flood(fair, quiet_after):
    """The same queue (one slot, 10 of the flood's waiting, then one of the quiet key's): in
    arrival order it goes last; by key (`tailguard plan --by-key`) it is lifted level with the
    flood and goes out after at most one more of it."""
    s, c = _fair_sim(fair)
    for i in range(11):
        s.arrive(0.01 * i, c["flood"], 3, 5)  # the first runs, 10 wait
    s.arrive(0.5, c["quiet"], 3, 5)
    order = [s.pop("only", 1.0).cls for _ in range(11)]
    assert order.index("quiet") <= quiet_after and order.count("flood") == 10
    if fair is None:
        assert order[-1] == "quiet"


def test_by_key_weights_share_the_dispatches_two_to_one():
    s, c = _fair_sim({"flood": 2.0})
    s.arrive(0.0, c["flood"], 3, 5)  # runs
    for i in range(30):
        s.arrive(0.01 * i, c["flood"], 3, 5)
        s.arrive(0.01 * i, c["quiet"], 3, 5)
    order = [s.pop("only", 1.0).cls for _ in range(30)]
    assert abs(order.count("flood") - 2 * order.count("quiet")) <= 2, order


@pytest.mark.parametrize("bound, starts", [(0, [0.0, 0.0, 0.0]), (10, [0.0, 1.0, 2.0])])
def test_an_engine_at_its_prefill_bound_takes_the_next_job_once_a_first_token_is_out(bound, starts):
    lane = Lane(name="only", max_tokens=100, deadline_s=1e9, queue_ttl_s=1e9,
                max_model_len=1 << 20, max_num_seqs=4)
    s = Simulation([C], [lane], [EngineGroup(("only",), 1, 4, dispatch=FLEET,
                                             max_prefill_tokens=bound)], MODEL)
    s.replay([(0.0, "c", 10, 2)] * 3)  # three 10-token prompts at once; 12 tokens per step
    s.run()
    assert sorted(r.start for r in s.done) == starts


def test_a_long_prompt_prefilling_holds_back_the_next_long_one_not_a_short_one():
    lanes = [Lane(name="short", max_tokens=100, max_cost=100, max_num_seqs=4),
             Lane(name="long", max_tokens=1000, max_num_seqs=4)]
    classes = [ClassLoad("short", 0.0, Lengths.fixed(1), Lengths.fixed(1)),
               ClassLoad("long", 0.0, Lengths.fixed(1), Lengths.fixed(1))]
    s = Simulation(classes, lanes, [EngineGroup(("short", "long"), 1, 4, dispatch=FLEET,
                                                max_prefill_tokens=10)], MODEL)
    s.replay([(0.0, "long", 150, 2), (0.0, "long", 150, 2), (0.0, "short", 5, 2)])
    s.run()
    starts = sorted((r.start, r.lane) for r in s.done)
    assert starts[:2] == [(0.0, "long"), (0.0, "short")]  # the short one beside the prefill
    assert starts[2][1] == "long" and starts[2][0] > 0.0  # the second long after a first token
