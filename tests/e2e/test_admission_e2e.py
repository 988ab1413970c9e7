"""Admission and API keys on the real system (workers, engines, gunicorn): a 202 carries the
predicted start, and the official openai client authenticates with a key from `tailguard keys`."""

from __future__ import annotations

import openai
import pytest
from e2e_fixtures import http_status, serve

from tailguard import settings
from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.host.procs import ChildSpec, tailguard_argv
from tailguard.host.redis_server import free_port
from tailguard.redis import keys

pytestmark = pytest.mark.e2e

MODEL = "tailguard-demo"


def test_a_202_carries_the_predicted_start_and_the_job_runs(api, redis_client_noflush):
    resp = api.post("/v1/jobs", json={"prompt": "解释什么是Transformer", "max_tokens": 8})
    assert resp.status_code == 202
    job = resp.get_json()
    assert job["lane"] == "short" and 0 <= job["estimated_start_s"] < 5
    done = api.get(f"/v1/jobs/{job['id']}?wait=30").get_json()
    assert done["status"] == "succeeded"
    # the worker that ran it is the one the lane's heartbeat names, so it took one of the
    # lane's slots (admission's count of them, tailguard/lanes/admission.py) and gave it back
    assert redis_client_noflush.zscore(keys.lane_workers_key("short"), done["worker"]) is not None
    assert redis_client_noflush.zscore(keys.lane_running_key("short"), keys.job_key(job["id"])) is None


@pytest.fixture
def api_key(redis_client_noflush):
    store = ApiKeyStore(redis_client_noflush)
    try:
        yield store.add(ApiKey("e2e", requests_per_min=1000))
    finally:
        redis_client_noflush.delete(keys.API_KEYS)


@pytest.fixture(scope="module")
def keys_api_url(workers, tiny_model, tmp_path_factory):
    """A second `tailguard api` in keys mode (the session's runs open, on loopback)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = serve(ChildSpec("api-keys", tailguard_argv("api", "--port", str(port)),
                            env={settings.MODEL.env: tiny_model,
                                 settings.API_AUTH.env: settings.AUTH_KEYS}),
                  tmp_path_factory.mktemp("api-keys-log"),
                  lambda: http_status(url + "/healthz") == 200)
    yield url
    child.stop()


def test_the_openai_client_authenticates_with_a_key(keys_api_url, api_key):
    api_url = keys_api_url
    client = openai.OpenAI(base_url=api_url + "/v1", api_key=api_key, max_retries=0, timeout=60)
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="解释什么是Transformer",
                                                      max_tokens=4)
    assert raw.parse().choices[0].text and float(raw.headers["x-tailguard-estimated-start-s"]) >= 0
    wrong = openai.OpenAI(base_url=api_url + "/v1", api_key="tg-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as exc:
        wrong.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    assert exc.value.code == "invalid_api_key"
