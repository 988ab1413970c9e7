"""Prefix affinity's rule (tailguard/lanes/affinity.py): which engine a request is offered to."""

import pytest

from tailguard.lanes.affinity import (
    Affinity,
    Holdings,
    block_hashes,
    cached_tokens,
    engine_block_tokens,
    holders,
    indexed_depths,
    offer_to,
    offer_wait_s,
    prefix_depths,
    remember,
)

POLICY = Affinity(max_extra=2, max_wait_s=0.5, holders=2)


def test_the_holders_are_those_of_the_longest_prefix_known():
    index = {"system": ("e1", "e2"), "chat/7": ("e3",)}
    assert holders(["system", "chat/7"], index) == ("e3",)  # the conversation before the system
    assert holders(["system", "chat/8"], index) == ("e1", "e2")
    assert holders(["chat/9"], index) == ()


def test_remember_keeps_the_latest_holders_latest_last():
    assert remember((), "e1", POLICY) == ("e1",)
    assert remember(("e1", "e2"), "e3", POLICY) == ("e2", "e3")  # at most POLICY.holders
    assert remember(("e1", "e2"), "e1", POLICY) == ("e2", "e1")  # served again: the latest


ROOM = {"e1": 8, "e2": 8, "e3": 8}


@pytest.mark.parametrize("candidates, load, slots, chosen", [
    (("e1",), {"e1": 3, "e2": 1}, ROOM, "e1"),          # within max_extra of the least loaded
    (("e1",), {"e1": 4, "e2": 1}, ROOM, None),          # past it: load beats affinity
    (("e1", "e2"), {"e1": 5, "e2": 2, "e3": 0}, ROOM, "e2"),  # the least loaded holder
    (("e1", "e2"), {"e1": 1, "e2": 1}, ROOM, "e2"),     # a tie: the latest holder
    (("gone",), {"e1": 0}, ROOM, None),                  # a holder that may not serve the lane
    ((), {"e1": 0}, ROOM, None),                         # no holder
    (("e1",), {"e1": 3, "e2": 3}, {"e1": 3, "e2": 8}, None),  # a full holder is not waited for
    (("e1", "e2"), {"e1": 2, "e2": 1}, {"e1": 8, "e2": 1}, "e1"),  # the one with room
    (("e1", "e2"), {"e1": 2, "e2": 0}, {"e1": 8, "e2": 3}, "e1"),  # the most free slots
    (("e1", "e2"), {"e1": 5, "e2": 0}, {"e1": 8, "e2": 3}, "e2"),  # a tie of free slots: latest
    (("e1", "e2"), {"e1": 6, "e2": 1}, {"e1": 16, "e2": 3}, "e2"),  # e1 past max_extra
    (("e1",), {"e1": 0}, {}, None),                      # no limit known: no room
])
def test_offer_to(candidates, load, slots, chosen):
    assert offer_to(candidates, load, slots, POLICY) == chosen


def test_an_offer_waits_no_longer_than_its_lanes_promise():
    assert offer_wait_s(POLICY, None) == 0.5
    assert offer_wait_s(POLICY, 0.1) == 0.1
    assert offer_wait_s(POLICY, 2.0) == 0.5


def test_cached_tokens_are_the_longest_held_prefix():
    assert cached_tokens(["a", "b", "c"], [1, 2, 4], ["a", "b"], 16) == 32
    assert cached_tokens(["a", "b", "c"], [1, 2, 4], ["c"], 16) == 64
    assert cached_tokens(["a", "b"], [1, 2], [], 16) == 0


def test_holdings_offer_only_to_live_engines_of_the_lane():
    h = Holdings(prefixes=("sys", "chat"), depths=(1, 3),
                 engines={"short": {"e1": (1, 8), "e2": (0, 8)}, "long": {"e3": (0, 4)}},
                 held={"sys": ("e2",), "chat": ("e3",)})
    # "chat" is held by e3, which serves only long: for short the system prompt's holder
    assert h.offer_to("short", POLICY) == "e2"
    assert h.offer_to("long", POLICY) == "e3"
    assert h.offer_to("batch", POLICY) is None
    assert h.cached_tokens(128) == 3 * 128
    assert Holdings(("x",), (1,), {}, {"x": ()}).cached_tokens(128) == 0


def test_prefix_depths_name_the_indexed_prefixes():
    named = prefix_depths(list(range(16 * 20)), 16)
    assert [d for _, d in named] == indexed_depths(20)
    hashes = block_hashes(list(range(16 * 20)), 16)
    assert [k for k, _ in named] == [hashes[d - 1] for d in indexed_depths(20)]


def test_the_bounds_are_checked():
    with pytest.raises(ValueError):
        Affinity(max_extra=-1)
    with pytest.raises(ValueError):
        Affinity(holders=0)


# -- prefix names (block_hashes, indexed_depths, prefix_depths) ---------------------------------

def test_block_hashes_cover_full_blocks_only():
    assert len(block_hashes(list(range(47)), 16)) == 2
    assert block_hashes(list(range(15)), 16) == []


def test_a_shared_prefix_shares_its_blocks_names_and_no_more():
    a = block_hashes(list(range(64)), 16)
    b = block_hashes(list(range(48)) + [999] * 16, 16)
    assert a[:3] == b[:3] and a[3] != b[3]


def test_a_block_name_depends_on_every_token_before_it():
    # the same second block after a different first one is a different prefix (chained)
    a = block_hashes([1] * 16 + [2] * 16, 16)
    b = block_hashes([3] * 16 + [2] * 16, 16)
    assert a[1] != b[1]


@pytest.mark.parametrize("blocks, depths", [
    (0, []), (1, [1]), (8, list(range(1, 9))), (9, [*range(1, 9), 9]),
    (16, [*range(1, 9), 16]), (40, [*range(1, 9), 16, 32, 40]), (64, [*range(1, 9), 16, 32, 64]),
])
def test_indexed_depths(blocks, depths):
    assert indexed_depths(blocks) == depths


def test_prefix_names_are_the_indexed_depths_hashes_shortest_first():
    ids = list(range(16 * 20))
    hashes = block_hashes(ids, 16)
    assert [k for k, _ in prefix_depths(ids, 16)] == [hashes[d - 1] for d in [*range(1, 9), 16, 20]]


def test_block_size_must_be_positive():
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)


@pytest.mark.parametrize("engine, device, size", [
    ({}, "cpu", 128), ({}, "cuda", 16), ({}, "auto", 16), ({"block_size": 32}, "cpu", 32),
])
def test_engine_block_tokens(engine, device, size):
    assert engine_block_tokens(engine, device) == size


def test_prefix_and_worker_queue_names():
    from tailguard.redis import keys

    assert keys.prefix_holders_key("ab" * 12) == "tailguard:prefix:" + "ab" * 12
    assert keys.worker_queue("short", "engine-0@host") == "short.w.engine-0@host"
    for bad in ("", "not hex", "ab"):
        with pytest.raises(ValueError):
            keys.prefix_holders_key(bad)
    with pytest.raises(ValueError):
        keys.worker_queue("short", "two words")
