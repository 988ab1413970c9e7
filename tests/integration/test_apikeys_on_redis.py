"""API keys against a real Redis: off while none exists, then 401 without one, per-key
limits from the shared Lua token bucket (429 + Retry-After), the priority ceiling, the
key's name in the request log and metrics, and the `tailguard keys` command."""

import pytest
from click.testing import CliRunner
from test_observability import sample

from tailguard.cli import main
from tailguard.errors import Unauthenticated
from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.jobs.finished import FinishedConsumer
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_client):
    yield ApiKeyStore(redis_client)
    redis_client.delete(keys.API_KEYS)  # a key left behind would turn auth on for later tests


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_with_no_key_the_api_is_open_and_ignores_what_clients_send(client):
    assert client.post("/v1/jobs", json={"prompt": "hi"}).status_code == 202
    assert client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer("EMPTY")).status_code == 202


def test_once_a_key_exists_every_v1_call_needs_it(client, store, tiny_model):
    key = store.add(ApiKey("team-a"))
    assert key.startswith("tg-")
    resp = client.post("/v1/jobs", json={"prompt": "hi"})
    assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "invalid_api_key"
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    resp = client.post("/v1/completions", json={"model": tiny_model, "prompt": "hi"},
                       headers=bearer("tg-wrong"))
    assert resp.status_code == 401
    assert resp.get_json()["error"]["type"] == "authentication_error"
    assert resp.get_json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models").status_code == 401
    assert client.get("/healthz").status_code in (200, 503)  # probes need no key
    job = client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key))
    assert job.status_code == 202
    assert client.get(f"/v1/jobs/{job.get_json()['id']}", headers=bearer(key)).status_code == 200
    assert store.revoke("team-a") and not store.any()


def test_a_known_key_is_one_lookup_and_the_rest_ask_whether_any_key_exists(store, monkeypatch):
    key = store.add(ApiKey("team-a"))
    asked = []
    any_key = store.any
    monkeypatch.setattr(store, "any", lambda: asked.append(1) or any_key())
    assert store.authenticate(f"Bearer {key}").name == "team-a"
    assert asked == []  # every /v1/ request with a key: no second Redis call
    for header, message in ((None, "send an API key"), ("Bearer tg-wrong", "unknown API key"),
                            (f"Basic {key}", "send an API key")):
        with pytest.raises(Unauthenticated, match=message):
            store.authenticate(header)
    assert len(asked) == 3
    store.revoke("team-a")
    assert store.authenticate(f"Bearer {key}") is None  # no key left: authentication is off


def test_requests_per_minute_is_a_429_with_retry_after(client, store):
    key = store.add(ApiKey("slow", requests_per_min=2))
    for _ in range(2):
        assert client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key)).status_code == 202
    resp = client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key))
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "rate_limited"
    assert 1 <= int(resp.headers["Retry-After"]) <= 30  # one request refills in 30 s
    # another key has buckets of its own
    other = store.add(ApiKey("other", requests_per_min=2))
    assert client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(other)).status_code == 202
    metrics = client.get("/metrics").get_data(as_text=True)
    assert sample(metrics, "tailguard_api_key_requests_total", key="slow", result="accepted") >= 2
    assert sample(metrics, "tailguard_api_key_requests_total", key="slow",
                  result="rate_limited") >= 1


def test_tokens_per_minute_counts_each_request_cost(client, store):
    key = store.add(ApiKey("tokens", tokens_per_min=100))
    first = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}, headers=bearer(key))
    assert first.status_code == 202 and first.get_json()["cost"] > 50
    resp = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}, headers=bearer(key))
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "rate_limited"
    resp = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1000}, headers=bearer(key))
    assert resp.status_code == 429 and "exceeds" in resp.get_json()["error"]["message"]


def test_a_batch_key_runs_everything_as_batch_and_is_named_in_the_log(
        client, store, redis_client, api_app):
    from app import get_gateway

    key = store.add(ApiKey("nightly", max_priority="batch"))
    job = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4}, headers=bearer(key))
    assert job.get_json()["lane"] == "batch" and job.get_json()["priority"] == "batch"
    jobs = JobStore(redis_client)
    job_id = job.get_json()["id"]
    jobs.transition(job_id, {QUEUED}, RUNNING)
    jobs.transition(job_id, {RUNNING}, SUCCEEDED, {"completion_tokens": 4})
    seen = []
    FinishedConsumer(redis_client, [seen.append]).run_once()
    assert [r.api_key for r in seen] == ["nightly"]
    with api_app.app_context():
        assert get_gateway().store.get(job_id)["api_key"] == "nightly"


def test_keys_command_adds_lists_and_revokes(store, redis_client, redis_server, monkeypatch):
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    runner = CliRunner()
    added = runner.invoke(main, ["keys", "add", "ci", "--rpm", "60", "--max-priority", "batch"])
    assert added.exit_code == 0, added.output
    secret = added.stdout.splitlines()[0]
    assert secret.startswith("tg-") and secret.encode() not in b"".join(
        redis_client.hgetall(keys.API_KEYS).values())
    assert ApiKeyStore(redis_client).lookup(secret).name == "ci"
    listed = runner.invoke(main, ["keys", "list"])
    assert "ci" in listed.output and "rpm 60" in listed.output and secret not in listed.output
    assert runner.invoke(main, ["keys", "add", "ci"]).exit_code != 0  # names are unique
    assert runner.invoke(main, ["keys", "revoke", "ci"]).exit_code == 0
    assert runner.invoke(main, ["keys", "revoke", "ci"]).exit_code != 0
    assert "no API keys" in runner.invoke(main, ["keys", "list"]).output


def test_api_refuses_a_public_bind_without_keys(redis_client, redis_server, monkeypatch):
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    result = CliRunner().invoke(main, ["api", "--bind", "0.0.0.0"])
    assert result.exit_code != 0 and "refusing to serve 0.0.0.0" in result.output
