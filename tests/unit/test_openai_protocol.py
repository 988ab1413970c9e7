"""OpenAI bodies to JobRequests, and OpenAI-shaped answers: every bad field is named."""

import pytest

from tailguard.errors import InvalidField, JobNotFound
from tailguard.gateway.openai_protocol import (
    ModelNotFound,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    openai_finish_reason,
    parse_chat_request,
    parse_completion_request,
    usage_chunk,
)
from tailguard.model.chat import render_chat
from tailguard.model.demo import CHAT_TEMPLATE

SERVED = {"demo", "/models/demo"}


def demo_render(messages):
    return render_chat(messages, CHAT_TEMPLATE)


def completion(**fields):
    return parse_completion_request({"model": "demo", "prompt": "p", **fields}, SERVED)


def chat(**fields):
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(body, SERVED, demo_render)


# ---------------------------------------------------------------- completions


def test_minimal_completion():
    req = parse_completion_request({"model": "demo", "prompt": "解释什么是Transformer"}, SERVED)
    assert (req.model, req.stream, req.include_usage, req.kind) == ("demo", False, False, "completion")
    job = req.job
    assert (job.prompt, job.max_tokens, job.priority, job.sampling) == \
        ("解释什么是Transformer", None, "interactive", {})


def test_completion_fields_reach_the_job():
    req = completion(max_tokens=8, temperature=0, top_p=0.9, top_k=5, stop="\n", seed=1,
                     ignore_eos=True, min_tokens=2, repetition_penalty=1.1, priority="batch",
                     frequency_penalty=0.5, presence_penalty=-0.25, stream=True,
                     stream_options={"include_usage": True})
    assert req.job.sampling == {"temperature": 0.0, "top_p": 0.9, "top_k": 5, "stop": ["\n"],
                                "seed": 1, "ignore_eos": True, "min_tokens": 2,
                                "repetition_penalty": 1.1, "frequency_penalty": 0.5,
                                "presence_penalty": -0.25}
    assert (req.job.max_tokens, req.job.priority, req.stream, req.include_usage) == \
        (8, "batch", True, True)


def test_prompt_list_of_one():
    assert completion(prompt=["only one"]).job.prompt == "only one"


def test_what_openai_clients_send_by_default_is_accepted():
    # inert values of fields we ignore, and null meaning "default"
    req = completion(n=1, user="u-1", logprobs=None, echo=False, suffix=None, best_of=1,
                     logit_bias={}, frequency_penalty=0, presence_penalty=0.0, temperature=None,
                     stop=None, max_tokens=None, stream=None, stream_options=None)
    # the penalties' 0 is the client's own value: it overrides a model's generation-config
    # default at the engine, as in vLLM's server, so it is kept
    assert (req.job.sampling, req.job.max_tokens, req.stream) == (
        {"frequency_penalty": 0.0, "presence_penalty": 0.0}, None, False)


def test_include_usage_only_when_streaming():
    assert completion(stream_options={"include_usage": True}).include_usage is False
    options = {"continuous_usage_stats": True}  # vLLM's extra option: accepted, ignored
    assert completion(stream=True, stream_options=options).include_usage is False


