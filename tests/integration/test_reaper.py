"""The running-jobs index and the reaper against a real Redis: the jobs of a worker that
stopped heart-beating end worker_lost within a few periods, once, whoever reaps them."""

import time

import pytest

from tailguard.jobs.liveness import Liveness
from tailguard.jobs.reaper import Reaper
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration

PERIOD_S = 0.2


def start(store: JobStore, job_id: str, worker: str) -> None:
    store.create(job_id, {"lane": "short", "deadline_s": 30}, queue_ttl_s=60)
    assert store.transition(job_id, {QUEUED}, RUNNING, {"worker": worker})[0]


def test_the_index_follows_the_state_in_the_same_step(redis_client):
    store = JobStore(redis_client)
    start(store, "aa" * 16, "w1@host")
    assert store.running() == {"aa" * 16: "w1@host"}
    store.transition("aa" * 16, {RUNNING}, SUCCEEDED, {"result": {"text": "x"}})
    assert store.running() == {}


def test_a_dead_workers_jobs_are_reaped_once_and_a_live_ones_are_not(redis_client):
    store, liveness = JobStore(redis_client), Liveness(redis_client)
    start(store, "aa" * 16, "dead@host")
    start(store, "bb" * 16, "live@host")
    liveness.worker_alive("dead@host", ttl_s=PERIOD_S)
    liveness.worker_alive("live@host", ttl_s=60)
    reapers = [Reaper(store, liveness, PERIOD_S) for _ in range(2)]
    time.sleep(PERIOD_S * 1.5)  # dead@host lapses
    assert [r.run_once() for r in reapers] == [[], []]  # suspected, not yet confirmed
    time.sleep(PERIOD_S)
    reaped = [r.run_once() for r in reapers]
    assert sorted(reaped, key=len) == [[], ["aa" * 16]]  # two reapers, one transition
    job = store.get("aa" * 16)
    assert (job["status"], job["error"]["code"]) == ("failed", "worker_lost")
    assert "dead@host" in job["error"]["message"]
    assert store.status("bb" * 16) == RUNNING and store.running() == {"bb" * 16: "live@host"}
    assert redis_client.xlen(keys.FINISHED_STREAM) == 1


def test_a_worker_that_heartbeats_again_after_a_stall_keeps_its_jobs(redis_client):
    # after a Redis stall every heartbeat looks lapsed at once: a live worker gets a period
    store, liveness = JobStore(redis_client), Liveness(redis_client)
    start(store, "aa" * 16, "w@host")
    liveness.worker_alive("w@host", ttl_s=0.01)
    time.sleep(0.05)
    reaper = Reaper(store, liveness, PERIOD_S)
    assert reaper.run_once() == []
    liveness.worker_alive("w@host", ttl_s=60)  # its next heartbeat
    time.sleep(PERIOD_S)
    assert reaper.run_once() == [] and store.status("aa" * 16) == RUNNING


def test_an_expired_record_leaves_the_index(redis_client):
    store, liveness = JobStore(redis_client), Liveness(redis_client)
    start(store, "aa" * 16, "gone@host")
    redis_client.delete(keys.job_key("aa" * 16))
    reaper = Reaper(store, liveness, 0.0)
    assert reaper.run_once() == [] and reaper.run_once() == []
    assert store.running() == {}
