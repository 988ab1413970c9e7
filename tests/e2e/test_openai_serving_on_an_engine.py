"""EngineHost.openai against a real vLLM engine on the tiny demo model: vLLM's own serving
layer on tailguard's engine (tailguard/engine/serving.py), no mocks.

The session's one EngineHost (tests/e2e_fixtures.py's `engine_host`). A test that needs a request to end before its first token holds
vLLM's engine-core process (SIGSTOP) meanwhile: nothing can be generated, however fast this
machine is, and the abort (done in this process's output processor) still ends the request.
Every assertion is on what vLLM or the host produced, never on wall time.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Callable
from contextlib import contextmanager

import pytest
from e2e_fixtures import ENGINE_HOST_MODEL

from tailguard.engine.host import EngineHost, OpenAIResult
from tailguard.errors import EngineRefused

pytestmark = pytest.mark.e2e

MODEL = ENGINE_HOST_MODEL
EXTRA = {"lane": "short", "max_tokens": 8, "max_tokens_capped": True}
_ids = itertools.count()


@pytest.fixture
def host(engine_host):
    return engine_host


def assert_idle(host: EngineHost) -> None:
    """Nothing left in the host or in vLLM: aborted requests (children too) were released."""
    stats = host.stats()
    assert (stats.in_flight, stats.engine_unfinished) == (0, 0)


@contextmanager
def engine_held(host: EngineHost):
    """vLLM's engine-core process stopped: no token can come until it is released."""
    pid = host.engine_core_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def chat(stream: bool = True, max_tokens: int = 8, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about KV caches"}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": stream, **fields}


def run(host: EngineHost, body: dict, endpoint: str = "chat", deadline_s: float = 120,
        should_cancel: Callable[[list[str]], bool] | None = None
        ) -> tuple[str, OpenAIResult, list[dict], list[int]]:
    """The request id, the result, the chunks handed on (parsed) and, for each
    on_first_token, how many payloads had been handed on by then."""
    request_id = f"job{next(_ids)}"
    payloads: list[str] = []
    firsts: list[int] = []
    result = host.openai(request_id, endpoint, body, deadline_s, extra=EXTRA,
                         on_first_token=lambda: firsts.append(len(payloads)),
                         on_chunks=payloads.extend,
                         should_cancel=None if should_cancel is None
                         else lambda: should_cancel(payloads))
    return request_id, result, [json.loads(p) for p in payloads], firsts


def by_choice(chunks: list[dict]) -> dict[int, list[dict]]:
    """Each choice's chunks (the usage chunk, with no choice, left out)."""
    out: dict[int, list[dict]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            out.setdefault(choice["index"], []).append(choice)
    return out


def test_a_streamed_chat_is_vllms_chunks_role_tokens_finish_usage(host):
    request_id, result, chunks, firsts = run(host, chat(
        stream_options={"include_usage": True}, return_token_ids=True))
    assert {c["id"] for c in chunks} == {f"chatcmpl-{request_id}"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {MODEL}
    (choices,) = by_choice(chunks).values()
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}  # the role first
    tokens = choices[1:]
    # one chunk per engine output: one token each, unless this process fell behind the engine
    # (vLLM then merges the outputs it had not taken yet, as `vllm serve` does under load)
    assert all(c["token_ids"] for c in tokens) and sum(len(c["token_ids"]) for c in tokens) == 8
    assert [c["finish_reason"] for c in tokens] == [None] * (len(tokens) - 1) + ["length"]
    final = chunks[-2]
    assert final["tailguard"] == {**EXTRA, "finish_reason": "length"}
    # only the final chunk carries it (chunks[1] is the final one too when all 8 came merged)
    assert ["tailguard" in c for c in chunks[:-1]] == [False] * (len(chunks) - 2) + [True]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert usage["usage"]["prompt_tokens"] == result.prompt_tokens > 5
    assert (result.completion_tokens, result.finish_reason, result.response) == (8, "length", None)
    # on_first_token once, after the role chunk was handed on; the first chunk with text came
    # with it, or in the batch right after (which the worker's writer then writes at once:
    # DeltaWriter.write_next_at_once), as the caller's thread woke before or after vLLM
    # emitted it; TTFT is the first text's
    assert len(firsts) == 1 and firsts[0] >= 1 and 0 < result.ttft_s <= result.engine_s
    assert_idle(host)


def test_n_2_streams_both_choices_each_to_its_finish(host):
    _, result, chunks, _ = run(host, chat(n=2, seed=1, temperature=1.0,
                                          stream_options={"include_usage": True}))
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1]
    for choice in choices.values():
        assert choice[0]["delta"]["role"] == "assistant"
        assert [c["finish_reason"] for c in choice if c["finish_reason"]] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == result.completion_tokens == 16
    assert_idle(host)


