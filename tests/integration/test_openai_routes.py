"""The OpenAI routes against a real Redis with vLLM's real render layer, and no worker: what a
request becomes (the lane task's message and the job record, as docs/api.md's contract says),
what is refused before a job exists, vLLM's other routes, and the relay of what a worker
writes (its stream is written here as the worker's DeltaWriter writes it)."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from app.gateway_ext import built_gateway
from tailguard import settings
from tailguard.jobs.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.jobs.stream import DeltaWriter

pytestmark = pytest.mark.integration

LANES = ("short", "long", "batch")
HI = [{"role": "user", "content": "hi"}]


def messages_on(redis_client, lane):
    """The lane's queued task messages: (headers, kwargs)."""
    out = []
    for raw in redis_client.lrange(lane, 0, -1):
        message = json.loads(raw)
        out.append((message["headers"], json.loads(base64.b64decode(message["body"]))[1]))
    return out


def queued(redis_client) -> int:
    return sum(redis_client.llen(lane) for lane in LANES)


def open_stream(client, path, body, **kw):
    """A streamed call: it answers once its job is queued (the body is read later)."""
    resp = client.post(path, json={**body, "stream": True}, buffered=False, **kw)
    assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
    return resp


def sse_payloads(resp) -> list[str]:
    text = b"".join(resp.response).decode()
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block.startswith("data: ")]


def tokenized(client, body) -> int:
    resp = client.post("/tokenize", json=body)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["count"]


# ---------------------------------------------------------------- what a request becomes

def test_a_chat_is_queued_with_the_contracts_task_arguments(client, redis_client):
    body = {"model": "tailguard-demo", "messages": HI, "max_tokens": 8, "temperature": 0.5,
            "priority": "interactive", "seed": 7}
    resp = open_stream(client, "/v1/chat/completions", body)
    job_id = resp.headers["X-Tailguard-Job-Id"]
    assert resp.headers["X-Tailguard-Lane"] == "short"
    assert resp.headers["X-Tailguard-Max-Tokens-Capped"] == "false"
    [(headers, kwargs)] = messages_on(redis_client, "short")
    prompt_tokens = tokenized(client, {"model": "tailguard-demo", "messages": HI})
    assert headers["id"] == job_id and headers["task"] == "tailguard.generate.short"
    assert kwargs == {
        "job_id": job_id, "prompt": "", "max_tokens": 8, "sampling": {}, "deadline_s": 30,
        "prefill_tokens": prompt_tokens, "openai": {"endpoint": "chat", "prompt_tokens": prompt_tokens, "capped": False, "request": {
            "model": "tailguard-demo", "messages": HI, "max_tokens": 8, "temperature": 0.5,
            "seed": 7, "stream": True, "request_id": job_id}}}
    # Flower, worker logs and `inspect` see no text of the request
    assert "hi" not in headers["kwargsrepr"].replace("chat", "") and "characters>" in headers["kwargsrepr"]
    job = JobStore(redis_client).get(job_id)
    assert (job["status"], job["lane"], job["prompt_tokens"], job["max_tokens"]) == (
        QUEUED, "short", prompt_tokens, 8)
    assert job["openai"] == "chat" and job["sampling"] == {}
    resp.close()


def test_omitted_max_tokens_is_vllms_default_within_the_lane_cap(client, redis_client):
    # chat: vLLM would grant the rest of the context; placed with short's default (16), the
    # job gets short's cap (64), and says it was capped
    resp = open_stream(client, "/v1/chat/completions", {"messages": HI})
    job = JobStore(redis_client).get(resp.headers["X-Tailguard-Job-Id"])
    assert (job["lane"], job["max_tokens"], job.get("requested_max_tokens"), job["max_tokens_capped"]) \
        == ("short", 64, None, True)
    assert resp.headers["X-Tailguard-Max-Tokens-Capped"] == "true"
    resp.close()
    # completions: vLLM's 16
    resp = open_stream(client, "/v1/completions", {"prompt": "hi"})
    job = JobStore(redis_client).get(resp.headers["X-Tailguard-Job-Id"])
    assert (job["lane"], job["max_tokens"], job["max_tokens_capped"]) == ("short", 16, False)
    [(_, kwargs)] = [m for m in messages_on(redis_client, "short")
                     if m[0]["id"] == resp.headers["X-Tailguard-Job-Id"]]
    assert kwargs["openai"]["request"]["max_tokens"] == 16
    resp.close()


