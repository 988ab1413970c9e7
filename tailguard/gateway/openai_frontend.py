"""vLLM's own OpenAI frontend in the API process, without an engine.

Why: the API costs, places and caps a request before any engine sees it, so it must know
what vLLM will make of it: the exact prompt tokens (chat template, tools, token-id
prompts), the max_tokens vLLM would grant, and everything vLLM would refuse. Writing that
by hand drifts from vLLM; running vLLM's own code does not. This module builds what
``vllm launch render`` runs (vllm/entrypoints/launchers/render/app_state.py:
``OnlineRenderer``, ``ServingRender``, ``ServingTokenization``, ``OpenAIModelRegistry``)
for the served model, with the lanes' longest context, from TAILGUARD_OPENAI_ARGS and the
lanes file's top-level ``[engine]`` table, and drives it for Flask's request threads.

Built once per process, in the background from when the process starts (``start``), or on
the first OpenAI request: importing vLLM takes seconds. Its coroutines belong to one event
loop, on a thread of its own (``tailguard.loop_thread.LoopThread``); request threads reach it
through ``submit``. The native job API never touches this: it needs no vLLM at all.

This is the only module of the API that imports vLLM, and only its frontend
(tests/unit/test_import_directions.py): no engine-core or model-runner process starts here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard.errors import ConfigError, InvalidField, ModelNotFound, TailguardError, Unavailable
from tailguard.gateway.openai_request import (
    BATCH_REFUSED,
    REFUSED_FIELDS,
    RESPONSES_REFUSED,
    Endpoint,
    OpenAIJob,
    prompt_text_bytes,
    requested_max_tokens,
    split_body,
)
from tailguard.loop_thread import LoopThread

log = logging.getLogger("tailguard.api")

#: How long a request waits for the frontend to be built (importing vLLM on a busy host).
BUILD_WAIT_S = 300.0
#: How long a request waits for its render on the loop (~1-2 ms of CPU each).
RENDER_WAIT_S = 60.0
#: What a request rendered while the process stops is told (a 503: retry on another process).
STOPPING = "this API process is stopping; retry"


@dataclass(frozen=True)
class _Rendered:
    """What vLLM's render layer made of one request: its prompt's token ids, and the
    max_tokens and n of the sampling parameters vLLM would give it."""

    token_ids: list[int]
    max_tokens: int
    n: int = 1


@dataclass(frozen=True)
class Answer:
    """One of vLLM's answers as it would send it: a status and a JSON-ready body."""

    status: int
    body: dict[str, Any]


