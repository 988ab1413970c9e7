"""tailguard against its peers, per class: served, within target, refused, and refused while an
engine had a free slot. Pure.

Issue 42's table. For each topology of the run, on one phase (``mixed``), and each class
(short, long): requests sent, served (succeeded), within target, refused with 429 and with
503 (after the client's retries, when it retried: `Sample.attempts`), and, for the short class,
refused while an engine that may serve it had a free slot (tailguard/bench/engine_watch.py: from
the engines' own ``vllm:num_requests_running`` and ``_waiting`` against their slots). Then
tailguard's (the ``lanes`` topology's) figures over the better of the two router fleets
(`BETTER_FLEET_RULE`) and over the best tuned vLLM (tailguard/bench/tuned.py).

Within target is fixed, not the lanes file's targets, so every topology is held to the
same numbers: the short class the bench's short SLO (tailguard/bench/goodput.py), every
other class the long SLO plus a first token within `LONG_TTFT_TARGET_S`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tailguard.bench.engine_watch import free_slot_evidence, prefix_hit_rate
from tailguard.bench.goodput import Slo, meets, slo_text
from tailguard.bench.loadgen import REFUSED, Sample
from tailguard.bench.topology import FLEET, FLEET_P2
from tailguard.plan.sim import percentile

TAILGUARD = "lanes"
FLEETS = (FLEET, FLEET_P2)
#: A long request's first token within this is part of its target (issue 42's long target).
LONG_TTFT_TARGET_S = 10.0
BETTER_FLEET_RULE = ("the fleet with more requests within target (every class), then the "
                     "higher output tok/s")
#: The figures compared, each with whether more is better.
COMPARED = {"served": True, "within_target": True, "refused_free_slot": False,
            "e2e_p99_s": False, "ttft_p99_s": False}


def targets(short_slo: Slo, long_slo: Slo) -> tuple[Slo, Slo]:
    """The short and long targets: the bench's SLOs, the long one with a TTFT bound
    (`LONG_TTFT_TARGET_S`) unless it has one of its own."""
    keys = dict(long_slo)
    keys.setdefault("ttft", LONG_TTFT_TARGET_S * 1e3)
    return short_slo, tuple(keys.items())


def class_row(samples: list[Sample], slo: Slo, free_slot: int | None) -> dict[str, Any]:
    """One class of one topology: the table's figures."""
    ok = [s for s in samples if s.ok]
    refused = [s for s in samples if s.status == REFUSED]
    return {"sent": len(samples), "served": len(ok),
            "within_target": sum(1 for s in samples if meets(s, slo)),
            "refused_429": sum(1 for s in refused if s.http_status == 429),
            "refused_503": sum(1 for s in refused if s.http_status == 503),
            "refused_free_slot": free_slot,
            "retried": sum(1 for s in samples if s.attempts > 1),
            "e2e_p99_s": percentile([s.e2e_s for s in ok if s.e2e_s is not None], 99),
            "ttft_p99_s": percentile([s.ttft_s for s in ok if s.ttft_s is not None], 99)}


def topology_rows(samples: list[Sample], classes: Iterable[str], slos: dict[str, Slo],
                  engines: dict[str, Any] | None, slots: dict[str, int] | None,
                  class_engines: dict[str, list[str]] | None) -> dict[str, Any]:
    """Every class of one topology's phase (`class_row`), how many requests each of its
    engines served and its prefix cache's hit rate (`engines`: the phase's EngineWatch
    figures; None: not watched)."""
    classes = list(classes)
    watched = bool(engines and slots)
    free = free_slot_evidence(samples, engines["series"], slots, class_engines) if watched else {}
    # only the first (short) class: the gauges count every request on an engine against its
    # slots, the first lane's limit; a later lane's own limit there is lower, which they cannot show
    rows = {cls: class_row([s for s in samples if s.cls == cls], slos[cls],
                           len(free.get(cls, [])) if watched and cls == classes[0] else None)
            for cls in classes}
    if watched and classes:
        rows[classes[0]]["refused_free_slot_evidence"] = free.get(classes[0], [])
    cache = (engines or {}).get("prefix_cache")
    return {"classes": rows, "engine_served": (engines or {}).get("served"),
            "prefix_cache": prefix_hit_rate(cache) if cache else None}


