"""Admission against a real Redis: a lane's backlog and measured rate, 429 with Retry-After
when it is full or its wait too long, 202 with estimated_start_s otherwise, 503 while no
live worker serves it (a real threads worker makes it live)."""

import math
import tomllib

import pytest
from conftest import TEST_LANES
from test_observability import sample
from test_worker import run_worker  # noqa: F401 - the real threads worker fixture
from waiting import wait_for

from tailguard.errors import WaitTooLong
from tailguard.jobs.finished import FinishedConsumer
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration

PRIOR = 10.0  # output tokens/s per sequence, on the 4-sequence test lanes


def prior_rate(body: dict) -> float:
    """The lane's rate for an accepted request's shape while nothing is measured: 4 sequences,
    each prefilling its prompt (at the default 1,000 tokens/s) and decoding its output at PRIOR
    (tailguard/lanes/admission.py), so about 41 cost tokens/s for "hi" and 60 tokens out."""
    prompt, cost = body["prompt_tokens"], body["cost"]
    return 4 * cost / (prompt / 1000 + (cost - prompt) / PRIOR)


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
    """No worker runs (admitted anyway: the lane is judged as one worker's 4 slots at the prior):
    the first 4 requests each have a free slot; the n-th after them waits for the n-1 beyond
    the slots and for one slot to free, n requests' work at the prior's rate."""
    backlog, accepted = 0, []
    while True:
        resp = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60})
        if resp.status_code != 202:
            break
        body = resp.get_json()
        assert body["lane"] == "short"
        rate = prior_rate(body)
        expected = max(0, len(accepted) - 3) * body["cost"] / rate
        assert body["estimated_start_s"] == pytest.approx(expected, abs=1e-3)
        backlog += body["cost"]
        accepted.append(body["id"])
    cost = body["cost"]  # every request here costs the same
    assert resp.status_code == 429
    assert resp.get_json()["error"]["code"] == "wait_too_long"
    wait = (len(accepted) - 3) * cost / rate
    assert wait > 10 >= wait - cost / rate
    assert int(resp.headers["Retry-After"]) == -(-(wait - 10) // 1)
    assert int(redis_client.get(keys.lane_backlog_key("short"))) == backlog
    # a cancelled request leaves the backlog at once: there is room again
    assert api.delete(f"/v1/jobs/{accepted[0]}").status_code == 200
    assert int(redis_client.get(keys.lane_backlog_key("short"))) == backlog - cost
    assert api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}).status_code == 202


def test_requests_admitted_on_the_same_stale_backlog_cannot_all_enter(api, queue_app, redis_client):
    """A burst on many API threads: each reads the lane's load, then stores its job. Every
    read here sees the lane empty (as a burst's first requests do); the store applies the
    rule again in the same step, so the lane still stops at its promise."""
    from dataclasses import replace

    from app.gateway_ext import get_gateway

    with queue_app.app_context():
        gateway = get_gateway()
    real_load = gateway.load.load
    gateway.load.load = lambda lane, sharing=(): replace(
        real_load(lane, sharing), backlog_tokens=0, queued_jobs=0, running_jobs=0,
        sharing_jobs=0)  # stale reads
    try:
        codes, ahead = [], []
        for _ in range(40):
            resp = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60})
            codes.append(resp.status_code)
            if resp.status_code == 202:
                assert resp.get_json()["estimated_start_s"] == 0.0  # what the stale read said
                ahead.append(len(ahead))
                cost, prompt_tokens = resp.get_json()["cost"], resp.get_json()["prompt_tokens"]
            else:
                assert resp.status_code == 429, resp.get_json()
                assert resp.get_json()["error"]["code"] == "wait_too_long"
                assert int(resp.headers["Retry-After"]) >= 1
    finally:
        gateway.load.load = real_load
    # short promises 10 s at the prior's rate on 4 slots: a job may have 4 ahead (the slots) and
    # then as many as leave its wait (one request's work each) within 10 s of that rate
    # (without the second check all 40 were accepted on the stale reads)
    rate = prior_rate({"prompt_tokens": prompt_tokens, "cost": cost})
    assert 429 in codes and len(ahead) == 4 + int(10 * rate) // cost
    assert int(redis_client.get(keys.lane_backlog_key("short"))) == len(ahead) * cost


