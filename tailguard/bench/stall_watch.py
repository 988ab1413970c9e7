"""Whether the whole machine stalled during a phase, and when.

The front end (the API, once the worker with it) has been seen to stop for seconds at
once while no engine loop stalled and Redis logged no latency event (docs/cpu-hosts.md,
"Where the front end runs"). What else could stop every front-end process together is
the machine: its CPU saturated
(the kernel's pressure stall information, ``/proc/pressure/cpu``), I/O (``io``), or,
on a VM, the hypervisor not running our vCPUs (steal time, ``/proc/stat``). A phase
samples the three counters four times a second on a thread of the load generator and
keeps each one's worst 1-second window and when it began, and the longest gap between
its own samples (a sampler that ran late is a load generator that did not run), so the
report says whether a stall seen in the samples lines up with one of them. Under the
default load both cores are busy and CPU pressure reads near 100% in some second of
every phase; steal, I/O and the sampler's gap are what single out a stall. Linux only;
elsewhere nothing is sampled.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

INTERVAL_S = 0.25
WINDOW_S = 1.0


def read_counters() -> dict[str, float] | None:
    """Cumulative seconds: CPU and I/O pressure ("some": at least one task waited) and the
    CPU time stolen from all vCPUs; None where the kernel gives none of them."""
    out: dict[str, float] = {}
    for kind in ("cpu", "io"):
        try:
            with open(f"/proc/pressure/{kind}") as fh:
                for line in fh:
                    if line.startswith("some "):
                        total = line.rpartition("total=")[2]
                        out[f"{kind}_some"] = int(total) / 1e6  # microseconds
        except (OSError, ValueError):
            pass
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        if fields and fields[0] == "cpu" and len(fields) > 8:
            out["steal"] = int(fields[8]) / (os.sysconf("SC_CLK_TCK") or 100)
    except (OSError, ValueError):
        pass
    return out or None


def worst_window(points: Sequence[tuple[float, float]], window_s: float = WINDOW_S
                 ) -> tuple[float, float] | None:
    """The largest rise per second of a cumulative counter over the spans of at least
    `window_s` that end at each sample (starting at the latest sample that allows it), as
    (rise per second, start of the span); a phase shorter than a window gives its whole
    span; None for fewer than two samples. `points` are (time, counter) in time order. Pure."""
    if len(points) < 2:
        return None
    if points[-1][0] - points[0][0] < window_s:  # a phase shorter than a window: its span
        (t0, c0), (t1, c1) = points[0], points[-1]
        return ((c1 - c0) / (t1 - t0) if t1 > t0 else 0.0), t0
    best: tuple[float, float] | None = None
    i = 0
    for t1, c1 in points:
        if t1 - points[0][0] < window_s:
            continue  # no full window ends here yet
        while t1 - points[i + 1][0] >= window_s:
            i += 1  # the latest start at least a window before this end
        t0, c0 = points[i]
        rate = (c1 - c0) / (t1 - t0)
        if best is None or rate > best[0]:
            best = (rate, t0)
    return best


def longest_gap(times: Sequence[float]) -> tuple[float, float] | None:
    """The longest time between two samples and when it began; None for fewer than two. Pure."""
    gaps = [(b - a, a) for a, b in zip(times, times[1:])]
    return max(gaps) if gaps else None


class StallWatch:
    """Samples `read_counters` on a daemon thread until `stop()`, which returns the phase's
    worst 1-second windows: ``{"cpu_some": {"share": .., "at_s": ..}, ...}`` where `share` is
    the fraction of that second the counter grew by (for steal, summed over vCPUs, so it can
    exceed 1 on a multi-core VM) and `at_s` is seconds from the phase's start; and
    ``"sample_gap": {"max_s": .., "at_s": ..}``, the longest time between two samples."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.t0 = time.monotonic()
        self.interval_s = interval_s
        self.points: list[tuple[float, dict[str, float]]] = []
        self._done = threading.Event()
        first = read_counters()
        self._thread = None
        if first is not None:
            self.points.append((0.0, first))
            self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            counters = read_counters()
            if counters is not None:
                self.points.append((time.monotonic() - self.t0, counters))

    def stop(self) -> dict[str, dict[str, float]]:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        out: dict[str, dict[str, float]] = {}
        gap = longest_gap([t for t, _ in self.points])
        if gap is not None:
            # the sampler itself late: this process (on a front-end core) did not run
            out["sample_gap"] = {"max_s": round(gap[0], 3), "at_s": round(gap[1], 2)}
        names = set().union(*(c.keys() for _, c in self.points)) if self.points else set()
        for name in sorted(names):
            series = [(t, c[name]) for t, c in self.points if name in c]
            worst = worst_window(series)
            if worst is not None:
                out[name] = {"share": round(worst[0], 3), "at_s": round(worst[1], 2)}
        return out


def describe(stalls: dict[str, dict[str, float]]) -> str:
    """`StallWatch.stop()`'s result in one line, for the phase's log."""
    worst = ", ".join(f"{name} {w['share']:.0%} at {w['at_s']:g} s"
                      for name, w in stalls.items() if "share" in w)
    gap = stalls.get("sample_gap")
    return ("worst second: " + (worst or "not measured")
            + (f"; longest sampler gap {gap['max_s']:g} s at {gap['at_s']:g} s" if gap else ""))
