"""A short sweep on a real vLLM engine, fitted to a StepModel.

Decode: ``n`` requests started together (a short prompt, ``decode_tokens`` out,
``ignore_eos``) for each batch size ``n``; a request's time per output token
after its first, (engine time - TTFT) / (tokens - 1), is the step time with ``n``
sequences decoding (the median over the ``n`` requests). Long-context decode: the
same with ``long_context``-token prompts; the request prefilled last is timed, as
its later steps are decode-only with ``n`` sequences of about that context (fewer
at the end, as the others finish first). Prefill: one request of
``p`` prompt tokens and one output token, alone, for each ``p``; its TTFT is the
step that prefilled it. Each point is the median of ``repeats`` runs.

A neighbour on other cores (``neighbour_cores``): an engine of ``neighbour_slots`` slots
pinned there, at normal priority (``TAILGUARD_ENGINE_NICE`` where those are the front-end
cores, as the last worker's engine runs), kept full of the same long requests while the
same decode points are measured again: how much longer they take is
``StepModel.neighbour_slowdown``, what one engine costs another on the same host (the
cores share the caches and the memory bandwidth; `tailguard bench` runs two engines on
two cores).

The engines run in this process (``EngineHost``), placed as `tailguard up`'s core plan
places a worker's (tailguard/host/cores.py): an engine's vLLM processes on its cores
(``--cores``; the neighbour's on ``neighbour_cores``), this process's own threads (what a
worker runs beside its engine: the engine loop with its detokenization, the requests'
threads) on the front-end cores (``frontend_cores``: by default the neighbour's, as the
last worker's cores are the front end's), and an engine whose cores include a front-end
core at ``TAILGUARD_ENGINE_NICE``. So a profile measures what one worker's engine does,
without the API or the broker around it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from tailguard.plan.stepmodel import StepModel, fit, path_free, slowdown

BATCHES = (1, 2, 4, 8, 16)
PROMPTS = (128, 512, 1024, 2000)
LONG_BATCHES = (1, 4, 8)
#: decode batch sizes measured again beside a busy neighbour (the short lane's usual batch: a
#: few requests)
BESIDE_BATCHES = (1, 2, 4)


def run_profile(model: str, *, cores: tuple[int, ...] = (), batches: tuple[int, ...] = BATCHES,
                prompts: tuple[int, ...] = PROMPTS, long_batches: tuple[int, ...] = LONG_BATCHES,
                long_context: int = 2000, decode_tokens: int = 64, repeats: int = 3,
                max_model_len: int = 4096, long_tokens: int = 512,
                neighbour_cores: tuple[int, ...] = (), neighbour_slots: int = 8,
                frontend_cores: tuple[int, ...] = (),
                say: Callable[[str], None] = print) -> StepModel:
    """Start one engine on `model` (its processes on `cores`, this process's threads on
    `frontend_cores`), measure, fit, shut it down; with `neighbour_cores`, also measure it
    beside a busy engine there (the module docstring).

    Long on purpose (~100 lines): one sweep on one live engine, in the order the module
    docstring gives, whose steps share the engine, its thread pool and the decode figures
    measured alone (the baseline of the "beside" sweep); split up, each part would take
    them all as arguments. Runs only against a real engine (`tailguard plan --profile`)."""
    from tailguard.engine.host import EngineConfig, EngineHost
    from tailguard.host.cores import Pinning, frontend_env, pin_threads
    from tailguard.model.tokens import counter_for
    from tailguard.plan.synthetic import SEED_PROMPTS, long_prompt

    pin = Pinning(cores=cores)
    os.environ.update(pin.env())
    # An engine host on front-end cores lowers its own processes' priority, as in a worker.
    os.environ.update(frontend_env(frontend_cores))
    pin_threads(frontend_cores)
    config = EngineConfig(model=model, max_num_seqs=max(batches), max_model_len=max_model_len)
    host = EngineHost(config)
    t0 = time.perf_counter()
    nice = _start(host, cores, frontend_cores)
    say(f"engine ready in {time.perf_counter() - t0:.1f} s ({pin.label()}{_at(nice)}; this "
        f"process's threads on {Pinning(cores=frontend_cores).label()})")
    count = counter_for(model).count
    rng = random.Random(0)
    ids = iter(range(10**9))
    try:
        def one(prompt: str, max_tokens: int):
            return host.generate(f"profile-{next(ids)}", prompt,
                                 {"max_tokens": max_tokens, "ignore_eos": True,
                                  "temperature": 0.0}, deadline_s=None)

        one(SEED_PROMPTS[0], 8)  # warm-up: the first step of a fresh engine is slow
        decode: list[tuple[int, float]] = []
        with ThreadPoolExecutor(max(batches)) as pool:
            def decode_step_s(n: int) -> float:
                """Seconds per decode step with `n` short requests decoding (median of runs)."""
                runs = []
                for _ in range(repeats):
                    results = list(pool.map(lambda i: one(SEED_PROMPTS[i % 4], decode_tokens),
                                            range(n)))
                    runs.append(statistics.median(
                        (r.engine_s - r.ttft_s) / (r.completion_tokens - 1) for r in results))
                return statistics.median(runs)

            for n in batches:
                decode.append((n, decode_step_s(n)))
                say(f"decode batch {n:>3}: {1000 * decode[-1][1]:.2f} ms/step")
            long_decode: list[tuple[int, int, float]] = []
            for n in long_batches:
                runs = []
                for _ in range(repeats):
                    texts = [long_prompt(long_context, rng, count) for _ in range(n)]
                    results = list(pool.map(lambda text: one(text, decode_tokens), texts))
                    last = max(results, key=lambda r: r.ttft_s)
                    runs.append((last.engine_s - last.ttft_s) / (last.completion_tokens - 1))
                ctx = n * (long_context + decode_tokens // 2)
                long_decode.append((n, ctx, statistics.median(runs)))
                say(f"decode batch {n:>3} at {long_context} tokens of context: "
                    f"{1000 * long_decode[-1][2]:.2f} ms/step")
            alone = dict(decode)

            def beside(other: str, slots: int, **where: Any) -> list[tuple[int, float, float]]:
                points = []
                with _busy_engine(dataclasses.replace(config, max_num_seqs=slots),
                                  long_context, long_tokens, count, say, **where):
                    for n in BESIDE_BATCHES:
                        points.append((n, alone[n], decode_step_s(n)))
                        say(f"decode batch {n:>3} beside {slots} long requests on {other}: "
                            f"{1000 * points[-1][2]:.2f} ms/step "
                            f"({points[-1][2] / points[-1][1]:.2f}x)")
                return points

            neighbour = (beside(f"an engine on cores {','.join(map(str, neighbour_cores))}",
                                neighbour_slots, cores=neighbour_cores,
                                frontend=frontend_cores)
                         if neighbour_cores else [])
        prefill: list[tuple[int, float]] = []
        for p in prompts:
            runs = []
            for _ in range(repeats):
                text = long_prompt(p, rng, count)  # fresh text: no prefix-cache hit
                runs.append(one(text, 1).ttft_s)
            prefill.append((p, statistics.median(runs)))
            say(f"prefill {p:>5} tokens: {1000 * prefill[-1][1]:.1f} ms")
    finally:
        host.shutdown()
    return fit(decode, prefill, long_decode,
               neighbour_slowdown=slowdown(neighbour) if neighbour else 0.0, source={
        "model": path_free(model), "pinning": pin.label(), "cpu_count": os.cpu_count(),
        "frontend_cores": list(frontend_cores),
        "decode_tokens": decode_tokens, "repeats": repeats,
        "neighbour_points": [list(x) for x in neighbour],
        "neighbour_cores": list(neighbour_cores), "neighbour_slots": neighbour_slots,
        "beside_long": [long_context, long_tokens],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def _start(host: Any, cores: tuple[int, ...], frontend: tuple[int, ...]) -> int:
    """Start `host`'s engine, its pin in the environment, as a worker starts its engine (the
    host lowers its own processes to ``TAILGUARD_ENGINE_NICE`` when its `cores` include a
    front-end core); the nice value it runs at, for the log."""
    from tailguard import settings

    host.start()
    return max(0, settings.ENGINE_NICE.get()) if set(cores) & set(frontend) else 0


def _at(nice: int) -> str:
    return f", at nice {nice}" if nice else ""


@contextmanager
def _busy_engine(config: Any, prompt_tokens: int, max_tokens: int, count: Callable[[str], int],
                 say: Callable[[str], None], cores: tuple[int, ...] = (),
                 frontend: tuple[int, ...] = ()) -> Iterator[None]:
    """Within the block, a second engine on `cores` holds `config.max_num_seqs` long
    requests at all times; after it, they finish and the engine is shut down. At normal
    priority, or ``TAILGUARD_ENGINE_NICE`` on the `frontend` cores."""
    from tailguard.engine.host import EngineHost
    from tailguard.host.cores import Pinning
    from tailguard.plan.synthetic import long_prompt

    other = EngineHost(config)
    started: list[BaseException | int] = []
    env = Pinning(cores=cores).env()

    def start() -> None:  # on its own thread, as a worker starts its engine
        try:
            started.append(_start(other, cores, frontend))
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            started.append(exc)

    t0 = time.perf_counter()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the engine host reads its pin from the environment (`Pinning.from_env`)
    try:
        starter = threading.Thread(target=start, name="profile-other-engine")
        starter.start()
        starter.join()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nice = started[0]
    if isinstance(nice, BaseException):
        raise nice
    say(f"engine ready in {time.perf_counter() - t0:.1f} s"
        f" on {Pinning(cores=cores).label()}{_at(nice)}")
    stop = threading.Event()

    def feed(i: int) -> None:
        rng = random.Random(f"long/{i}")
        for k in itertools.count():
            if stop.is_set():
                return
            other.generate(f"profile-other-{i}-{k}", long_prompt(prompt_tokens, rng, count),
                          {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
                          deadline_s=None)

    feeders = [threading.Thread(target=feed, args=(i,), daemon=True, name=f"profile-long-{i}")
               for i in range(config.max_num_seqs)]
    try:
        for f in feeders:
            f.start()
        full_by = time.monotonic() + 120
        while other.stats().in_flight < config.max_num_seqs:
            if time.monotonic() > full_by or not any(f.is_alive() for f in feeders):
                raise RuntimeError("the second engine never held its long requests")
            time.sleep(0.05)
        yield
    finally:
        stop.set()
        for f in feeders:
            f.join()
        other.shutdown()
