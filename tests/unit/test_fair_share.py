"""Fair share by key (VTC, OSDI 2024), table-tested against the paper's properties: the service
gap between two backlogged keys, work conservation, a returning key lifted to the least counter,
weighted service; and the fair refusal rule of admission."""

import itertools
import random

import pytest

from tailguard.errors import LaneFull, NoLiveWorker, OverFairShare, WaitTooLong
from tailguard.lanes.admission import AdmissionPolicy, LaneLoad
from tailguard.lanes.fair_share import (
    FairQueue,
    VirtualTokenCounters,
    fair_share,
    served_next,
    work_ahead,
)
from tailguard.lanes.table import Lane


def costs(spec: str, n: int, seed: int) -> list[int]:
    """n request costs: "const:C", or "uniform:LO-HI" (seeded)."""
    kind, _, arg = spec.partition(":")
    if kind == "const":
        return [int(arg)] * n
    lo, hi = (int(x) for x in arg.split("-"))
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


@pytest.mark.parametrize("cost_a,cost_b,weights", [
    ("const:100", "const:100", {}),
    ("const:10", "const:1000", {}),              # small requests against large ones
    ("uniform:1-1024", "uniform:1-1024", {}),
    ("uniform:1-64", "uniform:500-1024", {}),
    ("const:100", "const:100", {"a": 2.0}),
    ("uniform:1-1024", "uniform:1-1024", {"a": 3.0, "b": 0.5}),
])
def test_service_gap_of_two_backlogged_keys_within_twice_the_largest_request(cost_a, cost_b,
                                                                              weights):
    queue = FairQueue(weights)
    jobs = {"a": costs(cost_a, 400, 1), "b": costs(cost_b, 400, 2)}
    for key, cs in jobs.items():
        for i, c in enumerate(cs):
            queue.push(key, i, c)
    w = {k: weights.get(k, 1.0) for k in jobs}
    bound = 2 * max(c / w[k] for k, cs in jobs.items() for c in cs)
    served = {"a": 0.0, "b": 0.0}
    trace = []  # weighted service of each key after each dispatch, while both are backlogged
    while len(queue.backlogged()) == 2:
        key, _, cost = queue.pop()
        served[key] += cost / w[key]
        if len(queue.backlogged()) < 2:
            break
        trace.append((served["a"], served["b"]))
    assert len(trace) > 100
    for (a1, b1), (a2, b2) in itertools.combinations(trace, 2):  # every interval
        assert abs((a2 - a1) - (b2 - b1)) <= bound


@pytest.mark.parametrize("arrivals", [
    # per tick: the jobs (key, cost) that arrive; the lane dispatches one job a tick
    [[("a", 10)], [], [], [("b", 5), ("b", 5), ("a", 1)], [], [], [], [("c", 3)], [], []],
    [[("a", 10)] * 5, [], [], [], [], [], [], [("b", 1)], [], [], [], []],
    [[], [("a", 1)], [], [("a", 1), ("b", 1), ("c", 1)], [], [], []],
])
def test_work_conserving_never_idle_while_a_key_is_backlogged(arrivals):
    queue = FairQueue()
    for tick in arrivals:
        for key, cost in tick:
            queue.push(key, None, cost)
        had_work = len(queue) > 0
        assert (queue.pop() is not None) == had_work


