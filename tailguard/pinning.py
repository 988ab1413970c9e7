"""Where each worker runs: one GPU each on a CUDA host, disjoint CPU cores otherwise.

The core plan on a CPU host: a pin puts the engine on its cores, and nothing else.
vLLM's OpenMP compute threads bind to them (``VLLM_CPU_OMP_THREADS_BIND``, as a plain
vLLM server binds them), and vLLM's own processes, the engine core (whose scheduler
busy-polls while each step runs) and the model runner, start there (`children_on`).
Pinning the whole worker process to the engine's cores made the front end slow its
own model down; leaving the engine-core process unpinned as well let its busy polling
take the other core from the API, Redis and Celery (docs/benchmarks.md, issue 12's
overhead runs). Off its engine's core, the engine core is faster only where the other
core is free (plain vLLM's placement in the overhead workload); beside the long engine
it made the short engine 21% slower, and beside an idle-priority one it took 39-48% of
that core (benchmarks/engine_core_placement.py). So it moves only while the front-end
cores are idle, below the front end there, and comes home as soon as they are busy
(tailguard/roaming.py).

The front end (the API, Redis, Flower, each worker's own threads: Celery, the engine
loop with its detokenization, Redis I/O; and a benchmark's load generator) runs on
the **front-end cores** (`frontend_cores`): by default, on a CPU host with two or more
workers, the cores of the *last* worker in the lanes file, so the engines of the
workers listed first (the short lane's, in the shipped file) have their cores to
themselves. The engine that shares its cores with the front end runs at a lower CPU
priority (`TAILGUARD_ENGINE_NICE`, `renice`), so a request's trip through
the front end never waits behind a long batch's compute; that engine gets what the
front end leaves, which is most of its cores. Left unpinned (the plan before), front-end
work landed on the short engine's core whenever the other core was busy with long
requests, and short requests decoded ~1.5x slower with long traffic than without.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.lanes import WorkerSpec

#: How an engine's processes are named: vLLM titles its engine-core process ``VLLM::EngineCore``
#: and its model runners ``VLLM::Worker`` (``_TP0``, ...; vllm.utils.system_utils.set_process_title,
#: which also sets the kernel's command name, cut to 15 characters: ``VLLM::EngineCor``).
ENGINE_CORE_COMM = "VLLM::EngineCor"
MODEL_RUNNER_COMM = "VLLM::Worker"
#: How a pin reaches vLLM: the cores its OpenMP compute threads bind to (vLLM's own variable).
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class Pinning:
    """One GPU, or a set of CPU cores, or (neither) anywhere."""

    gpu: int | None = None
    cores: tuple[int, ...] = ()

    @classmethod
    def from_options(cls, gpu: int | None, cores: str | None) -> "Pinning":
        """The pin given by `tailguard worker --gpu N` or `--cores 0,1` (see `options`)."""
        return cls(gpu=gpu, cores=tuple(int(c) for c in cores.split(",")) if cores else ())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Pinning":
        """The CPU pin `env()` handed this process; none for vLLM's own values (auto, all,
        nobind) or anything else that is not a list of cores and ranges (``0,2-3``)."""
        return cls(cores=parse_cores(environ.get(OMP_BIND_ENV, "")) or ())

    def options(self) -> list[str]:
        """The `tailguard worker` options that pin a worker here."""
        if self.gpu is not None:
            return ["--gpu", str(self.gpu)]
        return ["--cores", ",".join(map(str, self.cores))] if self.cores else []

    def label(self) -> str:
        """For people: `GPU 1`, `cores 0,1`."""
        if self.gpu is not None:
            return f"GPU {self.gpu}"
        return f"cores {','.join(map(str, self.cores))}" if self.cores else "any core"

    def env(self) -> dict[str, str]:
        """Environment that keeps a worker's engine on its device (the module docstring)."""
        if self.gpu is not None:
            return {"CUDA_VISIBLE_DEVICES": str(self.gpu)}
        if self.cores:
            cores = ",".join(map(str, self.cores))
            # vLLM's CPU backend binds its OpenMP threads itself; give it only our cores.
            return {OMP_BIND_ENV: cores, "OMP_NUM_THREADS": str(len(self.cores)),
                    "CUDA_VISIBLE_DEVICES": ""}
        return {}


