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
    assert table["short"].max_cost is not None
    assert table["batch"].priority == "batch"
    assert table["batch"].queue_ttl_s > table["long"].queue_ttl_s
    # one fleet: every engine serves every lane, in order, each within its per-engine limit
    assert [w.lanes for w in table.workers] == [("short", "long", "batch")]
    assert table["long"].engine_slots < table["short"].engine_slots


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


def test_a_lanes_per_engine_limit_is_its_max_running_within_its_batch():
    table = parse_lanes({**GOOD, "lanes": {**GOOD["lanes"],
                                          "long": {"max_tokens": 512, "max_num_seqs": 8,
                                                   "max_running": 2},
                                          "batch": {"priority": "batch", "max_tokens": 512,
                                                    "max_num_seqs": 4, "max_running": 16}}})
    assert table["long"].engine_slots == 2
    assert table["batch"].engine_slots == 4  # never more than its batch
    assert table["short"].engine_slots == table["short"].max_num_seqs


@pytest.mark.parametrize("field", ["max_running", "max_ahead"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_a_bad_per_engine_limit_is_named(field, value):
    with pytest.raises(ConfigError) as err:
        parse_lanes({**GOOD, "lanes": {**GOOD["lanes"],
                                      "long": {"max_tokens": 512, field: value}}})
    assert err.value.field == f"lanes.long.{field}"


def test_the_gpu_lanes_file_starts_long_only_beside_few_short_jobs():
    # docs/capacity.md, "The per-engine long limit": long may take all but one slot, but starts
    # on no engine with 5 short requests decoding; the CPU file keeps its own limits (none)
    from tailguard.lanes.table import cpu_lanes_path

    gpu, cpu = load_lanes(default_lanes_path()), load_lanes(cpu_lanes_path())
    assert (gpu["long"].max_ahead, gpu["long"].engine_slots) == (5, 15)
    assert [l.max_ahead for l in cpu] == [None, None, None]
    assert gpu["batch"].max_ahead is None and gpu["short"].max_ahead is None


@pytest.mark.parametrize("gone", ["borrow", "moves_to", "borrow_max"])
def test_the_removed_worker_fields_are_refused_by_name(gone):
    data = {**GOOD, "workers": [{"name": "short", "lanes": ["short"], gone: ["long"]},
                                {"name": "long", "lanes": ["long", "batch"]}]}
    with pytest.raises(ConfigError, match=gone):
        parse_lanes(data)


def test_an_engine_serving_several_lanes_takes_the_largest_batch_and_context():
    from tailguard.lanes.table import engine_settings_for

    table = parse_lanes({**GOOD, "lanes": {
        **GOOD["lanes"], "short": {"max_cost": 100, "max_tokens": 64, "max_num_seqs": 16},
        "long": {"max_tokens": 512, "max_num_seqs": 4, "max_model_len": 4096}},
        "workers": [{"name": "engine", "lanes": ["short", "long", "batch"]}]})
    assert engine_settings_for([table["short"], table["long"]]) == (16, 4096)


def test_the_cpu_host_lanes_file_is_the_packaged_one_with_its_own_sizes():
    # lanes-cpu.toml is what `tailguard up` runs on a CPU host: it must not drift from the
    # packaged default in anything but the short lane's batch and cost bound, the lanes'
    # promises, the per-engine limits and the workers (one engine per core of the 2-core host it was measured on)
    import dataclasses

    from tailguard.lanes.table import cpu_lanes_path

    packaged = load_lanes(default_lanes_path())
    cpu = load_lanes(cpu_lanes_path())
    assert (cpu["short"].max_num_seqs, cpu["short"].max_wait_s, cpu["short"].max_cost) == \
        (8, 0.5, 2048)
    assert dataclasses.replace(cpu["short"], max_num_seqs=packaged["short"].max_num_seqs,
                               max_wait_s=packaged["short"].max_wait_s,
                               max_cost=packaged["short"].max_cost) == packaged["short"]
    assert cpu["long"].max_wait_s == 8
    for name in ("long", "batch"):
        assert dataclasses.replace(cpu[name], max_running=packaged[name].max_running,
                                   max_ahead=packaged[name].max_ahead,
                                   max_wait_s=packaged[name].max_wait_s,
                                   max_num_seqs=packaged[name].max_num_seqs) == packaged[name]
    assert [(w.name, w.lanes, w.engine) for w in cpu.workers] == \
        [(w.name, w.lanes, w.engine) for w in packaged.workers]
    assert [(w.replicas, w.max_prefill_tokens) for w in cpu.workers] == [(2, 1024)]
    assert [w.max_prefill_tokens for w in packaged.workers] == [0]


@pytest.mark.parametrize("bound", [-1, 1.5, "2048", True])
def test_a_workers_prefill_bound_is_a_whole_number_of_tokens(bound):
    data = {**GOOD, "workers": [{"name": "short", "lanes": ["short"], "max_prefill_tokens": bound},
                                {"name": "long", "lanes": ["long", "batch"]}]}
    with pytest.raises(ConfigError) as err:
        parse_lanes(data)
    assert err.value.field == "workers[0].max_prefill_tokens"


def test_a_workers_prefill_bound_is_read_and_none_by_default():
    table = parse_lanes({**GOOD, "workers": [
        {"name": "short", "lanes": ["short"], "max_prefill_tokens": 4096},
        {"name": "long", "lanes": ["long", "batch"]}]})
    assert [w.max_prefill_tokens for w in table.workers] == [4096, 0]
    assert table.max_prefill_tokens == 4096
    assert parse_lanes(GOOD).max_prefill_tokens == 0
