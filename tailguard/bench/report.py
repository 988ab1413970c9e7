"""Statistics, the ratios that matter, and the PASS/FAIL lines of issues 4, 11, 12 and 25. Pure.

Latency statistics are over the requests that succeeded (errors and refusals at
admission are counted apart, not timed). Percentiles are nearest-rank: the P99 of
100 samples is the 99th value.
A class's output tokens/s is vLLM benchmark_serving's "output token throughput",
per class: its output tokens over the span from its first request sent to its last
one finished. Under an open-loop load the system keeps up with, that is the
offered load; it drops when the class's engines cannot keep up. ``decode_tok_s``
is each request's own rate after its first token.

Per phase, across all classes: goodput (``goodput``: requests that met their
class's SLO, per second), the whole machine's output tokens/s (vLLM's output
token throughput over the phase's span, every class together), and the streamed
inter-token latency a client sees: the gaps between chunks with text, pooled over
the requests (as vLLM's ITL), with the output tokens per chunk. Each class reports
the output lengths asked for (``max_tokens``) and produced (the model's own when
the run does not ignore EOS).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tailguard.bench import comparison
from tailguard.bench.engine_watch import prefix_hit_rate
from tailguard.bench.exactly_once import describe as describe_exactly_once
from tailguard.bench.goodput import (
    DEFAULT_LONG_SLO,
    DEFAULT_SHORT_SLO,
    Slo,
    goodput,
    phase_span_s,
    slo_text,
    tpot_s,
)
from tailguard.bench.loadgen import REFUSED, Sample
from tailguard.bench.topology import STATIC
from tailguard.bench.tuned import is_tuned, tuned_figures
from tailguard.bench.workload import (
    A_ALONE,
    ARRIVAL_ORDER,
    BATCH,
    BURST,
    FAIR,
    OVERLOAD,
    SHIFT,
    TENANT_A,
    TENANT_B,
    TENANTS,
    WINDOWS,
    WITH_BATCH,
    split_shift,
)
from tailguard.plan.sim import percentile

METRICS = {"queued_s": "queue wait", "ttft_s": "TTFT", "e2e_s": "end-to-end"}
OVERHEAD = "overhead"  # the phase (and workload) that measures the gateway against direct
PROBE = "probe"  # the overload workload's saturation probe of the short lane
PHASES = ("baseline", "mixed", OVERHEAD, PROBE, WITH_BATCH, *WINDOWS, A_ALONE, FAIR, ARRIVAL_ORDER)

#: Targets (issue 4), on the short class's P99 of the chosen metric.
LOAD_MIN_INTERFERENCE = 3.0  # shared short P99 >= 3x its no-long baseline: a load worth testing
LANES_VS_SHARED_MAX = 0.25
LANES_VS_BASELINE_MAX = 1.3  # issue 12 (issue 4 had 1.5)
LONG_THROUGHPUT_MIN = 0.85
LANES_VS_DIRECT_MAX = 0.25  # issue 25 (issue 12 had 1/2): of plain vLLM's (priority) short P99
#: Serving targets (issue 25), on the mixed phase: the whole machine's output tok/s against
#: direct's, the long class's P50 end-to-end against shared's, the streamed ITL P99 against direct's.
TOTAL_THROUGHPUT_MIN = 0.95
LONG_E2E_P50_MAX = 1.5
STREAM_ITL_P99_MAX = 1.5
#: Against the best tuned plain vLLM (issue 33), on the mixed phase: lanes' short P99 end-to-end
#: at most this share of its, short TTFT P99 and goodput no worse, the whole machine's output at
#: least TOTAL_THROUGHPUT_MIN of its, the long class's TTFT P99 at most this factor of its.
LANES_VS_TUNED_E2E_MAX = 0.5
LONG_TTFT_VS_TUNED_MAX = 2.0
#: shift (issue 33): in every window, the short class's P99 end-to-end at most this factor of
#: the same window's without long traffic (the baseline phase's).
SHIFT_SHORT_OVER_BASELINE_MAX = 1.5
#: Gateway overhead targets (issue 12), tailguard minus direct on the overhead workload.
TTFT_OVERHEAD_P50_MAX_S = 0.005
TTFT_OVERHEAD_P99_MAX_S = 0.015
E2E_OVERHEAD_P50_MAX = 0.05  # a share of direct's end-to-end P50
#: Overload targets (issue 11): the accepted short requests' P99 in the burst against the
#: reference window's; a short request after the burst counts as recovered when it is accepted,
#: succeeds and takes at most this factor of the reference P99 too.
OVERLOAD_P99_MAX = 1.5
#: Issue 34's targets: the interactive short P99 beside a batch within this of the same load
#: without it, and the batch's output at least this share of the capacity left idle.
BATCH_P99_MAX = 1.1
BATCH_SHARE_MIN = 0.7
#: Issue 35's target: key A's short P99 beside key B's flood, in fair order, within this of A's
#: alone (and A refused nothing)
TENANT_P99_MAX = 1.3
#: The probe's first share of its time is ramp-up: its capacity counts what finished after it.
PROBE_RAMP_SHARE = 1 / 3
#: A request sent this much later than due means the load generator fell behind.
LAG_WARN_S = 0.05


def summarize(values: Iterable[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"avg": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {"avg": sum(vals) / len(vals), "p50": percentile(vals, 50),
            "p95": percentile(vals, 95), "p99": percentile(vals, 99), "max": max(vals)}


def class_stats(samples: list[Sample]) -> dict[str, Any]:
    ok = [s for s in samples if s.ok]
    sent = [s for s in samples if s.sent_s is not None]
    span = phase_span_s(samples)
    tokens = sum(s.completion_tokens or 0 for s in ok)
    lanes: dict[str, int] = {}
    for s in samples:
        if s.lane:
            lanes[s.lane] = lanes.get(s.lane, 0) + 1
    errors: dict[str, int] = {}  # a refusal is the API working as meant: counted apart
    for s in samples:
        if not s.ok and s.status != REFUSED:
            errors[s.status] = errors.get(s.status, 0) + 1
    lags = [s.lag_s for s in sent]
    decode = [s.decode_tok_s for s in ok if s.decode_tok_s is not None]
    reasons: dict[str, int] = {}
    for s in ok:
        reasons[s.finish_reason or "?"] = reasons.get(s.finish_reason or "?", 0) + 1
    return {
        "count": len(samples),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "refused": sum(1 for s in samples if s.status == REFUSED),
        "accepted": sum(1 for s in samples if s.accepted),
        "finished": sum(1 for s in samples if s.accepted and s.finished),
        "lanes": lanes,
        **{m: summarize(getattr(s, m) for s in ok) for m in METRICS},
        "output_tokens": tokens,
        "throughput_tok_s": tokens / span if span else None,
        "decode_tok_s": {"avg": sum(decode) / len(decode) if decode else None,
                         "p50": percentile(decode, 50), "min": min(decode, default=None)},
        "max_lag_s": max(lags, default=None),
        "late_sends": sum(1 for lag in lags if lag > LAG_WARN_S),
        "requested_tokens": sum(s.max_tokens for s in ok),
        "requested_len": summarize(s.max_tokens for s in ok),
        "output_len": summarize(s.completion_tokens for s in ok),
        "finish_reasons": reasons,
        "tpot_s": summarize(tpot_s(s) for s in ok if (s.completion_tokens or 0) > 1),
        **stream_stats(ok),
    }


def stream_stats(ok: list[Sample]) -> dict[str, Any]:
    """The streamed inter-token latency of successful requests, their gaps pooled, and the
    output tokens per chunk with text."""
    chunks = sum(s.chunks for s in ok)
    tokens = sum(s.completion_tokens or 0 for s in ok if s.chunks)
    return {"itl_s": summarize(g for s in ok for g in s.itl_s), "chunks": chunks,
            "tokens_per_chunk": tokens / chunks if chunks else None}


def phase_totals(samples: list[Sample], short_class: str | None, short_slo: Slo,
                 long_slo: Slo) -> dict[str, Any]:
    """One phase of one topology, every class together: goodput, output tok/s, streams."""
    ok = [s for s in samples if s.ok]
    span = phase_span_s(samples)
    tokens = sum(s.completion_tokens or 0 for s in ok)
    return {"output_tokens": tokens, "output_tok_s": tokens / span if span else None,
            "goodput": goodput(samples, short_class, short_slo, long_slo), **stream_stats(ok)}


def slos(config: dict[str, Any]) -> tuple[Slo, Slo]:
    """The short and long SLOs a run was judged by (its config's, else the defaults)."""
    def pairs(value: Any, default: Slo) -> Slo:
        return tuple((k, float(v)) for k, v in value) if value else default

    return (pairs(config.get("goodput_short"), DEFAULT_SHORT_SLO),
            pairs(config.get("goodput_long"), DEFAULT_LONG_SLO))


def phase_stats(samples: list[Sample], classes: list[str]) -> dict[str, Any]:
    return {c: class_stats([s for s in samples if s.cls == c]) for c in classes
            if any(s.cls == c for s in samples)}


def _get(report: dict, topo: str, phase: str, cls: str | None, *path: str) -> Any:
    node: Any = report.get("topologies", {}).get(topo, {}).get("phases", {}).get(phase, {})
    node = node.get(cls) if cls else None
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(report: dict, metric: str) -> dict[str, float | None]:
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]

    def p99(topo: str, phase: str) -> float | None:
        return _get(report, topo, phase, short, metric, "p99")

    return {
        "lanes_short_p99_over_shared": _ratio(p99("lanes", "mixed"), p99("shared", "mixed")),
        "lanes_short_p99_over_baseline": _ratio(p99("lanes", "mixed"), p99("lanes", "baseline")),
        "shared_short_p99_over_baseline": _ratio(p99("shared", "mixed"), p99("shared", "baseline")),
        "lanes_long_tok_s_over_shared": _ratio(
            _get(report, "lanes", "mixed", long, "throughput_tok_s"),
            _get(report, "shared", "mixed", long, "throughput_tok_s")),
        "lanes_short_p99_over_direct": _ratio(p99("lanes", "mixed"), p99("direct", "mixed")),
        "lanes_long_tok_s_over_direct": _ratio(
            _get(report, "lanes", "mixed", long, "throughput_tok_s"),
            _get(report, "direct", "mixed", long, "throughput_tok_s")),
        "lanes_short_p99_over_tuned": _ratio(p99("lanes", "mixed"),
                                             p99((report.get("tuned") or {}).get("best") or "",
                                                 "mixed")),
        "lanes_short_p99_over_static": _ratio(p99("lanes", "mixed"), p99(STATIC, "mixed")),
    }


