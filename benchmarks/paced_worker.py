"""A real tailguard Celery worker whose engine is a paced stand-in: no vLLM, no model run.

For soaks whose subject is not the engine (benchmarks/soak_storage.py: Redis memory over
hours of traffic). Everything else is the product's: `celery -A tasks worker` with the
threads pool, tailguard's worker runtime, job runner, stream writer, heartbeats and
reaper. Only ``tailguard.engine.host.EngineHost`` is replaced, before the worker sets up,
by a subclass that "generates" `max_tokens` tokens of English-like words at
SOAK_TOKENS_PER_S per sequence (handing them over every 50 ms, as the stream writer
batches them anyway), honouring cancels and the deadline as the real host does.

    python benchmarks/paced_worker.py -A tasks worker -Q short -n short@%h -c 32
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailguard.engine import host  # noqa: E402
from tailguard.engine.host import GenerationResult  # noqa: E402

#: ~4.6 bytes a token with its space, as English text tokenizes
WORDS = ("the ", "model ", "answers ", "with ", "a ", "short ", "reply ", "about ", "lanes ",
         "and ", "queues ", "in ", "one ", "gateway ", "for ", "many ", "teams ")
STEP_S = 0.05


class PacedEngineHost(host.EngineHost):
    """An EngineHost that starts at once and streams words at a fixed pace."""

    tokens_per_s = float(os.environ.get("SOAK_TOKENS_PER_S", "200"))

    def start(self, timeout: float | None = None) -> None:
        self._paced_up = True

    @property
    def started(self) -> bool:
        return getattr(self, "_paced_up", False) and not self._closed

    @property
    def dead(self) -> bool:
        return False

    @property
    def engine_core_pid(self) -> int | None:
        return None

    def shutdown(self, timeout: float = 30) -> None:
        self._closed = True

    def generate(self, request_id, prompt, sampling, deadline_s, on_first_token=None,
                 should_cancel=None, on_delta=None, add_special_tokens=True, priority=0):
        t0 = time.perf_counter()
        self._counters.entered()
        want = int(sampling.get("max_tokens") or 16)
        made, parts, ttft, reason = 0, [], None, "length"
        per_step = max(1, round(self.tokens_per_s * STEP_S))
        try:
            while made < want:
                time.sleep(STEP_S)
                if should_cancel is not None and should_cancel():
                    reason = "cancelled"
                    break
                if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                    reason = "deadline"
                    break
                n = min(per_step, want - made)
                text = "".join(WORDS[(made + i) % len(WORDS)] for i in range(n))
                made += n
                parts.append(text)
                if ttft is None:
                    ttft = time.perf_counter() - t0
                    if on_first_token is not None:
                        on_first_token()
                if on_delta is not None:
                    on_delta(text)
        finally:
            self._counters.left(decoded=ttft is not None,
                                outcome="completed" if reason == "length" else "aborted",
                                engine_unfinished=0)
        return GenerationResult("".join(parts), max(1, len(prompt) // 4), made, reason, ttft,
                                time.perf_counter() - t0)


host.EngineHost = PacedEngineHost

if __name__ == "__main__":
    from celery.bin.celery import main

    threading.current_thread().name = "paced-worker"
    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(main())
