"""Client libraries people point at an OpenAI-compatible server, pointed at tailguard: LangChain's
ChatOpenAI and LiteLLM, through the API (gunicorn) to the session's real workers and engines
(tests/e2e_fixtures.py). Whatever either library sends by default must be served, not refused.

Both run offline: LangChain's tracing off, LiteLLM on its bundled cost map (it fetches one from
the internet at import otherwise)."""

from __future__ import annotations

import pytest
import requests
from e2e_support import wait_openai_ready

pytestmark = pytest.mark.e2e

MODEL = "tailguard-demo"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def api(api_url):
    """The session's API once its render layer is built."""
    return wait_openai_ready(api_url)


@pytest.fixture(scope="module")
def chat_model(api):
    with pytest.MonkeyPatch.context() as env:
        for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
            env.setenv(name, "false")
        from langchain_openai import ChatOpenAI

        yield ChatOpenAI(base_url=api + "/v1", api_key="unused", model=MODEL, max_retries=0,
                         timeout=120, max_tokens=6, extra_body={"ignore_eos": True},
                         include_response_headers=True)


@pytest.fixture(scope="module")
def litellm():
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        env.setenv("LITELLM_OFFLINE_MODE", "true")
        import litellm

        yield litellm


def litellm_args(api: str) -> dict:
    return {"model": "openai/" + MODEL, "api_base": api + "/v1", "api_key": "unused",
            "num_retries": 0, "timeout": 120, "extra_body": {"ignore_eos": True}}


def test_langchain_invoke(chat_model):
    reply = chat_model.invoke("hi")
    meta = reply.response_metadata
    assert reply.content and meta["finish_reason"] == "length" and meta["model_name"] == MODEL
    assert meta["token_usage"]["completion_tokens"] == 6 and reply.usage_metadata["output_tokens"] == 6
    assert meta["headers"]["x-tailguard-lane"] == "short"
    assert meta["headers"]["x-tailguard-max-tokens-capped"] == "false"  # max_completion_tokens read
    job_id = meta["headers"]["x-tailguard-job-id"]
    assert meta["id"] == f"chatcmpl-{job_id}"


def test_langchain_stream(chat_model, api):
    chunks = list(chat_model.stream("hi", stream_usage=True))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert len(chunks) > 2 and whole.content
    assert whole.response_metadata["finish_reason"] == "length"
    assert whole.usage_metadata["output_tokens"] == 6
    assert chunks[0].response_metadata["headers"]["x-tailguard-lane"] == "short"


def test_litellm_completion(litellm, api):
    done = litellm.completion(messages=HI, max_tokens=6, **litellm_args(api))
    assert done.choices[0].message.content and done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 6
    headers = done._hidden_params["additional_headers"]
    assert headers["llm_provider-x-tailguard-lane"] == "short"
    job = requests.get(f"{api}/v1/jobs/{headers['llm_provider-x-tailguard-job-id']}", timeout=10).json()
    assert job["status"] == "succeeded" and job["result"]["text"] == done.choices[0].message.content


def test_litellm_stream(litellm, api):
    chunks = list(litellm.completion(messages=HI, max_tokens=5, stream=True,
                                     stream_options={"include_usage": True}, **litellm_args(api)))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    whole = litellm.stream_chunk_builder(chunks, messages=HI)
    assert whole.choices[0].message.content == text and whole.usage.completion_tokens == 5


def test_litellm_text_completion(litellm, api):
    done = litellm.text_completion(prompt="hello", max_tokens=4, **litellm_args(api))
    assert done.choices[0].text and done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == 4
