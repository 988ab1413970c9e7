"""The Azure trace workloads: the packaged files, the window, the scaling, classes by place()."""

import io
import random
import tomllib
from fnmatch import fnmatch
from importlib import resources

import pytest
from conftest import ROOT

from tailguard.bench.azure_trace import (
    FILES,
    MIN_PROMPT_TOKENS,
    TRACES,
    TraceRow,
    describe,
    load_trace,
    parse_csv,
    parse_timestamp,
    scaled_lengths,
    select_window,
    trace_workload,
)
from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.lanes.placement import place
from tailguard.lanes.table import default_lanes_path, load_lanes
from tailguard.plan.synthetic import exact_prompt


def words_and_bos(text: str) -> int:
    """A stand-in tokenizer: one token per word, plus a BOS (as the served counter adds)."""
    return 1 + len(text.split())


@pytest.fixture(scope="module")
def lanes():
    return list(load_lanes(default_lanes_path()))


def rows(times, ctx=100, gen=10, source="conv"):
    return [TraceRow(t, ctx, gen, source) for t in times]


def test_the_traces_ship_in_the_package_with_their_licence_and_attribution():
    folder = resources.files("tailguard.bench").joinpath("traces")
    assert {FILES["conv"], FILES["code"], "LICENSE", "README.md"} <= {p.name for p in folder.iterdir()}
    assert "Attribution 4.0 International" in folder.joinpath("LICENSE").read_text(encoding="utf-8-sig")
    readme = folder.joinpath("README.md").read_text()
    assert "Splitwise" in readme and "CC BY 4.0" in readme and "AzurePublicDataset" in readme
    # the wheel carries what pyproject's package-data names: every file of the folder
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in (p.name for p in folder.iterdir()):
        assert any(fnmatch(f"traces/{name}", g) for g in data.get("tailguard.bench", [])), name


