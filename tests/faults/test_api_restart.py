"""Restart the API (gunicorn, as `tailguard up` stops it: SIGTERM, then SIGKILL once its stop
timeout passes, 2 s here so the streams outlast gunicorn's graceful drain) under 20 open
streams. No engine: the jobs are advanced by a thread that writes them exactly as a
worker does (its DeltaWriter, the job state machine), so the test is about the API alone.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from fault_system import (
    NativeStream,
    OpenAIStream,
    assert_invariants,
    figure,
    submit,
    system_fixture,
    wait_openai_ready,
    wait_terminal,
)

from tailguard.jobs.liveness import Liveness
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter

pytestmark = pytest.mark.faults

STREAMS = 20
TICKS = 80          # deltas per job, one per TICK_S: the jobs outlast the stop timeout
TICK_S = 0.1
FAKE_WORKER = "fake@faults"


@pytest.fixture(scope="module")
def system(tmp_path_factory, tiny_model):
    sys_ = system_fixture(tmp_path_factory, tiny_model, worker=False)
    yield sys_
    sys_.stop()


def work_like_a_worker(client, job_ids: list[str]) -> None:
    """Runs the jobs as a worker would, heart-beating like one (else the reaper ends them)."""
    store, liveness = JobStore(client), Liveness(client)
    liveness.worker_alive(FAKE_WORKER, ttl_s=5)
    writers = {}
    for job_id in job_ids:
        store.transition(job_id, {QUEUED}, RUNNING, {"worker": FAKE_WORKER})
        writers[job_id] = DeltaWriter(client, job_id, flush_s=0.0)
    for tick in range(TICKS):
        for writer in writers.values():
            writer.add(f"t{tick} ")
        if tick % 10 == 0:
            liveness.worker_alive(FAKE_WORKER, ttl_s=5)
        time.sleep(TICK_S)
    for job_id in job_ids:
        store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
            "text": "".join(f"t{t} " for t in range(TICKS)), "completion_tokens": TICKS,
            "finish_reason": "length"}})


def test_restart_the_api_under_20_open_streams(system, tiny_model):
    client = system.client()
    wait_openai_ready(system.url)  # the OpenAI streams get their job ids within the second
    ids = [submit(system.url) for _ in range(STREAMS)]
    streams = [NativeStream(system.url, job_id) for job_id in ids]
    openai = [OpenAIStream(system.url, tiny_model) for _ in range(4)]
    for s in streams + openai:
        s.start()
    time.sleep(1.0)
    ids += [s.job_id for s in openai]
    assert None not in ids
    worker = threading.Thread(target=work_like_a_worker, args=(client, ids), daemon=True)
    worker.start()
    time.sleep(1.0)
    stopping = time.monotonic()
    system.api.spec = dataclasses.replace(system.api.spec, stop_timeout_s=2)
    system.api.stop()
    system.start_api()
    back_after_s = time.monotonic() - stopping
    for s in streams:
        s.join(60)
    worker.join(30)
    jobs = wait_terminal(client, ids, system.url, 30)

    assert_invariants(client, jobs)  # nothing cancelled by the restart
    expected = "".join(f"t{t} " for t in range(TICKS))
    assert [s.text == expected and s.end == {"status": "succeeded", "completion_tokens": TICKS,
                                              "finish_reason": "length"} for s in streams] == \
        [True] * STREAMS
    assert sum(s.resumes for s in streams) >= STREAMS  # each one was cut and resumed
    figure(fault="API restart (SIGTERM) under 20 open streams", streams=STREAMS,
           resumes=sum(s.resumes for s in streams), api_back_after_s=round(back_after_s, 1),
           openai_stream_errors=[s.error for s in openai], complete_streams=STREAMS)
