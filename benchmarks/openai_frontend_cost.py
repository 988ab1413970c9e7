"""What vLLM's render layer costs an API process: the OpenAI routes' frontend, measured alone.

Builds tailguard's OpenAIFrontend (tailguard/gateway/openai_frontend.py) for a model in this
process, as the API builds it, and prints one JSON line: the seconds to import and build it,
the process's peak RSS, and the CPU per request that `prepare` (validate with vLLM's request
model, render with vLLM's render layer, verify at the grant) spends on a short chat and a short
completion, over `--requests` of each, on the calling thread and the loop thread together.

    python benchmarks/openai_frontend_cost.py                      # the small demo model
    python benchmarks/openai_frontend_cost.py --model ~/.tailguard/models/SmolLM2-135M-Instruct

No engine, no Redis. Run it alone: the import time is wall clock on a shared host.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

CHAT = {"messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16, "temperature": 0, "store": True, "metadata": {"team": "a"}}
COMPLETION = {"prompt": "The capital of France is", "max_tokens": 16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the demo model)")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

    from tailguard.model.demo import build_demo_model

    model = args.model or str(build_demo_model(Path(".tailguard/test-models/tiny"), size="tiny"))
    started, cpu0 = time.perf_counter(), time.process_time()
    from tailguard.gateway.openai_frontend import OpenAIFrontend

    frontend = OpenAIFrontend(model, ["bench"], max_model_len=1024)
    frontend.prepare("completion", COMPLETION)  # builds it: imports vLLM, loads the tokenizer
    ready_s, ready_cpu_s = time.perf_counter() - started, time.process_time() - cpu0

    per_request: dict[str, float] = {}
    for endpoint, body in (("chat", CHAT), ("completion", COMPLETION)):
        job = frontend.prepare(endpoint, body)
        cpu = time.process_time()
        for _ in range(args.requests):
            frontend.prepare(endpoint, body).verify(job.vllm_max_tokens)
        per_request[endpoint] = (time.process_time() - cpu) / args.requests
    chat_prompt_tokens = frontend.prepare("chat", CHAT).prompt_tokens
    frontend.close()
    print(json.dumps({
        "model": model, "ready_s": round(ready_s, 2), "ready_cpu_s": round(ready_cpu_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "cpu_ms_per_chat": round(per_request["chat"] * 1e3, 3),
        "cpu_ms_per_completion": round(per_request["completion"] * 1e3, 3),
        "chat_prompt_tokens": chat_prompt_tokens,
        "engine_imported": any(m in sys.modules for m in ("vllm.v1.engine.async_llm",
                                                           "vllm.v1.engine.core")),
    }))


if __name__ == "__main__":
    main()
