"""While Redis is stopped (SIGSTOP: it hangs and keeps its connections) or down, every route
of the API, under gunicorn, answers 503 with Retry-After within its bounded Redis timeout,
and serves again once Redis is back; an open stream rides out the stop. No engine needed."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests
from fault_system import HTTP_TIMEOUT_S, NativeStream, figure, submit, system_fixture
from waiting import wait_for

from tailguard.jobs.liveness import Liveness
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def system(tmp_path_factory, tiny_model):
    sys_ = system_fixture(tmp_path_factory, tiny_model, worker=False)
    yield sys_
    sys_.stop()


def _aof_written(system) -> bool:
    info = system.client().info("persistence")
    return info.get("aof_buffer_length", 0) == 0 and info.get("aof_pending_bio_fsync", 0) == 0


def answers(system, tiny_model, job_id):
    """(status, Retry-After, seconds) of each route."""
    calls = {
        "submit": lambda: requests.post(system.url + "/v1/jobs", json={"prompt": "x"},
                                        timeout=HTTP_TIMEOUT_S),
        "status": lambda: requests.get(f"{system.url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT_S),
        "stream": lambda: requests.get(f"{system.url}/v1/jobs/{job_id}/stream",
                                       timeout=HTTP_TIMEOUT_S),
        "healthz": lambda: requests.get(system.url + "/healthz", timeout=HTTP_TIMEOUT_S),
        "openai": lambda: requests.post(system.url + "/v1/completions", timeout=HTTP_TIMEOUT_S,
                                        json={"model": tiny_model, "prompt": "x", "stream": True}),
    }
    out = {}
    for name, call in calls.items():
        t0 = time.monotonic()
        resp = call()
        out[name] = (resp.status_code, resp.headers.get("Retry-After"),
                     round(time.monotonic() - t0, 2))
    return out


@pytest.mark.parametrize("fault", ["SIGSTOP", "kill -9"])
def test_every_route_answers_503_with_retry_after(system, tiny_model, fault):
    job_id = submit(system.url)
    if fault == "SIGSTOP":
        os.kill(system.redis.pid, signal.SIGSTOP)
    else:
        # the job is in the append-only file before the kill: with `appendfsync everysec` Redis
        # postpones that write while a slow disk's fsync runs (tailguard/host/redis_server.py),
        # and a kill -9 then loses it, which this test is not about
        wait_for(lambda: _aof_written(system), 10, "the AOF written")
        system.redis.kill()
    try:
        seen = answers(system, tiny_model, job_id)
    finally:
        if fault == "SIGSTOP":
            os.kill(system.redis.pid, signal.SIGCONT)
        else:
            system.start_redis()  # replays its AOF
    figure(fault=f"redis {fault}: API answers", routes=seen)
    assert {name: (code, retry) for name, (code, retry, _s) in seen.items()} == \
        {name: (503, "2") for name in seen}
    assert requests.get(f"{system.url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT_S).status_code == 200


def test_an_open_stream_rides_out_a_redis_stop(system):
    """Redis stopped past the API's socket timeout under an open stream: the stream stays
    open (heartbeats), then delivers the rest and the end event, on the same connection."""
    client = system.client()
    job_id = submit(system.url)
    store = JobStore(client)
    # the job's stand-in worker is alive past the stop: only the stream is under test here, and
    # the reapers (the API's, the real worker's) would otherwise fail its job as worker_lost
    Liveness(client).worker_alive("fake@faults", ttl_s=120)
    store.transition(job_id, {QUEUED}, RUNNING, {"worker": "fake@faults"})
    writer = DeltaWriter(client, job_id, flush_s=0.0)
    writer.add("before ")
    stream = NativeStream(system.url, job_id)
    stream.start()
    time.sleep(1.0)
    os.kill(system.redis.pid, signal.SIGSTOP)
    time.sleep(4.0)  # longer than TAILGUARD_REDIS_SOCKET_TIMEOUT_S (3 s)
    os.kill(system.redis.pid, signal.SIGCONT)
    writer.add("after")
    store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
        "text": "before after", "completion_tokens": 2, "finish_reason": "length"}})
    stream.join(30)
    assert stream.text == "before after" and stream.end["status"] == "succeeded", stream.end
    assert (stream.resumes, stream.errors) == (0, [])