def tuned(report: dict, phase: str) -> dict[str, Any] | None:
    """The tuned vLLM runs on `phase` and the best of them (tailguard/bench/tuned.py), or None
    when none ran."""
    short = report["workload"]["short_class"]
    names = [t for t in report["topologies"] if is_tuned(t)]
    if not names:
        return None
    runs = {t: (_get(report, t, phase, short, "e2e_s", "p99"),
                _totals(report, t, phase, "goodput", "goodput_rps")) for t in names}
    flags = {t: list(report["topologies"][t].get("extra_args") or ()) for t in names}
    return {"phase": phase, **tuned_figures(runs, flags)}


def vs_static(report: dict, phase: str) -> dict[str, Any] | None:
    """Issue 33's figures on `phase` for lanes and for today's static lanes (the `static`
    topology) side by side, or None when static did not run."""
    if STATIC not in report["topologies"]:
        return None
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]

    def figures(topo: str) -> dict[str, Any]:
        return {"short_e2e_p99_s": _get(report, topo, phase, short, "e2e_s", "p99"),
                "short_ttft_p99_s": _get(report, topo, phase, short, "ttft_s", "p99"),
                "good": _totals(report, topo, phase, "goodput", "good"),
                "output_tok_s": _totals(report, topo, phase, "output_tok_s"),
                "long_ttft_p99_s": _get(report, topo, phase, long, "ttft_s", "p99") if long else None}

    return {"phase": phase, "lanes": figures("lanes"), STATIC: figures(STATIC)}


def _totals(report: dict, topo: str, phase: str, *path: str) -> Any:
    node: Any = report.get("topologies", {}).get(topo, {}).get("totals", {}).get(phase)
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def serving(report: dict, phase: str = "mixed") -> dict[str, Any]:
    """Issue 25's figures on `phase`, per topology: goodput, the whole machine's output tok/s
    and that against direct's; lanes' long-class P50 end-to-end against shared's and its
    streamed ITL P99 against direct's (every class, and the short class alone)."""
    topos = list(report["topologies"])
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]
    tok_s = {t: _totals(report, t, phase, "output_tok_s") for t in topos}
    return {
        "phase": phase,
        "goodput_rps": {t: _totals(report, t, phase, "goodput", "goodput_rps") for t in topos},
        "good": {t: _totals(report, t, phase, "goodput", "good") for t in topos},
        "requests": {t: _totals(report, t, phase, "goodput", "requests") for t in topos},
        "output_tok_s": tok_s,
        "output_tok_s_over_direct": {t: _ratio(tok_s[t], tok_s.get("direct")) for t in topos},
        "lanes_long_e2e_p50_over_shared": _ratio(
            _get(report, "lanes", phase, long, "e2e_s", "p50"),
            _get(report, "shared", phase, long, "e2e_s", "p50")),
        "lanes_itl_p99_over_direct": _ratio(_totals(report, "lanes", phase, "itl_s", "p99"),
                                            _totals(report, "direct", phase, "itl_s", "p99")),
        "lanes_short_itl_p99_over_direct": _ratio(
            _get(report, "lanes", phase, short, "itl_s", "p99"),
            _get(report, "direct", phase, short, "itl_s", "p99")),
    }


def burst_figures(by_phase: dict[str, list[Sample]], short: str, long: str | None,
                  burst_at_s: float) -> dict[str, Any]:
    """The short requests that arrived while the burst's prefill ran (from the burst until the
    last long request's first token): their TTFT against the same requests' in the baseline
    phase, which had no burst."""
    longs = [s for s in by_phase.get("mixed", []) if s.cls == long]
    firsts = [s.sent_s + s.ttft_s for s in longs if s.ok and s.sent_s is not None
              and s.ttft_s is not None]
    end = max(firsts, default=None)
    if end is None or len(firsts) < len(longs):  # a long one never started: to the phase's end
        end = max((s.arrival_s for s in by_phase.get("mixed", [])), default=burst_at_s)
        end = max(end, burst_at_s) + 1e-9
    out: dict[str, Any] = {"burst_at_s": burst_at_s, "prefill_end_s": end,
                           "long_first_tokens": len(firsts), "longs": len(longs)}
    for phase in ("mixed", "baseline"):
        during = [s for s in by_phase.get(phase, [])
                  if s.cls == short and burst_at_s <= s.arrival_s < end]
        ok = [s.ttft_s for s in during if s.ok and s.ttft_s is not None]
        out[phase] = {"short": len(during), "ok": len(ok), "ttft_p99_s": percentile(ok, 99),
                      "ttft_max_s": max(ok, default=None)}
    return out


