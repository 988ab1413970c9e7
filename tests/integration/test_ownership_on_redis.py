"""A job belongs to the key that made it (issue 22): any other key gets the 404 an unknown id
gets, on every route that takes a job id, for jobs made through the native and the OpenAI
routes alike; an admin key sees and cancels them; revoking every key leaves /v1/ answering
401. Keys mode on a real Redis, no worker: jobs stay queued where the test can see them."""

import pytest

from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.jobs.store import CANCELLED, QUEUED, JobStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration

UNKNOWN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def team(redis_client):
    store = ApiKeyStore(redis_client)
    made = {name: store.add(ApiKey(name, admin=name == "ops")) for name in ("a", "b", "ops")}
    yield {name: {"Authorization": f"Bearer {key}"} for name, key in made.items()}
    redis_client.delete(keys.API_KEYS)


def reads(job_id):
    """Every route that names a job: (method, path)."""
    return [("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}?wait=0.2"),
            ("GET", f"/v1/jobs/{job_id}/stream"),
            ("GET", f"/v1/jobs/{job_id}/stream?cancel_on_disconnect=true"),
            ("DELETE", f"/v1/jobs/{job_id}")]


def call(client, method, path, headers):
    with client.open(path, method=method, headers=headers) as resp:
        return resp.status_code, resp.get_json() if resp.is_json else None


def openai_job(client, headers, model):
    """A job made through the OpenAI route (streamed, so the call returns while it is queued),
    and the still-open response holding it."""
    resp = client.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4,
                                                "stream": True}, headers=headers, buffered=False)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.headers["X-Tailguard-Job-Id"], resp


def test_another_keys_job_is_a_404_exactly_like_an_unknown_id(keys_client, team, redis_client,
                                                              tiny_model):
    native = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=team["a"]).get_json()["id"]
    via_openai, open_stream = openai_job(keys_client, team["a"], tiny_model)
    try:
        for job_id in (native, via_openai):
            for method, path in reads(job_id):
                status, body = call(keys_client, method, path, team["b"])
                unknown = call(keys_client, method, path.replace(job_id, UNKNOWN), team["b"])
                assert status == 404, (method, path, body)
                # the same answer as for an id that never existed: nothing says it does
                assert body["error"] == {**unknown[1]["error"],
                                         "message": unknown[1]["error"]["message"].replace(
                                             UNKNOWN, job_id)}, (method, path)
            # none of B's calls touched it (no cancel, no cancel_on_disconnect)
            assert JobStore(redis_client).get(job_id)["status"] == QUEUED
            # its owner sees it
            assert call(keys_client, "GET", f"/v1/jobs/{job_id}", team["a"])[0] == 200
    finally:
        open_stream.close()


def test_an_admin_key_sees_and_cancels_every_keys_job(keys_client, team, redis_client):
    job_id = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=team["a"]).get_json()["id"]
    status, body = call(keys_client, "GET", f"/v1/jobs/{job_id}?wait=0.1", team["ops"])
    assert status == 200 and body["status"] == QUEUED
    with keys_client.get(f"/v1/jobs/{job_id}/stream", headers=team["ops"], buffered=False) as resp:
        assert resp.status_code == 200
    status, body = call(keys_client, "DELETE", f"/v1/jobs/{job_id}", team["ops"])
    assert status == 200 and body["status"] == CANCELLED
    assert JobStore(redis_client).get(job_id)["status"] == CANCELLED
    # and an admin key's own jobs are not every key's
    own = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=team["ops"]).get_json()["id"]
    assert call(keys_client, "GET", f"/v1/jobs/{own}", team["a"])[0] == 404


def test_the_owner_cancels_and_streams_its_own_job(keys_client, team):
    job_id = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=team["b"]).get_json()["id"]
    with keys_client.get(f"/v1/jobs/{job_id}/stream", headers=team["b"], buffered=False) as resp:
        assert resp.status_code == 200
    status, body = call(keys_client, "DELETE", f"/v1/jobs/{job_id}", team["b"])
    assert status == 200 and body["status"] == CANCELLED


def test_revoking_every_key_leaves_v1_answering_401(keys_client, team, redis_client, tiny_model):
    job_id = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=team["a"]).get_json()["id"]
    store = ApiKeyStore(redis_client)
    for name in ("a", "b", "ops"):
        assert store.revoke(name)
    assert not store.any()
    for headers in (team["a"], team["ops"], {}):
        for method, path in [*reads(job_id), ("POST", "/v1/jobs"), ("GET", "/v1/models"),
                             ("GET", "/v1/lanes")]:
            status, body = call(keys_client, method, path, headers)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", (method, path)
    resp = keys_client.post("/v1/chat/completions", json={"model": tiny_model, "messages": [
        {"role": "user", "content": "hi"}]})
    assert resp.status_code == 401 and "tailguard keys add" in resp.get_json()["error"]["message"]
    # a Redis emptied by FLUSHDB is the same: keys mode does not switch itself off
    redis_client.flushdb()
    assert keys_client.post("/v1/jobs", json={"prompt": "hi"}).status_code == 401
