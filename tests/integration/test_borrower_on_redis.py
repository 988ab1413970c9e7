"""Work-conserving lanes on a real Redis: the borrower takes real Celery messages the API
queued, through kombu, and runs them through the real JobRunner and job records. The
engine is a stand-in that streams a few deltas (as tests/integration/test_runner.py's);
a real worker borrowing on a real engine is covered by tests/e2e/test_borrowing_e2e.py."""

import dataclasses
import json
import threading

import pytest
from waiting import wait_for

from tailguard.engine.host import GenerationResult
from tailguard.jobs.store import QUEUED, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter
from tailguard.lanes.borrowing import BorrowPolicy
from tailguard.lanes.table import load_lanes
from tailguard.redis.keys import job_stream_key
from tailguard.worker.borrower import BORROWED_PRIORITY, Borrower, Prioritized
from tailguard.worker.runner import JobRunner
from tasks import app

pytestmark = pytest.mark.integration

WORKER = "short@borrower-test"


class HeldEngine:
    """Streams "a", then "b" once `release` is set (polling should_cancel meanwhile); records
    what it was asked, and counts what is inside it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.in_flight = 0
        self.calls: list[tuple[str, int, int]] = []  # (prompt, max_tokens, priority)

    @property
    def priorities(self) -> list[int]:
        return [priority for _, _, priority in self.calls]

    def generate(self, request_id, prompt, sampling, deadline_s, on_first_token=None,
                 should_cancel=None, on_delta=None, add_special_tokens=True, priority=0):
        self.calls.append((prompt, sampling["max_tokens"], priority))
        self.in_flight += 1
        try:
            on_first_token()
            on_delta("a")
            while not self.release.wait(0.02):
                if should_cancel():
                    return GenerationResult("a", 3, 1, "cancelled", 0.01, 0.02)
            on_delta("b")
            return GenerationResult("ab", 3, 2, "length", 0.01, 0.02)
        finally:
            self.in_flight -= 1


@pytest.fixture
def engine():
    e = HeldEngine()
    yield e
    e.release.set()


@pytest.fixture
def borrower(redis_client, engine):
    store = JobStore(redis_client)
    runner = JobRunner(lambda: Prioritized(engine, BORROWED_PRIORITY), store,
                       lambda job_id: DeltaWriter(redis_client, job_id, flush_s=0), WORKER)
    long = load_lanes()["long"]

    def publish(lane, job):  # as the worker does (tailguard/worker/runtime.py)
        app.send_task(long.task_name, task_id=job.job_id, queue=lane,
                      expires=long.queue_ttl_s, kwargs=dataclasses.asdict(job))

    b = Borrower(BorrowPolicy(lanes=("long",), headroom=1, max_borrowed=1), ["short"], slots=4,
                 runner=runner, connect=app.connection_for_read, publish=publish,
                 in_flight=lambda: engine.in_flight, serving=lambda: True)
    yield b
    b._close()


def submit(client, **body) -> str:
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def long_job(client) -> str:
    return submit(client, prompt="word " * 200, max_tokens=8)  # over short's max_cost


def unacked(redis_client) -> int:
    return redis_client.hlen("unacked")


def test_an_idle_worker_runs_a_long_job_at_low_priority_and_acks_it(client, redis_client,
                                                                    borrower, engine):
    job_id = long_job(client)
    assert borrower.step() == job_id
    engine.release.set()
    done = client.get(f"/v1/jobs/{job_id}?wait=10").get_json()
    assert (done["status"], done["lane"], done["worker"]) == (SUCCEEDED, "long", WORKER)
    assert done["result"] == {"text": "ab", "completion_tokens": 2, "finish_reason": "length"}
    assert engine.priorities == [BORROWED_PRIORITY]
    wait_for(lambda: borrower.stats().running == 0 and unacked(redis_client) == 0)
    assert redis_client.llen("long") == 0
    assert borrower.stats().borrowed == {"long": 1}


def test_own_queued_work_means_no_borrowing(client, redis_client, borrower):
    short_id = submit(client, prompt="hi", max_tokens=4)
    long_id = long_job(client)
    assert borrower.step() is None
    assert client.get(f"/v1/jobs/{long_id}").get_json()["status"] == QUEUED
    assert client.get(f"/v1/jobs/{short_id}").get_json()["status"] == QUEUED
    assert redis_client.llen("long") == 1 and unacked(redis_client) == 0


def test_at_most_borrow_max_at_once(client, redis_client, borrower, engine):
    first, second = long_job(client), long_job(client)
    assert borrower.step() == first
    wait_for(lambda: engine.in_flight == 1)
    assert borrower.step() is None  # B = 1 is running
    assert redis_client.llen("long") == 1
    engine.release.set()
    wait_for(lambda: borrower.stats().running == 0)
    assert borrower.step() == second
    assert client.get(f"/v1/jobs/{second}?wait=10").get_json()["status"] == SUCCEEDED


def test_nothing_to_borrow_takes_nothing(borrower, redis_client):
    assert borrower.step() is None
    assert borrower.stats().borrowed == {}


def test_own_work_arriving_reclaims_the_borrowed_job_which_continues_where_it_stopped(
        client, redis_client, borrower, engine):
    job_id = long_job(client)
    assert borrower.step() == job_id
    wait_for(lambda: engine.in_flight == 1)
    for _ in range(3):  # 3 short jobs arrive: with 3 slots free, R = 1 needs one back
        submit(client, prompt="hi", max_tokens=4)
    assert borrower.step() is None
    queued = wait_for(lambda: (j := client.get(f"/v1/jobs/{job_id}").get_json())["status"]
                      == QUEUED and j)
    assert queued["lane"] == "long"
    # a fresh message: published once the record says queued again, so it may trail it
    wait_for(lambda: redis_client.llen("long") == 1)
    wait_for(lambda: borrower.stats().running == 0 and unacked(redis_client) == 0)
    stats = borrower.stats()
    assert (stats.reclaimed, stats.wasted_tokens) == (1, 3 + 1)

    redis_client.delete("short")  # own work done: it may borrow again, the same job
    engine.release.set()
    assert borrower.step() == job_id
    done = client.get(f"/v1/jobs/{job_id}?wait=10").get_json()
    assert done["status"] == SUCCEEDED
    assert done["result"]["text"] == "a" + "ab" and done["result"]["completion_tokens"] == 1 + 2
    (first_prompt, first_max, _), (prompt, max_tokens, _) = engine.calls
    assert prompt == first_prompt + "a" and max_tokens == first_max - 1
    deltas = [json.loads(f[b"data"])["text"] for _, f in redis_client.xrange(job_stream_key(job_id))
              if f[b"type"] == b"delta"]
    assert "".join(deltas) == "a" + "ab"  # one stream: paused, then continued


def test_a_stopping_worker_gives_its_borrowed_jobs_back(client, redis_client, borrower, engine):
    job_id = long_job(client)
    assert borrower.step() == job_id
    wait_for(lambda: engine.in_flight == 1)
    assert borrower.give_back(timeout_s=10)
    job = client.get(f"/v1/jobs/{job_id}").get_json()
    assert job["status"] == QUEUED and redis_client.llen("long") == 1
    assert unacked(redis_client) == 0
