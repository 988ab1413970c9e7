"""The checks: 93 OpenAI requests a client sends, each with what a server must answer.

Pure data and predicates, declared in order (``check``, ``check1``, ``declare_refusal``):
routes, ids, vLLM's metrics, completions and chat, streams, the Responses API, messages and
the chat template, tools, fields real clients send, sampling and output fields, what tailguard
refuses on purpose and bodies no engine can run (last, the NaN: a server that takes one might
not survive it). ``CHECKS`` holds them; ``by_name`` picks some.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from tailguard.conformance.check import (
    MODEL,
    SPECIAL,
    TOKEN,
    TOKEN_TEXT,
    TOOL_PARSER,
    Answer,
    Call,
    Check,
    Context,
    Predicate,
    need,
)

# ------------------------------------------------------------------------ predicate helpers


def _error(a: Answer) -> dict[str, Any]:
    return (a.body or {}).get("error") or {} if isinstance(a.body, dict) else {}


def ok(a: Answer, obj: str | None = None) -> dict[str, Any]:
    """`a`'s JSON body, once it is a 200 (of OpenAI object `obj`)."""
    need(a.status == 200, a.brief())
    need(isinstance(a.body, dict), f"200 but not a JSON object: {str(a.body)[:120]}")
    if obj is not None:
        need(a.body.get("object") == obj, f"object {a.body.get('object')!r}, not {obj!r}")
    return a.body


def refused(a: Answer, status: int = 400) -> str:
    """`a` is an OpenAI error of `status` (vLLM's answer to a body it cannot serve)."""
    need(a.status == status, f"wanted {status}, got {a.brief()}")
    need(isinstance(_error(a).get("message"), str), f"{status} without an OpenAI error body")
    return a.brief()


def choice(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    choices = body["choices"]
    need(len(choices) > index, f"{len(choices)} choices")
    return choices[index]


def usage(body: dict[str, Any]) -> dict[str, Any]:
    u = body.get("usage")
    need(isinstance(u, dict), "no usage")
    return u


def message(body: dict[str, Any]) -> dict[str, Any]:
    m = choice(body)["message"]
    need(m.get("role") == "assistant", f"role {m.get('role')!r}")
    return m


def text_of(body: dict[str, Any]) -> str:
    c = choice(body)
    return c["text"] if "text" in c else (c["message"].get("content") or "")


def finish(body: dict[str, Any], allowed: tuple[str, ...] = ("length", "stop")) -> str:
    reason = choice(body)["finish_reason"]
    need(reason in allowed, f"finish_reason {reason!r}")
    return reason


def completion(a: Answer, max_tokens: int | None = None) -> str:
    body = ok(a, "text_completion")
    need(isinstance(text_of(body), str), "no text")
    reason = finish(body)
    tokens = usage(body)["completion_tokens"]
    if max_tokens is not None:
        need(tokens <= max_tokens, f"{tokens} tokens > max_tokens {max_tokens}")
    return f"200, {tokens} tokens, {reason}"


def chat(a: Answer, max_tokens: int | None = None) -> str:
    body = ok(a, "chat.completion")
    m = message(body)
    need(isinstance(m.get("content"), str) or m.get("tool_calls"), "no content")
    reason = finish(body, ("length", "stop", "tool_calls"))
    tokens = usage(body)["completion_tokens"]
    if max_tokens is not None:
        need(tokens <= max_tokens, f"{tokens} tokens > max_tokens {max_tokens}")
    return f"200, {tokens} tokens, {reason}"


def stream(a: Answer, obj: str) -> list[dict[str, Any]]:
    """A 200 stream's chunks, once its framing is vLLM's: each event one ``data:`` line and a
    blank line, every payload a JSON `obj` chunk with one id, and ``data: [DONE]`` last."""
    need(a.status == 200, a.brief())
    need(a.events, "no events")
    need(a.events[-1] == "[DONE]", f"last event {str(a.events[-1])[:80]!r}, not [DONE]")
    need(all(isinstance(e, dict) for e in a.events[:-1]), "a payload that is not JSON")
    other = [line for line in a.lines or () if line and not line.startswith("data: ")]
    need(not other, f"a line that is not data: {other[0][:80] if other else ''!r}")
    chunks = a.chunks
    need(chunks, "no chunks")
    errors = [c for c in chunks if "error" in c]
    need(not errors, f"an error event: {str(errors[:1])[:160]}")
    odd = [c.get("object") for c in chunks if c.get("object") != obj]
    need(not odd, f"a chunk not {obj!r}: {odd[:1]}")
    need(len({c.get("id") for c in chunks}) == 1, "chunks with different ids")
    return chunks


def final_reason(chunks: list[dict[str, Any]], index: int = 0) -> str:
    reasons = [c["finish_reason"] for ch in chunks for c in ch.get("choices") or ()
               if c.get("index") == index and c.get("finish_reason")]
    need(len(reasons) == 1, f"{len(reasons)} finish_reasons for choice {index}")
    return reasons[0]


def stream_text(chunks: list[dict[str, Any]], index: int = 0) -> str:
    return "".join((c.get("text") if "text" in c else (c.get("delta") or {}).get("content")) or ""
                   for ch in chunks for c in ch.get("choices") or () if c.get("index") == index)


def one(predicate: Callable[[Answer, Context], str]) -> Predicate:
    """A predicate on a single call's answer."""
    return lambda answers, ctx: predicate(answers[0], ctx)


# ------------------------------------------------------------------------ the checks

_HI = [{"role": "user", "content": "Say hi."}]
_PARIS = "The capital of France is"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a unit",
    "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["unit"], "additionalProperties": False}}}
_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
           "required": ["answer"], "additionalProperties": False}


