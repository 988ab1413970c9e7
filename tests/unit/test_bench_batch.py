"""The batch benchmark's pure parts: its file, its progress arithmetic, the idle share of the
batch lane's workers, its figures and report lines."""

import json

import pytest

from tailguard.batches.lines import parse_input
from tailguard.bench.batch_load import (
    Progress,
    batch_file,
    completed_at,
    figures,
    idle_slot_share,
    lines_per_s,
)
from tailguard.bench.loadgen import Sample
from tailguard.bench.report import BATCH_P99_MAX, build_report, render_text
from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.bench.workload import BATCH, LONG, SHORT, WITH_BATCH, batch_workload


def test_the_batch_file_is_one_the_batch_api_takes_each_line_exactly_its_tokens():
    data = batch_file(250, "Hello", 64, "m")
    lines, errors = parse_input(data, "/v1/completions", max_lines=50_000, max_bytes=1 << 20)
    assert errors == [] and len(lines) == 250
    assert len({x.custom_id for x in lines}) == 250
    assert lines[0].body == {"model": "m", "prompt": "Hello", "max_tokens": 64, "ignore_eos": True}


def progress(*points, status="in_progress"):
    return Progress(points=list(points), status=status)


def test_lines_done_are_interpolated_between_reads():
    p = progress((10.0, 0), (12.0, 10), (14.0, 30))
    assert completed_at(p, 11.0) == 5 and completed_at(p, 13.5) == 25
    assert completed_at(p, 9.0) is None and completed_at(p, 15.0) is None  # not read yet
    assert lines_per_s(p, 11.0, 13.0) == pytest.approx(7.5)  # 5 -> 20 in 2 s
    assert lines_per_s(p, 11.0, 20.0) is None and lines_per_s(p, 13.0, 11.0) is None
    ended = progress((10.0, 0), (12.0, 100), status="completed")
    assert completed_at(ended, 30.0) == 100  # a batch that ended stays at its count
    assert lines_per_s(ended, 10.0, 20.0) == pytest.approx(10.0)


def ran(lane, sent, queued, e2e):
    return Sample(lane, 64, sent, sent_s=sent, queued_s=queued, e2e_s=e2e, lane=lane, ok=True)


def test_the_idle_slot_share_is_none_while_a_job_is_queued_else_the_free_slots():
    # 2 slots, a 100 s phase: a long job runs 0-40; a second is queued 10-40, runs 40-60
    samples = [ran(LONG, 0.0, 0.0, 40.0), ran(LONG, 10.0, 30.0, 50.0),
               ran(SHORT, 0.0, 50.0, 100.0),  # another lane: not counted
               Sample(LONG, 64, 70.0, sent_s=70.0, lane=LONG)]  # never ended: no span
    # 0-10: 1 of 2 free (10 slot-s); 10-40: queued (0); 40-60: 1 free (20); 60-100: 2 free (80)
    assert idle_slot_share(samples, [LONG], 2, 0.0, 100.0) == pytest.approx(110 / 200)
    assert idle_slot_share(samples, ["batch"], 2, 0.0, 100.0) == 1.0
    assert idle_slot_share(samples, [LONG], 2, 50.0, 100.0) == pytest.approx(90 / 100)
    assert idle_slot_share([ran(LONG, 0.0, 0.0, 500.0)], [LONG], 1, 0.0, 100.0) == 0.0
    assert idle_slot_share(samples, [LONG], 2, 10.0, 10.0) == 0.0


def test_figures_are_ratios_of_what_was_measured():
    f = figures(short_p99_alone=0.5, short_p99_with=0.55, capacity_tok_s=400.0, idle=0.5,
                with_load_tok_s=150.0, lines=1000, tokens_per_line=64)
    assert f["short_p99_ratio"] == pytest.approx(1.1)
    assert f["idle_capacity_tok_s"] == 200.0 and f["share_of_idle"] == pytest.approx(0.75)
    f = figures(short_p99_alone=None, short_p99_with=0.5, capacity_tok_s=None, idle=0.0,
                with_load_tok_s=None, lines=1000, tokens_per_line=64)
    assert f["short_p99_ratio"] is None and f["share_of_idle"] is None
    f = figures(short_p99_alone=0.5, short_p99_with=0.5, capacity_tok_s=100.0, idle=0.0,
                with_load_tok_s=50.0, lines=1000, tokens_per_line=64)
    assert f["idle_capacity_tok_s"] == 0.0 and f["share_of_idle"] is None  # nothing left idle