def better_fleet(rows: dict[str, dict[str, Any]], tok_s: dict[str, float | None]) -> str | None:
    """The better of the fleets that ran, by `BETTER_FLEET_RULE`."""
    ran = [f for f in FLEETS if f in rows]
    if not ran:
        return None
    return max(ran, key=lambda f: (sum(c["within_target"] for c in rows[f]["classes"].values()),
                                   tok_s.get(f) or 0.0))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per class and figure of `COMPARED`, tailguard's over the peer's."""
    return {cls: {k: _ratio(row.get(k), theirs["classes"].get(cls, {}).get(k)) for k in COMPARED}
            for cls, row in mine["classes"].items()}


def comparison(report: dict[str, Any], samples: dict[str, dict[str, list[Sample]]],
               short_slo: Slo, long_slo: Slo, phase: str = "mixed") -> dict[str, Any] | None:
    """The report's `peers` entry (the module docstring), or None when no topology ran `phase`."""
    wl = report["workload"]
    short, long = wl["short_class"], wl["long_class"]
    classes = [c for c in (short, long) if c]
    if not classes or not any(phase in by_phase for by_phase in samples.values()):
        return None
    short_t, long_t = targets(short_slo, long_slo)
    slos = {c: short_t if c == short else long_t for c in classes}
    rows = {}
    for topo, by_phase in samples.items():
        if phase not in by_phase:
            continue
        info = report["topologies"].get(topo, {})
        rows[topo] = topology_rows(by_phase[phase], classes, slos,
                                   ((info.get("host") or {}).get(phase) or {}).get("engines"),
                                   info.get("engine_slots"), info.get("class_engines"))
    tok_s = {t: ((report["topologies"][t].get("totals") or {}).get(phase) or {}).get("output_tok_s")
             for t in rows}
    fleet = better_fleet(rows, tok_s)
    tuned = (report.get("tuned") or {}).get("best")
    mine = rows.get(TAILGUARD)
    return {"phase": phase, "targets": {c: slo_text(slos[c]) for c in classes},
            "retries": report["config"].get("retries", 0), "rows": rows, "output_tok_s": tok_s,
            "better_fleet": fleet, "rule": BETTER_FLEET_RULE, "tuned": tuned,
            "vs_fleet": ratios(mine, rows[fleet]) if mine and fleet else None,
            "vs_tuned": ratios(mine, rows[tuned]) if mine and tuned in rows else None,
            "output_vs": {p: _ratio(tok_s.get(TAILGUARD), tok_s.get(p))
                          for p in (fleet, tuned) if mine and p in rows}}


def render(peers: dict[str, Any]) -> str:
    """The table: a row per topology and class."""
    t = peers["targets"]
    out = [f"per class, {peers['phase']} phase (within target: "
           + "; ".join(f"{c} {v} ms" for c, v in t.items())
           + f"; client retries of a 429/503: {peers['retries'] or 'off'})\n",
           "| topology | class | sent | served | within target | refused 429 | refused 503 | "
           "refused with a free slot | retried | e2e P99 | TTFT P99 | served per engine | "
           "prefix cache hits |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for topo, row in peers["rows"].items():
        split = ", ".join(f"{e} {n}" for e, n in (row["engine_served"] or {}).items())
        for i, (cls, c) in enumerate(row["classes"].items()):
            free = "n/a" if c["refused_free_slot"] is None else c["refused_free_slot"]
            out.append(f"| {topo} | {cls} | {c['sent']} | {c['served']} | {c['within_target']} | "
                       f"{c['refused_429']} | {c['refused_503']} | {free} | {c['retried']} | "
                       f"{_cell(c['e2e_p99_s'])} | {_cell(c['ttft_p99_s'])} | "
                       f"{'' if i else split} | {'' if i else hit_text(row.get('prefix_cache'))} |")
            # every class together: on its first row
    return "\n".join(out) + "\n"


def hit_text(cache: dict[str, Any] | None) -> str:
    """A topology's prefix-cache hit rate over a phase, as a cell: `n/a` when unread."""
    if not cache or cache["hit_rate"] is None:
        return "n/a"
    return f"{cache['hit_rate']:.1%}" + (" (some engines unread)" if cache["unread"] else "")


def _cell(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def _n(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def _fmt_x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def lines(peers: dict[str, Any], line: Callable[..., None]) -> None:
    """Issue 42's lines: tailguard within target >= the better fleet's per class, no short
    refusal while an engine had a free slot; the ratios against the fleet and tuned vLLM."""
    rows, fleet = peers["rows"], peers["better_fleet"]
    mine = rows.get(TAILGUARD)
    retries = f" (client retries {peers['retries']})" if peers["retries"] else ""
    line("peers_targets", None, "within target, per class: " + "; ".join(
        f"{c} {v} ms" for c, v in peers["targets"].items()) + f"; better fleet: {fleet or 'none'}"
         f" by {peers['rule']}", info=True)
    need = "the lanes topology and a fleet"
    for cls in peers["targets"]:
        a = (mine or {}).get("classes", {}).get(cls, {}).get("within_target")
        b = rows[fleet]["classes"][cls]["within_target"] if fleet else None
        line(f"within_target_vs_fleet_{cls}", None if a is None or b is None else a >= b,
             f"lanes {cls} requests within target {_n(a)} >= {fleet or 'fleet'}'s {_n(b)}"
             f"{retries}", need)
    short = next(iter(peers["targets"]))
    free = (mine or {}).get("classes", {}).get(short, {}).get("refused_free_slot")
    line("short_refused_free_slot", None if free is None else free == 0,
         f"lanes: {_n(free)} {short} requests refused while an engine that may serve them had a "
         "free slot (its vllm:num_requests_running + _waiting < its slots through two engine steps)",
         "the lanes topology and its engines' series")
    for peer, key in ((fleet, "vs_fleet"), (peers["tuned"], "vs_tuned")):
        r = peers.get(key)
        if r:
            line(f"peers_{key}", None, f"lanes / {peer}: " + "; ".join(
                f"{cls} " + ", ".join(f"{k.replace('_', ' ')} {_fmt_x(v)}" for k, v in f.items())
                for cls, f in r.items())
                + f"; output tok/s {_fmt_x((peers.get('output_vs') or {}).get(peer))}", info=True)
    for topo, row in rows.items():
        if row["engine_served"]:
            line(f"engine_split_{topo}", None, f"{topo}: requests served per engine: "
                 + ", ".join(f"{e} {n}" for e, n in row["engine_served"].items()), info=True)
