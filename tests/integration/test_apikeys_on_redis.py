"""API keys against a real Redis: the auth mode is configuration (open mode takes no key; keys
mode stays on with no key at all), per-key limits from the shared Lua token bucket (every call
counts toward rpm, GETs too; 429 + Retry-After; a cost above the whole tpm is a 400), waits per
key, the priority ceiling, the key's name in the request log, and the `tailguard keys` and
`tailguard api` commands. The mode is never a surprise: /healthz names it, the API records it in
Redis as it starts, and `tailguard keys add` warns when it makes a key that nothing asks for. A key's weight and
latency-target bounds are set by `keys add`, changed in place by `keys edit`, shown by `keys list`."""

import pytest
from click.testing import CliRunner
from test_observability import sample

from tailguard import settings
from tailguard.cli import main
from tailguard.errors import ConfigError, Unauthenticated
from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.gateway.wait_slots import WaitSlots
from tailguard.jobs.finished import FinishedConsumer
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.observe.stats import StatsStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_client):
    yield ApiKeyStore(redis_client)
    redis_client.delete(keys.API_KEYS)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def test_open_mode_takes_no_key_and_ignores_what_clients_send(client, store):
    store.add(ApiKey("team-a"))  # a key in Redis turns nothing on: the mode is configuration
    assert client.post("/v1/jobs", json={"prompt": "hi"}).status_code == 202
    assert client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer("EMPTY")).status_code == 202


def test_keys_mode_with_no_key_at_all_refuses_every_call_and_says_how_to_add_one(keys_client, store):
    assert not store.any()
    for resp in (keys_client.post("/v1/jobs", json={"prompt": "hi"}),
                 keys_client.get("/v1/models", headers=bearer("tg-anything")),
                 keys_client.get("/v1/lanes")):
        assert resp.status_code == 401, resp.get_json()
        assert "tailguard keys add NAME" in str(resp.get_json()["error"]["message"])
    assert keys_client.get("/healthz").status_code in (200, 503)  # probes need no key


def test_keys_mode_every_v1_call_needs_a_known_key(keys_client, store, tiny_model):
    key = store.add(ApiKey("team-a"))
    assert key.startswith("tg-")
    resp = keys_client.post("/v1/jobs", json={"prompt": "hi"})
    assert resp.status_code == 401 and resp.get_json()["error"]["code"] == "invalid_api_key"
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    resp = keys_client.post("/v1/completions", json={"model": tiny_model, "prompt": "hi"},
                            headers=bearer("tg-wrong"))
    assert resp.status_code == 401
    assert resp.get_json()["error"]["type"] == "authentication_error"
    assert resp.get_json()["error"]["code"] == "invalid_api_key"
    assert keys_client.get("/v1/models").status_code == 401
    job = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key))
    assert job.status_code == 202
    assert keys_client.get(f"/v1/jobs/{job.get_json()['id']}", headers=bearer(key)).status_code == 200
    assert store.revoke("team-a") and not store.any()
    assert keys_client.get("/v1/models", headers=bearer(key)).status_code == 401


def test_a_known_key_is_one_lookup_and_a_refusal_asks_whether_any_key_exists(store, monkeypatch):
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
    with pytest.raises(Unauthenticated, match="none exists yet"):
        store.authenticate(f"Bearer {key}")  # no key left: still keys mode


def test_requests_per_minute_is_a_429_with_retry_after(keys_client, store):
    key = store.add(ApiKey("slow", requests_per_min=2))
    slow_id = store.lookup(key).id[:12]
    for _ in range(2):
        assert keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key)).status_code == 202
    resp = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key))
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "rate_limited"
    assert 1 <= int(resp.headers["Retry-After"]) <= 30  # one request refills in 30 s
    # another key has buckets of its own
    other = store.add(ApiKey("other", requests_per_min=2))
    assert keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(other)).status_code == 202
    metrics = keys_client.get("/metrics").get_data(as_text=True)
    # labelled by the key's id as `tailguard keys list` shows it, not by its name
    assert sample(metrics, "tailguard_api_key_requests_total", key=slow_id, result="accepted") >= 2
    # `tailguard stats --by key` names it (Redis, read by operators, not scraped)
    now = float(store.redis.time()[0])
    by_key = StatsStore(store.redis).keys_window(now - 60, now)
    assert by_key["slow"].refused == {"rate_limited": 1} and "other" not in by_key
    assert sample(metrics, "tailguard_api_key_requests_total", key=slow_id,
                  result="rate_limited") >= 1
    assert 'key="slow"' not in metrics and "other" not in metrics


