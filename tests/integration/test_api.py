"""The API against a real Redis: routing onto lane queues, caps, errors. No worker runs
here, so every accepted request stays in its queue where the test can inspect it."""

import base64
import json
import time

import pytest

from tailguard.jobs.store import QUEUED

pytestmark = pytest.mark.integration


def queued_messages(redis_client, queue):
    return [json.loads(m) for m in redis_client.lrange(queue, 0, -1)]


def submit(client, **body):
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def test_short_request_lands_on_the_short_queue(client, redis_client):
    job = submit(client, prompt="解释什么是Transformer", max_tokens=16)
    assert job["lane"] == "short" and job["status"] == QUEUED
    assert job["prompt_tokens"] == 10 and job["max_tokens"] == 16
    assert job["max_tokens_capped"] is False
    [msg] = queued_messages(redis_client, "short")
    assert msg["headers"]["id"] == job["id"]
    assert msg["headers"]["task"] == "tailguard.generate.short"
    assert msg["headers"]["expires"] is not None  # the lane's queue TTL travels with it
    assert msg["headers"]["ignore_result"] is True  # the job record is the result
    kwargs = json.loads(base64.b64decode(msg["body"]))[1]
    assert kwargs == {"job_id": job["id"], "prompt": "解释什么是Transformer", "max_tokens": 16,
                      "sampling": {}, "deadline_s": 30, "prefill_tokens": 10}  # the lane gate's
    assert redis_client.llen("long") == 0


def test_request_whose_cost_exceeds_short_lands_on_long(client, redis_client):
    # short: max_cost 256 in tests/lanes.test.toml
    job = submit(client, prompt="word " * 200, max_tokens=60)
    assert job["prompt_tokens"] + 60 > 256
    assert job["lane"] == "long"
    assert [m["headers"]["id"] for m in queued_messages(redis_client, "long")] == [job["id"]]
    assert redis_client.llen("short") == 0


def test_huge_max_tokens_is_clamped_not_obeyed(client, redis_client):
    job = submit(client, prompt="hi", max_tokens=100000)
    assert job["lane"] == "long"
    assert job["max_tokens"] == 1500 and job["requested_max_tokens"] == 100000
    assert job["max_tokens_capped"] is True
    [msg] = queued_messages(redis_client, "long")
    assert json.loads(base64.b64decode(msg["body"]))[1]["max_tokens"] == 1500


def test_missing_max_tokens_gets_the_lane_default(client):
    job = submit(client, prompt="hi")
    assert (job["lane"], job["max_tokens"], job["requested_max_tokens"]) == ("short", 16, None)


def test_batch_priority_lands_on_batch(client, redis_client):
    job = submit(client, prompt="hi", max_tokens=8, priority="batch", temperature=0.5)
    assert job["lane"] == "batch"
    kwargs = json.loads(base64.b64decode(queued_messages(redis_client, "batch")[0]["body"]))[1]
    assert kwargs["sampling"] == {"temperature": 0.5}


def test_status_of_a_queued_job(client):
    job = submit(client, prompt="hi", max_tokens=4)
    resp = client.get(f"/v1/jobs/{job['id']}")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["status"] == "queued" and body["lane"] == "short" and body["result"] is None
    timing = body["timing"]
    assert {k: timing[k] for k in ("queued_s", "ttft_s", "e2e_s", "engine_ttft_s")} == {
        "queued_s": None, "ttft_s": None, "e2e_s": None, "engine_ttft_s": None}
    assert abs(timing["submitted_at"] - time.time()) < 60  # Unix seconds, the Redis clock


def test_lane_table(client):
    body = client.get("/v1/lanes").get_json()
    assert [l["name"] for l in body["lanes"]] == ["short", "long", "batch"]
    assert body["lanes"][0]["max_cost"] == 256 and body["model_max_len"] == 2048
    assert body["workers"] == [{"name": "short", "lanes": ["short"]},
                               {"name": "long", "lanes": ["long", "batch"]}]


