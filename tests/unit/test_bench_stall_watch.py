"""The bench's machine stall watch: worst 1-second windows of cumulative counters."""

import os
import time

from tailguard.bench.stall_watch import (
    StallWatch,
    describe,
    longest_gap,
    read_counters,
    worst_window,
)


def test_worst_window_finds_the_steepest_second_and_when_it_began():
    # a counter that grows 0.1/s, except 0.9 within [2.0, 3.0)
    points = [(t / 4, 0.1 * t / 4) for t in range(0, 9)]
    points += [(2.25, 0.425), (2.5, 0.65), (2.75, 0.875), (3.0, 1.1)]
    points += [(3.0 + t / 4, 1.1 + 0.1 * t / 4) for t in range(1, 9)]
    rate, start = worst_window(points)
    assert start == 2.0
    assert abs(rate - 0.9) < 1e-9


def test_worst_window_of_a_phase_shorter_than_a_window_is_its_whole_span():
    assert worst_window([(0.0, 1.0), (0.5, 1.25)]) == (0.5, 0.0)
    assert worst_window([(0.0, 1.0)]) is None
    assert worst_window([]) is None


def test_worst_window_counts_a_jump_in_the_last_quarter_second():
    points = [(0.0, 0.0), (0.25, 0.0), (0.5, 0.0), (1.0, 0.0), (1.25, 0.5)]
    assert worst_window(points) == (0.5, 0.25)


def test_longest_gap_between_samples():
    assert longest_gap([0.0, 0.25, 0.5, 2.5, 2.75]) == (2.0, 0.5)
    assert longest_gap([1.0]) is None


def test_describe_puts_a_phase_on_one_line():
    stalls = {"cpu_some": {"share": 0.97, "at_s": 11.5}, "steal": {"share": 0.01, "at_s": 3.0},
              "sample_gap": {"max_s": 0.252, "at_s": 0.25}}
    assert describe(stalls) == ("worst second: cpu_some 97% at 11.5 s, steal 1% at 3 s; "
                                "longest sampler gap 0.252 s at 0.25 s")
    assert describe({}) == "worst second: not measured"


def test_stall_watch_samples_this_machine():
    watch = StallWatch(interval_s=0.05)
    t0 = time.monotonic()
    while len(watch.points) < 4 and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    out = watch.stop()
    if read_counters() is None:
        assert out == {}
        return
    assert set(out) <= {"cpu_some", "io_some", "steal", "sample_gap"}
    if os.path.exists("/proc/stat"):
        assert "steal" in out
    assert 0.05 <= out["sample_gap"]["max_s"] <= elapsed + 0.1
    for name, figures in out.items():
        assert 0 <= figures["at_s"] <= elapsed + 0.1
        if name != "sample_gap":
            assert figures["share"] >= 0
