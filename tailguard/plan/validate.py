"""Predicted against measured: the simulator on the bench runs of docs/benchmarks.md.

``MEASURED`` holds the figures of the two `make bench` runs documented there (2-core
AMD EPYC, the `small` demo model, one engine per core, the shipped lanes file); the
runs' report.json files were not kept, so the figures are copied from that page, with
the command of each run. A new run's report can be compared by adding its row.
The simulated fleet is the bench's: `shared` = one lane on both engines, `lanes` = the
lanes file's worker groups, one engine each. The simulated requests are the run's own:
the bench's workload generator, given the run's rate, share, duration and seed, yields
the arrival times it sent (`--seed` draws Poisson arrivals of the same rates instead,
to show how much a P99 of 200 requests moves with the draw).
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.bench.workload import LONG, mixed_workload
from tailguard.lanes import LaneTable
from tailguard.plan.search import topology
from tailguard.plan.sim import simulate
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad, Lengths

#: The bench's `mixed` workload: the article's prompts (2-4 tokens with the small demo
#: model's tokenizer, 3 taken) and 64 tokens out; long: ~2,000-token prompts, 512 out.
SHORT_PROMPT_TOKENS, SHORT_TOKENS, LONG_PROMPT_TOKENS, LONG_TOKENS = 3, 64, 2000, 512


@dataclass(frozen=True)
class BenchRun:
    name: str
    command: str
    rate: float
    long_share: float
    duration_s: float
    # topology -> (short end-to-end P99 s, long output tokens/s), mixed phase
    measured: dict[str, tuple[float, float]]


MEASURED = (
    BenchRun("run1 (default load)", "tailguard bench", 2.5, 0.2, 90,
             {"shared": (3.924, 266.7), "lanes": (0.584, 181.8)}),
    BenchRun("run2 (lighter long load)", "tailguard bench --rate 2.3 --long-share 0.13",
             2.3, 0.13, 90, {"shared": (2.181, 184.2), "lanes": (0.681, 156.2)}),
)


def bench_classes(run: BenchRun) -> list[ClassLoad]:
    short_rate, long_rate = run.rate * (1 - run.long_share), run.rate * run.long_share
    return [ClassLoad("short", short_rate, Lengths.fixed(SHORT_PROMPT_TOKENS),
                      Lengths.fixed(SHORT_TOKENS)),
            ClassLoad("long", long_rate, Lengths.fixed(LONG_PROMPT_TOKENS),
                      Lengths.fixed(LONG_TOKENS))]


def bench_arrivals(run: BenchRun) -> list[tuple[float, str, int, int]]:
    """The requests the bench sent in the run (its generator is seeded: seed 0)."""
    wl = mixed_workload(run.rate, run.long_share, run.duration_s, seed=0,
                        short_tokens=SHORT_TOKENS, long_tokens=LONG_TOKENS)
    return [(r.arrival_s, r.cls, LONG_PROMPT_TOKENS if r.cls == LONG else SHORT_PROMPT_TOKENS,
             r.max_tokens) for r in wl.requests]


def predict(run: BenchRun, table: LaneTable, model: StepModel, name: str,
            seed: int | None = None) -> tuple[float, float]:
    """(short P99 s, long tokens/s) the simulator predicts for one bench run and topology:
    for the run's own arrivals, or (`seed`) for a Poisson draw of the same rates."""
    lanes, groups = topology(table, name, count=2 if name == "shared" else 1)
    res = simulate(bench_classes(run), lanes, groups, model, duration_s=run.duration_s,
                   seed=seed or 0, arrivals=bench_arrivals(run) if seed is None else None)
    return res["short"].e2e["p99"] or 0.0, res["long"].tokens_per_s


def table_rows(table: LaneTable, model: StepModel, seed: int | None = None) -> list[dict]:
    rows = []
    for run in MEASURED:
        for name, (m_p99, m_tps) in run.measured.items():
            p99, tps = predict(run, table, model, name, seed)
            rows.append({"run": run.name, "topology": name,
                         "short_p99": (p99, m_p99, p99 / m_p99 - 1),
                         "long_tokens_per_s": (tps, m_tps, tps / m_tps - 1)})
    return rows


def render(rows: list[dict]) -> str:
    out = [("| run | topology | short P99 predicted | measured | error | long tok/s predicted "
            "| measured | error |"), "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p, m, e = r["short_p99"]
        tp, tm, te = r["long_tokens_per_s"]
        out.append(f"| {r['run']} | {r['topology']} | {p:.3f} s | {m:.3f} s | {100 * e:+.0f}% "
                   f"| {tp:.1f} | {tm:.1f} | {100 * te:+.0f}% |")
    return "\n".join(out)