def test_logprobs_come_as_vllm_sends_them(host):
    _, _, chunks, _ = run(host, chat(logprobs=True, top_logprobs=2, return_token_ids=True))
    tokens = by_choice(chunks)[0][1:]
    for choice in tokens:  # one entry per token of the chunk
        entries = choice["logprobs"]["content"]
        assert len(entries) == len(choice["token_ids"])
        assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    assert sum(len(c["logprobs"]["content"]) for c in tokens) == 8


def test_a_deadline_aborts_the_request_and_its_end_says_length_and_why(host):
    _, result, chunks, _ = run(host, chat(max_tokens=1900, n=2, seed=3, temperature=1.0,
                                          stream_options={"include_usage": True}),
                               deadline_s=1.0)
    finals = [c for c in chunks if any(ch["finish_reason"] for ch in c["choices"])]
    assert sorted(ch["index"] for c in finals for ch in c["choices"]) == [0, 1]
    for final in finals:
        assert final["choices"][0]["finish_reason"] == "length"  # vLLM's "abort", rewritten
        assert final["tailguard"] == {**EXTRA, "finish_reason": "deadline"}
    assert chunks[-1]["usage"]["completion_tokens"] == result.completion_tokens < 2 * 1900
    assert result.finish_reason == "deadline"
    assert_idle(host)  # both children were aborted in the engine


def test_a_deadline_before_the_first_token_still_ends_every_choice(host):
    with engine_held(host):
        _, result, chunks, _ = run(host, chat(n=2, seed=1, temperature=1.0,
                                              stream_options={"include_usage": True}),
                                   deadline_s=0.2)
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1]
    for choice in choices.values():
        assert choice[0]["delta"]["role"] == "assistant"
        assert choice[-1]["finish_reason"] == "length"
    assert [c["tailguard"]["finish_reason"] for c in chunks if "tailguard" in c] == ["deadline"] * 2
    assert chunks[-1]["usage"]["completion_tokens"] == result.completion_tokens == 0
    assert result.finish_reason == "deadline" and result.ttft_s is None
    assert_idle(host)


def test_a_cancel_aborts_the_request_and_vllm_ends_the_stream(host):
    _, result, chunks, _ = run(host, chat(max_tokens=1900), should_cancel=lambda got: len(got) >= 3)
    assert result.finish_reason == "cancelled" and result.completion_tokens < 1900
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "abort"  # vLLM's word for it
    assert final["tailguard"]["finish_reason"] == "abort"
    assert_idle(host)


def test_a_non_streamed_chat_is_vllms_response_with_the_extra_field(host):
    request_id, result, chunks, _ = run(host, chat(stream=False, n=2, seed=2, temperature=1.0))
    assert chunks == []
    body = json.loads(result.response)
    assert body["id"] == f"chatcmpl-{request_id}" and body["object"] == "chat.completion"
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert body["usage"]["completion_tokens"] == result.completion_tokens == 16
    assert body["usage"]["prompt_tokens"] == result.prompt_tokens
    assert body["tailguard"] == {**EXTRA, "finish_reason": "length"}
    assert_idle(host)


