"""The lane controller's policy (tailguard/lanes/rebalance.py), table-driven: who moves, when,
and when nothing may."""

import math

import pytest

from tailguard.lanes.admission import AdmissionPolicy, LaneLoad
from tailguard.lanes.rebalance import (
    HOME,
    NO_WORKER,
    TARGET_MISSED,
    FleetView,
    QuietClock,
    RebalancePolicy,
    WorkerView,
)
from tailguard.lanes.table import Lane

SHORT = Lane("short", max_tokens=64, default_max_tokens=16, max_num_seqs=4, queue_ttl_s=60,
             max_wait_s=1.0, dedicated=True)                 # target: half the promise, 0.5 s
LONG = Lane("long", max_tokens=512, default_max_tokens=100, max_num_seqs=4, queue_ttl_s=600,
            target_wait_s=10.0, min_workers=0)
BATCH = Lane("batch", max_tokens=512, priority="batch", max_num_seqs=4, queue_ttl_s=3600,
             min_workers=0)
LANES = {l.name: l for l in (SHORT, LONG, BATCH)}
POLICY = RebalancePolicy(admission=AdmissionPolicy(prior_tokens_per_s=20.0), min_dwell_s=10.0)

#: the shipped layout: a short worker that may go long, a long one (long + batch) that may go short
SHORT_W = ((("short",), ("long",)))
LONG_W = ((("long", "batch"), ("short",)))


def load(live=1, queued=0, running=0, backlog=None, standby=0, cost=100):
    return LaneLoad(backlog_tokens=queued * cost if backlog is None else backlog,
                    queued_jobs=queued, running_jobs=running, served_tokens=0, window_s=60.0,
                    live_workers=live, standby_workers=standby)


def worker(name, assignments, serving=None, told=None, told_at=None, running=None):
    return WorkerView(name, assignments, serving or assignments[0], told, told_at, running or {})


def fleet(workers, now=100.0, last_at=None, last_s=None, quiet_for=None, **loads):
    """The figures of one tick; `quiet_for`: how long each worker away from home has been
    quiet (QuietClock's stamp), by default long enough for rule 5."""
    figures = {"short": load(), "long": load(), "batch": load()}
    figures.update(loads)
    quiet_for = POLICY.home_after_s if quiet_for is None else quiet_for
    return FleetView(LANES, figures, tuple(workers), now, last_at, last_s,
                     quiet_since={w.name: now - quiet_for for w in workers})


QUIET = [worker("short", SHORT_W), worker("long", LONG_W)]
FLOOD = load(live=1, queued=20, running=4, cost=60)   # short: ~15 s of work on 1 worker


def test_a_quiet_fleet_stays_as_its_entries_say():
    assert POLICY.decide(fleet(QUIET)) is None


def test_a_flooded_short_lane_takes_the_idle_long_worker():
    move = POLICY.decide(fleet(QUIET, short=FLOOD))
    assert (move.worker, move.from_, move.to, move.reason) == \
        ("long", ("long", "batch"), ("short",), TARGET_MISSED)
    assert "predicted wait" in move.detail and "target 0.5" in move.detail


@pytest.mark.parametrize("long_load, running, why", [
    (load(live=1, queued=3, running=4), {"long": 4}, "long has work queued, no other worker"),
    (load(live=1, queued=0, running=2), {"long": 2}, "its long jobs would go back to nobody"),
])
def test_no_donor_whose_own_lane_would_miss_without_it(long_load, running, why):
    workers = [worker("short", SHORT_W), worker("long", LONG_W, running=running)]
    assert POLICY.decide(fleet(workers, short=FLOOD, long=long_load)) is None, why


def test_a_batch_backlog_never_holds_a_worker_back_from_an_interactive_lane():
    move = POLICY.decide(fleet(QUIET, short=FLOOD, batch=load(live=1, queued=50)))
    assert move is not None and move.worker == "long"


def test_min_workers_is_kept():
    lanes = {**LANES, "long": Lane("long", max_tokens=512, max_num_seqs=4, queue_ttl_s=600,
                                   target_wait_s=10.0, min_workers=1)}
    view = fleet(QUIET, short=FLOOD)
    assert POLICY.decide(FleetView(lanes, view.loads, view.workers, view.now)) is None


def test_of_two_donors_the_one_with_fewer_running_jobs_goes():
    workers = [worker("short", SHORT_W), worker("long", LONG_W, running={"long": 2}),
               worker("long-2", LONG_W, running={"long": 1})]
    move = POLICY.decide(fleet(workers, short=FLOOD, long=load(live=2, running=3)))
    assert move.worker == "long-2"


def test_a_worker_whose_entry_does_not_allow_the_lane_is_never_moved():
    workers = [worker("short", ((("short",),))), worker("long", ((("long", "batch"),)))]
    assert POLICY.decide(fleet(workers, short=FLOOD)) is None


