"""What vLLM's own stat loggers cost a worker: one engine, with them and without, side by side.

An engine host is built as a worker builds it on a CPU host under the core plan: its vLLM
processes on core 0 (VLLM_CPU_OMP_THREADS_BIND), this process's own threads, which are what
a worker runs beside its engine (the engine loop with vLLM's output processing and its stat
loggers), on core 1. For each mode it decodes 64-token requests at 1, 4 and 8 at once and
prints the output tokens/s, the median TTFT and this process's CPU per output token. Modes
alternate (on, off, on, off by default) so a drift of the machine lands on both.

    python benchmarks/vllm_stats_cost.py                   # the small demo model
    python benchmarks/vllm_stats_cost.py --rounds 3

Needs 2 cores; run it alone (an engine is started per mode and round).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLING = {"max_tokens": 64, "temperature": 0.0, "ignore_eos": True}


def measure(model: str, log_stats: bool) -> dict[int, dict[str, float]]:
    """One engine's figures at 1, 4 and 8 requests at once (run in a process of its own)."""
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    from tailguard.engine.host import EngineConfig, EngineHost
    from tailguard.host.cores import pin_threads

    pin_threads((1,))
    host = EngineHost(EngineConfig(model=model, max_num_seqs=16, log_stats=log_stats))
    host.start()
    try:
        for i in range(3):  # warm
            host.generate(f"warm-{i}", "hello there", SAMPLING, 60)
        out = {}
        for concurrency in (1, 4, 8):
            n = 12 if concurrency == 1 else 3 * concurrency
            t0, cpu0 = time.perf_counter(), time.process_time()
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda i: host.generate(
                    f"r{concurrency}-{i}", "hello there friend", SAMPLING, 60),  # noqa: B023
                    range(n)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            tokens = sum(r.completion_tokens for r in results)
            ttfts = sorted(r.ttft_s or 0.0 for r in results)
            out[concurrency] = {"tok_s": round(tokens / wall, 1),
                                "ttft_p50_ms": round(1000 * ttfts[len(ttfts) // 2], 1),
                                "cpu_ms_per_token": round(1000 * cpu / tokens, 3)}
        return out
    finally:
        host.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help="default: the small demo model (built if missing)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.child == "on")), flush=True)
        return
    from tailguard.model.demo import build_demo_model

    model = args.model or str(build_demo_model(ROOT / ".tailguard" / "models" / "demo-small",
                                               size="small"))
    print(f"{'stat loggers':<13}{'batch':>6}{'tok/s':>9}{'TTFT p50 ms':>13}{'CPU ms/token':>14}")
    for _ in range(args.rounds):
        for mode in ("on", "off"):
            proc = subprocess.run([sys.executable, __file__, "--child", mode, "--model", model],
                                  capture_output=True, text=True, check=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            figures = json.loads(proc.stdout.strip().splitlines()[-1])
            for batch, f in figures.items():
                print(f"{mode:<13}{batch:>6}{f['tok_s']:>9}{f['ttft_p50_ms']:>13}"
                      f"{f['cpu_ms_per_token']:>14}")


if __name__ == "__main__":
    main()
