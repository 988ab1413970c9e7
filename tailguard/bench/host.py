"""Where the CPU went during a phase: outside the benchmark's process tree, and within it.

A benchmark on a shared machine is only as good as its quiet: the report keeps,
per phase, the CPU seconds that processes other than the benchmark and the
topology it started (its descendants) used, so a disturbed run says so. Within
the tree it splits the benchmark's own CPU into the vLLM engines' (their
engine-core and model-runner processes, `is_engine`) and the front end's
(everything else: Redis, the API, Flower, the workers' own threads, the load
generator), the figures `tailguard plan` fits its front-end cost from
(tailguard/plan/stepmodel.py). Linux only (/proc); elsewhere nothing is measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tailguard.host.procfs import ENGINE_CORE_COMM, MODEL_RUNNER_COMM, Proc, below, parse_stat

#: A phase is flagged disturbed when others used more than this share of the machine's CPU
#: (and at least DISTURBED_MIN_S CPU seconds, so a few seconds of noise in a short phase is not).
DISTURBED_SHARE = 0.05
DISTURBED_MIN_S = 2.0
#: kthreadd: kernel threads (writeback, RCU, ...) are its children and mostly work for everyone.
KTHREADD_PID = 2
#: How an engine's processes are named (tailguard/host/cores.py).
ENGINE_COMMS = (ENGINE_CORE_COMM, MODEL_RUNNER_COMM)


def snapshot() -> dict[int, Proc]:
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    procs = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                p = parse_stat(fh.read(), ticks)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        procs[p.pid] = p
    return procs


def descendants(procs: dict[int, Proc], root: int) -> set[int]:
    """`root` and the processes below it in a snapshot."""
    return {root} | below({p.pid: p.ppid for p in procs.values()}, root)


def is_engine(p: Proc) -> bool:
    """Whether `p` is a vLLM engine's own process (engine core or model runner), by its name."""
    return p.comm.startswith(ENGINE_COMMS)


def engine_pids(before: dict[int, Proc], after: dict[int, Proc]) -> set[int]:
    """The engines' processes in two snapshots: those with an engine's name, and what they
    start (a model runner is a bare `python` spawn child until it names itself, which is
    seconds when an engine is built meanwhile: a borrowing worker's idle engine)."""
    engines: set[int] = set()
    for procs in (before, after):
        named = {p.pid for p in procs.values() if is_engine(p)}
        parents = {p.pid: p.ppid for p in procs.values()}
        for pid in named:
            engines |= {pid} | below(parents, pid)
    return engines


def cpu_by(before: dict[int, Proc], after: dict[int, Proc], pids: set[int],
           key: Callable[[Proc], str]) -> dict[str, float]:
    """CPU seconds the processes `pids` used between two snapshots, summed by `key`.

    A process that started and ended between the snapshots is in neither; its time is in
    its parent's reaped-children time, so that counts too, under the parent's key. A process
    that was in `before` and has ended took the time it had then into its parent's: that
    is taken back out, so only what it used since is counted. A pid whose command changed
    is a new process (the pid was reused): all its time is counted.
    """
    out: dict[str, float] = {}

    def total(p: Proc) -> float:
        return p.cpu_s + p.children_cpu_s

    for pid, p in after.items():
        if pid not in pids:
            continue
        prev = before.get(pid)
        delta = total(p) - (total(prev) if prev and prev.comm == p.comm else 0.0)
        if delta > 0:
            out[key(p)] = out.get(key(p), 0.0) + delta
    for pid, prev in before.items():
        if pid not in after and pid in pids:  # its time went to its parent's
            parent = after.get(prev.ppid)
            k = key(parent if parent is not None else prev)
            out[k] = out.get(k, 0.0) - total(prev)
    return out