def shift_figures(by_phase: dict[str, list[Sample]], short: str, long: str | None,
                  params: dict[str, Any], short_slo: Slo, long_slo: Slo) -> dict[str, Any]:
    """Per shift window of one topology: the short class's P99 end-to-end and TTFT (and the
    end-to-end against the same window's in the baseline phase), the long class's TTFT and
    queue wait P99, goodput."""
    mixed = split_shift(by_phase.get("mixed", []), params)
    base = split_shift(by_phase.get("baseline", []), params)
    windows = []
    for w in params["windows"]:
        ss = mixed[w["name"]]

        def p99(cls: str | None, metric: str, ss: list[Sample] = ss) -> float | None:
            return percentile((getattr(s, metric) for s in ss if s.cls == cls and s.ok
                               and getattr(s, metric) is not None), 99)

        short_p99 = p99(short, "e2e_s")
        base_p99 = percentile((s.e2e_s for s in base[w["name"]] if s.ok and s.e2e_s is not None),
                              99)
        g = goodput(ss, short, short_slo, long_slo)
        windows.append({
            **w, "short": sum(1 for s in ss if s.cls == short),
            "long": sum(1 for s in ss if s.cls == long),
            "long_not_ok": sum(1 for s in ss if s.cls == long and not s.ok),
            "not_ok": sum(1 for s in ss if not s.ok),
            "refused": sum(1 for s in ss if s.status == REFUSED),
            "short_e2e_p99_s": short_p99, "short_ttft_p99_s": p99(short, "ttft_s"),
            "baseline_short_e2e_p99_s": base_p99,
            "short_p99_over_baseline": _ratio(short_p99, base_p99),
            "long_ttft_p99_s": p99(long, "ttft_s"), "long_queued_p99_s": p99(long, "queued_s"),
            "goodput_rps": g["goodput_rps"], "good": g["good"]})
    return {"windows": windows}


def _shift_lines(report: dict, line: Callable[..., None]) -> None:
    """The shift lines, per topology: the short tail in every window against its
    no-long-traffic value, and the long class's wait in every window."""
    short = report["workload"]["short_class"]
    for topo, f in report["shift"].items():
        ratios_ = [w["short_p99_over_baseline"] for w in f["windows"]]
        line(f"shift_short_{topo}",
             None if None in ratios_ else all(v <= SHIFT_SHORT_OVER_BASELINE_MAX for v in ratios_),
             f"{topo}: {short} P99 end-to-end in every window <= "
             f"{SHIFT_SHORT_OVER_BASELINE_MAX:g}x the same window's without long traffic: "
             + ", ".join(f"{w['name']} {_fmt_x(w['short_p99_over_baseline'])}"
                         for w in f["windows"]), "a baseline phase")
        target = report["workload"]["params"].get("long_target_wait_s")
        served = [w for w in f["windows"] if w["long"]]
        line(f"shift_long_{topo}",
             None if target is None or not served else all(
                 not w["long_not_ok"] and w["long_queued_p99_s"] is not None
                 and w["long_queued_p99_s"] <= target for w in served),
             f"{topo}: long requests served within the long target wait ({target} s) in "
             "every window, none failed or refused: queue wait P99 "
             + ", ".join(f"{w['name']} {_cell(w['long_queued_p99_s']) or 'n/a'} s"
                         + (f" ({w['long_not_ok']} not ok)" if w["long_not_ok"] else "")
                         for w in served),
             "a long lane with a target wait and long requests")



def render_shift(report: dict) -> str:
    """The shift workload's table: each topology's figures per window."""
    out = ["shift: per window (P99s in s; vs baseline: the short P99 over the same window's "
           "without long traffic)\n",
           "| topology | window | short/s | long/s | short | short e2e P99 | vs baseline | "
           "short TTFT P99 | long | long TTFT P99 | long queue wait P99 | not ok | refused | "
           "goodput req/s |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for topo, f in report["shift"].items():
        for w in f["windows"]:
            out.append(f"| {topo} | {w['name']} | {w['short_rate']:.3g} | {w['long_rate']:.3g} | "
                       f"{w['short']} | {_cell(w['short_e2e_p99_s'])} | "
                       f"{_cell(w['short_p99_over_baseline'], 2)} | "
                       f"{_cell(w['short_ttft_p99_s'])} | {w['long']} | "
                       f"{_cell(w['long_ttft_p99_s'])} | {_cell(w['long_queued_p99_s'])} | "
                       f"{w['not_ok']} | {w['refused']} | {_cell(w['goodput_rps'], 2)} |")
    return "\n".join(out) + "\n"


def overhead(report: dict) -> dict[str, float | None]:
    """What tailguard (`lanes`) adds to direct on the overhead phase: TTFT and end-to-end
    P50/P99 differences in seconds, and end-to-end as a share of direct's."""
    cls = report["workload"]["short_class"]

    def q(topo: str, metric: str, p: str) -> float | None:
        return _get(report, topo, OVERHEAD, cls, metric, p)

    def diff(metric: str, p: str) -> float | None:
        a, b = q("lanes", metric, p), q("direct", metric, p)
        return None if a is None or b is None else a - b

    out = {f"{m}_{p}_s": diff(f"{m}_s", p) for m in ("ttft", "e2e") for p in ("p50", "p99")}
    for p in ("p50", "p99"):
        d = out[f"e2e_{p}_s"]
        out[f"e2e_{p}_share"] = _ratio(d, q("direct", "e2e_s", p)) if d is not None else None
    return out


def _fmt_ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e3:+.1f} ms"


def _fmt_s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f} s"


def _fmt_x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _fmt_pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _fmt_tok(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _isolation_lines(report: dict, line: Callable[..., None]) -> None:
    """The short class's tail under long traffic, against shared, its baseline and direct."""
    metric = report["config"]["metric"]
    mname = METRICS[metric]
    r = report["ratios"][metric]
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]

    def p99(topo: str, phase: str) -> float | None:
        return _get(report, topo, phase, short, metric, "p99")

    cond = r["shared_short_p99_over_baseline"]
    valid = cond is not None and cond >= LOAD_MIN_INTERFERENCE
    line("load", None if cond is None else valid,
         f"load: shared {short} P99 ({mname}) {_fmt_s(p99('shared', 'mixed'))} is "
         f"{_fmt_x(cond)} its no-long-traffic {_fmt_s(p99('shared', 'baseline'))} "
         f"(>= {LOAD_MIN_INTERFERENCE:g}x makes the targets below meaningful)",
         "the shared topology with a baseline phase")
    note = "  [load condition not met]" if cond is not None and not valid else ""
    v = r["lanes_short_p99_over_shared"]
    line("lanes_vs_shared", None if v is None else v <= LANES_VS_SHARED_MAX,
         f"lanes {short} P99 {_fmt_s(p99('lanes', 'mixed'))} <= 1/4 of shared's "
         f"{_fmt_s(p99('shared', 'mixed'))}: ratio {_fmt_x(v)} (<= {LANES_VS_SHARED_MAX:g}){note}",
         "both topologies")
    v = r["lanes_short_p99_over_baseline"]
    line("lanes_vs_baseline", None if v is None else v <= LANES_VS_BASELINE_MAX,
         f"lanes {short} P99 {_fmt_s(p99('lanes', 'mixed'))} <= {LANES_VS_BASELINE_MAX:g}x its "
         f"no-long-traffic {_fmt_s(p99('lanes', 'baseline'))}: ratio {_fmt_x(v)} "
         f"(<= {LANES_VS_BASELINE_MAX:g}){note}",
         "the lanes topology with a baseline phase")
    v = r["lanes_short_p99_over_direct"]
    line("lanes_vs_direct", None if v is None else v <= LANES_VS_DIRECT_MAX,
         f"lanes {short} P99 {_fmt_s(p99('lanes', 'mixed'))} <= {LANES_VS_DIRECT_MAX:g}x direct's "
         "(vLLM, priority "
         f"scheduling) {_fmt_s(p99('direct', 'mixed'))}: ratio {_fmt_x(v)} "
         f"(<= {LANES_VS_DIRECT_MAX:g}){note}", "the lanes and direct topologies")
    v = r["lanes_long_tok_s_over_shared"]
    lt = _get(report, "lanes", "mixed", long, "throughput_tok_s")
    st = _get(report, "shared", "mixed", long, "throughput_tok_s")
    dt = _get(report, "direct", "mixed", long, "throughput_tok_s")
    vd = r["lanes_long_tok_s_over_direct"]
    vs_direct = "" if dt is None else (f"; vs direct's {dt:.1f} tok/s: "
                                       f"{'n/a' if vd is None else f'{vd:.1%}'} (reported only)")
    line("long_throughput", None if v is None else v >= LONG_THROUGHPUT_MIN,
         f"lanes {long} output {'n/a' if lt is None else f'{lt:.1f}'} tok/s >= 85% of shared's "
         f"{'n/a' if st is None else f'{st:.1f}'}: ratio {'n/a' if v is None else f'{v:.1%}'} "
         f"(>= {LONG_THROUGHPUT_MIN:.0%}){vs_direct}{note}", "both topologies and a long class")


