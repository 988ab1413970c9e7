"""How long a job's writer batches its text (tailguard.jobs.stream.flush_interval): pure."""

import pytest

from tailguard.jobs.stream import flush_interval


@pytest.mark.parametrize("running, expected", [(1, 0.05), (5, 0.05), (8, 0.08), (16, 0.16)])
def test_the_batch_stretches_once_the_running_jobs_would_write_more_than_the_budget(
        running, expected):
    assert flush_interval(running, 0.05, 100.0) == pytest.approx(expected)
    # the budget holds: running jobs x entries per job per second
    assert running / flush_interval(running, 0.05, 100.0) <= 100.0 + 1e-9


def test_no_budget_never_stretches():
    assert flush_interval(500, 0.05, 0) == 0.05
