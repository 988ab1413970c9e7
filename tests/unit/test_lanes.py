"""The lanes file: defaults load, every bad field is named."""

import tomllib

import pytest

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.lanes.table import default_lanes_path, load_lanes, parse_lanes

GOOD = {
    "lanes": {
        "short": {"max_cost": 100, "max_tokens": 64, "dedicated": True},
        "long": {"max_tokens": 512},
        "batch": {"priority": "batch", "max_tokens": 512, "queue_ttl_s": 3600},
    },
    "workers": [{"name": "short", "lanes": ["short"]}, {"name": "long", "lanes": ["long", "batch"]}],
}


def test_default_file_loads_with_short_long_batch():
    table = load_lanes(default_lanes_path())
    assert table.names == ["short", "long", "batch"]
    assert table["short"].dedicated and table["short"].max_cost is not None
    assert table["batch"].priority == "batch"
    assert table["batch"].queue_ttl_s > table["long"].queue_ttl_s
    assert [w.lanes for w in table.workers] == [("short",), ("long", "batch")]


def test_queue_and_task_names_are_built_from_the_lane_name():
    lane = parse_lanes(GOOD)["long"]
    assert lane.queue == "long"
    assert lane.task_name == "tailguard.generate.long"


def test_default_max_tokens_falls_back_to_min_of_256_and_cap():
    table = parse_lanes(GOOD)
    assert table["short"].effective_default_max_tokens == 64
    assert table["long"].effective_default_max_tokens == 256


def test_a_lane_promises_its_max_wait_else_its_queue_ttl():
    table = load_lanes(default_lanes_path())
    assert table["short"].promised_wait_s == table["short"].max_wait_s < table["short"].queue_ttl_s
    assert table["batch"].max_wait_s is None
    assert table["batch"].promised_wait_s == table["batch"].queue_ttl_s


def _with(path: str, value):
    data = tomllib.loads(default_lanes_path().read_text())
    node = data
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize("path,value,field", [
    ("lanes.short.max_tokens", "many", "lanes.short.max_tokens"),
    ("lanes.short.max_tokens", KeyError, "lanes.short.max_tokens"),
    ("lanes.short.max_tokens", 0, "lanes.short.max_tokens"),
    ("lanes.short.max_tokens", True, "lanes.short.max_tokens"),
    ("lanes.short.priority", "urgent", "lanes.short.priority"),
    ("lanes.short.deadline_s", -1, "lanes.short.deadline_s"),
    ("lanes.short.rate_limit", "fast", "lanes.short.rate_limit"),
    ("lanes.short.max_tokns", 5, "lanes.short.max_tokns"),
    ("lanes.short.default_max_tokens", 100000, "lanes.short.default_max_tokens"),
    ("lanes.short.dedicated", "yes", "lanes.short.dedicated"),
    ("lanes.short.max_backlog_tokens", 0, "lanes.short.max_backlog_tokens"),
    ("lanes.short.max_backlog_tokens", 1.5, "lanes.short.max_backlog_tokens"),
    ("lanes.short.max_backlog_tokens", 100, "lanes.short.max_backlog_tokens"),  # < max_model_len
    ("lanes.short.max_wait_s", -1, "lanes.short.max_wait_s"),
    ("lanes.short.max_wait_s", 61, "lanes.short.max_wait_s"),  # > queue_ttl_s
])
def test_bad_lane_field_is_named(path, value, field):
    with pytest.raises(ConfigError) as err:
        parse_lanes(_with(path, value))
    assert err.value.field == field
    assert field.split(".")[-1] in err.value.message


def test_bad_lane_name_is_rejected():
    with pytest.raises(ConfigError, match="lane name"):
        parse_lanes({"lanes": {"Short Lane": {"max_tokens": 1}}})


def test_worker_serving_a_dedicated_lane_serves_nothing_else():
    data = {**GOOD, "workers": [{"lanes": ["short", "long"]}, {"lanes": ["batch"]}]}
    with pytest.raises(ConfigError, match="dedicated") as err:
        parse_lanes(data)
    assert err.value.field == "workers"


def test_every_lane_needs_a_worker():
    data = {**GOOD, "workers": [{"lanes": ["short"]}, {"lanes": ["long"]}]}
    with pytest.raises(ConfigError, match="batch"):
        parse_lanes(data)


def test_worker_with_unknown_lane():
    data = {**GOOD, "workers": [{"lanes": ["short"]}, {"lanes": ["long", "batch", "bulk"]}]}
    with pytest.raises(ConfigError, match="bulk") as err:
        parse_lanes(data)
    assert err.value.field == "workers[1].lanes"


def test_no_workers_table_means_one_worker_per_lane():
    data = {"lanes": GOOD["lanes"]}
    assert [w.lanes for w in parse_lanes(data).workers] == [("short",), ("long",), ("batch",)]


