"""Benchmark workloads: open-loop Poisson arrivals per class, reproducible, paired across phases."""

import json
import random

import pytest

from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.bench.workload import (
    LONG,
    MEDIUM,
    SEED_MAX_TOKENS,
    SHORT,
    burst_workload,
    jsonl_workload,
    mixed_workload,
    overhead_workload,
    parse_jsonl,
    seed_workload,
)
from tailguard.plan.synthetic import SEED_PROMPTS, long_prompt, poisson_arrivals


def words_x2(text: str) -> int:
    """A stand-in tokenizer: two tokens per word."""
    return 2 * len(text.split())


def test_poisson_arrivals_rate_bounds_and_determinism():
    times = poisson_arrivals(10, 1000, random.Random(1))
    assert times == sorted(times) and 0 < times[0] and times[-1] < 1000
    assert abs(len(times) - 10_000) < 400  # 4 sigma of a Poisson count
    assert times == poisson_arrivals(10, 1000, random.Random(1))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert abs(sum(gaps) / len(gaps) - 0.1) < 0.005  # exponential gaps of mean 1/rate
    assert len(poisson_arrivals(10, 1000, random.Random(1), max_count=7)) == 7
    assert poisson_arrivals(0, 100, random.Random(1)) == []
    with pytest.raises(ValueError):
        poisson_arrivals(-1, 10, random.Random(1))


def test_seed_workload_is_the_articles_test():
    wl = seed_workload(rate=3, duration_s=200, seed=4)
    assert wl.classes == [SHORT, MEDIUM, LONG]
    assert {r.prompt for r in wl.requests} == set(SEED_PROMPTS)
    for r in wl.requests:
        assert r.max_tokens == SEED_MAX_TOKENS[r.cls] and r.ignore_eos
    assert [r.arrival_s for r in wl.requests] == sorted(r.arrival_s for r in wl.requests)
    counts = wl.counts()
    assert all(abs(n - 200) < 60 for n in counts.values())  # rate 1/s per class
    assert wl == seed_workload(rate=3, duration_s=200, seed=4)
    assert wl != seed_workload(rate=3, duration_s=200, seed=5)


def test_mixed_workload_shares_and_sizes():
    wl = mixed_workload(rate=4, long_share=0.25, duration_s=100, seed=1, short_tokens=64,
                        long_prompt_tokens=500, long_tokens=512, count_tokens=words_x2)
    counts = wl.counts()
    assert abs(counts[SHORT] - 300) < 60 and abs(counts[LONG] - 100) < 35
    assert wl.classes == [SHORT, LONG]
    for r in wl.requests:
        if r.cls == SHORT:
            assert r.prompt in SEED_PROMPTS and r.max_tokens == 64
        else:
            assert abs(words_x2(r.prompt) - 500) <= 2 and r.max_tokens == 512
    longs = [r.prompt for r in wl.requests if r.cls == LONG]
    # every long prompt starts differently: no shared prefix for vLLM's prefix cache to reuse
    assert len({p.split()[:12].__repr__() for p in longs}) == len(longs)


def test_short_arrivals_do_not_depend_on_the_long_class():
    a = mixed_workload(2, 0.5, 60, seed=3, long_prompt_tokens=100, count_tokens=words_x2)
    b = mixed_workload(2, 0.5, 60, seed=3, long_prompt_tokens=900, long_tokens=32,
                       count_tokens=words_x2)
    assert a.only([SHORT]).requests == b.only([SHORT]).requests
    assert all(r.cls == SHORT for r in a.only([SHORT]).requests)


@pytest.mark.parametrize("target", [1, 7, 300, 2000])
def test_long_prompt_hits_its_token_target(target):
    prompt = long_prompt(target, random.Random(0), words_x2)
    assert abs(words_x2(prompt) - target) <= 2
    assert long_prompt(target, random.Random(0)) != ""  # without a tokenizer: an estimate


def test_mixed_rejects_a_bad_share():
    with pytest.raises(ValueError, match="long_share"):
        mixed_workload(1, 1.5, 10)


def _write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(l) if not isinstance(l, str) else l for l in lines))
    return path


def test_jsonl_timed_trace_is_replayed_from_zero(tmp_path):
    path = _write(tmp_path, [
        {"prompt": "a", "max_tokens": 8, "class": "short", "arrival_s": 10.5},
        {"prompt": "b", "max_tokens": 300, "class": "long", "arrival_s": 10.0},
        {"prompt": "c", "max_tokens": 8, "arrival_s": 99.0, "ignore_eos": False},
    ])
    wl = jsonl_workload(path, rate=1, duration_s=None)
    assert [(r.prompt, r.arrival_s, r.cls) for r in wl.requests] == [
        ("b", 0.0, "long"), ("a", 0.5, "short"), ("c", 89.0, "short")]
    assert wl.requests[2].ignore_eos is False
    assert (wl.short_class, wl.long_class) == (SHORT, LONG)
    assert [r.prompt for r in jsonl_workload(path, rate=1, duration_s=5).requests] == ["b", "a"]


