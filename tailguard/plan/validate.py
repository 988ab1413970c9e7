"""Predicted against measured: the simulator on the bench runs of docs/benchmarks.md.

``MEASURED`` holds the figures of `make bench` runs, all on one host and model (those
docs/benchmarks.md reports), and names the lanes file each ran with, kept in ``RUNS_DIR``:
with it come the lanes and the worker groups. A new run is
compared by adding its line (and its lanes file, if new). A run whose figures are not
evidence for the model (a disturbed run, code that is not the commit named) stays in the
table, marked, out of the count within 20% (``not_counted``).
The simulated fleet is the bench's: `shared` = one lane on both engines, `lanes` = the
lanes file's worker groups, one engine each. The simulator no longer models borrowing (the
short worker running long jobs on a second engine, which the runs marked "borrowing" did): their
`lanes` rows predict the long lane without it. The
simulated requests are the run's own: the bench's workload generator, given the run's
rate, share, duration and seed, yields the arrival times it sent (`--seed` draws Poisson
arrivals of the same rates instead, to show how much a P99 moves with the draw).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tailguard.lanes.table import LaneTable, parse_lanes
from tailguard.plan.search import topology
from tailguard.plan.sim import simulate
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.synthetic import class_stream, poisson_arrivals
from tailguard.plan.workload import ClassLoad, Lengths

#: The bench's `mixed` workload: the article's prompts (2-4 tokens with the small demo
#: model's tokenizer, 3 taken) and 64 tokens out; long: ~2,000-token prompts, 512 out.
SHORT_PROMPT_TOKENS, SHORT_TOKENS, LONG_PROMPT_TOKENS, LONG_TOKENS = 3, 64, 2000, 512


#: where the lanes file of each run is kept
RUNS_DIR = Path(__file__).resolve().parents[2] / "docs" / "capacity" / "runs"
#: worker fields of mechanisms gone since those runs (borrowing, lane moves): a run's file is read
#: past them, as the simulator no longer models them (the files stay as the runs had them)
RETIRED_WORKER_FIELDS = ("borrow", "borrow_max", "borrow_headroom", "borrow_engine", "moves_to")


@dataclass(frozen=True)
class BenchRun:
    """One `make bench` run: its mixed phase's figures and the load and lanes file it ran with
    (by default `tailguard bench`'s default load and the borrowing lanes file)."""

    name: str
    #: topology -> (short end-to-end P99 s, long output tokens/s), mixed phase
    measured: dict[str, tuple[float, float]]
    #: long requests of the lanes topology's mixed phase that a borrowing worker ran (None:
    #: not recorded; the simulator no longer models borrowing: shown, not predicted)
    borrowed: int | None = None
    #: topology -> why its figures are shown but not evidence (left out of `summary`)
    not_counted: dict[str, str] = field(default_factory=dict)
    command: str = "tailguard bench"
    rate: float = 2.5
    long_share: float = 0.2
    duration_s: float = 90
    lanes_file: str = "borrowing.lanes.toml"  # in RUNS_DIR: the lanes file the run used
    #: whether it ran under the core plan (tailguard/host/cores.py): the front end on the last
    #: engine's core, which it slows (tailguard/plan/sim.py); without it the front end runs
    #: anywhere, which the simulator does not model
    frontend_core: bool = True


#: A new run: its line here (and its lanes file in RUNS_DIR if it is not one of these).
MEASURED = (
    BenchRun("run1 (default load, before borrowing)",
             {"shared": (3.924, 266.7), "lanes": (0.584, 181.8)}, 0,
             lanes_file="pre-borrowing.lanes.toml", frontend_core=False),
    BenchRun("run2 (lighter long load, before borrowing)",
             {"shared": (2.181, 184.2), "lanes": (0.681, 156.2)}, 0,
             lanes_file="pre-borrowing.lanes.toml", rate=2.3, long_share=0.13,
             command="tailguard bench --rate 2.3 --long-share 0.13", frontend_core=False),
    BenchRun("bench-final (default, borrowing; c9a94fc)",
             {"shared": (5.365, 255.9), "lanes": (0.992, 206.3)}, 12, frontend_core=False),
    BenchRun("bench-run2 (default, borrowing; 9c2ac1f)",
             {"shared": (7.287, 246.7), "lanes": (2.160, 191.8)}, 14,
             not_counted={"lanes": "partly uncommitted code, unit tests beside its mixed phase"},
             frontend_core=False),
    BenchRun("bench-front1 (default, borrowing, core plan; 5355d9d)",
             {"shared": (8.124, 253.4), "lanes": (0.565, 198.5)}, 17),
    BenchRun("bench-final2 (default, borrowing, core plan, free slots; edb7c59; quiet)",
             {"shared": (5.033, 265.7), "lanes": (0.533, 193.1)}, 17,
             lanes_file="coreplan.lanes.toml"),
    BenchRun("bench-fs1 (default, borrowing, core plan, front end's CPU recorded; f795d7f; quiet)",
             {"shared": (5.277, 260.7), "lanes": (0.544, 199.7)}, 16,
             lanes_file="coreplan.lanes.toml"),
    BenchRun("bench-final4 (default, borrowing, core plan, worker batches its text; b3a1c19; quiet)",
             {"shared": (5.681, 258.6), "lanes": (0.488, 196.3)}, 17,
             lanes_file="coreplan.lanes.toml"),
)


def bench_classes(run: BenchRun) -> list[ClassLoad]:
    short_rate, long_rate = run.rate * (1 - run.long_share), run.rate * run.long_share
    return [ClassLoad("short", short_rate, Lengths.fixed(SHORT_PROMPT_TOKENS),
                      Lengths.fixed(SHORT_TOKENS)),
            ClassLoad("long", long_rate, Lengths.fixed(LONG_PROMPT_TOKENS),
                      Lengths.fixed(LONG_TOKENS))]


def run_lanes(run: BenchRun) -> LaneTable:
    """The lanes file `run` ran with, less its RETIRED_WORKER_FIELDS."""
    with open(RUNS_DIR / run.lanes_file, "rb") as fh:
        data = tomllib.load(fh)
    for worker in data.get("workers", []):
        for name in RETIRED_WORKER_FIELDS:
            worker.pop(name, None)
    return parse_lanes(data)


def bench_arrivals(run: BenchRun) -> list[tuple[float, str, int, int]]:
    """The requests the bench sent in the run: its `mixed` workload draws each class's arrivals
    from the class's own seeded stream (seed 0), as here (tests/unit/test_plan_validate.py
    holds the two equal)."""
    requests = [(t, cls, prompt_tokens, tokens)
                for cls, rate, prompt_tokens, tokens in (
                    ("short", run.rate * (1 - run.long_share), SHORT_PROMPT_TOKENS, SHORT_TOKENS),
                    ("long", run.rate * run.long_share, LONG_PROMPT_TOKENS, LONG_TOKENS))
                for t in poisson_arrivals(rate, run.duration_s, class_stream(0, cls))]
    return sorted(requests, key=lambda r: (r[0], r[1]))


def predict(run: BenchRun, model: StepModel, name: str,
            seed: int | None = None) -> tuple[float, float]:
    """(short P99 s, long tokens/s) the simulator predicts for one
    bench run and topology: for the run's own arrivals, or (`seed`) for a Poisson draw of
    the same rates."""
    table = run_lanes(run)
    lanes, groups = topology(table, name, count=2 if name == "shared" else 1,
                             frontend=run.frontend_core)
    res = simulate(bench_classes(run), lanes, groups, model, duration_s=run.duration_s,
                   seed=seed or 0, arrivals=bench_arrivals(run) if seed is None else None)
    return res["short"].e2e["p99"] or 0.0, res["long"].tokens_per_s


def table_rows(model: StepModel, seed: int | None = None) -> list[dict]:
    rows = []
    for run in MEASURED:
        for name, (m_p99, m_tps) in run.measured.items():
            p99, tps = predict(run, model, name, seed)
            rows.append({"run": run.name, "topology": name, "lanes_file": run.lanes_file,
                         "short_p99": (p99, m_p99, p99 / m_p99 - 1),
                         "long_tokens_per_s": (tps, m_tps, tps / m_tps - 1),
                         "long_borrowed": run.borrowed if name == "lanes" else 0,
                         "not_counted": run.not_counted.get(name)})
    return rows


def summary(rows: list[dict], within: float = 0.2) -> str:
    """How many of the counted rows' predictions are within `within` of the measured figure."""
    counted = [r for r in rows if not r["not_counted"]]
    parts = []
    for key, label in (("short_p99", "short P99"), ("long_tokens_per_s", "long tok/s")):
        ok = sum(abs(r[key][2]) <= within for r in counted)
        parts.append(f"{label} {ok} of {len(counted)}")
    left = len(rows) - len(counted)
    return (f"within {100 * within:.0f}%: " + ", ".join(parts)
            + (f" ({left} row{'s' * (left != 1)} not counted)" if left else ""))


def render(rows: list[dict]) -> str:
    out = [("| run | topology | short P99 predicted | measured | error | long tok/s predicted "
            "| measured | error | long jobs borrowed (measured) |"),
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p, m, e = r["short_p99"]
        tp, tm, te = r["long_tokens_per_s"]
        bm = r["long_borrowed"]
        why = f" (not counted: {r['not_counted']})" if r["not_counted"] else ""
        out.append(f"| {r['run']} | {r['topology']}{why} | {p:.3f} s | {m:.3f} s | {100 * e:+.0f}% "
                   f"| {tp:.1f} | {tm:.1f} | {100 * te:+.0f}% "
                   f"| {'-' if bm is None else bm} |")
    return "\n".join(out + ["", summary(rows)])
