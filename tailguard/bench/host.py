"""What else ran on this machine during a phase: CPU time used outside the benchmark's process tree.

A benchmark on a shared machine is only as good as its quiet: the report keeps,
per phase, the CPU seconds that processes other than the benchmark and the
topology it started (its descendants) used, so a disturbed run says so. Linux
only (/proc); elsewhere nothing is measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tailguard.pinning import below

#: A phase is flagged disturbed when others used more than this share of the machine's CPU
#: (and at least DISTURBED_MIN_S CPU seconds, so a few seconds of noise in a short phase is not).
DISTURBED_SHARE = 0.05
DISTURBED_MIN_S = 2.0
#: kthreadd: kernel threads (writeback, RCU, ...) are its children and mostly work for everyone.
KTHREADD_PID = 2


@dataclass(frozen=True)
class Proc:
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


def others_cpu(before: dict[int, Proc], after: dict[int, Proc], root: int,
               top: int = 3) -> tuple[float, list[tuple[str, float]]]:
    """CPU seconds used between two snapshots by processes outside `root`'s tree (kernel
    threads left out), and the heaviest of them by command name.

    A process that started and ended between the snapshots is in neither; its time is in
    its parent's reaped-children time, so that counts too, by the parent's name. A process
    that was in `before` and has ended took the time it had then into its parent's: that
    is taken back out, so only what it used since is counted.
    """
    ours = descendants(after, root) | descendants(before, root)
    ours |= descendants(after, KTHREADD_PID) | descendants(before, KTHREADD_PID)
    by_comm: dict[str, float] = {}

    def total(p: Proc) -> float:
        return p.cpu_s + p.children_cpu_s

    for pid, p in after.items():
        if pid in ours:
            continue
        prev = before.get(pid)
        delta = total(p) - (total(prev) if prev and prev.comm == p.comm else 0.0)
        if delta > 0:
            by_comm[p.comm] = by_comm.get(p.comm, 0.0) + delta
    for pid, prev in before.items():
        if pid not in after and pid not in ours:  # its time went to its parent's
            parent = after.get(prev.ppid)
            comm = parent.comm if parent is not None else prev.comm
            by_comm[comm] = by_comm.get(comm, 0.0) - total(prev)
    by_comm = {c: s for c, s in by_comm.items() if s > 0}
    heaviest = sorted(by_comm.items(), key=lambda kv: -kv[1])[:top]
    return sum(by_comm.values()), [(c, round(s, 1)) for c, s in heaviest]


class Watch:
    """CPU used by others over one phase; `stop()` returns the report's `host` entry."""

    def __init__(self) -> None:
        self.before = snapshot()
        self.t0 = os.times().elapsed
        self.load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    def stop(self) -> dict:
        after = snapshot()
        wall = os.times().elapsed - self.t0
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        cpu, heaviest = others_cpu(self.before, after, os.getpid())
        share = cpu / (wall * (cpus or 1)) if wall > 0 else 0.0
        return {"wall_s": round(wall, 1), "others_cpu_s": round(cpu, 1),
                "others_share": round(share, 3), "others_heaviest": heaviest,
                "disturbed": bool(after) and share > DISTURBED_SHARE and cpu >= DISTURBED_MIN_S,
                "loadavg_1m": [self.load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None]}
