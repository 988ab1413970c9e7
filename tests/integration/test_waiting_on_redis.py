"""Long polls block on the announcement of their job's end (tailguard/jobs/finished.py JobEnds)
instead of reading the record every 50 ms, on a real Redis: the gateway's `wait` as the native
?wait= and the non-streamed OpenAI calls use it."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_for

from tailguard.jobs.finished import JobEnds
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter

pytestmark = pytest.mark.integration


@pytest.fixture
def gateway(api_app, client):
    from app.gateway_ext import get_gateway

    with api_app.app_context():
        return get_gateway()


def submit(client, **body) -> str:
    resp = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4, **body})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def calls(redis_client, command: str) -> int:
    return redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_a_long_poll_on_a_queued_job_reads_its_record_once_not_per_poll(gateway, client,
                                                                         redis_client):
    job_id = submit(client)  # short: queued for 120 s (tests/lanes.test.toml), nobody runs it
    before = calls(redis_client, "hgetall")
    job = gateway.wait(job_id, 1.5)
    assert job["status"] == QUEUED
    # the first read, and the last when the wait is up: the old 50 ms poll made ~30
    assert calls(redis_client, "hgetall") - before <= 2


def test_a_long_poll_returns_when_its_job_ends_with_the_text(gateway, client, redis_client):
    job_id = submit(client)
    got: list[dict] = []
    waiter = threading.Thread(target=lambda: got.append(gateway.wait(job_id, 60)), daemon=True)
    waiter.start()
    wait_for(lambda: gateway.ends.waiting() == 1, what="the long poll waiting")
    store = JobStore(redis_client)
    assert store.transition(job_id, {QUEUED}, RUNNING, {"worker": "short@test"})[0]
    writer = DeltaWriter(redis_client, job_id, flush_s=0)
    writer.add("done")
    writer.close()
    assert waiter.is_alive()  # running is not an end
    assert store.transition(job_id, {RUNNING}, SUCCEEDED, {
        "result": {"text": "done", "completion_tokens": 1, "finish_reason": "length"}})[0]
    waiter.join(20)  # woken by the announcement, long before its 60 s are up
    assert not waiter.is_alive()
    assert got[0]["status"] == SUCCEEDED and got[0]["result"]["text"] == "done"
    assert gateway.ends.waiting() == 0


def test_a_long_poll_settles_its_job_when_its_queue_ttl_passes(gateway, client):
    job_id = submit(client, priority="batch")  # batch: a 3 s queue TTL, no worker
    job = gateway.wait(job_id, 30)  # nothing announces an expiry: the wait reads it then
    assert job["status"] == "expired" and job["error"]["code"] == "expired"
    assert job["expired_at"] - job["submitted_at"] < 30


def test_a_client_that_went_away_cancels_its_job(gateway, client):
    job_id = submit(client)
    job = gateway.wait(job_id, 30, still_wanted=lambda: False)
    assert job["status"] == "cancelled" and job["error"]["code"] == "cancelled"


def test_only_the_ended_job_s_waiters_wake(redis_client):
    store = JobStore(redis_client)
    ended, other = "ab" * 16, "cd" * 16
    for job_id in (ended, other):
        store.create(job_id, {"lane": "short"}, queue_ttl_s=60)
    ends = JobEnds(redis_client, block_ms=100)
    try:
        with ends.watch(ended) as ended_event, ends.watch(other) as other_event:
            assert store.transition(ended, {QUEUED}, "cancelled", {"error": {"code": "cancelled"}})[0]
            assert ended_event.wait(10)
            assert not other_event.is_set()
    finally:
        ends.stop(timeout_s=5)