def _serving_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 25's lines: goodput, the whole machine's throughput, the long class's wait, streams."""
    sv = report["serving"]
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]
    short_slo, long_slo = slos(report["config"])
    line("slo", None, f"goodput SLOs (vLLM bench serve --goodput pairs, ms): class {short!r} "
         f"{slo_text(short_slo)}, every other class {slo_text(long_slo)} "
         "(--goodput-short, --goodput-long)", info=True)

    def good(topo: str) -> str:
        g = sv["goodput_rps"].get(topo)
        return (f"{'n/a' if g is None else f'{g:.2f}'} req/s ({sv['good'].get(topo)} of "
                f"{sv['requests'].get(topo)} met their SLO)")

    for other in ("direct", "shared"):
        a, b = sv["good"].get("lanes"), sv["good"].get(other)
        line(f"goodput_vs_{other}", None if a is None or b is None else a >= b,
             f"lanes goodput {good('lanes')} >= {other}'s {good(other)} (compared by requests "
             "that met their SLO: every topology is sent the same arrivals)",
             f"the lanes and {other} topologies")
    tok, v = sv["output_tok_s"], sv["output_tok_s_over_direct"]
    shared_v = v.get("shared")
    line("total_throughput", None if v.get("lanes") is None else v["lanes"] >= TOTAL_THROUGHPUT_MIN,
         f"whole machine: lanes output {_fmt_tok(tok.get('lanes'))} tok/s (every class) >= "
         f"{TOTAL_THROUGHPUT_MIN:.0%} of direct's {_fmt_tok(tok.get('direct'))}: ratio "
         f"{_fmt_pct(v.get('lanes'))}; shared {_fmt_tok(tok.get('shared'))} = "
         f"{_fmt_pct(shared_v)} of direct's (reported only)", "the lanes and direct topologies")
    v = sv["lanes_long_e2e_p50_over_shared"]
    line("long_e2e_p50", None if v is None else v <= LONG_E2E_P50_MAX,
         f"lanes {long} P50 end-to-end {_fmt_s(_get(report, 'lanes', sv['phase'], long, 'e2e_s', 'p50'))}"
         f" <= {LONG_E2E_P50_MAX:g}x shared's "
         f"{_fmt_s(_get(report, 'shared', sv['phase'], long, 'e2e_s', 'p50'))}: ratio {_fmt_x(v)}",
         "the lanes and shared topologies and a long class")
    v = sv["lanes_itl_p99_over_direct"]

    def itl(topo: str) -> str:
        t = report["topologies"].get(topo, {}).get("totals", {}).get(sv["phase"]) or {}
        tpc = t.get("tokens_per_chunk")
        return (f"{_fmt_s((t.get('itl_s') or {}).get('p99'))} "
                f"({'n/a' if tpc is None else f'{tpc:.1f}'} tokens per chunk)")

    line("stream_itl", None if v is None else v <= STREAM_ITL_P99_MAX,
         f"streams: lanes inter-chunk P99 (every class) {itl('lanes')} <= {STREAM_ITL_P99_MAX:g}x "
         f"direct's {itl('direct')}: ratio {_fmt_x(v)}; class {short!r} alone "
         f"{_fmt_x(sv['lanes_short_itl_p99_over_direct'])}", "the lanes and direct topologies")


def _tuned_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 33's lines: lanes against the best tuned plain vLLM of the sweep."""
    tu = report["tuned"]
    best, phase = tu["best"], tu["phase"]
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]
    runs = "; ".join(f"{name}: short e2e P99 {_fmt_s(r['short_e2e_p99_s'])}, goodput "
                     + ("n/a" if r["goodput_rps"] is None else f"{r['goodput_rps']:.2f}")
                     + " req/s" for name, r in tu["runs"].items())
    line("tuned", None, f"tuned vLLM: best {best or 'none measured'}"
         + (f" ({' '.join(tu['flags'] or ())}, priority per class)" if best else "")
         + f" by {tu['rule']}; {runs}", info=True)
    need = "the lanes topology and a measured direct-tuned run"

    def q(topo: str | None, cls: str | None, metric: str) -> float | None:
        return _get(report, topo or "", phase, cls, metric, "p99")

    v = _ratio(q("lanes", short, "e2e_s"), q(best, short, "e2e_s"))
    line("lanes_vs_tuned_e2e", None if v is None else v <= LANES_VS_TUNED_E2E_MAX,
         f"lanes {short} end-to-end P99 {_fmt_s(q('lanes', short, 'e2e_s'))} <= "
         f"{LANES_VS_TUNED_E2E_MAX:g}x tuned vLLM's {_fmt_s(q(best, short, 'e2e_s'))}: ratio "
         f"{_fmt_x(v)}", need)
    a, b = q("lanes", short, "ttft_s"), q(best, short, "ttft_s")
    line("lanes_vs_tuned_ttft", None if a is None or b is None else a <= b,
         f"lanes {short} TTFT P99 {_fmt_s(a)} <= tuned vLLM's {_fmt_s(b)}", need)
    good = {t: _totals(report, t, phase, "goodput", "good") for t in ("lanes", best or "")}
    line("goodput_vs_tuned", None if None in good.values() else good["lanes"] >= good[best or ""],
         f"lanes goodput {good['lanes']} requests met their SLO >= tuned vLLM's "
         f"{good[best or '']}", need)
    tok = {t: _totals(report, t, phase, "output_tok_s") for t in ("lanes", best or "")}
    v = _ratio(tok["lanes"], tok[best or ""])
    line("total_throughput_vs_tuned", None if v is None else v >= TOTAL_THROUGHPUT_MIN,
         f"whole machine: lanes output {_fmt_tok(tok['lanes'])} tok/s >= "
         f"{TOTAL_THROUGHPUT_MIN:.0%} of tuned vLLM's {_fmt_tok(tok[best or ''])}: ratio "
         f"{_fmt_pct(v)}", need)
    if long:
        v = _ratio(q("lanes", long, "ttft_s"), q(best, long, "ttft_s"))
        line("long_ttft_vs_tuned", None if v is None else v <= LONG_TTFT_VS_TUNED_MAX,
             f"lanes {long} TTFT P99 {_fmt_s(q('lanes', long, 'ttft_s'))} <= "
             f"{LONG_TTFT_VS_TUNED_MAX:g}x tuned vLLM's {_fmt_s(q(best, long, 'ttft_s'))}: ratio "
             f"{_fmt_x(v)}", need)


