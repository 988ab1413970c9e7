"""tailguard plan: the step model fit, the workload sources and the simulator, on pure inputs."""

import json
import random

import pytest

from tailguard.lanes.table import Lane, default_lanes_path, load_lanes
from tailguard.plan.search import Targets, least_engines, split_fleet
from tailguard.plan.sim import EngineGroup, simulate
from tailguard.plan.stepmodel import StepModel, fit, fit_line
from tailguard.plan.workload import ClassLoad, Lengths, from_stats, from_trace, parse_class

TABLE = load_lanes(default_lanes_path())
CPU = StepModel(a_s=0.004, decode_s=0.0003, prefill_s=0.00025)


def one_lane(**kw) -> Lane:
    return Lane(name="only", max_tokens=100000, deadline_s=1e9, queue_ttl_s=1e9,
                max_model_len=1 << 20, **kw)


def test_fit_recovers_the_coefficients():
    a, b, c, d = 0.005, 0.0004, 0.0002, 1e-6
    m = fit([(n, a + b * n) for n in (1, 2, 4, 8, 16)],
            [(p, a + b + c * p) for p in (128, 512, 2000)],
            [(n, n * 2000, a + b * n + d * n * 2000) for n in (1, 4, 8)])
    assert (m.a_s, m.decode_s, m.prefill_s, m.context_s) == pytest.approx((a, b, c, d))
    assert m.source["prefill_intercept_s"] == pytest.approx(a + b)


def test_fit_line_needs_two_distinct_x():
    with pytest.raises(ValueError):
        fit_line([1, 1], [2, 3])


def test_step_model_round_trips_through_json(tmp_path):
    CPU.save(tmp_path / "m.json")
    assert StepModel.load(tmp_path / "m.json") == CPU


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8])
def test_one_slot_one_token_is_m_d_1(rho):
    """Service D = one step; the mean wait of M/D/1 is rho*D / (2(1-rho))."""
    d = 1.0
    model = StepModel(a_s=d, decode_s=0.0, prefill_s=0.0)
    cls = ClassLoad("c", rho / d, Lengths.fixed(1), Lengths.fixed(1))
    r = simulate([cls], [one_lane(max_num_seqs=1)], [EngineGroup(("only",), 1, 1)], model,
                 duration_s=40000, seed=1)["c"]
    expected = rho * d / (2 * (1 - rho)) + d
    assert r.e2e["avg"] == pytest.approx(expected, rel=0.08)


def test_batching_reduces_wait():
    model = StepModel(a_s=0.01, decode_s=0.0005, prefill_s=0.0)
    cls = ClassLoad("c", 4.0, Lengths.fixed(1), Lengths.fixed(32))  # 4/s x 0.33 s alone
    p99 = {}
    for slots in (1, 8):
        r = simulate([cls], [one_lane(max_num_seqs=slots)], [EngineGroup(("only",), 1, slots)],
                     model, duration_s=600)["c"]
        p99[slots] = r.e2e["p99"]
        assert r.max_running <= slots
    assert p99[8] < p99[1] / 3


@pytest.mark.parametrize("spec,lane,tokens_each", [
    ("s:1:3:64", "short", 64),  # cost 67 <= 1024: short, as asked
    ("l:1:2000:512", "long", 512),  # cost over 1024: long
    ("x:1:3:5000", "long", 1024),  # over every cap: long, clamped to its 1024
    ("b:1:3:5000:batch", "batch", 1024),  # batch priority, clamped
])
def test_placement_and_caps_are_the_apis(spec, lane, tokens_each):
    cls = parse_class(spec)
    groups = [EngineGroup(("short",), 1, 16), EngineGroup(("long", "batch"), 1, 8)]
    r = simulate([cls], list(TABLE), groups, CPU, duration_s=30)[cls.name]
    assert r.lanes == {lane: r.n}
    assert r.output_tokens == tokens_each * r.n


def test_deadline_and_queue_ttl_end_requests():
    lane = Lane(name="only", max_tokens=1000, deadline_s=0.5, queue_ttl_s=1.0, max_num_seqs=1)
    model = StepModel(a_s=0.01, decode_s=0.0, prefill_s=0.0)  # 1000 tokens: 10 s > deadline
    cls = ClassLoad("c", 5.0, Lengths.fixed(1), Lengths.fixed(1000))
    r = simulate([cls], [lane], [EngineGroup(("only",), 1, 1)], model, duration_s=20)["c"]
    assert set(r.statuses) == {"deadline", "expired"}


def test_long_contexts_slow_decoding():
    """Attention over the KV cache: the same outputs take longer after long prompts."""
    model = StepModel(a_s=0.004, decode_s=0.0003, prefill_s=0.0, context_s=1e-6)
    lane = one_lane(max_num_seqs=8)
    p50 = {}
    for prompt in (10, 4000):
        cls = ClassLoad("c", 1.0, Lengths.fixed(prompt), Lengths.fixed(64))
        p50[prompt] = simulate([cls], [lane], [EngineGroup(("only",), 1, 8)], model,
                               duration_s=60)["c"].e2e["p50"]
    assert p50[4000] > p50[10] * 1.5


