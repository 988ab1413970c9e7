"""vLLM's own OpenAI serving layer on one engine: what a client of an OpenAI job gets is vLLM's.

An OpenAI job (its task message's ``openai``: tailguard/worker/runner.py) runs through
``OpenAIServingChat``, ``OpenAIServingCompletion`` or ``OpenAIServingResponses`` (the
Responses API: its events and response objects, marked by `mark_response`), with
``OpenAIServingModels`` and an
``OnlineRenderer``, built once per engine on its loop as vLLM's api_server builds them
(vllm/entrypoints/launchers/api_server/app_state.py, vllm/entrypoints/generate/api_router.py),
from the frontend options of TAILGUARD_OPENAI_ARGS (tailguard/openai_args.py). The API
rendered and validated the same body with vLLM's render layer before queueing it, so a
refusal here is rare; it ends the job with EngineRefused (a 400), never a 5xx a client would retry.

The serving classes see the engine through `ObservedEngine`: what one OpenAI request sends
to the engine is recorded on its `Progress` (its engine request ids, prompt and output
tokens, the first text), found through a context variable that the request's task carries.
That tells the host what the chunks do not always say (the tokens of a stream without
usage, the ids to abort) without changing a line of vLLM's.

A deadline or a cancel ends a request by aborting its engine requests (``AsyncLLM.abort``
by their external ids, which the children of n > 1 share with their parent), never by
cancelling the serving coroutine, so vLLM's serving layer itself ends the stream (finish
chunks, usage chunk) or builds the response (with usage) from the aborted output. vLLM
reports such a choice with finish_reason "abort"; a deadline's becomes "length", and the
final chunk of each choice and the response carry the ``tailguard`` extra field
(`mark_final`), which OpenAI SDK objects keep (``model_extra["tailguard"]``).
What vLLM 0.32 emits after an abort (seen on a real engine, tests/e2e/test_openai_serving_on_an_engine.py):
a choice with output so far gets its finish chunk (empty delta, "abort") and the usage
chunk follows with the tokens streamed; a choice aborted before its first token gets no
finish chunk at all (vLLM skips empty outputs), so the host adds one in vLLM's own shape
(`finish_chunk`) before the usage chunk. A non-streamed request's response has each
aborted choice with its text so far and "abort".

Frames: vLLM's generators yield ``data: <payload>\\n\\n``; the payloads are handed on as
they are (the API frames them again, and adds ``[DONE]`` after the job's end event), except
the final chunks, which are parsed, marked and serialized again. An error payload (vLLM's
``{"error": ...}``, e.g. the engine died mid-stream) is not a chunk: it ends the request
with the error it names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tailguard.errors import EngineDeadError, EngineError, EngineRefused

if TYPE_CHECKING:  # vLLM is imported only where an engine runs
    from vllm.v1.engine.async_llm import AsyncLLM

ENDPOINTS = ("chat", "completion", "responses")
#: the events that end a Responses stream, each carrying the whole response
_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")
#: how the payloads of vLLM's SSE frames start and end
_DATA, _END = "data: ", "\n\n"
DONE = "[DONE]"
#: Starlette's JSONResponse, which vLLM answers a non-streamed request with
_JSON = {"ensure_ascii": False, "allow_nan": False, "separators": (",", ":")}


# --- what one request did in the engine ------------------------------------------------------

@dataclass
class Progress:
    """One OpenAI request's engine requests, as `ObservedEngine` saw them (on the loop)."""

    wall_t0: float = field(default_factory=time.time)
    request_ids: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    #: (engine request #, choice index) -> its output tokens so far
    tokens: dict[tuple[int, int], int] = field(default_factory=dict)
    #: vLLM's time to the first token of a non-streamed request (its request metrics)
    engine_ttft_s: float | None = None
    #: why the host aborted it: "deadline", "cancelled", "shutdown"; None while it runs
    stopped: str | None = None
    #: added to the id of each engine request: ids the host can abort by without touching
    #: another request's (a caller's request_id, which vLLM's ids start from, may repeat)
    engine_id_suffix: str = ""

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens.values())

    async def observe(self, outputs: AsyncIterator[Any], request_id: str,
                      delta: bool) -> AsyncIterator[Any]:
        """`outputs` (one engine request's, `delta`: vLLM's DELTA kind) passed on, counted."""
        slot = len(self.request_ids)
        self.request_ids.append(request_id)
        prompt_counted = False
        async with contextlib.aclosing(outputs):  # closing it aborts the engine request
            async for out in outputs:
                if not prompt_counted and out.prompt_token_ids is not None:
                    self.prompt_tokens += len(out.prompt_token_ids)
                    prompt_counted = True
                for choice in out.outputs:
                    key = (slot, choice.index)
                    self.tokens[key] = (self.tokens.get(key, 0) if delta else 0) + len(
                        choice.token_ids)
                metrics = getattr(out, "metrics", None)
                if out.finished and metrics is not None and getattr(
                        metrics, "first_token_latency", 0) > 0 and self.engine_ttft_s is None:
                    self.engine_ttft_s = max(0.0, metrics.arrival_time - self.wall_t0
                                             + metrics.first_token_latency)
                yield out


