"""Prefix affinity's rule (tailguard/lanes/affinity.py): which engine a request is offered to."""

import pytest

from tailguard.lanes.affinity import (
    Affinity,
    block_hashes,
    engine_block_tokens,
    given_up,
    holders,
    indexed_depths,
    offer_to,
    prefix_keys,
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


@pytest.mark.parametrize("candidates, load, chosen", [
    (("e1",), {"e1": 3, "e2": 1}, "e1"),          # within max_extra of the least loaded
    (("e1",), {"e1": 4, "e2": 1}, None),          # past it: load beats affinity
    (("e1", "e2"), {"e1": 5, "e2": 2, "e3": 0}, "e2"),  # the least loaded holder
    (("e1", "e2"), {"e1": 1, "e2": 1}, "e2"),     # a tie: the latest holder
    (("gone",), {"e1": 0}, None),                  # a holder that may not serve the lane
    ((), {"e1": 0}, None),                         # no holder
])
def test_offer_to(candidates, load, chosen):
    assert offer_to(candidates, load, POLICY) == chosen


def test_an_offer_is_given_up_after_its_wait():
    assert not given_up(10.0, 10.4, POLICY) and given_up(10.0, 10.5, POLICY)


def test_the_bounds_are_checked():
    with pytest.raises(ValueError):
        Affinity(max_extra=-1)
    with pytest.raises(ValueError):
        Affinity(holders=0)


# -- prefix names (block_hashes, indexed_depths, prefix_keys) ---------------------------------

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


def test_prefix_keys_are_the_indexed_depths_hashes_shortest_first():
    ids = list(range(16 * 20))
    hashes = block_hashes(ids, 16)
    assert prefix_keys(ids, 16) == [hashes[d - 1] for d in [*range(1, 9), 16, 20]]


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
