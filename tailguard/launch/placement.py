"""Where each worker `tailguard up` starts runs: its GPU, or its share of the CPU cores. Pure."""

from __future__ import annotations

import os

from tailguard.errors import ConfigError
from tailguard.host.cores import Pinning
from tailguard.host.devices import gpu_count
from tailguard.lanes.table import WorkerSpec


def place_workers(workers: tuple[WorkerSpec, ...], kind: str, cores: list[int] | None = None,
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
