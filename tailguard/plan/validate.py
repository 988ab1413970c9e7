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

`--validate-runs` (``run_rows``) needs no table: it reads a bench run's directory, replays the
requests each topology accepted through the tailguard/plan/compare.py setup that models it, with
the front end on the engine whose cores it shared (``frontend_of``), and compares the figures the
run's report computes (the rules: ``replay_arrivals``, ``measured``).
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tailguard.lanes.table import LaneTable, load_lanes, parse_lanes
from tailguard.plan import compare
from tailguard.plan.compare import FLEET_SETUP, ROUTER_SETUP, SHARED
from tailguard.plan.search import topology
from tailguard.plan.sim import Simulation, simulate
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


# -- `--validate-runs`: a bench run's own samples against the simulator's setups

#: the bench's measured phase, its classes, and a refusal's status (tailguard/bench/loadgen.py's
#: REFUSED: the planner does not import the bench)
RUN_PHASE, SHORT, LONG, REFUSED = "mixed", "short", "long", "refused"
#: a bench topology -> the setup of tailguard/plan/compare.py that models it
SETUP_OF = {"lanes": FLEET_SETUP, "fleet": ROUTER_SETUP, "fleet-p2": ROUTER_SETUP, "shared": SHARED}
TWO_CORES = "one engine on two cores needs a two-core step model"
#: bench topologies (a direct-tuned-N-M by its prefix) shown but not simulated, and why
NOT_MODELLED = {"direct": TWO_CORES, "direct-tuned": TWO_CORES,
                "static": "the bench's static split is not compare.py's static layout"}
#: (key, label) of each figure a row compares
FIGURES = (("short_e2e_p99", "short e2e P99"), ("short_ttft_p99", "short TTFT P99"),
           ("long_ttft_p99", "long TTFT P99"), ("output_tok_s", "output tok/s"),
           ("short_within", "short within target"), ("long_within", "long within target"))
#: the figures that are not seconds (tokens/s, request counts), with their digits after the point
PLAIN = {"output_tok_s": 1, "short_within": 0, "long_within": 0}
Request = tuple[float, str, int, int]


def setup_for(topology: str) -> str | None:
    """The compare.py setup that models a bench topology; None: not modelled (NOT_MODELLED);
    ValueError for a name the bench does not run."""
    if topology in SETUP_OF:
        return SETUP_OF[topology]
    if topology in NOT_MODELLED or topology.startswith("direct-tuned-"):
        return None
    raise ValueError(f"topology {topology!r} is not one tailguard bench runs "
                     f"({', '.join([*SETUP_OF, *NOT_MODELLED])})")