def test_a_full_lane_is_a_429_with_retry_after_in_both_apis(api, tiny_model):
    long_job = {"prompt": "hi", "max_tokens": 1500}
    first = api.post("/v1/jobs", json=long_job)
    assert first.status_code == 202 and first.get_json()["lane"] == "long"
    cost = first.get_json()["cost"]
    resp = api.post("/v1/jobs", json=long_job)
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "lane_full"
    assert int(resp.headers["Retry-After"]) == math.ceil((2 * cost - 2048) / prior_rate(first.get_json()))
    resp = api.post("/v1/completions", json={"model": tiny_model, **long_job})
    assert resp.status_code == 429 and int(resp.headers["Retry-After"]) >= 1
    assert resp.get_json()["error"]["code"] == "lane_full"
    assert resp.get_json()["error"]["type"] == "rate_limit_error"
    metrics = api.get("/metrics").get_data(as_text=True)
    assert sample(metrics, "tailguard_requests_refused_total", code="lane_full", lane="long") >= 2


def test_refusals_are_in_tailguard_stats(api, redis_client):
    from tailguard.observe.stats import StatsStore

    api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1500})
    assert api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1500}).status_code == 429
    now = redis_client.time()[0]
    window = StatsStore(redis_client).window(["short", "long"], now - 60, now)
    assert window.lanes["long"].refused == {"lane_full": 1}
    assert "long lane_full 1" in window.render()


def test_a_job_whose_queue_ttl_lapsed_leaves_the_backlog_unsettled(redis_client):
    from tailguard.jobs.lane_load import LaneLoadStore

    store = JobStore(redis_client)
    store.create("ab" * 16, {"lane": "batch", "cost": 100}, queue_ttl_s=0.2)
    loads = LaneLoadStore(redis_client)
    assert loads.load("batch").backlog_tokens == 100
    wait_for(lambda: loads.load("batch").backlog_tokens == 0)
    # the job itself is settled later (when read, or by a worker): it is not counted twice
    assert store.transition("ab" * 16, {QUEUED}, RUNNING)[0]
    assert loads.load("batch").backlog_tokens == 0


def test_service_rate_is_measured_from_finished_requests(api, redis_client, queue_app):
    from app.gateway_ext import get_gateway

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
    # and the engine time they ran (started -> succeeded here: a millisecond each at least)
    assert 0.003 <= load.served_engine_s < 5
    rate = gw.admission.service_rate(gw.lanes["short"], load)
    assert rate == pytest.approx(load.served_tokens / load.served_engine_s * gw.admission.slots(
        gw.lanes["short"], load))


def test_no_live_worker_is_a_503_until_a_real_worker_serves_the_lane(
        tiny_model, redis_server, lanes_file, redis_client, run_worker):  # noqa: F811
    app = make_app(tiny_model, redis_server, lanes_file)
    api = app.test_client()
    resp = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1500})
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "no_live_worker"
    resp = api.post("/v1/completions", json={"model": tiny_model, "prompt": "hi"})
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "no_live_worker"
    with app.app_context():
        from app.gateway_ext import get_gateway

        gw = get_gateway()
    with run_worker(["long", "batch"]):
        # submitting would make this engine-less worker start its engine: ask admission itself
        load = wait_for(lambda: (l := gw.load.load("long")).live_workers == 1 and l)
        assert gw.admission.admit(gw.lanes["long"], load, 1502) == 0.0
    metrics = api.get("/metrics").get_data(as_text=True)
    assert sample(metrics, "tailguard_requests_refused_total",
                  code="no_live_worker", lane="long") == 1


WORKER = "short@test-host"  # a worker serving the short lane, by its heartbeat alone


@pytest.fixture
def short_worker(redis_client):
    """The short lane served by one live worker (4 slots), as its heartbeat says."""
    from tailguard.jobs.liveness import Liveness

    Liveness(redis_client).heartbeat(["short"], WORKER, ttl_s=60)
    return WORKER


