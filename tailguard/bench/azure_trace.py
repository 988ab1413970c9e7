"""The Azure LLM inference traces 2023 as workloads: a window of real arrivals and lengths.

The traces (tailguard/bench/traces/, CC BY 4.0, attribution in its README) give,
per request, its arrival time and its prompt and output lengths in tokens; no
text. A workload takes a window of one (``azure-conv``, ``azure-code``) or of
both merged on their own timestamps (``azure-mix``: the two services at once, as
they ran), then fits it to the host:

* **window**: the requests from ``trace_start_s`` (seconds after the trace's first
  request) on. With a ``rate``, the first ``rate x duration_s`` of them, their
  span stretched or compressed to ``duration_s``; with a ``time_scale``, those
  within ``duration_s / time_scale`` trace seconds. Either way the arrivals keep
  the trace's own burstiness, scaled in time by ``time_scale`` (> 1: slower).
* **lengths**: both token counts times ``token_scale``, a prompt at least
  ``MIN_PROMPT_TOKENS`` and an output at least 1; a request that would not fit the
  longest context of the interactive lanes has its prompt cut to fit (counted).
* **classes**: the lane the lanes file's own rule (``tailguard.lanes.placement.place``,
  as the API applies it) puts the request in, and the ``max_tokens`` it allows:
  every topology is sent what tailguard would run.
* **prompts**: random words with exactly the traced (scaled) number of tokens in
  the served tokenizer (``plan.synthetic.exact_prompt``), each a fresh draw, so vLLM's
  prefix cache gets no help the real traffic would not have had.

Pure but for reading the packaged CSV files.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from tailguard.bench.workload import BenchRequest, Workload, finish
from tailguard.errors import RequestError
from tailguard.lanes.placement import place
from tailguard.lanes.table import Lane
from tailguard.plan.azure import FILES, MIN_PROMPT_TOKENS, parse_timestamp
from tailguard.plan.synthetic import class_stream, exact_prompt

#: Workload name -> the trace files it merges.
TRACES = {"azure-conv": ("conv",), "azure-code": ("code",), "azure-mix": ("conv", "code")}


@dataclass(frozen=True)
class TraceRow:
    t_s: float  # seconds after the first request of the trace (of the merged ones: the earliest)
    context_tokens: int
    generated_tokens: int
    source: str  # "conv" or "code"


def parse_csv(lines: Iterable[str], source: str) -> list[tuple[float, int, int, str]]:
    """(POSIX time, context tokens, generated tokens, source) per row; a bad row raises
    ValueError naming it."""
    out = []
    reader = csv.DictReader(lines)
    want = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if not want <= set(reader.fieldnames or ()):
        raise ValueError(f"{source}: expected columns {sorted(want)}, got {reader.fieldnames}")
    for n, row in enumerate(reader, 2):
        try:
            out.append((parse_timestamp(row["TIMESTAMP"]), int(row["ContextTokens"]),
                        int(row["GeneratedTokens"]), source))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}:{n}: {exc}") from None
    return out


def read_source(source: str) -> str:
    """One packaged trace file's text."""
    return resources.files("tailguard.bench").joinpath("traces", FILES[source]).read_text()


@lru_cache(maxsize=8)
def load_trace(name: str, read: Callable[[str], str] = read_source) -> tuple[TraceRow, ...]:
    """The rows of workload `name` (TRACES), merged by time, from the first one's instant
    (cached: the files do not change, and parsing them takes a while)."""
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r} (known: {', '.join(TRACES)})")
    rows = sorted((r for src in TRACES[name] for r in parse_csv(io.StringIO(read(src)), src)),
                  key=lambda r: r[0])
    if not rows:
        raise ValueError(f"trace {name!r} has no rows")
    t0 = rows[0][0]
    return tuple(TraceRow(t - t0, ctx, gen, src) for t, ctx, gen, src in rows)


@dataclass(frozen=True)
class TraceWindow:
    rows: tuple[TraceRow, ...]
    start_s: float  # trace seconds where the window starts
    span_s: float  # trace seconds it covers
    time_scale: float  # bench seconds per trace second (> 1: stretched, a lower rate)
    first: int  # index of its first row in the trace
    trace_rows: int
    trace_span_s: float

    def arrival_s(self, row: TraceRow) -> float:
        return (row.t_s - self.start_s) * self.time_scale


def select_window(rows: Sequence[TraceRow], *, start_s: float, duration_s: float,
                  rate: float | None = None, time_scale: float | None = None) -> TraceWindow:
    """The rows a run of `duration_s` bench seconds replays (see the module docstring):
    `time_scale` when given, else the one that makes `rate` requests per second."""
    if duration_s <= 0:
        raise ValueError("a trace workload needs --duration > 0")
    end = rows[-1].t_s
    if not 0 <= start_s < end:
        raise ValueError(f"--trace-start {start_s:g} s is outside the trace (0 to {end:.0f} s)")
    first = next(i for i, r in enumerate(rows) if r.t_s >= start_s)
    if time_scale is not None:
        if time_scale <= 0:
            raise ValueError("--time-scale must be > 0")
        span = duration_s / time_scale
        if start_s + span > end:
            raise ValueError(f"the window {start_s:g}-{start_s + span:.0f} s runs past the trace's "
                             f"end ({end:.0f} s): a later --time-scale, shorter --duration or "
                             "earlier --trace-start")
        picked = [r for r in rows[first:] if r.t_s < start_s + span]
    else:
        if rate is None or rate <= 0:
            raise ValueError("a trace workload needs --rate > 0 or --time-scale")
        n = round(rate * duration_s)
        if n < 1 or first + n >= len(rows):
            raise ValueError(f"{n} requests from {start_s:g} s on are more than the trace has "
                             f"({len(rows) - first}): a lower --rate, shorter --duration or "
                             "earlier --trace-start")
        picked = list(rows[first:first + n])
        span = rows[first + n].t_s - start_s  # the next request would arrive at duration_s
        if span <= 0:
            raise ValueError(f"the trace's requests from {start_s:g} s on all arrive at once")
        time_scale = duration_s / span
    return TraceWindow(tuple(picked), start_s, span, time_scale, first, len(rows), end)