class OpenAIFrontend:
    """vLLM's render layer for one served model, on its own loop thread (the docstring)."""

    def __init__(self, model: str, served_names: Sequence[str], max_model_len: int,
                 argv: Sequence[str] = (), engine_options: Mapping[str, Any] | None = None, *,
                 on_ignored: Callable[[Endpoint, Sequence[str]], None] | None = None) -> None:
        self.model = model
        self.served_names = list(served_names)
        #: the longest context any lane serves: what vLLM's defaults and /v1/models count with
        self.max_model_len = max_model_len
        self.argv = tuple(argv)
        self.engine_options = dict(engine_options or {})
        self.on_ignored = on_ignored
        self._lock = threading.Lock()
        self._built = threading.Event()
        self._closing = threading.Event()
        self._loop: LoopThread | None = None
        self._state: Any = None  # starlette's State, as init_render_app_state fills it
        self._error: TailguardError | None = None
        self._fields: dict[Endpoint, frozenset[str]] = {}

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start building it in the background (once): every later call waits for it."""
        with self._lock:
            if self._loop is not None:
                return
            self._loop = LoopThread("tailguard-openai-render")
            self._loop.start()
            self._loop.submit(self._build()).add_done_callback(self._built_or_failed)

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            if self._loop is not None:
                self._loop.stop(timeout=5)

    @property
    def status(self) -> str:
        """"ready", "starting", "failed" or "idle" (not started: nothing asked for it yet)."""
        if self._built.is_set():
            return "failed" if self._error is not None else "ready"
        return "starting" if self._loop is not None else "idle"

    @property
    def error(self) -> TailguardError | None:
        return self._error

    def _ready(self, wait_s: float = BUILD_WAIT_S) -> Any:
        """The render state, once built (started here if nothing started it)."""
        self.start()
        if not self._built.wait(wait_s):
            raise Unavailable("vLLM's render layer is still starting in this API process "
                              "(importing vLLM takes a while); retry shortly")
        if self._error is not None:
            # the process's setup, not the request: a 503 (nothing was queued), logged at start
            raise Unavailable(f"this API's OpenAI routes are unavailable: {self._error.message}")
        return self._state

    def _built_or_failed(self, future: Any) -> None:
        exc = future.exception()
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("vllm"):
            self._error = ConfigError(
                "vLLM is not installed beside the API: its OpenAI routes validate and render "
                "requests with vLLM's frontend (install tailguard[cpu] on any host, or "
                "tailguard[cuda]; the native /v1/jobs routes need neither)")
        elif exc is not None:
            self._error = exc if isinstance(exc, TailguardError) else ConfigError(
                f"vLLM's render layer could not be built for {self.model!r}: "
                f"{type(exc).__name__}: {exc}")
        if self._error is not None:
            log.error("OpenAI routes unavailable: %s", self._error.message)
        else:
            assert self._loop is not None
            self._loop.watch_stalls()
            log.info("vLLM's render layer is ready for %s (context %d)", self.model,
                     self.max_model_len)
        self._built.set()

    async def _build(self) -> None:
        """What vllm/entrypoints/launchers/render/entry.py does before it serves."""
        import vllm.envs as envs
        from starlette.datastructures import State
        from vllm.config import VllmConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.render.app_state import init_render_app_state

        from tailguard.openai_args import frontend_args

        args = frontend_args(self.argv)
        args.model = self.model
        args.served_model_name = self.served_names
        args.max_model_len = self.max_model_len
        engine_args = AsyncEngineArgs.from_cli_args(args)
        try:
            # the lanes file's [engine] table: the model config its engines build (a
            # generation_config override changes vLLM's default sampling parameters)
            engine_args = dataclasses.replace(engine_args, **self.engine_options)
        except TypeError as exc:
            raise ConfigError(f"the lanes file's [engine] table: {exc}", field="engine") from None
        model_config = engine_args.create_model_config()
        model_config.quantization = None  # rendering runs no quantized kernel
        envs.VLLM_CPU_KVCACHE_SPACE = 0  # and allocates no KV cache
        vllm_config = VllmConfig(model_config=model_config,
                                 logging_config=engine_args.create_logging_config(),
                                 structured_outputs_config=engine_args.create_structured_outputs_config())
        state = State()
        await init_render_app_state(vllm_config, state, args)
        self._fields = {endpoint: _field_names(cls) for endpoint, cls in _request_models().items()}
        self._state = state

    def _run(self, coro: Any) -> Any:
        assert self._loop is not None
        try:
            return self._loop.submit(coro).result(RENDER_WAIT_S)
        except TimeoutError:
            raise Unavailable("vLLM's render loop in this API process did not answer within "
                              f"{RENDER_WAIT_S:.0f} s; retry") from None

    # ---------------------------------------------------------------- OpenAI requests

    def prepare(self, endpoint: Endpoint, body: Any,
                check_prompt_bytes: Callable[[int], None] = lambda _: None) -> OpenAIJob:
        """Validate `body` with vLLM's request model and render it with vLLM's render layer;
        an InvalidField (or ModelNotFound) for anything vLLM would refuse, before a job
        exists. `check_prompt_bytes` (the API's byte bound) sees the prompt's size first."""
        if self._closing.is_set():
            raise Unavailable(STOPPING)
        try:
            return self._prepare(endpoint, body, check_prompt_bytes)
        except InvalidField:
            if self._closing.is_set():
                # the process is stopping and vLLM's render layer with it (its tokenizer pool
                # shut down): not the body's fault, and nothing was queued
                raise Unavailable(STOPPING) from None
            raise

    def _prepare(self, endpoint: Endpoint, body: Any,
                 check_prompt_bytes: Callable[[int], None]) -> OpenAIJob:
        state = self._ready()
        refused = {**REFUSED_FIELDS, **RESPONSES_REFUSED} if endpoint == "responses" else (
            REFUSED_FIELDS)
        split = split_body(body, self._fields[endpoint], refused)
        if split.ignored and self.on_ignored is not None:
            self.on_ignored(endpoint, split.ignored)
        check_prompt_bytes(prompt_text_bytes(split.body))
        request = _validated(endpoint, split.body)
        rendered = self._run(_render(state, endpoint, request))
        if isinstance(rendered, Answer):
            raise _refusal(rendered)
        renderer = state.online_renderer.renderer
        try:  # what vLLM's engine input processor checks of a prompt: token ids in the vocabulary
            renderer.validate_token_ids(rendered.token_ids, parameter="prompt")
        except Exception as exc:  # noqa: BLE001 - classified as vLLM's server classifies it
            raise _refusal(_answer(exc)) from None
        defaults = state.serving_render.default_sampling_params
        config = state.vllm_config
        tokenizer = renderer.get_tokenizer()

        def verify(max_tokens: int) -> None:
            """vLLM's checks of the request at the granted max_tokens: its sampling parameters'
            (min_tokens, ...), then what its engine checks them against (SamplingParams.verify:
            logprobs and token ids within the model's limits, a structured output its backend
            can compile)."""
            try:
                request.to_sampling_params(max_tokens, defaults).verify(
                    config.model_config, config.speculative_config,
                    config.structured_outputs_config, tokenizer)
            except Exception as exc:  # noqa: BLE001 - classified as vLLM's server classifies it
                raise _refusal(_answer(exc)) from None

        return OpenAIJob(
            endpoint=endpoint, request=split.body, prompt_tokens=len(rendered.token_ids),
            vllm_max_tokens=rendered.max_tokens,
            max_tokens=requested_max_tokens(endpoint, split.body),
            priority=split.priority, stream=bool(request.stream), n=rendered.n,
            prompt_bytes=prompt_text_bytes(split.body), verify=verify,
            prompt_ids=tuple(rendered.token_ids))

    # ---------------------------------------------------------------- vLLM's other routes

    def models(self) -> dict[str, Any]:
        """GET /v1/models as vLLM answers it, with the lanes' longest context."""
        state = self._ready()
        return self._run(state.openai_serving_models.show_available_models()).model_dump()

    def tokenize(self, body: Any) -> Answer:
        """POST /tokenize as vLLM answers it (its ServingTokenization)."""
        return self._tokenization("tokenize", body)

    def detokenize(self, body: Any) -> Answer:
        """POST /detokenize as vLLM answers it."""
        return self._tokenization("detokenize", body)

    def _tokenization(self, what: str, body: Any) -> Answer:
        from pydantic import ValidationError

        state = self._ready()
        try:
            request = _tokenization_adapter(what).validate_python(body)
        except ValidationError as exc:
            raise _validation_error(exc) from None
        serving = state.serving_tokenization
        call = serving.create_tokenize if what == "tokenize" else serving.create_detokenize
        answer = self._run(_answered(call(request, None)))
        if answer.status >= 400:
            raise _refusal(answer)
        return answer

    def version(self) -> str:
        from vllm.version import __version__

        self._ready()
        return __version__


@functools.cache
def _tokenization_adapter(what: str) -> Any:
    """vLLM's /tokenize or /detokenize request type as a pydantic TypeAdapter, kept: a chat
    message's content parts are validated lazily, by an iterator that panics (pydantic-core's
    PanicException, a BaseException) once the adapter that made it was collected."""
    from pydantic import TypeAdapter
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest, TokenizeRequest

    return TypeAdapter(TokenizeRequest if what == "tokenize" else DetokenizeRequest)


def _field_names(model: Any) -> frozenset[str]:
    """The fields (and their aliases) a vLLM request model knows: the others it ignores."""
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return frozenset(names)


def _request_models() -> dict[Endpoint, Any]:
    """vLLM's pydantic request model of each endpoint."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return {"chat": ChatCompletionRequest, "completion": CompletionRequest,
            "responses": ResponsesRequest}


def _validated(endpoint: Endpoint, body: dict[str, Any]) -> Any:
    """`body` as vLLM's pydantic request model; InvalidField naming the field otherwise."""
    from pydantic import ValidationError

    try:
        return _request_models()[endpoint].model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    except Exception as exc:  # noqa: BLE001 - classified as vLLM's server classifies it
        raise _refusal(_answer(exc)) from None


def _validation_error(exc: Any) -> InvalidField:
    """A pydantic ValidationError as vLLM's server words it: the first errors, and the param
    (vLLM's own parameter when a validator of vLLM's raised it, else the field's path)."""
    from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param
    from vllm.exceptions import VLLMValidationError

    errors = exc.errors(include_url=False)
    param = None
    for error in errors:
        ctx_error = (error.get("ctx") or {}).get("error")
        if isinstance(ctx_error, VLLMValidationError):
            param = ctx_error.parameter
            break
    if param is None and errors and errors[0].get("loc"):
        param = clean_loc_for_param(tuple(errors[0]["loc"]))
    shown = [f"{clean_loc_for_param(tuple(e.get('loc') or ())) or 'body'}: {e.get('msg')}"
             for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return InvalidField("; ".join(shown) + more, field=param or "body")


async def _render(state: Any, endpoint: Endpoint, request: Any) -> _Rendered | Answer:
    """On the loop: what vLLM's render layer makes of `request`, or vLLM's error answer."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    try:
        if endpoint == "responses":
            # the model check vLLM's Responses serving class makes (its render layer has it)
            result = await state.serving_render._check_model(request)
            result = result or await state.online_renderer.render_responses(request)
        elif endpoint == "chat":
            result = await state.serving_render.render_chat_request(request)
        else:
            result = await state.serving_render.render_completion_request(request)
    except Exception as exc:  # noqa: BLE001 - classified as vLLM's server classifies it
        return _answer(exc)
    if isinstance(result, ErrorResponse):
        return Answer(result.error.code, result.model_dump())
    if endpoint == "responses":
        return _rendered_response(state, request, result.engine_input)
    generates = result if isinstance(result, list) else [result]
    if len(generates) != 1:
        raise InvalidField(f"{BATCH_REFUSED} (got {len(generates)} prompts)", field="prompt")
    [generate] = generates
    return _Rendered(list(generate.token_ids), generate.sampling_params.max_tokens,
                     generate.sampling_params.n)


def _rendered_response(state: Any, request: Any, engine_input: Any) -> _Rendered:
    """A Responses request's prompt and the max_tokens vLLM grants it, as
    ``OpenAIServingResponses`` computes them (its prompt check included: a 400 on ``input``)."""
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    model_config = state.vllm_config.model_config
    components = state.serving_render._extract_prompt_components(engine_input)
    token_ids = list(components.token_ids or ())
    if len(token_ids) >= model_config.max_model_len:
        raise InvalidField(f"The engine prompt length {len(token_ids)} exceeds the max_model_len "
                           f"{model_config.max_model_len}. Please reduce prompt.", field="input")
    defaults = state.serving_render.default_sampling_params
    override = (defaults.get("max_tokens") if model_config.generation_config not in (
        "auto", "vllm") else getattr(model_config, "override_generation_config", {}).get(
        "max_new_tokens"))
    return _Rendered(token_ids, get_max_tokens(
        model_config.max_model_len, request.max_output_tokens, len(token_ids), defaults,
        override, truncate_prompt_tokens=-1 if request.truncation != "disabled" else None))


async def _answered(coro: Any) -> Answer:
    """On the loop: a vLLM serving call's result (or exception) as the answer it would send."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    try:
        result = await coro
    except Exception as exc:  # noqa: BLE001 - classified as vLLM's server classifies it
        return _answer(exc)
    if isinstance(result, ErrorResponse):
        return Answer(result.error.code, result.model_dump())
    return Answer(200, result.model_dump())


def _answer(exc: BaseException) -> Answer:
    """An exception as vLLM's server answers it (its create_error_response); what vLLM would
    answer with a 5xx (not the client's doing, as vLLM sees it) is logged with its trace."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    error = create_error_response(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
    if error.error.code >= 500:
        log.error("vLLM's render layer failed on a request", exc_info=exc)
    return Answer(error.error.code, error.model_dump())


def _refusal(answer: Answer) -> TailguardError:
    """vLLM's error answer as the error tree's: 404 ModelNotFound, anything else InvalidField
    (a 400: vLLM's 501 and 500 for a body it cannot render too, since the same body fails again
    however often it is sent, and the SDKs retry 5xx)."""
    error = answer.body.get("error") or {}
    message = str(error.get("message") or "vLLM refused the request")
    param = error.get("param")
    if answer.status == 404:
        return ModelNotFound(message, field=param or "model")
    return InvalidField(message, field=param)
