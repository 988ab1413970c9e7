"""The OpenAI API on top of tailguard: request bodies in, response bodies out.

Why: clients already speak OpenAI's ``/v1/completions`` and
``/v1/chat/completions`` (vLLM's server does too). This module turns such a
body into tailguard's own ``JobRequest``, so the lanes, costs and caps apply
unchanged, and builds OpenAI-shaped answers, chunks and error bodies. It is
pure: no Flask, no Redis, no engine; the chat template is passed in as
``render``. Framing chunks as server-sent events and choosing HTTP statuses is
the app's (``app/sse.py``, ``app/errors.py``).

What is accepted is what vLLM accepts, less what tailguard cannot honour: one
prompt (no batches, no token ids), ``n == 1``, no logprobs, no tools. A field
tailguard does not know is a 400 naming it, as on the native API: a typo
silently ignored is worse than an error. Fields that OpenAI clients send by
default with inert values (``user``, ``logprobs: false``, ``echo: false``,
``logit_bias: {}``, penalties of 0, …) are accepted and ignored. The sampling
fields and their bounds are ``tailguard.sampling``'s table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from tailguard.errors import InvalidField, ModelNotFound
from tailguard.gateway.job_request import JobRequest, parse_job_request
from tailguard.sampling import MAX_TOKENS, as_int, field_names

Kind = Literal["completion", "chat"]

#: Roles a chat message may have (OpenAI's, "developer" included).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

#: Message keys passed to the template besides role and content.
_MESSAGE_PASSTHROUGH = ("name", "tool_call_id")

#: Fields passed through to tailguard's request validator unchanged: the sampling table's and
#: tailguard's own priority.
_PASSED = ("priority", *field_names("openai"))

#: Fields read here (not part of the native body).
_OWN = ("model", "stream", "stream_options", "n")

#: Fields clients send by default; only their inert value is accepted, and then ignored.
_INERT: dict[str, Callable[[Any], bool]] = {
    "user": lambda v: v is None or isinstance(v, str),
    "logprobs": lambda v: v is None or v is False,
    "echo": lambda v: v is None or v is False,
    "logit_bias": lambda v: v is None or v == {},
}
_INERT_COMPLETION: dict[str, Callable[[Any], bool]] = {
    "suffix": lambda v: v is None,
    "best_of": lambda v: v is None or (v == 1 and not isinstance(v, bool)),
}
_INERT_CHAT: dict[str, Callable[[Any], bool]] = {
    "top_logprobs": lambda v: v is None or (v == 0 and not isinstance(v, bool)),
}

#: Each endpoint's own fields, and the inert ones it accepts, besides the common ones.
_ENDPOINT_FIELDS: dict[Kind, tuple[tuple[str, ...], dict[str, Callable[[Any], bool]]]] = {
    "completion": (("prompt",), {**_INERT, **_INERT_COMPLETION}),
    "chat": (("messages", "max_completion_tokens"), {**_INERT, **_INERT_CHAT}),
}

#: The payload of the last event of an OpenAI stream.
STREAM_DONE = "[DONE]"

#: finish_reason values of the OpenAI API; anything else is mapped by openai_finish_reason.
OPENAI_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})


@dataclass(frozen=True)
class OpenAIRequest:
    job: JobRequest
    model: str  # as the client sent it: echoed back in every response
    stream: bool
    include_usage: bool  # stream_options.include_usage, and only when streaming
    kind: Kind


# ---------------------------------------------------------------- requests


def parse_completion_request(body: Any, served_names: set[str]) -> OpenAIRequest:
    """POST /v1/completions body to an OpenAIRequest, or InvalidField/ModelNotFound."""
    _check_fields(body, "completion")
    model = _model(body, served_names)
    prompt = _completion_prompt(body.get("prompt"))
    return _build(body, model, prompt, max_tokens_field="max_tokens", kind="completion")


def parse_chat_request(body: Any, served_names: set[str],
                       render: Callable[[list[dict]], str]) -> OpenAIRequest:
    """POST /v1/chat/completions body to an OpenAIRequest, the prompt rendered by ``render``.

    ``render`` gets the validated messages with every content as one string
    (what chat templates expect) and returns the prompt text, e.g.
    ``lambda m: render_chat(m, template, bos_token=..., eos_token=...)``.
    """
    _check_fields(body, "chat")
    # model before messages, as for completions: an unknown model is a 404 whatever else is wrong
    model = _model(body, served_names)
    messages = normalize_messages(body.get("messages"))
    prompt = render(messages)
    if not isinstance(prompt, str) or not prompt:
        raise InvalidField("the chat template rendered these messages to an empty prompt",
                           field="messages")
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    built = _build(body, model, prompt, max_tokens_field=field, kind="chat")
    # Like vLLM's chat endpoint: the rendered template is tokenized without special tokens.
    return replace(built, job=replace(built.job, add_special_tokens=False))


def normalize_messages(messages: Any) -> list[dict]:
    """Validate OpenAI chat messages; each comes back as {role, content: str, name?, tool_call_id?}.

    Text content parts are joined with newlines, as vLLM does for text-only
    content. Keys with a null value (``tool_calls: null``, ``refusal: null``,
    what a client echoing an earlier assistant message sends) are dropped.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidField("messages is required and must be a non-empty list", field="messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidField(f"{where} must be an object", field="messages")
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise InvalidField(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {role!r}",
                               field="messages")
        extra = sorted(k for k, v in msg.items()
                       if k not in ("role", "content", *_MESSAGE_PASSTHROUGH) and v not in (None, []))
        if extra:
            raise InvalidField(f"{where}: unsupported key(s) {', '.join(extra)} (tool calls, audio "
                               "and the like are not supported)", field="messages")
        norm = {"role": role, "content": _message_content(msg.get("content"), where)}
        for key in _MESSAGE_PASSTHROUGH:
            value = msg.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise InvalidField(f"{where}.{key} must be a string", field="messages")
            norm[key] = value
        out.append(norm)
    return out


def _message_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidField(f"{where}.content must be a string or a list of text parts",
                           field="messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise InvalidField(f"{where}.content[{j}]: only text parts ({{\"type\": \"text\", "
                               f"\"text\": ...}}) are supported, got type {kind!r}", field="messages")
        if not isinstance(part.get("text"), str):
            raise InvalidField(f"{where}.content[{j}].text must be a string", field="messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _completion_prompt(prompt: Any) -> str:
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        elif prompt and all(isinstance(p, str) for p in prompt):
            raise InvalidField(f"batching is unsupported: send one request per prompt "
                               f"(got a list of {len(prompt)})", field="prompt")
        elif prompt:
            raise InvalidField("token-id prompts are unsupported: send the prompt as text",
                               field="prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidField("prompt is required and must be a non-empty string", field="prompt")
    return prompt


def known_fields(kind: Kind) -> frozenset[str]:
    """Every field a body of this endpoint may carry (the OpenAPI description lists them)."""
    own, inert = _ENDPOINT_FIELDS[kind]
    return frozenset({*own, *_OWN, *_PASSED, *inert})


def inert_fields(kind: Kind) -> frozenset[str]:
    """The fields of this endpoint accepted with their default value only, and ignored."""
    return frozenset(_ENDPOINT_FIELDS[kind][1])


def _check_fields(body: Any, kind: Kind) -> None:
    """Unknown fields and non-inert values of ignored fields are 400s naming the field."""
    if not isinstance(body, dict):
        raise InvalidField("the body must be a JSON object", field="body")
    known = known_fields(kind)
    inert = _ENDPOINT_FIELDS[kind][1]
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidField(f"unknown or unsupported field(s): {', '.join(unknown)} "
                           f"(known: {', '.join(sorted(known))})", field=unknown[0])
    for name, is_inert in inert.items():
        if name in body and not is_inert(body[name]):
            raise InvalidField(f"{name}={body[name]!r} is not supported; omit it or send "
                               "its default", field=name)


def _model(body: dict, served_names: set[str]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidField("model is required and must be a string", field="model")
    if model not in served_names:
        raise ModelNotFound(f"The model `{model}` does not exist.", field="model")
    return model


def _build(body: dict, model: str, prompt: str, *, max_tokens_field: str,
           kind: Kind) -> OpenAIRequest:
    """Fields common to both endpoints; sampling goes through the request validator."""
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidField("stream must be true or false", field="stream")
    include_usage = _include_usage(body.get("stream_options"))
    n = body.get("n")
    if n is not None and as_int("n", n, 1) > 1:
        raise InvalidField(f"n > 1 is not supported: send {n} requests (got n={n})", field="n")

    # null means "default" in OpenAI bodies; the native validator wants it absent
    native = {k: body[k] for k in _PASSED if body.get(k) is not None}
    if max_tokens_field != MAX_TOKENS.name:  # max_completion_tokens wins; a bad max_tokens is still a 400
        native[MAX_TOKENS.name] = MAX_TOKENS.parse(body[max_tokens_field], max_tokens_field)
        if body.get(MAX_TOKENS.name) is not None:
            MAX_TOKENS.parse(body[MAX_TOKENS.name])
    native["prompt"] = prompt
    job = parse_job_request(native, api="openai")
    return OpenAIRequest(job=job, model=model, stream=stream,
                         include_usage=stream and include_usage, kind=kind)


def _include_usage(options: Any) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidField("stream_options must be an object", field="stream_options")
    value = options.get("include_usage")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidField("stream_options.include_usage must be true or false",
                           field="stream_options")
    return value


# ---------------------------------------------------------------- responses


def openai_finish_reason(reason: str) -> str:
    """tailguard/vLLM finish reason to OpenAI's: only a natural end is "stop".

    "deadline" (the lane deadline cut the output), "abort", "cancelled" and any
    other cut become "length": to a client, "length" means "the text is
    truncated", "stop" that it is complete, and a truncated text must not pass
    for a complete one. The precise reason travels in a response header.
    """
    return reason if reason in OPENAI_FINISH_REASONS else "length"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _id(kind: Kind, request_id: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}"


def completion_response(*, request_id: str, model: str, created: int, text: str, finish_reason: str,
                        prompt_tokens: int, completion_tokens: int) -> dict:
    """The body of a non-streamed /v1/completions answer."""
    return {
        "id": _id("completion", request_id), "object": "text_completion", "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def chat_response(*, request_id: str, model: str, created: int, text: str, finish_reason: str,
                  prompt_tokens: int, completion_tokens: int) -> dict:
    """The body of a non-streamed /v1/chat/completions answer."""
    return {
        "id": _id("chat", request_id), "object": "chat.completion", "created": created,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def completion_chunk(*, request_id: str, model: str, created: int, text: str,
                     finish_reason: str | None = None) -> dict:
    """One streamed /v1/completions event; the last one carries finish_reason."""
    return {
        "id": _id("completion", request_id), "object": "text_completion", "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": None,
    }


def chat_chunk(*, request_id: str, model: str, created: int, text: str = "",
               finish_reason: str | None = None, first: bool = False) -> dict:
    """One streamed /v1/chat/completions event.

    The first (``first=True``) announces the role, ``{"role": "assistant",
    "content": ""}``; the next ones carry ``{"content": text}``; the last one
    has finish_reason and an empty delta (or the last text, if any).
    """
    if first:
        delta: dict[str, str] = {"role": "assistant", "content": text}
    elif finish_reason is not None and not text:
        delta = {}
    else:
        delta = {"content": text}
    return {
        "id": _id("chat", request_id), "object": "chat.completion.chunk", "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        "usage": None,
    }


def usage_chunk(*, kind: Kind, request_id: str, model: str, created: int, prompt_tokens: int,
                completion_tokens: int) -> dict:
    """The usage-only event (``choices: []``) sent last when stream_options.include_usage is set."""
    return {
        "id": _id(kind, request_id),
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created, "model": model, "choices": [],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def error_body(message: str, *, type: str, param: str | None, code: str | int | None) -> dict:
    """``{"error": {message, type, param, code}}``, the OpenAI error shape."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}