def test_unknown_top_level_key():
    with pytest.raises(ConfigError, match="lane"):
        parse_lanes({**GOOD, "lane": {}})


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "lanes.toml"
    bad.write_text("[lanes.short]\nmax_tokens = 'x'\n")
    with pytest.raises(ConfigError, match=str(bad)):
        load_lanes(bad)
    bad.write_text("not toml [")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_lanes(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_lanes(tmp_path / "missing.toml")


def test_worker_for_lane_and_queues():
    table = parse_lanes(GOOD)
    assert table.worker_for_lane("long").lanes == ("long", "batch")
    assert table.worker_for_lane("batch").lanes == ("long", "batch")
    assert [l.name for l in table.lanes_for_queues(["long", "batch"])] == ["long", "batch"]
    with pytest.raises(ConfigError, match="celery"):
        table.lanes_for_queues(["celery"])


def test_visibility_covers_longest_wait_plus_deadline():
    table = parse_lanes(GOOD)
    assert table.max_visibility_s == 3600 + 60


def test_job_ttl_must_outlive_every_lane():
    from tailguard.lanes.table import check_job_ttl

    table = load_lanes(default_lanes_path())
    check_job_ttl(table, settings.JOB_TTL_S.default, settings.WORKER_LOST_GRACE_S.default)
    with pytest.raises(ConfigError, match="lane 'batch'") as err:
        check_job_ttl(table, 86400, 30)  # batch: 86400 s in the queue + 900 s deadline + 30 s
    assert err.value.field == settings.JOB_TTL_S.env


def test_a_job_ttl_too_short_stops_the_load(tmp_path, monkeypatch):
    monkeypatch.setenv(settings.JOB_TTL_S.env, "100")
    with pytest.raises(ConfigError, match="TAILGUARD_JOB_TTL_S=100 must exceed lane 'short'"):
        load_lanes(default_lanes_path())


def _borrowing(**short):
    return {**GOOD, "workers": [{"name": "short", "lanes": ["short"], **short},
                                {"name": "long", "lanes": ["long", "batch"]}]}


def test_a_worker_borrows_nothing_unless_told():
    assert all(not w.borrow.lanes for w in parse_lanes(GOOD).workers)


def test_a_borrowing_worker_and_its_knobs():
    table = parse_lanes(_borrowing(borrow=["long"], borrow_headroom=3, borrow_max=1,
                                   borrow_engine="idle"))
    policy = table.worker_for_queues(["short"]).borrow
    assert (policy.lanes, policy.headroom, policy.max_borrowed, policy.engine) == (
        ("long",), 3, 1, "idle")
    assert table.worker_for_queues(["long", "batch"]).borrow.lanes == ()
    assert table.worker_for_queues(["batch", "long"]) is None  # -Q in another order


@pytest.mark.parametrize("short, field", [
    ({"borrow": "long"}, "workers[0].borrow"),
    ({"borrow": ["bulk"]}, "workers[0].borrow"),
    ({"borrow": ["short"]}, "workers[0].borrow"),  # its own lane
    ({"borrow": ["long"], "borrow_headroom": -1}, "workers[0].borrow_headroom"),
    ({"borrow": ["long"], "borrow_max": 0}, "workers[0].borrow_max"),
    ({"borrow": ["long"], "borrow_max": True}, "workers[0].borrow_max"),
    ({"borrow": ["long"], "borrow_engine": "gpu"}, "workers[0].borrow_engine"),
])
def test_bad_borrowing_is_named(short, field):
    with pytest.raises(ConfigError) as err:
        parse_lanes(_borrowing(**short))
    assert err.value.field == field


def test_a_borrowing_engine_fits_the_borrowed_lanes_requests_not_their_batch():
    from tailguard.lanes.table import engine_settings_for

    data = _borrowing(borrow=["long"])
    data["lanes"] = {**GOOD["lanes"], "short": {**GOOD["lanes"]["short"], "max_num_seqs": 16,
                                                "max_model_len": 2048},
                     "long": {"max_tokens": 512, "max_num_seqs": 4, "max_model_len": 4096}}
    table = parse_lanes(data)
    assert engine_settings_for([table["short"]], [table["long"]]) == (16, 4096)


def test_the_cpu_host_lanes_file_is_the_packaged_one_with_a_smaller_short_lane():
    # lanes-cpu.toml is what docs/benchmarks.md measured overload with and what `tailguard up`
    # runs on a CPU host: it must not drift from the packaged default in anything but the
    # short lane's batch and promise
    import dataclasses

    from tailguard.lanes.table import cpu_lanes_path

    packaged = load_lanes(default_lanes_path())
    cpu = load_lanes(cpu_lanes_path())
    assert cpu.workers == packaged.workers
    assert (cpu["short"].max_num_seqs, cpu["short"].max_wait_s) == (6, 0.1)
    assert dataclasses.replace(cpu["short"], max_num_seqs=packaged["short"].max_num_seqs,
                               max_wait_s=packaged["short"].max_wait_s) == packaged["short"]
    assert [cpu[n] for n in cpu.names if n != "short"] == \
        [packaged[n] for n in packaged.names if n != "short"]
    # the same workers on the 2-core CPU host it was measured on (the packaged file's
    # replicas = "fill" is one worker there; it only differs on a GPU host)
    from tailguard.launch.worker_placement import place_workers

    def on_the_cpu_host(table):
        return [(w.name, w.spec.lanes, w.spec.borrow, w.spec.engine, w.pin)
                for w in place_workers(table.workers, "cpu", cores=[0, 1]).workers]

    assert on_the_cpu_host(cpu) == on_the_cpu_host(packaged)
