"""kill -9 of a worker mid-generation: its running jobs end worker_lost within the reaping
bound (~5 heartbeats: 7.5 s with the default 1.5 s), read or not, each counted once on
the finished stream; the system then serves new requests, on another worker (of the short
lane, started beside the doomed one so that the two engines start at once), while the dead
worker's jobs stay as the reaper ended them."""

from __future__ import annotations

import time

import pytest
from fault_workers import (
    Worker,
    api_with_reaper,
    finished_jobs,
    own_database,
    submit,
    wait_serving,
    wait_streaming,
)
from waiting import wait_for

from tailguard import settings
from tailguard.jobs.reaper import LAPSE_PERIODS
from tailguard.jobs.store import TERMINAL, JobStore

pytestmark = pytest.mark.faults

#: The issue's target for a dead worker's running jobs to end.
REAP_BOUND_S = 10.0


@pytest.fixture
def db(redis_server):
    """A Redis database of this file's own."""
    yield from own_database(redis_server, 2)


@pytest.fixture
def api(db, tiny_model):
    # the API's reaper runs (as in production); nobody reads the jobs through it
    yield from api_with_reaper(db[0], tiny_model)


def test_kill_9_of_a_worker_mid_generation(db, api, tiny_model, tmp_path):
    url, redis_client = db
    store = JobStore(redis_client)
    first = Worker("doomed", url, tiny_model, tmp_path)
    second = Worker("bystander", url, tiny_model, tmp_path, queues="short", core=0)
    try:
        wait_serving(api, first)
        wait_serving(api, second, lane="short")
        ids = [submit(api) for _ in range(3)]  # fewer than its 4 threads: all of them run
        for job_id in ids:
            wait_streaming(redis_client, job_id)
        first.kill()
        killed_at = time.monotonic()
        # read the records as they are: no settle-on-read, only the reaper ends them
        wait_for(lambda: all(store.status(j) in TERMINAL for j in ids), 60, "all jobs terminal")
        took = time.monotonic() - killed_at
        print(f"\nkill -9 -> all {len(ids)} running jobs terminal in {took:.1f} s "
              f"(heartbeat {settings.WORKER_HEARTBEAT_S.get()} s x {LAPSE_PERIODS} lapse)")
        assert took <= REAP_BOUND_S
        for job_id in ids:
            job = store.get(job_id)
            assert (job["status"], job["error"]["code"]) == ("failed", "worker_lost"), job
        assert sorted(finished_jobs(redis_client)) == sorted(ids)  # accepted = finished, once

        new = submit(api, max_tokens=16)  # within short's cap: lane short, the bystander's
        wait_for(lambda: store.status(new) in TERMINAL, 60, "new job done")
        assert store.status(new) == "succeeded"
        assert all(store.status(j) == "failed" for j in ids)  # no second ending
        assert sorted(finished_jobs(redis_client)) == sorted(ids + [new])
    finally:
        first.stop()
        second.stop()
