"""A message a worker took and then lost with its broker connection goes back on its queue,
against a real Redis and kombu's own ack emulation (tailguard/jobs/redeliver.py).

The "lost" worker is a kombu consumer that takes the message without acking and is
never closed while the pass runs: exactly what a worker cut off from Redis leaves in
kombu's ``unacked`` hash.
"""

import pytest
from kombu import Queue

from tailguard.jobs.redeliver import Redeliverer
from tailguard.jobs.store import CANCELLED, QUEUED, JobStore
from tasks import app

pytestmark = pytest.mark.integration


@pytest.fixture
def taken(client, redis_client):
    """A job submitted through the API whose message a consumer took and never acked."""
    job_id = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4}).get_json()["id"]
    assert redis_client.llen("short") == 1
    conn = app.connection_for_write()
    message = Queue("short", channel=conn.default_channel).get(no_ack=False)
    assert message is not None and message.headers["id"] == job_id
    assert redis_client.llen("short") == 0 and redis_client.hlen("unacked") == 1
    yield job_id
    conn.release()


def test_a_lost_delivery_of_a_queued_job_goes_back_on_its_queue(taken, redis_client):
    store = JobStore(redis_client)
    assert Redeliverer(store, app.connection_for_write, after_s=0).run_once() == [taken]
    assert redis_client.hlen("unacked") == 0 and redis_client.zcard("unacked_index") == 0
    conn = app.connection_for_write()
    try:
        again = Queue("short", channel=conn.default_channel).get(no_ack=True)
    finally:
        conn.release()
    assert again.headers["id"] == taken and again.headers.get("redelivered") is True
    assert store.status(taken) == QUEUED


def test_a_recent_delivery_is_left_to_its_worker(taken, redis_client):
    assert Redeliverer(JobStore(redis_client), app.connection_for_write, after_s=3600).run_once() == []
    assert redis_client.hlen("unacked") == 1 and redis_client.llen("short") == 0


def test_a_finished_job_s_unacked_message_is_dropped_not_requeued(taken, redis_client):
    store = JobStore(redis_client)
    assert store.transition(taken, {QUEUED}, CANCELLED)[0]
    assert Redeliverer(store, app.connection_for_write, after_s=0).run_once() == []
    assert redis_client.hlen("unacked") == 0 and redis_client.llen("short") == 0


def test_a_delivery_whose_job_has_no_record_is_dropped(taken, redis_client):
    """Its record expired, or Redis lost it with its last writes in a crash: no worker would run
    the message, and it must not stay in ``unacked`` for ever."""
    from tailguard.redis import keys
    redis_client.delete(keys.job_key(taken))
    assert Redeliverer(JobStore(redis_client), app.connection_for_write, after_s=0).run_once() == []
    assert redis_client.hlen("unacked") == 0 and redis_client.zcard("unacked_index") == 0
    assert redis_client.llen("short") == 0


def test_a_queued_job_whose_message_vanished_fails_as_message_lost(client, redis_client):
    """A worker's BRPOP took the message and its connection dropped before kombu recorded the
    delivery: the job's message is nowhere. Two passes apart, it fails with a reason."""
    from tailguard.lanes.table import load_lanes

    lost = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4}).get_json()["id"]
    kept = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4}).get_json()["id"]
    redis_client.rpop("short")  # the oldest message: the first job's
    store = JobStore(redis_client)
    passes = Redeliverer(store, app.connection_for_write, after_s=0, lanes=load_lanes().lanes,
                         confirm_s=0)
    passes.run_once()  # found nowhere once: a suspect (it may be mid-delivery)
    assert store.status(lost) == QUEUED
    passes.run_once()
    job = client.get(f"/v1/jobs/{lost}").get_json()
    assert job["status"] == "failed" and job["error"]["code"] == "message_lost"
    assert store.status(kept) == QUEUED and redis_client.llen("short") == 1


def test_jobs_whose_messages_are_queued_or_delivered_are_never_failed(taken, client, redis_client):
    from tailguard.lanes.table import load_lanes

    waiting = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4}).get_json()["id"]
    store = JobStore(redis_client)
    passes = Redeliverer(store, app.connection_for_write, after_s=0, lanes=load_lanes().lanes,
                         confirm_s=0)
    assert passes.run_once() == [taken]  # the lost delivery goes back on the queue
    assert passes.run_once() == []
    assert store.status(taken) == QUEUED and store.status(waiting) == QUEUED
    assert redis_client.llen("short") == 2


def calls(redis_client, command: str) -> int:
    return redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_a_running_job_s_delivery_is_read_once_however_many_passes(taken, redis_client):
    """The message holds the prompt: a pass reads an old delivery's message once, then only its
    job's state, and never every delivery (kombu's whole unacked hash) each period."""
    from tailguard.jobs.store import RUNNING
    from tailguard.lanes.table import load_lanes

    store = JobStore(redis_client)
    assert store.transition(taken, {QUEUED}, RUNNING, {"worker": "short@host"})[0]
    passes = Redeliverer(store, app.connection_for_write, after_s=0, lanes=load_lanes().lanes,
                         confirm_s=0)
    hmget, hvals, hgetall = (calls(redis_client, c) for c in ("hmget", "hvals", "hgetall"))
    for _ in range(5):
        assert passes.run_once() == []
    assert calls(redis_client, "hmget") - hmget == 1
    assert calls(redis_client, "hvals") == hvals and calls(redis_client, "hgetall") == hgetall
    assert redis_client.hlen("unacked") == 1 and store.status(taken) == RUNNING


def test_one_process_at_a_time_runs_the_passes(taken, redis_client):
    import time

    store = JobStore(redis_client)
    first = Redeliverer(store, app.connection_for_write, after_s=3600, lease_s=0.3)
    second = Redeliverer(store, app.connection_for_write, after_s=0, lease_s=0.3)
    assert first.run_once() == [] and first.holds_lease()
    assert second.run_once() == []  # the lost delivery waits: the first holds the lease
    assert redis_client.hlen("unacked") == 1
    time.sleep(0.4)  # the first stopped passing (its process died): its lease lapses
    assert second.run_once() == [taken]
    assert not first.holds_lease()
    first.close()
    second.close()
