"""Child processes with real tiny children (`python -c ...`): start, pin, log, stop, kill."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

import pytest

from tailguard.pinning import Pinning
from tailguard.procs import ChildFailed, ChildSpec, Group, running, start, wait_until

PY = sys.executable


def py(name: str, code: str, **kw) -> ChildSpec:
    return ChildSpec(name, (PY, "-c", code), **kw)


#: Says it is ready, then ignores SIGTERM: only a kill ends it.
STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")


def test_exit_status_and_log_tail(tmp_path):
    child = start(py("boom", "import sys; print('x' * 5000); print('last words'); sys.exit(3)"),
                  log=tmp_path / "boom.log")
    assert child.proc.wait(10) == 3
    tail = child.log_tail(chars=100)
    assert tail.startswith("--- boom (pid") and "exit code 3" in tail
    assert tail.endswith("last words\n") and len(tail.splitlines()[1]) < 100
    assert child.stop() == 3  # already exited: nothing to stop


def test_env_and_pin_reach_the_child(tmp_path):
    core = min(os.sched_getaffinity(0))
    child = start(py("pinned", "import os; print(sorted(os.sched_getaffinity(0)), "
                               "os.environ['VLLM_CPU_OMP_THREADS_BIND'], os.environ['MINE'])",
                     env={"MINE": "yes"}, pin=Pinning(cores=(core,))),
                  log=tmp_path / "pinned.log")
    assert child.proc.wait(10) == 0
    assert (tmp_path / "pinned.log").read_text() == f"[{core}] {core} yes\n"


def test_stop_is_warm_first(tmp_path):
    child = start(py("warm", "import signal, sys, time; "
                             "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
                             "print('ready', flush=True); time.sleep(60)"),
                  log=tmp_path / "warm.log")
    wait_until(lambda: "ready" in child.log_tail(), [child], 10, "ready")
    assert running(child.pid)
    assert child.stop() == 0 and not child.alive() and not running(child.pid)


def test_stop_kills_what_does_not_exit_in_time(tmp_path):
    child = start(dataclasses.replace(py("hung", STUBBORN), stop_timeout_s=0.5),
                  log=tmp_path / "hung.log")
    wait_until(lambda: "ready" in child.log_tail(), [child], 10, "ready")
    assert child.stop() == -signal.SIGKILL
    assert "signal SIGKILL" in child.describe()


def test_stop_kills_the_whole_process_group(tmp_path):
    """What a child started (vLLM's engine core) does not outlive it."""
    grandchild = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys; "
            f"p = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}]); "
            f"open({str(grandchild)!r}, 'w').write(str(p.pid)); p.wait()")
    child = start(dataclasses.replace(py("parent", code), stop_timeout_s=0.5),
                  log=tmp_path / "parent.log")
    pid = int(wait_until(lambda: grandchild.exists() and grandchild.read_text(), [child], 10,
                         "grandchild started"))
    child.stop()
    # Reaped by init once killed; until then it may linger as a zombie.
    wait_until(lambda: not running(pid), [], 10, "grandchild gone")


def test_wait_until_fails_fast_with_the_log_when_a_child_dies(tmp_path):
    child = start(py("dies", "print('engine died: SIGILL'); raise SystemExit(1)"),
                  log=tmp_path / "dies.log")
    with pytest.raises(ChildFailed, match=r"(?s)dies \(pid \d+, exited with exit code 1\).*"
                                          r"engine died: SIGILL"):
        wait_until(lambda: False, [child], 60, "never ready")


def test_wait_until_times_out_with_the_log(tmp_path):
    child = start(py("slow", STUBBORN), log=tmp_path / "slow.log")
    try:
        with pytest.raises(ChildFailed, match=r"never: not reached within 0 s\n--- slow \(pid"):
            wait_until(lambda: False, [child], 0.5, "never")
    finally:
        child.kill()


def test_group_stops_in_reverse_order(tmp_path):
    order = tmp_path / "order"
    code = ("import signal, sys, time; "
            "signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], 'a').write(sys.argv[2] "
            "+ '\\n'), sys.exit(0))); print('ready', flush=True); time.sleep(60)")
    with Group(tmp_path / "logs") as group:
        for name in ("redis", "api", "worker"):
            group.start(ChildSpec(name, (PY, "-c", code, str(order), name)))
        group.wait_until(lambda: all("ready" in c.log_tail() for c in group.children), 10,
                         "all ready")
        assert group.exited() == [] and group["api"].alive()
        assert (tmp_path / "logs" / "api.log").exists()
        codes = group.stop()
    assert codes == {"redis": 0, "api": 0, "worker": 0}
    assert order.read_text().split() == ["worker", "api", "redis"]
    with pytest.raises(ValueError, match="already"):
        group.start(py("api", "pass"))


def test_echo_tags_each_line(capfd):
    child = start(py("talker", "print('one'); print('two')"), echo="talker| ")
    assert child.proc.wait(10) == 0
    wait_until(lambda: "two" in child.log_tail(), [], 5, "echoed")
    out = capfd.readouterr().out
    assert "talker| one\ntalker| two\n" in out