def test_healthz_and_lane_table_count_live_workers_per_host(client, redis_client):
    from tailguard.jobs.liveness import Liveness

    liveness = Liveness(redis_client)
    liveness.heartbeat(["short"], "short@gpu-a", ttl_s=30)
    liveness.heartbeat(["short"], "short2@gpu-b", ttl_s=30)
    liveness.heartbeat(["long", "batch"], "long@gpu-a", ttl_s=30)
    body = client.get("/healthz").get_json()
    assert body["workers_per_host"] == {"short": {"gpu-a": 1, "gpu-b": 1},
                                        "long": {"gpu-a": 1}, "batch": {"gpu-a": 1}}
    assert body["workers_per_lane"] == {"short": 2, "long": 1, "batch": 1}
    liveness.forget(["short"], "short2@gpu-b")
    lanes = client.get("/v1/lanes").get_json()["lanes"]
    assert {l["name"]: l["live_workers_per_host"] for l in lanes} == {
        "short": {"gpu-a": 1}, "long": {"gpu-a": 1}, "batch": {"gpu-a": 1}}


def test_healthz_names_lanes_without_a_worker(client):
    resp = client.get("/healthz")
    assert resp.status_code == 503
    assert resp.get_json()["lanes_without_worker"] == ["short", "long", "batch"]
    assert resp.get_json()["workers_per_host"] == {"short": {}, "long": {}, "batch": {}}


@pytest.mark.parametrize("body,status,code,field", [
    (b"not json", 400, "invalid_field", "body"),
    (b'{"prompt": 3}', 400, "invalid_field", "prompt"),
    (b'{"prompt": "p", "max_tokens": "64"}', 400, "invalid_field", "max_tokens"),
    (b'{"prompt": "p", "max_tokenz": 64}', 400, "invalid_field", "max_tokenz"),
    (json.dumps({"prompt": "word " * 3000}).encode(), 400, "prompt_too_long", "prompt"),
])
def test_bad_input_is_a_json_400(client, redis_client, body, status, code, field):
    resp = client.post("/v1/jobs", data=body, content_type="application/json")
    assert resp.status_code == status
    assert resp.get_json()["error"]["code"] == code
    assert resp.get_json()["error"]["field"] == field
    assert redis_client.dbsize() == 0  # nothing recorded, nothing queued


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_a_415_and_never_read(client, redis_client, path, content_type):
    # what a web page may POST cross-origin without a CORS preflight
    resp = client.post(path, data=b'{"prompt": "hi", "model": "m", "messages": []}',
                       **({"content_type": content_type} if content_type else {}))
    assert resp.status_code == 415
    assert resp.get_json()["error"]["code"] == "unsupported_media_type"
    assert redis_client.dbsize() == 0


def test_body_too_large_is_a_413(api_app, client):
    limit = api_app.config["MAX_CONTENT_LENGTH"]
    resp = client.post("/v1/jobs", data=b"x" * (limit + 1), content_type="application/json")
    assert resp.status_code == 413
    assert resp.get_json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("path", ["/v1/jobs/0123456789abcdef0123456789abcdef", "/v1/jobs/nope",
                                  "/v1/jobs/..%2F..%2Fetc"])
def test_unknown_id_is_a_404(client, path):
    resp = client.get(path)
    assert resp.status_code == 404
    assert resp.get_json()["error"]["code"] == "not_found"


def test_bad_wait_is_a_400(client):
    job = submit(client, prompt="hi")
    for wait in ("soon", "-1", "100000"):
        resp = client.get(f"/v1/jobs/{job['id']}?wait={wait}")
        assert resp.status_code == 400 and resp.get_json()["error"]["field"] == "wait"


def test_unknown_route_and_method_are_json(client):
    assert client.get("/v2/nothing").get_json()["error"]["code"] == "not_found"
    resp = client.put("/v1/jobs")
    assert resp.status_code == 405 and resp.get_json()["error"]["code"] == "method_not_allowed"


def test_redis_down_is_a_503_not_a_500(tiny_model):
    from app import create_app
    from tailguard.host.redis_server import free_port

    dead = create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model, "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_REAP_RUNNING": False,
                       "TAILGUARD_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}).test_client()
    for resp in (dead.post("/v1/jobs", json={"prompt": "hi"}),
                 dead.get("/v1/jobs/0123456789abcdef0123456789abcdef"), dead.get("/healthz")):
        assert resp.status_code == 503
        assert resp.get_json()["error"]["code"] == "broker_unavailable"


