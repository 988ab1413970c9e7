"""Where each worker `tailguard up` starts runs: its GPUs, or its share of the CPU cores.

`place_workers` is pure: given the [[workers]] entries and the host's cores or visible
GPUs, it says which workers run (each entry's replicas) and where, or refuses with a
ConfigError saying what does not fit. `plan_workers` is what `tailguard up` calls before
it starts anything: it reads the host and checks the engine tables against vLLM's own
EngineArgs, then places.

On a CUDA host, GPUs are numbered as this process sees them (within CUDA_VISIBLE_DEVICES,
as vLLM numbers them) and each worker is told its GPUs as CUDA_VISIBLE_DEVICES entries:

* entries with ``devices`` get them. A number past the visible GPUs is refused; a GPU
  named by two workers is refused unless each of them sets
  ``engine.gpu_memory_utilization`` and they add up to at most 1 (vLLM's way to run
  several engines on one GPU);
* then, in file order, each entry's replicas (``"fill"``: its first) take free GPUs, an
  engine of n GPUs an aligned block of n when one is free ([0,1], [2,3]), else the lowest
  n free;
* then the ``"fill"`` entry takes as many more replicas as the GPUs left hold;
* too few GPUs is refused, with what each entry needs; GPUs left over are reported
  (`Placement.notes`), never left idle without a word.

On a CPU host each entry's replicas (``"fill"``: one) split the cores evenly and
disjointly; ``devices`` mean nothing there.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from tailguard.errors import ConfigError
from tailguard.host.cores import Pinning
from tailguard.lanes.engine_options import check_against
from tailguard.lanes.table import FILL, LaneTable, WorkerSpec

#: how far past 1 the gpu_memory_utilization of a GPU's workers may add up (float sums)
_SHARE_SLACK = 1e-9


@dataclass(frozen=True)
class PlacedWorker:
    """One worker process: its name (an entry's, or a replica's), its entry, its pin."""

    name: str
    spec: WorkerSpec
    pin: Pinning
    #: its GPUs as this process numbers them (vLLM's numbering); () on a CPU host
    devices: tuple[int, ...] = ()

    def label(self) -> str:
        """For people: ``GPUs 2,3``, with this process's numbers when CUDA_VISIBLE_DEVICES
        makes them differ (``GPUs 4,5 (devices 0,1 of CUDA_VISIBLE_DEVICES)``)."""
        if self.devices and tuple(map(str, self.devices)) != self.pin.gpus:
            return (f"{self.pin.label()} (device{'s' if len(self.devices) > 1 else ''} "
                    f"{','.join(map(str, self.devices))} of CUDA_VISIBLE_DEVICES)")
        return self.pin.label()


@dataclass(frozen=True)
class Placement:
    """Every worker to start, in file order (an entry's replicas one after another)."""

    workers: tuple[PlacedWorker, ...]
    kind: str  # "cuda" or "cpu"
    #: visible GPUs no worker got (this process's numbers)
    idle: tuple[int, ...] = ()
    #: the [[workers]] entries that name devices on a CPU host, where they mean nothing
    ignored_devices: tuple[str, ...] = ()

    @property
    def pins(self) -> list[Pinning]:
        return [w.pin for w in self.workers]

    def notes(self) -> list[str]:
        """What `tailguard up` must say beyond each worker's line: devices left unused."""
        out = []
        if self.idle:
            many = len(self.idle) > 1
            out.append(f"GPU{'s' if many else ''} {','.join(map(str, self.idle))} serve"
                       f"{'' if many else 's'} no worker: no [[workers]] entry takes "
                       f"{'them' if many else 'it'} (`replicas`, `replicas = \"{FILL}\"` or "
                       "`devices` would)")
        if self.ignored_devices:
            out.append(f"devices of {', '.join(self.ignored_devices)} ignored: this is a CPU "
                       "host (the cores are split between the workers)")
        return out


def place_workers(workers: Sequence[WorkerSpec], kind: str, cores: Sequence[int] | None = None,
                  gpus: Sequence[str] | int | None = None) -> Placement:
    """Where each worker of `workers` runs on a `kind` ("cuda" or "cpu") host (the module
    docstring). `gpus`: the visible GPUs as CUDA_VISIBLE_DEVICES entries in vLLM's order,
    or how many there are (numbered from 0); `cores`: the CPU cores to split. Pure given
    them; else the host's (visible_gpus, the process's CPU affinity)."""
    if kind == "cuda":
        if gpus is None:
            from tailguard.host.devices import visible_gpus

            gpus = visible_gpus()
        visible = tuple(str(i) for i in range(gpus)) if isinstance(gpus, int) else tuple(gpus)
        return _on_gpus(tuple(workers), visible)
    return _on_cores(tuple(workers), sorted(cores if cores is not None
                                            else os.sched_getaffinity(0)))


def plan_workers(table: LaneTable, kind: str) -> Placement:
    """`tailguard up`'s placement: the engine tables checked against vLLM's EngineArgs
    (vLLM is imported for it, which takes seconds, only when there is a table), then the
    workers placed on this host."""
    if table.engine_tables:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
        except ImportError as exc:
            raise ConfigError(f"{table.source or 'the lanes file'} has engine tables, but vLLM "
                              f"does not import here ({exc}): no worker could start "
                              "(scripts/install.sh installs it)", field="engine") from None
        check_against(table, AsyncEngineArgs)
    return place_workers(table.workers, kind)


def _count(spec: WorkerSpec) -> int:
    """Its replicas before filling: "fill" is one."""
    return 1 if spec.replicas == FILL else int(spec.replicas)


def _on_cores(workers: tuple[WorkerSpec, ...], cores: list[int]) -> Placement:
    names = [(spec, spec.replica_name(k)) for spec in workers for k in range(1, _count(spec) + 1)]
    if len(cores) < len(names):
        # Fewer cores than engines: share rather than refuse (a laptop demo still runs).
        pins = [Pinning(cores=tuple(cores)) for _ in names]
    else:
        share, extra = divmod(len(cores), len(names))
        pins, start = [], 0
        for i in range(len(names)):
            n = share + (1 if i < extra else 0)
            pins.append(Pinning(cores=tuple(cores[start:start + n])))
            start += n
    return Placement(tuple(PlacedWorker(name, spec, pin) for (spec, name), pin in zip(names, pins)),
                     "cpu", ignored_devices=tuple(s.name for s in workers if s.devices is not None))


def _on_gpus(workers: tuple[WorkerSpec, ...], visible: tuple[str, ...]) -> Placement:
    n = len(visible)
    if n == 0:
        raise ConfigError("this is a CUDA host, but no GPU is visible to this process "
                          "(CUDA_VISIBLE_DEVICES hides them, or nvidia-smi lists none); "
                          "TAILGUARD_DEVICE=cpu runs on the CPU", field="TAILGUARD_DEVICE")
    numbered = f"numbered 0-{n - 1}" if n > 1 else "numbered 0"
    named: dict[int, list[WorkerSpec]] = {}
    for spec in workers:
        if spec.devices is None:
            continue
        missing = [d for d in spec.devices if d >= n]
        if missing:
            raise ConfigError(f"worker {spec.name!r} is given GPU {', '.join(map(str, missing))}, "
                              f"but this process sees {n} ({numbered}, within "
                              "CUDA_VISIBLE_DEVICES)", field="workers")
        for d in spec.devices:
            named.setdefault(d, []).append(spec)
    for d, sharing in named.items():
        if len(sharing) > 1:
            _check_shared(d, sharing)

    auto = [s for s in workers if s.devices is None]
    free = [d for d in range(n) if d not in named]
    need = sum(_count(s) * s.devices_per_engine for s in auto)
    if need > len(free):
        parts = [f"{s.name} {_count(s)} x {s.devices_per_engine}" for s in auto]
        taken = f"; {len(named)} named by `devices`" if named else ""
        raise ConfigError(f"too few GPUs: the workers need {need} besides those named by "
                          f"`devices` ({', '.join(parts)}{taken}), and this process sees {n} "
                          f"({numbered}, within CUDA_VISIBLE_DEVICES)", field="workers")
    got: dict[str, list[tuple[int, ...]]] = {s.name: [] for s in workers}
    for spec in workers:
        if spec.devices is not None:
            got[spec.name].append(spec.devices)
    for spec in auto:
        for _ in range(_count(spec)):
            got[spec.name].append(_take(free, spec.devices_per_engine, n))
    fill = next((s for s in auto if s.replicas == FILL), None)
    while fill is not None and len(free) >= fill.devices_per_engine:
        got[fill.name].append(_take(free, fill.devices_per_engine, n))
    placed = tuple(PlacedWorker(spec.replica_name(k), spec,
                                Pinning(gpus=tuple(visible[d] for d in devs)), devs)
                   for spec in workers for k, devs in enumerate(got[spec.name], start=1))
    return Placement(placed, "cuda", idle=tuple(free))


def _take(free: list[int], count: int, n: int) -> tuple[int, ...]:
    """`count` GPUs out of `free` (removed from it): the first aligned block of them that is
    all free (neighbours for a tensor-parallel engine), else the lowest free ones."""
    for start in range(0, n - count + 1, count):
        block = list(range(start, start + count))
        if all(d in free for d in block):
            break
    else:
        block = free[:count]
    for d in block:
        free.remove(d)
    return tuple(block)


def _check_shared(device: int, sharing: list[WorkerSpec]) -> None:
    """Several workers name `device`: each must size its share (gpu_memory_utilization),
    and the shares must fit in the GPU."""
    names = ", ".join(repr(s.name) for s in sharing)
    unsized = [s.name for s in sharing
               if not isinstance(s.engine.get("gpu_memory_utilization"), (int, float))
               or isinstance(s.engine.get("gpu_memory_utilization"), bool)]
    if unsized:
        raise ConfigError(f"GPU {device} is named by workers {names}: several engines on one GPU "
                          "need engine.gpu_memory_utilization each (vLLM's default, 0.9, is "
                          f"for one engine alone), and {', '.join(map(repr, unsized))} "
                          "set none", field="workers")
    total = sum(float(s.engine["gpu_memory_utilization"]) for s in sharing)
    if total > 1 + _SHARE_SLACK:
        raise ConfigError(f"GPU {device} is named by workers {names}, whose "
                          f"engine.gpu_memory_utilization add up to {total:g}: more than the "
                          "whole GPU", field="workers")