def parse_cores(text: str) -> tuple[int, ...] | None:
    """``0,2-3`` as (0, 2, 3); None for anything else (empty, ``auto``, ``all``)."""
    cores: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            return None
        cores.extend(range(int(lo), int(hi) + 1) if dash else [int(lo)])
    return tuple(cores)


def frontend_cores(pins: Sequence[Pinning], setting: str = "auto") -> tuple[int, ...]:
    """The cores the front end runs on (the module docstring); () for anywhere. Pure.

    `setting` is TAILGUARD_FRONTEND_CORES: ``auto`` (the last worker's cores, when every
    worker has CPU cores of its own and there are two or more: with one worker, or on a
    GPU host, there is nothing to keep the front end away from), ``none``, or a core list.
    """
    if setting.strip().lower() == "none":
        return ()
    if setting.strip().lower() != "auto":
        cores = parse_cores(setting)
        if cores is None:
            raise ConfigError(f"{settings.FRONTEND_CORES.env} must be auto, none or a core list "
                              f"such as 1 or 2-3, got {setting!r}", field=settings.FRONTEND_CORES.env)
        return cores
    if len(pins) < 2 or any(p.gpu is not None or not p.cores for p in pins):
        return ()
    last = set(pins[-1].cores)
    if any(last & set(p.cores) for p in pins[:-1]):
        return ()  # fewer cores than engines: they share already (`plan`)
    return pins[-1].cores


def frontend_env(cores: tuple[int, ...]) -> dict[str, str]:
    """What a child of `tailguard up` or the benchmark is told of the front-end cores: a
    worker whose engine shares them lowers its engine's priority (`shares_frontend`)."""
    return {settings.FRONTEND_CORES.env: ",".join(map(str, cores)) if cores else "none"}


def shares_frontend(pin: Pinning, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this worker's engine cores include a front-end core (`frontend_env` told us)."""
    front = parse_cores(environ.get(settings.FRONTEND_CORES.env, "")) or ()
    return bool(set(pin.cores) & set(front))


def below(parents: Mapping[int, int], root: int) -> set[int]:
    """The processes below `root` (children and theirs), given each process's parent. Pure."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    out: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


@dataclass(frozen=True)
class Proc:
    """One process as its ``/proc/<pid>/stat`` line gives it (`parse_stat`): who its parent
    is (`descendants`), and its CPU time (tailguard/bench/host.py, tailguard/roaming.py)."""

    pid: int
    ppid: int
    comm: str
    cpu_s: float  # user + system
    #: user + system of its children that ended and that it reaped (cutime + cstime): a test
    #: run that starts and ends within a phase is counted here, in the shell that ran it
    children_cpu_s: float = 0.0


def parse_stat(text: str, ticks: int) -> Proc:
    """One /proc/<pid>/stat line (the command may hold spaces and parentheses)."""
    head, _, rest = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = rest.split()
    # fields[0] is the state (stat field 3): ppid is field 4, utime 14, stime 15, cutime 16,
    # cstime 17
    return Proc(int(pid), int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / ticks,
                (int(fields[13]) + int(fields[14])) / ticks)


def descendants(pid: int | None = None) -> set[int]:
    """The processes below `pid` (default: this process), children and theirs; read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = parse_stat(fh.read(), ticks=1).ppid
            except (OSError, ValueError, IndexError):
                pass
    return below(parents, os.getpid() if pid is None else pid)


def renice(pids: Iterable[int], nice: int) -> int:
    """Lower the CPU priority of every thread of the processes `pids` to at least `nice`;
    how many threads were changed.

    Linux keeps a nice value per thread and a new thread inherits its creator's, so the
    threads those processes start later run at `nice` too. Raising one's own children's
    nice needs no privilege. A process or thread that ended meanwhile is skipped.
    """
    changed = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                    changed += 1
            except OSError:  # ended meanwhile
                pass
    return changed


@contextmanager
def lowered_on_frontend(pin: Pinning, environ: Mapping[str, str] = os.environ) -> Iterator[None]:
    """Processes started within the block (an engine's) are `renice`d to
    ``TAILGUARD_ENGINE_NICE`` afterwards when `pin` shares the front-end cores
    (`shares_frontend`); only those: another engine of the process keeps its own."""
    nice = settings.ENGINE_NICE.get() if shares_frontend(pin, environ) else 0
    before = descendants() if nice > 0 else set()
    yield
    if nice > 0:
        renice(descendants() - before, nice)


def idle_priority() -> None:
    """Put the calling thread at the kernel's idle CPU priority (SCHED_IDLE). Threads and
    processes it starts inherit it: called on the thread that builds and starts an engine,
    it covers that engine's engine-core process and its compute threads, which then only
    run when the cores have nothing else to do (a borrowing worker's idle engine)."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def normal_priority_threads() -> None:
    """Once the idle engine is up: this process's threads back at normal priority (its
    engine-core process stays idle). A thread here at idle priority holding the GIL would
    be starved by the own engine's compute and stall every thread of the process, own
    lane's included (a priority inversion measured as short TTFT stalls of ~0.5 s)."""
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # the thread ended meanwhile
            pass


