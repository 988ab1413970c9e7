"""kill -9 of a worker and a restart of the API process (gunicorn, with its batch feeder) in the
middle of a batch: the batch completes with exactly one output line per custom_id, none missing,
none twice, and no line in the error file.

Two real workers serve the batch lane (`-Q long,batch`, started at once as test_worker_kill.py
starts its two, one per core), with their vLLM engines on the tiny model. One is killed while it
runs lines: their jobs end worker_lost and the feeder queues each line again under its next
attempt's job id, which the other worker serves. The API is restarted as `tailguard up` stops
it (SIGTERM); the new process's feeder takes the lease and carries on from what Redis holds.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import time

import openai
import pytest
from fault_system import figure, system_fixture
from fault_workers import START_TIMEOUT_S, Worker
from waiting import wait_for

from tailguard import settings
from tailguard.batches.feeder import MAX_ATTEMPTS
from tailguard.batches.lines import line_job_id
from tailguard.jobs.store import RUNNING, JobStore

pytestmark = pytest.mark.faults

LINES = 200
MODEL_NAME = "tailguard-demo"
#: lines done before the faults: the batch is well under way, most of it still to run
DONE_BEFORE = 20
BATCH_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def system(tmp_path_factory, tiny_model):
    sys_ = system_fixture(tmp_path_factory, tiny_model, worker=False)
    yield sys_
    sys_.stop()


def batch_workers(system) -> int:
    import requests

    return requests.get(system.url + "/healthz", timeout=10).json()["workers_per_lane"]["batch"]


def line_jobs(store: JobStore, batch_id: str) -> list[dict]:
    """Every attempt's job record of every line (the ids are deterministic)."""
    out = []
    for index in range(LINES):
        for attempt in range(MAX_ATTEMPTS):
            job = store.get(line_job_id(batch_id, index, attempt))
            if job is None:
                break
            out.append(job)
    return out


def freeze_running(worker: Worker, node: str, store: JobStore, batch_id: str) -> bool:
    """Stop the worker (SIGSTOP) and say whether a line is running on it; thaw it if none.
    Frozen, it cannot finish the line between the look and the kill, so the kill lands
    mid-line on any machine, however fast its lines run."""
    os.kill(worker.proc.pid, signal.SIGSTOP)
    if any(j["status"] == RUNNING and j.get("worker") == node
           for j in line_jobs(store, batch_id)):
        return True
    os.kill(worker.proc.pid, signal.SIGCONT)
    time.sleep(0.2)
    return False


def test_kill_9_of_a_worker_and_an_api_restart_mid_batch(system, tiny_model, tmp_path):
    client = openai.OpenAI(base_url=system.url + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    redis_url = system.env[settings.REDIS_URL.env]
    store = JobStore(system.client())
    heartbeat = {settings.WORKER_HEARTBEAT_S.env: "1"}
    doomed = Worker("batch-a", redis_url, tiny_model, tmp_path, core=0, env=heartbeat)
    survivor = Worker("batch-b", redis_url, tiny_model, tmp_path, core=1, env=heartbeat)
    doomed_node = f"batch-a@{socket.gethostname()}"
    try:
        wait_for(lambda: batch_workers(system) == 2, START_TIMEOUT_S, "both workers on batch")
        lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"model": MODEL_NAME, "prompt": f"line {i}:", "max_tokens": 8,
                           "ignore_eos": True}} for i in range(LINES)]
        data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
        source = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/completions",
                                      completion_window="24h")

        wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed
                 >= DONE_BEFORE, 300, f"{DONE_BEFORE} lines done")
        wait_for(lambda: freeze_running(doomed, doomed_node, store, batch.id), 120,
                 "a line running on the worker to be killed")
        doomed.kill()  # SIGKILL ends a stopped process too
        killed_at = time.monotonic()
        system.api.stop()  # SIGTERM, as `tailguard up` stops it: the feeder thread goes with it
        system.start_api()
        restarted_s = time.monotonic() - killed_at

        deadline = time.monotonic() + BATCH_TIMEOUT_S
        while (done := client.batches.retrieve(batch.id)).status not in (
                "completed", "failed", "expired", "cancelled"):
            assert time.monotonic() < deadline, f"batch still {done.status}: {done.request_counts}"
            assert survivor.proc.poll() is None, survivor.tail()
            time.sleep(1)
        took_s = time.monotonic() - killed_at

        assert done.status == "completed", done
        out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        errors = ([json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
                  if done.error_file_id else [])
        assert errors == []  # a line lost with its worker runs again; it does not fail
        ids = [x["custom_id"] for x in out]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(LINES))  # each once
        assert all(x["response"]["status_code"] == 200 for x in out)
        assert done.request_counts.completed == LINES and done.request_counts.failed == 0
        jobs = line_jobs(store, batch.id)
        lost = [j for j in jobs if (j.get("error") or {}).get("code") == "worker_lost"]
        assert lost, "no line was running on the killed worker"
        assert all(j["worker"] == doomed_node for j in lost)
        figure(fault="kill -9 a batch worker + API restart mid-batch", lines=LINES,
               lines_lost_and_run_again=len(lost), attempts=len(jobs),
               api_back_after_s=round(restarted_s, 1), completed_after_s=round(took_s, 1))
    finally:
        doomed.stop()
        survivor.stop()
