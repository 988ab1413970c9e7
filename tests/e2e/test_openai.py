"""The official `openai` client against the OpenAI-compatible endpoints, through the
lanes, on real engines (workers and gunicorn from tests/e2e_fixtures.py)."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
import requests
from e2e_support import EngineHold, engine_stats

pytestmark = pytest.mark.e2e

MODEL = "tailguard-demo"  # the demo model's served name


@pytest.fixture(scope="module")
def client(api_url):
    return openai.OpenAI(base_url=api_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == MODEL


def test_completion(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="解释什么是Transformer", max_tokens=12, extra_body={"ignore_eos": True})
    completion = raw.parse()
    assert raw.headers["x-tailguard-lane"] == "short"
    assert raw.headers["x-tailguard-max-tokens-capped"] == "false"
    assert completion.object == "text_completion" and completion.model == MODEL
    assert completion.choices[0].finish_reason == "length" and completion.choices[0].text
    assert completion.usage.completion_tokens == 12
    assert completion.usage.prompt_tokens == 10
    assert completion.usage.total_tokens == 22


def test_chat_completion(client, redis_client_noflush):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "解释KV Cache"}],
        max_completion_tokens=10, extra_body={"ignore_eos": True})
    chat = raw.parse()
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage.completion_tokens == 10
    # the prompt is the demo model's chat template applied to both messages, tokenized as
    # vLLM's chat endpoint does (no extra BOS): the API's count is what the engine saw
    assert chat.usage.prompt_tokens > 10
    record = redis_client_noflush.hgetall(f"tailguard:job:{raw.headers['x-tailguard-job-id']}")
    assert int(record[b"engine_prompt_tokens"]) == chat.usage.prompt_tokens


def test_streamed_completion_adds_up(client, api_url):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="讲一下深度学习的发展史", max_tokens=40, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(raw.parse())
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    # the final text and counts, as the job recorded them
    job = requests.get(f"{api_url}/v1/jobs/{raw.headers['x-tailguard-job-id']}", timeout=10).json()
    assert text == job["result"]["text"] and text
    assert finish == ["length"]
    assert usage.completion_tokens == job["result"]["completion_tokens"] == 40
    assert usage.prompt_tokens == job["prompt_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + 40


def test_streamed_chat_starts_with_the_role(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True,
        extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_max_tokens_above_the_cap_comes_back_capped(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=2000, extra_body={"ignore_eos": True})
    assert raw.headers["x-tailguard-lane"] == "long"
    assert raw.headers["x-tailguard-max-tokens-capped"] == "true"
    completion = raw.parse()
    assert completion.usage.completion_tokens == 1500  # long's cap in tests/lanes.test.toml
    assert completion.model_extra["tailguard"]["max_tokens_capped"] is True


@pytest.mark.parametrize("kwargs,status,param", [
    ({"model": MODEL}, 400, "prompt"),                                   # missing prompt
    ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),  # past the context
    ({"model": MODEL, "prompt": "hi", "n": 0}, 400, None),               # vLLM names no param
    ({"model": MODEL, "prompt": "word " * 3000}, 400, "input_tokens"),   # longer than the context
    ({"model": "gpt-4o", "prompt": "hi"}, 404, "model"),                 # unknown model
])
def test_bad_input_is_an_openai_error(api_url, kwargs, status, param):
    # vLLM's own errors (its message, its param), before any job exists
    resp = requests.post(api_url + "/v1/completions", json=kwargs, timeout=30)
    assert resp.status_code == status, resp.text
    assert "x-tailguard-job-id" not in resp.headers
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]
    assert error["type"] in ("invalid_request_error", "BadRequestError", "NotFoundError")


def test_bad_input_raises_the_right_openai_exception(client):
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=100000)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="hi")


def test_disconnecting_from_an_openai_stream_cancels_the_request(api_url, workers):
    before = engine_stats("long")["aborted"]
    body = {"model": MODEL, "prompt": "写一篇1000字的人工智能文章", "max_tokens": 1500,
            "ignore_eos": True, "stream": True}
    host, port = api_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with EngineHold(workers, "long") as engine:  # it cannot finish before we hang up
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                         + payload)
            deadline = time.monotonic() + 30
            while engine_stats("long")["in_flight"] == 0:  # handed to the held engine
                assert time.monotonic() < deadline
                time.sleep(0.05)
            engine.release()  # it decodes while we read its first text...
            seen = b""
            while b"data: " not in seen:
                chunk = sock.recv(65536)
                assert chunk
                seen += chunk
            engine.hold()  # ...and the rest of its 1,500 tokens wait: hang up
        job_id = next(line.split(":", 1)[1].strip()
                      for line in seen.decode(errors="replace").split("\r\n")
                      if line.lower().startswith("x-tailguard-job-id"))
        while (job := requests.get(f"{api_url}/v1/jobs/{job_id}", timeout=10).json())["status"] \
                == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert job["status"] == "cancelled"
        while (stats := engine_stats("long"))["in_flight"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert stats["engine_unfinished"] == 0 and stats["aborted"] == before + 1


def test_leaving_a_non_streaming_call_cancels_the_request(api_url, workers):
    before = engine_stats("long")["aborted"]
    body = {"model": MODEL, "prompt": "写一篇1000字的人工智能文章", "max_tokens": 1500,
            "ignore_eos": True}
    host, port = api_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with EngineHold(workers, "long"):  # it cannot finish before the client leaves
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                         + payload)
            # wait until the long worker has handed it to its engine, then hang up
            deadline = time.monotonic() + 30
            while engine_stats("long")["in_flight"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        while (stats := engine_stats("long"))["in_flight"]:
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
    assert stats["engine_unfinished"] == 0
    # the engine stopped early: it was aborted, not run to its 1,500 tokens
    assert stats["aborted"] == before + 1