def pin_threads(cores: tuple[int, ...]) -> None:
    """Every thread of this process (and those they start) on `cores`; () does nothing."""
    if not cores:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:
            pass  # it has ended already


@contextmanager
def children_on(cores: tuple[int, ...]) -> Iterator[None]:
    """Processes this thread starts within the block run on `cores` (none: anywhere).

    A child inherits the CPU affinity of the thread that starts it, so only the calling
    thread's affinity changes, for the block; threads it starts meanwhile (ZeroMQ's
    I/O threads, say) are given the old affinity back at the end. An engine host builds
    its engine in here, so vLLM's engine-core process (whose scheduler busy-polls while
    each step runs) and model runner stay on the engine's cores, while the worker's own
    threads run where the OS finds room (the module docstring).
    """
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    threads = set(os.listdir("/proc/self/task"))
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        for tid in set(os.listdir("/proc/self/task")) - threads:
            try:
                os.sched_setaffinity(int(tid), before)
            except ProcessLookupError:
                pass  # it has ended already


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def device_kind() -> str:
    kind = settings.DEVICE.get()
    if kind not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{settings.DEVICE.env} must be auto, cpu or cuda, got {kind!r}",
                          field=settings.DEVICE.env)
    if kind == "auto":
        return "cuda" if gpu_count() > 0 else "cpu"
    return kind


def plan(workers: tuple[WorkerSpec, ...], kind: str, cores: list[int] | None = None,
         gpus: int | None = None) -> list[Pinning]:
    """Pinning of each worker, in order. Pure given `cores`/`gpus`."""
    if kind == "cuda":
        n = gpu_count() if gpus is None else gpus
        pins = [Pinning(gpu=w.gpu if w.gpu is not None else i) for i, w in enumerate(workers)]
        too_high = [p.gpu for p in pins if p.gpu is not None and p.gpu >= n]
        if too_high:
            raise ConfigError(f"{len(workers)} workers need GPUs {sorted({p.gpu for p in pins})} "
                              f"but this host has {n}", field="workers")
        return pins
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if len(cores) < len(workers):
        # Fewer cores than engines: share rather than refuse (a laptop demo still runs).
        return [Pinning(cores=tuple(cores)) for _ in workers]
    share, extra = divmod(len(cores), len(workers))
    pins, start = [], 0
    for i in range(len(workers)):
        n = share + (1 if i < extra else 0)
        pins.append(Pinning(cores=tuple(cores[start:start + n])))
        start += n
    return pins
