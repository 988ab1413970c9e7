"""Pins: a worker's GPUs or cores, as options, environment and labels; the front-end cores.

Where `tailguard up` places its workers is tests/unit/test_launch_placement.py."""

import os
import subprocess
import sys
import threading

import pytest

from tailguard.errors import ConfigError
from tailguard.host import procs
from tailguard.host.cores import (
    OMP_BIND_ENV,
    Pinning,
    children_on,
    frontend_cores,
    frontend_env,
    shares_frontend,
)


def test_pinning_env():
    assert Pinning(gpus=("1",)).env() == {"CUDA_VISIBLE_DEVICES": "1"}
    assert Pinning(gpus=("2", "3")).env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    env = Pinning(cores=(2, 3)).env()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and env["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("pin,options,label", [
    (Pinning(gpus=("1",)), ["--gpu", "1"], "GPU 1"),
    (Pinning(gpus=("0", "1")), ["--gpu", "0,1"], "GPUs 0,1"),
    (Pinning(gpus=("GPU-8f2a",)), ["--gpu", "GPU-8f2a"], "GPU GPU-8f2a"),  # a UUID entry
    (Pinning(cores=(0, 2)), ["--cores", "0,2"], "cores 0,2"),
    (Pinning(), [], "any core"),
])
def test_pinning_as_worker_options_and_back(pin, options, label):
    assert pin.options() == options and pin.label() == label
    gpu = options[1] if options[:1] == ["--gpu"] else None
    cores = options[1] if options[:1] == ["--cores"] else None
    assert Pinning.from_options(gpu, cores) == pin


@pytest.mark.parametrize("value,cores", [
    ("2,3", (2, 3)), ("0", (0,)), ("0,2-4", (0, 2, 3, 4)),
    ("auto", ()), ("all", ()), ("nobind", ()), ("", ()), ("0-1|2-3", ()),
])
def test_pinning_from_env_reads_back_what_env_wrote(value, cores):
    assert Pinning.from_env({OMP_BIND_ENV: value}).cores == cores
    assert Pinning.from_env({}).cores == ()
    if cores:
        assert Pinning.from_env(Pinning(cores=cores).env()) == Pinning(cores=cores)