def cmpl(**body: Any) -> Call:
    return Call("completions", {"model": MODEL, "prompt": _PARIS, "max_tokens": 8, **body})


def chat_call(**body: Any) -> Call:
    return Call("chat", {"model": MODEL, "messages": _HI, "max_tokens": 8, **body})


_DECLARED: list[Check] = []


def check(name: str, area: str, what: str, *calls: Call, refused: str | None = None,
          required: bool = False, needs: str | None = None
          ) -> Callable[[Predicate], Predicate]:
    """Declare a check whose predicate (on all its answers) is the decorated function."""
    def declare(predicate: Predicate) -> Predicate:
        _DECLARED.append(Check(name, area, what, tuple(calls), predicate, refused=refused,
                             required=required, needs=needs))
        return predicate
    return declare


def check1(name: str, area: str, what: str, call: Call, **how: Any
           ) -> Callable[[Callable[[Answer, Context], str]], Callable[[Answer, Context], str]]:
    """Declare a one-call check whose predicate takes its answer."""
    def declare(predicate: Callable[[Answer, Context], str]) -> Callable[[Answer, Context], str]:
        check(name, area, what, call, **how)(one(predicate))
        return predicate
    return declare


def served(what: str) -> Callable[[Answer, Context], str]:
    """The predicate "served as a completion (or chat) would be"."""
    def predicate(a: Answer, ctx: Context) -> str:
        return chat(a) if what == "chat" else completion(a)
    return predicate


def declare_refusal(name: str, area: str, what: str, call: Call, *, status: int = 400,
                    required: bool = False) -> None:
    """A body vLLM refuses: the check is "refused with `status`, never served"."""
    check1(name, area, what, call, required=required)(lambda a, ctx: refused(a, status))


# --- routes

@check1("models", "routes", "GET /v1/models lists the served model with its context",
        Call("models"))
def _models(a: Answer, ctx: Context) -> str:
    body = ok(a, "list")
    card = body["data"][0]
    need(card["object"] == "model" and card["id"] == ctx.model, f"first model {card}")
    need(isinstance(card.get("max_model_len"), int) and card["max_model_len"] > 0,
         f"max_model_len {card.get('max_model_len')!r}")
    return f"200, {card['id']}, max_model_len {card['max_model_len']}"


@check1("health", "routes", "GET /health is 200", Call("get", path="/health"))
def _health(a: Answer, ctx: Context) -> str:
    need(a.status == 200, a.brief())
    return "200"


@check1("version", "routes", "GET /version gives vLLM's version", Call("get", path="/version"))
def _version(a: Answer, ctx: Context) -> str:
    body = ok(a)
    need(isinstance(body.get("version"), str), f"body {body}")
    return f"200, version {body['version']}"


@check1("tokenize", "routes", "POST /tokenize of a prompt: its token ids and count",
        Call("post", path="/tokenize", body={"model": MODEL, "prompt": _PARIS}))
def _tokenize(a: Answer, ctx: Context) -> str:
    body = ok(a)
    need(body["count"] == len(body["tokens"]) > 0, f"body {body}")
    need(body["max_model_len"] == ctx.max_model_len,
         f"max_model_len {body['max_model_len']} but /v1/models says {ctx.max_model_len}")
    return f"200, {body['count']} tokens"


@check1("tokenize_chat", "routes", "POST /tokenize of messages, rendered by the chat template",
        Call("post", path="/tokenize", body={"model": MODEL, "messages": _HI,
                                             "add_generation_prompt": True}))
def _tokenize_chat(a: Answer, ctx: Context) -> str:
    body = ok(a)
    need(body["count"] == len(body["tokens"]) > 3, f"body {body}")
    return f"200, {body['count']} tokens"


@check1("detokenize", "routes", "POST /detokenize of a token id gives its text",
        Call("post", path="/detokenize", body={"model": MODEL, "tokens": [TOKEN]}))
def _detokenize(a: Answer, ctx: Context) -> str:
    body = ok(a)
    need(body["prompt"] == ctx.token_text, f"prompt {body['prompt']!r}, not {ctx.token_text!r}")
    return f"200, {body['prompt']!r}"


@check1("request_id", "routes", "X-Request-Id names the request (echoed, or in the body's id)",
        Call("completions", {"model": MODEL, "prompt": _PARIS, "max_tokens": 2},
             headers={"X-Request-Id": "compat-rid-24"}))