def test_gets_count_toward_requests_per_minute_before_anything_else(keys_client, store):
    key = store.add(ApiKey("reader", requests_per_min=3))
    job = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key)).get_json()
    assert keys_client.get(f"/v1/jobs/{job['id']}", headers=bearer(key)).status_code == 200
    assert keys_client.get("/v1/lanes", headers=bearer(key)).status_code == 200
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/stream", "/v1/models"):
        resp = keys_client.get(path, headers=bearer(key))
        assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "rate_limited", path
    # charged before the body is read: a malformed one is a 429 too, not a 400
    resp = keys_client.post("/v1/jobs", data="{not json", content_type="application/json",
                            headers=bearer(key))
    assert resp.status_code == 429


def test_tokens_per_minute_counts_each_request_cost(keys_client, store):
    key = store.add(ApiKey("tokens", tokens_per_min=100))
    first = keys_client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}, headers=bearer(key))
    assert first.status_code == 202 and first.get_json()["cost"] > 50
    resp = keys_client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60}, headers=bearer(key))
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "rate_limited"
    # more than the whole minute's tokens: waiting would not help, so a 400 (never retried)
    resp = keys_client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 1000}, headers=bearer(key))
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "over_key_limit"
    assert "exceeds" in resp.get_json()["error"]["message"] and "Retry-After" not in resp.headers


def test_a_key_holds_at_most_its_waits_open(keys_app, keys_client, store):
    from app.gateway_ext import get_gateway

    key = store.add(ApiKey("streamer"))
    other = store.add(ApiKey("other"))
    job = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(key)).get_json()
    with keys_app.app_context():
        gw = get_gateway()
    before, gw.wait_slots = gw.wait_slots, WaitSlots(1)
    try:
        held = keys_client.get(f"/v1/jobs/{job['id']}/stream", headers=bearer(key), buffered=False)
        assert held.status_code == 200
        resp = keys_client.get(f"/v1/jobs/{job['id']}?wait=1", headers=bearer(key))
        assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "too_many_waits"
        assert int(resp.headers["Retry-After"]) >= 1
        # a plain read does not wait, and another key has slots of its own
        assert keys_client.get(f"/v1/jobs/{job['id']}", headers=bearer(key)).status_code == 200
        other_job = keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=bearer(other))
        with keys_client.get(f"/v1/jobs/{other_job.get_json()['id']}?wait=0.1",
                             headers=bearer(other)) as resp:
            assert resp.status_code == 200
        held.close()  # the stream ends (the server closes its response): its slot is free again
        with keys_client.get(f"/v1/jobs/{job['id']}?wait=0.1", headers=bearer(key)) as resp:
            assert resp.status_code == 200
            assert gw.wait_slots.held(store.lookup(key).id) == 1  # until the response is closed
        assert gw.wait_slots.held(store.lookup(key).id) == 0
    finally:
        gw.wait_slots = before


def test_a_batch_key_runs_everything_as_batch_and_is_named_in_the_log(
        keys_client, store, redis_client, keys_app):
    from app.gateway_ext import get_gateway

    key = store.add(ApiKey("nightly", max_priority="batch"))
    job = keys_client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4}, headers=bearer(key))
    assert job.get_json()["lane"] == "batch" and job.get_json()["priority"] == "batch"
    jobs = JobStore(redis_client)
    job_id = job.get_json()["id"]
    jobs.transition(job_id, {QUEUED}, RUNNING)
    jobs.transition(job_id, {RUNNING}, SUCCEEDED, {"completion_tokens": 4})
    seen = []
    FinishedConsumer(redis_client, [seen.append]).run_once()
    assert [r.api_key for r in seen] == ["nightly"]
    with keys_app.app_context():
        record = get_gateway().store.get(job_id)
    assert record["api_key"] == "nightly" and record["owner"] == store.lookup(key).id


