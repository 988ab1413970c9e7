"""`tailguard plan --validate`'s table: every run's lanes file is kept, and a run marked not
counted is shown but left out of the count within 20%. `--validate-runs`: a bench run directory's
samples read into the requests it sent and the figures its report computes, each topology on the
simulator's setup for it (synthetic runs only: no measured figure here)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT

from tailguard.lanes.table import load_lanes
from tailguard.plan import compare
from tailguard.plan.command import plan
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.validate import (
    MEASURED,
    RETIRED_WORKER_FIELDS,
    RUNS_DIR,
    engine_split,
    frontend_of,
    measured,
    render_row,
    replay_arrivals,
    run_lanes,
    run_rows,
    runs_summary,
    setup_for,
    summary,
)


def test_every_run_names_a_kept_lanes_file():
    assert all((RUNS_DIR / run.lanes_file).is_file() for run in MEASURED)


def test_every_runs_lanes_file_reads_past_the_retired_worker_fields():
    """The runs that borrowed keep their files as they ran; the simulator reads them without it."""
    borrowed = [run for run in MEASURED if "borrow" in (RUNS_DIR / run.lanes_file).read_text()]
    assert borrowed  # the case this covers is there
    for run in MEASURED:
        table = run_lanes(run)
        assert {"short", "long"} <= {lane.name for lane in table} and table.workers
        assert not any(getattr(w, "borrow", None) and w.borrow.lanes for w in table.workers)
    assert "borrow" in RETIRED_WORKER_FIELDS


def _row(err_p99: float, err_tps: float, not_counted: str | None = None) -> dict:
    return {"short_p99": (0, 0, err_p99), "long_tokens_per_s": (0, 0, err_tps),
            "not_counted": not_counted}


def test_summary_counts_only_the_counted_rows():
    rows = [_row(0.1, -0.2), _row(-0.3, 0.05), _row(-0.9, 0.5, "disturbed")]
    assert summary(rows) == "within 20%: short P99 1 of 2, long tok/s 2 of 2 (1 row not counted)"
    assert summary(rows[:2], within=0.3) == "within 30%: short P99 2 of 2, long tok/s 2 of 2"


def test_the_replayed_arrivals_are_the_ones_the_bench_sends():
    """The planner replays the bench's `mixed` arrivals without importing the bench: the two
    draw from the same per-class streams (tailguard/plan/synthetic.py)."""
    from tailguard.bench.workload import mixed_workload
    from tailguard.plan.validate import LONG_TOKENS, SHORT_TOKENS, bench_arrivals

    for run in MEASURED:
        sent = mixed_workload(run.rate, run.long_share, run.duration_s, seed=0,
                              short_tokens=SHORT_TOKENS, long_tokens=LONG_TOKENS)
        assert [(t, cls, out) for t, cls, _, out in bench_arrivals(run)] == [
            (r.arrival_s, r.cls, r.max_tokens) for r in sent.requests]


# -- `--validate-runs`: a bench run directory against the simulator (synthetic runs only)
STEP_MODEL = ROOT / "docs" / "capacity" / "cpu-small-1core.json"


def _sample(topology: str, cls: str, arrival: float, e2e: float | None, ttft: float | None,
            *, phase: str = "mixed", status: str = "succeeded", prompt: int | None = 3,
            tokens: int = 8, worker: str | None = "engine@vm", accepted: bool | None = None) -> dict:
    ok = status == "succeeded"
    return {"topology": topology, "phase": phase, "cls": cls, "arrival_s": arrival,
            "sent_s": arrival + 0.001, "max_tokens": 8, "status": status, "ok": ok,
            "accepted": ok if accepted is None else accepted, "finished": ok, "e2e_s": e2e, "ttft_s": ttft,
            "completion_tokens": tokens if ok else None, "prompt_tokens": prompt if ok else None,
            "planned_prompt_tokens": None, "worker": worker if ok else None,
            "http_status": 200 if ok else 429}


def _samples() -> list[dict]:
    out = [_sample("lanes", "short", 0.0, 9.9, 9.9, phase="warmup")]
    for topo in ("lanes", "fleet"):
        out += [_sample(topo, "short", 0.1 * k, 0.2 + 0.01 * k, 0.05 + 0.002 * k)
                for k in range(1, 12)]
        out += [_sample(topo, "long", 0.35, 2.5, 0.9, prompt=400, tokens=6)]
    out.append(_sample("lanes", "long", 0.75, None, None, status="refused"))
    out.append(_sample("fleet", "long", 0.75, 2.0, 0.7, prompt=420))
    return out


def _bench_report(samples: list[dict], config: dict) -> dict:
    """report.json as tailguard/bench/report.py writes a run's phases and totals."""
    from tailguard.bench.comparison import targets, topology_rows
    from tailguard.bench.loadgen import Sample
    from tailguard.bench.report import phase_stats, phase_totals, slos

    topologies, rows = {}, {}
    short_slo, long_slo = targets(*slos({}))
    for topo in dict.fromkeys(s["topology"] for s in samples):
        mine = [Sample.from_dict(s) for s in samples
                if s["topology"] == topo and s["phase"] == "mixed"]
        topologies[topo] = {"phases": {"mixed": phase_stats(mine, ["short", "long"])},
                            "totals": {"mixed": phase_totals(mine, "short", *slos({}))}}
        rows[topo] = topology_rows(mine, ["short", "long"], {"short": short_slo, "long": long_slo},
                                   None, None, None)
    return {"config": config, "topologies": topologies, "peers": {"phase": "mixed", "rows": rows}}


