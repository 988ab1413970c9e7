"""How long a job's writer batches its text (tailguard.jobs.stream.flush_interval): pure."""

import pytest

from tailguard.jobs.stream import flush_interval, writes_per_s_for


@pytest.mark.parametrize("running, expected", [(1, 0.05), (5, 0.05), (8, 0.08), (16, 0.16)])
def test_the_batch_stretches_once_the_running_jobs_would_write_more_than_the_budget(
        running, expected):
    assert flush_interval(running, 0.05, 100.0) == pytest.approx(expected)
    # the budget holds: running jobs x entries per job per second
    assert running / flush_interval(running, 0.05, 100.0) <= 100.0 + 1e-9


def test_no_budget_never_stretches():
    assert flush_interval(500, 0.05, 0) == 0.05


def test_the_default_budget_is_the_host_kinds():
    # a CPU host's engines share the cores with the front end; a GPU host's do not
    assert writes_per_s_for("cpu", None) == 40.0
    assert writes_per_s_for("cuda", None) == 320.0
    assert writes_per_s_for("cuda", 10.0) == writes_per_s_for("cpu", 10.0) == 10.0
    assert writes_per_s_for("cuda", 0.0) == 0.0  # 0 is "never stretched", not "unset"


def test_on_a_gpu_host_the_shipped_lanes_batches_keep_the_base_interval():
    from tailguard.lanes.table import default_lanes_path, load_lanes

    table = load_lanes(default_lanes_path())
    for lane in table:
        running = lane.max_num_seqs
        assert flush_interval(running, 0.05, writes_per_s_for("cuda", None)) == 0.05, lane.name
    # on a CPU host the short lane's full batch stretches every stream to 0.4 s
    assert flush_interval(16, 0.05, writes_per_s_for("cpu", None)) == pytest.approx(0.4)
