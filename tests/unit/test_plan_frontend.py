"""tailguard plan's front end: its CPU cost fitted from bench phases, and the engine on its core
slowed by the share it takes (tailguard/plan/sim.py, "Front end")."""

import dataclasses
import json

import pytest

from tailguard.lanes.table import default_lanes_path, load_lanes
from tailguard.plan.search import topology
from tailguard.plan.sim import MAX_FRONTEND_SHARE, EngineGroup, simulate
from tailguard.plan.stepmodel import StepModel, fit_frontend, frontend_points
from tailguard.plan.validate import MEASURED, predict
from tailguard.plan.workload import ClassLoad, Lengths

TABLE = load_lanes(default_lanes_path())
LANES = list(TABLE)
CPU = StepModel(a_s=0.004, decode_s=0.0003, prefill_s=0.00025, context_s=1e-6)
SHORT = ClassLoad("short", 0.0, Lengths.fixed(3), Lengths.fixed(64))
LONG = ClassLoad("long", 0.0, Lengths.fixed(2000), Lengths.fixed(512))


def arrivals(seconds: int, per_s: int) -> list[tuple[float, str, int, int]]:
    """`per_s` short requests a second, evenly, for `seconds`; 8 long ones at once at 5 s (the
    front end's window full by then), done well within it."""
    return ([(i / per_s, "short", 3, 64) for i in range(per_s * seconds)]
            + [(5.0, "long", 2000, 512) for _ in range(8)])


def run(model: StepModel, front: str | None, seconds: int = 60, per_s: int = 10) -> dict:
    """The short lane's engine, then the long lane's; `front` names the one on the front end's
    core."""
    gs = [EngineGroup(("short",), 1, 16, frontend=front == "short"),
          EngineGroup(("long", "batch"), 1, 8, frontend=front == "long")]
    res = simulate([SHORT, LONG], LANES, gs, model, duration_s=seconds,
                   arrivals=arrivals(seconds, per_s))
    return {k: v.to_dict() for k, v in res.items()}


def test_zero_coefficients_change_nothing():
    plain = run(CPU, None)
    assert run(CPU, "long") == plain == run(CPU, "short")
    costly = dataclasses.replace(CPU, frontend_s_per_request=0.03, frontend_s_per_token=1e-4)
    assert run(costly, None) == plain  # no engine on the front end's core


def test_the_engine_on_the_front_end_core_loses_the_front_ends_share():
    """10 requests a second at 30 ms of front-end CPU each: 30% of the core. The long engine
    there does its work 1 / 0.7 times as slowly; the short engine's results are untouched."""
    plain = run(CPU, None)
    fronted = run(dataclasses.replace(CPU, frontend_s_per_request=0.03), "long")
    assert fronted["short"] == plain["short"]
    assert fronted["long"]["tokens_per_s"] == pytest.approx(
        plain["long"]["tokens_per_s"] * (1 - 0.3), rel=0.02)


def test_the_front_end_on_the_short_engines_core_slows_the_short_engine_only():
    plain = run(CPU, None)
    fronted = run(dataclasses.replace(CPU, frontend_s_per_request=0.03), "short")
    assert fronted["long"] == plain["long"]
    assert fronted["short"]["e2e"]["p50"] > plain["short"]["e2e"]["p50"] * 1.3


def test_output_tokens_cost_the_front_end_too():
    """Tokens of either engine count: the long engine alone is slowed by what the short
    engine's tokens cost."""
    plain = run(CPU, None)
    fronted = run(dataclasses.replace(CPU, frontend_s_per_token=1e-3), "long")
    assert fronted["short"] == plain["short"]
    assert fronted["long"]["tokens_per_s"] < plain["long"]["tokens_per_s"] * 0.8


def test_the_front_end_never_takes_the_whole_core():
    """The nice-10 engine keeps the kernel's share of a busy core (MAX_FRONTEND_SHARE)."""
    swamped = run(dataclasses.replace(CPU, frontend_s_per_request=2.0), "long", 200, per_s=1)
    plain = run(CPU, None, 200, per_s=1)
    assert swamped["long"]["statuses"] == {"succeeded": 8}
    assert swamped["long"]["tokens_per_s"] == pytest.approx(
        plain["long"]["tokens_per_s"] * (1 - MAX_FRONTEND_SHARE), rel=0.02)


def test_fit_frontend_recovers_the_costs_from_two_phases_and_more():
    per_request, per_token = 0.02, 4e-4
    phases = [(200, 12800), (251, 38912), (200, 12800), (251, 38912)]
    points = [(n, t, per_request * n + per_token * t) for n, t in phases]
    assert fit_frontend(points[:2]) == pytest.approx((per_request, per_token))
    assert fit_frontend(points) == pytest.approx((per_request, per_token))