#: the Progress of the OpenAI request whose task is running (set by OpenAIServing.run)
_PROGRESS: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "tailguard_openai_progress", default=None)


class ObservedEngine:
    """An AsyncLLM as vLLM's serving classes get it: itself, with each ``generate`` of an
    OpenAI request recorded on that request's Progress (the module docstring)."""

    def __init__(self, engine: AsyncLLM) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Any, sampling_params: Any, request_id: str, *args: Any,
                 **kwargs: Any) -> AsyncIterator[Any]:
        from vllm.sampling_params import RequestOutputKind

        progress = _PROGRESS.get()
        if progress is None:
            return self._engine.generate(prompt, sampling_params, request_id, *args, **kwargs)
        # vLLM's serving layer builds its response from its own id, never the engine's outputs'
        request_id += progress.engine_id_suffix
        outputs = self._engine.generate(prompt, sampling_params, request_id, *args, **kwargs)
        delta = getattr(sampling_params, "output_kind", None) == RequestOutputKind.DELTA
        return progress.observe(outputs, request_id, delta)


# --- final chunks and responses --------------------------------------------------------------

def mark_final(obj: dict[str, Any], extra: dict[str, Any], *, deadline: bool) -> str | None:
    """Mark a chunk's or a response's finished choices in place: with `deadline` (the host
    aborted it at the lane's deadline), vLLM's "abort" becomes "length"; `obj` gets the
    ``tailguard`` field (`extra` and its finish_reason: "deadline" when the deadline cut a
    choice, else the first finished choice's). Returns that finish_reason; None (and `obj`
    untouched) when no choice in it has finished."""
    reasons = []
    for choice in obj.get("choices") or ():
        reason = choice.get("finish_reason")
        if reason is None:
            continue
        if deadline and reason == "abort":
            choice["finish_reason"] = "length"
            reason = "deadline"
        reasons.append(reason)
    if not reasons:
        return None
    finish = "deadline" if "deadline" in reasons else reasons[0]
    obj["tailguard"] = {**extra, "finish_reason": finish}
    return finish


def mark_response(obj: dict[str, Any], extra: dict[str, Any], *, deadline: bool) -> str:
    """Mark a Responses API response (vLLM's ResponsesResponse, as a dict) in place with the
    ``tailguard`` field, as `mark_final` marks a chat's; its finish_reason: "deadline" when the
    host aborted it at the lane's deadline, "length" when vLLM says it is incomplete (its
    max_output_tokens), else "stop"."""
    finish = ("deadline" if deadline else "length" if obj.get("status") == "incomplete"
              else "stop")
    obj["tailguard"] = {**extra, "finish_reason": finish}
    return finish


def finish_chunk(endpoint: str, index: int, *, chunk_id: str, created: int, model: str) -> str:
    """The finish chunk vLLM sends for an aborted choice (an empty delta, "abort"), for choice
    `index`, which vLLM skipped since it was aborted before its first token: vLLM's own
    classes with the fields its stream generator sets, serialized as it serializes them."""
    if endpoint == "chat":
        from vllm.entrypoints.generate.base.protocol import DeltaMessage
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionResponseStreamChoice,
            ChatCompletionStreamResponse,
        )

        chunk: Any = ChatCompletionStreamResponse(
            id=chunk_id, object="chat.completion.chunk", created=created, model=model,
            choices=[ChatCompletionResponseStreamChoice(
                index=index, delta=DeltaMessage(content=""), logprobs=None,
                finish_reason="abort", stop_reason=None, token_ids=None)])
    else:
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionResponseStreamChoice,
            CompletionStreamResponse,
        )

        chunk = CompletionStreamResponse(
            id=chunk_id, object="text_completion", created=created, model=model,
            choices=[CompletionResponseStreamChoice(
                index=index, text="", logprobs=None, finish_reason="abort", stop_reason=None,
                prompt_token_ids=None, token_ids=None)])
    return chunk.model_dump_json(exclude_unset=True)