def test_keys_command_adds_lists_and_revokes(store, redis_client, redis_server, monkeypatch):
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    runner = CliRunner()
    added = runner.invoke(main, ["keys", "add", "ci", "--rpm", "60", "--max-priority", "batch"])
    assert added.exit_code == 0, added.output
    secret = added.stdout.splitlines()[0]
    assert secret.startswith("tg-") and secret.encode() not in b"".join(
        redis_client.hgetall(keys.API_KEYS).values())
    assert ApiKeyStore(redis_client).lookup(secret).name == "ci"
    assert not ApiKeyStore(redis_client).lookup(secret).admin
    admin = runner.invoke(main, ["keys", "add", "ops", "--admin"])
    assert admin.exit_code == 0 and ApiKeyStore(redis_client).lookup(
        admin.stdout.splitlines()[0]).admin
    listed = runner.invoke(main, ["keys", "list"])
    assert "ci" in listed.output and "rpm 60" in listed.output and secret not in listed.output
    assert [line for line in listed.output.splitlines() if line.startswith("ops")][0].endswith("admin")
    assert runner.invoke(main, ["keys", "add", "ci"]).exit_code != 0  # names are unique
    assert runner.invoke(main, ["keys", "revoke", "ci"]).exit_code == 0
    assert runner.invoke(main, ["keys", "revoke", "ci"]).exit_code != 0
    assert runner.invoke(main, ["keys", "revoke", "ops"]).exit_code == 0
    assert "no API keys" in runner.invoke(main, ["keys", "list"]).output


def test_keys_have_a_weight_and_bounds_and_are_edited_in_place(store, redis_client, redis_server,
                                                                 monkeypatch):
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    runner = CliRunner()
    added = runner.invoke(main, ["keys", "add", "team-a", "--weight", "2", "--min-ttft-ms", "200",
                                 "--max-ttft-ms", "5000", "--min-vllm-priority", "0"])
    assert added.exit_code == 0, added.output
    secret = added.stdout.splitlines()[0]
    key = store.lookup(secret)
    assert (key.weight, key.min_ttft_ms, key.max_ttft_ms, key.min_vllm_priority) == (2.0, 200,
                                                                                      5000, 0)
    plain = runner.invoke(main, ["keys", "add", "team-b"])
    assert store.lookup(plain.stdout.splitlines()[0]).weight == 1.0
    listed = runner.invoke(main, ["keys", "list"]).output
    line_a = next(line for line in listed.splitlines() if line.startswith("team-a"))
    line_b = next(line for line in listed.splitlines() if line.startswith("team-b"))
    assert "weight 2" in line_a and "ttft ms 200..5000" in line_a and "vllm priority >= 0" in line_a
    assert "weight 1" in line_b and "ttft" not in line_b
    edited = runner.invoke(main, ["keys", "edit", "team-a", "--weight", "0.5", "--rpm", "60",
                                  "--max-ttft-ms", "0", "--min-tpot-ms", "10"])
    assert edited.exit_code == 0, edited.output
    assert "weight 0.5" in edited.output and "ttft ms 200.." in edited.output
    key = store.lookup(secret)  # the same secret, edited in place
    assert (key.weight, key.requests_per_min, key.max_ttft_ms, key.min_tpot_ms) == (0.5, 60,
                                                                                    None, 10)
    for bad in (["--weight", "0"], ["--min-ttft-ms", "900", "--max-ttft-ms", "100"], []):
        refused = runner.invoke(main, ["keys", "edit", "team-a", *bad])
        assert refused.exit_code != 0 and store.lookup(secret).weight == 0.5, refused.output
    assert runner.invoke(main, ["keys", "edit", "nobody", "--weight", "2"]).exit_code != 0
    assert runner.invoke(main, ["keys", "add", "team-c", "--weight", "-1"]).exit_code != 0


