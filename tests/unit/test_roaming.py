"""The engine core's roaming onto idle front-end cores (tailguard/host/roaming.py): the pure
policy, the /proc arithmetic, where it applies, and a real process moved and back."""

import os
import subprocess
import sys
import threading
import time

import pytest

from tailguard import settings
from tailguard.host.cores import Pinning
from tailguard.host.roaming import (
    EngineCoreRoamer,
    RoamPolicy,
    cpu_ticks,
    may_raise_priority,
    process_ticks,
    roamer_for,
)

STAT = """cpu  300 0 100 1000 50 0 0 0 0 0
cpu0 100 0 50 500 25 0 0 0 0 0
cpu1 200 5 50 500 25 10 0 7 3 0
intr 12345
"""


def test_it_goes_only_after_settling_and_comes_back_at_once():
    policy = RoamPolicy(go_below=0.3, settle=2, back_above=0.5)
    assert policy.next(False, 0, 0.1) == (False, 1)
    assert policy.next(False, 1, 0.1) == (True, 0)  # two calm samples in a row
    assert policy.next(False, 1, 0.4) == (False, 0)  # a busy one starts the count again
    assert policy.next(True, 0, 0.45) == (True, 0)  # between the two bounds: it stays
    assert policy.next(True, 0, 0.6) == (False, 0)  # one busy sample brings it home


def test_cpu_ticks_counts_busy_and_total_of_the_named_cores():
    # cpu1: user 200 nice 5 system 50 idle 500 iowait 25 irq 10 softirq 0 steal 7 (guest
    # time is inside user already)
    assert cpu_ticks((1,), STAT) == (200 + 5 + 50 + 10 + 7, 797)
    assert cpu_ticks((0, 1), STAT) == (150 + 272, 675 + 797)
    assert cpu_ticks((5,), STAT) == (0, 0)


def test_process_ticks_reads_this_process():
    start = process_ticks(os.getpid())
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    assert process_ticks(os.getpid()) > start


def test_it_applies_to_an_engine_off_the_front_end_cores_only(monkeypatch):
    import tailguard.host.roaming

    none = lambda: None
    monkeypatch.setenv(settings.FRONTEND_CORES.env, "1")
    monkeypatch.setattr(tailguard.host.roaming, "may_raise_priority", lambda: True)
    roamer = roamer_for(Pinning(cores=(0,)), none)
    assert roamer is not None and (roamer.home, roamer.frontend) == ((0,), (1,))
    assert roamer.away_nice == settings.ENGINE_NICE.default
    monkeypatch.setattr(tailguard.host.roaming, "may_raise_priority", lambda: False)
    assert roamer_for(Pinning(cores=(0,)), none) is None  # could not come home at nice 0
    monkeypatch.setattr(tailguard.host.roaming, "may_raise_priority", lambda: True)
    assert roamer_for(Pinning(cores=(1,)), none) is None  # it shares them: niced instead
    assert roamer_for(Pinning(gpus=("0",)), none) is None
    monkeypatch.setenv(settings.FRONTEND_CORES.env, "none")
    assert roamer_for(Pinning(cores=(0,)), none) is None
    monkeypatch.setenv(settings.FRONTEND_CORES.env, "1")
    monkeypatch.setenv(settings.ENGINE_CORE_ROAM.env, "0")
    assert roamer_for(Pinning(cores=(0,)), none) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.skipif(not may_raise_priority(), reason="needs root or RLIMIT_NICE >= 20")
def test_a_real_process_is_moved_to_the_front_end_cores_below_them_and_home_again():
    home, front = sorted(os.sched_getaffinity(0))[:2]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.sched_setaffinity(child.pid, {home})
        stop = threading.Event()
        # first: the front-end core always counts as idle; then always as busy
        roamer = EngineCoreRoamer(lambda: child.pid, (home,), (front,),
                                  RoamPolicy(go_below=2.0, settle=2, back_above=2.0),
                                  period_s=0.02, away_nice=7)
        thread = threading.Thread(target=roamer.run, args=(stop,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while os.sched_getaffinity(child.pid) != {front} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.sched_getaffinity(child.pid) == {front} and roamer.away
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 7  # below the front end there
        assert roamer.moves_away == 1
        roamer.policy = RoamPolicy(go_below=-1.0, back_above=-1.0)
        while os.sched_getaffinity(child.pid) != {home} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.sched_getaffinity(child.pid) == {home} and not roamer.away
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 0
        stop.set()
        thread.join(5)
    finally:
        child.kill()
        child.wait()
