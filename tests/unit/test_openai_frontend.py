"""The OpenAI frontend's lifecycle without vLLM: what a request gets when it cannot be built."""

from __future__ import annotations

import pytest

from tailguard.errors import Unavailable
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
