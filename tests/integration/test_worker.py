"""A real Celery worker (threads pool, in a thread) against a real Redis, with no engine
started: expiry, worker liveness, rate-limit wiring, the job state machine's races."""

import time
from contextlib import contextmanager

import pytest
from celery.contrib.testing.worker import start_worker, test_worker_started
from waiting import wait_for

from tailguard import settings
from tailguard.jobs.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.worker import runtime as tailguard_worker
from tasks import app

pytestmark = pytest.mark.integration


@pytest.fixture
def run_worker(redis_client):
    """Start a real worker consuming `queues`; its engine only starts if a task needs it."""

    def _setup(sender=None, worker=None, consumer=None, **_):
        tailguard_worker.setup(app, worker.hostname,
                               [q.name for q in consumer.task_consumer.queues], eager_engine=False)

    test_worker_started.connect(_setup, weak=False)
    try:
        @contextmanager
        def run(queues):
            with start_worker(app, pool="threads", concurrency=2, queues=queues,
                              perform_ping_check=False, loglevel="WARNING",
                              hostname=f"test-{'-'.join(queues)}@localhost",
                              shutdown_timeout=30) as w:
                # test_worker_started is sent just after start_worker returns
                wait_for(lambda: tailguard_worker.attached(app) is not None)
                try:
                    yield w
                finally:
                    # the test worker stops cold, which sends no worker_shutdown
                    tailguard_worker.teardown(app)
        yield run
    finally:
        test_worker_started.disconnect(_setup)


def test_request_past_its_queue_ttl_expires_without_touching_the_engine(client, run_worker,
                                                                        redis_client):
    # batch.queue_ttl_s is 3 s in tests/lanes.test.toml; nobody consumes batch yet.
    job = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4, "priority": "batch"}).get_json()
    time.sleep(3.5)
    with run_worker(["long", "batch"]):
        runtime = tailguard_worker.WorkerRuntime.of(app)
        # the worker drops the message (Celery's `expires`) and records why
        wait_for(lambda: redis_client.llen("batch") == 0)
        body = client.get(f"/v1/jobs/{job['id']}?wait=10").get_json()
        assert body["status"] == "expired"
        assert body["error"]["code"] == "expired"
        assert runtime.engine is None  # never built, let alone started


def test_expiry_is_reported_even_with_no_worker_at_all(client):
    job = client.post("/v1/jobs", json={"prompt": "hi", "priority": "batch"}).get_json()
    body = client.get(f"/v1/jobs/{job['id']}?wait=5").get_json()
    assert body["status"] == "expired"
    assert body["timing"]["e2e_s"] >= 3.0


def test_healthz_is_200_once_every_lane_has_a_live_worker(client, run_worker):
    with run_worker(["short"]):
        wait_for(lambda: client.get("/healthz").get_json()["workers_per_lane"]["short"] == 1)
        body = client.get("/healthz").get_json()
        assert body["lanes_without_worker"] == ["long", "batch"]
    with run_worker(["long", "batch"]):
        # the short worker is gone: its heartbeat was withdrawn at shutdown
        body = wait_for(lambda: (r := client.get("/healthz").get_json())["workers_per_lane"]["long"]
                        and r)
        assert body["lanes_without_worker"] == ["short"]


def test_lane_rate_limit_is_applied_by_the_worker(run_worker):
    with run_worker(["long", "batch"]) as w:
        buckets = w.consumer.task_buckets
        assert buckets["tailguard.generate.long"].fill_rate == 50.0  # long: rate_limit "50/s"
        assert buckets["tailguard.generate.batch"] is None             # batch: no limit


def test_worker_refuses_a_short_plus_long_lane_group(run_worker):
    from tailguard.errors import ConfigError

    with pytest.raises(ConfigError, match="dedicated"):
        tailguard_worker.setup(app, "x@y", ["short", "long"], eager_engine=False)


def test_state_machine_a_late_success_never_overwrites_a_cancel(redis_client):
    store = JobStore(redis_client)
    job_id = "ab" * 16
    store.create(job_id, {"lane": "short", "deadline_s": 1}, queue_ttl_s=60)
    assert store.transition(job_id, {QUEUED}, RUNNING) == (True, QUEUED)
    assert store.transition(job_id, {QUEUED, RUNNING}, CANCELLED) == (True, RUNNING)
    assert store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {"text": "x"}}) == \
        (False, CANCELLED)
    job = store.get(job_id)
    assert job["status"] == CANCELLED and "result" not in job
    # a redelivered copy of the task cannot start it again either
    assert store.transition(job_id, {QUEUED}, RUNNING) == (False, CANCELLED)
    assert store.transition("cd" * 16, {QUEUED}, RUNNING) == (False, None)


def test_running_job_whose_worker_vanished_ends_failed(redis_client):
    store = JobStore(redis_client, worker_lost_grace_s=0.0)
    job_id = "ef" * 16
    store.create(job_id, {"lane": "long", "deadline_s": 0.2}, queue_ttl_s=60)
    store.transition(job_id, {QUEUED}, RUNNING, {"worker": "gone@host"})
    assert store.settle(job_id)["status"] == RUNNING  # not overdue yet
    time.sleep(0.3)
    job = store.settle(job_id)
    assert job["status"] == FAILED and job["error"]["code"] == "worker_lost"


def test_timestamps_come_from_one_clock(redis_client):
    store = JobStore(redis_client)
    job_id = "01" * 16
    submitted = store.create(job_id, {"lane": "short"}, queue_ttl_s=5)
    job = store.get(job_id)
    assert job["submitted_at"] == pytest.approx(submitted, abs=1e-6)
    assert job["expires_at"] == pytest.approx(submitted + 5, abs=1e-5)
    assert 0 < redis_client.ttl(f"tailguard:job:{job_id}") <= settings.JOB_TTL_S.default


def test_the_redelivery_pass_a_worker_runs_covers_every_lane_not_only_its_own(
        client, run_worker, redis_client, monkeypatch):
    """One lease, one process running the passes: whichever worker holds it looks for lost
    messages on every lane of the lanes table. Here a `short` worker finds the `long` job
    whose message vanished, and fails it as message_lost."""
    from tailguard.lanes.table import load_lanes

    monkeypatch.setenv(settings.REDELIVER_AFTER_S.env, "0")
    store = JobStore(redis_client)
    job_id = "cd" * 16
    store.create(job_id, {"lane": "long", "cost": 10}, queue_ttl_s=load_lanes()["long"].queue_ttl_s)
    # its message is nowhere: taken off the list by a connection that then dropped
    with run_worker(["short"]):
        wait_for(lambda: store.status(job_id) == FAILED, 30,
                 "the short worker's pass to fail the long job")
    assert store.get(job_id)["error"]["code"] == "message_lost"