def test_the_packaged_traces_read_as_the_dataset_describes_them():
    conv, code, mix = (load_trace(name) for name in ("azure-conv", "azure-code", "azure-mix"))
    assert (len(conv), len(code), len(mix)) == (19366, 8819, 19366 + 8819)
    for trace in (conv, code, mix):
        assert trace[0].t_s == 0 and [r.t_s for r in trace] == sorted(r.t_s for r in trace)
        assert min(r.context_tokens for r in trace) > 0 and min(r.generated_tokens for r in trace) > 0
    assert 3400 < conv[-1].t_s < 3600 and {r.source for r in mix} == {"conv", "code"}
    # merged on their own clocks: the code service's first request came 77 s after conv's
    assert next(r.t_s for r in mix if r.source == "code") == pytest.approx(77.3, abs=0.1)
    assert sorted(r.context_tokens for r in conv)[len(conv) // 2] == 1020  # the median the README gives


def test_timestamps_with_seven_fractional_digits_parse():
    a = parse_timestamp("2023-11-16 18:15:46.6805900")
    assert a == pytest.approx(1700158546.68059, abs=1e-6)  # UTC
    assert parse_timestamp("2023-11-16 18:15:47") - a == pytest.approx(0.31941, abs=1e-6)


def test_a_bad_csv_row_is_named():
    with pytest.raises(ValueError, match="conv:3"):
        parse_csv(io.StringIO("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                              "2023-11-16 18:15:46.1,5,6\n2023-11-16 18:15:47.1,x,6\n"), "conv")
    with pytest.raises(ValueError, match="expected columns"):
        parse_csv(io.StringIO("a,b\n1,2\n"), "code")
    with pytest.raises(ValueError, match="unknown trace"):
        load_trace("azure-other")


def test_a_rate_picks_that_many_requests_and_stretches_their_span_to_the_duration():
    trace = rows([float(i) for i in range(100)])  # one request a second
    win = select_window(trace, start_s=10, duration_s=20, rate=0.5)
    assert len(win.rows) == 10 and win.rows[0].t_s == 10 and win.first == 10
    assert win.span_s == 10 and win.time_scale == 2.0  # the 11th request would land at 20 s
    assert [win.arrival_s(r) for r in win.rows] == [2.0 * i for i in range(10)]
    win = select_window(trace, start_s=10.5, duration_s=5, rate=4)  # compressed
    assert win.rows[0].t_s == 11 and len(win.rows) == 20  # 11..30; the next, at 31, lands at 5 s
    assert win.time_scale == pytest.approx(5 / 20.5)


def test_a_time_scale_takes_the_trace_seconds_it_covers():
    trace = rows([0.0, 1.0, 1.5, 2.0, 5.0, 9.0])
    win = select_window(trace, start_s=1.0, duration_s=8, time_scale=2.0)
    assert [r.t_s for r in win.rows] == [1.0, 1.5, 2.0] and win.span_s == 4.0
    assert [win.arrival_s(r) for r in win.rows] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("kw,match", [
    ({"start_s": 200, "rate": 1}, "outside the trace"),
    ({"start_s": -1, "rate": 1}, "outside the trace"),
    ({"start_s": 90, "rate": 1}, "more than the trace has"),
    ({"start_s": 0, "time_scale": 0.1}, "runs past the trace's end"),
    ({"start_s": 0, "time_scale": 0}, "--time-scale must be > 0"),
    ({"start_s": 0}, "--rate > 0 or --time-scale"),
])
def test_a_window_that_does_not_fit_the_trace_says_why(kw, match):
    with pytest.raises(ValueError, match=match):
        select_window(rows([float(i) for i in range(100)]), duration_s=20, **kw)


@pytest.mark.parametrize("ctx,gen,scale,context,want", [
    (1000, 200, 0.25, 4096, (250, 50, False)),
    (2, 1, 0.25, 4096, (MIN_PROMPT_TOKENS, 1, False)),  # the floors
    (14050, 400, 1.0, 4096, (3696, 400, True)),  # cut to fit the longest context
    (100, 9000, 1.0, 4096, (MIN_PROMPT_TOKENS, 4096 - MIN_PROMPT_TOKENS, True)),
])
def test_lengths_are_scaled_with_floors_and_cut_to_fit(ctx, gen, scale, context, want):
    assert scaled_lengths(TraceRow(0, ctx, gen, "conv"), scale, context) == want


@pytest.mark.parametrize("target", [MIN_PROMPT_TOKENS, 37, 500, 3000])
def test_exact_prompt_has_exactly_the_target_tokens(target):
    prompt, n = exact_prompt(target, random.Random(target), words_and_bos)
    assert n == target == words_and_bos(prompt)


def test_exact_prompt_says_when_the_tokenizer_cannot_hit_the_target():
    two_per_word = lambda text: 2 * len(text.split())  # no word adds one token
    prompt, n = exact_prompt(301, random.Random(0), two_per_word)
    assert n == two_per_word(prompt) == 300


def test_classes_are_the_lanes_the_api_would_choose(lanes):
    trace = [TraceRow(i * 0.5, ctx, gen, "conv")
             for i, (ctx, gen) in enumerate([(100, 10), (4000, 200), (900, 400), (30, 1200)] * 5)]
    wl = trace_workload("azure-conv", lanes=lanes, model_max_len=8192, count_tokens=words_and_bos,
                        duration_s=10, rate=1.5, token_scale=0.5, rows=trace)
    assert len(wl.requests) == 15 and wl.classes == ["short", "long"]
    assert (wl.short_class, wl.long_class) == ("short", "long")
    for r in wl.requests:
        assert words_and_bos(r.prompt) == r.prompt_tokens
        where = place(lanes, priority="interactive", prompt_tokens=r.prompt_tokens,
                      requested_max_tokens=None, model_max_len=8192)
        assert where.lane in ("short", "long")
    by_lengths = {(r.prompt_tokens, r.cls, r.max_tokens) for r in wl.requests}
    # 100+10 -> 50/5 fits short; 4000/200 -> 2000/100 is long; 900/400 -> 450/200: cost 650 and
    # max_tokens 200 fit short's 1024 and 256; 30/1200 -> 15/600: over short's cap, so long
    assert by_lengths == {(50, "short", 5), (2000, "long", 100), (450, "short", 200),
                          (15, "long", 600)}
    p = wl.params
    assert (p["rate"], p["time_scale"], p["window_rows"], p["cut_to_fit"]) == (1.5, 10 / 7.5, 15, 0)
    assert p["prompt_tokens_inexact"] == 0 and p["max_tokens_capped"] == 0
    assert "rows 0-14 of 20" in p["described"] and "token scale 0.5" in p["described"]
    assert describe(p) == p["described"]
    assert list(phases_of(wl, baseline=True)) == ["baseline", "mixed"]


def test_a_trace_of_one_class_has_no_long_class(lanes):
    wl = trace_workload("azure-code", lanes=lanes, model_max_len=None, count_tokens=words_and_bos,
                        duration_s=5, rate=1, rows=rows([float(i) for i in range(10)], source="code"))
    assert wl.classes == ["short"] and wl.long_class is None
    assert list(phases_of(wl, baseline=True)) == ["mixed"]


def test_the_same_seed_builds_the_same_trace_workload(lanes):
    args = dict(lanes=lanes, model_max_len=None, count_tokens=words_and_bos, duration_s=20,
                rate=2, rows=rows([i * 0.3 for i in range(200)], ctx=400))
    a, b = trace_workload("azure-mix", **args), trace_workload("azure-mix", **args)
    assert a == b and a != trace_workload("azure-mix", seed=1, **args)
    assert len({r.prompt.split()[0:8].__repr__() for r in a.requests}) == len(a.requests)


def test_bench_builds_each_trace_workload_from_the_packaged_files():
    cfg = BenchConfig(workload="azure-mix", rate=3, duration_s=20)
    wl = build_workload(cfg, words_and_bos)
    p = wl.params
    assert p["trace"] == "azure-mix" and p["trace_start_s"] == 1200 and len(wl.requests) == 60
    assert set(p["by_source"]) == {"conv", "code"} and all(p["by_source"].values())
    assert all(r.ignore_eos for r in wl.requests)
    for name in TRACES:
        assert build_workload(BenchConfig(workload=name, duration_s=4), words_and_bos).name == name
    with pytest.raises(ValueError, match="tokenizer"):
        build_workload(cfg, None)
    own = build_workload(BenchConfig(workload="azure-conv", duration_s=4, ignore_eos=False),
                         words_and_bos)
    assert not any(r.ignore_eos for r in own.requests) and own.params["ignore_eos"] is False
