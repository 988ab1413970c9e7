"""A bench stopped by SIGTERM or Ctrl-C at any point stops every process it started: a
topology still starting (waiting for its engines) kills what it started before raising, and a
child is in its group before a signal can interrupt (`sleep` children, no engine)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from tailguard.bench.topology import DirectSpec, RunningDirect
from tailguard.host import procs
from tailguard.host.cores import Pinning
from tailguard.host.procs import ChildSpec, Group, signals_held, stop_signals


@dataclass(frozen=True)
class SleepSpec(DirectSpec):
    """A 'vLLM server' that never answers /health: a topology that is still starting."""

    def argv(self, model: str, port: int, python: str = sys.executable) -> tuple[str, ...]:
        return ("sleep", "300")


def signal_soon(signum: int, after_s: float = 0.3) -> threading.Timer:
    timer = threading.Timer(after_s, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


def gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while procs.running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_topology_starts_kills_what_it_started(tmp_path, signum):
    spec = SleepSpec(pin=Pinning(), max_num_seqs=1, max_model_len=16, kv_cache_gib=1)
    topo = RunningDirect(spec, model="m", workdir=tmp_path, api_port=1)  # nothing listens on 1
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals():
        signal_soon(signum)
        with pytest.raises(KeyboardInterrupt):
            topo.start(timeout_s=60)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    [child] = topo.group.children  # registered before the wait, so the interrupt found it
    assert not child.alive() and gone(child.pid)


def test_a_signal_is_held_until_the_child_is_in_its_group(tmp_path):
    group = Group(tmp_path)
    try:
        with stop_signals():
            with pytest.raises(KeyboardInterrupt, match="held"):
                with signals_held():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)  # the handler has run: it held the signal
                    group.start(ChildSpec("sleeper", ("sleep", "300")))
            assert group["sleeper"].alive()  # started, registered, then the signal was raised
    finally:
        group.kill()
        group.stop()
    assert gone(group["sleeper"].pid)


def test_a_failure_inside_the_held_block_goes_on_and_the_signal_waits(tmp_path):
    with stop_signals():
        with pytest.raises(RuntimeError):
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                raise RuntimeError("failed first")
        with pytest.raises(KeyboardInterrupt):  # the held signal, at the next block's end
            with signals_held():
                pass


def test_kill_stops_a_started_topology_at_once(tmp_path):
    spec = SleepSpec(pin=Pinning(), max_num_seqs=1, max_model_len=16, kv_cache_gib=1)
    topo = RunningDirect(spec, model="m", workdir=tmp_path, api_port=1)
    topo.group.start(ChildSpec("vllm", spec.argv("m", 1), stop_timeout_s=60))
    t0 = time.monotonic()
    topo.kill()
    assert time.monotonic() - t0 < 10 and not topo.group.children[0].alive()


def test_a_held_signal_runs_then_at_once(tmp_path):
    """The bench's cleanup waits for warm shutdowns; a signal meanwhile kills them at once."""
    group = Group(tmp_path)
    # a child that ignores its stop signal, as a worker still loading its engine does
    group.start(ChildSpec("sleeper", ("sh", "-c", "trap '' TERM; sleep 300"), stop_timeout_s=60))
    time.sleep(0.2)  # the trap is set
    with stop_signals():
        with pytest.raises(KeyboardInterrupt):
            with signals_held(then=group.kill):
                signal_soon(signal.SIGTERM, 0.3)
                t0 = time.monotonic()
                group.stop()  # would wait 60 s... until the signal kills it
                assert time.monotonic() - t0 < 10
    assert gone(group["sleeper"].pid)