def test_jsonl_untimed_trace_cycles_at_the_rate(tmp_path):
    path = _write(tmp_path, [{"prompt": "a", "max_tokens": 8}, {"prompt": "b", "max_tokens": 9}])
    wl = jsonl_workload(path, rate=5, duration_s=100)
    prompts = [r.prompt for r in wl.requests]
    assert prompts[:4] == ["a", "b", "a", "b"] and abs(len(prompts) - 500) < 100
    assert wl.long_class is None


@pytest.mark.parametrize("line,match", [
    ("{nope", "not JSON"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 3, "temperature": 1}, "unknown field"),
    ({"prompt": "x", "max_tokens": 3, "arrival_s": -1}, "arrival_s"),
])
def test_jsonl_bad_lines_are_named(line, match):
    with pytest.raises(ValueError, match=match):
        parse_jsonl([json.dumps({"prompt": "ok", "max_tokens": 1}),
                     line if isinstance(line, str) else json.dumps(line)], "t.jsonl")


def test_jsonl_arrival_on_every_line_or_none():
    with pytest.raises(ValueError, match="every line or on none"):
        parse_jsonl([json.dumps({"prompt": "a", "max_tokens": 1, "arrival_s": 0}),
                     json.dumps({"prompt": "b", "max_tokens": 1})])
    with pytest.raises(ValueError, match="no requests"):
        parse_jsonl(["", "  "])


def test_phases_baseline_is_the_short_class_alone():
    cfg = BenchConfig(rate=4, long_share=0.25, duration_s=30, long_prompt_tokens=50)
    wl = build_workload(cfg, words_x2)
    phases = phases_of(wl, baseline=True)
    assert list(phases) == ["baseline", "mixed"]
    assert phases["baseline"].requests == wl.only([SHORT]).requests
    assert list(phases_of(wl, baseline=False)) == ["mixed"]
    assert list(phases_of(wl.only([SHORT]), baseline=True)) == ["mixed"]  # nothing to compare
    assert build_workload(BenchConfig(workload="seed", rate=1, duration_s=10), None).name == "seed"
    with pytest.raises(ValueError, match="seed, mixed, overhead, overload, burst, shift, batch, "
                                         "tenants, chat, shared-doc, azure-conv, azure-code, "
                                         "azure-mix or a .jsonl"):
        build_workload(BenchConfig(workload="other"), None)
    json.dumps(cfg.to_dict())  # goes into report.json as is


def test_overhead_is_vllm_bench_serves_random_shape():
    wl = overhead_workload(count_tokens=lambda text: len(text.split()))
    assert len(wl.requests) == 100 and wl.classes == [SHORT] and wl.long_class is None
    assert {r.max_tokens for r in wl.requests} == {32}
    assert all(abs(len(r.prompt.split()) - 64) <= 2 for r in wl.requests)
    assert len({r.prompt for r in wl.requests}) == 100  # no shared prefixes
    assert wl.params["duration_s"] == wl.requests[-1].arrival_s
    assert 15 < wl.params["duration_s"] < 40  # 100 arrivals at 4/s
    assert list(phases_of(wl, baseline=True)) == ["overhead"]
    assert build_workload(BenchConfig(workload="overhead"), None).name == "overhead"


def test_burst_is_a_steady_short_stream_and_long_prompts_all_at_once():
    wl = burst_workload(rate=2, duration_s=30, burst_size=6, seed=1, long_prompt_tokens=300,
                        long_tokens=128, count_tokens=words_x2)
    shorts = [r for r in wl.requests if r.cls == SHORT]
    longs = [r for r in wl.requests if r.cls == LONG]
    assert [r.arrival_s for r in shorts] == [0.25 + 0.5 * i for i in range(60)]  # evenly spaced
    assert [r.arrival_s for r in longs] == [10.0] * 6  # a third of the way in, together
    assert all(abs(words_x2(r.prompt) - 300) <= 2 and r.max_tokens == 128 for r in longs)
    assert len({r.prompt for r in longs}) == 6  # each its own prompt: no shared prefix
    assert wl.classes == [SHORT, LONG] and wl.params["burst_at_s"] == 10.0
    assert "6 long ones" in wl.params["described"] and "every 0.5 s" in wl.params["described"]
    phases = phases_of(wl, baseline=True)
    assert phases["baseline"].requests == tuple(shorts)  # the same arrivals, without the burst
    at = burst_workload(rate=2, duration_s=30, burst_size=2, burst_at_s=0, count_tokens=words_x2)
    assert {r.arrival_s for r in at.requests if r.cls == LONG} == {0}
    for bad in ({"burst_at_s": 30}, {"burst_at_s": -1}, {"burst_size": -1}):
        with pytest.raises(ValueError, match="burst"):
            burst_workload(rate=2, duration_s=30, **{"burst_size": 1, **bad})
    cfg = BenchConfig(workload="burst", rate=1, duration_s=9, burst_size=3, burst_at_s=4.5)
    wl = build_workload(cfg, words_x2)
    assert wl.counts() == {SHORT: 9, LONG: 3} and wl.params["burst_at_s"] == 4.5