def _request_id(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    echoed = a.headers.get("x-request-id") == "compat-rid-24"
    in_id = "compat-rid-24" in str(body.get("id"))
    need(echoed or in_id, f"header {a.headers.get('x-request-id')!r}, id {body.get('id')!r}")
    return f"header echoed: {echoed}, in the id: {in_id}"


@check1("request_id_header", "ids", "X-Request-Id builds the response's id: cmpl-<it>",
        Call("completions", {"model": MODEL, "prompt": _PARIS, "max_tokens": 2,
                             "request_id": "compat-body-31"},
             headers={"X-Request-Id": "compat-rid-31"}))
def _request_id_header(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(body.get("id") == "cmpl-compat-rid-31", f"id {body.get('id')!r}, not cmpl-compat-rid-31 "
         "(the header before the body's request_id)")
    return f"200, id {body['id']}"


@check1("request_id_body", "ids", "the body's request_id builds a chat's id: chatcmpl-<it>",
        chat_call(request_id="compat-body-32"))
def _request_id_body(a: Answer, ctx: Context) -> str:
    body = ok(a, "chat.completion")
    need(body.get("id") == "chatcmpl-compat-body-32",
         f"id {body.get('id')!r}, not chatcmpl-compat-body-32")
    return f"200, id {body['id']}"


@check1("request_id_stream", "ids", "X-Request-Id names every chunk of a stream",
        Call("chat", {"model": MODEL, "messages": _HI, "max_tokens": 4, "stream": True},
             headers={"X-Request-Id": "compat-rid-33"}))
def _request_id_stream(a: Answer, ctx: Context) -> str:
    ids = {c.get("id") for c in stream(a, "chat.completion.chunk")}
    need(ids == {"chatcmpl-compat-rid-33"}, f"chunk ids {sorted(map(str, ids))}")
    return f"{len(a.chunks)} chunks, id chatcmpl-compat-rid-33"


#: the series of vLLM's own that dashboards, routers and autoscalers read
#: (a counter's and a histogram's by the sample names Prometheus exposes)
VLLM_METRIC_SAMPLES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total")


def metric_labels(text: str, sample: str) -> list[dict[str, str]]:
    """The label sets of `sample` in a Prometheus text exposition."""
    return [dict(re.findall(r'(\w+)="([^"]*)"', m))
            for m in re.findall(rf"^{re.escape(sample)}\{{([^}}]*)\}}", text, re.M)]


@check1("vllm_metrics", "metrics", "vLLM's own vllm:* series where its engines are (tailguard: "
        "each worker's port, labelled with the worker, its lanes in tailguard_worker_lanes_info)",
        Call("metrics"))
def _vllm_metrics(a: Answer, ctx: Context) -> str:
    need(a.status == 200 and isinstance(a.body, str), a.brief())
    missing = [name for name in VLLM_METRIC_SAMPLES if not metric_labels(a.body, name)]
    need(not missing, f"missing {', '.join(missing)}")
    engines = metric_labels(a.body, "vllm:num_requests_running")
    if ctx.side == "tailguard":  # one engine per worker: each says whose; its lanes apart
        unlabelled = [e for e in engines if not e.get("worker")]
        need(not unlabelled, f"a series without worker: {unlabelled[:1]}")
        lanes = metric_labels(a.body, "tailguard_worker_lanes_info")
        workers = {e["worker"] for e in engines}
        need(workers <= {x.get("worker") for x in lanes},
             f"a worker without tailguard_worker_lanes_info: {sorted(workers)}")
        return (f"{len(VLLM_METRIC_SAMPLES)} series, {len(engines)} engine(s), lanes "
                + ", ".join(sorted({x["lane"] for x in lanes})))
    return f"{len(VLLM_METRIC_SAMPLES)} series, {len(engines)} engine(s)"


declare_refusal("unknown_model", "routes", "a model nobody serves is vLLM's 404",
                cmpl(model="no-such-model"), status=404)


# --- completions and chat, basics and max_tokens


@check1("completion", "completions", "a completion with max_tokens", cmpl())
def _completion(a: Answer, ctx: Context) -> str:
    return completion(a, 8)


@check1("completion_max_tokens_omitted", "completions",
        "max_tokens omitted: vLLM's default of 16", cmpl(max_tokens=None, ignore_eos=True))
def _completion_default(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    tokens = usage(body)["completion_tokens"]
    need(tokens == 16 and finish(body) == "length", f"{tokens} tokens, {finish(body)}")
    return f"200, {tokens} tokens, length"


@check1("chat", "chat", "a chat with max_tokens", chat_call())
def _chat(a: Answer, ctx: Context) -> str:
    return chat(a, 8)


@check1("chat_max_tokens_omitted", "chat",
        "max_tokens omitted: ends with stop, or with length and says why (the rest of the "
        "context, or tailguard's documented extra field: the lane's cap)",
        chat_call(max_tokens=None))
def _chat_default(a: Answer, ctx: Context) -> str:
    body = ok(a, "chat.completion")
    reason = finish(body)
    u = usage(body)
    extra = body.get("tailguard") or {}
    if reason == "stop":
        return f"200, {u['completion_tokens']} tokens, stop" + (f", {extra}" if extra else "")
    whole_context = u["prompt_tokens"] + u["completion_tokens"] >= ctx.max_model_len
    capped = extra.get("max_tokens_capped") is True and extra.get("max_tokens") == u[
        "completion_tokens"] and extra.get("finish_reason") == "length"
    need(whole_context or capped, f"length after {u['completion_tokens']} tokens, with no reason "
         f"(prompt {u['prompt_tokens']}, context {ctx.max_model_len}, extra {extra})")
    return (f"200, length after {u['completion_tokens']} tokens: "
            + ("the whole context" if whole_context else f"the lane's cap, {extra}"))


@check1("max_completion_tokens", "chat", "max_completion_tokens bounds a chat",
        chat_call(max_tokens=None, max_completion_tokens=5, ignore_eos=True))
def _max_completion_tokens(a: Answer, ctx: Context) -> str:
    body = ok(a, "chat.completion")
    tokens = usage(body)["completion_tokens"]
    need(tokens == 5, f"{tokens} tokens, not 5")
    return "200, 5 tokens"


@check1("ignore_eos", "completions", "ignore_eos: exactly max_tokens tokens",
        cmpl(max_tokens=6, ignore_eos=True))
def _ignore_eos(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(usage(body)["completion_tokens"] == 6 and finish(body) == "length",
         f"{usage(body)['completion_tokens']} tokens")
    return "200, 6 tokens, length"


@check1("min_tokens", "completions", "min_tokens = max_tokens: exactly that many tokens",
        cmpl(max_tokens=4, min_tokens=4))
def _min_tokens(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(usage(body)["completion_tokens"] == 4, f"{usage(body)['completion_tokens']} tokens")
    return "200, 4 tokens"


@check1("model_omitted", "completions", "model omitted: the served model", cmpl(model=None))
def _model_omitted(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(body["model"] == ctx.model, f"model {body['model']!r}")
    return completion(a, 8)


@check1("chat_model_omitted", "chat", "model omitted on a chat: the served model",
        chat_call(model=None))
def _chat_model_omitted(a: Answer, ctx: Context) -> str:
    body = ok(a, "chat.completion")
    need(body["model"] == ctx.model, f"model {body['model']!r}")
    return chat(a, 8)


# --- streams


@check1("stream", "streams", "a stream: data lines, text_completion chunks, one finish, [DONE]",
        cmpl(max_tokens=5, stream=True, ignore_eos=True))
def _stream(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "text_completion")
    reason = final_reason(chunks)
    need(reason == "length", f"finish_reason {reason!r}")
    need(all(c.get("usage") is None for c in chunks), "usage without include_usage")
    return f"{len(chunks)} chunks, {stream_text(chunks)!r}, [DONE]"


@check1("chat_stream", "streams", "a chat stream: the role first, deltas, one finish, [DONE]",
        chat_call(max_tokens=5, stream=True, ignore_eos=True))
def _chat_stream(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "chat.completion.chunk")
    first = chunks[0]["choices"][0]["delta"]
    need(first.get("role") == "assistant", f"first delta {first}")
    need(final_reason(chunks) == "length", f"finish_reason {final_reason(chunks)!r}")
    return f"{len(chunks)} chunks, {stream_text(chunks)!r}, [DONE]"


@check1("stream_include_usage", "streams", "stream_options.include_usage: a last chunk with "
        "usage and no choices", cmpl(max_tokens=5, stream=True, ignore_eos=True,
                                     stream_options={"include_usage": True}))
def _stream_usage(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "text_completion")
    last = chunks[-1]
    need(last["choices"] == [] and last["usage"]["completion_tokens"] == 5, f"last chunk {last}")
    need(all(c.get("usage") is None for c in chunks[:-1]), "usage before the last chunk")
    return f"last chunk: usage {last['usage']}"


@check1("chat_stream_include_usage", "streams", "include_usage on a chat stream",
        chat_call(max_tokens=5, stream=True, ignore_eos=True,
                  stream_options={"include_usage": True}))
def _chat_stream_usage(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "chat.completion.chunk")
    last = chunks[-1]
    need(last["choices"] == [] and last["usage"]["completion_tokens"] == 5, f"last chunk {last}")
    return f"last chunk: usage {last['usage']}"


@check1("stream_continuous_usage", "streams", "continuous_usage_stats: usage on every chunk",
        cmpl(max_tokens=5, stream=True, ignore_eos=True,
             stream_options={"include_usage": True, "continuous_usage_stats": True}))
def _continuous_usage(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "text_completion")
    without = [c for c in chunks if not isinstance(c.get("usage"), dict)]
    need(not without, f"{len(without)} of {len(chunks)} chunks without usage")
    need(chunks[-1]["usage"]["completion_tokens"] == 5, f"last usage {chunks[-1]['usage']}")
    return f"{len(chunks)} chunks, each with usage"


@check1("chat_stream_continuous_usage", "streams", "continuous_usage_stats on a chat stream",
        chat_call(max_tokens=5, stream=True, ignore_eos=True,
                  stream_options={"include_usage": True, "continuous_usage_stats": True}))
def _chat_continuous_usage(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "chat.completion.chunk")
    content = [c for c in chunks if c["choices"]]
    need(all(isinstance(c.get("usage"), dict) for c in content), "a chunk without usage")
    return f"{len(chunks)} chunks, each with usage"


@check1("stream_n2", "streams", "a stream of n=2: both choices, each finished",
        cmpl(max_tokens=3, stream=True, ignore_eos=True, n=2, temperature=1.0))
def _stream_n2(a: Answer, ctx: Context) -> str:
    chunks = stream(a, "text_completion")
    reasons = [final_reason(chunks, i) for i in (0, 1)]
    return f"{len(chunks)} chunks, finish {reasons}"


declare_refusal("stream_options_without_stream", "streams",
                "stream_options without stream is vLLM's 400",
                cmpl(stream_options={"include_usage": True}))


# --- the Responses API

def respond(**body: Any) -> Call:
    return Call("responses", {"model": MODEL, "input": "Say hi.", "max_output_tokens": 8,
                              "store": False, **body})


def response_text(response: dict[str, Any]) -> str:
    return "".join(part.get("text") or "" for item in response.get("output") or ()
                   for part in item.get("content") or () if part.get("type") == "output_text")


@check1("responses", "responses", "a response with instructions and max_output_tokens",
        respond(instructions="Answer in one word."))
def _responses(a: Answer, ctx: Context) -> str:
    body = ok(a, "response")
    need(body.get("status") in ("completed", "incomplete"), f"status {body.get('status')!r}")
    tokens = usage(body)["output_tokens"]
    need(tokens <= 8, f"{tokens} output tokens > max_output_tokens 8")
    need(response_text(body), "no output text")
    return f"200, {body['status']}, {tokens} tokens"


@check1("responses_request_id", "responses", "the body's request_id is the response's id",
        respond(request_id="resp_compat-34"))
def _responses_request_id(a: Answer, ctx: Context) -> str:
    body = ok(a, "response")
    need(body.get("id") == "resp_compat-34", f"id {body.get('id')!r}")
    return "200, id resp_compat-34"


@check1("responses_stream", "responses", "a streamed response: events named by their type, "
        "created first, completed last, its deltas the final response's text",
        respond(stream=True))
def _responses_stream(a: Answer, ctx: Context) -> str:
    need(a.status == 200 and a.events, a.brief())
    events = a.chunks
    need(len(events) == len(a.events), "a payload that is not JSON (or a [DONE])")
    names = [line.removeprefix("event: ") for line in a.lines or () if line.startswith("event: ")]
    need(names == [e.get("type") for e in events], "event names that are not their types")
    need(events[0].get("type") == "response.created", f"first {events[0].get('type')!r}")
    last = events[-1]
    need(last.get("type") in ("response.completed", "response.incomplete"),
         f"last {last.get('type')!r}")
    deltas = "".join(e.get("delta") or "" for e in events
                     if e.get("type") == "response.output_text.delta")
    need(deltas == response_text(last["response"]), "the deltas are not the response's text")
    return f"{len(events)} events, {last['type']}"


@check1("responses_tools_auto", "responses", "a response with a function tool defined, "
        "tool_choice auto (the tool parser decides): completed, any call named and JSON",
        respond(max_output_tokens=40, tool_choice="auto", tools=[
            {"type": "function", **WEATHER_TOOL["function"]}]), needs=TOOL_PARSER)
def _responses_tools(a: Answer, ctx: Context) -> str:
    body = ok(a, "response")
    need(body.get("status") in ("completed", "incomplete"), f"status {body.get('status')!r}")
    calls = [item for item in body.get("output") or () if item.get("type") == "function_call"]
    for call in calls:
        need(call.get("name") == "get_weather", f"called {call.get('name')!r}")
        json.loads(call.get("arguments") or "{}")
    return f"200, {body['status']}, {len(calls)} tool call(s)"


@check("responses_previous_id", "responses", "previous_response_id of no stored response is "
       "refused (vLLM: 404, nothing stored; tailguard: documented 400, nothing is stored)",
       respond(previous_response_id="resp_compat-nothing"), refused="previous_response_id")
def _responses_previous_id(answers: Sequence[Answer], ctx: Context) -> str:
    return refused(answers[0], 404)


# --- messages and the chat template


def _prompt_tokens(a: Answer) -> int:
    return usage(ok(a, "chat.completion"))["prompt_tokens"]


@check("developer_role", "messages", "the developer role renders as system (same prompt tokens)",
       chat_call(messages=[{"role": "developer", "content": "Be brief."}, *_HI], max_tokens=2),
       chat_call(messages=[{"role": "system", "content": "Be brief."}, *_HI], max_tokens=2))
def _developer(answers: Sequence[Answer], ctx: Context) -> str:
    developer, system = (_prompt_tokens(a) for a in answers)
    need(developer == system, f"{developer} prompt tokens as developer, {system} as system")
    return f"{developer} prompt tokens either way"


@check("content_parts", "messages", "content as text parts renders their text (more prompt "
       "tokens than an empty message)",
       chat_call(messages=[{"role": "user", "content": [
           {"type": "text", "text": "Say hi"}, {"type": "text", "text": "to the world."}]}],
           max_tokens=2),
       chat_call(messages=[{"role": "user", "content": ""}], max_tokens=2))
def _content_parts(answers: Sequence[Answer], ctx: Context) -> str:
    parts, empty = (_prompt_tokens(a) for a in answers)
    need(parts >= empty + 5, f"{parts} prompt tokens with the parts, {empty} without")
    return f"{parts} prompt tokens ({empty} empty)"


@check1("system_and_turns", "messages", "system, user, assistant, user", chat_call(messages=[
    {"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Say bye."}]))
def _turns(a: Answer, ctx: Context) -> str:
    return chat(a, 8)


@check1("assistant_content_null", "messages", "an assistant message with content null",
        chat_call(messages=[{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": None},
                            {"role": "user", "content": "Say bye."}]))
def _content_null(a: Answer, ctx: Context) -> str:
    return chat(a, 8)


@check("add_generation_prompt_false", "messages", "add_generation_prompt false renders no "
       "assistant header (fewer prompt tokens)",
       chat_call(max_tokens=2, add_generation_prompt=False), chat_call(max_tokens=2))
def _no_generation_prompt(answers: Sequence[Answer], ctx: Context) -> str:
    without, with_ = (_prompt_tokens(a) for a in answers)
    need(without < with_, f"{without} prompt tokens without, {with_} with")
    return f"{without} prompt tokens without, {with_} with"


@check1("continue_final_message", "messages", "continue_final_message continues the assistant",
        chat_call(messages=[*_HI, {"role": "assistant", "content": "Hi! I am"}], max_tokens=4,
                  add_generation_prompt=False, continue_final_message=True))
def _continue(a: Answer, ctx: Context) -> str:
    return chat(a, 4)


@check1("chat_template_kwargs", "messages", "chat_template_kwargs reach the template",
        chat_call(chat_template_kwargs={"enable_thinking": False}))
def _template_kwargs(a: Answer, ctx: Context) -> str:
    return chat(a, 8)


declare_refusal("request_chat_template", "messages", "a chat_template in the request is vLLM's "
                "400 (without --trust-request-chat-template)",
                chat_call(chat_template="{{ messages[0]['content'] }}"))
declare_refusal("image_part_text_model", "messages", "an image part to a text-only model is "
                "vLLM's 400", chat_call(messages=[{"role": "user", "content": [
                    {"type": "text", "text": "What is it?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]))
check1("custom_role", "messages", "a role of the client's own (vLLM's custom message) renders",
       chat_call(messages=[{"role": "narrator", "content": "Hi"}, *_HI]))(served("chat"))


# --- tools


def _tool_call(a: Answer) -> str:
    body = ok(a, "chat.completion")
    calls = message(body).get("tool_calls") or []
    need(calls, f"no tool call: {message(body)}")
    fn = calls[0]["function"]
    need(fn["name"] == "get_weather", f"called {fn['name']!r}")
    args = json.loads(fn["arguments"])
    need(isinstance(args, dict) and args.get("unit") in ("c", "f"), f"arguments {fn['arguments']!r}")
    return f"200, {fn['name']}({fn['arguments']})"


@check1("tools_choice_none", "tools", "tools with tool_choice none: a plain answer",
        chat_call(tools=[WEATHER_TOOL], tool_choice="none"))
def _tools_none(a: Answer, ctx: Context) -> str:
    body = ok(a, "chat.completion")
    need(not message(body).get("tool_calls"), f"tool calls {message(body).get('tool_calls')}")
    return chat(a, 8)


@check1("tools_choice_named", "tools", "tool_choice naming a function: a call with valid "
        "arguments", chat_call(tools=[WEATHER_TOOL], max_tokens=40, tool_choice={
            "type": "function", "function": {"name": "get_weather"}}), needs=TOOL_PARSER)
def _tools_named(a: Answer, ctx: Context) -> str:
    return _tool_call(a)


@check1("tools_choice_required", "tools", "tool_choice required: a call with valid arguments",
        chat_call(tools=[WEATHER_TOOL], max_tokens=60, tool_choice="required"),
        needs=TOOL_PARSER)
def _tools_required(a: Answer, ctx: Context) -> str:
    return _tool_call(a)


@check1("tools_choice_auto", "tools", "tool_choice auto (the tool parser decides)",
        chat_call(tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=40), needs=TOOL_PARSER)
def _tools_auto(a: Answer, ctx: Context) -> str:
    return chat(a, 40)


@check1("tool_result_in_history", "tools", "an assistant tool call and the tool's result in "
        "the messages", chat_call(tools=[WEATHER_TOOL], tool_choice="none", messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"unit": "c"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "20 degrees"}]))
def _tool_history(a: Answer, ctx: Context) -> str:
    return chat(a, 8)


# --- fields real clients send that vLLM does not know, or ignores


for _name, _value in (("store", True), ("metadata", {"team": "compat"}),
                      ("service_tier", "auto"), ("user", "compat-user"),
                      ("prompt_cache_key", "compat"), ("x_unknown_field", 1)):
    check1(f"unknown_{_name}", "unknown fields", f"{_name} (sent by real clients) is ignored",
           chat_call(**{_name: _value}))(served("chat"))
check1("parallel_tool_calls", "unknown fields", "parallel_tool_calls with tools and "
       "tool_choice none", chat_call(tools=[WEATHER_TOOL], tool_choice="none",
                                     parallel_tool_calls=False))(served("chat"))
check1("completion_unknown_field", "unknown fields", "an unknown field on a completion is "
       "ignored", cmpl(x_unknown_field={"a": 1}))(served("completion"))


# --- sampling and output fields


@check1("n2", "sampling", "n=2: two choices", cmpl(n=2, max_tokens=3, temperature=1.0))
def _n2(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(sorted(c["index"] for c in body["choices"]) == [0, 1], f"{len(body['choices'])} choices")
    return "200, choices 0 and 1"


@check1("chat_n2", "sampling", "n=2 on a chat: two choices", chat_call(n=2, max_tokens=3,
                                                                     temperature=1.0))
def _chat_n2(a: Answer, ctx: Context) -> str:
    body = ok(a, "chat.completion")
    need(sorted(c["index"] for c in body["choices"]) == [0, 1], f"{len(body['choices'])} choices")
    return "200, choices 0 and 1"


@check1("logprobs", "sampling", "completion logprobs=2: tokens with their top 2",
        cmpl(max_tokens=3, logprobs=2, ignore_eos=True))
def _logprobs(a: Answer, ctx: Context) -> str:
    lp = choice(ok(a, "text_completion"))["logprobs"]
    need(len(lp["tokens"]) == 3 and len(lp["token_logprobs"]) == 3, f"logprobs {lp}")
    need(all(len(t) >= 2 for t in lp["top_logprobs"]), f"top_logprobs {lp['top_logprobs']}")
    return f"200, tokens {lp['tokens']}"


@check1("chat_logprobs", "sampling", "chat logprobs with top_logprobs=2",
        chat_call(max_tokens=3, logprobs=True, top_logprobs=2, ignore_eos=True))
def _chat_logprobs(a: Answer, ctx: Context) -> str:
    content = choice(ok(a, "chat.completion"))["logprobs"]["content"]
    need(len(content) == 3 and all(len(t["top_logprobs"]) == 2 for t in content),
         f"logprobs {content}")
    return f"200, {[t['token'] for t in content]}"


@check1("echo", "sampling", "echo: the prompt, then the completion", cmpl(max_tokens=3, echo=True))
def _echo(a: Answer, ctx: Context) -> str:
    text = text_of(ok(a, "text_completion"))
    need(text.startswith(_PARIS), f"text {text!r}")
    return f"200, {text!r}"


@check1("token_id_prompt", "sampling", "a prompt of token ids",
        cmpl(prompt=[TOKEN, TOKEN, TOKEN], max_tokens=3))
def _token_ids(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(usage(body)["prompt_tokens"] == 3, f"usage {usage(body)}")
    return completion(a, 3)


check1("prompt_batch", "sampling", "a prompt batch (two prompts): a choice per prompt",
       cmpl(prompt=[_PARIS, "Hello"], max_tokens=3), refused="prompt")(
    lambda a, ctx: (need(len(ok(a, "text_completion")["choices"]) == 2, "not 2 choices")
                    or "200, 2 choices"))
check1("min_p", "sampling", "min_p", cmpl(min_p=0.1, temperature=1.0))(served("completion"))
check1("top_k_0", "sampling", "top_k 0 (no top-k)", cmpl(top_k=0, temperature=1.0))(
    served("completion"))
check1("top_k_top_p", "sampling", "top_k 20 and top_p 0.9", cmpl(top_k=20, top_p=0.9,
                                                                 temperature=1.0))(
    served("completion"))
check1("penalties", "sampling", "presence, frequency and repetition penalties",
       cmpl(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2))(
    served("completion"))
check1("priority_int", "sampling", "priority as vLLM's integer (0, fcfs' only)",
       cmpl(priority=0))(served("completion"))


@check1("logit_bias", "sampling", "logit_bias +100 on a token: every token is it",
        cmpl(max_tokens=3, temperature=0, logit_bias={TOKEN: 100}))
def _logit_bias(a: Answer, ctx: Context) -> str:
    text = text_of(ok(a, "text_completion"))
    need(text == ctx.token_text * 3, f"text {text!r}, not {ctx.token_text * 3!r}")
    return f"200, {text!r}"


@check1("stop_token_ids", "sampling", "stop_token_ids: the biased token stops it",
        cmpl(max_tokens=5, temperature=0, logit_bias={TOKEN: 100}, stop_token_ids=[TOKEN]))
def _stop_token_ids(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    c = choice(body)
    need(c["finish_reason"] == "stop" and c.get("stop_reason") == ctx.token,
         f"finish {c['finish_reason']!r}, stop_reason {c.get('stop_reason')!r}")
    return f"200, stop at token {ctx.token}"


@check1("include_stop_str_in_output", "sampling", "include_stop_str_in_output keeps the stop "
        "string", cmpl(max_tokens=5, temperature=0, logit_bias={TOKEN: 100}, stop=[TOKEN_TEXT],
                       include_stop_str_in_output=True))
def _include_stop(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(finish(body) == "stop" and text_of(body) == ctx.token_text,
         f"text {text_of(body)!r}, {finish(body)}")
    return f"200, {text_of(body)!r}"


@check1("four_stop_strings", "sampling", "four stop strings (vLLM's most): the biased "
        "token's stops it", cmpl(max_tokens=5, temperature=0, logit_bias={TOKEN: 100},
                                 stop=["zzz1", "zzz2", "zzz3", TOKEN_TEXT]))
def _four_stops(a: Answer, ctx: Context) -> str:
    body = ok(a, "text_completion")
    need(finish(body) == "stop" and text_of(body) == "", f"text {text_of(body)!r}, {finish(body)}")
    return "200, stopped before any text"


declare_refusal("six_stop_strings", "sampling", "six stop strings: vLLM's 400 (past "
                "VLLM_MAX_STOP_STRINGS, 4)", cmpl(stop=["s1", "s2", "s3", "s4", "s5", "s6"]))


@check1("skip_special_tokens_false", "sampling", "skip_special_tokens false shows a special "
        "token", cmpl(max_tokens=2, temperature=0, ignore_eos=True, skip_special_tokens=False,
                      logit_bias={SPECIAL: 100}))
def _special(a: Answer, ctx: Context) -> str:
    text = text_of(ok(a, "text_completion"))
    need(ctx.special_text in text, f"text {text!r} without {ctx.special_text!r}")
    return f"200, {text!r}"


@check("seed", "sampling", "the same seed twice: the same text",
       cmpl(max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True),
       cmpl(max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True))
def _seed(answers: Sequence[Answer], ctx: Context) -> str:
    first, second = (text_of(ok(a, "text_completion")) for a in answers)
    need(first == second, f"{first!r} then {second!r}")
    return f"200 twice, {first!r}"


# --- structured output


@check1("response_format_json_object", "structured output", "response_format json_object: "
        "JSON", chat_call(max_tokens=30, response_format={"type": "json_object"}, messages=[
            {"role": "user", "content": "Give a JSON object with a key a."}]))
def _json_object(a: Answer, ctx: Context) -> str:
    content = message(ok(a, "chat.completion"))["content"]
    need(content.lstrip().startswith("{"), f"content {content!r}")
    return f"200, {content!r}"


@check1("response_format_json_schema", "structured output", "response_format json_schema: "
        "JSON of the schema", chat_call(max_tokens=30, response_format={
            "type": "json_schema", "json_schema": {"name": "yes_no", "schema": _SCHEMA}}))
def _json_schema(a: Answer, ctx: Context) -> str:
    content = message(ok(a, "chat.completion"))["content"]
    need(json.loads(content).get("answer") in ("yes", "no"), f"content {content!r}")
    return f"200, {content!r}"


@check1("structured_outputs_choice", "structured output", "structured_outputs choice",
        chat_call(structured_outputs={"choice": ["yes", "no"]}))
def _so_choice(a: Answer, ctx: Context) -> str:
    content = message(ok(a, "chat.completion"))["content"]
    need(content in ("yes", "no"), f"content {content!r}")
    return f"200, {content!r}"


@check1("structured_outputs_regex", "structured output", "structured_outputs regex on a "
        "completion", cmpl(structured_outputs={"regex": "[0-9]{3}"}))
def _so_regex(a: Answer, ctx: Context) -> str:
    text = text_of(ok(a, "text_completion"))
    need(re.fullmatch("[0-9]{3}", text), f"text {text!r}")
    return f"200, {text!r}"


# --- what tailguard refuses on purpose (vLLM serves or ignores it)


check1("guided_json", "refused on purpose", "guided_json (removed from vLLM, which ignores "
       "it)", chat_call(guided_json=_SCHEMA), refused="guided_json")(served("chat"))
check1("guided_choice", "refused on purpose", "guided_choice (removed from vLLM, which ignores "
       "it)", cmpl(guided_choice=["yes", "no"]), refused="guided_choice")(served("completion"))
check1("guided_regex", "refused on purpose", "guided_regex (removed from vLLM)",
       cmpl(guided_regex="[0-9]+"), refused="guided_regex")(served("completion"))
check1("use_beam_search", "refused on purpose", "use_beam_search with n=2",
       cmpl(use_beam_search=True, n=2, max_tokens=3), refused="use_beam_search")(
    served("completion"))
check1("kv_transfer_params", "refused on purpose", "kv_transfer_params (no KV connector: "
       "vLLM ignores it)", cmpl(kv_transfer_params={"do_remote_prefill": False}),
       refused="kv_transfer_params")(served("completion"))


# --- bodies no engine can run: a 400 before anything is queued


declare_refusal("seed_2_70", "refused before queueing", "seed 2**70 (past 64 bits) is a 400",
                cmpl(seed=2**70), required=True)
declare_refusal("min_tokens_over_max_tokens", "refused before queueing", "min_tokens above "
                "max_tokens is a 400", cmpl(min_tokens=10, max_tokens=5), required=True)
declare_refusal("negative_max_tokens", "refused before queueing", "max_tokens -1 is a 400",
                cmpl(max_tokens=-1))
declare_refusal("negative_temperature", "refused before queueing", "temperature -1 is a 400",
                cmpl(temperature=-1))
declare_refusal("logprobs_over_max", "refused before queueing", "logprobs past the model's "
                "max_logprobs is a 400", cmpl(logprobs=50))
declare_refusal("token_id_out_of_vocab", "refused before queueing", "a token id past the "
                "vocabulary is a 400", cmpl(prompt=[10**8]))
declare_refusal("prompt_too_long", "refused before queueing", "a prompt past the context is a "
                "400", cmpl(prompt="hello " * 6000))
declare_refusal("empty_messages", "refused before queueing", "no messages is a 400",
                chat_call(messages=[]))
# last: a server that takes a NaN might not survive it
declare_refusal("nan_temperature", "refused before queueing", "temperature NaN (JSON from a "
                "JavaScript client; the SDK cannot send it) is a 400",
                Call("raw", path="/v1/completions", data='{"model": "$MODEL", "prompt": "hi", '
                                                          '"max_tokens": 2, "temperature": NaN}'),
                required=True)


CHECKS: tuple[Check, ...] = tuple(_DECLARED)


def by_name(names: Sequence[str] | None = None) -> tuple[Check, ...]:
    """The checks named (all by default), in their order; ValueError for an unknown name."""
    if not names:
        return CHECKS
    known = {c.name: c for c in CHECKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown checks: {', '.join(unknown)}")
    return tuple(c for c in CHECKS if c.name in names)


__all__ = ["CHECKS", "by_name"]