def _static_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 33's lines against today's static lanes: lanes that follow the load better or
    equal on each (`vs_static`)."""
    st = report["static"]
    a, b = st["lanes"], st[STATIC]
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]
    need = "the lanes and static topologies"

    def no_worse(name: str, key: str, what: str, fmt: Callable[[float | None], str],
                 higher: bool = False) -> None:
        x, y = a[key], b[key]
        ok = None if x is None or y is None else (x >= y if higher else x <= y)
        line(name, ok, f"lanes {what} {fmt(x)} {'>=' if higher else '<='} static lanes' "
             f"{fmt(y)}: ratio {_fmt_x(_ratio(x, y))}", need)

    no_worse("lanes_vs_static_e2e", "short_e2e_p99_s", f"{short} end-to-end P99", _fmt_s)
    no_worse("lanes_vs_static_ttft", "short_ttft_p99_s", f"{short} TTFT P99", _fmt_s)
    no_worse("goodput_vs_static", "good", "goodput (requests that met their SLO)",
             lambda v: "n/a" if v is None else f"{v:g}", higher=True)
    no_worse("total_throughput_vs_static", "output_tok_s", "whole machine output tok/s",
             _fmt_tok, higher=True)
    if long:
        no_worse("long_ttft_vs_static", "long_ttft_p99_s", f"{long} TTFT P99", _fmt_s)


def _burst_line(topo: str, b: dict[str, Any], line: Callable[..., None]) -> None:
    m, base = b["mixed"], b["baseline"]
    line(f"burst_{topo}", None,
         f"{topo}: {m['short']} short requests arrived during the burst's prefill "
         f"({b['burst_at_s']:.1f}-{b['prefill_end_s']:.1f} s; {b['long_first_tokens']} of "
         f"{b['longs']} long requests got a first token): TTFT P99 {_fmt_s(m['ttft_p99_s'])}, max "
         f"{_fmt_s(m['ttft_max_s'])}; the same arrivals without the burst: P99 "
         f"{_fmt_s(base['ttft_p99_s'])}", info=True)


def _overhead_lines(o: dict[str, float | None], line: Callable[..., None]) -> None:
    """What the gateway adds to the engine alone (the overhead workload)."""
    need = "the lanes and direct topologies"
    for p, limit in (("p50", TTFT_OVERHEAD_P50_MAX_S), ("p99", TTFT_OVERHEAD_P99_MAX_S)):
        v = o[f"ttft_{p}_s"]
        line(f"overhead_ttft_{p}", None if v is None else v <= limit,
             f"gateway TTFT overhead {p.upper()} {_fmt_ms(v)} (lanes minus direct) "
             f"<= {limit * 1e3:g} ms", need)
    v, share = o["e2e_p50_s"], o["e2e_p50_share"]
    line("overhead_e2e_p50", None if share is None else share <= E2E_OVERHEAD_P50_MAX,
         f"gateway end-to-end overhead P50 {_fmt_ms(v)} = "
         f"{'n/a' if share is None else f'{share:+.1%}'} of direct's <= "
         f"{E2E_OVERHEAD_P50_MAX:.0%}; P99 {_fmt_ms(o['e2e_p99_s'])} = "
         f"{'n/a' if o['e2e_p99_share'] is None else format(o['e2e_p99_share'], '+.1%')} "
         "(reported only)", need)

def capacity_rps(samples: list[Sample], duration_s: float) -> float | None:
    """Requests per second a saturated lane finished: the probe's successes that ended after
    its ramp-up and within its `duration_s`."""
    start = duration_s * PROBE_RAMP_SHARE
    done = [s for s in samples if s.ok and start <= s.sent_s + s.e2e_s < duration_s]
    return len(done) / (duration_s - start) if done and duration_s > start else None


def recovery(samples: list[Sample], burst_end_s: float, limit_s: float | None) -> dict[str, Any]:
    """When short requests were back to normal after the burst: from the burst's end to the
    arrival of the last one after it that was refused, failed or slower than `limit_s`
    (0 when none was). Not recovered when that last one was also the last request sent."""
    after = sorted((s for s in samples if s.arrival_s >= burst_end_s), key=lambda s: s.arrival_s)
    bad = [s for s in after
           if not s.ok or limit_s is None or s.e2e_s is None or s.e2e_s > limit_s]
    last = bad[-1] if bad else None
    last_refused = max((s.arrival_s for s in after if s.status == REFUSED), default=None)
    return {"recovery_s": 0.0 if last is None else last.arrival_s - burst_end_s,
            "recovered": bool(after) and (last is None or last is not after[-1]),
            "requests_after": len(after), "not_normal_after": len(bad),
            "last_refused_after_s": None if last_refused is None else last_refused - burst_end_s}


def overload_figures(by_phase: dict[str, list[Sample]], short: str,
                     params: dict[str, Any]) -> dict[str, Any]:
    """Issue 11's overload figures for one topology: refusals, the accepted short requests'
    P99 in the burst against the reference's, expiries, accepted vs finished, recovery."""
    everything = [s for ss in by_phase.values() for s in ss]
    timeline = [s for w in WINDOWS for s in by_phase.get(w, [])]
    shorts = {w: [s for s in by_phase.get(w, []) if s.cls == short] for w in WINDOWS}
    refused = [s for s in timeline if s.status == REFUSED]
    codes: dict[str, int] = {}
    for s in refused:
        codes[s.refusal or "?"] = codes.get(s.refusal or "?", 0) + 1
    retry = [s.retry_after_s for s in refused if s.http_status == 429 and s.retry_after_s]
    ref_p99 = percentile((s.e2e_s for s in shorts["reference"] if s.ok), 99)
    burst_p99 = percentile((s.e2e_s for s in shorts["burst"] if s.ok), 99)
    limit = None if ref_p99 is None else OVERLOAD_P99_MAX * ref_p99
    sent = {w: sum(1 for s in ss if s.sent_s is not None) for w, ss in shorts.items()}
    return {
        "capacity_rps": params.get("capacity_rps"),
        "burst_short_rate": params.get("burst_short_rate"),
        "short_sent": sent,
        "short_refused": {w: sum(1 for s in ss if s.status == REFUSED) for w, ss in shorts.items()},
        "burst_refused_share": _ratio(sum(1 for s in shorts["burst"] if s.status == REFUSED),
                                      sent["burst"]),
        "refused": len(refused),
        "refused_by_code": codes,
        "refused_with_retry_after": len(retry),
        "retry_after_s": {"min": min(retry, default=None), "max": max(retry, default=None)},
        "reference_p99_s": ref_p99,
        "burst_accepted_p99_s": burst_p99,
        "burst_p99_over_reference": _ratio(burst_p99, ref_p99),
        "expired": sum(1 for s in everything if s.status == "expired"),
        "accepted": sum(1 for s in everything if s.accepted),
        "finished": sum(1 for s in everything if s.accepted and s.finished),
        "errors": sum(1 for s in everything if not s.ok and s.status != REFUSED),
        **recovery(shorts["recovery"], params["burst_end_s"], limit),
        "recovery_limit_s": limit,
    }


def _overload_peers(report: dict, samples: dict[str, dict[str, list[Sample]]],
                    short_slo: Slo, long_slo: Slo) -> dict[str, Any] | None:
    """The per-class comparison over the whole overload timeline (its windows together), where
    a fleet got the same timeline as tailguard; None otherwise."""
    if not set(samples) & set(comparison.FLEETS):
        return None
    wl = report["workload"]
    timeline = {name: {OVERLOAD: [s for w in WINDOWS for s in phases.get(w, [])]}
                for name, phases in samples.items()}
    for name, by_phase in timeline.items():
        report["topologies"][name]["totals"][OVERLOAD] = phase_totals(
            by_phase[OVERLOAD], wl["short_class"], short_slo, long_slo)
    return comparison.comparison(report, timeline, short_slo, long_slo, phase=OVERLOAD)


