"""Admission against a real Redis: a lane's backlog and measured rate, 429 with Retry-After
when it is full or its wait too long, 202 with estimated_start_s otherwise, 503 while no
live worker serves it (a real threads worker makes it live)."""

import tomllib

import pytest

from conftest import TEST_LANES
from tailguard import keys
from tailguard.finished import FinishedConsumer
from tailguard.jobs import QUEUED, RUNNING, SUCCEEDED, JobStore
from test_observability import sample
from test_worker import run_worker  # noqa: F401 - the real threads worker fixture
from waiting import wait_for

pytestmark = pytest.mark.integration

PRIOR = 10.0  # tokens/s per sequence: 40 tokens/s on the 4-sequence test lanes


@pytest.fixture(scope="module")
def lanes_file(tmp_path_factory):
    """The test lanes, short promising 10 s, long bounded at 2,048 backlog tokens."""
    text = TEST_LANES.read_text()
    text = text.replace("dedicated = true", "dedicated = true\nmax_wait_s = 10", 1)
    text = text.replace('rate_limit = "50/s"', 'rate_limit = "50/s"\nmax_backlog_tokens = 2048', 1)
    path = tmp_path_factory.mktemp("lanes") / "lanes.toml"
    path.write_text(text)
    assert tomllib.loads(text)["lanes"]["long"]["max_backlog_tokens"] == 2048
    return path


def make_app(tiny_model, redis_server, lanes_file, **config):
    from app import create_app

    return create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                       "TAILGUARD_REDIS_URL": redis_server, "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_REAP_RUNNING": False, "TAILGUARD_LANES": str(lanes_file), "TAILGUARD_PRIOR_TOKENS_PER_S": PRIOR,
                       **config})


@pytest.fixture(scope="module")
def queue_app(tiny_model, redis_server, lanes_file):
    """No worker runs: accepted requests stay queued, so the backlog is what the test put there."""
    return make_app(tiny_model, redis_server, lanes_file, TAILGUARD_ADMIT_WITHOUT_WORKER=True)


@pytest.fixture
def api(queue_app, redis_client):
    return queue_app.test_client()


def test_202_carries_the_predicted_start_until_the_wait_passes_the_promise(api, redis_client):
    backlog, accepted = 0, []
    while True:
        resp = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60})
        if resp.status_code != 202:
            break
        body = resp.get_json()
        assert body["lane"] == "short"
        assert body["estimated_start_s"] == pytest.approx(backlog / 40.0, abs=1e-3)
        backlog += body["cost"]
        accepted.append(body["id"])
    assert resp.status_code == 429
    assert resp.get_json()["error"]["code"] == "wait_too_long"
    assert backlog / 40.0 > 10 >= (backlog - body["cost"]) / 40.0
    assert int(resp.headers["Retry-After"]) == -(-(backlog / 40.0 - 10) // 1)
    assert int(redis_client.get(keys.lane_backlog_key("short"))) == backlog
    # a cancelled request leaves the backlog at once: there is room again
    assert api.delete(f"/v1/jobs/{accepted[0]}").status_code == 200
    assert int(redis_client.get(keys.lane_backlog_key("short"))) == backlog - body["cost"]
    assert api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}).status_code == 202


def test_requests_admitted_on_the_same_stale_backlog_cannot_all_enter(api, queue_app, redis_client):
    """A burst on many API threads: each reads the lane's backlog, then stores its job. Every
    read here sees the lane empty (as a burst's first requests do); the store checks the
    backlog again in the same step, so the lane still stops at its promise."""
    from dataclasses import replace

    from app import get_gateway

    with queue_app.app_context():
        gateway = get_gateway()
    real_load = gateway.load.load
    gateway.load.load = lambda lane: replace(real_load(lane), backlog_tokens=0)  # stale reads
    try:
        codes, backlog, ahead = [], 0, []
        for _ in range(40):
            resp = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60})
            codes.append(resp.status_code)
            if resp.status_code == 202:
                assert resp.get_json()["estimated_start_s"] == 0.0  # what the stale read said
                ahead.append(backlog)
                backlog += resp.get_json()["cost"]
            else:
                assert backlog > 400
                assert resp.status_code == 429, resp.get_json()
                assert resp.get_json()["error"]["code"] == "wait_too_long"
                assert int(resp.headers["Retry-After"]) >= 1
    finally:
        gateway.load.load = real_load
    # short promises 10 s at 40 tokens/s: at most 400 tokens may be ahead of an accepted job
    # (without the second check all 40 were accepted on the stale reads)
    assert 429 in codes and max(ahead) <= 400
    assert int(redis_client.get(keys.lane_backlog_key("short"))) == backlog


