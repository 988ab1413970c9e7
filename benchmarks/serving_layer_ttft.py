"""What vLLM's OpenAI serving layer adds in a worker: one EngineHost, two paths, side by side.

Builds tailguard's EngineHost (tailguard/engine/host.py) on a model in this process, as a
worker does, and sends the overhead workload's request (a 64-token prompt, 32 tokens out,
streamed) one at a time, alternating between
  generate  the native path: the prompt to AsyncLLM.generate, text deltas back;
  openai    an OpenAI completion through vLLM's OpenAIServingCompletion (validation,
            rendering, vLLM's chunks: tailguard/engine/serving.py), as OpenAI jobs run.
Prints one JSON line: per path, the time from the call to its first piece of output and to
its end (P50, P90 in ms, after `--warmup` rounds), and the difference at P50.

    python benchmarks/serving_layer_ttft.py                       # the tiny demo model
    python benchmarks/serving_layer_ttft.py --model ~/.tailguard/models/demo-small

No Redis, no API. Run it alone: it is wall clock on the engine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

PROMPT = " ".join(["word"] * 63)  # 64 tokens with the demo models' BOS
MAX_TOKENS = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the tiny demo model)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    from tailguard.engine.host import EngineConfig, EngineHost
    from tailguard.model.demo import build_demo_model
    from tailguard.model.info import serving_dtype

    model = args.model or str(build_demo_model(Path(".tailguard/test-models/tiny"), size="tiny"))
    host = EngineHost(EngineConfig(model=model, max_num_seqs=4, max_model_len=1024,
                                   dtype=serving_dtype(model), log_stats=False,
                                   served_model_names=("bench",)))
    host.start()
    first: dict[str, list[float]] = {"generate": [], "openai": []}
    whole: dict[str, list[float]] = {"generate": [], "openai": []}
    try:
        for i in range(args.warmup + args.rounds):
            for path in ("generate", "openai"):
                got: list[float] = []

                def note(_: object, got: list[float] = got) -> None:
                    got.append(time.perf_counter())

                t0 = time.perf_counter()
                if path == "generate":
                    host.generate(f"g{i}", PROMPT, {"max_tokens": MAX_TOKENS, "ignore_eos": True},
                                  60, on_delta=note)
                else:
                    host.openai(f"o{i}", "completion", {
                        "model": "bench", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                        "ignore_eos": True, "stream": True}, 60, on_chunks=note)
                if i >= args.warmup:
                    first[path].append((got[0] - t0) * 1e3)
                    whole[path].append((time.perf_counter() - t0) * 1e3)
    finally:
        host.shutdown()

    def summary(ms: list[float]) -> dict[str, float]:
        return {"p50": round(statistics.median(ms), 2),
                "p90": round(statistics.quantiles(ms, n=10)[-1], 2)}

    print(json.dumps({
        "model": model, "rounds": args.rounds,
        **{f"{path}_first_ms": summary(first[path]) for path in first},
        **{f"{path}_end_ms": summary(whole[path]) for path in whole},
        "openai_minus_generate_first_p50_ms": round(
            statistics.median(first["openai"]) - statistics.median(first["generate"]), 2),
    }))


if __name__ == "__main__":
    main()
