"""The engine-core process dies under a worker: the worker withdraws its lanes at once,
restarts its engine in-process and serves again; only requests in flight fail, queued
ones are served by the new engine, and a request in flight during two engine deaths is
quarantined (poison_request) and never run a third time."""

from __future__ import annotations

import os
import signal
import time

import pytest
from fault_workers import (
    START_TIMEOUT_S,
    Worker,
    api_with_reaper,
    finished_jobs,
    lane_workers,
    own_database,
    submit,
    wait_serving,
    wait_streaming,
)
from waiting import wait_for

from tailguard.jobs.store import RUNNING, TERMINAL, JobStore

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def db(redis_server):
    """A Redis database of this file's own."""
    yield from own_database(redis_server, 3)


@pytest.fixture(scope="module")
def api(db, tiny_model):
    yield from api_with_reaper(db[0], tiny_model)


@pytest.fixture(scope="module")
def worker(db, api, tiny_model, tmp_path_factory):
    """Two threads, so a third and fourth request wait in the queue."""
    w = Worker("fragile", db[0], tiny_model, tmp_path_factory.mktemp("fault-logs"), concurrency=2)
    try:
        wait_serving(api, w)
        yield w
    finally:
        w.stop()


def new_core(worker: Worker, old: int | None) -> int:
    return wait_for(lambda: (pid := worker.engine_core_pid()) not in (None, old) and pid,
                    START_TIMEOUT_S, "a new engine-core process")


def test_engine_core_killed_under_load(db, api, worker):
    url, redis_client = db
    store = JobStore(redis_client)
    core = worker.engine_core_pid()
    in_flight = [submit(api) for _ in range(2)]
    for job_id in in_flight:
        wait_streaming(redis_client, job_id)
    os.kill(core, signal.SIGSTOP)  # frozen mid-generation, whatever the machine's speed
    queued = [submit(api, max_tokens=100) for _ in range(2)]
    os.kill(core, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: lane_workers(api, "long") == 0, 10, "healthz: lane long withdrawn")
    withdrawn = time.monotonic() - killed_at
    wait_for(lambda: all(store.status(j) in TERMINAL for j in in_flight), 30, "in-flight failed")
    for job_id in in_flight:
        job = store.get(job_id)
        assert (job["status"], job["error"]["code"], job["engine_deaths"]) == \
            ("failed", "engine_dead", 1), job  # they had streamed text: not run again
    wait_for(lambda: lane_workers(api, "long") == 1, START_TIMEOUT_S, "healthz: lane long back")
    back = time.monotonic() - killed_at
    wait_for(lambda: all(store.status(j) in TERMINAL for j in queued), 60, "queued jobs served")
    served = time.monotonic() - killed_at
    assert [store.status(j) for j in queued] == ["succeeded"] * 2
    assert all("engine_deaths" not in store.get(j) for j in queued)
    assert sorted(finished_jobs(redis_client)) == sorted(in_flight + queued)
    assert worker.proc.poll() is None  # the worker process itself never went down
    print(f"\nengine-core kill -9 -> lane withdrawn in {withdrawn:.2f} s, in-flight failed, "
          f"lane back in {back:.1f} s, queued served in {served:.1f} s")


def test_a_request_in_flight_during_two_engine_deaths_is_quarantined(db, api, worker):
    url, redis_client = db
    store = JobStore(redis_client)
    before = len(finished_jobs(redis_client))
    core = worker.engine_core_pid()
    os.kill(core, signal.SIGSTOP)  # in flight with no token yet
    job_id = submit(api)
    try:
        wait_for(lambda: store.status(job_id) == RUNNING, 30, "job running")
        time.sleep(0.5)  # let the worker hand it to the (stopped) engine
    finally:
        os.kill(core, signal.SIGKILL)
    # no token yet: it stays running and runs again on the restarted engine
    wait_for(lambda: store.get(job_id).get("engine_deaths") == 1, 30, "first death counted")
    assert store.status(job_id) == RUNNING
    second = new_core(worker, core)
    wait_streaming(redis_client, job_id, timeout=START_TIMEOUT_S)  # its second run
    os.kill(second, signal.SIGKILL)
    wait_for(lambda: store.status(job_id) in TERMINAL, 30, "quarantined")
    job = store.get(job_id)
    assert (job["status"], job["error"]["code"], job["engine_deaths"]) == \
        ("failed", "poison_request", 2)
    # served again afterwards, and the poison request never ran a third time
    new_core(worker, second)
    wait_serving(api, worker)
    ok = submit(api, max_tokens=100)
    wait_for(lambda: store.status(ok) in TERMINAL, 60, "a new request served")
    assert store.status(ok) == "succeeded"
    assert store.get(job_id)["status"] == "failed"
    assert finished_jobs(redis_client)[before:] == [job_id, ok]  # each counted once
    resp = api.get(f"/v1/jobs/{job_id}")
    assert resp.get_json()["error"]["code"] == "poison_request"