def test_a_full_lane_is_a_429_with_retry_after_in_both_apis(api, tiny_model):
    long_job = {"prompt": "hi", "max_tokens": 1500}
    first = api.post("/v1/jobs", json=long_job)
    assert first.status_code == 202 and first.get_json()["lane"] == "long"
    cost = first.get_json()["cost"]
    resp = api.post("/v1/jobs", json=long_job)
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "lane_full"
    assert int(resp.headers["Retry-After"]) == -(-(2 * cost - 2048) // 40)
    resp = api.post("/v1/completions", json={"model": tiny_model, **long_job})
    assert resp.status_code == 429 and int(resp.headers["Retry-After"]) >= 1
    assert resp.get_json()["error"]["code"] == "lane_full"
    assert resp.get_json()["error"]["type"] == "rate_limit_error"
    metrics = api.get("/metrics").get_data(as_text=True)
    assert sample(metrics, "tailguard_requests_refused_total", code="lane_full", lane="long") >= 2


def test_refusals_are_in_tailguard_stats(api, redis_client):
    from tailguard.stats import StatsStore

    api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1500})
    assert api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1500}).status_code == 429
    now = redis_client.time()[0]
    window = StatsStore(redis_client).window(["short", "long"], now - 60, now)
    assert window.lanes["long"].refused == {"lane_full": 1}
    assert "long lane_full 1" in window.render()


def test_a_job_whose_queue_ttl_lapsed_leaves_the_backlog_unsettled(redis_client):
    from tailguard.laneload import LaneLoadStore

    store = JobStore(redis_client)
    store.create("ab" * 16, {"lane": "batch", "cost": 100}, queue_ttl_s=0.2)
    loads = LaneLoadStore(redis_client)
    assert loads.load("batch").backlog_tokens == 100
    wait_for(lambda: loads.load("batch").backlog_tokens == 0)
    # the job itself is settled later (when read, or by a worker): it is not counted twice
    assert store.transition("ab" * 16, {QUEUED}, RUNNING)[0]
    assert loads.load("batch").backlog_tokens == 0


def test_service_rate_is_measured_from_finished_requests(api, redis_client, queue_app):
    from app import get_gateway

    with queue_app.app_context():
        gw = get_gateway()
    ids = [api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}).get_json() for _ in range(3)]
    store = JobStore(redis_client)
    for job in ids:
        store.transition(job["id"], {QUEUED}, RUNNING)
        store.transition(job["id"], {RUNNING}, SUCCEEDED, {"completion_tokens": 60})
    assert gw.load.load("short").served_tokens == 0  # not until the finished stream is read
    FinishedConsumer(redis_client, [gw.load.record]).run_once()
    load = gw.load.load("short")
    assert load.backlog_tokens == 0
    assert load.served_tokens == sum(job["cost"] for job in ids)


def test_no_live_worker_is_a_503_until_a_real_worker_serves_the_lane(
        tiny_model, redis_server, lanes_file, redis_client, run_worker):  # noqa: F811
    app = make_app(tiny_model, redis_server, lanes_file)
    api = app.test_client()
    resp = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1500})
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "no_live_worker"
    resp = api.post("/v1/completions", json={"model": tiny_model, "prompt": "hi"})
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "no_live_worker"
    with app.app_context():
        from app import get_gateway

        gw = get_gateway()
    with run_worker(["long", "batch"]):
        # submitting would make this engine-less worker start its engine: ask admission itself
        load = wait_for(lambda: (l := gw.load.load("long")).live_workers == 1 and l)
        assert gw.admission.admit(gw.lanes["long"], load, 1502) == 0.0
    metrics = api.get("/metrics").get_data(as_text=True)
    assert sample(metrics, "tailguard_requests_refused_total",
                  code="no_live_worker", lane="long") == 1
