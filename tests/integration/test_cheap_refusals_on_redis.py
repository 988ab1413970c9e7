"""Cheap refusals first (issue 22): the key is charged and the prompt's size checked before the
tokenizer runs; nothing that could never run is queued (non-finite floats, out-of-range
integers, min_tokens above the granted max_tokens); malformed bodies of every kind are 400s;
the Host header and, in open mode, the peer are checked. Real Redis, no worker."""

import json

import pytest

from tailguard.gateway.api_keys import ApiKey, ApiKeyStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration

LANES = ("short", "long", "batch")


def queued(redis_client) -> int:
    return sum(redis_client.llen(lane) for lane in LANES)


@pytest.fixture
def tokenized(api_app, keys_app, monkeypatch):
    """How many prompts the apps' tokenizer counted."""
    from app.gateway_ext import get_gateway

    calls = []
    for app in (api_app, keys_app):
        with app.app_context():
            gw = get_gateway()
        counter = gw.counter
        monkeypatch.setattr(gw, "counter", type("Counting", (), {
            "model": counter.model, "model_max_len": counter.model_max_len,
            "tokenizer_config": counter.tokenizer_config,
            "encode": lambda self, *a, **k: calls.append(1) or counter.encode(*a, **k)})())
    return calls


def raw(client, path, text, **kw):
    return client.post(path, data=text, content_type="application/json", **kw)


def test_an_oversized_prompt_is_refused_before_it_is_tokenized(client, tokenized, api_app,
                                                               redis_client, tiny_model):
    from app.gateway_ext import get_gateway

    with api_app.app_context():
        limit = get_gateway().max_prompt_bytes
    assert limit == 32 * 2048  # the tiny model's max length, 32 bytes a token
    for path, body in (("/v1/jobs", {"prompt": "x" * (limit + 1)}),
                       ("/v1/jobs", {"prompt": "语" * (limit // 3 + 1)}),  # bytes, not characters
                       ("/v1/completions", {"model": tiny_model, "prompt": "x" * (limit + 1)})):
        resp = client.post(path, json=body)
        assert resp.status_code == 400, resp.get_json()
        assert resp.get_json()["error"]["code"] == "prompt_too_long"
    assert tokenized == [] and queued(redis_client) == 0
    assert client.post("/v1/jobs", json={"prompt": "x" * 100}).status_code == 202
    assert tokenized == [1]


def test_a_key_over_its_rpm_costs_no_tokenizing(keys_client, tokenized, redis_client):
    key = ApiKeyStore(redis_client).add(ApiKey("busy", requests_per_min=1))
    headers = {"Authorization": f"Bearer {key}"}
    assert keys_client.post("/v1/jobs", json={"prompt": "hi"}, headers=headers).status_code == 202
    resp = keys_client.post("/v1/jobs", json={"prompt": "word " * 10_000}, headers=headers)
    assert resp.status_code == 429 and tokenized == [1]
    redis_client.delete(keys.API_KEYS)


@pytest.mark.parametrize("body,field", [
    ('{"prompt": "hi", "temperature": NaN}', "temperature"),
    ('{"prompt": "hi", "temperature": Infinity}', "temperature"),
    ('{"prompt": "hi", "top_p": -Infinity}', "top_p"),
    ('{"prompt": "hi", "repetition_penalty": NaN}', "repetition_penalty"),
    ('{"prompt": "hi", "temperature": 1e999}', "temperature"),
    ('{"prompt": "hi", "seed": 18446744073709551616}', "seed"),
    ('{"prompt": "hi", "seed": -9223372036854775809}', "seed"),
    ('{"prompt": "hi", "top_k": 1000000000000000000000000000000}', "top_k"),
    ('{"prompt": "hi", "min_tokens": 20}', "min_tokens"),  # the lane's default max_tokens is 16
    ('{"prompt": "hi", "max_tokens": 100000, "min_tokens": 2000}', "min_tokens"),  # capped: 1500
    ('{"prompt": "\\ud800 lone"}', "prompt"),
    ('{"prompt": "hi", "stop": ["\\udfff"]}', "stop"),
    ('{"prompt": "hi", "priority": "\\ud800"}', "priority"),
    ('{"prompt": "hi", "\\ud800": 1}', "body"),
    ("[" * 100_000 + "]" * 100_000, "body"),
    ('{"prompt": ' + "[" * 50_000 + "]" * 50_000 + "}", "body"),
    ('{"prompt": "hi", "max_tokens": ' + "9" * 5000 + "}", "body"),  # past Python's int digits
])
def test_what_could_never_run_is_a_400_and_queues_nothing(client, redis_client, body, field):
    resp = raw(client, "/v1/jobs", body)
    assert resp.status_code == 400, resp.get_data(as_text=True)[:300]
    assert resp.get_json()["error"]["field"] == field
    assert queued(redis_client) == 0


@pytest.mark.parametrize("extra", [
    '"temperature": NaN', '"presence_penalty": Infinity', '"seed": 18446744073709551616',
    '"top_k": 10000000000000000000000', '"max_tokens": 100000, "min_tokens": 5000',
])
def test_the_openai_routes_refuse_the_same_before_queueing(client, redis_client, tiny_model, extra):
    for path, shape in (("/v1/completions", '"prompt": "hi"'),
                        ("/v1/chat/completions", '"messages": [{"role": "user", "content": "hi"}]')):
        resp = raw(client, path, f'{{"model": {json.dumps(tiny_model)}, {shape}, {extra}}}')
        assert resp.status_code == 400, (path, resp.get_data(as_text=True)[:300])
        assert resp.get_json()["error"]["type"] == "invalid_request_error"
    assert queued(redis_client) == 0


def test_lone_surrogates_and_deep_nesting_in_chat_messages_are_400s(client, redis_client, tiny_model):
    for messages in ('[{"role": "user", "content": "\\ud83d"}]',
                     '[{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]',
                     '[{"role": "user", "content": ' + "[" * 30_000 + "]" * 30_000 + "}]"):
        resp = raw(client, "/v1/chat/completions",
                   f'{{"model": {json.dumps(tiny_model)}, "messages": {messages}}}')
        assert resp.status_code == 400, resp.get_data(as_text=True)[:300]
    assert queued(redis_client) == 0


def test_open_mode_answers_loopback_hosts_and_peers_only(client, keys_client):
    assert client.get("/healthz", headers={"Host": "localhost:8000"}).status_code in (200, 503)
    assert client.get("/healthz", headers={"Host": "127.0.0.1:8000"}).status_code in (200, 503)
    # a DNS-rebinding page: the browser sends the attacker's name as Host
    for host in ("evil.example:8000", "127.0.0.1.evil.example"):
        resp = client.post("/v1/jobs", json={"prompt": "hi"}, headers={"Host": host})
        assert resp.status_code == 400, host
    resp = client.post("/v1/jobs", json={"prompt": "hi"}, environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert resp.status_code == 401 and "own machine" in resp.get_json()["error"]["message"]
    # keys mode: a key is the guard, any Host will do (a proxy's, a public name)
    assert keys_client.get("/healthz", headers={"Host": "api.example.com"}).status_code in (200, 503)