@pytest.fixture(scope="module")
def tight_app(tiny_model, redis_server, tmp_path_factory):
    """The test lanes with a 0.1 s promise on short (4 slots; one queued request's work,
    at the prior 40 tokens/s, is already past it)."""
    text = TEST_LANES.read_text().replace("dedicated = true", "dedicated = true\nmax_wait_s = 0.1", 1)
    path = tmp_path_factory.mktemp("tight") / "lanes.toml"
    path.write_text(text)
    return make_app(tiny_model, redis_server, path)


def test_a_tight_promise_admits_requests_arriving_together_while_slots_are_free(
        tight_app, redis_client, short_worker):
    """The documented load on an idle lane: requests that arrive together, each still queued
    when the next comes, are admitted while a free slot is left for each (backlog / rate
    alone refused the second); a burst gets exactly the free slots, race or not."""
    from concurrent.futures import ThreadPoolExecutor

    api = tight_app.test_client()
    short = {"prompt": "hi", "max_tokens": 60}
    first, second = (api.post("/v1/jobs", json=short) for _ in range(2))
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.get_json()["estimated_start_s"] == second.get_json()["estimated_start_s"] == 0.0
    store = JobStore(redis_client)
    # both start on the lane's worker: 2 of its 4 slots busy, 2 free, nothing queued
    for resp in (first, second):
        assert store.transition(resp.get_json()["id"], {QUEUED}, RUNNING, {"worker": short_worker})[0]
    with ThreadPoolExecutor(8) as pool:  # 8 together on many API threads, for 2 free slots
        burst = list(pool.map(lambda _: api.post("/v1/jobs", json=short), range(8)))
    assert sorted(r.status_code for r in burst) == [202] * 2 + [429] * 6
    refused = [r for r in burst if r.status_code == 429]
    assert {r.get_json()["error"]["code"] for r in refused} == {"wait_too_long"}
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    # beyond the free slots: refused until a running request ends and frees one
    assert api.post("/v1/jobs", json=short).status_code == 429
    store.transition(first.get_json()["id"], {RUNNING}, SUCCEEDED, {"completion_tokens": 60})
    assert api.post("/v1/jobs", json=short).status_code == 202
    assert api.post("/v1/jobs", json=short).status_code == 429


def test_the_slots_in_use_follow_the_jobs_own_workers_run_and_cannot_drift(
        redis_client, short_worker):
    """A job takes a slot of its lane while it runs on a worker serving the lane, and gives it
    back in the same step as it stops running, whichever way; a borrowed job (run by another
    lane's worker) takes none; a job whose record vanished lapses with its deadline."""
    from tailguard.jobs.lane_load import LaneLoadStore
    from tailguard.jobs.store import CANCELLED, FAILED

    store, loads = JobStore(redis_client, worker_lost_grace_s=0.0), LaneLoadStore(redis_client)
    jobs = [f"{i:032x}" for i in range(1, 8)]
    for job in jobs:
        store.create(job, {"lane": "short", "cost": 10, "deadline_s": 30}, queue_ttl_s=60)

    def running() -> int:
        return loads.load("short").running_jobs

    def run(job: str, worker: str = short_worker) -> None:
        assert store.transition(job, {QUEUED}, RUNNING, {"worker": worker})[0]

    run(jobs[0])
    run(jobs[1], worker="long@test-host")  # borrowed: runs in the long worker's engine
    assert (running(), loads.load("short").queued_jobs) == (1, 5)
    assert store.transition(jobs[0], {RUNNING}, RUNNING, {"engine_deaths": 1})[0]  # run again
    for job in jobs[2:4]:
        run(job)
    assert running() == 3
    store.transition(jobs[2], {RUNNING}, FAILED, {"error": {"code": "worker_lost"}})  # reaped
    store.transition(jobs[3], {QUEUED, RUNNING}, CANCELLED)  # DELETE
    store.transition(jobs[1], {RUNNING}, SUCCEEDED)  # the borrowed one ends: nothing to give
    assert running() == 1
    store.transition(jobs[0], {RUNNING}, SUCCEEDED)
    assert running() == 0
    # a running job whose record vanished (nothing can end it) lapses past its deadline
    store.create(jobs[5], {"lane": "short", "cost": 10, "deadline_s": 0.2}, queue_ttl_s=60)
    run(jobs[5])
    redis_client.delete(keys.job_key(jobs[5]))
    assert running() == 1
    wait_for(lambda: running() == 0, timeout=5)