def test_lanes_without_an_engine_are_left_out():
    cls = [parse_class("s:2:3:64"), parse_class("l:1:2000:512")]
    r = simulate(cls, list(TABLE), [EngineGroup(("short",), 1, 16)], CPU, duration_s=30)
    assert r["l"].n == 0 and r["s"].n > 0


def test_same_seed_same_result_other_seed_other():
    cls = [parse_class("s:2:3:64"), parse_class("l:0.5:2000:512")]
    groups = [EngineGroup(("short",), 1, 16), EngineGroup(("long", "batch"), 1, 8)]

    def run(seed):
        return {k: v.to_dict() for k, v in simulate(cls, list(TABLE), groups, CPU, duration_s=60,
                                                    seed=seed).items()}
    assert run(3) == run(3)
    assert run(3) != run(4)


def test_least_engines_grows_with_load():
    group = EngineGroup(("long", "batch"), 1, 8)
    targets = Targets({}, max_queue_s=5.0)
    needs = [least_engines([parse_class(f"l:{rate}:2000:512")], list(TABLE), group, CPU, targets,
                           duration_s=120) for rate in (0.2, 1.0, 4.0)]
    assert needs[0] <= needs[1] <= needs[2] and needs[0] < needs[2]


@pytest.mark.parametrize("needed,fleet,split", [
    ([2, 5], 7, [2, 5]),
    ([2, 5], 3, [2, 5]),  # too small: the least that meets the targets
    ([2, 5], 14, [4, 10]),
    ([1, 1, 1], 5, [2, 2, 1]),
])
def test_split_fleet(needed, fleet, split):
    assert split_fleet(needed, fleet) == split


def test_lengths():
    assert Lengths.fixed(7).sample(random.Random(0)) == 7
    d = Lengths.from_values([10, 20, 30])
    rng = random.Random(0)
    assert all(10 <= d.sample(rng) <= 30 for _ in range(100))
    assert d.mean == pytest.approx(20)


@pytest.mark.parametrize("bad", ["s:1:3", "s:x:3:4", "s:1:0:4", "s:1:3:4:urgent"])
def test_parse_class_rejects(bad):
    with pytest.raises(ValueError):
        parse_class(bad)


def test_trace_rates_and_lengths():
    lines = [json.dumps({"prompt": "x" * 40, "max_tokens": 64, "class": "short", "arrival_s": t})
             for t in range(11)]
    lines.append(json.dumps({"prompt": "y", "prompt_tokens": 2000, "max_tokens": 512,
                             "class": "long", "arrival_s": 5}))
    by = {c.name: c for c in from_trace(lines)}
    assert by["short"].rate == pytest.approx(1.1) and by["long"].rate == pytest.approx(0.1)
    assert by["short"].prompt.mean == 10 and by["long"].output == Lengths.fixed(512)
    with pytest.raises(ValueError, match="--rate"):
        from_trace([json.dumps({"prompt": "x", "max_tokens": 1})])


def test_stats_json_classes():
    summary = {"count": 60, "avg": 1, "p50": 10, "p95": 20, "p99": 30, "max": 40}
    stats = {"window": {"start": 0, "end": 60},
             "lanes": {"batch": {"count": 60, "prompt_tokens": summary, "output_tokens": summary},
                       "long": {"count": 0}}}
    [c] = from_stats(stats, TABLE)
    assert (c.name, c.rate, c.priority) == ("batch", 1.0, "batch")


def test_replayed_arrivals_are_the_requests_simulated():
    """--validate replays a bench run's own requests instead of a Poisson draw."""
    cls = ClassLoad("c", 0.0, Lengths.fixed(1), Lengths.fixed(1))
    model = StepModel(a_s=1.0, decode_s=0.0, prefill_s=0.0)
    r = simulate([cls], [one_lane(max_num_seqs=1)], [EngineGroup(("only",), 1, 1)], model,
                 duration_s=10, arrivals=[(0.0, "c", 1, 1), (0.5, "c", 1, 1)])["c"]
    assert r.n == 2 and r.e2e["max"] == pytest.approx(1.5)  # the second waited 0.5 s


def test_a_target_no_engine_count_meets_is_none():
    """A lone 64-token request takes ~0.3 s here: no fleet makes its P99 0.1 s (a big group's
    sample must not shrink to a few lucky requests)."""
    group = EngineGroup(("short",), 1, 16)
    assert least_engines([parse_class("s:2:3:64")], list(TABLE), group, CPU,
                         Targets({"s": 0.1}), duration_s=60) is None
