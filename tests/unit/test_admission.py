"""Admission policy: predicted wait with free batch slots, the backlog bound, the lane's
promise, Retry-After."""

import dataclasses

import pytest

from tailguard.errors import LaneFull, NoLiveWorker, WaitTooLong
from tailguard.lanes.admission import AdmissionPolicy, BacklogLimits, LaneLoad
from tailguard.lanes.table import Lane

# rate prior: 10 tokens/s per sequence x 4 slots per live worker
POLICY = AdmissionPolicy(prior_tokens_per_s=10.0)
LANE = Lane(name="short", max_tokens=64, max_num_seqs=4, max_model_len=1000, queue_ttl_s=60,
            max_wait_s=30, max_backlog_tokens=5000)
TIGHT = dataclasses.replace(LANE, max_wait_s=0.1)


def load(backlog=0, queued=0, running=0, served=0, window=30.0, workers=1, engine_s=0.0):
    return LaneLoad(backlog_tokens=backlog, queued_jobs=queued, running_jobs=running,
                    served_tokens=served, window_s=window, live_workers=workers,
                    served_engine_s=engine_s)


@pytest.mark.parametrize("lane_load,rate", [
    (load(), 40.0),                       # nothing measured: the prior
    (load(workers=2), 80.0),              # the prior scales with live workers
    (load(served=600, engine_s=20), 120.0),   # 30 tokens per engine second x 4 slots
    (load(served=600, engine_s=120), 20.0),   # 5 x 4 is less than the 20 served per second
    (load(served=3000, engine_s=60, workers=2), 400.0),  # 50 x 8 slots
    # served, no engine time on record (an older API recorded it): the prior, or what it served
    (load(served=600), 40.0),
    (load(served=3000), 100.0),
    (load(served=3000, window=0), 40.0),  # no window: the prior
])
def test_service_rate_is_a_sequences_measured_rate_times_the_slots(lane_load, rate):
    assert POLICY.service_rate(LANE, lane_load) == rate


@pytest.mark.parametrize("cost,prompt,per_sequence", [
    (100, 0, 10.0),        # no shape: the prior, a decode rate
    (64, 64, 10.0),        # no output either
    (1064, 1000, 1064 / (1000 / 1000 + 64 / 10)),  # 1 s of prefill + 6.4 s of decode
    (67, 3, 67 / (3 / 1000 + 64 / 10)),            # a short prompt: about the prior
    (100, 500, 10.0),      # a prompt past the cost (drifted figures): read as all prompt
])
def test_the_prior_prefills_a_prompt_and_decodes_the_output(cost, prompt, per_sequence):
    assert POLICY.prior_per_sequence(cost, prompt) == pytest.approx(per_sequence)


def test_a_prompt_heavy_request_is_not_judged_as_if_each_prompt_token_took_a_decode_step():
    """A question over a long document on a lane that has measured nothing yet, its 4 slots full:
    at the bare prior (40 tokens/s) its 1,064 tokens take 26.6 s, past the 8 s promise; a
    sequence gets through them in 7.4 s, so the lane in 1.85 s."""
    lane, busy = dataclasses.replace(LANE, max_wait_s=8), load(running=4)
    with pytest.raises(WaitTooLong):
        POLICY.admit(lane, busy, 1064)
    assert POLICY.admit(lane, busy, 1064, prompt_tokens=1000) == pytest.approx(7.4 / 4)
    limits = POLICY.limits(lane, busy, cost=1064, prompt_tokens=1000)
    assert limits.wait_tokens == pytest.approx(8 * 4 * 1064 / 7.4)  # the store's check alike
    # once the lane has measured a request, a sequence's measured rate: the warm-up's 1,064
    # tokens in 2 engine seconds, whatever the judged request's shape
    measured = load(running=4, served=1064, engine_s=2.0)
    assert POLICY.service_rate(lane, measured, 64, 0) == pytest.approx(4 * 532)
    assert POLICY.admit(lane, measured, 1064, prompt_tokens=1000) == pytest.approx(0.5)


@pytest.mark.parametrize("lane_load,cost,wait", [
    (load(), 100, 0.0),                               # idle lane: starts at once
    (load(backlog=100, queued=1), 100, 0.0),          # arrives with another: both have a slot
    (load(backlog=300, queued=3, running=0), 100, 0.0),   # the last free slot is left for it
    (load(backlog=100, queued=1, running=2), 100, 0.0),
    (load(backlog=400, queued=4), 100, 2.5),          # 4 ahead take the 4 slots: one must end
    (load(running=4), 100, 2.5),                      # batch full, nothing queued: one must end
    (load(running=6), 100, 2.5),                      # a dead worker's jobs not reaped yet
    (load(backlog=600, queued=6, running=2), 100, 12.5),  # 2 absorbed, 400 beyond, + one
    (load(backlog=400, queued=4, running=4), 100, 12.5),  # none absorbed
    (load(backlog=1100, queued=11, running=4), 100, 30.0),  # exactly the promise: accepted
    (load(backlog=2800, queued=28, running=4, served=3000), 100, 29.0),  # measured 100/s
    (load(backlog=300, queued=3, running=4, workers=2), 100, 0.0),  # 8 slots: one left
    (load(backlog=-5, queued=0, running=-1), 100, 0.0),  # drifted figures read as empty
])
def test_accepted_with_its_predicted_wait(lane_load, cost, wait):
    assert POLICY.admit(LANE, lane_load, cost) == pytest.approx(wait)


