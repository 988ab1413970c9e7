"""The Azure LLM inference traces 2023 as the planner's arrivals: a window of real arrivals.

The files are the ones `tailguard bench` replays (tailguard/bench/traces/, CC BY 4.0,
attribution there), read here by path: the planner may not import the bench (it replays the
bench's runs). The window follows tailguard/bench/azure_trace.py's rule for a ``rate``: the
first ``rate x duration_s`` requests from ``start_s`` trace seconds on, their span compressed
or stretched to ``duration_s`` (the trace's own burstiness and mix kept); lengths times
``token_scale``, a prompt at least MIN_PROMPT_TOKENS, cut to fit the longest interactive
context; each request's class is the lane the lanes file's rule places it on. Pure but for
reading the files; no text, no tokenizer.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import tailguard
from tailguard.lanes.placement import place
from tailguard.lanes.table import Lane

#: the bench's packaged traces; the bench reads these names and the constants below from here
TRACE_DIR = Path(tailguard.__file__).parent / "bench" / "traces"
FILES = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}
#: Shortest prompt sent: a few tokens of context, and clear of the CPU backend's trouble with
#: 1-3-token prompts on some machines (the tiny model on Intel AMX hosts).
MIN_PROMPT_TOKENS = 8
#: the bench's default window start: 20 minutes in, where both services are busy
START_S = 1200.0


def parse_timestamp(text: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> POSIX seconds (the files have 7 fractional digits,
    more than datetime parses)."""
    whole, _, frac = text.strip().partition(".")
    t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return t + (float(f"0.{frac}") if frac else 0.0)


@lru_cache(maxsize=2)
def rows(trace_dir: Path = TRACE_DIR) -> tuple[tuple[float, int, int], ...]:
    """(seconds after the first request, prompt tokens, output tokens) of both services
    merged by time (azure-mix)."""
    out = []
    for name in FILES.values():
        with open(trace_dir / name, newline="") as f:
            out += [(parse_timestamp(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
                    for r in csv.DictReader(f)]
    out.sort()
    return tuple((t - out[0][0], p, o) for t, p, o in out)


def arrivals(lanes: Sequence[Lane], *, rate: float, duration_s: float, start_s: float = START_S,
             token_scale: float = 1.0,
             trace: Sequence[tuple[float, int, int]] | None = None,
             ) -> list[tuple[float, str, int, int]]:
    """(time, class = lane, prompt tokens, max_tokens) of the window (module docstring)."""
    trace = rows() if trace is None else trace
    first = next((i for i, r in enumerate(trace) if r[0] >= start_s), len(trace))
    n = round(rate * duration_s)
    if n < 1 or first + n >= len(trace):
        raise ValueError(f"{n} requests from {start_s:g} s on are more than the trace has "
                         f"({len(trace) - first}): a lower rate or a shorter duration")
    span = trace[first + n][0] - start_s
    scale = duration_s / span  # the next request would arrive at duration_s
    context = max(l.max_model_len for l in lanes if l.priority == "interactive")
    out = []
    for t, ctx, gen in trace[first:first + n]:
        prompt = max(MIN_PROMPT_TOKENS, round(ctx * token_scale))
        max_tokens = max(1, round(gen * token_scale))
        if prompt + max_tokens > context:
            max_tokens = min(max_tokens, context - MIN_PROMPT_TOKENS)
            prompt = context - max_tokens
        lane = place(lanes, priority="interactive", prompt_tokens=prompt,
                     requested_max_tokens=max_tokens).lane
        out.append(((t - start_s) * scale, lane, prompt, max_tokens))
    return out
