"""Cost, classification and caps, table-tested against the default lanes."""

import pytest

from tailguard.errors import NoLaneForRequest, PromptTooLong
from tailguard.lanes.placement import place, request_cost
from tailguard.lanes.table import default_lanes_path, load_lanes, parse_lanes

LANES = load_lanes(default_lanes_path()).lanes  # short: max_cost 1024, cap 256, default 64


@pytest.mark.parametrize("priority,prompt,asked,lane,max_tokens,capped", [
    # short prompt, small output: short lane, as asked
    ("interactive", 9, 64, "short", 64, False),
    # no max_tokens: the short lane's default
    ("interactive", 9, None, "short", 64, False),
    # exactly at the short lane's cost bound
    ("interactive", 768, 256, "short", 256, False),
    # one token over the bound: long
    ("interactive", 769, 256, "long", 256, False),
    # asks for more than the short cap: long, not silently cut to 256
    ("interactive", 9, 512, "long", 512, False),
    # asks for 100000: long, clamped to its cap
    ("interactive", 9, 100000, "long", 1024, True),
    # long prompt and a max_tokens that would overflow the 4096 context: clamped to what is left
    ("interactive", 3500, 1024, "long", 596, True),
    # batch priority: the batch lane whatever the cost
    ("batch", 9, 64, "batch", 64, False),
    ("batch", 2000, 5000, "batch", 1024, True),
])
def test_place(priority, prompt, asked, lane, max_tokens, capped):
    p = place(LANES, priority=priority, prompt_tokens=prompt, requested_max_tokens=asked)
    assert (p.lane, p.max_tokens, p.max_tokens_capped) == (lane, max_tokens, capped)
    assert p.cost == request_cost(prompt, max_tokens) == prompt + max_tokens
    assert p.requested_max_tokens == asked


def test_model_context_caps_the_lane_context():
    p = place(LANES, priority="interactive", prompt_tokens=1000, requested_max_tokens=1024,
              model_max_len=1500)
    assert (p.lane, p.context_len, p.max_tokens, p.max_tokens_capped) == ("long", 1500, 500, True)


def test_prompt_longer_than_every_context_is_a_400():
    with pytest.raises(PromptTooLong) as err:
        place(LANES, priority="interactive", prompt_tokens=4096, requested_max_tokens=1)
    assert err.value.http_status == 400 and err.value.field == "prompt"


def test_prompt_too_long_for_short_goes_long():
    p = place(LANES, priority="interactive", prompt_tokens=2047, requested_max_tokens=1)
    assert p.lane == "long"


def test_priority_without_a_lane():
    only_interactive = parse_lanes({"lanes": {"a": {"max_tokens": 10}}}).lanes
    with pytest.raises(NoLaneForRequest, match="batch"):
        place(only_interactive, priority="batch", prompt_tokens=1, requested_max_tokens=1)


def test_all_lanes_bounded_and_none_fits():
    bounded = parse_lanes({"lanes": {"a": {"max_tokens": 10, "max_cost": 20}}}).lanes
    with pytest.raises(NoLaneForRequest) as err:
        place(bounded, priority="interactive", prompt_tokens=15, requested_max_tokens=10)
    assert err.value.field == "max_tokens"