def test_the_native_api_needs_no_vllm_and_the_openai_routes_start_no_engine(tiny_model,
                                                                           redis_server):
    """The API imports vLLM's frontend for the OpenAI routes only, and never starts an engine:
    no engine-core or model-runner process, none of vLLM's engine clients even imported."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    code = (
        "import json, sys, psutil\n"
        "from app import create_app\n"
        f"c = create_app({{'TAILGUARD_MODEL': {tiny_model!r}, 'TAILGUARD_REDIS_URL': {redis_server!r}, "
        "'TAILGUARD_ADMIT_WITHOUT_WORKER': True, 'TAILGUARD_CONSUME_FINISHED': False, "
        "'TAILGUARD_REAP_RUNNING': False}).test_client()\n"
        "assert c.post('/v1/jobs', json={'prompt': 'hi', 'max_tokens': 1}).status_code == 202\n"
        "native = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'transformers'})\n"
        "r = c.post('/v1/completions', json={'prompt': 'hi', 'max_tokens': 1, 'stream': True}, "
        "buffered=False)\n"
        "assert r.status_code == 200, r.get_data()\n"
        "r.close()\n"
        "engines = sorted(m for m in sys.modules if m in ('vllm.v1.engine.async_llm', "
        "'vllm.v1.engine.core', 'vllm.v1.engine.core_client', 'vllm.v1.engine.llm_engine', "
        "'vllm.entrypoints.llm', 'vllm.v1.worker.gpu_model_runner', 'vllm.v1.worker.cpu_model_runner'))\n"
        "print(json.dumps({'native': native, 'vllm': 'vllm' in sys.modules, 'engines': engines, "
        "'children': [p.name() for p in psutil.Process().children(recursive=True)]}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"native": [], "vllm": True, "engines": [], "children": []}


def test_openai_call_whose_job_expires_is_a_503_expired(client, tiny_model):
    # batch.queue_ttl_s is 3 s and no worker runs: the waiting call settles the job expired
    resp = client.post("/v1/completions", json={"model": tiny_model, "prompt": "hi",
                                                "max_tokens": 4, "priority": "batch"})
    assert resp.status_code == 503
    assert resp.get_json()["error"] == {
        "message": "the request waited in its lane's queue past queue_ttl_s",
        "type": "server_error", "param": None, "code": "expired"}
    assert resp.headers["X-Tailguard-Lane"] == "batch" and resp.headers["X-Tailguard-Job-Id"]


def test_openai_stream_whose_job_expires_ends_with_an_error_event(client, tiny_model):
    resp = client.post("/v1/chat/completions", json={
        "model": tiny_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "priority": "batch", "stream": True})
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    events = [block.removeprefix("data: ") for block in resp.get_data(as_text=True).split("\n\n")
              if block.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "expired"


def test_create_app_takes_every_setting_the_api_reads(tiny_model, redis_server):
    """Flask-tutorial style: test_config overrides any setting, and the API's JobStore honours
    them as the workers' does (TAILGUARD_STREAM_MAXLEN included)."""
    import re

    from conftest import ROOT

    from app import create_app
    from app.config import APP_SETTINGS
    from app.gateway_ext import get_gateway
    from tailguard import settings

    app = create_app({"TESTING": True, "TAILGUARD_CONSUME_FINISHED": False,
                      "TAILGUARD_REAP_RUNNING": False,
                      settings.MODEL.env: tiny_model, settings.REDIS_URL.env: redis_server,
                      settings.STREAM_MAXLEN.env: 123, settings.JOB_TTL_S.env: 77,
                      settings.WORKER_LOST_GRACE_S.env: 4.0, settings.MAX_BODY_BYTES.env: 1000,
                      settings.MAX_WAIT_S.env: 1.0})
    with app.app_context():
        store = get_gateway().store
    assert (store.stream_maxlen, store.ttl_s, store.worker_lost_grace_s) == (123, 77, 4.0)
    assert app.config["MAX_CONTENT_LENGTH"] == 1000
    resp = app.test_client().get("/v1/jobs/0123456789abcdef0123456789abcdef?wait=2")
    assert resp.status_code == 400 and resp.get_json()["error"]["field"] == "wait"

    read = {name for path in (ROOT / "app").glob("*.py")
            for name in re.findall(r"settings\.([A-Z][A-Z_]+)\b", path.read_text())}
    assert read <= {name for name, value in vars(settings).items() if value in APP_SETTINGS}
    assert not any("os.environ" in p.read_text() or "getenv" in p.read_text()
                   for p in (ROOT / "app").glob("*.py"))