def test_max_tokens_above_the_lane_cap_is_capped_and_said(client, redis_client):
    resp = open_stream(client, "/v1/chat/completions",
                       {"messages": HI, "max_completion_tokens": 1800, "priority": "batch"})
    job_id = resp.headers["X-Tailguard-Job-Id"]
    [(_, kwargs)] = messages_on(redis_client, "batch")
    request = kwargs["openai"]["request"]
    assert (request["max_tokens"], request["max_completion_tokens"]) == (1500, 1500)
    assert kwargs["openai"]["capped"] is True and kwargs["max_tokens"] == 1500
    assert JobStore(redis_client).get(job_id)["requested_max_tokens"] == 1800
    resp.close()


def test_token_id_prompts_n_and_vllms_integer_priority_are_accepted(client, redis_client):
    resp = open_stream(client, "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 4, "n": 3,
                                                   "priority": 2, "logprobs": 2, "echo": True})
    [(_, kwargs)] = messages_on(redis_client, "short")
    assert kwargs["openai"]["prompt_tokens"] == 4
    assert kwargs["openai"]["request"]["priority"] == 2  # vLLM's, in the body
    job = JobStore(redis_client).get(resp.headers["X-Tailguard-Job-Id"])
    assert job["priority"] == "interactive" and job["cost"] == 4 + 3 * 4  # each sequence counts
    resp.close()


def test_unknown_fields_are_ignored_and_counted(client, redis_client):
    resp = open_stream(client, "/v1/chat/completions", {
        "messages": HI, "max_tokens": 4, "store": True, "metadata": {"team": "a"},
        "service_tier": "auto", "parallel_tool_calls": False,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "none"})
    [(_, kwargs)] = messages_on(redis_client, "short")
    request = kwargs["openai"]["request"]
    assert "store" not in request and "metadata" not in request and "service_tier" not in request
    assert request["tool_choice"] == "none" and request["parallel_tool_calls"] is False
    resp.close()
    metrics = client.get("/metrics").get_data(as_text=True)
    for field in ("store", "metadata", "service_tier"):
        assert f'tailguard_openai_ignored_fields_total{{endpoint="chat",field="{field}"}}' in metrics


def test_x_request_id_is_echoed_and_names_the_request_as_vllm_would(client, redis_client):
    resp = open_stream(client, "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                   "request_id": "body-id"},
                       headers={"X-Request-Id": "trace-42"})
    assert resp.headers["X-Request-Id"] == "trace-42"
    job_id = resp.headers["X-Tailguard-Job-Id"]
    resp.close()
    # the header wins over the body's request_id (vLLM's rule); the job id stays tailguard's
    [(_, kwargs)] = [m for m in messages_on(redis_client, "short") if m[0]["id"] == job_id]
    assert kwargs["openai"]["request"]["request_id"] == "trace-42"
    assert JobStore(redis_client).get(job_id)["request_id"] == "cmpl-trace-42"
    view = client.get(f"/v1/jobs/{job_id}").get_json()
    assert (view["id"], view["request_id"]) == (job_id, "cmpl-trace-42")
    # without one, the body's; without either, the job's own id
    resp = open_stream(client, "/v1/chat/completions", {"messages": HI, "max_tokens": 2,
                                                        "request_id": "body-id"})
    assert JobStore(redis_client).get(resp.headers["X-Tailguard-Job-Id"])["request_id"] == \
        "chatcmpl-body-id"
    resp.close()
    bad = client.post("/v1/completions", json={"prompt": "hi", "top_k": -5},
                      headers={"X-Request-Id": "trace-43"})
    assert bad.status_code == 400 and bad.headers["X-Request-Id"] == "trace-43"