@pytest.mark.parametrize("lane_load,cost,error,retry_after", [
    (load(backlog=1140, queued=12, running=4), 100, WaitTooLong, 1),   # 31 s > 30 s
    (load(backlog=1900, queued=19, running=4), 100, WaitTooLong, 20),  # 50 s, 20 s over
    (load(backlog=4950, queued=50, running=4, served=6000), 100, LaneFull, 1),  # 5050 > 5000
    (load(backlog=4900, queued=49, running=4), 1000, LaneFull, 23),  # 900 over at 40/s
])
def test_refused_with_retry_after(lane_load, cost, error, retry_after):
    with pytest.raises(error) as exc:
        POLICY.admit(LANE, lane_load, cost)
    assert exc.value.retry_after_s == retry_after and exc.value.http_status == 429
    assert exc.value.lane == "short"


@pytest.mark.parametrize("running", range(6))
@pytest.mark.parametrize("queued", range(6))
def test_a_tight_promise_admits_exactly_the_requests_a_free_slot_is_left_for(queued, running):
    """A 0.1 s promise on 4 slots: what the old backlog / rate refused (one queued request
    ahead already predicted 2.5 s) is admitted while a slot is free for it, and only then."""
    lane_load = load(backlog=67 * queued, queued=queued, running=running)
    if queued < 4 - running:
        assert POLICY.admit(TIGHT, lane_load, 67) == 0.0
    else:
        with pytest.raises(WaitTooLong) as exc:
            POLICY.admit(TIGHT, lane_load, 67)
        assert exc.value.retry_after_s >= 1


def test_the_limits_are_the_slots_and_the_promise_in_work():
    assert POLICY.limits(LANE, load(workers=2, served=6000)) == BacklogLimits(
        slots=8, wait_tokens=30 * 200.0, after=5000)
    assert POLICY.limits(Lane(name="batch", max_tokens=64, max_num_seqs=4, queue_ttl_s=100),
                         load(workers=0)) == BacklogLimits(slots=4, wait_tokens=4000.0)


def test_without_a_bound_or_max_wait_the_queue_ttl_is_the_promise():
    lane = Lane(name="batch", max_tokens=64, max_num_seqs=4, queue_ttl_s=100)
    assert POLICY.admit(lane, load(backlog=3900, queued=39, running=4), 100) == 100.0
    with pytest.raises(WaitTooLong):
        POLICY.admit(lane, load(backlog=3940, queued=39, running=4), 100)


def test_no_live_worker_is_a_503_unless_admitted_anyway():
    with pytest.raises(NoLiveWorker) as exc:
        POLICY.admit(LANE, load(workers=0), 100)
    assert exc.value.http_status == 503
    # admitted anyway, the lane is judged as if one worker served it (as the prior rate is)
    anyway = AdmissionPolicy(admit_without_worker=True)
    assert anyway.admit(LANE, load(workers=0), 100) == 0.0
    assert anyway.admit(LANE, load(backlog=400, queued=4, workers=0), 100) == 100 / 80.0


def test_the_lanes_after_it_and_the_advertised_limits_take_its_free_slots():
    """A lane's limit counts the jobs of the lanes after it on its engines, and its workers
    advertise their own (cut) limits: both bound the free slots a request may start in."""
    lane_load = load(workers=2)  # 4 slots each, as the lane says
    assert POLICY.slots(LANE, lane_load) == 8
    cut = dataclasses.replace(lane_load, worker_slots=5, advertising_workers=2)  # one cut to 1
    assert POLICY.slots(LANE, cut) == 5 and POLICY.service_rate(LANE, cut) == 50.0
    # a worker of an older version advertises nothing: its lane's own limit stands for it
    assert POLICY.slots(LANE, dataclasses.replace(cut, worker_slots=1, advertising_workers=1)) == 5
    assert POLICY.admit(TIGHT, dataclasses.replace(cut, sharing_jobs=4), 67) == 0.0
    with pytest.raises(WaitTooLong):  # 3 long + 2 short running fill the 5
        POLICY.admit(TIGHT, dataclasses.replace(cut, sharing_jobs=3, running_jobs=2), 67)
    assert POLICY.limits(LANE, cut, ("long",)).sharing == ("long",)


def test_a_lane_shares_its_slots_with_the_lanes_after_it_on_its_workers():
    from tailguard.lanes.table import LaneTable, WorkerSpec

    lanes = tuple(dataclasses.replace(LANE, name=n) for n in ("short", "long", "batch"))
    every = LaneTable(lanes, (WorkerSpec("engine", ("short", "long", "batch")),))
    assert every.sharing("short") == ("long", "batch") and every.sharing("batch") == ()
    split = LaneTable(lanes, (WorkerSpec("s", ("short",)), WorkerSpec("l", ("long", "batch"))))
    assert split.sharing("short") == () and split.sharing("long") == ("batch",)