def _overload_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 11's overload lines, per topology (the lanes one: shared has no admission to test)."""
    p = report["workload"]["params"]
    for topo, o in report["overload"].items():
        probe = report["topologies"][topo].get(PROBE) or {}
        cap = o["capacity_rps"]
        line(f"capacity_{topo}", None,
             f"{topo}: short lane capacity {'n/a' if cap is None else f'{cap:.1f}'} req/s (probe: "
             f"{probe.get('concurrency', '?')} closed-loop senders for {probe.get('duration_s', '?')}"
             f" s); burst: short requests at {o['burst_short_rate'] or 0:.1f} req/s "
             f"({p['factor']:g}x) for {p['burst_s']:g} s", info=True)
        share = o["burst_refused_share"]
        codes = ", ".join(f"{k} {v}" for k, v in sorted(o["refused_by_code"].items())) or "none"
        ra = o["retry_after_s"]
        line(f"refusals_{topo}", o["refused"] > 0 and o["refused_with_retry_after"] == o["refused"],
             f"{topo}: refused {o['short_refused']['burst']} of {o['short_sent']['burst']} short "
             f"requests in the burst ({'n/a' if share is None else f'{share:.1%}'}), "
             f"{o['short_refused']['reference']} in the reference, "
             f"{o['short_refused']['recovery']} after; {o['refused_with_retry_after']} of "
             f"{o['refused']} refusals are 429 with Retry-After"
             + (f" ({ra['min']:g}-{ra['max']:g} s)" if ra["min"] is not None else "")
             + f"; codes: {codes}" + ("" if o["refused"] else " (none refused: admission never acted)"))
        v = o["burst_p99_over_reference"]
        line(f"overload_p99_{topo}", None if v is None else v <= OVERLOAD_P99_MAX,
             f"{topo}: accepted short P99 in the burst {_fmt_s(o['burst_accepted_p99_s'])} <= "
             f"{OVERLOAD_P99_MAX:g}x the reference's {_fmt_s(o['reference_p99_s'])}: ratio "
             f"{_fmt_x(v)}", "short requests that succeeded in both windows")
        line(f"no_expired_{topo}", o["expired"] == 0, f"{topo}: {o['expired']} expired")
        lost = o["accepted"] - o["finished"]
        line(f"accepted_finished_{topo}", lost == 0 and o["errors"] == 0,
             f"{topo}: accepted {o['accepted']} = finished {o['finished']}"
             + (f" ({lost} lost)" if lost else "") + f"; {o['errors']} errors besides refusals")
        rec = o["recovery_s"]
        line(f"recovery_{topo}", None,
             f"{topo}: recovery: short requests accepted and within {_fmt_s(o['recovery_limit_s'])}"
             f" ({OVERLOAD_P99_MAX:g}x the reference P99) from {rec:.1f} s after the burst "
             + ("" if o["recovered"] else "(NOT within the recovery window) ")
             + f"({o['not_normal_after']} of {o['requests_after']} after it were not; last "
             f"refusal at "
             + ("none" if o["last_refused_after_s"] is None else f"+{o['last_refused_after_s']:.1f} s")
             + ")", info=True)


def tenants_figures(by_phase: dict[str, list[Sample]], metric: str) -> dict[str, Any]:
    """Issue 35's figures: key A's P99 (`metric`) and refusals alone, beside B's flood in fair
    order and in arrival order; what B was served and how it was refused."""
    def of(phase: str, cls: str) -> list[Sample]:
        return [s for s in by_phase.get(phase, []) if s.cls == cls]

    def p99(ss: list[Sample]) -> float | None:
        return percentile((getattr(s, metric) for s in ss if s.ok
                           and getattr(s, metric) is not None), 99)

    alone = p99(of(A_ALONE, TENANT_A))
    out: dict[str, Any] = {"metric": metric, "a_alone_p99_s": alone,
                           "a_alone_refused": sum(s.status == REFUSED for s in of(A_ALONE, TENANT_A))}
    for phase in (FAIR, ARRIVAL_ORDER):
        a, b = of(phase, TENANT_A), of(phase, TENANT_B)
        refused_b = [s for s in b if s.status == REFUSED]
        codes: dict[str, int] = {}
        for s in refused_b:
            codes[s.refusal or "?"] = codes.get(s.refusal or "?", 0) + 1
        out[phase] = {
            "a_sent": len(a), "a_ok": sum(s.ok for s in a),
            "a_refused": sum(s.status == REFUSED for s in a),
            "a_p99_s": p99(a), "a_p99_over_alone": _ratio(p99(a), alone),
            "b_sent": len(b), "b_ok": sum(s.ok for s in b), "b_refused": len(refused_b),
            "b_refusals": codes,
            "b_refused_with_retry_after": sum(s.retry_after_s is not None for s in refused_b),
            "b_not_ok_otherwise": sum(1 for s in b if not s.ok and s.status != REFUSED),
            "b_p99_s": p99(b),
            # where A's time went: the lane (queue wait) or the front end (sent -> stored)
            "a_queued_p99_s": _p99_of(a, "queued_s"),
            "a_submit_delay_p99_s": _p99_of(a, "submit_delay_s")}
    out["a_alone_queued_p99_s"] = _p99_of(of(A_ALONE, TENANT_A), "queued_s")
    out["a_alone_submit_delay_p99_s"] = _p99_of(of(A_ALONE, TENANT_A), "submit_delay_s")
    return out


def _p99_of(samples: list[Sample], field: str) -> float | None:
    return percentile((getattr(s, field) for s in samples
                       if s.ok and getattr(s, field) is not None), 99)


def _tenants_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 35's lines, per topology: A's tail and refusals beside B's flood in fair order,
    B's refusals; arrival order's figures for comparison."""
    for topo, f in report["tenants"].items():
        fair, fifo = f[FAIR], f[ARRIVAL_ORDER]
        v = fair["a_p99_over_alone"]
        line(f"tenant_a_p99_{topo}", None if v is None else v <= TENANT_P99_MAX,
             f"{topo}: key A's P99 beside B's flood (fair order) {_fmt_s(fair['a_p99_s'])} <= "
             f"{TENANT_P99_MAX:g}x A alone {_fmt_s(f['a_alone_p99_s'])}: ratio {_fmt_x(v)}",
             "the a_alone and fair phases")
        line(f"tenant_a_refused_{topo}", fair["a_refused"] == 0,
             f"{topo}: key A refused {fair['a_refused']} of {fair['a_sent']} beside the flood "
             f"(fair order)")
        line(f"tenant_b_refused_{topo}",
             fair["b_refused"] > 0 and fair["b_refused_with_retry_after"] == fair["b_refused"],
             f"{topo}: key B refused {fair['b_refused']} of {fair['b_sent']}, each 429 with "
             f"Retry-After: {fair['b_refused_with_retry_after']} (codes {fair['b_refusals']}); "
             f"served {fair['b_ok']}")
        line(f"tenant_a_where_{topo}", None,
             f"{topo}: key A's queue wait P99 alone {_fmt_s(f['a_alone_queued_p99_s'])}, fair "
             f"{_fmt_s(fair['a_queued_p99_s'])}, arrival order {_fmt_s(fifo['a_queued_p99_s'])}; "
             f"sent -> stored by the API (the front end) P99 alone "
             f"{_fmt_s(f['a_alone_submit_delay_p99_s'])}, fair "
             f"{_fmt_s(fair['a_submit_delay_p99_s'])}, arrival order "
             f"{_fmt_s(fifo['a_submit_delay_p99_s'])}", info=True)
        line(f"tenant_arrival_order_{topo}", None,
             f"{topo}: the same in arrival order (fair share off): key A's P99 "
             f"{_fmt_s(fifo['a_p99_s'])} = {_fmt_x(fifo['a_p99_over_alone'])} A alone, A refused "
             f"{fifo['a_refused']} of {fifo['a_sent']}; B refused {fifo['b_refused']} "
             f"{fifo['b_refusals']}, served {fifo['b_ok']}", info=True)


def _batch_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 34's lines, per topology (the lanes one: the batch lane is its)."""
    for topo, b in report["batch"].items():
        line(f"batch_capacity_{topo}", None,
             f"{topo}: the batch alone: {_fmt_tok(b['capacity_tok_s'])} output tok/s over "
             f"{b['probe_s']:g} s; the mixed load alone left {b['idle_slot_share']:.1%} of "
             f"their {b['slots']} slots' time to the batch lane (no "
             f"{', '.join(b['shared_lanes'])} job queued, slots not running one): "
             f"{_fmt_tok(b['idle_capacity_tok_s'])} tok/s left idle", info=True)
        v = b["short_p99_ratio"]
        line(f"batch_short_p99_{topo}", None if v is None else v <= BATCH_P99_MAX,
             f"{topo}: short P99 beside the batch {_fmt_s(b['short_p99_with_batch_s'])} <= "
             f"{BATCH_P99_MAX:g}x without it {_fmt_s(b['short_p99_without_batch_s'])}: ratio "
             f"{_fmt_x(v)}", "short requests that succeeded in both phases")
        share = b["share_of_idle"]
        line(f"batch_share_{topo}", None if share is None else share >= BATCH_SHARE_MIN,
             f"{topo}: the batch beside the load: {_fmt_tok(b['batch_tok_s'])} output tok/s = "
             f"{_fmt_pct(share)} of the capacity left idle (target >= {BATCH_SHARE_MIN:.0%}); "
             f"{b['lines_done_with_load']} of {b['lines']} lines done, then cancelled "
             f"({b['status_after_cancel']})", "the batch alone and beside the load")


