"""A topology measured more than once in one bench run, its rounds pooled.

On a small host one pair's ratios can flip with the order the topologies ran in. Naming a
topology twice (`--topologies lanes,fleet,fleet,lanes`) starts it afresh each time (its own
engines, Redis database and log folder) and the report pools its rounds: their requests
together, their engines' counters summed, their spans summed. Each round's own figures stay in
the report (tailguard/bench/report.py `rounds`).

Pure: the bench's run loop (tailguard/bench/run.py) calls it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Fields of a phase's host figures (tailguard/bench/host.py) that add up over rounds.
_SUMMED = ("wall_s", "others_cpu_s", "frontend_cpu_s", "engine_cpu_s")


def run_order(wanted: Iterable[str], names: Iterable[str],
              matches: Callable[[str, str], bool] | None = None) -> list[tuple[str, int]]:
    """(topology, round) in the order they run: each of `wanted` in turn, expanded to the
    `names` it stands for (`matches(name, want)`, default equality); a topology wanted again
    runs again as its next round."""
    names = list(names)
    match = matches or (lambda name, want: name == want)
    seen: Counter[str] = Counter()
    out = []
    for want in wanted:
        for name in names:
            if match(name, want):
                seen[name] += 1
                out.append((name, seen[name]))
    return out


def round_label(name: str, round_no: int) -> str:
    """What a round's logs and folder are called: the topology's name, then `.2`, `.3`..."""
    return name if round_no == 1 else f"{name}.{round_no}"


def pool_engines(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Two rounds' engine figures (tailguard/bench/engine_watch.py's EngineWatch.stop) as one:
    the series of each engine joined (their times are wall clock), its requests served and
    prefix-cache tokens summed (None where either round left it unread). A round whose engines
    were not watched at all (None) adds nothing."""
    if a is None or b is None:
        return dict(a or b) if (a or b) else None

    def both(x: Any, y: Any, add: Any) -> Any:
        return None if x is None or y is None else add(x, y)

    engines = list(dict.fromkeys([*a.get("series", {}), *b.get("series", {})]))
    return {
        "series": {e: [*a.get("series", {}).get(e, []), *b.get("series", {}).get(e, [])]
                   for e in engines},
        "served": {e: both(a.get("served", {}).get(e), b.get("served", {}).get(e),
                           lambda x, y: x + y)
                   for e in dict.fromkeys([*a.get("served", {}), *b.get("served", {})])},
        "prefix_cache": {e: both(a.get("prefix_cache", {}).get(e),
                                 b.get("prefix_cache", {}).get(e),
                                 lambda x, y: {k: x[k] + y[k] for k in ("queries", "hits")})
                         for e in dict.fromkeys([*a.get("prefix_cache", {}),
                                                 *b.get("prefix_cache", {})])}}


def pool_host(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two rounds' figures of one phase as one: CPU seconds and wall time summed, the other
    processes' share over both, disturbed if either was, the engines pooled; the rest
    (stalls, Redis's latency events, load averages): the first round's, or the second's
    where the first has none."""
    out = {**b, **a}
    for key in _SUMMED:
        if key in a and key in b:
            out[key] = round(a[key] + b[key], 1)
    if "others_share" in a and "others_share" in b and a.get("wall_s") and b.get("wall_s"):
        out["others_share"] = round((a["others_share"] * a["wall_s"]
                                     + b["others_share"] * b["wall_s"])
                                    / (a["wall_s"] + b["wall_s"]), 3)
    if "disturbed" in a or "disturbed" in b:
        out["disturbed"] = bool(a.get("disturbed") or b.get("disturbed"))
    if "engines" in a or "engines" in b:
        out["engines"] = pool_engines(a.get("engines"), b.get("engines"))
    return out


def pool_hosts(a: Mapping[str, Mapping[str, Any]],
               b: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase, `pool_host` of the two rounds (a phase only one ran: its own)."""
    return {phase: (pool_host(a[phase], b[phase]) if phase in a and phase in b
                    else dict(a.get(phase) or b[phase]))
            for phase in dict.fromkeys([*a, *b])}


def pool_ends(a: Mapping[str, int] | None, b: Mapping[str, int] | None) -> dict[str, int] | None:
    """Terminal entries per job id over two rounds' finished streams (None: either unread)."""
    if a is None or b is None:
        return None
    return dict(Counter(a) + Counter(b))


__all__ = ["pool_ends", "pool_engines", "pool_host", "pool_hosts", "round_label", "run_order"]