def test_one_move_in_flight_at_a_time_until_it_times_out():
    moving = [worker("short", SHORT_W), worker("long", LONG_W, told=("short",), told_at=95.0)]
    assert POLICY.decide(fleet(moving, now=100.0, long=load(live=1, queued=5))) is None
    stuck = POLICY.decide(fleet(moving, now=95.0 + POLICY.move_timeout_s + 1,
                                short=FLOOD))
    assert stuck is not None  # a worker that never carried its order out blocks no one


@pytest.mark.parametrize("since_last, last_s, moves", [
    (5.0, None, False), (10.5, None, True), (10.5, 4.0, False), (12.5, 4.0, True),
])
def test_dwell_after_a_move_grows_with_the_moves_duration(since_last, last_s, moves):
    view = fleet(QUIET, now=100.0, last_at=100.0 - since_last, last_s=last_s, short=FLOOD)
    assert (POLICY.decide(view) is not None) is moves


def test_a_lane_left_with_work_and_no_worker_gets_one_back_whatever_the_other_lanes_target():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",),
                                              told=("short",), told_at=50.0)]
    move = POLICY.decide(fleet(away, short=load(live=2, queued=10, running=8, cost=60),
                               long=load(live=0, queued=1, standby=1)))
    assert (move.worker, move.to, move.reason) == ("long", ("long", "batch"), NO_WORKER)


def test_a_lane_with_work_and_no_worker_does_not_wait_out_the_dwell():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",))]
    # a slow move (say Redis restarted during it) made the dwell 3 x 14.6 s
    view = fleet(away, now=100.0, last_at=95.0, last_s=14.6,
                 short=load(live=2, queued=0, running=1), long=load(live=0, queued=2, standby=1))
    move = POLICY.decide(view)
    assert (move.worker, move.to, move.reason) == ("long", ("long", "batch"), NO_WORKER)
    # a target miss still waits for it
    missed = fleet(QUIET, now=100.0, last_at=95.0, last_s=14.6, short=FLOOD)
    assert POLICY.decide(missed) is None


def test_a_worker_going_home_goes_first():
    away = [worker("short", SHORT_W, serving=("long",), told=("long",), told_at=50.0),
            worker("long", LONG_W)]
    # short's own worker went long, and short has work again: it is the one that comes back
    move = POLICY.decide(fleet(away, short=load(live=0, queued=3, standby=2),
                               long=load(live=2, queued=0)))
    assert (move.worker, move.to, move.reason) == ("short", ("short",), NO_WORKER)


def test_a_batch_lane_without_a_worker_waits_for_idle_capacity():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",),
                                              told=("short",), told_at=50.0)]
    busy = load(live=2, queued=10, running=8, cost=60)
    assert POLICY.decide(fleet(away, short=busy, long=load(live=0, standby=1),
                               batch=load(live=0, queued=40, standby=1))) is None


def test_home_when_the_lane_it_helps_is_quiet_again():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",),
                                              told=("short",), told_at=50.0)]
    move = POLICY.decide(fleet(away, short=load(live=2), long=load(live=0, standby=1)))
    assert (move.worker, move.to, move.reason) == ("long", ("long", "batch"), HOME)


def test_home_only_after_the_lane_was_quiet_without_a_break():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",),
                                              told=("short",), told_at=50.0)]
    quiet = {"short": load(live=2), "long": load(live=0, standby=1)}
    assert POLICY.decide(fleet(away, quiet_for=POLICY.home_after_s - 1, **quiet)) is None
    clock, t = QuietClock(), 100.0
    for busy_at in (110.0,):  # a busy moment restarts the clock
        while t < busy_at + 1 + POLICY.home_after_s:  # quiet again from busy_at + 1
            figures = dict(quiet, short=load(live=2, running=6)) if t == busy_at else quiet
            view = clock.stamp(POLICY, FleetView(LANES, {"batch": load(), **figures},
                                                 tuple(away), t))
            move = POLICY.decide(view)
            assert move is None, (t, move)
            t += 1.0
    view = clock.stamp(POLICY, FleetView(LANES, {"batch": load(), **quiet}, tuple(away), t))
    assert POLICY.decide(view).reason == HOME


def test_home_waits_while_the_lane_it_helps_stays_busy_though_no_request_waits():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",),
                                              told=("short",), told_at=50.0, running={"short": 1})]
    # 2 running on the short worker's 4 slots + 1 here: no wait predicted, but 3 of 4 busy alone
    busy = fleet(away, short=load(live=2, running=3), long=load(live=0, standby=1))
    assert POLICY.predicted_wait_s(SHORT, POLICY.without(away[1], busy, "short")) == 0.0
    assert POLICY.decide(busy) is None
    quiet = fleet(away, short=load(live=2, running=2), long=load(live=0, standby=1))
    assert POLICY.decide(quiet).reason == HOME


