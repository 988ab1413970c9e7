"""Static lanes, lanes that follow the load, one shared engine per GPU: one trace, one fleet.

`tailguard plan --compare-follow 8,64` (tailguard/plan/command.py). For a fleet of N GPUs,
one engine per GPU, three simulations of the same arrivals (by default a window of the Azure
trace: tailguard/plan/azure.py):

* **static lanes**: the lanes file's workers as `tailguard up` lays them out on N GPUs (each
  entry its replicas, the ``"fill"`` entry the GPUs left), none moved; borrowing as on a GPU
  (``auto``: none);
* **lanes that follow the load**: the same layout, and the lane controller's own policy
  (tailguard/lanes/rebalance.py) moving whole engines as the entries' ``moves_to`` allow
  (tailguard/plan/sim.py, ``Follow``);
* **one shared engine per GPU**: N engines consuming one queue that takes every request.

Each row: the short class's end-to-end and TTFT P99, the long class's TTFT P99, goodput
(requests per second within their class's SLO, over the span from the first arrival to the
last end: `tailguard bench`'s defaults, ``SLO``), every class's output tokens per second, the
moves made and the requests a move handed back.

**Where following stops being worth it** (``verdict``, over a grid of fleet sizes and loads in
requests/s per GPU): following is *worth it* at a point of the grid when, against static lanes,
it cuts the short P99 by at least WORTH (5%) or raises goodput by at least WORTH; for each fleet
size the verdict names the loads where it is and those where it is not: below the first (static
lanes keep up, nothing needs moving) and above the last (the fleet is saturated, no lane can
spare a worker) following stops being worth it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tailguard.lanes.table import FILL, LaneTable
from tailguard.plan.search import shared_lane, topology
from tailguard.plan.sim import EngineGroup, Follow, Simulation
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad, Lengths

STATIC, FOLLOW, SHARED = "static lanes", "lanes that follow the load", "one shared engine per GPU"
#: the smallest gain over static lanes (short P99 or goodput) that makes following worth it
WORTH = 0.05
#: per class, the SLO a good request meets: (TTFT, end-to-end, time per output token) bounds in
#: seconds, None: unbounded. `tailguard bench`'s defaults (tailguard/bench/goodput.py): short
#: ttft:1000,e2el:4000, every other class tpot:200
SLO: dict[str, tuple[float | None, float | None, float | None]] = {"short": (1.0, 4.0, None)}
OTHER_SLO: tuple[float | None, float | None, float | None] = (None, None, 0.2)


@dataclass(frozen=True)
class Row:
    name: str
    gpus: int
    requests: int
    short_p99_s: float | None
    short_ttft_p99_s: float | None
    long_ttft_p99_s: float | None
    goodput_rps: float
    output_tokens_per_s: float
    moves: int
    handed_back: int
    not_succeeded: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def lanes_layout(table: LaneTable, gpus: int) -> list[EngineGroup]:
    """The lanes file's workers on `gpus` GPUs, one engine each, as on a GPU host: each entry
    its replicas, the "fill" one what the others leave (at least one); borrowing resolved for
    cuda (none, as "auto" is there)."""
    _, groups = topology(table, "lanes", borrow_on="cuda")
    fixed = sum(int(w.replicas) for w in table.workers if w.replicas != FILL)
    counts = [max(1, gpus - fixed) if w.replicas == FILL else int(w.replicas)
              for w in table.workers]
    return [replace(g, count=n) for g, n in zip(groups, counts)]


def run(name: str, arrivals: Sequence[tuple[float, str, int, int]], table: LaneTable,
        model: StepModel, gpus: int, *, follow: Follow | None = None, seed: int = 0) -> Row:
    """One row: `arrivals` (time, class, prompt tokens, max_tokens) on the `name` setup."""
    classes = [ClassLoad(c, 0.0, Lengths.fixed(1), Lengths.fixed(1))
               for c in sorted({a[1] for a in arrivals})]
    if name == SHARED:
        lane = shared_lane(table)
        lanes, groups = [lane], [EngineGroup((lane.name,), gpus, lane.max_num_seqs)]
    else:
        lanes, groups = list(table), lanes_layout(table, gpus)
    sim = Simulation(classes, lanes, groups, model, seed=seed,
                     follow=follow if name == FOLLOW else None)
    sim.replay(arrivals)
    results = sim.run()
    short, long_ = results.get("short"), results.get("long")
    done = sim.done
    span = (max(r.end for r in done) - min(r.arrival for r in done)) if done else 0.0
    return Row(name=name, gpus=gpus, requests=len(done) + sum(sim.rejected.values()),
               short_p99_s=short.e2e["p99"] if short else None,
               short_ttft_p99_s=short.ttft_p99 if short else None,
               long_ttft_p99_s=long_.ttft_p99 if long_ else None,
               goodput_rps=sum(_good(r, model.overhead_s) for r in done) / span if span else 0.0,
               output_tokens_per_s=sum(r.out for r in done) / span if span else 0.0,
               moves=len(sim.moves), handed_back=sum(r.reclaimed for r in done),
               not_succeeded=sum(r.status != "succeeded" for r in done)
               + sum(sim.rejected.values()))


def _good(r: Any, overhead_s: float) -> bool:
    """Whether a finished request succeeded within its class's SLO (the bench's definition:
    TPOT is (end-to-end - TTFT) / (output tokens - 1), 0 for one token)."""
    if r.status != "succeeded" or r.first is None:
        return False
    ttft, e2e = r.first - r.arrival + overhead_s, r.end - r.arrival + overhead_s
    tpot = (e2e - ttft) / (r.out - 1) if r.out > 1 else 0.0
    bounds = SLO.get(r.cls, OTHER_SLO)
    return all(b is None or v <= b for v, b in zip((ttft, e2e, tpot), bounds))


def compare(arrivals: Sequence[tuple[float, str, int, int]], table: LaneTable, model: StepModel,
            gpus: int, *, follow: Follow | None = None, seed: int = 0) -> list[Row]:
    """The three rows (module docstring) for a fleet of `gpus`."""
    follow = follow or Follow()
    return [run(name, arrivals, table, model, gpus, follow=follow, seed=seed)
            for name in (STATIC, FOLLOW, SHARED)]


def gains(rows: Sequence[Row]) -> tuple[float, float]:
    """(short P99 cut, goodput gain) of following over static lanes, as fractions of static's."""
    by = {r.name: r for r in rows}
    static, follow = by[STATIC], by[FOLLOW]
    cut = ((static.short_p99_s - follow.short_p99_s) / static.short_p99_s
           if static.short_p99_s and follow.short_p99_s is not None else 0.0)
    more = ((follow.goodput_rps - static.goodput_rps) / static.goodput_rps
            if static.goodput_rps else 0.0)
    return cut, more