def has_output(chunk: dict[str, Any]) -> bool:
    """Whether a chunk carries generated output (text, reasoning, tool calls), not only a role."""
    for choice in chunk.get("choices") or ():
        if choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning") or delta.get("tool_calls"):
            return True
    return False


def payload_of(frame: str) -> str:
    """The payload of one of vLLM's SSE frames (``data: <payload>\\n\\n``)."""
    if frame.startswith(_DATA):
        frame = frame[len(_DATA):]
    return frame[:-len(_END)] if frame.endswith(_END) else frame


@dataclass
class _Stream:
    """What the host follows of one streamed request's payloads (on the loop)."""

    endpoint: str
    extra: dict[str, Any]
    emit: Callable[[str], None]
    on_text: Callable[[], None]
    progress: Progress
    fallback_id: str
    model: str
    choices: int  # per engine request (n)
    seen_text: bool = False
    chunk_id: str | None = None
    created: int = 0
    finished: dict[int, str] = field(default_factory=dict)  # choice index -> tailguard's reason

    def take(self, payload: str) -> None:
        """One payload: passed on as it is, or marked (a final chunk), or raised (an error)."""
        if payload.startswith('{"error"'):
            raise _ServingError(json.loads(payload).get("error") or {})
        # A finished choice says "finish_reason":"..." (JSON text escapes its quotes, so no
        # text can spell that); the usage chunk has no choices. Others pass unparsed once
        # the first text has come.
        final = '"finish_reason":"' in payload
        usage = '"choices":[]' in payload
        if self.chunk_id is None or not self.seen_text or final or usage:
            chunk = json.loads(payload)
            if self.chunk_id is None:
                self.chunk_id, self.created = chunk.get("id"), chunk.get("created", 0)
                self.model = chunk.get("model", self.model)
            if usage and not chunk.get("choices"):
                self.add_missing_finishes()
            if final:
                finish = mark_final(chunk, self.extra, deadline=self.progress.stopped == "deadline")
                for choice in chunk.get("choices") or ():
                    if choice.get("finish_reason") is not None and finish is not None:
                        self.finished[choice.get("index", 0)] = finish
                payload = json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
            if not self.seen_text and has_output(chunk):
                self.seen_text = True
                self.emit(payload)
                self.on_text()
                return
        self.emit(payload)

    def add_missing_finishes(self) -> None:
        """After a deadline, a finish chunk for each choice vLLM sent none (the docstring)."""
        if self.progress.stopped != "deadline":
            return
        total = self.choices * max(1, len(self.progress.request_ids))
        for index in range(total):
            if index in self.finished:
                continue
            chunk = json.loads(finish_chunk(
                self.endpoint, index, chunk_id=self.chunk_id or self.fallback_id,
                created=self.created or int(time.time()), model=self.model))
            self.finished[index] = mark_final(chunk, self.extra, deadline=True) or "deadline"
            self.emit(json.dumps(chunk, ensure_ascii=False, separators=(",", ":")))


