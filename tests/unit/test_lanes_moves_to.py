"""The lanes file's fields for lanes that follow the load: `moves_to` on a worker entry,
`target_wait_s` and `min_workers` on a lane; refused at start, with the reason, when impossible."""

import pytest

from tailguard.errors import ConfigError
from tailguard.lanes.table import engine_settings_for, parse_lanes


def _data(long_extra=None, worker_extra=None):
    return {
        "lanes": {"short": {"max_cost": 512, "max_tokens": 64, "max_num_seqs": 16,
                            "max_model_len": 1024, "max_wait_s": 1, "dedicated": True},
                  "long": {"max_tokens": 512, "max_num_seqs": 8, "max_model_len": 4096,
                           **(long_extra or {})}},
        "workers": [{"name": "short", "lanes": ["short"]},
                    {"name": "long", "lanes": ["long"], **(worker_extra or {})}]}


def test_a_worker_that_may_move_sizes_its_engine_for_every_lane_it_may_serve():
    table = parse_lanes(_data({"min_workers": 0}, {"moves_to": ["short"]}))
    spec = table.worker("long")
    assert spec.moves_to == ("short",)
    assert spec.assignments == [("long",), ("short",)]
    assert engine_settings_for([table["long"]], moves_to=[table["short"]]) == (16, 4096)
    assert engine_settings_for([table["long"]]) == (8, 4096)


@pytest.mark.parametrize("extra, says", [
    ({"moves_to": ["long"]}, "is not another worker's lane"),
    ({"moves_to": ["nope"]}, "is not another worker's lane"),
    ({"moves_to": ["short", "short"]}, "names a lane twice"),
    ({"moves_to": "short"}, "must be a list of lane names"),
    ({"moves_to": ["short"], "borrow": ["short"]}, "either borrows jobs"),
])
def test_moves_to_is_refused_with_the_reason(extra, says):
    with pytest.raises(ConfigError, match=says):
        parse_lanes(_data(worker_extra=extra))


@pytest.mark.parametrize("long_extra, says", [
    ({"min_workers": 2}, "keeps min_workers = 2, but only 1 worker"),
    ({"min_workers": -1}, "min_workers must be >= 0"),
    ({"target_wait_s": 0}, "target_wait_s must be > 0"),
    ({"max_wait_s": 5, "target_wait_s": 6}, "exceeds the lane's promise"),
])
def test_lane_targets_and_minimums_are_refused_when_impossible(long_extra, says):
    with pytest.raises(ConfigError, match=says):
        parse_lanes(_data(long_extra))


def test_targets_default_to_half_the_promise_and_none_for_a_batch_lane():
    data = _data()
    data["lanes"]["batch"] = {"priority": "batch", "max_tokens": 512, "min_workers": 0}
    data["workers"][1]["lanes"] = ["long", "batch"]
    table = parse_lanes(data)
    assert table["short"].wait_target_s == 0.5
    assert table["long"].wait_target_s == table["long"].queue_ttl_s / 2
    assert table["batch"].wait_target_s is None
    assert table["long"].min_workers == 1 and table["batch"].min_workers == 0
