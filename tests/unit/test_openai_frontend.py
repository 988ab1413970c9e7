"""The OpenAI frontend's lifecycle without vLLM: what a request gets when it cannot be built."""

from __future__ import annotations

import pytest

from tailguard.errors import InvalidField, Unavailable
from tailguard.gateway.openai_frontend import OpenAIFrontend


def test_without_vllm_an_openai_request_is_a_503_that_says_what_to_install(monkeypatch):
    async def no_vllm(self):
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

    monkeypatch.setattr(OpenAIFrontend, "_build", no_vllm)
    frontend = OpenAIFrontend("some/model", ["m"], max_model_len=128)
    try:
        with pytest.raises(Unavailable) as exc:
            frontend.prepare("chat", {"messages": []})
        assert exc.value.http_status == 503
        assert "tailguard[cpu]" in exc.value.message and "/v1/jobs" in exc.value.message
        assert frontend.status == "failed"
    finally:
        frontend.close()


def test_a_stopping_frontend_answers_503_and_a_refusal_it_caused_is_a_503_too(monkeypatch):
    frontend = OpenAIFrontend("some/model", ["m"], max_model_len=128)
    frontend.close()
    with pytest.raises(Unavailable, match="stopping"):
        frontend.prepare("chat", {"messages": []})

    # a render that fails because the process stopped under it (vLLM's tokenizer pool shut down
    # at exit answers a 500, which is otherwise the body's fault: a 400)
    frontend = OpenAIFrontend("some/model", ["m"], max_model_len=128)

    def render_while_stopping(endpoint, body, check_prompt_bytes):
        frontend.close()
        raise InvalidField("cannot schedule new futures after shutdown")

    monkeypatch.setattr(frontend, "_prepare", render_while_stopping)
    with pytest.raises(Unavailable, match="stopping"):
        frontend.prepare("chat", {"messages": []})


def test_a_refusal_while_serving_stays_the_clients_400(monkeypatch):
    frontend = OpenAIFrontend("some/model", ["m"], max_model_len=128)

    def refuse(endpoint, body, check_prompt_bytes):
        raise InvalidField("bad", field="messages")

    monkeypatch.setattr(frontend, "_prepare", refuse)
    with pytest.raises(InvalidField) as exc:
        frontend.prepare("chat", {"messages": []})
    assert exc.value.http_status == 400
