"""The engine's step time: ``step_s = a + b * decode_seqs + c * prefill_tokens + d * context``.

One engine step decodes one token for every running sequence and prefills up to
``max_batched_tokens`` prompt tokens (vLLM's chunked prefill). A step's cost is a
fixed part (scheduling, the Python around the model, reading the weights), a part
per token in the batch (a decode token and a prefill token cost differently, so
each has its coefficient) and, for decoding, attention over each sequence's KV
cache: ``context`` is the sum of the decoding sequences' lengths so far. The
coefficients are fitted by least squares from a profile (``tailguard.plan.profile``).

The front end (Redis, the API, the workers' own threads, a bench's load generator)
costs CPU too, on the cores of the engine that shares them (tailguard/host/cores.py):
``frontend_s_per_request`` and ``frontend_s_per_token``, CPU seconds per request and
per output token, fitted (`fit_frontend`) from the CPU a bench run's front end used in
its phases (report.json ``topologies.<t>.host.<phase>.frontend_cpu_s``,
tailguard/bench/host.py); how the simulator uses them is in tailguard/plan/sim.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StepModel:
    a_s: float  # fixed cost of one step
    decode_s: float  # per sequence decoding in the step
    prefill_s: float  # per prompt token prefilled in the step
    context_s: float = 0.0  # per token of KV cache the decoding sequences attend to
    max_batched_tokens: int = 2048  # prompt tokens one step may prefill (chunked prefill)
    overhead_s: float = 0.0  # per request, outside the engine: API, broker, streaming
    #: how much longer its steps take while another engine of the host is stepping (its
    #: cores share the caches and the memory bandwidth; tailguard/plan/sim.py)
    neighbour_slowdown: float = 0.0
    #: the front end's CPU seconds per request and per output token (`fit_frontend`)
    frontend_s_per_request: float = 0.0
    frontend_s_per_token: float = 0.0
    source: dict[str, Any] = field(default_factory=dict)  # how it was obtained

    def step_s(self, decode_seqs: int, prefill_tokens: int, context_tokens: int = 0) -> float:
        return (self.a_s + self.decode_s * decode_seqs + self.prefill_s * prefill_tokens
                + self.context_s * context_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepModel:
        known = {k: d[k] for k in ("a_s", "decode_s", "prefill_s", "context_s", "max_batched_tokens",
                                   "overhead_s", "neighbour_slowdown",
                                   "frontend_s_per_request", "frontend_s_per_token", "source")
                 if k in d}
        return cls(**known)

    @classmethod
    def load(cls, path: str | Path) -> StepModel:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def path_free(name: str | Path, parts: int = 1) -> str:
    """`name` as a step model's `source` records it: a local path by its last `parts`
    components (where it lay on the measuring machine means nothing on another), anything
    else (a Hugging Face id) as given."""
    path = Path(name)
    if not (path.is_absolute() or path.exists()):
        return str(name)
    return "/".join(path.parts[-parts:])


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def fit(decode: Sequence[tuple[int, float]], prefill: Sequence[tuple[int, float]],
        long_decode: Sequence[tuple[int, int, float]] = (), **kw: Any) -> StepModel:
    """A StepModel from measurements: (batch size, seconds per decode step) with short
    contexts, (prompt tokens, seconds of the step that prefilled them), and (batch size,
    context tokens in all, seconds per decode step) with long contexts.

    The short-context decode line gives the fixed cost (intercept) and the cost per
    sequence (slope); the prefill line's slope is the cost per prompt token (its
    intercept, the fixed cost plus one decode, is a check, kept in ``source``); what the
    long-context steps take beyond the short-context line, over their context tokens
    (least squares through the origin), is the cost per context token.
    """
    a, b = fit_line([n for n, _ in decode], [s for _, s in decode])
    a2, c = fit_line([p for p, _ in prefill], [s for _, s in prefill])
    d = 0.0
    if long_decode:
        xs = [ctx for _, ctx, _ in long_decode]
        d = sum(x * (s - a - b * n) for (n, _, s), x in zip(long_decode, xs)) / sum(x * x for x in xs)
    source = dict(kw.pop("source", {}), decode_points=[list(x) for x in decode],
                  prefill_points=[list(x) for x in prefill],
                  long_decode_points=[list(x) for x in long_decode], prefill_intercept_s=a2)
    return StepModel(a_s=max(a, 0.0), decode_s=max(b, 0.0), prefill_s=max(c, 0.0),
                     context_s=max(d, 0.0), source=source, **kw)


def slowdown(points: Sequence[tuple[int, float, float]]) -> float:
    """``neighbour_slowdown`` from (batch size, step seconds alone,
    step seconds beside the busy other engine): the median of the ratios, less one (never
    below 0)."""
    if not points:
        raise ValueError("no points")
    ratios = sorted(beside / alone for _, alone, beside in points)
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return max(median - 1.0, 0.0)


def fit_frontend(points: Sequence[tuple[int, int, float]]) -> tuple[float, float]:
    """(``frontend_s_per_request``, ``frontend_s_per_token``) from (requests, output tokens,
    front-end CPU seconds) of bench phases: least squares through the origin (no CPU without
    requests), so two phases of different request/token mixes give it exactly. Neither is
    below 0."""
    srr = sum(n * n for n, _, _ in points)
    stt = sum(t * t for _, t, _ in points)
    srt = sum(n * t for n, t, _ in points)
    sry = sum(n * y for n, _, y in points)
    sty = sum(t * y for _, t, y in points)
    det = srr * stt - srt * srt
    if det <= 1e-9 * srr * stt:
        raise ValueError("the phases need different mixes of requests and tokens")
    per_request, per_token = (sry * stt - sty * srt) / det, (sty * srr - sry * srt) / det
    if per_request < 0:  # the best fit with tokens alone
        return 0.0, max(sty / stt, 0.0)
    if per_token < 0:
        return max(sry / srr, 0.0), 0.0
    return per_request, per_token


def frontend_points(report: dict[str, Any]) -> list[tuple[str, tuple[int, int, float]]]:
    """("topology/phase", (requests, output tokens, front-end CPU s)) of each phase of a bench
    report.json that recorded its front end's CPU (tailguard/bench/host.py). `direct` is left
    out: its front end is vLLM's own server (its report entry names it, `server`), not ours."""
    out = []
    for topo, t in report["topologies"].items():
        if "server" in t:
            continue
        for phase, classes in (t.get("phases") or {}).items():
            cpu = ((t.get("host") or {}).get(phase) or {}).get("frontend_cpu_s")
            if cpu is None:
                continue
            out.append((f"{topo}/{phase}", (sum(c["count"] for c in classes.values()),
                                            sum(c["output_tokens"] for c in classes.values()),
                                            cpu)))
    return out
