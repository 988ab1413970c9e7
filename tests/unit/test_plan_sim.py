"""tailguard plan's simulator, one rule at a time: the methods of `Simulation` on a fleet set up
by hand (the whole runs are in test_plan.py, test_plan_borrowing.py, test_plan_frontend.py)."""

import pytest

from tailguard.lanes.table import Lane
from tailguard.plan.sim import FRONTEND_WINDOW_S, MAX_FRONTEND_SHARE, EngineGroup, Simulation
from tailguard.plan.stepmodel import StepModel
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
    [e] = s.owners
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


def test_a_batch_decodes_every_prefilled_request_then_own_prompts_first_within_the_budget():
    s = sim(slots=4)
    for t, prompt in ((0.0, 8), (0.1, 8), (0.2, 8)):
        s.arrive(t, C, prompt, 5)
    [e] = s.owners
    first, borrowed, own = e.reqs
    first.prefilled = 8  # its prompt is done: it decodes
    borrowed.borrowed = True
    prefill = s.batch(e, [first])
    # 12 tokens: one decoding, then 8 of the own prompt, then 3 of the borrowed one's
    assert e.batch == [(first, 0), (own, 8), (borrowed, 3)] and prefill == 11


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
    other, front = s.owners
    assert s.front is front
    assert s.step_s(front, 0.5, [], 0) == pytest.approx(2 * MODEL.a_s)
    assert s.step_s(other, 0.5, [], 0) == MODEL.a_s


def test_a_reclaimed_request_keeps_its_output_and_prefills_it_again():
    s = sim(slots=1)
    s.arrive(0.0, C, 3, 5)
    [e] = s.owners
    [r] = e.reqs
    r.prefilled, r.out = 3, 2
    s.give_back(r, 2.0)
    assert (r.reclaimed, r.used_s, r.to_prefill, r.prefilled) == (1, 2.0, 5, 0)
    assert r.queued_at == 2.0 and r.where is e and r.since == 2.0  # the free slot takes it again


def test_a_suspended_step_resumes_with_what_it_had_left_and_its_old_end_is_void():
    s = sim()
    s.arrive(0.0, C, 3, 5)
    [e] = s.owners
    old = e.version
    s.suspend(e, 0.25)
    assert e.suspended and e.left_s == pytest.approx(MODEL.a_s - 0.25)
    s.step_ended(1.0, e, old)  # the end scheduled before the suspension: ignored
    assert e.reqs[0].out == 0
    s.resume(e, 5.0)
    assert not e.suspended and e.end == pytest.approx(5.75)
    s.step_ended(e.end, e, e.version)
    assert e.reqs[0].out == 1


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
