"""The parts of tailguard/engine/serving.py that need no engine: marking final chunks and
responses, following a stream's payloads, counting what the engine sent. The same code on a
real engine: tests/e2e/test_openai_serving_on_an_engine.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tailguard.engine.serving import (
    _PROGRESS,
    ObservedEngine,
    Progress,
    _ServingError,
    _Stream,
    finish_chunk,
    has_output,
    mark_final,
    mark_response,
    payload_of,
)

EXTRA = {"lane": "short", "max_tokens": 16, "max_tokens_capped": False}


def chat_chunk(index: int = 0, content: str | None = None, finish: str | None = None,
               role: str | None = None) -> str:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return json.dumps({"id": "chatcmpl-j1", "object": "chat.completion.chunk", "created": 7,
                       "model": "m", "choices": [{"index": index, "delta": delta, "logprobs": None,
                                                  "finish_reason": finish}]},
                      separators=(",", ":"))


USAGE = json.dumps({"id": "chatcmpl-j1", "object": "chat.completion.chunk", "created": 7,
                    "model": "m", "choices": [], "usage": {"prompt_tokens": 3,
                                                           "completion_tokens": 2,
                                                           "total_tokens": 5}},
                   separators=(",", ":"))


@pytest.mark.parametrize("deadline, vllm_reason, reason, tailguard_reason", [
    (True, "abort", "length", "deadline"),    # the lane's deadline cut it
    (False, "abort", "abort", "abort"),       # a cancel: vLLM's word stands
    (True, "stop", "stop", "stop"),           # it finished before the deadline fired
    (False, "length", "length", "length"),
])
def test_a_finished_choice_is_marked(deadline, vllm_reason, reason, tailguard_reason):
    chunk = json.loads(chat_chunk(finish=vllm_reason))
    assert mark_final(chunk, EXTRA, deadline=deadline) == tailguard_reason
    assert chunk["choices"][0]["finish_reason"] == reason
    assert chunk["tailguard"] == {**EXTRA, "finish_reason": tailguard_reason}


def test_a_chunk_without_a_finished_choice_is_left_alone():
    chunk = json.loads(chat_chunk(content="hi"))
    before = json.dumps(chunk)
    assert mark_final(chunk, EXTRA, deadline=True) is None
    assert json.dumps(chunk) == before


def test_a_response_cut_by_the_deadline_says_so_whichever_choice_was_cut():
    body = {"choices": [{"index": 0, "finish_reason": "stop"},
                        {"index": 1, "finish_reason": "abort"}]}
    assert mark_final(body, EXTRA, deadline=True) == "deadline"
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["tailguard"]["finish_reason"] == "deadline"


def test_payloads_come_out_of_vllms_frames():
    assert payload_of('data: {"a":1}\n\n') == '{"a":1}'
    assert payload_of("data: [DONE]\n\n") == "[DONE]"


@pytest.mark.parametrize("chunk, output", [
    ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False),
    ({"choices": [{"delta": {"content": "x"}}]}, True),
    ({"choices": [{"delta": {"reasoning": "hmm"}}]}, True),
    ({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, True),
    ({"choices": [{"text": "x", "index": 0}]}, True),
    ({"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}, False),
    ({"choices": [], "usage": {}}, False),
])
def test_output_is_text_reasoning_or_tool_calls(chunk, output):
    assert has_output(chunk) is output


def follow(payloads: list[str], *, stopped: str | None = None, n: int = 1,
           endpoint: str = "chat", engine_requests: int = 1) -> tuple[list[str], list[int]]:
    """What a _Stream hands on for `payloads`, and after how many payloads it saw text."""
    out: list[str] = []
    texts: list[int] = []
    progress = Progress(request_ids=[f"r{i}" for i in range(engine_requests)], stopped=stopped)
    stream = _Stream(endpoint, EXTRA, out.append, lambda: texts.append(len(out)), progress,
                     fallback_id="chatcmpl-j1", model="m", choices=n)
    for payload in payloads:
        stream.take(payload)
    stream.add_missing_finishes()
    return out, texts


def test_a_stream_passes_vllms_payloads_on_and_marks_its_finish():
    payloads = [chat_chunk(role="assistant", content=""), chat_chunk(content="a"),
                chat_chunk(content="b"), chat_chunk(content="", finish="length"), USAGE]
    out, texts = follow(payloads)
    assert out[:3] == payloads[:3]  # verbatim, not re-serialized
    assert texts == [2]  # right after the first chunk with text, once
    final = json.loads(out[3])
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["tailguard"] == {**EXTRA, "finish_reason": "length"}
    assert out[4] == USAGE and len(out) == 5


def test_a_deadline_before_a_choices_first_token_gets_it_a_finish_chunk_before_the_usage():
    # n=2: choice 0 streamed and was aborted (vLLM sends its finish chunk); choice 1 had no
    # token yet (vLLM sends none): the stream gets one in vLLM's shape, before the usage chunk
    payloads = [chat_chunk(0, role="assistant", content=""), chat_chunk(1, role="assistant", content=""),
                chat_chunk(0, content="a"), chat_chunk(0, content="", finish="abort"), USAGE]
    out, _ = follow(payloads, stopped="deadline", n=2)
    assert len(out) == 6 and out[-1] == USAGE
    finals = [json.loads(p) for p in out[3:5]]
    assert [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in finals] == [
        (0, "length"), (1, "length")]
    assert all(c["tailguard"]["finish_reason"] == "deadline" for c in finals)
    assert finals[1]["id"] == "chatcmpl-j1" and finals[1]["object"] == "chat.completion.chunk"
    assert finals[1]["choices"][0]["delta"] == {"content": ""}


def test_a_completion_aborted_before_any_output_still_ends_each_choice():
    out, _ = follow([], stopped="deadline", endpoint="completion", n=1, engine_requests=2)
    chunks = [json.loads(p) for p in out]
    assert [c["choices"][0]["index"] for c in chunks] == [0, 1]  # one per prompt
    assert all(c["object"] == "text_completion" and c["choices"][0]["text"] == ""
               and c["choices"][0]["finish_reason"] == "length" for c in chunks)


def test_no_finish_is_made_up_when_nothing_cut_the_stream():
    out, _ = follow([chat_chunk(role="assistant", content="")], stopped="cancelled")
    assert len(out) == 1


def test_an_error_payload_is_not_a_chunk():
    error = json.dumps({"error": {"message": "boom", "type": "BadRequestError", "param": "x",
                                  "code": 400}})
    with pytest.raises(_ServingError) as info:
        follow([chat_chunk(role="assistant", content=""), error])
    assert info.value.info["code"] == 400 and info.value.info["param"] == "x"


def test_the_made_up_finish_chunk_is_the_one_vllm_sends_for_an_aborted_choice():
    # as vLLM 0.32 streamed it for a choice aborted mid-stream (tests/e2e/test_openai_serving_on_an_engine.py)
    vllm_sent = ('{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m",'
                 '"choices":[{"index":3,"delta":{"content":""},"logprobs":null,'
                 '"finish_reason":"abort","stop_reason":null,"token_ids":null}]}')
    assert finish_chunk("chat", 3, chunk_id="chatcmpl-x", created=1, model="m") == vllm_sent


def output(index: int, token_ids: list[int], text: str = "x") -> SimpleNamespace:
    return SimpleNamespace(index=index, token_ids=token_ids, text=text)


def request_output(outputs, prompt=(1, 2, 3), finished=False) -> SimpleNamespace:
    return SimpleNamespace(prompt_token_ids=list(prompt), outputs=outputs, finished=finished,
                           metrics=None)


async def _drain(progress: Progress, outputs, request_id: str, delta: bool) -> list:
    async def gen():
        for out in outputs:
            yield out

    return [out async for out in progress.observe(gen(), request_id, delta)]


def test_progress_counts_the_prompt_once_and_every_choices_tokens():
    progress = Progress()
    # n=2 as DELTA outputs: each output carries the new tokens only
    outs = [request_output([output(0, [5]), output(1, [6])]),
            request_output([output(0, [7, 8])], finished=True)]
    seen = asyncio.run(_drain(progress, outs, "chatcmpl-j1", delta=True))
    assert seen == outs  # passed on as they came
    assert progress.request_ids == ["chatcmpl-j1"]
    assert progress.prompt_tokens == 3 and progress.completion_tokens == 4
    # a FINAL_ONLY output carries them all: counted once, not added to the above
    asyncio.run(_drain(progress, [request_output([output(0, [1, 2, 3])], finished=True)],
                       "cmpl-j1-1", delta=False))
    assert progress.request_ids == ["chatcmpl-j1", "cmpl-j1-1"]
    assert progress.prompt_tokens == 6 and progress.completion_tokens == 7


def test_each_engine_request_gets_the_calls_suffix_so_a_repeated_caller_id_aborts_only_its_own():
    class Engine:
        def __init__(self):
            self.ids = []

        def generate(self, prompt, params, request_id, *args, **kwargs):
            self.ids.append(request_id)

            async def outputs():
                yield request_output([output(0, [5])], finished=True)
            return outputs()

    engine, progress = Engine(), Progress(engine_id_suffix=".7")

    async def one_request() -> None:
        _PROGRESS.set(progress)
        params = SimpleNamespace(output_kind=None)
        [out async for out in ObservedEngine(engine).generate("p", params, "chatcmpl-trace-42")]

    asyncio.run(one_request())
    assert engine.ids == progress.request_ids == ["chatcmpl-trace-42.7"]
    # outside an OpenAI request (warm-up, the native path) the id is left alone
    ObservedEngine(engine).generate("p", SimpleNamespace(output_kind=None), "native-1")
    assert engine.ids[-1] == "native-1"


@pytest.mark.parametrize(("status", "deadline", "finish"), [
    ("completed", False, "stop"), ("incomplete", False, "length"), ("completed", True, "deadline")])
def test_a_responses_api_response_is_marked_like_a_chats(status, deadline, finish):
    obj = {"id": "resp_1", "object": "response", "status": status, "output": []}
    assert mark_response(obj, EXTRA, deadline=deadline) == finish
    assert obj["tailguard"] == {**EXTRA, "finish_reason": finish} and obj["status"] == status
