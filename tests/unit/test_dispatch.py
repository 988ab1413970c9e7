"""One fleet, every lane: the order in which an engine takes work, and its limits per lane."""

import pytest

from tailguard.lanes.dispatch import capped, consumable, next_lane, prefill_open
from tailguard.lanes.table import parse_lanes

TABLE = parse_lanes({
    "lanes": {
        "short": {"max_cost": 100, "max_tokens": 64, "max_num_seqs": 6},
        "long": {"max_tokens": 512, "max_num_seqs": 8, "max_running": 4},
        "batch": {"priority": "batch", "max_tokens": 512, "max_num_seqs": 8, "max_running": 2},
    },
    "workers": [{"name": "engine", "lanes": ["short", "long", "batch"]}],
})
LANES = list(TABLE)


@pytest.mark.parametrize("running, waiting, expected", [
    ({}, {}, None),                                           # nothing waits
    ({}, {"long": 3, "short": 1}, "short"),                   # short first
    ({}, {"long": 3}, "long"),
    ({"long": 4}, {"long": 3}, None),                         # long at its limit on this engine
    ({"long": 2, "batch": 2}, {"long": 3}, None),             # ... which counts batch too
    ({"long": 4}, {"long": 3, "short": 1}, "short"),          # a short still finds a slot
    ({"short": 6}, {"short": 1, "long": 1}, "long"),          # short full here: long may go
    ({}, {"batch": 5}, "batch"),                              # batch when nothing else waits
    ({"long": 4}, {"long": 1, "batch": 5}, None),             # batch waits behind waiting long
    ({"short": 6}, {"short": 1, "batch": 5}, None),           # ... and behind waiting short
    ({"batch": 2}, {"batch": 5}, None),                       # batch at its limit
    ({"batch": 2}, {"long": 1}, "long"),                      # long has room beside batch
])
def test_an_engine_takes_the_first_lane_with_work_below_its_limit(running, waiting, expected):
    assert next_lane(LANES, running, waiting) == expected


@pytest.mark.parametrize("running, expected", [
    ({}, ("short", "long", "batch")),
    ({"long": 3}, ("short", "long", "batch")),
    ({"long": 4}, ("short",)),                 # long closed, and batch behind it
    ({"long": 2, "batch": 2}, ("short",)),     # long's limit counts batch's jobs
    ({"short": 6}, ("long",)),                 # short closed: batch must not overtake it
    ({"batch": 2}, ("short", "long")),
    ({"short": 4, "long": 1}, ("short", "long", "batch")),
    ({"short": 5, "long": 1}, ("long",)),      # short's limit counts every lane after it
])
def test_a_worker_consumes_the_lanes_below_their_limits_in_order(running, expected):
    assert consumable(LANES, running) == expected


def test_consuming_the_open_queues_in_order_takes_what_next_lane_takes():
    # a broker serving the first non-empty queue of `consumable` picks `next_lane`'s lane
    # wherever that one is not a batch lane held back by a closed interactive lane
    for running in ({}, {"long": 4}, {"short": 6}, {"batch": 2}, {"short": 6, "long": 2},
                    {"long": 2, "batch": 2}):
        for waiting in ({"short": 1}, {"long": 1}, {"batch": 1}, {"long": 1, "batch": 1},
                        {"short": 1, "long": 1, "batch": 1}):
            open_ = consumable(LANES, running)
            broker = next((q for q in open_ if waiting.get(q)), None)
            assert broker in (next_lane(LANES, running, waiting), None)


AHEAD = list(parse_lanes({
    "lanes": {
        "short": {"max_cost": 100, "max_tokens": 64, "max_num_seqs": 8},
        "long": {"max_tokens": 512, "max_num_seqs": 8, "max_ahead": 3},
        "batch": {"priority": "batch", "max_tokens": 512, "max_num_seqs": 8, "max_running": 2},
    },
    "workers": [{"name": "engine", "lanes": ["short", "long", "batch"]}],
}))