def test_home_waits_while_the_lane_still_needs_it_with_hysteresis():
    away = [worker("short", SHORT_W), worker("long", LONG_W, serving=("short",),
                                              told=("short",), told_at=50.0)]
    # 5 queued, 8 running on 2 workers (8 slots): meets 0.5 s with both, not 0.25 s with one
    view = fleet(away, short=load(live=2, queued=5, running=8, cost=10),
                 long=load(live=0, standby=1))
    assert POLICY.misses(SHORT, view.loads["short"]) is None
    assert POLICY.decide(view) is None


def test_predicted_wait_is_admissions():
    figures = load(live=1, queued=8, running=4, cost=50)
    wait = POLICY.predicted_wait_s(SHORT, figures)
    assert wait == pytest.approx(AdmissionPolicy(20.0).wait_tokens(SHORT, figures, 50) / 80.0)
    assert POLICY.predicted_wait_s(SHORT, load(live=0, queued=1)) == math.inf
    assert POLICY.predicted_wait_s(SHORT, load(live=0)) == 0.0


def test_lane_targets_default_to_half_the_promise_and_none_for_batch():
    assert SHORT.wait_target_s == 0.5 and LONG.wait_target_s == 10.0
    assert BATCH.wait_target_s is None


# --- rule 6: as many as the lane needs, in one decision ----------------------------------

def _long_workers(n, **kw):
    return [worker(f"long-{i}", LONG_W, **kw) for i in range(n)]


@pytest.mark.parametrize("short_load, fleet_size, max_moves, moved", [
    # 20 queued, 4 running on one worker: free slots for all 20 take 5 more workers
    (FLOOD, 16, 0, 4),                                   # a quarter of the 17 live workers: 4
    (FLOOD, 16, 10, 5),                                  # as many as it needs, then no more
    (FLOOD, 16, 1, 1),                                   # one at a time, as before
    (load(live=1, queued=6, running=4, cost=60), 16, 0, 2),  # 6 queued: two more are enough
    (FLOOD, 1, 0, 1),                                    # a 2-worker host: one move a decision
])
def test_a_large_fleet_sends_as_many_as_the_lane_needs_in_one_decision(
        short_load, fleet_size, max_moves, moved):
    policy = RebalancePolicy(admission=POLICY.admission, max_moves=max_moves)
    workers = [worker("short", SHORT_W), *_long_workers(fleet_size)]
    moves = policy.decide_moves(fleet(workers, short=short_load, long=load(live=fleet_size)))
    assert len(moves) == moved
    assert len({m.worker for m in moves}) == moved  # each worker once
    assert {(m.to, m.receiving) for m in moves} == {(("short",), "short")}
    assert moves[0] == policy.decide(fleet(workers, short=short_load, long=load(live=fleet_size)))


def test_every_further_donor_passes_the_consolidation_check_on_the_fleet_as_it_will_be():
    # three long workers, 4 long jobs each: long spares one (its jobs fit in the other two
    # within 10 s), not two, however many short needs
    policy = RebalancePolicy(admission=POLICY.admission, max_moves=5)
    workers = [worker("short", SHORT_W), *_long_workers(3, running={"long": 4})]
    moves = policy.decide_moves(fleet(workers, short=FLOOD, long=load(live=3, running=12)))
    assert [m.reason for m in moves] == [TARGET_MISSED]


def test_a_quiet_lane_sends_its_borrowed_workers_home_together():
    away = [worker("short", SHORT_W),
            *[worker(f"long-{i}", LONG_W, serving=("short",), told=("short",), told_at=10.0)
              for i in range(3)],
            *_long_workers(4)]
    view = fleet(away, short=load(live=4), long=load(live=4))
    assert [(m.worker, m.reason) for m in POLICY.decide_moves(view)] == [
        ("long-0", HOME), ("long-1", HOME)]  # a quarter of 8 live workers
    everyone = RebalancePolicy(admission=POLICY.admission, max_moves=8).decide_moves(view)
    assert [m.worker for m in everyone] == ["long-0", "long-1", "long-2"]  # short keeps its own
    assert all(m.to == ("long", "batch") and m.receiving is None for m in everyone)


def test_nothing_more_is_decided_while_any_worker_of_the_decision_is_moving():
    workers = [worker("short", SHORT_W),
               worker("long-0", LONG_W, told=("short",), told_at=99.0),  # moving
               *_long_workers(8)[1:]]
    assert POLICY.decide_moves(fleet(workers, short=FLOOD, long=load(live=8))) == ()