def not_modelled_why(topology: str) -> str:
    return NOT_MODELLED["direct-tuned" if topology.startswith("direct-tuned") else topology]


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(report.json, samples.jsonl's lines) of a finished bench run's directory."""
    files = {name: run_dir / name for name in ("report.json", "samples.jsonl")}
    for name, path in files.items():
        if not path.is_file():
            raise ValueError(f"{run_dir}: no {name} (not a finished tailguard bench run)")
    try:
        report = json.loads(files["report.json"].read_text())
        lines = files["samples.jsonl"].read_text().splitlines()
        samples = [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{run_dir}: a file is not JSON: {exc}") from None
    if any(s.get("round", 1) > 1 for s in samples):  # the replay is one timeline per topology
        raise ValueError(f"{run_dir}: a topology ran more than once (--topologies named it "
                         "twice): replay a run that measured each once")
    return report, samples


def measured(report: dict[str, Any], topology: str) -> dict[str, float | None]:
    """One topology's measured phase as the run's report.json holds it (tailguard/bench/report.py
    computed it: nearest-rank P99s over the requests that succeeded, every class's output tokens
    over the phase's span, each class's requests within target), so the figures are those of its
    report.md."""
    node = (report.get("topologies") or {}).get(topology) or {}
    classes = (node.get("phases") or {}).get(RUN_PHASE) or {}

    def p99(cls: str, key: str) -> float | None:
        return ((classes.get(cls) or {}).get(key) or {}).get("p99")

    def within(cls: str) -> int | None:  # the per-class table's "within target"
        return ((_peer_row(report, topology).get("classes") or {}).get(cls) or {}).get(
            "within_target")

    totals = (node.get("totals") or {}).get(RUN_PHASE) or {}
    return {"short_e2e_p99": p99(SHORT, "e2e_s"), "short_ttft_p99": p99(SHORT, "ttft_s"),
            "long_ttft_p99": p99(LONG, "ttft_s"), "output_tok_s": totals.get("output_tok_s"),
            "short_within": within(SHORT), "long_within": within(LONG)}


def _peer_row(report: dict[str, Any], topology: str) -> dict[str, Any]:
    """A topology's row of the report's comparison with the fleets (report.json ``peers``:
    per-class figures, requests served per engine); {} where the run has none."""
    return ((report.get("peers") or {}).get("rows") or {}).get(topology) or {}


def accepted(sample: dict[str, Any]) -> bool:
    """Whether the topology took the request (its API answered with a job, or a plain server
    its stream): a refused one (429/503) never reached an engine. A sample without the field
    (an older run's): whether it was sent and not refused."""
    if "accepted" in sample:
        return bool(sample["accepted"])
    return sample.get("sent_s") is not None and sample.get("status") != REFUSED


def replay_arrivals(samples: Sequence[dict[str, Any]],
                    run_samples: Sequence[dict[str, Any]] = ()) -> tuple[list[Request], int]:
    """(arrivals, how many prompt lengths were taken from elsewhere): every request the topology
    accepted (``accepted``: the simulator models no admission, so a refused request, which never
    loaded an engine, is left out; `run_rows` counts them beside the row), as (arrival_s, class,
    prompt tokens, max_tokens). The simulator ends a request at its max_tokens only, so that is
    its output (the bench ignores EOS; `early_stops` counts those that ended sooner). A prompt's
    length is the server's count, else the workload's plan, else the same arrival's count in
    another topology of the run (`run_samples`: every topology is sent the same arrivals), else
    its class's median there."""
    known = {(s["cls"], s["arrival_s"]): s["prompt_tokens"] for s in run_samples
             if s.get("prompt_tokens")}
    by_class: dict[str, list[int]] = {}
    for (cls, _), n in known.items():
        by_class.setdefault(cls, []).append(n)
    out, guessed = [], 0
    for s in samples:
        if s.get("sent_s") is None or not accepted(s):
            continue
        prompt = s.get("prompt_tokens") or s.get("planned_prompt_tokens")
        if not prompt:
            guessed += 1
            lengths = sorted(by_class.get(s["cls"], []))
            prompt = known.get((s["cls"], s["arrival_s"])) or (lengths[len(lengths) // 2]
                                                               if lengths else None)
            if not prompt:
                raise ValueError(f"no prompt length for class {s['cls']!r} anywhere in the run")
        out.append((s["arrival_s"], s["cls"], int(prompt), int(s["max_tokens"])))
    return sorted(out), guessed


def run_lanes_file(run_dir: Path, report: dict[str, Any]) -> Path:
    """The lanes file a run's lanes ran with: the copy in its `lanes/` folder, else the config's
    lanes_file (from the repository root if relative), else tailguard/lanes/lanes-cpu.toml."""
    if (run_dir / "lanes" / "lanes.toml").is_file():
        return run_dir / "lanes" / "lanes.toml"
    root = Path(__file__).resolve().parents[2]
    name = Path(report.get("config", {}).get("lanes_file") or "tailguard/lanes/lanes-cpu.toml")
    return name if name.is_absolute() else root / name


def replica_budget(report: dict[str, Any], topology: str) -> int | None:
    """A router fleet's replicas' --max-num-batched-tokens (the tuned one), if the report has it."""
    for replica in report.get("topologies", {}).get(topology, {}).get("replicas", []):
        args = replica.get("extra_args", [])
        if "--max-num-batched-tokens" in args:
            return int(args[args.index("--max-num-batched-tokens") + 1])
    return None


def frontend_of(report: dict[str, Any], topology: str, setup_name: str) -> tuple[bool, int]:
    """(whether the front end shared an engine's cores, that engine's slots as its worker cut
    them: the `frontend` and `frontend_cap` of compare.run) for a topology of a run. The front
    end's cores are the topology's, else the run's (report.json ``frontend_cores``); it shares an
    engine's where the topology lists an engine on one of them (or lists no engines). Only
    tailguard's lanes (the fleet setup) cut that engine's lane limits (``engine_slots``, its entry
    for it); a router fleet's replica on those cores (beside the router and the replicas' API
    servers) runs all its max_num_seqs: no cap."""
    info = (report.get("topologies") or {}).get(topology) or {}
    cores = set(info.get("frontend_cores") or (report.get("config") or {}).get("frontend_cores")
                or ())
    if not cores:
        return False, 0
    engines = info.get("engines") or []
    beside = [e["name"] for e in engines if cores & set(e.get("cores") or ())]
    if engines and not beside:
        return False, 0
    if setup_name != FLEET_SETUP:
        return True, 0
    slots = info.get("engine_slots") or {}
    cut = [slots[name] for name in beside if name in slots]
    return True, min(cut) if cut else 0


def engine_split(sim: Simulation) -> list[int]:
    """Requests each engine of a finished simulation took, most first."""
    return sorted(Counter(r.where.name for r in sim.done if r.where).values(), reverse=True)


def measured_split(report: dict[str, Any], topology: str,
                   samples: Sequence[dict[str, Any]]) -> list[int]:
    """Requests each engine served, most first: the report's (engine counters), else the
    samples' workers."""
    served = _peer_row(report, topology).get("engine_served")
    if not served:
        served = Counter(s["worker"] for s in samples if s.get("ok") and s.get("worker"))
    return sorted(served.values(), reverse=True)


def _figures(pred: dict[str, float | None],
             meas: dict[str, float | None]) -> dict[str, tuple[float | None, float | None,
                                                             float | None]]:
    return {k: (pred[k], meas[k], pred[k] / meas[k] - 1 if pred[k] is not None and meas[k] else None)
            for k, _ in FIGURES}


def run_rows(run_dir: Path, model: StepModel) -> list[dict[str, Any]]:
    """Per topology of a bench run: its measured phase against the simulator's setup for it, fed
    the requests it accepted (``replay_arrivals``; its refused ones counted beside) on the run's
    engines (the config's, else 2), the front end placed as it ran (``frontend_of``)."""
    report, samples = read_run(run_dir)
    phase = [s for s in samples if s.get("phase") == RUN_PHASE]
    topologies = list(dict.fromkeys(s["topology"] for s in phase))
    setups = {t: setup_for(t) for t in topologies}
    engines = int(report.get("config", {}).get("engines") or 2)
    lanes_file = run_lanes_file(run_dir, report)
    table = load_lanes(lanes_file)
    rows = []
    for topo in topologies:
        mine = [s for s in phase if s["topology"] == topo]
        row: dict[str, Any] = {
            "run": run_dir.name, "topology": topo, "setup": setups[topo], "sent": len(mine),
            "refused": sum(s.get("status") == REFUSED for s in mine),
            "not_ok": sum(not s.get("ok") and s.get("status") != REFUSED for s in mine),
            "early_stops": sum(bool(s.get("ok")) and (s.get("completion_tokens") or 0)
                               < s["max_tokens"] for s in mine),
            "lanes_file": str(lanes_file), "why_not": None}
        if setups[topo] is None:
            rows.append({**row, "why_not": not_modelled_why(topo)})
            continue
        arrivals, row["guessed_prompts"] = replay_arrivals(mine, phase)
        row["replayed"] = len(arrivals)
        budget = replica_budget(report, topo) if setups[topo] == ROUTER_SETUP else None
        sim_model = replace(model, max_batched_tokens=budget) if budget else model
        row["frontend"], row["frontend_cap"] = frontend_of(report, topo, setups[topo])
        sim = compare.simulation(setups[topo], arrivals, table, sim_model, engines,
                                 frontend=row["frontend"], frontend_cap=row["frontend_cap"])
        pred = compare.row(sim, setups[topo], engines, sim_model)
        row["figures"] = _figures({"short_e2e_p99": pred.short_p99_s,
                                   "short_ttft_p99": pred.short_ttft_p99_s,
                                   "long_ttft_p99": pred.long_ttft_p99_s,
                                   "output_tok_s": pred.output_tokens_per_s,
                                   "short_within": compare.within_target(sim, SHORT, sim_model),
                                   "long_within": compare.within_target(sim, LONG, sim_model)},
                                  measured(report, topo))
        row["sim_not_succeeded"] = pred.not_succeeded
        row["batched_tokens"] = sim_model.max_batched_tokens
        row["split"] = (engine_split(sim), measured_split(report, topo, mine))
        rows.append(row)
    return rows


def runs_summary(rows: Sequence[dict[str, Any]], within: float = 0.2) -> str:
    """Per figure, how many simulated rows are within `within` of the measured figure."""
    parts = []
    for key, label in FIGURES:
        errs = [r["figures"][key][2] for r in rows if r.get("figures")
                and r["figures"][key][2] is not None]
        parts.append(f"{label} {sum(abs(e) <= within for e in errs)} of {len(errs)}")
    return f"within {100 * within:.0f}%: " + ", ".join(parts)


def _cell(fig: tuple[float | None, float | None, float | None], unit: str, digits: int) -> str:
    p, m = ("-" if x is None else f"{x:.{digits}f}" for x in fig[:2])
    return f"{p} / {m}{unit} ({'-' if fig[2] is None else f'{100 * fig[2]:+.0f}%'})"


def render_row(r: dict[str, Any]) -> str:
    """One markdown row: each figure predicted / measured (error)."""
    head = f"| {r['run']} | {r['topology']} -> {r['setup'] or '-'} | {r['sent']} | {r['refused']} "
    if r["why_not"]:
        return head + f"| not modelled: {r['why_not']} |" + "|" * len(FIGURES)
    f = r["figures"]
    pred, meas = r["split"]
    return (head + "| " + " | ".join(_cell(f[k], "" if k in PLAIN else " s", PLAIN.get(k, 3))
                                     for k, _ in FIGURES)
            + f" | {'/'.join(map(str, pred))} / {'/'.join(map(str, meas)) or '-'} |")


def _front(r: dict[str, Any]) -> str:
    if not r["frontend"]:
        return "no front end on an engine's cores"
    return "the front end on the last engine's cores" + (
        f" (its lane limits cut to {r['frontend_cap']})" if r["frontend_cap"] else " (no cut)")


def render_runs(rows: Sequence[dict[str, Any]]) -> str:
    out = ["| run | topology -> setup | sent | refused | " + " | ".join(
               f"{label} predicted / measured (error)" for _, label in FIGURES)
           + " | served per engine predicted / measured |",
           "|---|---|---:|---:|" + "---:|" * len(FIGURES) + "---|"]
    out += [render_row(r) for r in rows]
    notes = sorted({f"{r['run']}: lanes file {r['lanes_file']}" for r in rows})
    notes += [f"{r['run']} {r['topology']}: {r['replayed']} accepted replayed ({r['refused']} "
              f"refused left out), {r['early_stops']} ended before max_tokens, "
              f"{r['guessed_prompts']} prompt lengths from another topology, {r['not_ok']} failed "
              f"(measured) against {r['sim_not_succeeded']} not succeeded (simulated); simulated "
              f"with max_batched_tokens {r['batched_tokens']}, {_front(r)}"
              for r in rows if not r["why_not"]]
    return "\n".join(out + [""] + notes + ["", runs_summary(rows)])
