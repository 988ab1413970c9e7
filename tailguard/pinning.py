"""Where each worker runs: one GPU each on a CUDA host, disjoint CPU cores otherwise.

On a CPU host a pin binds only the engine's compute: vLLM's OpenMP threads go to
the pinned cores (``VLLM_CPU_OMP_THREADS_BIND``), as a plain vLLM server binds
them. The worker's front end (Celery's threads, detokenization, Redis I/O, the
engine-core process's own Python thread) is not pinned: the OS runs it wherever
there is room, instead of on the cores whose compute it would slow down. Pinning
the whole worker process there made the front end compete with its own model
(issue 12: TTFT P99 219 ms against plain vLLM's 87 ms).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.lanes import WorkerSpec


@dataclass(frozen=True)
class Pinning:
    """One GPU, or a set of CPU cores, or (neither) anywhere."""

    gpu: int | None = None
    cores: tuple[int, ...] = ()

    @classmethod
    def from_options(cls, gpu: int | None, cores: str | None) -> "Pinning":
        """The pin given by `tailguard worker --gpu N` or `--cores 0,1` (see `options`)."""
        return cls(gpu=gpu, cores=tuple(int(c) for c in cores.split(",")) if cores else ())

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
            return {"VLLM_CPU_OMP_THREADS_BIND": cores, "OMP_NUM_THREADS": str(len(self.cores)),
                    "CUDA_VISIBLE_DEVICES": ""}
        return {}


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
