"""Where workers run: disjoint cores on a CPU host, one GPU each on a CUDA host."""

import os
import subprocess
import sys
import threading

import pytest

from tailguard.errors import ConfigError
from tailguard.lanes import WorkerSpec
from tailguard.pinning import OMP_BIND_ENV, Pinning, children_on, plan

TWO = (WorkerSpec("short", ("short",)), WorkerSpec("long", ("long", "batch")))


@pytest.mark.parametrize("cores,expected", [
    ([0, 1], [(0,), (1,)]),
    ([0, 1, 2, 3, 4], [(0, 1, 2), (3, 4)]),
    ([4, 6], [(4,), (6,)]),
    ([0], [(0,), (0,)]),  # fewer cores than engines: shared, not refused
])
def test_cpu_cores_are_split_disjointly(cores, expected):
    assert [p.cores for p in plan(TWO, "cpu", cores=cores)] == expected


def test_cuda_one_gpu_per_worker_in_order():
    assert [p.gpu for p in plan(TWO, "cuda", gpus=2)] == [0, 1]


def test_cuda_explicit_gpu_and_too_few_gpus():
    specs = (WorkerSpec("short", ("short",), gpu=3), WorkerSpec("long", ("long",)))
    assert [p.gpu for p in plan(specs, "cuda", gpus=4)] == [3, 1]
    with pytest.raises(ConfigError, match="has 1"):
        plan(TWO, "cuda", gpus=1)


def test_pinning_env():
    assert Pinning(gpu=1).env() == {"CUDA_VISIBLE_DEVICES": "1"}
    env = Pinning(cores=(2, 3)).env()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and env["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("pin,options,label", [
    (Pinning(gpu=1), ["--gpu", "1"], "GPU 1"),
    (Pinning(cores=(0, 2)), ["--cores", "0,2"], "cores 0,2"),
    (Pinning(), [], "any core"),
])
def test_pinning_as_worker_options_and_back(pin, options, label):
    assert pin.options() == options and pin.label() == label
    gpu = int(options[1]) if options[:1] == ["--gpu"] else None
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
