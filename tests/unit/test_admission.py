"""Admission policy: predicted wait, the backlog bound, the lane's promise, Retry-After."""

import pytest

from tailguard.admission import AdmissionPolicy, LaneLoad
from tailguard.errors import LaneFull, NoLiveWorker, WaitTooLong
from tailguard.lanes import Lane

# rate prior: 10 tokens/s per sequence x 4 sequences x live workers
POLICY = AdmissionPolicy(prior_tokens_per_s=10.0)
LANE = Lane(name="short", max_tokens=64, max_num_seqs=4, max_model_len=1000, queue_ttl_s=60,
            max_wait_s=30, max_backlog_tokens=5000)


def load(backlog=0, served=0, window=30.0, workers=1):
    return LaneLoad(backlog_tokens=backlog, served_tokens=served, window_s=window,
                    live_workers=workers)


@pytest.mark.parametrize("lane_load,rate", [
    (load(), 40.0),                       # nothing measured: the prior
    (load(workers=2), 80.0),              # the prior scales with live workers
    (load(served=600), 40.0),             # 20 tokens/s measured, below the prior
    (load(served=3000), 100.0),           # 100 tokens/s measured
    (load(served=3000, window=0), 40.0),  # no window: the prior
])
def test_service_rate_is_measured_never_below_the_prior(lane_load, rate):
    assert POLICY.service_rate(LANE, lane_load) == rate


@pytest.mark.parametrize("lane_load,cost,wait", [
    (load(), 100, 0.0),                            # empty lane: starts at once
    (load(backlog=400), 100, 10.0),                # 400 tokens ahead at 40/s
    (load(backlog=1200), 100, 30.0),               # exactly the promise: accepted
    (load(backlog=2900, served=3000), 100, 29.0),  # measured 100/s
    (load(backlog=-5), 100, 0.0),                  # a drifted counter reads as empty
])
def test_accepted_with_its_predicted_wait(lane_load, cost, wait):
    assert POLICY.admit(LANE, lane_load, cost) == pytest.approx(wait)


@pytest.mark.parametrize("lane_load,cost,error,retry_after", [
    (load(backlog=1240), 100, WaitTooLong, 1),        # 31 s > 30 s: back in 1 s
    (load(backlog=2000), 100, WaitTooLong, 20),       # 50 s predicted, 20 s over
    (load(backlog=4950, served=6000), 100, LaneFull, 1),   # 5050 > 5000 at 200/s
    (load(backlog=4900), 1000, LaneFull, 23),          # 900 over the bound at 40/s
])
def test_refused_with_retry_after(lane_load, cost, error, retry_after):
    with pytest.raises(error) as exc:
        POLICY.admit(LANE, lane_load, cost)
    assert exc.value.retry_after_s == retry_after and exc.value.http_status == 429
    assert exc.value.lane == "short"


def test_without_a_bound_or_max_wait_the_queue_ttl_is_the_promise():
    lane = Lane(name="batch", max_tokens=64, max_num_seqs=4, queue_ttl_s=100)
    assert POLICY.admit(lane, load(backlog=4000), 100) == 100.0
    with pytest.raises(WaitTooLong):
        POLICY.admit(lane, load(backlog=4040), 100)


def test_no_live_worker_is_a_503_unless_admitted_anyway():
    with pytest.raises(NoLiveWorker) as exc:
        POLICY.admit(LANE, load(workers=0), 100)
    assert exc.value.http_status == 503
    assert AdmissionPolicy(admit_without_worker=True).admit(LANE, load(workers=0), 100) == 0.0
