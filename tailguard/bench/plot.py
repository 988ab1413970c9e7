"""The benchmark's picture: latency CDFs per class and topology, and the short class's P99 over time.

One row, read left to right: the short class's latency with and without long
traffic in each topology, the other classes', then the short class's P99 in a
sliding window across the mixed phase (where the 'explosion' shows). The overload
workload gets its own picture: its timeline (`overload_plot`).
"""

from __future__ import annotations

from pathlib import Path

from tailguard.bench.loadgen import REFUSED, Sample
from tailguard.bench.report import METRICS, OVERLOAD_P99_MAX
from tailguard.bench.workload import BATCH, OVERLOAD, WINDOWS, WITH_BATCH
from tailguard.plan.sim import percentile

#: Per topology; any other (each tuned run) takes matplotlib's next colour (COLORS.get: None).
COLORS = {"shared": "#d62728", "lanes": "#1f77b4", "static": "#9467bd", "direct": "#2ca02c"}


def rolling_p99(samples: list[Sample], metric: str, window_s: float,
                step_s: float | None = None) -> list[tuple[float, float]]:
    """(window centre, P99) over windows of send time; windows with no sample are skipped."""
    points = sorted((s.sent_s, getattr(s, metric)) for s in samples
                    if s.ok and s.sent_s is not None and getattr(s, metric) is not None)
    if not points:
        return []
    step = step_s or window_s / 2
    out, start, end = [], 0.0, points[-1][0]
    while start <= end:
        vals = [v for t, v in points if start <= t < start + window_s]
        if vals:
            out.append((start + window_s / 2, percentile(vals, 99)))
        start += step
    return out


def make_plot(report: dict, samples: dict[str, dict[str, list[Sample]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if report["workload"]["name"] == OVERLOAD:
        return overload_plot(report, samples, path, plt)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    def plain_log(axis) -> None:
        """Log scale labelled 0.1, 0.2, 0.5, 1, 2, 5...: readable over less than a decade."""
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())

    metric = report["config"]["metric"]
    mname = METRICS[metric]
    short = report["workload"]["short_class"]
    classes = report["workload"]["classes"]
    # each topology's phases drawn: the mixed load solid, its comparison dashed
    other, other_label = ((WITH_BATCH, " (beside the batch)") if report["workload"]["name"] == BATCH
                          else ("baseline", " (no long traffic)"))
    fig, axes = plt.subplots(1, len(classes) + 1, figsize=(5.2 * (len(classes) + 1), 4.4))
    for ax, cls in zip(axes, classes):
        for topo, phases in samples.items():
            for phase, style in (("mixed", "-"), (other, "--")):
                vals = sorted(getattr(s, metric) for s in phases.get(phase, [])
                              if s.cls == cls and s.ok and getattr(s, metric) is not None)
                if not vals:
                    continue
                ys = [0.0] + [(i + 1) / len(vals) for i in range(len(vals))]
                vals = [vals[0]] + vals
                label = f"{topo}" + (other_label if phase == other else "")
                ax.step(vals, ys, style, where="post", color=COLORS.get(topo), label=label)
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.set_xscale("log")
        plain_log(ax.xaxis)
        ax.set_xlabel(f"{mname} latency (s, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{cls} requests: CDF")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3, which="both")
    ax = axes[-1]
    duration = report["workload"]["params"].get("duration_s") or 60
    window = max(5.0, duration / 6)
    for topo, phases in samples.items():
        for phase, style in (("mixed", "-"), (other, "--")):
            pts = rolling_p99([s for s in phases.get(phase, []) if s.cls == short], metric, window)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=".",
                        color=COLORS.get(topo),
                        label=f"{topo}" + (other_label if phase == other else ""))
    ax.set_yscale("log")
    plain_log(ax.yaxis)
    ax.set_xlabel("time into the phase (s)")
    ax.set_ylabel(f"{short} P99 {mname} (s, log)")
    ax.set_title(f"{short} P99 over time ({window:.0f} s windows)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    cfg = report["config"]
    fig.suptitle(f"tailguard bench: {report['workload']['name']} workload, {cfg['model_label']}, "
                 f"{cfg['engines']} engines x {cfg['cores_per_engine']}", fontsize=11)
    return _save(fig, path, plt)


def overload_plot(report: dict, samples: dict[str, dict[str, list[Sample]]], path: Path,
                  plt) -> Path:
    """The overload timeline: each short request's end-to-end latency at its arrival (accepted)
    and the refusals per second, the burst shaded, 1.5x the reference P99 drawn."""
    p = report["workload"]["params"]
    short = report["workload"]["short_class"]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    right = ax.twinx()
    for topo, phases in samples.items():
        shorts = [s for w in WINDOWS for s in phases.get(w, []) if s.cls == short]
        ok = [(s.arrival_s, s.e2e_s) for s in shorts if s.ok]
        ax.scatter([t for t, _ in ok], [v for _, v in ok], s=5, color=COLORS.get(topo),
                   label=f"{topo}: accepted {short} request, end-to-end")
        per_s: dict[int, int] = {}
        for s in shorts:
            if s.status == REFUSED:
                per_s[int(s.arrival_s)] = per_s.get(int(s.arrival_s), 0) + 1
        right.bar(list(per_s), list(per_s.values()), width=1.0, color="#d62728", alpha=0.35,
                  label="refused (429) per second")
        ref = (report.get("overload") or {}).get(topo, {}).get("reference_p99_s")
        if ref:
            ax.axhline(OVERLOAD_P99_MAX * ref, color="grey", ls="--", lw=0.8,
                       label=f"{OVERLOAD_P99_MAX:g}x the reference P99")
    ax.axvspan(p["burst_start_s"], p["burst_end_s"], color="orange", alpha=0.12,
               label=f"burst: {p.get('burst_short_rate', 0):.1f} {short} req/s")
    ax.set_yscale("log")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("end-to-end latency (s, log)")
    right.set_ylabel("refused per second")
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    cfg = report["config"]
    ax.set_title(f"tailguard bench: overload, {cfg['model_label']}, {cfg['engines']} engines x "
                 f"{cfg['cores_per_engine']}", fontsize=11)
    return _save(fig, path, plt)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