def test_an_edit_never_brings_back_a_revoked_key(store, monkeypatch):
    secret = store.add(ApiKey("gone"))
    real_list = store.list

    def list_then_revoke():
        found = real_list()
        store.redis.hdel(keys.API_KEYS, store.lookup(secret).id)  # revoked between read and write
        return found

    monkeypatch.setattr(store, "list", list_then_revoke)
    with pytest.raises(ConfigError, match="revoked meanwhile"):
        store.edit("gone", weight=3.0)
    assert store.lookup(secret) is None


def test_a_keys_out_of_bounds_target_is_clamped_and_the_response_says_so(keys_client, store):
    key = store.add(ApiKey("bounded", min_ttft_ms=30_000, max_tpot_ms=100))
    resp = keys_client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4},
                            headers={**bearer(key), "x-llm-d-slo-ttft-ms": "50",
                                     "x-llm-d-slo-tpot-ms": "500"})
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["latency_target"] == {"ttft_ms": 30_000, "tpot_ms": 100,
                                                 "asked_ttft_ms": 50, "asked_tpot_ms": 500,
                                                 "clamped": True}


def test_healthz_names_the_auth_mode(client, keys_client):
    assert client.get("/healthz").get_json()["auth"] == "open"
    assert keys_client.get("/healthz").get_json()["auth"] == "keys"


@pytest.mark.parametrize("mode", ["open", "keys"])
def test_the_gateway_records_its_auth_mode_in_redis_as_it_starts(redis_client, mode):
    from tailguard.gateway.service import Gateway
    from tailguard.lanes.table import load_lanes

    store = ApiKeyStore(redis_client)
    assert store.served_mode() is None
    gateway = Gateway(load_lanes(), JobStore(redis_client), counter=None, broker=None,
                      consume_finished=False, auth_mode=mode)
    try:
        gateway.start()
        assert store.served_mode() == mode
        assert gateway.health()[1]["auth"] == mode
    finally:
        gateway.close()


@pytest.mark.parametrize("mode,says", [
    ("open", ["open mode", "TAILGUARD_API_AUTH=keys", "restart the API"]),
    (None, ["no API has started", "TAILGUARD_API_AUTH=keys", "open on a loopback bind"]),
    ("keys", []),
])
def test_keys_add_says_when_nothing_asks_for_the_key(store, redis_client, redis_server,
                                                      monkeypatch, mode, says):
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    if mode is not None:
        store.record_mode(mode)
    added = CliRunner().invoke(main, ["keys", "add", "team-a"])
    assert added.exit_code == 0, added.output
    assert added.stdout.splitlines() == [added.stdout.strip()]  # stdout: the key alone, as before
    assert store.lookup(added.stdout.strip()).name == "team-a"
    for text in says:
        assert text in added.stderr, added.stderr
    if not says:
        assert added.stderr.splitlines() == [line for line in added.stderr.splitlines()
                                             if line.startswith("key 'team-a' made")]


@pytest.mark.parametrize("bind,configured,mode", [
    ("127.0.0.1", "", "open"), ("0.0.0.0", "", "keys"), ("127.0.0.1", "keys", "keys"),
])
def test_api_serves_the_mode_its_configuration_says_and_says_which(
        redis_server, monkeypatch, bind, configured, mode):
    from tailguard import cli

    seen = {}
    monkeypatch.setattr(cli, "become", lambda argv, env=None, pin=None: seen.update(argv=argv, env=env))
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    monkeypatch.setenv(settings.API_AUTH.env, configured)
    result = CliRunner().invoke(main, ["api", "--host", bind])
    assert result.exit_code == 0, result.output
    assert seen["env"][settings.API_AUTH.env] == mode  # what the app serves, set explicitly
    assert ("API keys required" if mode == "keys" else "no API key needed") in result.output
    assert result.output.startswith(f"tailguard api: auth mode {mode}: ")  # its first line


def test_api_refuses_open_mode_on_a_public_bind(redis_server, monkeypatch):
    monkeypatch.setenv("TAILGUARD_REDIS_URL", redis_server)
    monkeypatch.setenv(settings.API_AUTH.env, "open")
    result = CliRunner().invoke(main, ["api", "--host", "0.0.0.0"])
    assert result.exit_code != 0 and "refusing to serve 0.0.0.0" in result.output