def scaled_lengths(row: TraceRow, token_scale: float, max_context: int) -> tuple[int, int, bool]:
    """(prompt tokens, output tokens, cut to fit) of `row` at `token_scale` within `max_context`."""
    prompt = max(MIN_PROMPT_TOKENS, round(row.context_tokens * token_scale))
    out = max(1, round(row.generated_tokens * token_scale))
    if prompt + out <= max_context:
        return prompt, out, False
    out = min(out, max_context - MIN_PROMPT_TOKENS)
    return max_context - out, out, True


def longest_context(lanes: Sequence[Lane], model_max_len: int | None) -> int:
    """The longest context an interactive request can get from these lanes."""
    return max(l.context_len(model_max_len) for l in lanes if l.priority == "interactive")


def trace_workload(name: str, *, lanes: Sequence[Lane], model_max_len: int | None,
                   count_tokens: Callable[[str], int], duration_s: float,
                   rate: float | None = None, time_scale: float | None = None,
                   trace_start_s: float = 0.0, token_scale: float = 1.0, seed: int = 0,
                   max_requests: int | None = None,
                   rows: Sequence[TraceRow] | None = None) -> Workload:
    """Workload `name` (TRACES) fitted to the host (module docstring); `rows`: the trace's
    rows when already loaded."""
    if token_scale <= 0:
        raise ValueError("--token-scale must be > 0")
    rows = load_trace(name) if rows is None else rows
    win = select_window(rows, start_s=trace_start_s, duration_s=duration_s, rate=rate,
                        time_scale=time_scale)
    context = longest_context(lanes, model_max_len)
    rng = class_stream(seed, name)
    requests: list[BenchRequest] = []
    cut = capped = inexact = 0
    for row in win.rows:
        prompt_tokens, out, was_cut = scaled_lengths(row, token_scale, context)
        try:
            where = place(lanes, priority="interactive", prompt_tokens=prompt_tokens,
                          requested_max_tokens=out, model_max_len=model_max_len)
        except RequestError as exc:  # a lanes file with no lane for it: the API would refuse it too
            raise ValueError(f"{name}: no lane for a request of {prompt_tokens} prompt tokens and "
                             f"max_tokens {out}: {exc}") from None
        prompt, n = exact_prompt(prompt_tokens, rng, count_tokens)
        cut += was_cut
        capped += where.max_tokens_capped
        inexact += n != prompt_tokens
        requests.append(BenchRequest(where.lane, prompt, where.max_tokens, win.arrival_s(row),
                                     prompt_tokens=n))
    order = [l.name for l in lanes if l.priority == "interactive"]
    used = [c for c in order if any(r.cls == c for r in requests)]
    params: dict[str, Any] = {
        "trace": name, "files": [FILES[s] for s in TRACES[name]], "duration_s": duration_s,
        "seed": seed, "trace_start_s": trace_start_s, "window_span_s": win.span_s,
        "window_first_row": win.first, "window_rows": len(win.rows),
        "trace_rows": win.trace_rows, "trace_span_s": win.trace_span_s,
        "time_scale": win.time_scale, "token_scale": token_scale,
        "rate": len(requests) / duration_s, "trace_rate": len(win.rows) / win.span_s,
        "by_source": {s: sum(1 for r in win.rows if r.source == s) for s in TRACES[name]},
        "longest_context": context, "cut_to_fit": cut, "max_tokens_capped": capped,
        "prompt_tokens_inexact": inexact,
        "traced_median_tokens": {"prompt": _median([r.context_tokens for r in win.rows]),
                                 "output": _median([r.generated_tokens for r in win.rows])},
    }
    params["described"] = describe(params)
    return finish(name, requests, max_requests, short_class=used[0] if used else None,
                   long_class=used[-1] if len(used) > 1 else None, params=params)


def _median(values: list[int]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def describe(params: dict[str, Any]) -> str:
    """The window, scales and rate a trace workload used, in one line."""
    p = params
    sources = ", ".join(f"{s} {n}" for s, n in p["by_source"].items())
    return (f"{p['trace']}: trace seconds {p['trace_start_s']:g}-"
            f"{p['trace_start_s'] + p['window_span_s']:.1f} of {p['trace_span_s']:.0f} "
            f"(rows {p['window_first_row']}-{p['window_first_row'] + p['window_rows'] - 1} of "
            f"{p['trace_rows']}; {sources}), its {p['trace_rate']:.2f} req/s replayed at "
            f"{p['rate']:.2f} req/s over {p['duration_s']:g} s (time scale {p['time_scale']:.3g}: "
            f"{'stretched' if p['time_scale'] > 1 else 'compressed'}); token scale "
            f"{p['token_scale']:g} (the window's traced medians: prompt "
            f"{p['traced_median_tokens']['prompt']}, output {p['traced_median_tokens']['output']}); "
            f"{p['cut_to_fit']} prompts cut to fit "
            f"{p['longest_context']} tokens, {p['max_tokens_capped']} max_tokens capped by their "
            f"lane, {p['prompt_tokens_inexact']} prompts not of the exact length")
