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

The engine runs in this process (``EngineHost``) pinned like a worker
(``--cores``), so a profile measures what one worker's engine does, without the
API or the broker around it.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from tailguard.plan.stepmodel import StepModel, fit

BATCHES = (1, 2, 4, 8, 16)
PROMPTS = (128, 512, 1024, 2000)
LONG_BATCHES = (1, 4, 8)


def run_profile(model: str, *, cores: tuple[int, ...] = (), batches: tuple[int, ...] = BATCHES,
                prompts: tuple[int, ...] = PROMPTS, long_batches: tuple[int, ...] = LONG_BATCHES,
                long_context: int = 2000, decode_tokens: int = 64, repeats: int = 3,
                max_model_len: int = 4096, say: Callable[[str], None] = print) -> StepModel:
    """Start one engine on `model` (pinned to `cores`), measure, fit, shut it down."""
    from tailguard.bench.workload import SEED_PROMPTS, long_prompt
    from tailguard.engine import EngineConfig, EngineHost
    from tailguard.pinning import Pinning
    from tailguard.tokens import counter_for

    pin = Pinning(cores=cores)
    os.environ.update(pin.env())
    if cores:
        os.sched_setaffinity(0, set(cores))
    host = EngineHost(EngineConfig(model=model, max_num_seqs=max(batches),
                                   max_model_len=max_model_len))
    t0 = time.perf_counter()
    host.start()
    say(f"engine ready in {time.perf_counter() - t0:.1f} s ({pin.label()})")
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
            for n in batches:
                runs = []
                for _ in range(repeats):
                    results = list(pool.map(lambda i: one(SEED_PROMPTS[i % 4], decode_tokens),
                                            range(n)))
                    runs.append(statistics.median(
                        (r.engine_s - r.ttft_s) / (r.completion_tokens - 1) for r in results))
                decode.append((n, statistics.median(runs)))
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
    return fit(decode, prefill, long_decode, source={
        "model": model, "pinning": pin.label(), "cpu_count": os.cpu_count(),
        "decode_tokens": decode_tokens, "repeats": repeats,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