def others_cpu(before: dict[int, Proc], after: dict[int, Proc], root: int,
               top: int = 3) -> tuple[float, list[tuple[str, float]]]:
    """CPU seconds used between two snapshots by processes outside `root`'s tree (kernel
    threads left out), and the heaviest of them by command name (`cpu_by`)."""
    ours = descendants(after, root) | descendants(before, root)
    ours |= descendants(after, KTHREADD_PID) | descendants(before, KTHREADD_PID)
    by_comm = cpu_by(before, after, (set(before) | set(after)) - ours, lambda p: p.comm)
    by_comm = {c: s for c, s in by_comm.items() if s > 0}
    heaviest = sorted(by_comm.items(), key=lambda kv: -kv[1])[:top]
    return sum(by_comm.values()), [(c, round(s, 1)) for c, s in heaviest]


#: the key the engines' CPU is summed under in `own_split` (no process is named so)
_ENGINES = "\0engines"


def own_split(before: dict[int, Proc], after: dict[int, Proc], root: int) -> dict[str, float]:
    """CPU seconds used between two snapshots by `root`'s tree (`root` itself included): the
    engines' together (`engine_pids`) under one key, each front-end process's by name."""
    ours = descendants(after, root) | descendants(before, root)
    engines = engine_pids(before, after)
    return cpu_by(before, after, ours, lambda p: _ENGINES if p.pid in engines else p.comm)


def frontend_heaviest(before: dict[int, Proc], after: dict[int, Proc], root: int,
                      top: int = 6, split: dict[str, float] | None = None
                      ) -> list[tuple[str, float]]:
    """The front end's CPU seconds between two snapshots by process name, heaviest first:
    which part of the front end a phase's CPU went to. The names are what the processes
    call themselves: Celery's and gunicorn's titles name a worker's node (``[celeryd:
    short``) and gunicorn's master and worker; the kernel keeps 15 characters. `split`:
    `own_split`'s, if already taken."""
    split = own_split(before, after, root) if split is None else split
    front = sorted(((k, v) for k, v in split.items() if k != _ENGINES), key=lambda kv: -kv[1])
    return [(k, round(v, 1)) for k, v in front[:top] if v > 0]


def own_cpu(before: dict[int, Proc], after: dict[int, Proc], root: int,
            split: dict[str, float] | None = None) -> tuple[float, float]:
    """CPU seconds used between two snapshots by `root`'s tree, split into the front end's
    (`root` itself included) and the engines' (`engine_pids`). `split`: `own_split`'s, if
    already taken."""
    split = own_split(before, after, root) if split is None else split
    frontend = sum(v for k, v in split.items() if k != _ENGINES)
    return max(frontend, 0.0), max(split.get(_ENGINES, 0.0), 0.0)


def engines_idle(root: int, interval_s: float = 1.0, busy_share: float = 0.1) -> bool:
    """Whether `root`'s engines used less than `busy_share` of a core over the next
    `interval_s`: none is still being built or warming up (a borrowing worker builds its
    idle-priority engine at idle priority, so it can still be starting when its lanes are
    already served)."""
    before = snapshot()
    time.sleep(interval_s)
    _, engine = own_cpu(before, snapshot(), root)
    return engine < busy_share * interval_s


class Watch:
    """CPU used over one phase, by others and by our front end and engines (`own_cpu`);
    `stop()` returns the report's `host` entry."""

    def __init__(self) -> None:
        self.before = snapshot()
        self.t0 = os.times().elapsed
        self.load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    def stop(self) -> dict:
        after = snapshot()
        wall = os.times().elapsed - self.t0
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        cpu, heaviest = others_cpu(self.before, after, os.getpid())
        split = own_split(self.before, after, os.getpid())
        frontend, engine = own_cpu(self.before, after, os.getpid(), split)
        share = cpu / (wall * (cpus or 1)) if wall > 0 else 0.0
        return {"wall_s": round(wall, 1), "others_cpu_s": round(cpu, 1),
                "others_share": round(share, 3), "others_heaviest": heaviest,
                "frontend_cpu_s": round(frontend, 1), "engine_cpu_s": round(engine, 1),
                "frontend_heaviest": frontend_heaviest(self.before, after, os.getpid(),
                                                       split=split),
                "disturbed": bool(after) and share > DISTURBED_SHARE and cpu >= DISTURBED_MIN_S,
                "loadavg_1m": [self.load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None]}