@pytest.mark.parametrize("fields,field", [
    ({"model": None}, "model"),
    ({"model": 3}, "model"),
    ({"prompt": None}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": [[1, 2]]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "64"}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"stop": ["a", 1]}, "stop"),
    ({"seed": 1.5}, "seed"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"priority": "urgent"}, "priority"),
    ({"n": 2}, "n"),
    ({"n": 0}, "n"),
    ({"n": "1"}, "n"),
    ({"stream": "true"}, "stream"),
    ({"stream_options": []}, "stream_options"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": "0"}, "presence_penalty"),
    ({"logprobs": 1}, "logprobs"),
    ({"logprobs": 0}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"suffix": "end"}, "suffix"),
    ({"best_of": 2}, "best_of"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
    ({"user": 7}, "user"),
    ({"max_tokns": 4}, "max_tokns"),
    ({"max_completion_tokens": 4}, "max_completion_tokens"),  # chat only
    ({"messages": []}, "messages"),  # chat only
])
def test_bad_completion_field_is_named(fields, field):
    body = {"model": "demo", "prompt": "p", **fields}
    body = {k: v for k, v in body.items() if v is not None or k not in ("model", "prompt")}
    with pytest.raises(InvalidField) as err:
        parse_completion_request(body, SERVED)
    assert err.value.field == field
    assert err.value.http_status == 400


def test_prompt_batches_and_token_ids_say_why():
    with pytest.raises(InvalidField, match="batching"):
        completion(prompt=["a", "b"])
    with pytest.raises(InvalidField, match="token-id"):
        completion(prompt=[1, 2])


@pytest.mark.parametrize("body", [[], "prompt", None])
def test_body_must_be_an_object(body):
    with pytest.raises(InvalidField) as err:
        parse_completion_request(body, SERVED)
    assert err.value.field == "body"


def test_unknown_model_is_a_404():
    with pytest.raises(ModelNotFound) as err:
        parse_completion_request({"model": "gpt-4", "prompt": "p"}, SERVED)
    assert isinstance(err.value, JobNotFound)
    assert (err.value.http_status, err.value.code, err.value.field) == (404, "model_not_found", "model")
    assert "gpt-4" in err.value.message
    assert completion(model="/models/demo").model == "/models/demo"


# ---------------------------------------------------------------- chat


def test_chat_rendered_with_the_demo_template():
    req = parse_chat_request({
        "model": "demo",
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "解释"},
                                                  {"type": "text", "text": "KV Cache"}]}],
        "max_completion_tokens": 16, "stream": True,
    }, SERVED, demo_render)
    assert req.job.prompt == "<|system|>\nbe brief</s>\n<|user|>\n解释\nKV Cache</s>\n<|assistant|>\n"
    assert (req.kind, req.stream, req.job.max_tokens) == ("chat", True, 16)