@pytest.mark.parametrize("running, waiting, expected", [
    ({"short": 2}, {"long": 1}, "long"),                      # fewer short than 3 here
    ({"short": 3}, {"long": 1}, None),                        # 3 short decoding: long goes elsewhere
    ({"short": 3}, {"long": 1, "short": 1}, "short"),         # short itself is not held back
    ({"short": 3}, {"long": 1, "batch": 1}, None),            # nor does batch overtake long
    ({"short": 2, "long": 5}, {"long": 1}, "long"),           # long's jobs do not count
    ({"short": 2, "long": 8}, {"long": 1}, None),             # its own limit still bounds it
])
def test_a_lane_with_max_ahead_starts_only_beside_fewer_jobs_of_the_lanes_ahead(
        running, waiting, expected):
    assert next_lane(AHEAD, running, waiting) == expected


@pytest.mark.parametrize("running, expected", [
    ({"short": 2}, ("short", "long", "batch")),
    ({"short": 3}, ("short",)),                # long closed by short's jobs, batch behind it
    ({"short": 2, "batch": 2}, ("short", "long")),
])
def test_a_worker_stops_consuming_a_lane_whose_max_ahead_is_reached(running, expected):
    assert consumable(AHEAD, running) == expected


def test_a_capped_engine_keeps_its_lanes_max_ahead():
    assert [l.max_ahead for l in capped(AHEAD, 2)] == [None, 3, None]
    assert consumable(capped(AHEAD, 4), {"short": 3}) == ("short",)


def test_a_capped_engine_has_every_lanes_limit_cut_to_its_cap():
    three = capped(LANES, 3)
    assert [l.name for l in three] == ["short", "long", "batch"]
    assert [l.engine_slots for l in three] == [3, 3, 2]  # batch's own 2 stays below the cap
    assert [l.priority for l in three] == ["interactive", "interactive", "batch"]
    assert consumable(three, {"short": 2}) == ("short", "long", "batch")
    # short starts only while fewer than 3 run here, every lane counted; long and batch as
    # their own limits say, cut to 3
    assert consumable(three, {"short": 3}) == ("long",)  # batch never past a closed short
    assert consumable(three, {"short": 1, "long": 2}) == ("long",)
    assert consumable(three, {"long": 3}) == ()
    assert next_lane(three, {"long": 2}, {"short": 1, "long": 1}) == "short"
    assert next_lane(three, {"long": 3}, {"short": 1}) is None
    # the uncapped engine beside it still takes a short job there
    assert next_lane(LANES, {"long": 3}, {"short": 1}) == "short"
    assert capped(LANES, 0) == LANES and capped(LANES, -1) == LANES


@pytest.mark.parametrize("prefilling, bound, expected, open_", [
    ({}, 0, "short", ("short", "long", "batch")),  # no bound
    ({"short": 5000}, 0, "short", ("short", "long", "batch")),
    ({"short": 1000}, 1024, "short", ("short", "long", "batch")),  # room for another job
    ({"short": 1250}, 1024, None, ()),  # a cold prompt: every lane counts its tokens
    ({"short": 600, "long": 600}, 1024, "short", ("short",)),  # long counts short's and its own
    # a long prompt prefilling closes long and batch, not short: short is ahead of it
    ({"long": 2000}, 1024, "short", ("short",)),
    ({"batch": 2000}, 1024, "short", ("short", "long")),
])
def test_an_engine_at_its_prefill_bound_starts_no_job_of_a_lane_counting_its_tokens(
        prefilling, bound, expected, open_):
    waiting = {"short": 1, "long": 1}
    assert next_lane(LANES, {}, waiting, prefilling, bound) == expected
    assert consumable(LANES, {}, prefilling, bound) == open_
    # with no short job waiting, long starts only where its queue is open
    assert (next_lane(LANES, {}, {"long": 1}, prefilling, bound) == "long") == ("long" in open_)


def test_prefill_open_counts_the_lane_and_those_before_it():
    assert prefill_open(LANES, "short", {"long": 5000, "batch": 5000}, 1024)
    assert not prefill_open(LANES, "long", {"short": 1024}, 1024)
    assert prefill_open(LANES, "batch", {"short": 5000}, 0)
