"""The tuned plain vLLM (`direct-tuned`): its flags, the sweep, and which run of it is best. Pure.

What an expert runs instead of tailguard: vLLM's own server with priority scheduling
(the load generator sends each class a vLLM priority, the short class first) and
chunked prefill with a token budget per step (``--max-num-batched-tokens N``) and a
cap on what one long prompt may take of it (``--long-prefill-token-threshold M``),
the knob vLLM's maintainers point to when long prompts starve short ones.
(``--max-num-partial-prefills`` and ``--max-long-partial-prefills`` are not used:
vLLM V1 accepts and ignores them.)

The bench runs one server per (N, M) of ``--tuned-sweep``, each a topology of its own
(``direct-tuned-N-M``), and reports the best by `BEST_RULE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TUNED = "direct-tuned"
#: The sweep's default: the setting issue 33 measured (one server run; sweep more with --tuned-sweep).
DEFAULT_SWEEP: tuple[tuple[int, int], ...] = ((1024, 256),)
#: A run's goodput may be this share below the sweep's best and still be chosen.
GOODPUT_WITHIN = 0.05
BEST_RULE = (f"the lowest short end-to-end P99 among the runs whose goodput is within "
             f"{GOODPUT_WITHIN:.0%} of the sweep's best goodput")


def parse_sweep(text: str) -> tuple[tuple[int, int], ...]:
    """`N:M[,N:M...]` -> ((N, M), ...): each a batched-token budget and a long-prefill threshold."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        n, sep, m = part.partition(":")
        try:
            pair = (int(n), int(m))
        except ValueError:
            pair = (0, 0)
        if not sep or pair[0] <= 0 or pair[1] <= 0:
            raise ValueError(f"a tuned setting is N:M, max-num-batched-tokens:"
                             f"long-prefill-token-threshold, both > 0; not {part!r}")
        if pair[1] > pair[0]:
            raise ValueError(f"{part}: a long-prefill threshold above the step's token budget "
                             "changes nothing")
        out.append(pair)
    if not out:
        raise ValueError("--tuned-sweep needs at least one N:M")
    if len(set(out)) != len(out):
        raise ValueError(f"--tuned-sweep lists a setting twice: {text!r}")
    return tuple(out)


def sweep_text(sweep: tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{n}:{m}" for n, m in sweep)


def tuned_name(batched_tokens: int, threshold: int) -> str:
    """The topology's name for one setting (a folder name too: no colon)."""
    return f"{TUNED}-{batched_tokens}-{threshold}"


def tuned_flags(batched_tokens: int, threshold: int) -> tuple[str, ...]:
    """vLLM server options for one setting (priority scheduling is the direct spec's own)."""
    return ("--enable-chunked-prefill", "--max-num-batched-tokens", str(batched_tokens),
            "--long-prefill-token-threshold", str(threshold))


def check_setting(batched_tokens: int, threshold: int, *, max_num_seqs: int,
                  max_model_len: int) -> None:
    """Refuse, before an engine starts, what vLLM's SchedulerConfig would refuse at start."""
    if batched_tokens < max_num_seqs:
        raise ValueError(f"--tuned-sweep {batched_tokens}:{threshold}: vLLM needs "
                         f"max-num-batched-tokens >= max-num-seqs ({max_num_seqs})")
    if threshold > max_model_len:
        raise ValueError(f"--tuned-sweep {batched_tokens}:{threshold}: vLLM needs "
                         f"long-prefill-token-threshold <= max-model-len ({max_model_len})")


def best_of_sweep(runs: Mapping[str, tuple[float | None, float | None]]) -> str | None:
    """The best run by `BEST_RULE`, from each run's (short end-to-end P99 s, goodput req/s);
    a run missing either is not chosen. Ties: the higher goodput, then the name."""
    measured = {name: (p99, good) for name, (p99, good) in runs.items()
                if p99 is not None and good is not None}
    if not measured:
        return None
    top = max(good for _, good in measured.values())
    eligible = [(p99, -good, name) for name, (p99, good) in measured.items()
                if good >= (1 - GOODPUT_WITHIN) * top]
    return min(eligible)[2]


def is_tuned(topology: str) -> bool:
    return topology.startswith(TUNED + "-")


def tuned_figures(runs: Mapping[str, tuple[float | None, float | None]],
                  flags: Mapping[str, list[str]]) -> dict[str, Any]:
    """The report's `tuned` entry: every run's figures, the best and its flags, the rule."""
    best = best_of_sweep(runs)
    return {"rule": BEST_RULE, "best": best, "flags": flags.get(best) if best else None,
            "runs": {name: {"short_e2e_p99_s": p99, "goodput_rps": good,
                            "flags": flags.get(name)} for name, (p99, good) in runs.items()}}