def targets(report: dict) -> list[dict[str, Any]]:
    """The issue's PASS/FAIL lines (SKIP when a number they need was not measured)."""
    out: list[dict[str, Any]] = []

    def line(name: str, ok: bool | None, text: str, need: str = "", info: bool = False) -> None:
        status = "INFO" if info else "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        out.append({"name": name, "status": status,
                    "line": f"{status}  {text}" + (f" (needs {need})" if ok is None and need else "")})

    if report["workload"]["name"] == OVERLOAD:
        _overload_lines(report, line)
        if (report.get("peers") or {}).get("better_fleet"):  # the same timeline sent to a fleet
            comparison.lines(report["peers"], line)
        _exactly_once_lines(report, line)
        return out
    if report["workload"]["name"] == OVERHEAD:
        _overhead_lines(report["overhead"], line)
    elif report["workload"]["name"] == BATCH:
        _batch_lines(report, line)
    elif report["workload"]["name"] == TENANTS:
        _tenants_lines(report, line)
    else:
        _isolation_lines(report, line)
        _serving_lines(report, line)
        if report.get("tuned"):
            _tuned_lines(report, line)
        if report.get("static"):
            _static_lines(report, line)
        for topo, b in report.get("burst", {}).items():
            _burst_line(topo, b, line)
        if report.get("shift"):
            _shift_lines(report, line)
        if (report.get("peers") or {}).get("better_fleet"):  # the lines compare with a fleet
            comparison.lines(report["peers"], line)
    def total(t: dict, key: str) -> int:
        return sum(c[key] for p in t["phases"].values() for c in p.values())

    for topo, t in report["topologies"].items():
        errors, refused = total(t, "errors"), total(t, "refused")
        accepted, finished = total(t, "accepted"), total(t, "finished")
        # the tenants workload's flood is meant to be refused (its own lines count it)
        allowed = refused if report["workload"]["name"] == TENANTS else 0
        line(f"no_errors_{topo}", errors == 0 and refused == allowed and accepted == finished,
             f"{topo}: {errors} errors, {refused} refused at admission, "
             f"accepted {accepted} = finished {finished}"
             + ("" if accepted == finished else f" ({accepted - finished} lost)"))
    _exactly_once_lines(report, line)
    return out


def _exactly_once_lines(report: dict, line: Callable[..., None]) -> None:
    """Issue 33's check, per tailguard topology: every accepted job ended exactly once."""
    for topo, t in report["topologies"].items():
        c = t.get("exactly_once")
        if c is not None:
            line(f"exactly_once_{topo}", c["ok"] if c["stream_read"] else None,
                 describe_exactly_once(topo, c), "the finished stream of the topology's Redis")


def build_report(*, config: dict[str, Any], workload: dict[str, Any],
                 topologies: dict[str, dict[str, Any]],
                 samples: dict[str, dict[str, list[Sample]]]) -> dict[str, Any]:
    """The whole report: `samples[topology][phase]` are the raw requests."""
    classes = workload["classes"]
    report = {
        "config": config,
        "workload": workload,
        "topologies": {
            name: {**topologies.get(name, {}),
                   "phases": {ph: phase_stats(ss, classes) for ph, ss in phases.items()}}
            for name, phases in samples.items()},
    }
    short_slo, long_slo = slos(config)
    for name, phases in samples.items():
        report["topologies"][name]["totals"] = {
            ph: phase_totals(ss, workload["short_class"], short_slo, long_slo)
            for ph, ss in phases.items()}
    report["tuned"] = tuned(report, OVERHEAD if workload["name"] == OVERHEAD else "mixed")
    report["static"] = vs_static(report, OVERHEAD if workload["name"] == OVERHEAD else "mixed")
    report["ratios"] = {m: ratios(report, m) for m in ("ttft_s", "e2e_s")}
    report["overhead"] = overhead(report)
    report["serving"] = serving(report, OVERHEAD if workload["name"] == OVERHEAD else "mixed")
    report["peers"] = (None if workload["name"] in (OVERHEAD, OVERLOAD, BATCH, TENANTS)
                       else comparison.comparison(report, samples, short_slo, long_slo))
    if workload["name"] == OVERLOAD:
        report["peers"] = _overload_peers(report, samples, short_slo, long_slo)
    if workload["name"] == BURST:
        report["burst"] = {name: burst_figures(phases, workload["short_class"],
                                               workload["long_class"],
                                               workload["params"]["burst_at_s"])
                           for name, phases in samples.items()}
    if workload["name"] == SHIFT:
        report["shift"] = {
            name: shift_figures(phases, workload["short_class"], workload["long_class"],
                                workload["params"], short_slo, long_slo)
            for name, phases in samples.items()}
    if workload["name"] == BATCH:
        report["batch"] = {name: topologies[name]["batch"] for name in samples
                           if (topologies.get(name) or {}).get("batch")}
    if workload["name"] == TENANTS:
        report["tenants"] = {name: tenants_figures(phases, config["metric"])
                             for name, phases in samples.items()}
    if workload["name"] == OVERLOAD:  # admission's figures: the fleets have none to test
        report["overload"] = {name: overload_figures(phases, workload["short_class"],
                                                     workload["params"])
                              for name, phases in samples.items() if name not in comparison.FLEETS}
    report["prefix_cache"] = prefix_cache(report)
    report["rounds"] = rounds(report, samples, short_slo, long_slo)
    report["targets"] = targets(report)
    return report


def rounds(report: dict, samples: dict[str, dict[str, list[Sample]]], short_slo: Slo,
           long_slo: Slo) -> list[dict[str, Any]]:
    """Each round of a topology that ran more than once (tailguard/bench/rounds.py), per phase:
    where it ran in the bench's order and its own figures, so the pooled ones can be read
    against the order they came from."""
    short = report["workload"]["short_class"]
    short_t, long_t = comparison.targets(short_slo, long_slo)
    out = []
    for topo, by_phase in samples.items():
        runs = (report["topologies"].get(topo) or {}).get("rounds") or []
        if len(runs) < 2:
            continue
        for run in runs:
            for phase, ss in by_phase.items():
                mine = [s for s in ss if s.round == run["round"]]
                by_class = {c: [s for s in mine if s.cls == c] for c in dict.fromkeys(
                    s.cls for s in mine)}
                rows = {c: comparison.class_row(cs, short_t if c == short else long_t, None)
                        for c, cs in by_class.items()}
                ttfts = [s.ttft_s for s in by_class.get(short, []) if s.ok and s.ttft_s is not None]
                out.append({
                    "topology": topo, "round": run["round"], "position": run["position"],
                    "phase": phase, "sent": len(mine),
                    "within_target": sum(r["within_target"] for r in rows.values()),
                    "short_ttft_p50_s": percentile(ttfts, 50),
                    "short_ttft_p99_s": (rows.get(short) or {}).get("ttft_p99_s"),
                    "short_e2e_p99_s": (rows.get(short) or {}).get("e2e_p99_s"),
                    "output_tok_s": phase_totals(mine, short, short_slo, long_slo)["output_tok_s"],
                    "prefix_cache": (run.get("prefix_cache") or {}).get(phase)})
    return out


def rounds_lines(report: dict) -> list[str]:
    """The rounds as a table (nothing when no topology ran twice)."""
    rows = report.get("rounds") or []
    if not rows:
        return []
    out = ["each round of a topology run more than once (the figures above pool them):",
           "| topology | round | position | phase | sent | within target | short TTFT P50 | "
           "short TTFT P99 | short e2e P99 | output tok/s | prefix cache hits |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['topology']} | {r['round']} | {r['position']} | {r['phase']} | "
                   f"{r['sent']} | {r['within_target']} | {_cell(r['short_ttft_p50_s'])} | "
                   f"{_cell(r['short_ttft_p99_s'])} | {_cell(r['short_e2e_p99_s'])} | "
                   f"{_cell(r['output_tok_s'], 1)} | {comparison.hit_text(r['prefix_cache'])} |")
    return [*out, ""]