class _ServingError(Exception):
    """vLLM's serving layer answered with an error (its ErrorInfo as a dict)."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(info.get("message", ""))
        self.info = info


@dataclass(frozen=True)
class Outcome:
    """How one OpenAI request ended on the serving layer."""

    response: str | None  # a non-streamed request's response JSON (marked)
    #: "deadline" when the deadline cut a choice, else choice 0's ("stop" when it has none)
    finish_reason: str


def _responses_serving(engine: Any, models: Any, renderer: Any, args: argparse.Namespace,
                       request_logger: Any, chat_template: Any, reasoning_parser: str,
                       template_kwargs: dict[str, Any]) -> Any:
    """vLLM's OpenAIServingResponses as its init_generate_state builds it, without a tool
    server (no built-in tools) and without a store (tailguard refuses what needs one)."""
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

    return OpenAIServingResponses(
        engine, models, renderer, request_logger=request_logger, chat_template=chat_template,
        chat_template_content_format=args.chat_template_content_format,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_auto_tools=args.enable_auto_tool_choice, tool_parser=args.tool_call_parser,
        tool_strict_level=args.tool_strict_level, tool_server=None,
        reasoning_parser=reasoning_parser,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        enable_per_request_metrics=args.enable_per_request_metrics,
        enable_log_outputs=args.enable_log_outputs,
        default_chat_template_kwargs=template_kwargs)


class OpenAIServing:
    """vLLM's serving classes on one engine (built on its loop by `build`)."""

    def __init__(self, engine: AsyncLLM, chat: Any, completion: Any, models: Any,
                 responses: Any = None) -> None:
        self.engine, self.chat, self.completion, self.models = engine, chat, completion, models
        self.responses = responses

    @classmethod
    async def build(cls, engine: AsyncLLM, args: argparse.Namespace, model: str,
                    served_names: Sequence[str]) -> OpenAIServing:
        """On the engine's loop, as vLLM's init_app_state and init_generate_state build them
        for a `vllm serve` of `model` under `served_names` with `args` (TAILGUARD_OPENAI_ARGS
        as tailguard.openai_args.frontend_args parsed them)."""
        from vllm.entrypoints.launchers.cli_args import resolve_default_chat_template_kwargs
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.entrypoints.serve.utils.api_utils import process_lora_modules
        from vllm.entrypoints.serve.utils.fingerprint import set_default_fingerprint_mode
        from vllm.entrypoints.serve.utils.request_logger import RequestLogger
        from vllm.renderers.chat_utils import load_chat_template
        from vllm.renderers.online_renderer import OnlineRenderer

        observed: Any = ObservedEngine(engine)
        vllm_config = engine.vllm_config
        reasoning_parser = vllm_config.structured_outputs_config.reasoning_parser or (
            args.reasoning_parser or "")
        if args.tool_call_parser is not None:
            from vllm.parser.metrics import init_parser_metrics

            init_parser_metrics(model_name=served_names[0])
        request_logger = (RequestLogger(max_log_len=args.max_log_len)
                          if args.enable_log_requests else None)
        chat_template = load_chat_template(args.chat_template)
        template_kwargs = resolve_default_chat_template_kwargs(args)
        default_mm_loras = (vllm_config.lora_config.default_mm_loras
                            if vllm_config.lora_config is not None else {})
        models = OpenAIServingModels(
            engine_client=observed,
            base_model_paths=[BaseModelPath(name=name, model_path=model) for name in served_names],
            lora_modules=process_lora_modules(args.lora_modules, default_mm_loras))
        await models.init_static_loras()
        renderer = OnlineRenderer(
            model_config=engine.model_config, renderer=engine.renderer,
            request_logger=request_logger, chat_template=chat_template,
            chat_template_content_format=args.chat_template_content_format,
            trust_request_chat_template=args.trust_request_chat_template,
            trust_request_mm_kwargs=args.trust_request_mm_kwargs,
            enable_auto_tools=args.enable_auto_tool_choice,
            exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
            tool_parser=args.tool_call_parser, tool_strict_level=args.tool_strict_level,
            reasoning_parser=reasoning_parser, default_chat_template_kwargs=template_kwargs,
            log_error_stack=args.log_error_stack)
        renderer.warmup()
        set_default_fingerprint_mode(getattr(args, "fingerprint_mode", "full"),
                                     getattr(args, "fingerprint_value", None))
        chat = OpenAIServingChat(
            engine_client=observed, models=models, response_role=args.response_role,
            online_renderer=renderer, request_logger=request_logger, chat_template=chat_template,
            chat_template_content_format=args.chat_template_content_format,
            default_chat_template_kwargs=template_kwargs,
            trust_request_chat_template=args.trust_request_chat_template,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            enable_auto_tools=args.enable_auto_tool_choice,
            exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
            tool_parser=args.tool_call_parser, tool_strict_level=args.tool_strict_level,
            reasoning_parser=reasoning_parser,
            enable_prompt_tokens_details=args.enable_prompt_tokens_details,
            enable_force_include_usage=args.enable_force_include_usage,
            enable_log_outputs=args.enable_log_outputs, enable_log_deltas=args.enable_log_deltas,
            enable_per_request_metrics=args.enable_per_request_metrics)
        completion = OpenAIServingCompletion(
            observed, models, online_renderer=renderer, request_logger=request_logger,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            enable_prompt_tokens_details=args.enable_prompt_tokens_details,
            enable_force_include_usage=args.enable_force_include_usage,
            enable_per_request_metrics=args.enable_per_request_metrics)
        responses = _responses_serving(observed, models, renderer, args, request_logger,
                                       chat_template, reasoning_parser, template_kwargs)
        return cls(engine, chat, completion, models, responses)

    async def run(self, endpoint: str, body: dict[str, Any], progress: Progress,
                  extra: dict[str, Any], emit: Callable[[str], None],
                  on_text: Callable[[], None]) -> Outcome:
        """Run one request (`body`: the client's, as the API validated it) to its end: a
        stream's payloads go to `emit` in order (`on_text` right after the first with output),
        a response comes back in the Outcome. Raises EngineRefused when the serving layer
        refuses it, EngineDeadError when the engine died, EngineError otherwise."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        _PROGRESS.set(progress)  # this task's own context: what ObservedEngine reads
        if endpoint not in ENDPOINTS:
            raise EngineRefused(f"unknown OpenAI endpoint {endpoint!r}", field="endpoint")
        try:
            if endpoint == "responses":
                return await self._respond(body, progress, extra, emit, on_text)
            if endpoint == "chat":
                request: Any = ChatCompletionRequest.model_validate(body)
                result = await self.chat.create_chat_completion(request)
            else:
                request = CompletionRequest.model_validate(body)
                result = await self.completion.create_completion(request)
            if isinstance(result, ErrorResponse):
                raise _ServingError(result.error.model_dump())
            if not hasattr(result, "__aiter__"):
                obj = result.model_dump()
                finish = mark_final(obj, extra, deadline=progress.stopped == "deadline")
                return Outcome(json.dumps(obj, **_JSON), finish or "stop")
            stream = _Stream(endpoint, extra, emit, on_text, progress,
                             fallback_id=f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-"
                                         f"{body.get('request_id')}",
                             model=self.models.model_name(), choices=int(body.get("n") or 1))
            async for frame in result:
                payload = payload_of(frame)
                if payload == DONE:
                    continue
                stream.take(payload)
            stream.add_missing_finishes()
            finished = stream.finished
            return Outcome(None, "deadline" if "deadline" in finished.values()
                           else finished.get(0, "stop"))
        except _ServingError as exc:
            raise self._error(exc.info) from None
        except VllmEngineDeadError as exc:
            raise EngineDeadError(f"the vLLM engine is dead: {exc}") from exc
        except (EngineError, asyncio.CancelledError):
            raise
        except Exception as exc:  # classified as vLLM's server classifies it
            if self.engine.errored:
                raise EngineDeadError(f"the vLLM engine is dead: {exc}") from exc
            raise self._error(create_error_response(exc).error.model_dump()) from exc

    async def _respond(self, body: dict[str, Any], progress: Progress, extra: dict[str, Any],
                       emit: Callable[[str], None], on_text: Callable[[], None]) -> Outcome:
        """A Responses API request through vLLM's OpenAIServingResponses: the response, or each
        event's payload (as vLLM's server serializes it) to `emit`; the response, whole or in
        the event that ends the stream, marked (`mark_response`)."""
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse

        result = await self.responses.create_responses(ResponsesRequest.model_validate(body))
        if isinstance(result, ErrorResponse):
            raise _ServingError(result.error.model_dump())
        if not hasattr(result, "__aiter__"):
            obj = result.model_dump(mode="json", by_alias=True)
            finish = mark_response(obj, extra, deadline=progress.stopped == "deadline")
            return Outcome(json.dumps(obj, **_JSON), finish)
        finish, seen_text = "stop", False
        async for event in result:
            payload = event.model_dump_json(indent=None, by_alias=True)
            if event.type in _RESPONSE_ENDS:
                obj = json.loads(payload)
                finish = mark_response(obj["response"], extra,
                                       deadline=progress.stopped == "deadline")
                payload = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
            emit(payload)
            if not seen_text and event.type.endswith(".delta"):
                seen_text = True
                on_text()
        return Outcome(None, finish)

    def _error(self, info: dict[str, Any]) -> EngineError:
        """vLLM's error (ErrorInfo) as tailguard's: a client error is a refusal."""
        message = str(info.get("message") or "the serving layer refused the request")
        if self.engine.errored:
            return EngineDeadError(f"the vLLM engine is dead: {message}")
        code = info.get("code")
        if isinstance(code, int) and 400 <= code < 500:  # HTTP's client errors
            return EngineRefused(message, field=info.get("param"))
        return EngineError(f"generation failed: {message}")