def test_the_workload_is_the_mixed_load_twice_without_then_with_the_batch():
    wl = batch_workload(2.5, 0.2, 60.0, 1, lines=1000, line_tokens=32)
    assert wl.name == BATCH and wl.classes == [SHORT, LONG]
    assert wl.params["batch_lines"] == 1000 and wl.params["batch_line_tokens"] == 32
    phases = phases_of(wl, baseline=True)
    assert list(phases) == ["mixed", WITH_BATCH]
    assert phases["mixed"].requests == phases[WITH_BATCH].requests  # paired
    cfg = BenchConfig(workload=BATCH, duration_s=60.0, seed=1, batch_lines=1000, batch_tokens=32)
    assert build_workload(cfg, None).requests == wl.requests
    with pytest.raises(ValueError):
        batch_workload(2.5, 0.2, 60.0, lines=0, line_tokens=32)


def done(sent, e2e, cls=SHORT):
    return Sample(cls, 64, sent, sent_s=sent, status="succeeded", ok=True, accepted=True,
                  finished=True, job_id=f"j{cls}{sent}", lane=cls, e2e_s=e2e, ttft_s=0.05,
                  completion_tokens=64)


def batch_run(with_p99, share):
    alone = [done(i, 0.5) for i in range(20)] + [done(1, 20.0, LONG)]
    beside = [done(i, 0.5) for i in range(19)] + [done(19, with_p99)] + [done(1, 20.0, LONG)]
    info = {"batch": {**figures(short_p99_alone=0.5, short_p99_with=with_p99,
                                capacity_tok_s=400.0, idle=0.5,
                                with_load_tok_s=200.0 * share,
                                lines=1000, tokens_per_line=64),
                      "batch_lane": "batch", "shared_lanes": ["long"], "slots": 8,
                      "probe_s": 30.0,
                      "lines_done_with_load": 300, "status_after_cancel": "cancelled"}}
    wl = batch_workload(2.5, 0.2, 60.0, lines=1000, line_tokens=64)
    samples = {"lanes": {"mixed": alone, WITH_BATCH: beside}}
    return build_report(
        config={"metric": "e2e_s", "model_label": "m", "engines": 2, "cores_per_engine": "1 core"},
        workload={"name": BATCH, "classes": [SHORT, LONG], "short_class": SHORT,
                  "long_class": LONG, "params": wl.params},
        topologies={"lanes": info}, samples=samples), samples


def statuses(report):
    return {t["name"]: t["status"] for t in report["targets"]}


def test_batch_lines_pass_and_fail_on_their_targets():
    r, _ = batch_run(0.5 * BATCH_P99_MAX * 0.99, 0.8)
    s = statuses(r)
    assert (s["batch_capacity_lanes"], s["batch_short_p99_lanes"], s["batch_share_lanes"]) == \
        ("INFO", "PASS", "PASS")
    lines = {t["name"]: t["line"] for t in r["targets"]}
    assert "80.0% of the capacity left idle" in lines["batch_share_lanes"]
    assert "left 50.0% of their 8 slots' time to the batch lane (no long job queued, slots not " \
        "running one): 200.0 tok/s left idle" in lines["batch_capacity_lanes"]
    text = render_text(r)
    assert "| lanes | with_batch | short |" in text and "lanes / shared" not in text
    json.dumps(r)
    s = statuses(batch_run(0.5 * BATCH_P99_MAX * 1.01, 0.6)[0])
    assert (s["batch_short_p99_lanes"], s["batch_share_lanes"]) == ("FAIL", "FAIL")


def test_batch_picture(tmp_path):
    pytest.importorskip("matplotlib")
    from tailguard.bench.plot import make_plot

    assert make_plot(*batch_run(0.5, 0.8), tmp_path / "b.png").stat().st_size > 0