# ---------------------------------------------------------------- refused before a job exists

CHAT_400 = [
    ('"temperature": NaN', "temperature"),
    ('"temperature": -1', "temperature"),
    ('"seed": 1180591620717411303424', "seed"),  # 2**70, outside int64
    ('"top_k": -5', None),
    ('"n": 3, "temperature": 0', None),  # n > 1 with greedy sampling
    ('"min_tokens": 1600, "max_tokens": 5000', None),  # above the lane's grant of 1500
    ('"max_tokens": 0', "max_tokens"),
    ('"tools": [{"type": "function", "function": {"parameters": {}}}]', "tools.0.function.name"),
    ('"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"', None),
    ('"response_format": {"type": "yaml"}', "response_format.type"),
    ('"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
     '{"type": "object", "properties": {"a": {"type": "strin"}}}}}', None),  # the engine's check
    ('"structured_outputs": {"regex": "(unclosed"}', None),
    ('"logit_bias": {"99999": 1}', None),  # a token id the vocabulary does not have
    ('"guided_json": {"type": "object"}', "guided_json"),
    ('"use_beam_search": true', "use_beam_search"),
    ('"kv_transfer_params": {"do_remote_decode": true}', "kv_transfer_params"),
    ('"priority": "vip"', "priority"),
    ('"messages": []', None),
    ('"messages": [{"role": "user"}], "continue_final_message": true, '
     '"add_generation_prompt": true', None),
    ('"logprobs": true, "top_logprobs": 100', "logprobs"),  # past the model's max_logprobs
    ('"stream_options": {"include_usage": true}', "stream_options"),  # without stream
]


@pytest.mark.parametrize("extra,param", CHAT_400, ids=[c[0][:40] for c in CHAT_400])
def test_chat_values_vllm_refuses_are_400s_and_queue_nothing(client, redis_client, extra, param):
    text = '{"messages": [{"role": "user", "content": "hi"}], ' + extra + "}"
    resp = client.post("/v1/chat/completions", data=text, content_type="application/json")
    assert resp.status_code == 400, resp.get_data(as_text=True)[:500]
    error = resp.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param, error
    assert redis_client.dbsize() == 0  # no job, no message, nothing charged


@pytest.mark.parametrize("body,param", [
    ({"prompt": ["one", "two"]}, "prompt"),  # a batch: refused on purpose (docs/api.md)
    ({"prompt": "hi", "max_tokens": 100_000}, "max_tokens"),
    ({"prompt": "hi", "min_tokens": 20, "max_tokens": 10}, None),
    ({"prompt": "hi", "suffix": "x", "stop": [""] * 3, "seed": -(2**64)}, "seed"),
    ({"prompt": "hi", "logprobs": 50}, "logprobs"),
    ({"prompt": "hi", "allowed_token_ids": [5, 10**6]}, None),
    ({"prompt": [-1, 5]}, None),
    ({"prompt": [5, 10**8]}, "prompt"),  # past the vocabulary: vLLM's engine would refuse it
    ({"prompt": ""}, None),
])
def test_completion_values_vllm_refuses_are_400s(client, redis_client, body, param):
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 400, resp.get_data(as_text=True)[:500]
    if param is not None:
        assert resp.get_json()["error"]["param"] == param
    assert redis_client.dbsize() == 0


