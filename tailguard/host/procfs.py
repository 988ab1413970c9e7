"""Processes as /proc shows them, and their CPU priority: parse, walk, renice.

The one reader of ``/proc/<pid>/stat`` (`parse_stat`), used by the bench's CPU
accounting and by the engine-core roamer, and the one place priorities are changed
(`renice`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

#: and its model runners ``VLLM::Worker`` (``_TP0``, ...; vllm.utils.system_utils.set_process_title,
#: which also sets the kernel's command name, cut to 15 characters: ``VLLM::EngineCor``).
ENGINE_CORE_COMM = "VLLM::EngineCor"
MODEL_RUNNER_COMM = "VLLM::Worker"

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
    is (`descendants`), and its CPU time (tailguard/bench/host.py, tailguard/host/roaming.py)."""

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
    for tid in _threads(pids):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except OSError:  # ended meanwhile
            pass
    return changed


def move_threads(pids: Iterable[int], cores: tuple[int, ...]) -> int:
    """Every thread of the processes `pids` onto `cores`, but those already bound within them
    (vLLM's compute threads, one per core); how many moved. Threads they start later inherit
    their creator's cores. A process or thread that ended meanwhile is skipped."""
    moved = 0
    for tid in _threads(pids):
        try:
            if not os.sched_getaffinity(tid) <= set(cores):
                os.sched_setaffinity(tid, cores)
                moved += 1
        except OSError:  # ended meanwhile
            pass
    return moved


def _threads(pids: Iterable[int]) -> Iterator[int]:
    """The thread ids of the processes `pids` (a process that ended meanwhile has none)."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        yield from (int(t) for t in tids)
