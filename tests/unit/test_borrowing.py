"""Work-conserving lanes: the borrow and reclaim decisions, table-driven."""

import pytest

from tailguard.errors import ConfigError
from tailguard.lanes.borrowing import (
    BorrowPolicy,
    EngineLoad,
    may_borrow,
    reclaim_count,
    resolve,
    youngest,
)

POLICY = BorrowPolicy(lanes=("long",), headroom=2, max_borrowed=3)


@pytest.mark.parametrize("slots, own, borrowed, queued, ok, why", [
    (16, 0, 0, 0, True, "idle engine, empty own queue"),
    (16, 0, 0, 1, False, "own work is queued: never borrow past it"),
    (16, 5, 2, 0, True, "room and under the cap"),
    (16, 5, 3, 0, False, "B borrowed already run"),
    (16, 13, 0, 0, True, "3 free: one more leaves R = 2"),
    (16, 14, 0, 0, False, "2 free: one more would eat into R"),
    (16, 16, 0, 0, False, "full"),
])
def test_may_borrow(slots, own, borrowed, queued, ok, why):
    assert may_borrow(POLICY, EngineLoad(slots, own, borrowed, queued)) is ok, why


def test_no_lanes_to_borrow_from_means_never():
    assert not may_borrow(BorrowPolicy(lanes=()), EngineLoad(16, 0, 0, 0))


@pytest.mark.parametrize("slots, own, borrowed, arriving, n, why", [
    (16, 0, 3, 1, 0, "12 free after the arrival: nothing to give back"),
    (16, 11, 3, 0, 0, "2 free: exactly R"),
    (16, 11, 3, 1, 1, "1 free after the arrival: one back"),
    (16, 11, 3, 3, 3, "R short by 3: all three back"),
    (16, 11, 3, 5, 3, "never more than are borrowed"),
    (16, 14, 0, 2, 0, "nothing borrowed: nothing to reclaim (own work waits in the engine)"),
])
def test_reclaim_count(slots, own, borrowed, arriving, n, why):
    assert reclaim_count(POLICY, EngineLoad(slots, own, borrowed, 0), arriving) == n, why


def test_youngest_borrowed_go_first():
    borrowed = [("a", 10.0), ("b", 30.0), ("c", 20.0)]
    assert youngest(borrowed, 2) == ["b", "c"]
    assert youngest(borrowed, 0) == [] and youngest(borrowed, 9) == ["b", "c", "a"]


def test_policy_rejects_negative_knobs_and_unknown_engines():
    with pytest.raises(ValueError):
        BorrowPolicy(lanes=("long",), headroom=-1)
    with pytest.raises(ValueError):
        BorrowPolicy(lanes=("long",), engine="gpu")


@pytest.mark.parametrize("engine,device,lanes,resolved", [
    ("auto", "cpu", ("long",), "idle"),  # measured: the idle engine on a CPU host
    ("auto", "cuda", (), "own"),         # a GPU: isolation, nothing borrowed
    ("own", "cuda", ("long",), "own"),   # asked for: borrowed into the own engine
    ("own", "cpu", ("long",), "own"),
    ("idle", "cpu", ("long",), "idle"),
])
def test_resolve_borrows_as_the_device_allows(engine, device, lanes, resolved):
    policy = resolve(BorrowPolicy(lanes=("long",), engine=engine), device)
    assert (policy.lanes, policy.engine) == (lanes, resolved)


def test_an_idle_engine_on_a_gpu_is_refused_and_nothing_to_borrow_is_left_alone():
    with pytest.raises(ConfigError, match='worker short: borrow_engine = "idle"'):
        resolve(BorrowPolicy(lanes=("long",), engine="idle"), "cuda", "short")
    quiet = BorrowPolicy(lanes=(), engine="idle")
    assert resolve(quiet, "cuda") is quiet


def test_the_shipped_short_worker_borrows_only_on_a_cpu_host():
    from tailguard.lanes.table import default_lanes_path, load_lanes

    short = load_lanes(default_lanes_path()).worker("short")
    assert resolve(short.borrow, "cpu").lanes == ("long",)
    assert resolve(short.borrow, "cuda").lanes == ()  # never inside the short engine on a GPU
