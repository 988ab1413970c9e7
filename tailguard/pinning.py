"""Where each worker runs: one GPU each on a CUDA host, disjoint CPU cores otherwise.

The core plan on a CPU host: a pin puts the engine on its cores, and nothing else.
vLLM's OpenMP compute threads bind to them (``VLLM_CPU_OMP_THREADS_BIND``, as a plain
vLLM server binds them), and vLLM's own processes, the engine core (whose scheduler
busy-polls while each step runs) and the model runner, start there (`children_on`).
The worker's front end (Celery's threads, the engine loop with its detokenization,
Redis I/O) is not pinned: the OS runs it wherever there is room. Pinning the whole
worker process to the engine's cores made the front end slow its own model down;
leaving the engine-core process unpinned as well let its busy polling take the other
core from the API, Redis and Celery (docs/benchmarks.md, issue 12's overhead runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.lanes import WorkerSpec

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
        cores: list[int] = []
        for part in environ.get(OMP_BIND_ENV, "").split(","):
            lo, dash, hi = part.strip().partition("-")
            if not lo.isdigit() or (dash and not hi.isdigit()):
                return cls()
            cores.extend(range(int(lo), int(hi) + 1) if dash else [int(lo)])
        return cls(cores=tuple(cores))

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