def test_render_gets_normalized_messages():
    seen = []
    parse_chat_request({"model": "demo", "messages": [
        {"role": "developer", "content": "rules"},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": "a", "tool_calls": None, "refusal": None},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]}, SERVED, lambda m: seen.append(m) or "prompt")
    assert seen == [[{"role": "developer", "content": "rules"},
                     {"role": "user", "content": "q", "name": "ann"},
                     {"role": "assistant", "content": "a"},
                     {"role": "tool", "content": "42", "tool_call_id": "c1"}]]


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=100, max_completion_tokens=10).job.max_tokens == 10
    assert chat(max_tokens=100).job.max_tokens == 100
    assert chat(max_tokens=100, max_completion_tokens=None).job.max_tokens == 100


def test_chat_accepts_inert_defaults():
    req = chat(n=1, user="u", logprobs=False, top_logprobs=0, echo=False, logit_bias=None,
               frequency_penalty=0, presence_penalty=0, stream=False)
    assert req.job.sampling == {"frequency_penalty": 0.0, "presence_penalty": 0.0}
    assert chat(n=1, logprobs=False, stream=False).job.sampling == {}


@pytest.mark.parametrize("fields,field", [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "user", "content": None}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi", "name": 1}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}]}, "messages"),
    ({"model": "gpt-x", "messages": "not even checked"}, "model"),  # a ModelNotFound, named too
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": "8"}, "max_completion_tokens"),
    ({"max_tokens": 0, "max_completion_tokens": 8}, "max_tokens"),
    ({"max_completion_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"n": 3}, "n"),
    ({"stream": 1}, "stream"),
    ({"top_logprobs": 5}, "top_logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"suffix": None}, "suffix"),  # completions only
    ({"best_of": 1}, "best_of"),  # completions only
    ({"prompt": "p"}, "prompt"),  # completions only
])
def test_bad_chat_field_is_named(fields, field):
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}
    body = {k: v for k, v in body.items() if v is not None or k != "messages"}
    with pytest.raises((InvalidField, ModelNotFound)) as err:
        parse_chat_request(body, SERVED, demo_render)
    assert err.value.field == field


def test_chat_n_error_says_unsupported():
    with pytest.raises(InvalidField, match=r"n > 1 is not supported"):
        chat(n=2)


def test_template_rejection_and_empty_render_are_message_errors():
    reject = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidField, match="roles must alternate") as err:
        parse_chat_request({"model": "demo", "messages": [{"role": "user", "content": "x"}]}, SERVED,
                           lambda m: render_chat(m, reject))
    assert err.value.field == "messages"
    with pytest.raises(InvalidField) as err:
        parse_chat_request({"model": "demo", "messages": [{"role": "user", "content": "x"}]}, SERVED,
                           lambda m: "")
    assert err.value.field == "messages"


# ---------------------------------------------------------------- responses

COMMON = dict(request_id="abc", model="demo", created=1700000000)


def test_completion_response_shape():
    body = completion_response(**COMMON, text="hé", finish_reason="length", prompt_tokens=3,
                               completion_tokens=4)
    assert body == {
        "id": "cmpl-abc", "object": "text_completion", "created": 1700000000, "model": "demo",
        "choices": [{"index": 0, "text": "hé", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    assert list(body) == ["id", "object", "created", "model", "choices", "usage"]


def test_chat_response_shape():
    body = chat_response(**COMMON, text="hi", finish_reason="stop", prompt_tokens=5,
                         completion_tokens=1)
    assert body == {
        "id": "chatcmpl-abc", "object": "chat.completion", "created": 1700000000, "model": "demo",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def test_chat_stream_chunks():
    first = chat_chunk(**COMMON, first=True)
    middle = chat_chunk(**COMMON, text="tok")
    last = chat_chunk(**COMMON, finish_reason="length")
    assert [c["choices"][0]["delta"] for c in (first, middle, last)] == \
        [{"role": "assistant", "content": ""}, {"content": "tok"}, {}]
    assert [c["choices"][0]["finish_reason"] for c in (first, middle, last)] == [None, None, "length"]
    for c in (first, middle, last):
        assert (c["id"], c["object"], c["usage"]) == ("chatcmpl-abc", "chat.completion.chunk", None)
    assert chat_chunk(**COMMON, text="end", finish_reason="stop")["choices"][0]["delta"] == \
        {"content": "end"}


def test_completion_stream_chunks():
    chunk = completion_chunk(**COMMON, text="tok")
    assert chunk == {"id": "cmpl-abc", "object": "text_completion", "created": 1700000000,
                     "model": "demo", "choices": [{"index": 0, "text": "tok", "logprobs": None,
                                                   "finish_reason": None}], "usage": None}
    last = completion_chunk(**COMMON, text="", finish_reason="stop")
    assert last["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("kind,id_,obj", [("chat", "chatcmpl-abc", "chat.completion.chunk"),
                                          ("completion", "cmpl-abc", "text_completion")])
def test_usage_chunk(kind, id_, obj):
    assert usage_chunk(kind=kind, **COMMON, prompt_tokens=2, completion_tokens=3) == {
        "id": id_, "object": obj, "created": 1700000000, "model": "demo", "choices": [],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}


def test_responses_parse_as_the_openai_client_types():
    types = pytest.importorskip("openai.types")
    chunk_types = pytest.importorskip("openai.types.chat")
    types.Completion.model_validate(completion_response(
        **COMMON, text="x", finish_reason="length", prompt_tokens=1, completion_tokens=1))
    # the client's Completion type wants a finish_reason, yet OpenAI itself streams null ones
    # (the client builds its objects without validating): check the last chunk only
    types.Completion.model_validate(completion_chunk(**COMMON, text="x", finish_reason="stop"))
    chunk_types.ChatCompletion.model_validate(chat_response(
        **COMMON, text="x", finish_reason="stop", prompt_tokens=1, completion_tokens=1))
    for chunk in (chat_chunk(**COMMON, first=True), chat_chunk(**COMMON, text="x"),
                  chat_chunk(**COMMON, finish_reason="stop"),
                  usage_chunk(kind="chat", **COMMON, prompt_tokens=1, completion_tokens=1)):
        chunk_types.ChatCompletionChunk.model_validate(chunk)


@pytest.mark.parametrize("reason,expected", [
    ("stop", "stop"), ("length", "length"), ("deadline", "length"), ("abort", "length"),
    ("cancelled", "length"), ("error", "length"), ("tool_calls", "tool_calls"),
])
def test_finish_reason(reason, expected):
    assert openai_finish_reason(reason) == expected


# ---------------------------------------------------------------- errors


def test_error_body():
    assert error_body("boom", type="server_error", param=None, code=None) == \
        {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}}
