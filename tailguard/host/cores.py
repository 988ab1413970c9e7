"""Which cores a process and its children run on: the core plan of a CPU host.

A pin puts an engine on its cores and nothing else: vLLM's OpenMP compute threads bind
to them (``VLLM_CPU_OMP_THREADS_BIND``, as a plain vLLM server binds them) and vLLM's own
processes, the engine core and the model runner, start there (`children_on`). The
front end (the API, Redis, Flower, each worker's own threads, a benchmark's load
generator) runs on the **front-end cores** (`frontend_cores`): by default the cores of
the last worker in the lanes file, whose engine runs below it (`lowered_on_frontend`),
so the engines listed first keep their cores to themselves. Why this plan and what it
was measured against: docs/cpu-hosts.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.host.procfs import descendants, renice

#: How a pin reaches vLLM: the cores its OpenMP compute threads bind to (vLLM's own variable).
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"

#: How a pin reaches CUDA: the GPUs a process may use, as the CUDA runtime and vLLM read them.
GPU_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Pinning:
    """GPUs, or a set of CPU cores, or (neither) anywhere.

    `gpus` are CUDA_VISIBLE_DEVICES entries (a GPU's number on the host, or its UUID), so
    a pin is what the child's CUDA_VISIBLE_DEVICES says: ``("2", "3")`` runs a
    tensor-parallel-2 engine on the host's GPUs 2 and 3, which vLLM then numbers 0 and 1.
    """

    gpus: tuple[str, ...] = ()
    cores: tuple[int, ...] = ()

    @classmethod
    def from_options(cls, gpu: str | None, cores: str | None) -> Pinning:
        """The pin given by `tailguard worker --gpu 0,1` or `--cores 0,1` (see `options`)."""
        return cls(gpus=tuple(g.strip() for g in gpu.split(",") if g.strip()) if gpu else (),
                   cores=tuple(int(c) for c in cores.split(",")) if cores else ())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Pinning:
        """The CPU pin `env()` handed this process; none for vLLM's own values (auto, all,
        nobind) or anything else that is not a list of cores and ranges (``0,2-3``)."""
        return cls(cores=parse_cores(environ.get(OMP_BIND_ENV, "")) or ())

    def options(self) -> list[str]:
        """The `tailguard worker` options that pin a worker here."""
        if self.gpus:
            return ["--gpu", ",".join(self.gpus)]
        return ["--cores", ",".join(map(str, self.cores))] if self.cores else []

    def label(self) -> str:
        """For people: `GPU 1`, `GPUs 2,3`, `cores 0,1`."""
        if self.gpus:
            return f"GPU{'s' if len(self.gpus) > 1 else ''} {','.join(self.gpus)}"
        return f"cores {','.join(map(str, self.cores))}" if self.cores else "any core"

    def env(self) -> dict[str, str]:
        """Environment that keeps a worker's engine on its device (the module docstring)."""
        if self.gpus:
            return {GPU_ENV: ",".join(self.gpus)}
        if self.cores:
            cores = ",".join(map(str, self.cores))
            # vLLM's CPU backend binds its OpenMP threads itself; give it only our cores.
            return {OMP_BIND_ENV: cores, "OMP_NUM_THREADS": str(len(self.cores)), GPU_ENV: ""}
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
    if len(pins) < 2 or any(p.gpus or not p.cores for p in pins):
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