@pytest.mark.parametrize("promise_s", [0.1, 3.0])
def test_the_store_applies_the_rule_admission_decided_with(redis_client, promise_s):
    """For every lane state (queued, running) the Lua step stores a job exactly when the pure
    policy admits it on the same figures: the race fix keeps the slot rule."""
    from tailguard.jobs.lane_load import LaneLoadStore
    from tailguard.jobs.liveness import Liveness
    from tailguard.jobs.store import BacklogMoved
    from tailguard.lanes.admission import AdmissionPolicy
    from tailguard.lanes.table import Lane

    # 4 slots at 40 tokens/s; 3 s is 120 tokens of work: one request of 50 beyond the slots
    policy, store, loads = AdmissionPolicy(prior_tokens_per_s=10.0), JobStore(redis_client), \
        LaneLoadStore(redis_client)
    ids = (f"{i:032x}" for i in range(1, 10_000))
    for queued in range(7):
        for running in range(6):
            lane = Lane(name=f"l{queued}{running}", max_tokens=64, max_num_seqs=4,
                        queue_ttl_s=60, max_wait_s=promise_s)
            Liveness(redis_client).heartbeat([lane.name], WORKER, ttl_s=60)
            fields = {"lane": lane.name, "cost": 50, "deadline_s": 30}
            for _ in range(running):
                job = next(ids)
                store.create(job, fields, queue_ttl_s=60)
                store.transition(job, {QUEUED}, RUNNING, {"worker": WORKER})
            for _ in range(queued):
                store.create(next(ids), fields, queue_ttl_s=60)
            load = loads.load(lane.name)
            assert (load.queued_jobs, load.running_jobs) == (queued, running)
            try:
                policy.admit(lane, load, 50)
                admitted = True
            except WaitTooLong:
                admitted = False
            try:
                store.create(next(ids), fields, queue_ttl_s=60, limits=policy.limits(lane, load))
                stored = True
            except BacklogMoved as moved:
                assert moved.moved(load) == load
                stored = False
            assert stored == admitted, (queued, running)
            assert admitted == (queued < 4 - running or (
                promise_s == 3.0 and queued - max(0, 4 - running) <= 1))


def test_a_ttft_target_the_lane_already_misses_is_refused_before_queueing(api, redis_client):
    """No worker runs; batch is the one lane of its class: the first 4 requests each have a
    slot (no wait), the 5th waits for one request's work at 40 tokens/s. A target that wait
    meets is queued and says so; one it misses is a 429 wait_past_target with the predicted
    wait, and nothing is queued."""
    batch = {"prompt": "hi", "max_tokens": 60, "priority": "batch"}
    target = {"x-llm-d-slo-ttft-ms": "50", "x-llm-d-slo-tpot-ms": "30"}
    first = api.post("/v1/jobs", json=batch, headers=target)
    assert first.status_code == 202, first.get_json()
    assert first.get_json()["latency_target"] == {"ttft_ms": 50, "tpot_ms": 30,
                                                  "asked_ttft_ms": 50, "asked_tpot_ms": 30,
                                                  "clamped": False}
    job = api.get(f"/v1/jobs/{first.get_json()['id']}").get_json()
    assert job["latency_target"] == {"ttft_ms": 50, "tpot_ms": 30, "ttft_met": None,
                                     "tpot_met": None}  # not started yet: not known
    for _ in range(3):
        assert api.post("/v1/jobs", json=batch).status_code == 202
    backlog = int(redis_client.get(keys.lane_backlog_key("batch")))
    missed = api.post("/v1/jobs", json=batch,
                      headers={"x-slo-ttft-ms": "50"})  # the alias
    assert missed.status_code == 429
    error = missed.get_json()["error"]
    assert error["code"] == "wait_past_target" and "past its time-to-first-token target of " \
        "50 ms" in error["message"]
    assert int(missed.headers["Retry-After"]) >= 1
    assert int(redis_client.get(keys.lane_backlog_key("batch"))) == backlog  # nothing queued
    plain = api.post("/v1/jobs", json=batch)
    assert plain.status_code == 202 and "latency_target" not in plain.get_json()
    bad = api.post("/v1/jobs", json={"prompt": "hi"}, headers={"x-llm-d-slo-ttft-ms": "soon"})
    assert bad.status_code == 400 and bad.get_json()["error"]["field"] == "x-llm-d-slo-ttft-ms"