def test_fit_frontend_needs_two_mixes_and_stays_at_or_above_zero():
    with pytest.raises(ValueError):
        fit_frontend([(100, 6400, 5.0), (200, 12800, 10.0)])  # one mix, twice as much
    # more tokens with less CPU: no positive per-token cost; requests alone fit best
    assert fit_frontend([(100, 1000, 10.0), (100, 5000, 9.0)]) == pytest.approx((0.095, 0.0))


def test_frontend_points_read_a_reports_phases():
    phase = {"count": 200, "output_tokens": 12800}
    report = {"topologies": {
        "shared": {"phases": {"baseline": {"short": phase},
                              "mixed": {"short": phase, "long": {"count": 51, "output_tokens": 26112}}},
                   "host": {"baseline": {"frontend_cpu_s": 10.0}, "mixed": {"frontend_cpu_s": 20.5}}},
        "old": {"phases": {"baseline": {"short": phase}}, "host": {"baseline": {"wall_s": 9.0}}},
        # plain vLLM's server: its front end is not ours to fit
        "direct": {"server": "python -m vllm.entrypoints.openai.api_server",
                   "phases": {"baseline": {"short": phase}},
                   "host": {"baseline": {"frontend_cpu_s": 5.5}}}}}
    assert frontend_points(report) == [("shared/baseline", (200, 12800, 10.0)),
                                       ("shared/mixed", (251, 38912, 20.5))]


def test_old_step_model_files_load_without_a_front_end():
    old = {k: v for k, v in CPU.to_dict().items() if not k.startswith("frontend_")}
    m = StepModel.from_dict(old)
    assert (m.frontend_s_per_request, m.frontend_s_per_token) == (0.0, 0.0)


@pytest.mark.parametrize("name", ["lanes", "shared"])
def test_topology_puts_the_front_end_on_the_last_group(name):
    assert not any(g.frontend for g in topology(TABLE, name, count=2)[1])
    gs = topology(TABLE, name, count=2, frontend=True)[1]
    assert [g.frontend for g in gs] == [False] * (len(gs) - 1) + [True]


def test_runs_before_the_core_plan_are_simulated_without_the_front_end():
    run_ = next(r for r in MEASURED if not r.frontend_core)
    costly = dataclasses.replace(CPU, frontend_s_per_request=0.03, frontend_s_per_token=1e-4)
    assert predict(run_, costly, "lanes") == predict(run_, CPU, "lanes")


def test_plan_frontend_from_writes_the_fit_into_the_step_model(tmp_path):
    import json

    from click.testing import CliRunner

    from tailguard.cli import main

    def phase(short, long, cpu):
        return ({"short": {"count": short, "output_tokens": 64 * short},
                 **({"long": {"count": long, "output_tokens": 512 * long}} if long else {})},
                {"frontend_cpu_s": cpu})
    phases = {"baseline": phase(200, 0, 0.02 * 200 + 4e-4 * 12800),
              "mixed": phase(200, 51, 0.02 * 251 + 4e-4 * 38912)}
    report = {"topologies": {"lanes": {"phases": {k: v[0] for k, v in phases.items()},
                                       "host": {k: v[1] for k, v in phases.items()}}}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    CPU.save(tmp_path / "step.json")
    result = CliRunner().invoke(main, ["plan", "--step-model", str(tmp_path / "step.json"),
                                       "--frontend-from", str(tmp_path / "report.json")])
    assert result.exit_code == 0, result.output
    m = StepModel.load(tmp_path / "step.json")
    assert (m.frontend_s_per_request, m.frontend_s_per_token) == pytest.approx((0.02, 4e-4))
    assert (m.a_s, m.source["frontend_points"]["lanes/mixed"][:2]) == (CPU.a_s, [251, 38912])


def test_plan_by_key_runs_the_fair_order_and_checks_its_weights(tmp_path):
    from click.testing import CliRunner

    from tailguard.cli import main

    CPU.save(tmp_path / "step.json")
    base = ["plan", "--step-model", str(tmp_path / "step.json"), "--class", "team-a:1:30:32",
            "--class", "team-b:6:30:32", "--split", "1,1", "--duration", "30", "--json"]
    ok = CliRunner().invoke(main, [*base, "--by-key", "--weight", "team-a=2"])
    assert ok.exit_code == 0, ok.output
    assert {"team-a", "team-b"} <= set(json.loads(ok.output)["classes"])
    for bad, says in ((["--weight", "team-a=2"], "--weight needs --by-key"),
                      (["--by-key", "--weight", "nobody=2"], "CLASS=W"),
                      (["--by-key", "--weight", "team-a=0"], "CLASS=W")):
        result = CliRunner().invoke(main, [*base, *bad])
        assert result.exit_code == 2 and says in result.output, result.output