def prefix_cache(report: dict) -> dict[str, dict[str, Any]]:
    """Per topology and phase, its engines' prefix-cache hit rate over the phase (after the
    warm-up; tailguard/bench/engine_watch.py), where its engines were watched."""
    out: dict[str, dict[str, Any]] = {}
    for topo, t in report["topologies"].items():
        for phase, host in (t.get("host") or {}).items():
            cache = ((host or {}).get("engines") or {}).get("prefix_cache")
            if cache:
                out.setdefault(topo, {})[phase] = prefix_hit_rate(cache)
    return out


def prefix_cache_lines(report: dict) -> list[str]:
    """The hit rates as text: a line per topology, its phases' rates."""
    by_topo = report.get("prefix_cache") or {}
    if not by_topo:
        return []
    out = ["prefix cache hits (prompt tokens found in an engine's cache / looked up, over the "
           "measured phase, the warm-up left out):"]
    for topo, phases in by_topo.items():
        out.append(f"  {topo}: " + "; ".join(
            f"{phase} {comparison.hit_text(c)} ({c['hits']:.0f} of {c['queries']:.0f})"
            for phase, c in phases.items()))
    return out


# --- text --------------------------------------------------------------------------------

def _cell(v: float | None, digits: int = 3) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _rows(report: dict) -> Iterable[tuple[str, str, str, dict]]:
    for topo, t in report["topologies"].items():
        for phase in PHASES:
            for cls, st in t["phases"].get(phase, {}).items():
                yield topo, phase, cls, st


def render_tables(report: dict) -> str:
    """Markdown tables (readable in a terminal, pasteable into docs)."""
    out = []
    for metric, title in METRICS.items():
        out.append(f"{title} (s)\n")
        out.append("| topology | phase | class | n | errors | refused | avg | P50 | P95 | P99 | max |")
        out.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for topo, phase, cls, st in _rows(report):
            s = st[metric]
            out.append(f"| {topo} | {phase} | {cls} | {st['count']} | {st['errors']} | "
                       f"{st['refused']} | "
                       + " | ".join(_cell(s[k]) for k in ("avg", "p50", "p95", "p99", "max")) + " |")
        out.append("")
    out.append("output (lengths: max_tokens asked for, tokens produced; finish reasons)\n")
    out.append("| topology | phase | class | lanes | output tokens | tok/s (class) "
               "| tok/s per request avg | P50 | min | asked avg | produced avg | P50 | finish |")
    out.append("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for topo, phase, cls, st in _rows(report):
        d = st["decode_tok_s"]
        lanes = ", ".join(f"{k} {v}" for k, v in st["lanes"].items())
        asked, made = st.get("requested_len") or {}, st.get("output_len") or {}
        reasons = ", ".join(f"{k} {v}" for k, v in sorted((st.get("finish_reasons") or {}).items()))
        out.append(f"| {topo} | {phase} | {cls} | {lanes} | {st['output_tokens']} | "
                   f"{_cell(st['throughput_tok_s'], 1)} | {_cell(d['avg'], 1)} | "
                   f"{_cell(d['p50'], 1)} | {_cell(d['min'], 1)} | {_cell(asked.get('avg'), 1)} | "
                   f"{_cell(made.get('avg'), 1)} | {_cell(made.get('p50'), 0)} | {reasons} |")
    out.append("")
    out.append("goodput, whole machine and streams (every class; streams: gaps between chunks "
               "with text, pooled)\n")
    out.append("| topology | phase | requests | met SLO | goodput req/s | output tok/s | "
               "vs direct | ITL P50 | ITL P99 | tokens/chunk | short ITL P99 | short tokens/chunk |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    short = report["workload"]["short_class"]
    for topo, t in report["topologies"].items():
        direct = (report["topologies"].get("direct", {}).get("totals") or {})
        for phase in PHASES:
            tot = (t.get("totals") or {}).get(phase)
            if tot is None:
                continue
            g, itl = tot["goodput"], tot["itl_s"]
            vs = _ratio(tot["output_tok_s"], (direct.get(phase) or {}).get("output_tok_s"))
            st = t["phases"].get(phase, {}).get(short) or {}
            out.append(f"| {topo} | {phase} | {g['requests']} | {g['good']} | "
                       f"{_cell(g['goodput_rps'], 2)} | {_cell(tot['output_tok_s'], 1)} | "
                       f"{'' if vs is None else f'{vs:.2f}'} | {_cell(itl['p50'], 4)} | "
                       f"{_cell(itl['p99'], 4)} | {_cell(tot['tokens_per_chunk'], 2)} | "
                       f"{_cell((st.get('itl_s') or {}).get('p99'), 4)} | "
                       f"{_cell(st.get('tokens_per_chunk'), 2)} |")
    return "\n".join(out) + "\n"


def render_text(report: dict) -> str:
    cfg = report["config"]
    metric = cfg["metric"]
    r = report["ratios"][metric]
    short, long = report["workload"]["short_class"], report["workload"]["long_class"]
    head = [f"workload: {report['workload']['params']['described']}"] \
        if report["workload"]["params"].get("described") else []
    if report["workload"]["name"] in (OVERHEAD, OVERLOAD, BATCH, TENANTS):
        lines = [*head, render_tables(report),
                 *([comparison.render(report["peers"])] if report.get("peers") else [])]
    else:
        lines = [*head, render_tables(report),
                 *([render_shift(report)] if report.get("shift") else []),
                 *([comparison.render(report["peers"])] if report.get("peers") else []),
                 f"ratios ({METRICS[metric]} P99 of class {short!r}):",
                 f"  lanes / shared                    {_fmt_x(r['lanes_short_p99_over_shared'])}",
                 f"  lanes / lanes' no-long baseline   {_fmt_x(r['lanes_short_p99_over_baseline'])}",
                 f"  shared / shared's no-long baseline {_fmt_x(r['shared_short_p99_over_baseline'])}",
                 f"  lanes / direct (vLLM, priority)   {_fmt_x(r['lanes_short_p99_over_direct'])}",
                 *([f"  lanes / best tuned vLLM ({report['tuned']['best']}) "
                    f"{_fmt_x(r['lanes_short_p99_over_tuned'])}"] if report.get("tuned") else []),
                 *([f"  lanes / static lanes (no controller) "
                    f"{_fmt_x(r['lanes_short_p99_over_static'])}"] if report.get("static") else []),
                 *([f"  lanes / shared output tok/s of class {long!r}: "
                    f"{_fmt_x(r['lanes_long_tok_s_over_shared'])}",
                    f"  lanes / direct output tok/s of class {long!r}: "
                    f"{_fmt_x(r['lanes_long_tok_s_over_direct'])}"] if long else []), ""]
    lines += prefix_cache_lines(report)
    lines += rounds_lines(report)
    lines += [t["line"] for t in report["targets"]]
    for topo, t in report["topologies"].items():
        own = [f"{phase} {h['frontend_cpu_s']:g} s in {h['wall_s']:g} s "
               f"({h['frontend_cpu_s'] / h['wall_s']:.2f} cores)"
               for phase, h in (t.get("host") or {}).items()
               if h.get("frontend_cpu_s") is not None and h.get("wall_s")]
        if own:  # what `tailguard plan --frontend-from` fits its front-end cost from
            lines.append(f"front end's CPU (all but the engines), {topo}: {', '.join(own)}")
        for phase, h in (t.get("host") or {}).items():
            if h.get("disturbed"):
                lines.append(f"note: {topo}/{phase} was disturbed: other processes used "
                             f"{h['others_share']:.0%} of the CPU (heaviest: "
                             f"{', '.join(f'{c} {s} s' for c, s in h['others_heaviest'])})")
    late = sum(st["late_sends"] for _, _, _, st in _rows(report))
    if late:
        lines.append(f"note: {late} requests were sent more than {LAG_WARN_S * 1e3:.0f} ms late "
                     "(the load generator fell behind: short of CPU, or of --max-in-flight)")
    return "\n".join(lines) + "\n"