def test_a_non_streamed_request_cut_by_its_deadline_answers_with_what_it_has(host):
    with engine_held(host):
        _, result, _, _ = run(host, chat(stream=False), deadline_s=0.2)
    body = json.loads(result.response)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["tailguard"]["finish_reason"] == "deadline" == result.finish_reason
    assert body["usage"]["completion_tokens"] == 0
    assert_idle(host)


def test_a_streamed_completion(host):
    request_id, result, chunks, _ = run(host, {
        "model": MODEL, "prompt": "KV caches are", "max_tokens": 5, "ignore_eos": True,
        "stream": True}, endpoint="completion")
    assert {c["id"] for c in chunks} == {f"cmpl-{request_id}"}
    assert {c["object"] for c in chunks} == {"text_completion"}
    # one chunk per token, unless vLLM merged outputs this process had not taken yet (above)
    assert 1 <= len(chunks) <= 5
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert chunks[-1]["tailguard"]["finish_reason"] == "length"
    assert result.completion_tokens == 5
    assert_idle(host)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("fields", [
    {"model": "not-served"},  # vLLM's 404
    {"structured_outputs": {"regex": "(unclosed"}},  # a grammar that does not compile: 400
])
def test_a_refusal_by_vllms_serving_layer_is_a_400_class_error(host, fields, stream):
    with pytest.raises(EngineRefused) as info:
        run(host, {**chat(stream=stream), **fields})
    assert info.value.http_status == 400 and info.value.message
    assert_idle(host)


def test_a_repeated_caller_id_cancels_only_its_own_request(host):
    """Two requests with one caller id (vLLM's ids start from it): the host aborts engine
    requests by id, and each call's engine ids carry a suffix of its own."""
    import threading

    other: list[OpenAIResult] = []
    thread = threading.Thread(target=lambda: other.append(host.openai(
        "dup", "chat", chat(max_tokens=8), 120, extra=EXTRA)))
    thread.start()
    cancelled = host.openai("dup", "chat", chat(max_tokens=1900), 120, extra=EXTRA,
                            on_chunks=lambda got: None, should_cancel=lambda: True)
    thread.join(120)
    assert cancelled.finish_reason == "cancelled"
    assert other and other[0].finish_reason == "length" and other[0].completion_tokens == 8
    assert_idle(host)


def respond(stream: bool = True, max_output_tokens: int = 8, **fields) -> dict:
    return {"model": MODEL, "input": "Tell me about KV caches", "instructions": "Be brief.",
            "max_output_tokens": max_output_tokens, "ignore_eos": True, "stream": stream,
            "store": False, **fields}


def test_a_responses_request_is_vllms_events_and_response_with_the_extra_field(host):
    request_id, result, events, firsts = run(host, respond(), endpoint="responses")
    types = [e["type"] for e in events]
    # vLLM ends its stream with response.completed, the response in it saying incomplete
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    final = events[-1]["response"]
    assert (final["id"], final["status"]) == (request_id, "incomplete")
    assert final["tailguard"] == {**EXTRA, "finish_reason": "length"}
    assert result.completion_tokens == 8 and result.finish_reason == "length" and firsts
    _, result, _, _ = run(host, respond(stream=False), endpoint="responses")
    body = json.loads(result.response)
    assert body["object"] == "response" and body["usage"]["output_tokens"] == 8
    assert body["tailguard"]["finish_reason"] == "length" == result.finish_reason
    assert_idle(host)


def test_a_responses_stream_cut_by_its_deadline_ends_and_says_why(host):
    _, result, events, _ = run(host, respond(max_output_tokens=1900), endpoint="responses",
                               deadline_s=1.0)
    assert result.finish_reason == "deadline" and result.completion_tokens < 1900
    assert events[-1]["response"]["tailguard"]["finish_reason"] == "deadline"
    assert_idle(host)