def _run_dir(tmp_path: Path, samples: list[dict], config: dict | None = None) -> Path:
    d = tmp_path / "run1"
    d.mkdir()
    (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (d / "report.json").write_text(json.dumps(_bench_report(samples, config or {"engines": 2})))
    return d


def test_measured_figures_are_the_bench_reports():
    """The measured figures are report.py's own (so those of the run's report.md)."""
    from tailguard.bench.loadgen import Sample
    from tailguard.bench.report import class_stats, phase_totals, slos

    report = _bench_report(_samples(), {"engines": 2})
    for topo in ("lanes", "fleet"):
        mine = [s for s in _samples() if s["topology"] == topo and s["phase"] == "mixed"]
        bench = [Sample.from_dict(s) for s in mine]
        short = class_stats([s for s in bench if s.cls == "short"])
        long_ = class_stats([s for s in bench if s.cls == "long"])
        assert measured(report, topo) == {
            "short_e2e_p99": short["e2e_s"]["p99"], "short_ttft_p99": short["ttft_s"]["p99"],
            "long_ttft_p99": long_["ttft_s"]["p99"],
            "output_tok_s": phase_totals(bench, "short", *slos({}))["output_tok_s"],
            # every short one meets ttft:1000,e2el:4000; of the long ones (tpot:200) only the
            # fleet's at 0.75 s (0.19 s per token; the other 0.32 s)
            "short_within": 11, "long_within": {"lanes": 0, "fleet": 1}[topo]}


def test_a_refused_request_is_not_replayed():
    """It never reached an engine (the simulator models no admission): left out, and counted."""
    samples = _samples()
    phase = [s for s in samples if s["phase"] == "mixed"]
    lanes = [s for s in phase if s["topology"] == "lanes"]
    arrivals, guessed = replay_arrivals(lanes, phase)
    assert len(lanes) == 13 and len(arrivals) == 12 and guessed == 0
    assert not any(t == 0.75 for t, *_ in arrivals)  # the refused long request
    assert arrivals == sorted(arrivals) and arrivals[0] == (0.1, "short", 3, 8)
    fleet, _ = replay_arrivals([s for s in phase if s["topology"] == "fleet"], phase)
    assert (0.75, "long", 420, 8) in fleet  # the fleet accepted the same arrival


def test_an_accepted_request_without_a_count_takes_another_topologys():
    """One that failed after its API took it did load its engine: replayed, its prompt's length
    the same arrival's count in the fleet."""
    samples = _samples()
    phase = [s for s in samples if s["phase"] == "mixed"]
    failed = _sample("lanes", "long", 0.75, None, None, status="failed", accepted=True)
    lanes = [s for s in phase if s["topology"] == "lanes" and s["status"] != "refused"]
    arrivals, guessed = replay_arrivals([*lanes, failed], phase)
    assert len(arrivals) == 13 and guessed == 1 and (0.75, "long", 420, 8) in arrivals


def test_bench_topologies_map_to_the_compare_setups():
    assert setup_for("lanes") == "fleet" and setup_for("fleet") == "router"
    assert setup_for("direct-tuned-1024-256") is None and setup_for("direct-tuned") is None
    with pytest.raises(ValueError, match="'lanse' is not one tailguard bench runs"):
        setup_for("lanse")


def test_a_row_renders_each_figure_predicted_measured_and_its_error():
    row = {"run": "d1", "topology": "fleet", "setup": "router", "sent": 251, "refused": 2,
           "why_not": None, "split": ([129, 122], [131, 120]),
           "figures": {"short_e2e_p99": (1.2, 1.0, 0.2), "short_ttft_p99": (0.5, 0.4, 0.25),
                       "long_ttft_p99": (None, None, None), "output_tok_s": (90.0, 100.0, -0.1),
                       "short_within": (189, 129, 189 / 129 - 1), "long_within": (51, 50, 0.02)}}
    assert render_row(row) == ("| d1 | fleet -> router | 251 | 2 | 1.200 / 1.000 s (+20%) "
                               "| 0.500 / 0.400 s (+25%) | - / - s (-) | 90.0 / 100.0 (-10%) "
                               "| 189 / 129 (+47%) | 51 / 50 (+2%) | 129/122 / 131/120 |")
    assert runs_summary([row]) == ("within 20%: short e2e P99 1 of 1, short TTFT P99 0 of 1, "
                                   "long TTFT P99 0 of 0, output tok/s 1 of 1, "
                                   "short within target 0 of 1, long within target 1 of 1")
    tuned = {**row, "topology": "direct-tuned-1024-256", "setup": None, "why_not": "two cores"}
    assert "| not modelled: two cores |" in render_row(tuned)


def test_a_synthetic_run_is_simulated_on_its_setups(tmp_path):
    samples = _samples() + [_sample("direct-tuned-1024-256", "short", 0.1, 0.3, 0.1)]
    rows = run_rows(_run_dir(tmp_path, samples), StepModel.load(STEP_MODEL))
    by = {r["topology"]: r for r in rows}
    assert by["lanes"]["setup"] == "fleet" and by["fleet"]["setup"] == "router"
    assert by["lanes"]["refused"] == 1 and by["lanes"]["lanes_file"].endswith("lanes-cpu.toml")
    assert by["lanes"]["replayed"] == sum(by["lanes"]["split"][0]) == 12  # not the refused one
    assert by["lanes"]["split"][1] == [12] and by["fleet"]["replayed"] == 13
    assert not by["lanes"]["frontend"] and by["lanes"]["frontend_cap"] == 0  # no frontend_cores
    assert by["direct-tuned-1024-256"]["why_not"].startswith("one engine on two cores")
    assert all(by[t]["figures"]["short_e2e_p99"][0] for t in ("lanes", "fleet"))
    # within target: the simulation's count of each class against the report's
    for t in ("lanes", "fleet"):
        predicted, measured, _ = by[t]["figures"]["short_within"]
        assert 0 <= predicted <= by[t]["replayed"] and measured == 11  # every short one


@pytest.mark.parametrize("samples, message", [
    (None, "no samples.jsonl (not a finished tailguard bench run)"),
    ([_sample("lanse", "short", 0.1, 0.3, 0.1)], "'lanse' is not one tailguard bench runs"),
    ([_sample("lanes", "short", 0.1, 0.3, 0.1), {**_sample("lanes", "short", 0.1, 0.3, 0.1),
                                                 "round": 2}], "a topology ran more than once"),
])
def test_a_missing_file_or_an_unknown_topology_is_a_clear_error(tmp_path, samples, message):
    d = _run_dir(tmp_path, samples or [])
    if samples is None:
        (d / "samples.jsonl").unlink()
    result = CliRunner().invoke(plan, ["--step-model", str(STEP_MODEL), "--validate-runs", str(d)])
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_run_directories_go_with_validate_runs(tmp_path):
    result = CliRunner().invoke(plan, ["--step-model", str(STEP_MODEL), str(tmp_path)])
    assert result.exit_code == 2 and "go with --validate-runs" in result.output


# -- the front end's core (report.json's frontend_cores and engine_slots)
CPU_TABLE = load_lanes(ROOT / "tailguard" / "lanes" / "lanes-cpu.toml")
#: a front end costly enough to take a good share of its core
FRONTED = StepModel(a_s=0.005, decode_s=0.0003, prefill_s=0.0002, context_s=1e-6,
                    frontend_s_per_request=0.015, frontend_s_per_token=0.0005)


def _report(frontend_cores: list[int] | None = None, gpus: bool = False) -> dict:
    def engine(name: str, core: int) -> dict:
        return {"name": name, "lanes": [], "gpus": [core] if gpus else [],
                "cores": [] if gpus else [core]}

    return {"config": {"engines": 2, "frontend_cores": frontend_cores},
            "topologies": {
                "lanes": {"engines": [engine("engine", 0), engine("engine-2", 1)],
                          "engine_slots": {"engine": 8, "engine-2": 3}},
                "fleet": {"engines": [engine("replica-0", 0), engine("replica-1", 1)],
                          "engine_slots": {"replica-0": 8, "replica-1": 8}}}}


def test_the_front_end_shares_the_engine_on_its_cores_and_only_the_lanes_cut_it():
    assert frontend_of(_report([1]), "lanes", "fleet") == (True, 3)  # engine-2's cut slots
    assert frontend_of(_report([1]), "fleet", "router") == (True, 0)  # router + API servers
    assert frontend_of(_report(None), "lanes", "fleet") == (False, 0)
    assert frontend_of(_report([1], gpus=True), "lanes", "fleet") == (False, 0)  # own cores
    assert frontend_of(_report([5]), "fleet", "router") == (False, 0)


def _steady(seconds: int = 40) -> list[tuple[float, str, int, int]]:
    """Four short requests a second and a long one every two: both engines busy."""
    return sorted([(k / 4, "short", 20, 64) for k in range(4 * seconds)]
                  + [(k / 2 + 0.1, "long", 1200, 128) for k in range(seconds // 2)])


def test_a_front_end_engine_with_a_cap_changes_the_per_engine_split():
    """compare's setups place no front end by default (GPUs); placed and capped as the bench
    runs it, the engine beside it takes fewer requests, and the cap alone does nothing without
    a front end engine."""
    arrivals = _steady()

    def sim(**kw):
        return compare.simulation("fleet", arrivals, CPU_TABLE, FRONTED, 2, **kw)

    plain = sim()
    assert [r.where.name for r in sim(frontend_cap=3).done] == [r.where.name for r in plain.done]
    assert compare.run("fleet", arrivals, CPU_TABLE, FRONTED, 2) == compare.row(
        plain, "fleet", 2, FRONTED)

    def split(s) -> dict[str, int]:
        return {name: sum(r.where.name == name for r in s.done) for name in ("worker", "worker-2")}

    uncut, cut = sim(frontend=True), sim(frontend=True, frontend_cap=3)
    assert split(uncut) == split(plain)  # the slowdown alone: the turns even out
    assert engine_split(cut) != engine_split(uncut)
    assert split(cut)["worker-2"] < split(uncut)["worker-2"] and split(cut)["worker"] > split(
        uncut)["worker"]
    assert sum(split(cut).values()) == len(arrivals)
    _, groups = compare.setup("router", CPU_TABLE, 2, arrivals, frontend=True)
    assert groups[-1].frontend and not compare.setup("router", CPU_TABLE, 2, arrivals)[1][-1].frontend


def test_a_run_on_a_cpu_host_places_the_front_end_as_it_ran(tmp_path):
    d = _run_dir(tmp_path, _samples())
    report = {**_report([1]), "config": {"engines": 2, "frontend_cores": [1]}}
    (d / "report.json").write_text(json.dumps(report))
    by = {r["topology"]: r for r in run_rows(d, StepModel.load(STEP_MODEL))}
    assert (by["lanes"]["frontend"], by["lanes"]["frontend_cap"]) == (True, 3)
    assert (by["fleet"]["frontend"], by["fleet"]["frontend_cap"]) == (True, 0)
