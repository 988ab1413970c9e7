"""Keys on the whole system: the API in keys mode (`keys_app`, in process) in front of the
session's real workers and engines (tests/e2e_fixtures.py).

* The Batch API with the official `openai` SDK (through httpx's WSGI transport to the same
  app): another key's file and batch are 404s, as OpenAI answers them (issue 34).
* Latency targets (issue 35): a TTFT target the lane's predicted wait already misses is refused
  before queueing (429 `wait_past_target`, Retry-After); one the lane can meet is served and
  its job says it was met; a key's out-of-bounds target is clamped, and the 202 says so.
"""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
import pytest
import redis

from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.redis import keys

pytestmark = pytest.mark.e2e

MODEL = "tailguard-demo"
TTFT = "x-llm-d-slo-ttft-ms"
#: the bounded key's TTFT targets: a tighter one is raised to the minimum
MIN_TTFT_MS, MAX_TTFT_MS = 200, 120_000


@pytest.fixture(scope="module")
def secrets(keys_app, redis_server):
    client = redis.Redis.from_url(redis_server)
    store = ApiKeyStore(client)
    names = ("e2e-a", "e2e-b", "e2e-bounded")
    for name in names:
        store.revoke(name)  # left by an earlier run on a kept Redis
    made = {"a": store.add(ApiKey("e2e-a")), "b": store.add(ApiKey("e2e-b")),
            "bounded": store.add(ApiKey("e2e-bounded", min_ttft_ms=MIN_TTFT_MS,
                                        max_ttft_ms=MAX_TTFT_MS))}
    yield made
    for name in names:
        store.revoke(name)
    client.close()


@pytest.fixture(scope="module")
def feeder(keys_app):
    """The app's batch feeder, running as in an API process (app/gunicorn_hooks.py starts it):
    a test client starts none, and the batch test must not lean on another test's process."""
    from app.gateway_ext import _batches

    with keys_app.app_context():
        running = _batches(keys_app)[1]
    running.start()
    yield running
    running.close()


@pytest.fixture(scope="module")
def http(keys_app, workers):
    return keys_app.test_client()


def sdk(keys_app, secret: str) -> openai.OpenAI:
    transport = httpx.WSGITransport(app=keys_app)
    return openai.OpenAI(base_url="http://tailguard.test/v1", api_key=secret, max_retries=0,
                         http_client=httpx.Client(transport=transport))


def auth(secret: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}", **headers}


def test_another_keys_file_and_batch_are_404s_to_the_sdk(keys_app, secrets, workers, feeder):
    a, b = sdk(keys_app, secrets["a"]), sdk(keys_app, secrets["b"])
    line = {"custom_id": "only", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": "hi", "max_tokens": 2}}
    source = a.files.create(file=("in.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                            purpose="batch")
    batch = a.batches.create(input_file_id=source.id, endpoint="/v1/completions",
                             completion_window="24h")
    try:
        for call in (lambda: b.files.retrieve(source.id), lambda: b.files.content(source.id),
                     lambda: b.files.delete(source.id), lambda: b.batches.retrieve(batch.id),
                     lambda: b.batches.cancel(batch.id)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert batch.id not in [x.id for x in b.batches.list()]
        assert source.id not in [f.id for f in b.files.list()]
        assert a.batches.retrieve(batch.id).input_file_id == source.id  # still A's, untouched
        assert a.files.content(source.id).text.strip() == json.dumps(line)
    finally:
        a.batches.cancel(batch.id)
        # a file a batch still reads cannot be deleted (409): once it has ended, it can
        for _ in range(300):  # its line, queued or running, ends first
            if a.batches.retrieve(batch.id).status in ("cancelled", "completed", "failed"):
                break
            time.sleep(0.1)
        a.files.delete(source.id)  # stored under the checkout's state directory


def wait_job(http, secret: str, job_id: str) -> dict:
    for _ in range(60):
        job = http.get(f"/v1/jobs/{job_id}?wait=5", headers=auth(secret)).get_json()
        if job["status"] not in ("queued", "running"):
            return job
    raise AssertionError(f"job {job_id} still {job['status']}")


def test_a_target_the_lane_meets_is_served_and_reported_met(http, secrets):
    resp = http.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4},
                     headers=auth(secrets["a"], **{TTFT: "60000"}))
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["latency_target"] == {
        "ttft_ms": 60000, "tpot_ms": None, "asked_ttft_ms": 60000, "asked_tpot_ms": None,
        "clamped": False}
    job = wait_job(http, secrets["a"], resp.get_json()["id"])
    assert job["status"] == "succeeded", job
    assert job["latency_target"]["ttft_met"] is True and job["latency_target"]["ttft_ms"] == 60000


def test_a_keys_out_of_bounds_target_is_clamped_and_said_so(http, secrets):
    resp = http.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4},
                     headers=auth(secrets["bounded"], **{TTFT: "50"}))
    assert resp.status_code == 202, resp.get_json()
    target = resp.get_json()["latency_target"]
    assert (target["ttft_ms"], target["asked_ttft_ms"], target["clamped"]) == (MIN_TTFT_MS, 50,
                                                                               True)
    loose = http.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4},
                      headers=auth(secrets["bounded"], **{"x-slo-ttft-ms": "86400000"}))
    assert loose.get_json()["latency_target"]["ttft_ms"] == MAX_TTFT_MS  # the alias, lowered
    for r in (resp, loose):
        assert wait_job(http, secrets["bounded"], r.get_json()["id"])["status"] == "succeeded"


def jobs(client) -> int:
    """Job records in Redis (their token streams, made as jobs run, left out)."""
    return sum(1 for k in client.scan_iter(f"{keys.PREFIX}:job:*", count=1000)
               if not k.endswith(b":stream"))


def test_a_target_the_lanes_wait_already_misses_is_refused_before_queueing(http, secrets,
                                                                             redis_client_noflush):
    """The long lane filled with its longest jobs until a job waits for a slot (more than its
    worker's slots queued, the predicted start past half a second): a 50 ms target cannot be met
    on it, and no other lane takes a request of its cost, so it is refused at once; nothing of
    it is queued. (The long lane, not batch: batch's 1 s deadline and 3 s queue TTL in the
    suite's lanes drain its fillers while the test runs on a loaded machine.)"""
    filler = {"prompt": "fill", "max_tokens": 1500, "ignore_eos": True}
    ids: list[str] = []
    try:
        estimated_start_s = 0.0
        while estimated_start_s < 0.5:
            assert len(ids) < 64, "the long lane never predicted a wait"
            resp = http.post("/v1/jobs", json=filler, headers=auth(secrets["a"]))
            assert resp.status_code == 202, resp.get_json()
            ids.append(resp.get_json()["id"])
            estimated_start_s = resp.get_json()["estimated_start_s"]
        jobs_before = jobs(redis_client_noflush)
        missed = http.post("/v1/jobs", json={**filler, "max_tokens": 300},  # past short's cost
                           headers=auth(secrets["a"], **{TTFT: "50"}))
        assert missed.status_code == 429, missed.get_json()
        error = missed.get_json()["error"]
        assert error["code"] == "wait_past_target" and "past its time-to-first-token target of " \
            "50 ms" in error["message"], error
        assert int(missed.headers["Retry-After"]) >= 1
        assert jobs(redis_client_noflush) == jobs_before  # refused before queueing: no job made
    finally:
        for job_id in ids:  # leave the session's workers idle for the next test
            http.delete(f"/v1/jobs/{job_id}", headers=auth(secrets["a"]))
