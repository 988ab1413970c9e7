"""The worker's start-up warm-up (tailguard/engine/warmup.py), with an in-process fake engine."""

from __future__ import annotations

import threading

import pytest

from tailguard.engine.host import GenerationResult
from tailguard.engine.warmup import cpu_description, exact_length_prompts, failure_message, warm_up
from tailguard.errors import EngineDeadError


class CharCounter:
    """A tokenizer stand-in: BOS plus one token per character."""

    def count(self, prompt: str, add_special_tokens: bool = True) -> int:
        return 1 + len(prompt)


class FakeEngine:
    """Generates `max_tokens` tokens, counting a prompt as CharCounter does; raises for
    prompts of `fail_at` tokens; records how many calls overlapped."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.lock = threading.Lock()
        self.running = self.peak = 0
        self.entered = threading.Barrier(2, timeout=5)
        self.prompt_tokens: list[int] = []

    def generate(self, request_id, prompt, sampling, deadline_s, **_) -> GenerationResult:
        n = CharCounter().count(prompt)
        with self.lock:
            self.prompt_tokens.append(n)
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            if request_id.startswith("warmup-batched") and n <= 2:
                self.entered.wait()  # the first two batched calls meet: they overlap
            if n == self.fail_at:
                raise RuntimeError("Worker proc VllmWorker-0 died unexpectedly")
            return GenerationResult("x" * sampling["max_tokens"], n, sampling["max_tokens"],
                                    "length", 0.01, 0.02)
        finally:
            with self.lock:
                self.running -= 1


def test_prompts_have_every_length_from_one_token():
    prompts = exact_length_prompts(CharCounter(), max_tokens=8)
    assert list(prompts) == list(range(1, 9))
    assert all(CharCounter().count(text) == n for n, text in prompts.items())


def test_warm_up_runs_each_prompt_alone_then_all_at_once():
    engine = FakeEngine()
    report = warm_up(engine, exact_length_prompts(CharCounter(), max_tokens=4), output_tokens=2)
    assert report.prompt_tokens == [1, 2, 3, 4]
    assert sorted(engine.prompt_tokens) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert engine.peak >= 2
    assert "4 prompts of 1...4 tokens, one at a time then 4 at once" in report.describe()


def test_a_failing_prompt_length_fails_the_warm_up():
    with pytest.raises(EngineDeadError, match="3-token prompt.*died unexpectedly"):
        warm_up(FakeEngine(fail_at=3), exact_length_prompts(CharCounter(), max_tokens=4))


def test_cpu_description_names_the_model_and_the_flags_that_matter(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                       "flags\t\t: fpu avx512f amx_tile sse\n\nprocessor\t: 1\n")
    assert cpu_description(cpuinfo) == \
        "Intel(R) Xeon(R) Platinum 8480+ (avx512f: yes, avx512_bf16: no, amx_tile: yes)"


def test_failure_message_names_model_dtype_and_cpu(tmp_path):
    (tmp_path / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    line = failure_message(str(tmp_path), "auto", EngineDeadError("boom"))
    assert f"model {tmp_path}, dtype auto (checkpoint: bfloat16), CPU " in line
    assert "avx512f: " in line and line.endswith(": boom")
