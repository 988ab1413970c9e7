"""Child processes with real tiny children (`python -c ...`): start, pin, log, stop, kill."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

import pytest

from tailguard.host.cores import Pinning
from tailguard.host.procs import (
    ChildFailed,
    ChildSpec,
    Group,
    RestartPolicy,
    running,
    start,
    wait_until,
)

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
    """A pin binds the engine's compute threads (env); the process itself stays unpinned."""
    core = min(os.sched_getaffinity(0))
    child = start(py("pinned", "import os; print(sorted(os.sched_getaffinity(0)), "
                               "os.environ['VLLM_CPU_OMP_THREADS_BIND'], os.environ['MINE'])",
                     env={"MINE": "yes"}, pin=Pinning(cores=(core,))),
                  log=tmp_path / "pinned.log")
    assert child.proc.wait(10) == 0
    assert (tmp_path / "pinned.log").read_text() == (
        f"{sorted(os.sched_getaffinity(0))} {core} yes\n")


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


def test_restart_backoff_doubles_and_is_capped():
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


#: Runs until stopped (SIGTERM ends it at once).
SLEEPER = "import time; time.sleep(60)"
#: Exits at once, leaving a line per run in the file named by its argument.
CRASHER = "import sys; open(sys.argv[1], 'a').write('run\\n'); sys.exit(7)"


def test_supervise_restarts_with_backoff_in_place(tmp_path):
    runs = tmp_path / "runs"
    policy = RestartPolicy(backoff_s=0.2, max_restarts=10, window_s=60)
    with Group(tmp_path / "logs") as group:
        group.start(py("first", SLEEPER))
        group.start(ChildSpec("crasher", (PY, "-c", CRASHER, str(runs)), restart=policy))
        group.start(py("last", SLEEPER))
        crasher = group["crasher"]
        crasher.proc.wait(10)
        t0 = 1000.0
        said = group.supervise(now=t0)
        assert len(said) == 1 and "exit code 7" in said[0] and "restarting it in 0.2 s" in said[0]
        assert group.supervise(now=t0 + 0.1) == [] and group["crasher"] is crasher  # backing off
        said = group.supervise(now=t0 + 0.2)
        assert said and said[0].startswith("restarted crasher")
        assert [c.name for c in group.children] == ["first", "crasher", "last"]  # same place
        assert group["crasher"] is not crasher and group.failed() == []
        group["crasher"].proc.wait(10)
        assert "restarting it in 0.4 s" in group.supervise(now=t0 + 0.3)[0]  # doubled
        group.supervise(now=t0 + 0.7)
        group["crasher"].proc.wait(10)
    assert runs.read_text() == "run\n" * 3
    assert (tmp_path / "logs" / "crasher.log").exists()


def test_crash_loop_guard_leaves_the_child_down(tmp_path):
    runs = tmp_path / "runs"
    policy = RestartPolicy(backoff_s=0.01, max_restarts=2, window_s=60)
    with Group(tmp_path / "logs") as group:
        group.start(ChildSpec("crasher", (PY, "-c", CRASHER, str(runs)), restart=policy))
        now, said = 0.0, []
        for _ in range(200):
            group["crasher"].proc.wait(10)
            now += 0.05
            said += group.supervise(now=now)
            if group.given_up:
                break
        assert list(group.given_up) == ["crasher"]
        assert "restarted 2 times within 60 s (a crash loop); left down" in said[-1]
        assert group.failed() == [group["crasher"]]
        assert group.supervise(now=now + 100) == []  # stays down
    assert runs.read_text() == "run\n" * 3  # the first run and 2 restarts


def test_restarts_outside_the_window_do_not_count(tmp_path):
    policy = RestartPolicy(backoff_s=0.01, max_restarts=1, window_s=10)
    with Group(tmp_path / "logs") as group:
        group.start(ChildSpec("crasher", (PY, "-c", CRASHER, str(tmp_path / "runs")),
                              restart=policy))
        for now in (0.0, 1.0, 20.0, 21.0):  # exit, restart; 19 s later: exit, restart again
            group["crasher"].proc.wait(10)
            group.supervise(now=now)
        assert group.given_up == {}


def test_exit_without_policy_is_a_failure_not_a_restart(tmp_path):
    with Group(tmp_path / "logs") as group:
        child = group.start(py("once", "raise SystemExit(2)"))
        child.proc.wait(10)
        assert group.supervise() == [] and group.failed() == [child]


def test_stop_can_put_the_api_first_and_nothing_restarts_after(tmp_path):
    order = tmp_path / "order"
    code = ("import signal, sys, time; "
            "signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], 'a').write(sys.argv[2] "
            "+ '\\n'), sys.exit(0))); print('ready', flush=True); time.sleep(60)")
    policy = RestartPolicy(backoff_s=0.0)
    group = Group(tmp_path / "logs")
    for name in ("redis", "api", "worker", "flower"):
        group.start(ChildSpec(name, (PY, "-c", code, str(order), name), restart=policy))
    group.wait_until(lambda: all("ready" in c.log_tail() for c in group.children), 10, "all ready")
    codes = group.stop(first=["api"])
    assert list(codes) == ["redis", "api", "worker", "flower"] and set(codes.values()) == {0}
    assert order.read_text().split() == ["api", "flower", "worker", "redis"]
    assert group.supervise() == []  # stopped children stay stopped


def test_kill_ends_a_stop_that_waits(tmp_path):
    group = Group(tmp_path / "logs")
    group.start(dataclasses.replace(py("hung", STUBBORN), stop_timeout_s=60))
    group.wait_until(lambda: "ready" in group["hung"].log_tail(), 10, "ready")
    group.kill()
    assert group.stop() == {"hung": -signal.SIGKILL}
