"""`tailguard plan --keda`: the engines a fleet needs at each load, and the backlog per worker at
which it needs one more, for a KEDA ScaledObject sized by simulation rather than guessed.

For each load (requests per second of a trace window), the fewest engines of the ``fleet``
setup (tailguard/plan/compare.py: one central queue per lane, every engine serving every lane)
that keep the short class's end-to-end P99 within the target, the long class's TTFT P99 within
its own (LONG_TTFT_S, the long lane's target in the bench's goodput) and nothing expired
(``engines_needed``: doubling, then bisection; more engines never make the fleet slower here).

The scaling series is ``tailguard_lane_backlog_tokens{lane}``: the cost tokens (prompt +
max_tokens) queued per lane, the figure the simulator keeps as ``Simulation.backlog``. KEDA's
Prometheus trigger with ``metricType: AverageValue`` asks for ``ceil(series / threshold)``
replicas, so a threshold T holds N engines at a load where N suffice when the backlog per
worker there is at most T (``fits``: N engines' mean backlog / N), and adds one where N - 1 do
not when the backlog per worker with N - 1 is above T (``short``): T holds at a load when
``fits <= T < short``. ``threshold`` is the T that holds at the most loads (the least such, which
errs towards more engines); the table says where it holds. ``min_replicas`` /
``max_replicas``: the engines the lowest and the highest load need.

A backlog sees only what queues. Where the target is missed inside the batches (every request
starts at once, but too many share each engine's steps), N - 1 engines queue no more than N
(``blind``): no backlog threshold tells them apart, and that load is left out of the threshold.
Fewer slots per engine (``--engine-slots``, the lanes' ``max_num_seqs``) or a lower long limit
(``--max-running long=N``) move the excess into the queue, where the series sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from tailguard.lanes.table import LaneTable
from tailguard.plan.compare import FLEET_SETUP, Arrivals, Limits, Row, run
from tailguard.plan.search import fewest
from tailguard.plan.stepmodel import StepModel

#: the most engines the search tries
MAX_ENGINES = 4096
#: the series the threshold is in (exported by the API's /metrics)
SERIES = "tailguard_lane_backlog_tokens"
#: the long class's TTFT P99 bound (the long lane's target, as compare.OTHER_SLO)
LONG_TTFT_S = 10.0


@dataclass(frozen=True)
class Load:
    rate: float  # requests/s of the trace window
    engines: int | None  # the fewest that meet the target (None: not within MAX_ENGINES)
    fits: float | None  # backlog tokens per worker with `engines`
    short: float | None  # backlog tokens per worker with `engines` - 1 (None: one suffices)
    short_p99_s: float | None  # with `engines`

    @property
    def blind(self) -> bool:
        """Whether one fewer engine queued no more per worker than `engines` (module docstring)."""
        return self.short is not None and self.fits is not None and self.short <= self.fits

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "blind": self.blind}


def meets(row: Row, target_s: float, long_ttft_s: float = LONG_TTFT_S) -> bool:
    return (row.short_p99_s is not None and row.short_p99_s <= target_s
            and (row.long_ttft_p99_s is None or row.long_ttft_p99_s <= long_ttft_s)
            and not row.not_succeeded)


def engines_needed(simulate: Callable[[int], Row], target_s: float,
                   max_engines: int = MAX_ENGINES) -> tuple[int | None, dict[int, Row]]:
    """The fewest engines whose row (`simulate(n)`) meets `target_s`, and every row simulated."""
    rows: dict[int, Row] = {}

    def ok(n: int) -> bool:
        if n not in rows:
            rows[n] = simulate(n)
        return meets(rows[n], target_s)

    return fewest(ok, max_engines), rows


def size(arrivals_at: Callable[[float], Arrivals], rates: Sequence[float], table: LaneTable,
         model: StepModel, target_s: float, *, limits: Limits | None = None,
         slots: int | None = None, seed: int = 0) -> list[Load]:
    """A Load per rate: `arrivals_at(rate)` on the fleet setup."""
    out = []
    for rate in rates:
        row = partial(_fleet_row, arrivals_at(rate), table, model, limits=limits, slots=slots,
                      seed=seed)
        n, rows = engines_needed(row, target_s)
        if n is None:
            out.append(Load(rate, None, None, None, None))
            continue
        if n > 1 and n - 1 not in rows:
            rows[n - 1] = row(n - 1)
        out.append(Load(rate, n, rows[n].backlog_tokens / n,
                        rows[n - 1].backlog_tokens / (n - 1) if n > 1 else None,
                        rows[n].short_p99_s))
    return out


def _fleet_row(arrivals: Arrivals, table: LaneTable, model: StepModel, n: int, *,
               limits: Limits | None, slots: int | None, seed: int) -> Row:
    return run(FLEET_SETUP, arrivals, table, model, n, limits=limits, slots=slots, seed=seed)


def threshold(loads: Sequence[Load]) -> tuple[float | None, int]:
    """(the threshold, at how many loads it holds N and adds one at N - 1): module docstring."""
    seen = [l for l in loads if not l.blind and l.fits is not None and l.short is not None]
    if not seen:
        return None, 0
    # the best is one of the `fits` (each load's interval opens there); ties: the least,
    # which errs towards more engines
    best = min((l.fits for l in seen), key=lambda t: (-sum(holds(l, t) for l in seen), t))
    return best, sum(holds(l, best) for l in seen)


def holds(load: Load, t: float) -> bool:
    """Whether threshold `t` keeps `load.engines` there and adds one to one fewer."""
    return (load.fits is not None and load.short is not None
            and load.fits <= t < load.short)


def query(table: LaneTable) -> str:
    """The Prometheus query over the interactive lanes (batch waits by design; every API
    process exports the same figures from Redis, hence max by lane)."""
    lanes = "|".join(l.name for l in table if l.priority == "interactive")
    return f'sum(max by (lane) ({SERIES}{{lane=~"{lanes}"}}))'


def render(loads: Sequence[Load], table: LaneTable, target_s: float) -> str:
    t, held = threshold(loads)
    out = [f"{'req/s':>8} {'engines':>8} {'short P99':>10} {'backlog/worker':>15} "
           f"{'with one fewer':>15}  threshold holds"]
    for l in loads:
        mark = "blind" if l.blind else ("yes" if t is not None and holds(l, t) else
                                        "-" if l.short is None else "no")
        out.append(f"{l.rate:>8g} {l.engines if l.engines else '-':>8} {_s(l.short_p99_s):>10} "
                   f"{_n(l.fits):>15} {_n(l.short):>15}  {mark}")
    needed = [l.engines for l in loads if l.engines]
    out.append("")
    if len(needed) < len(loads):
        out.append(f"some loads need more than {MAX_ENGINES} engines to meet the targets")
    blind = [f"{l.rate:g}" for l in loads if l.blind]
    if blind:
        out.append(f"blind at {', '.join(blind)} req/s: the target is missed inside the batches "
                   "before anything queues, so no backlog threshold adds that engine (fewer "
                   "--engine-slots or a lower --max-running long=N queue the excess instead)")
    if t is None:
        out.append("no load the backlog can see needs another engine: no threshold")
        return "\n".join(out)
    seen = sum(1 for l in loads if not l.blind and l.short is not None)
    out.append(f"threshold: {t:.0f} backlog tokens per worker (holds at {held} of the {seen} "
               "loads it can see)")
    out += ["", "KEDA ScaledObject (spec):",
            f"  minReplicaCount: {min(needed)}",
            f"  maxReplicaCount: {max(needed)}",
            "  triggers:",
            "  - type: prometheus",
            "    metricType: AverageValue",
            "    metadata:",
            f"      query: '{query(table)}'",
            f'      threshold: "{t:.0f}"']
    return "\n".join(out)


def _s(x: float | None) -> str:
    return f"{x:.2f} s" if x is not None else "-"


def _n(x: float | None) -> str:
    return f"{x:.0f}" if x is not None else "-"