def test_an_unknown_model_is_vllms_404(client, redis_client):
    resp = client.post("/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    assert resp.status_code == 404
    assert resp.get_json()["error"]["code"] == "model_not_found"
    assert resp.get_json()["error"]["param"] == "model"
    assert redis_client.dbsize() == 0


def test_a_prompt_longer_than_every_lanes_context_is_a_400(client, redis_client):
    resp = client.post("/v1/completions", json={"prompt": [5] * 2100, "max_tokens": 1})
    assert resp.status_code == 400 and "2048" in resp.get_json()["error"]["message"]
    assert redis_client.dbsize() == 0
    # one that only the long lanes hold goes there
    resp = open_stream(client, "/v1/completions", {"prompt": [5] * 1500, "max_tokens": 4})
    assert resp.headers["X-Tailguard-Lane"] == "long"
    resp.close()


# ---------------------------------------------------------------- vLLM's other routes

def test_models_report_the_context_the_lanes_serve(tiny_model, redis_server, tmp_path):
    from app import create_app

    lanes = tmp_path / "lanes.toml"
    lanes.write_text('[lanes.only]\nmax_tokens = 32\nmax_model_len = 512\n'
                     '[[workers]]\nname = "w"\nlanes = ["only"]\n')
    app = create_app({"TESTING": True, settings.MODEL.env: tiny_model,
                      settings.REDIS_URL.env: redis_server, settings.LANES_FILE.env: str(lanes),
                      "TAILGUARD_CONSUME_FINISHED": False, "TAILGUARD_REAP_RUNNING": False,
                      settings.ADMIT_WITHOUT_WORKER.env: True})
    client = app.test_client()
    body = client.get("/v1/models").get_json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["tailguard-demo", tiny_model]
    assert {m["max_model_len"] for m in body["data"]} == {512}  # the checkpoint says 2048
    assert client.post("/tokenize", json={"prompt": "hi"}).get_json()["max_model_len"] == 512
    # vLLM's own limit is the lanes' context too
    resp = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 600})
    assert resp.status_code == 400 and "512" in resp.get_json()["error"]["message"]
    with app.app_context():
        from app.gateway_ext import get_gateway

        get_gateway().close()


def test_tokenize_and_detokenize_as_vllm_answers(client):
    resp = client.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True})
    body = resp.get_json()
    assert resp.status_code == 200 and body["count"] == len(body["tokens"]) == len(body["token_strs"])
    assert body["max_model_len"] == 2048
    back = client.post("/detokenize", json={"tokens": body["tokens"]}).get_json()
    assert "hello world" in back["prompt"]
    chat = client.post("/tokenize", json={"messages": HI, "add_generation_prompt": True}).get_json()
    assert chat["count"] > 3
    bad = client.post("/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "tokens.0"
    assert client.post("/tokenize", json={"model": "nope", "prompt": "x"}).status_code == 404


def test_health_and_version(client):
    from vllm.version import __version__

    assert client.get("/version").get_json() == {"version": __version__}
    assert client.get("/health").status_code == 200
    assert client.get("/health").get_data() == b""


def test_the_documented_bodies_name_vllms_own_fields(client):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    schemas = client.get("/openapi.json").get_json()["components"]["schemas"]
    assert set(schemas["ChatRequest"]["properties"]) <= set(ChatCompletionRequest.model_fields)
    assert set(schemas["CompletionRequest"]["properties"]) <= set(CompletionRequest.model_fields)


# ---------------------------------------------------------------- the worker's output, relayed

def chunk(text: str | None = None, finish: str | None = None, *, usage: bool = False) -> str:
    """A chat chunk as vLLM serializes it."""
    choices = [] if usage else [{"index": 0, "delta": {} if text is None else {"content": text},
                                 "logprobs": None, "finish_reason": finish}]
    out = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": choices}
    if usage:
        out["usage"] = {"prompt_tokens": 19, "total_tokens": 22, "completion_tokens": 3}
    if finish:
        out["tailguard"] = {"lane": "short", "max_tokens": 8, "max_tokens_capped": False,
                            "finish_reason": finish}
    return json.dumps(out, separators=(",", ":"))


def run_job(redis_client, job_id: str) -> tuple[JobStore, DeltaWriter]:
    store = JobStore(redis_client)
    assert store.start(job_id, "worker@test").started
    return store, DeltaWriter(redis_client, job_id)


def test_a_stream_relays_each_payload_verbatim_then_done(client, redis_client):
    resp = open_stream(client, "/v1/chat/completions", {"messages": HI, "max_tokens": 8})
    job_id = resp.headers["X-Tailguard-Job-Id"]
    store, writer = run_job(redis_client, job_id)
    payloads = [chunk(""), chunk("Hel"), chunk("lo"), chunk("!"), chunk(None, "stop"),
                chunk(usage=True)]
    writer.add_chunks(payloads[:1])
    writer.add_chunks(payloads[1:4])  # batched into entries as the worker's flush decides
    writer.add_chunks(payloads[4:])
    writer.close()
    store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
        "finish_reason": "stop", "completion_tokens": 3, "text": "Hello!"}})
    assert sse_payloads(resp) == [*payloads, "[DONE]"]  # one event per payload, byte for byte
    job = client.get(f"/v1/jobs/{job_id}").get_json()
    assert job["status"] == SUCCEEDED and job["result"]["text"] == "Hello!"  # choice 0's text


