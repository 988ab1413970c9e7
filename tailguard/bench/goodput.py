"""Goodput: requests per second that met their class's service-level objectives. Pure.

As vLLM's ``bench serve --goodput`` defines it (vllm/benchmarks/serve.py,
``calculate_metrics``): an SLO is ``KEY:VALUE`` pairs, the value in milliseconds,
the key one of ``ttft`` (time to first token), ``tpot`` (time per output token
after the first: (end-to-end - TTFT) / (output tokens - 1), taken as 0 for a
one-token output) and ``e2el`` (end-to-end latency); a request is good when it
succeeded and is within every pair; goodput is the good requests over the
benchmark's duration. Here each class has its own SLO: the short class the
short one (an interactive answer: its first token and its whole answer soon),
every other class the long one (a long answer: a steady stream), and the
duration is the phase's, from its first request sent to its last one finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tailguard.bench.loadgen import Sample

SLO_KEYS = ("ttft", "tpot", "e2el")
#: (key, milliseconds) pairs: the form BenchConfig keeps an SLO in.
Slo = tuple[tuple[str, float], ...]
DEFAULT_SHORT_SLO: Slo = (("ttft", 1000.0), ("e2el", 4000.0))
DEFAULT_LONG_SLO: Slo = (("tpot", 200.0),)


def parse_slo(text: str) -> Slo:
    """'ttft:1000 e2el:4000' (vLLM's --goodput pairs; commas also separate) -> pairs."""
    out: dict[str, float] = {}
    for pair in text.replace(",", " ").split():
        key, sep, value = pair.partition(":")
        try:
            ms = float(value) if sep else None
        except ValueError:
            ms = None
        if key not in SLO_KEYS or ms is None or ms < 0:
            raise ValueError(f"an SLO is KEY:VALUE pairs, KEY one of {', '.join(SLO_KEYS)} and "
                             f"VALUE milliseconds >= 0; not {pair!r}")
        out[key] = ms
    if not out:
        raise ValueError("an SLO needs at least one KEY:VALUE pair")
    return tuple(out.items())


def slo_text(slo: Iterable[Iterable[Any]]) -> str:
    return ",".join(f"{k}:{v:g}" for k, v in slo)


def tpot_s(sample: Sample) -> float | None:
    """vLLM's TPOT of one successful request (0 for a one-token output, as its goodput does)."""
    if not sample.ok or sample.e2e_s is None or sample.ttft_s is None:
        return None
    n = sample.completion_tokens or 0
    return (sample.e2e_s - sample.ttft_s) / (n - 1) if n > 1 else 0.0


def meets(sample: Sample, slo: Iterable[Iterable[Any]]) -> bool:
    """Whether `sample` succeeded within every pair of `slo`."""
    if not sample.ok:
        return False
    value = {"ttft": sample.ttft_s, "tpot": tpot_s(sample), "e2el": sample.e2e_s}
    return all(value[k] is not None and value[k] <= ms / 1e3 for k, ms in slo)


def phase_span_s(samples: Iterable[Sample]) -> float | None:
    """From the phase's first request sent to its last successful one's end; a topology
    that ran in rounds: the rounds' spans summed (each round's times count from its own
    phase start)."""
    by_round: dict[int, list[Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, []).append(s)
    spans = [span for ss in by_round.values() if (span := _span_s(ss)) is not None]
    return sum(spans) if spans else None


def _span_s(samples: list[Sample]) -> float | None:
    sent = [s.sent_s for s in samples if s.sent_s is not None]
    ends = [s.sent_s + s.e2e_s for s in samples if s.ok and s.sent_s is not None
            and s.e2e_s is not None]
    return max(ends) - min(sent) if ends and max(ends) > min(sent) else None


def goodput(samples: list[Sample], short_class: str | None, short_slo: Slo,
            long_slo: Slo) -> dict[str, Any]:
    """One phase's goodput, in all and per class (the short class held to `short_slo`, the
    others to `long_slo`), each over the phase's span."""
    span = phase_span_s(samples)
    by_class: dict[str, dict[str, Any]] = {}
    for cls in dict.fromkeys(s.cls for s in samples):
        slo = short_slo if cls == short_class else long_slo
        ss = [s for s in samples if s.cls == cls]
        good = sum(1 for s in ss if meets(s, slo))
        by_class[cls] = {"slo": slo_text(slo), "requests": len(ss), "good": good,
                         "goodput_rps": good / span if span else None}
    good = sum(c["good"] for c in by_class.values())
    return {"span_s": span, "requests": len(samples), "good": good,
            "goodput_rps": good / span if span else None, "by_class": by_class}