def worth_it(rows: Sequence[Row]) -> bool:
    cut, more = gains(rows)
    return cut >= WORTH or more >= WORTH


Grid = dict[tuple[int, float], list[Row]]  # (GPUs, requests/s per GPU) -> compare's rows


def verdict(grid: Grid) -> str:
    """One sentence: per fleet size, the loads where following is worth it and where it is not
    (the module docstring's rule)."""
    parts = []
    for n in sorted({n for n, _ in grid}):
        loads = sorted(load for m, load in grid if m == n)
        yes = [load for load in loads if worth_it(grid[n, load])]
        no = [load for load in loads if load not in yes]
        if not no:
            parts.append(f"at {n} GPUs at every load scanned ({_loads(loads)})")
        elif not yes:
            parts.append(f"at {n} GPUs at no load scanned ({_loads(loads)})")
        else:
            parts.append(f"at {n} GPUs at {_loads(yes)} and not at {_loads(no)}")
    return (f"Following the load gains at least {100 * WORTH:g}% over static lanes on short P99 "
            f"or goodput {'; '.join(parts)} requests/s per GPU.")


def render(grid: Grid) -> str:
    out = [f"{'GPUs':>4} {'req/s/GPU':>9}  {'setup':<27}{'short P99':>10}{'short TTFT':>11}"
           f"{'long TTFT':>10}{'goodput':>9}{'out tok/s':>11}{'moves':>6}{'handed back':>12}"
           f"{'not ok':>7}"]
    for n, load in sorted(grid):
        for r in grid[n, load]:
            out.append(f"{n:>4} {load:>9g}  {r.name:<27}{_s(r.short_p99_s):>10}"
                       f"{_s(r.short_ttft_p99_s):>11}{_s(r.long_ttft_p99_s):>10}"
                       f"{r.goodput_rps:>9.1f}{r.output_tokens_per_s:>11.0f}{r.moves:>6}"
                       f"{r.handed_back:>12}{r.not_succeeded:>7}")
        cut, more = gains(grid[n, load])
        out.append(f"{'':>16}following against static: short P99 {0.0 - 100 * cut:+.0f}%, goodput "
                   f"{100 * more:+.0f}%: {'worth it' if worth_it(grid[n, load]) else 'not worth it'}")
    out += ["", verdict(grid)]
    return "\n".join(out)


def _loads(loads: Sequence[float]) -> str:
    return ", ".join(f"{x:g}" for x in loads)


def _s(x: float | None) -> str:
    return f"{x:.2f} s" if x is not None else "-"
