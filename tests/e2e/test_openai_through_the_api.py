"""The official `openai` client through the API (gunicorn, vLLM's render layer in its process) to
the workers' vLLM serving layer on real engines: what the client gets is vLLM's, with the lanes
visible in the body (tests/e2e_fixtures.py's session workers and API)."""

from __future__ import annotations

import asyncio
import shlex

import openai
import pytest
import requests
from e2e_fixtures import OPENAI_ARGS
from e2e_support import wait_openai_ready

pytestmark = pytest.mark.e2e

MODEL = "tailguard-demo"


@pytest.fixture(scope="module")
def api(api_url):
    """The session's API once its render layer is built."""
    return wait_openai_ready(api_url)


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_chat_is_vllms_response_with_the_lane_in_it(client, api):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        extra_body={"ignore_eos": True})
    chat = raw.parse()
    assert chat.object == "chat.completion" and chat.model == MODEL
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 6
    assert chat.model_extra["tailguard"] == {"lane": "short", "max_tokens": 6,
                                             "max_tokens_capped": False, "finish_reason": "length"}
    job_id = raw.headers["x-tailguard-job-id"]
    assert chat.id == f"chatcmpl-{job_id}"
    job = requests.get(f"{api}/v1/jobs/{job_id}", timeout=10).json()
    assert job["status"] == "succeeded" and job["result"]["text"] == chat.choices[0].message.content


def test_the_callers_request_id_names_the_response_as_vllm_names_it(client, api):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_headers={"X-Request-Id": "trace-42"}, extra_body={"request_id": "body-id"})
    assert raw.parse().id == "chatcmpl-trace-42" and raw.headers["x-request-id"] == "trace-42"
    job_id = raw.headers["x-tailguard-job-id"]
    assert requests.get(f"{api}/v1/jobs/{job_id}", timeout=10).json()["request_id"] == \
        "chatcmpl-trace-42"
    chunks = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True,
                                            extra_body={"request_id": "body-id"}))
    assert {c.id for c in chunks} == {"cmpl-body-id"}


def test_an_omitted_max_tokens_is_vllms_default_capped_by_the_lane_and_said(client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"ignore_eos": True})
    # vLLM alone would generate to the end of the context; the short lane's cap is 64
    assert chat.usage.completion_tokens == 64 and chat.choices[0].finish_reason == "length"
    assert chat.model_extra["tailguard"]["max_tokens_capped"] is True


def test_a_stream_is_vllms_chunks_then_usage(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt="hello", max_tokens=5, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert final and final[-1].model_extra["tailguard"]["lane"] == "short"
    assert text


def test_n_logprobs_and_echo_are_served(client):
    done = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, n=2, logprobs=2,
                                     echo=True, temperature=1.0, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in done.choices) == [0, 1]
    assert all(c.text.startswith("hello") and c.logprobs.top_logprobs for c in done.choices)


def test_the_async_client(api):
    async def one() -> str:
        async with openai.AsyncOpenAI(base_url=api + "/v1", api_key="unused", max_retries=0,
                                      timeout=120) as aclient:
            done = await aclient.completions.create(model=MODEL, prompt="hi", max_tokens=2)
            return done.choices[0].finish_reason

    assert asyncio.run(one()) in ("length", "stop")


def test_a_refused_value_is_a_400_before_any_job(client, api):
    # the SDK cannot send a NaN (httpx refuses it): the bytes a JavaScript client would send
    resp = requests.post(f"{api}/v1/completions", timeout=30, headers={"Content-Type": "application/json"},
                         data=b'{"model": "%s", "prompt": "hi", "temperature": NaN}' % MODEL.encode())
    assert resp.status_code == 400 and "x-tailguard-job-id" not in resp.headers
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="hi", seed=2**70)
    assert exc.value.status_code == 400 and exc.value.response.headers.get("x-tailguard-job-id") is None


def test_the_responses_api_through_the_lanes(client, api):
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Say hi.", instructions="Answer in one word.", max_output_tokens=6,
        store=False)
    response = raw.parse()  # the SDK's own Response type
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.id == f"resp_{raw.headers['x-tailguard-job-id']}"
    assert raw.headers["x-tailguard-lane"] == "short" and response.usage.output_tokens <= 6
    assert response.model_extra["tailguard"]["lane"] == "short"
    job = requests.get(f"{api}/v1/jobs/{raw.headers['x-tailguard-job-id']}", timeout=10).json()
    assert job["status"] == "succeeded" and job["result"]["text"] == response.output_text

    events = list(client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4,
                                          stream=True, store=False))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                            "response.incomplete")
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text and final.model_extra["tailguard"]["lane"] == "short"

    with pytest.raises(openai.BadRequestError):  # nothing is stored here: refused, not queued
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_x")


def test_a_response_with_a_function_tool_defined(client):
    """With a tool parser on the API and the workers (tests/e2e_fixtures.py): the render layer
    takes tool_choice "auto" and the worker's vLLM parses the output for calls. Random weights
    write no call the parser finds: text comes back, as the SDK's own types."""
    weather = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="What is the weather in Paris?", tools=[weather], tool_choice="auto",
        max_output_tokens=8, store=False)
    response = raw.parse()
    assert response.status in ("completed", "incomplete") and response.tool_choice == "auto"
    assert [t.name for t in response.tools] == ["get_weather"]
    assert raw.headers["x-tailguard-lane"] == "short"  # its cost's lane, as without tools
    assert response.output and {item.type for item in response.output} <= {"message",
                                                                           "function_call"}
    assert response.usage.output_tokens <= 8


def test_the_conformance_checks_of_ids_metrics_and_responses_hold_here(api, workers):
    """`tailguard conformance`'s own checks and SDK sender (its tailguard side) on these engines:
    ids as vLLM makes them, vLLM's series on the workers' ports, the Responses API."""
    from tailguard.conformance.catalog import by_name
    from tailguard.conformance.check import Context, judge
    from tailguard.conformance.run import capabilities_of
    from tailguard.conformance.sender import Sender

    sender = Sender(api, metrics_urls=[f"http://127.0.0.1:{port}/metrics"
                                       for port in workers.metrics_ports.values()])
    ctx = Context(side="tailguard", model=MODEL,
                  capabilities=capabilities_of(shlex.split(OPENAI_ARGS)))
    try:
        for check in by_name(["request_id_header", "request_id_body", "request_id_stream",
                              "vllm_metrics", "responses", "responses_request_id",
                              "responses_stream", "responses_previous_id",
                              "responses_tools_auto", "tools_choice_auto"]):
            result = judge(check, [sender.send(call, ctx) for call in check.calls], ctx)
            assert result.status in ("pass", "refused"), (check.name, result.detail)
    finally:
        sender.close()
    assert sender.retries == 0 and sender.would_retry == 0
