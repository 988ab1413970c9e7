"""`tailguard plan --validate`'s table: every run's lanes file is kept, and a run marked not
counted is shown but left out of the count within 20%."""

from tailguard.plan.validate import MEASURED, RETIRED_WORKER_FIELDS, RUNS_DIR, run_lanes, summary


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