def test_children_on_pins_only_the_processes_the_thread_starts():
    """A child started in the block runs on the cores; the thread, a thread it started in the
    block and the rest of the process do not."""
    mine = os.sched_getaffinity(0)
    core = min(mine)
    seen = {}

    def start_one():
        release = threading.Event()
        with children_on((core,)):
            out = subprocess.run(
                [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                capture_output=True, text=True, check=True).stdout
            helper = threading.Thread(target=lambda: (release.wait(10), seen.update(
                helper=os.sched_getaffinity(0))))
            helper.start()
        release.set()
        helper.join()
        seen["child"], seen["thread_after"] = out.strip(), os.sched_getaffinity(0)

    thread = threading.Thread(target=start_one)
    thread.start()
    thread.join()
    assert seen == {"child": f"[{core}]", "thread_after": mine, "helper": mine}
    assert os.sched_getaffinity(0) == mine


# --- the front-end cores (the module docstring of tailguard/host/cores.py) ---------------------

@pytest.mark.parametrize("pins,setting,expected", [
    ([Pinning(cores=(0,)), Pinning(cores=(1,))], "auto", (1,)),          # the last worker's
    ([Pinning(cores=(0, 1, 2)), Pinning(cores=(3, 4))], "auto", (3, 4)),
    ([Pinning(cores=(0,))], "auto", ()),                                 # one worker: anywhere
    ([Pinning(cores=(0,)), Pinning(cores=(0,))], "auto", ()),            # engines share cores
    ([Pinning(gpus=("0",)), Pinning(gpus=("1",))], "auto", ()),          # a GPU host
    ([Pinning(cores=(0,)), Pinning(cores=(1,))], "none", ()),
    ([Pinning(cores=(0,)), Pinning(cores=(1,))], "0,2-3", (0, 2, 3)),   # as the user says
])
def test_frontend_cores(pins, setting, expected):
    assert frontend_cores(pins, setting) == expected


def test_frontend_cores_refuses_what_is_not_a_core_list():
    with pytest.raises(ConfigError, match="TAILGUARD_FRONTEND_CORES"):
        frontend_cores([Pinning(cores=(0,))], "the second one")


def test_a_worker_learns_whether_its_engine_shares_the_front_end_cores():
    env = frontend_env((1,))
    assert shares_frontend(Pinning(cores=(1,)), env)
    assert not shares_frontend(Pinning(cores=(0,)), env)
    assert not shares_frontend(Pinning(cores=(1,)), frontend_env(()))  # "none"
    assert not shares_frontend(Pinning(cores=(1,)), {})                # started by hand


def test_renice_of_the_descendants_lowers_every_thread_of_them_only():
    """A child and its own child (vLLM's engine core and what it starts) get the nice value;
    the process that calls it keeps its own. Run in a process of its own, so the test
    session's other children (a Redis) are not touched."""
    script = """
import os, subprocess, sys
from tailguard.host.procfs import descendants, renice
sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
child = subprocess.Popen([sys.executable, "-c",
                          "import subprocess, sys, time; "
                          "p = subprocess.Popen(%r, stdout=subprocess.DEVNULL); "
                          "print(p.pid, flush=True); time.sleep(30)" % (sleeper,)],
                         stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
mine = os.getpriority(os.PRIO_PROCESS, 0)
first, again = renice(descendants(), mine + 5), renice(descendants(), mine + 5)
print(first, again, mine, os.getpriority(os.PRIO_PROCESS, 0),
      os.getpriority(os.PRIO_PROCESS, child.pid), os.getpriority(os.PRIO_PROCESS, grandchild))
os.kill(grandchild, 9)
child.kill()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    first, again, mine, caller, child, grandchild = map(int, out)
    assert first >= 2 and again == 0  # the second call finds them there already
    assert (caller, child, grandchild) == (mine, mine + 5, mine + 5)


def test_renice_lowers_only_the_processes_given():
    """Of two children, only the one started after `before` is reniced: how a process with
    two engines lowers one engine's priority and not the other's."""
    script = """
import os, subprocess, sys
from tailguard.host.procfs import descendants, renice
sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
first = subprocess.Popen(sleeper, stdout=subprocess.DEVNULL)
before = descendants()
second = subprocess.Popen(sleeper, stdout=subprocess.DEVNULL)
mine = os.getpriority(os.PRIO_PROCESS, 0)
new = descendants() - before
changed = renice(new, mine + 5)
print(changed, sorted(new) == [second.pid], first.pid in before, mine,
      os.getpriority(os.PRIO_PROCESS, first.pid), os.getpriority(os.PRIO_PROCESS, second.pid))
first.kill(); second.kill()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    changed, only_second, first_before = int(out[0]), out[1], out[2]
    mine, first, second = map(int, out[3:])
    assert changed >= 1 and only_second == "True" and first_before == "True"
    assert (first, second) == (mine, mine + 5)


def test_a_child_runs_on_its_specs_cpus(tmp_path):
    """The front end's processes start on the front-end cores; we stay where we were."""
    mine = os.sched_getaffinity(0)
    core = max(mine)
    spec = procs.ChildSpec("probe", (sys.executable, "-c",
                                     "import os; print(sorted(os.sched_getaffinity(0)))"),
                           cpus=(core,))
    child = procs.start(spec, log=tmp_path / "probe.log")
    assert child.proc.wait(30) == 0
    assert (tmp_path / "probe.log").read_text().strip() == f"[{core}]"
    assert os.sched_getaffinity(0) == mine


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_move_threads_moves_a_process_onto_cores_but_threads_bound_within_them():
    """A child's threads move onto the cores given; one already bound to a core among them
    (vLLM's compute threads) keeps its own binding."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    script = f"""
import os, subprocess, sys, time
from tailguard.host.procfs import move_threads
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
os.sched_setaffinity(inside.pid, {{{b}}})
time.sleep(0.2)
moved = move_threads([child.pid, inside.pid], ({a}, {b}))
print(moved, sorted(os.sched_getaffinity(child.pid)), sorted(os.sched_getaffinity(inside.pid)))
moved_again = move_threads([child.pid], ({a},))
print(moved_again, sorted(os.sched_getaffinity(child.pid)))
child.kill(); inside.kill()
"""
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, check=True).stdout.splitlines()
    assert lines[0].split(" ", 1)[1] == f"[{a}, {b}] [{b}]"
    assert lines[1].split(" ", 1)[1] == f"[{a}]" and int(lines[1].split()[0]) >= 1