def test_a_ttft_target_short_misses_and_long_meets_is_placed_on_long(api, redis_client):
    """Short's 4 slots are taken and one more is queued: a request there waits for one
    request's work (~1.5 s at 40 tokens/s). A 1,000 ms target goes to the idle long lane,
    which meets it; without a target the request stays on short, as ever."""
    for _ in range(5):
        assert api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}).get_json()["lane"] \
            == "short"
    plain = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}).get_json()
    assert plain["lane"] == "short" and plain["estimated_start_s"] > 1.0
    moved = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60},
                     headers={"x-llm-d-slo-ttft-ms": "1000"})
    assert moved.status_code == 202 and moved.get_json()["lane"] == "long"
    assert moved.get_json()["estimated_start_s"] <= 1.0
    roomy = api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60},
                     headers={"x-llm-d-slo-ttft-ms": "60000"})  # short meets it: short
    assert roomy.get_json()["lane"] == "short"


def test_the_lanes_after_a_lane_and_the_cut_limits_take_its_free_slots(redis_client):
    """An engine's limit for its first lane counts the jobs of the lanes after it, and the
    engine on the front end's cores advertises a cut limit: admission reads both from Redis,
    and the store's step counts the same (a long job running takes a short slot)."""
    from tailguard.jobs.lane_load import LaneLoadStore
    from tailguard.jobs.liveness import Liveness
    from tailguard.jobs.store import BacklogMoved
    from tailguard.lanes.admission import AdmissionPolicy
    from tailguard.lanes.table import Lane

    first, after = "sh-first", "sh-after"
    lane = Lane(name=first, max_tokens=64, max_num_seqs=4, queue_ttl_s=60, max_wait_s=0.1)
    live = Liveness(redis_client)
    live.heartbeat([first, after], "fast@test-host", ttl_s=60, slots={first: 4, after: 2})
    live.heartbeat([first, after], "front@test-host", ttl_s=60, slots={first: 1, after: 1})
    store, loads = JobStore(redis_client), LaneLoadStore(redis_client)
    policy = AdmissionPolicy(prior_tokens_per_s=10.0)
    ids = (f"{i:032x}" for i in range(50_000, 60_000))
    for worker in ("fast@test-host", "fast@test-host", "front@test-host"):
        job = next(ids)
        store.create(job, {"lane": after, "cost": 500, "deadline_s": 30}, queue_ttl_s=60)
        assert store.transition(job, {QUEUED}, RUNNING, {"worker": worker})[0]
    fields = {"lane": first, "cost": 50, "deadline_s": 30}
    assert loads.load(first).worker_slots == 5 and loads.load(first).sharing_jobs == 0
    load = loads.load(first, sharing=[after])
    assert (load.worker_slots, load.advertising_workers, load.running_jobs,
            load.sharing_jobs) == (5, 2, 0, 3)
    # 5 slots, 3 taken by the lane after it: two requests start at once, the third waits
    for expected in (True, True, False):
        load = loads.load(first, sharing=[after])
        try:
            policy.admit(lane, load, 50)
            admitted = True
        except WaitTooLong:
            admitted = False
        assert admitted == expected
        try:
            store.create(next(ids), fields, queue_ttl_s=60,
                         limits=policy.limits(lane, load, (after,)))
            stored = True
        except BacklogMoved as moved:
            assert moved.moved(load) == load
            stored = False
        assert stored == admitted