def test_a_key_alone_gets_the_whole_lane():
    queue = FairQueue({"a": 0.1})  # however small its weight
    for i in range(5):
        queue.push("a", i, 100)
    assert [item for _, item, _ in iter(queue.pop, None)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("counters,backlogged,last,returning,lifted_to", [
    ({"a": 500.0, "b": 300.0}, ["a", "b"], "a", "c", 300.0),   # new key: the least active
    ({"a": 500.0, "b": 300.0, "c": 50.0}, ["a", "b"], "a", "c", 300.0),  # saved credit: gone
    ({"a": 500.0, "b": 300.0, "c": 900.0}, ["a", "b"], "a", "c", 900.0),  # never lowered
    ({"a": 500.0, "c": 0.0}, [], "a", "c", 500.0),  # nobody backlogged: the last served's
    ({"c": 40.0}, [], None, "c", 40.0),              # nothing served yet: as it was
    ({"a": 500.0}, [], "a", "a", 500.0),             # the last served itself: as it was
])
def test_a_returning_key_is_lifted_to_the_least_active_counter(counters, backlogged, last,
                                                               returning, lifted_to):
    vtc = VirtualTokenCounters(counters=dict(counters), last_served=last)
    vtc.lift(returning, backlogged)
    assert vtc.value(returning) == lifted_to


def test_a_returning_key_is_served_without_bursting_past_the_others():
    queue = FairQueue()
    for i in range(50):  # a served alone for a while: its counter runs up, b's stays 0
        queue.push("a", i, 100)
    for _ in range(20):
        queue.pop()
    queue.push("b", "b0", 100)
    for i in range(10):
        queue.push("b", f"b{i + 1}", 100)
    order = [key for key, _, _ in (queue.pop() for _ in range(20))]
    # b is lifted to a's counter: they alternate, b does not take the lane for 20 jobs
    assert order.count("b") in (10, 11) and "a" in order[:3]


@pytest.mark.parametrize("weights,ratio", [({"a": 2.0, "b": 1.0}, 2.0), ({"a": 1.0, "b": 1.0}, 1.0),
                                           ({"a": 3.0, "b": 1.0}, 3.0)])
def test_weighted_keys_both_flooding_get_service_in_their_weights_ratio(weights, ratio):
    queue = FairQueue(weights)
    for seed, key in enumerate(weights):
        for i, c in enumerate(costs("uniform:10-200", 600, seed)):
            queue.push(key, i, c)
    served = {"a": 0, "b": 0}
    for _ in range(600):  # both stay backlogged throughout
        key, _, cost = queue.pop()
        served[key] += cost
    assert served["a"] / served["b"] == pytest.approx(ratio, rel=0.05)


def test_the_quiet_keys_job_is_not_behind_the_flood():
    queue = FairQueue()
    for i in range(100):
        queue.push("flood", i, 100)
    for _ in range(10):
        queue.pop()
    queue.push("quiet", "q", 100)
    assert "quiet" in [queue.pop()[0] for _ in range(2)]


@pytest.mark.parametrize("key,capacity,backlogs,weights,share", [
    ("a", 1200, {}, {}, 1200),                    # alone: all of it
    ("a", 1200, {"b": 1140}, {}, 600),
    ("a", 1200, {"a": 100, "b": 1140}, {}, 600),
    ("a", 1200, {"b": 1140, "c": 0}, {}, 600),    # c has nothing queued: not counted
    ("a", 1200, {"b": 1140}, {"a": 2.0}, 800),
    ("b", 1200, {"a": 10, "c": 10}, {"a": 2.0}, 300),
])
def test_fair_share(key, capacity, backlogs, weights, share):
    assert fair_share(key, capacity, backlogs, weights) == pytest.approx(share)


@pytest.mark.parametrize("key,backlogs,weights,ahead", [
    ("a", {"b": 1140}, {}, 0),                   # a key with nothing queued goes next
    ("a", {"a": 200, "b": 1140}, {}, 400),       # its own 200 and as much of b's
    ("a", {"a": 200, "b": 100}, {}, 300),        # b has less than a's share: all of it
    ("a", {"a": 200, "b": 1140}, {"a": 2.0}, 300),
    ("b", {"a": 200, "b": 1140}, {}, 1340),      # the flood waits for everything
])
def test_work_ahead_in_fair_order(key, backlogs, weights, ahead):
    assert work_ahead(key, backlogs, weights) == pytest.approx(ahead)


# rate prior: 10 tokens/s per sequence x 4 slots = 40/s; 30 s promise: the lane holds 1200
POLICY = AdmissionPolicy(prior_tokens_per_s=10.0)
LANE = Lane(name="short", max_tokens=64, max_num_seqs=4, max_model_len=1000, queue_ttl_s=60,
            max_wait_s=30, max_backlog_tokens=5000)


def load(backlog=0, queued=0, running=0, served=0, workers=1):
    return LaneLoad(backlog_tokens=backlog, queued_jobs=queued, running_jobs=running,
                    served_tokens=served, window_s=30.0, live_workers=workers)


@pytest.mark.parametrize("lane_load,key,backlogs,weights,wait", [
    (load(), "a", {}, {}, 0.0),                                          # idle lane
    (load(backlog=1000, queued=10, running=4), "b", {"b": 1000}, {}, 27.5),  # alone: all of it
    (load(backlog=1000, queued=10, running=4), "b", {"a": 100, "b": 900}, {}, 27.5),  # not full:
    # over its share, admitted all the same (work-conserving)
    (load(backlog=1140, queued=12, running=4), "a", {"b": 1140}, {}, 2.5),  # full; a within
    # its share goes next in fair order
    (load(backlog=1340, queued=14, running=4), "a", {"a": 200, "b": 1140}, {}, 12.5),  # 400 ahead
    (load(backlog=4950, queued=50, running=4, served=6000), "a", {"b": 4950}, {}, 0.5),  # past
    # the backlog bound (5050 > 5000) within its share: admitted, 100 / 200 tokens/s
])
def test_fair_admission_accepts(lane_load, key, backlogs, weights, wait):
    assert POLICY.admit_fairly(LANE, lane_load, 100, key, backlogs, weights) == pytest.approx(wait)


@pytest.mark.parametrize("lane_load,key,backlogs,weights,error,retry_after", [
    # the flood, over its share (1240 of 600) while a has work queued: refused first, with its
    # own code; Retry-After: 640 over at its share of the rate (20/s)
    (load(backlog=1240, queued=13, running=4), "b", {"a": 100, "b": 1140}, {}, OverFairShare, 32),
    (load(backlog=1240, queued=13, running=4), "b", {"a": 100, "b": 1140}, {"b": 3.0},
     OverFairShare, 12),                        # share 900: 340 over at 30/s
    # alone (a key with nothing queued does not count) it is refused as admit refuses it
    (load(backlog=1140, queued=12, running=4), "b", {"b": 1140}, {}, WaitTooLong, 1),
    (load(backlog=1140, queued=12, running=4), "b", {"a": 0, "b": 1140}, {}, WaitTooLong, 1),
    # within its share, but past twice the backlog bound (9950 + 100 > 10000): 5050 over at 200/s
    (load(backlog=9950, queued=99, running=4, served=6000), "a", {"a": 2400, "b": 7550}, {},
     LaneFull, 26),
])
def test_fair_admission_refuses(lane_load, key, backlogs, weights, error, retry_after):
    with pytest.raises(error) as refused:
        POLICY.admit_fairly(LANE, lane_load, 100, key, backlogs, weights)
    assert type(refused.value) is error and refused.value.retry_after_s == retry_after
    assert refused.value.lane == "short"


def test_fair_admission_without_a_live_worker_is_still_a_503():
    with pytest.raises(NoLiveWorker):
        POLICY.admit_fairly(LANE, load(workers=0), 100, "a", {}, {})


@pytest.mark.parametrize("key,backlogs,counters,weights,nxt", [
    ("a", {"a": 100, "b": 1000}, {"a": 500, "b": 700}, {}, True),   # 500 + 100 < 700
    ("a", {"a": 200, "b": 1000}, {"a": 500, "b": 700}, {}, False),  # 500 + 200: a tie
    ("a", {"a": 300, "b": 1000}, {"a": 500, "b": 700}, {}, False),  # 500 + 300 > 700
    ("a", {"a": 300, "b": 1000}, {"a": 500, "b": 700}, {"a": 2.0}, True),  # 500 + 150
    ("a", {"b": 1000}, {"a": 0, "b": 700}, {}, False),   # returning: lifted to 700, a tie
    ("a", {"b": 1000}, {"a": 900, "b": 700}, {}, False),  # never lowered: 900 > 700
    ("a", {"a": 100}, {"a": 0}, {}, False),               # alone: nobody to go before
    ("a", {"a": 100, "b": 0}, {"a": 0, "b": 50}, {}, False),  # b has nothing queued
])
def test_served_next_is_a_counter_still_at_most_the_others_once_charged(key, backlogs, counters,
                                                                        weights, nxt):
    assert served_next(key, backlogs, weights, counters) is nxt


def test_a_key_over_its_share_that_counter_order_serves_next_is_admitted_not_refused():
    """The flood's refusal above (b over its share, 1240 of 600), except that b was served less
    than a by more than it holds: b's new job goes out next, so it is admitted, with only its own
    queued work ahead of it: 1140 of the 1240 (12 of the 13 jobs, none beyond the 4 busy slots)
    and one slot's worth, 1240 tokens at 40 tokens/s."""
    full = load(backlog=1240, queued=13, running=4)
    with pytest.raises(OverFairShare):
        POLICY.admit_fairly(LANE, full, 100, "b", {"a": 100, "b": 1140}, {}, {"a": 0, "b": 0})
    wait = POLICY.admit_fairly(LANE, full, 100, "b", {"a": 100, "b": 1140}, {},
                               {"a": 5000, "b": 3000})
    assert wait == pytest.approx(31.0)


TIGHT = Lane(name="short", max_tokens=64, max_num_seqs=4, max_model_len=1000, queue_ttl_s=60,
             max_wait_s=1, max_backlog_tokens=5000)


def test_a_lane_whose_promise_is_shorter_than_a_slot_counts_running_work_in_the_shares():
    """Every slot runs the flood's jobs (400 cost tokens) and nothing is queued: a new request
    waits 2.5 s for a slot, past the 1 s promise. The quiet key has nothing there and is within
    its half of what the lane holds (1 s x 40 tokens/s + the 400 running): admitted, to go out at
    the next free slot. The flood alone is refused as arrival order refuses it; once the quiet
    key has work there, the flood is over its share (500 of 220): over_fair_share, Retry-After
    280 over at its half of the rate (20/s)."""
    full = load(running=4)
    assert POLICY.admit_fairly(TIGHT, full, 100, "a", {}, {}, {}, {"b": 400}) == pytest.approx(2.5)
    with pytest.raises(WaitTooLong):
        POLICY.admit_fairly(TIGHT, full, 100, "b", {}, {}, {}, {"b": 400})
    with pytest.raises(OverFairShare) as refused:
        POLICY.admit_fairly(TIGHT, full, 100, "b", {"a": 100}, {}, {}, {"b": 400})
    assert refused.value.retry_after_s == 14