def test_a_failed_stream_ends_with_an_openai_error_then_done(client, redis_client):
    resp = open_stream(client, "/v1/completions", {"prompt": "hi", "max_tokens": 8})
    job_id = resp.headers["X-Tailguard-Job-Id"]
    store, writer = run_job(redis_client, job_id)
    part = json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "text": "ab", "logprobs": None,
                                    "finish_reason": None}]})
    writer.add_chunks([part])
    writer.close()
    store.transition(job_id, {RUNNING}, FAILED, {"error": {
        "code": "engine_refused", "message": "the grammar did not compile", "field": "structured_outputs"}})
    events = sse_payloads(resp)
    assert events[0] == part and events[-1] == "[DONE]"
    assert json.loads(events[1])["error"] == {"message": "the grammar did not compile",
                                              "type": "invalid_request_error", "param": None,
                                              "code": "engine_refused"}


def wait_for(predicate, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def waiting_call(client, path, body):
    """A non-streamed call on a thread (it waits for its job), and the job's id once queued."""
    answer = {}
    thread = threading.Thread(target=lambda: answer.setdefault(
        "resp", client.post(path, json=body, headers={"X-Request-Id": "r-1"})))
    thread.start()
    job_id = wait_for(lambda: next((h["id"] for lane in LANES
                                    for h, _ in messages_on(built_gateway(
                                        client.application).store.redis, lane)), None))
    return thread, answer, job_id


def test_a_response_is_vllms_body_as_the_worker_wrote_it(client, redis_client):
    thread, answer, job_id = waiting_call(client, "/v1/chat/completions",
                                          {"messages": HI, "max_tokens": 8})
    store, writer = run_job(redis_client, job_id)
    body = json.dumps({"id": f"chatcmpl-{job_id}", "object": "chat.completion", "created": 1,
                       "model": "tailguard-demo", "choices": [
                           {"index": 0, "message": {"role": "assistant", "content": "Hi there"},
                            "logprobs": None, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 19, "completion_tokens": 8, "total_tokens": 27},
                       "tailguard": {"lane": "short", "max_tokens": 8, "max_tokens_capped": False,
                                     "finish_reason": "deadline"}}, separators=(",", ":"))
    writer.write_response(body)
    store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
        "finish_reason": "deadline", "completion_tokens": 8, "text": "Hi there"}})
    thread.join(30)
    resp = answer["resp"]
    assert resp.status_code == 200 and resp.get_data(as_text=True) == body
    assert resp.headers["X-Tailguard-Finish-Reason"] == "deadline"
    assert resp.headers["X-Tailguard-Job-Id"] == job_id and resp.headers["X-Request-Id"] == "r-1"
    assert client.get(f"/v1/jobs/{job_id}").get_json()["result"]["text"] == "Hi there"


def test_a_cancelled_job_answers_a_400_no_sdk_retries(client, redis_client):
    thread, answer, job_id = waiting_call(client, "/v1/completions", {"prompt": "hi", "max_tokens": 8})
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 200
    thread.join(30)
    resp = answer["resp"]
    # the openai SDK retries 409 (and 408, 429, 5xx): a retry would be a new job
    assert resp.status_code == 400 and resp.get_json()["error"]["code"] == "cancelled"
    assert JobStore(redis_client).get(job_id)["status"] == CANCELLED
