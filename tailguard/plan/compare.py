"""One fleet against the field's: four ways to run N GPUs on one trace.

`tailguard plan --compare-fleet 8,64` (tailguard/plan/command.py). For a fleet of N GPUs, one
engine each, four simulations of the same arrivals (by default a window of the Azure trace:
tailguard/plan/azure.py), each with its lanes' placement (max_tokens caps) and queue TTLs:

* **fleet** (tailguard): one central queue per lane over the whole fleet; every engine serves
  every lane, and a free slot takes the oldest request of the lane
  ``tailguard.lanes.dispatch.next_lane`` names, each lane held to its per-engine limit
  (``Lane.engine_slots``: ``--max-running`` overrides the lanes file's); vLLM priority inside
  each engine (tailguard/plan/sim.py, ``FLEET``);
* **shared**: one shared lane on every engine, first come first served, no priority;
* **router**: each request committed on arrival to the replica with the fewest requests
  running and waiting, vLLM priority inside each replica (short first), no queue TTL or
  deadline (``vllm serve`` has neither): a router such as ``vllm-router`` in front of N
  ``vllm serve`` replicas (tailguard/plan/sim.py, ``ROUTER``);
* **static**: lanes as a partition: the lanes file's workers as `tailguard up` lays them out
  on N GPUs (each entry its replicas, the ``"fill"`` one the GPUs left) when the file has
  more than one; else (one worker entry serving every lane) each interactive lane gets its own
  engines, as many as its share of the trace's cost tokens (at least one).

Each setup may place the front end (``frontend``, off by default: on GPUs it has cores of its
own): its last group's last engine then shares its cores with it, as ``search.topology``'s
``frontend`` marks it, and ``frontend_cap`` cuts that engine's lane limits as its worker cuts
them (``Simulation``'s; tailguard/plan/sim.py, "Front end"), as on a CPU host such as
`tailguard bench`'s (tailguard/plan/validate.py, ``run_rows``).

Each row: goodput (requests per second within their class's SLO, ``SLO``, over the span from
the first arrival to the last end), the short class's end-to-end and TTFT P99, the long
class's TTFT P99, every class's output tokens per second, the requests that did not succeed,
and whether the setup **queues**: its short P99 over QUEUES_AT (twice) the short class's
*unloaded* P99 (each short request of the trace alone on an idle engine, ``alone_s``).
``verdict`` reads the issue's lines for the fleet: goodput at least the best other setup's
at every point; short P99 at most the router's, and at most half of it where the router
queues.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tailguard.lanes.table import FILL, Lane, LaneTable, slots_for
from tailguard.plan.search import shared_lane, topology
from tailguard.plan.sim import FLEET, ROUTER, EngineGroup, Simulation, percentile
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad, Lengths

FLEET_SETUP, SHARED, ROUTER_SETUP, STATIC = "fleet", "shared", "router", "static"
SETUPS = (FLEET_SETUP, SHARED, ROUTER_SETUP, STATIC)
#: a setup queues where its short P99 is over this many times the unloaded one
QUEUES_AT = 2.0
#: the fleet's short P99 at most this share of the router's where the router queues (issue 42)
QUEUEING_CUT = 0.5
#: per class, the SLO a good request meets: (TTFT, end-to-end, time per output token) bounds in
#: seconds, None: unbounded. `tailguard bench`'s defaults (tailguard/bench/goodput.py): short
#: ttft:1000,e2el:4000, every other class tpot:200, and TTFT 10 s (the long lane's target)
SLO: dict[str, tuple[float | None, float | None, float | None]] = {"short": (1.0, 4.0, None)}
OTHER_SLO: tuple[float | None, float | None, float | None] = (10.0, None, 0.2)

Arrivals = Sequence[tuple[float, str, int, int]]
#: per lane, its per-engine limit (max_running) in a fleet row
Limits = Mapping[str, int]


@dataclass(frozen=True)
class Row:
    name: str
    gpus: int
    requests: int
    goodput_rps: float
    short_p99_s: float | None
    short_ttft_p99_s: float | None
    long_ttft_p99_s: float | None
    output_tokens_per_s: float
    not_succeeded: int
    queues: bool  # its short P99 is over QUEUES_AT x the unloaded one
    backlog_tokens: float = 0.0  # cost tokens queued, on average over the run

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def alone_s(model: StepModel, prompt: int, max_tokens: int) -> float:
    """End-to-end of one request alone on an idle engine, as the simulator steps it: its prompt
    in chunks of ``max_batched_tokens`` (the last yields the first token), then one decode step
    per token left; plus ``overhead_s``."""
    t, done = 0.0, 0
    while done < prompt:
        chunk = min(prompt - done, model.max_batched_tokens)
        t += model.step_s(0, chunk)
        done += chunk
    for out in range(1, max_tokens):
        t += model.step_s(1, 0, prompt + out)
    return t + model.overhead_s


def unloaded_short_p99(arrivals: Arrivals, lanes: Sequence[Lane], model: StepModel) -> float | None:
    """The short class's P99 with each of its requests alone (max_tokens capped by its lane)."""
    cap = {l.name: l.max_tokens for l in lanes}
    return percentile([alone_s(model, p, min(m, cap.get(c, m)))
                       for _, c, p, m in arrivals if c == "short"], 99)


def lanes_layout(table: LaneTable, gpus: int) -> list[EngineGroup]:
    """The lanes file's workers on `gpus` GPUs, one engine each, as on a GPU host: each entry
    its replicas, the "fill" one what the others leave (at least one)."""
    _, groups = topology(table, "lanes")
    fixed = sum(int(w.replicas) for w in table.workers if w.replicas != FILL)
    counts = [max(1, gpus - fixed) if w.replicas == FILL else int(w.replicas)
              for w in table.workers]
    return [replace(g, count=n) for g, n in zip(groups, counts)]


def static_layout(table: LaneTable, gpus: int, arrivals: Arrivals) -> list[EngineGroup]:
    """Lanes as a partition of `gpus` (module docstring, **static**)."""
    if len(table.workers) > 1:
        return lanes_layout(table, gpus)
    lanes = [l for l in table if l.priority == "interactive"]
    cost = {l.name: sum(p + m for _, c, p, m in arrivals if c == l.name) for l in lanes}
    total = sum(cost.values()) or 1
    counts = {l.name: max(1, round(gpus * cost[l.name] / total)) for l in lanes}
    biggest = max(counts, key=lambda n: counts[n])
    counts[biggest] = max(1, counts[biggest] - (sum(counts.values()) - gpus))
    return [EngineGroup((l.name,), counts[l.name], l.max_num_seqs, name=l.name) for l in lanes]


def setup(name: str, table: LaneTable, gpus: int, arrivals: Arrivals,
          limits: Limits | None = None, slots: int | None = None,
          ahead: Limits | None = None, *, frontend: bool = False
          ) -> tuple[list[Lane], list[EngineGroup]]:
    """The lanes and engine groups of one setup (module docstring) on `gpus` GPUs; the fleet's
    engines with `slots` (their max_num_seqs; None: the largest lane's), its lanes with the
    `limits` (max_running) and `ahead` (max_ahead) given instead of the file's. With
    `frontend`, the last group's last engine shares its cores with the front end (as
    ``search.topology`` marks it)."""
    lanes, groups = _setup(name, table, gpus, arrivals, limits, slots, ahead)
    if frontend and groups:
        groups[-1] = replace(groups[-1], frontend=True)
    return lanes, groups


def _setup(name: str, table: LaneTable, gpus: int, arrivals: Arrivals, limits: Limits | None,
           slots: int | None, ahead: Limits | None) -> tuple[list[Lane], list[EngineGroup]]:
    if name == SHARED:
        lane = shared_lane(table)
        return [lane], [EngineGroup((lane.name,), gpus, lane.max_num_seqs)]
    if name == STATIC:
        return list(table), static_layout(table, gpus, arrivals)
    lanes = list(table)
    names = tuple(l.name for l in lanes)
    if name == ROUTER_SETUP:
        lanes = [replace(l, queue_ttl_s=float("inf"), deadline_s=float("inf")) for l in lanes]
        return lanes, [EngineGroup(names, gpus, shared_lane(table).max_num_seqs, name="replica",
                                   dispatch=ROUTER)]
    if name != FLEET_SETUP:
        raise ValueError(f"a setup is one of {SETUPS}, got {name!r}")
    for option, given in (("--max-running", limits), ("--max-ahead", ahead)):
        unknown = set(given or {}) - set(names)
        if unknown:
            raise ValueError(f"{option} names no lane of the file: {', '.join(sorted(unknown))}")
    # a limit above the lane's own batch lifts that too (engine_slots is the lesser of the two)
    lanes = [replace(l, max_running=limits[l.name], max_num_seqs=max(l.max_num_seqs,
                                                                      limits[l.name]))
             if l.name in (limits or {}) else l for l in lanes]
    lanes = [replace(l, max_ahead=ahead[l.name]) if l.name in (ahead or {}) else l for l in lanes]
    return lanes, [EngineGroup(names, gpus, slots or slots_for(lanes), name="worker",
                               dispatch=FLEET, max_prefill_tokens=table.max_prefill_tokens)]


def simulation(name: str, arrivals: Arrivals, table: LaneTable, model: StepModel, gpus: int, *,
               limits: Limits | None = None, slots: int | None = None,
               ahead: Limits | None = None, seed: int = 0, frontend: bool = False,
               frontend_cap: int = 0) -> Simulation:
    """`arrivals` (time, class, prompt tokens, max_tokens) simulated to the end on the `name`
    setup (`setup`); `frontend_cap`: the front end's engine's lane limits cut to it (with
    `frontend` only; 0: not cut)."""
    classes = [ClassLoad(c, 0.0, Lengths.fixed(1), Lengths.fixed(1))
               for c in sorted({a[1] for a in arrivals})]
    lanes, groups = setup(name, table, gpus, arrivals, limits, slots, ahead, frontend=frontend)
    sim = Simulation(classes, lanes, groups, model, seed=seed, frontend_cap=frontend_cap)
    sim.replay(arrivals)
    sim.run()
    return sim


def run(name: str, arrivals: Arrivals, table: LaneTable, model: StepModel, gpus: int, *,
        limits: Limits | None = None, slots: int | None = None, ahead: Limits | None = None,
        unloaded_p99_s: float | None = None, seed: int = 0, label: str | None = None,
        frontend: bool = False, frontend_cap: int = 0) -> Row:
    """One row: `arrivals` (time, class, prompt tokens, max_tokens) on the `name` setup
    (`simulation`: `frontend` and `frontend_cap` place the front end)."""
    sim = simulation(name, arrivals, table, model, gpus, limits=limits, slots=slots, ahead=ahead,
                     seed=seed, frontend=frontend, frontend_cap=frontend_cap)
    return row(sim, label or name, gpus, model, unloaded_p99_s)


def row(sim: Simulation, name: str, gpus: int, model: StepModel,
        unloaded_p99_s: float | None = None) -> Row:
    """A finished simulation's row (`run`)."""
    results = sim.results()
    short, long_ = results.get("short"), results.get("long")
    done = sim.done
    span = (max(r.end for r in done) - min(r.arrival for r in done)) if done else 0.0
    p99 = short.e2e["p99"] if short else None
    return Row(name=name, gpus=gpus, requests=len(done) + sum(sim.rejected.values()),
               goodput_rps=sum(_good(r, model.overhead_s) for r in done) / span if span else 0.0,
               short_p99_s=p99, short_ttft_p99_s=short.ttft_p99 if short else None,
               long_ttft_p99_s=long_.ttft_p99 if long_ else None,
               output_tokens_per_s=sum(r.out for r in done) / span if span else 0.0,
               not_succeeded=sum(r.status != "succeeded" for r in done)
               + sum(sim.rejected.values()),
               queues=bool(p99 and unloaded_p99_s and p99 > QUEUES_AT * unloaded_p99_s),
               backlog_tokens=sim.backlog_mean)


def within_target(sim: Simulation, cls: str, model: StepModel) -> int | None:
    """How many of a finished simulation's requests of class `cls` succeeded within its SLO (the
    bench's "within target"); None where it ran none of that class."""
    mine = [r for r in sim.done if r.cls == cls]
    return sum(_good(r, model.overhead_s) for r in mine) if mine else None


def _good(r: Any, overhead_s: float) -> bool:
    """Whether a finished request succeeded within its class's SLO (the bench's definition:
    TPOT is (end-to-end - TTFT) / (output tokens - 1), 0 for one token)."""
    if r.status != "succeeded" or r.first is None:
        return False
    ttft, e2e = r.first - r.arrival + overhead_s, r.end - r.arrival + overhead_s
    tpot = (e2e - ttft) / (r.out - 1) if r.out > 1 else 0.0
    bounds = SLO.get(r.cls, OTHER_SLO)
    return all(b is None or v <= b for v, b in zip((ttft, e2e, tpot), bounds))


def fleet_label(limits: Limits, ahead: Limits | None = None) -> str:
    """`fleet long<=16 long:ahead<5`: the limits a fleet row runs with, where given."""
    return (FLEET_SETUP + "".join(f" {lane}<={n}" for lane, n in sorted(limits.items()))
            + "".join(f" {lane}:ahead<{n}" for lane, n in sorted((ahead or {}).items())))


def limit_sweep(values: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """Every combination of per-lane limits (`{"long": [2, 4]}` -> two fleets); none: one."""
    lanes = sorted(values)
    return [dict(zip(lanes, combo)) for combo in itertools.product(*(values[l] for l in lanes))]


def compare(arrivals: Arrivals, table: LaneTable, model: StepModel, gpus: int, *,
            sweep: Sequence[Limits] = ({},), slots: int | None = None,
            ahead_sweep: Sequence[Limits] = ({},),
            seed: int = 0) -> tuple[float | None, list[Row]]:
    """(the unloaded short P99, the rows): a fleet row per limits of `sweep` and max_ahead of
    `ahead_sweep` (its engines with `slots`), then the others."""
    unloaded = unloaded_short_p99(arrivals, list(table), model)
    rows = [run(FLEET_SETUP, arrivals, table, model, gpus, limits=limits, slots=slots,
                ahead=ahead, seed=seed, unloaded_p99_s=unloaded,
                label=fleet_label(limits, ahead) if limits or ahead else None)
            for limits in sweep for ahead in ahead_sweep]
    rows += [run(name, arrivals, table, model, gpus, unloaded_p99_s=unloaded, seed=seed)
             for name in (SHARED, ROUTER_SETUP, STATIC)]
    return unloaded, rows


@dataclass(frozen=True)
class Point:
    gpus: int
    per_gpu: float
    unloaded_p99_s: float | None
    rows: list[Row]

    def check(self, fleet: Row) -> list[str]:
        """The issue's lines `fleet` misses at this point (none: it holds them)."""
        others = [r for r in self.rows if not r.name.startswith(FLEET_SETUP)]
        best = max(others, key=lambda r: r.goodput_rps)
        router = next(r for r in others if r.name == ROUTER_SETUP)
        missed = []
        if fleet.goodput_rps < best.goodput_rps:
            missed.append(f"goodput {fleet.goodput_rps:.1f} < {best.name}'s {best.goodput_rps:.1f}")
        bound = (QUEUEING_CUT if router.queues else 1.0) * (router.short_p99_s or 0.0)
        if fleet.short_p99_s is None or router.short_p99_s is None or fleet.short_p99_s > bound:
            missed.append(f"short P99 {_s(fleet.short_p99_s)} > "
                          f"{'half ' if router.queues else ''}the router's {_s(router.short_p99_s)}")
        return missed


def verdict(points: Sequence[Point], fleet_name: str = FLEET_SETUP) -> str:
    """One sentence: where the fleet row named `fleet_name` holds the issue's lines."""
    misses = []
    for p in points:
        fleet = next(r for r in p.rows if r.name == fleet_name)
        misses += [f"{p.gpus} GPUs x {p.per_gpu:g}: {m}" for m in p.check(fleet)]
    if not misses:
        return (f"{fleet_name}: goodput >= the best other setup and short P99 <= the router's "
                f"(<= half where it queues) at every point.")
    return f"{fleet_name} misses: " + "; ".join(misses) + "."


def render(points: Sequence[Point]) -> str:
    width = max([18] + [len(r.name) + 1 for p in points for r in p.rows])
    out = [f"{'GPUs':>4} {'req/s/GPU':>9}  {'setup':<{width}}{'goodput':>8}{'short P99':>10}"
           f"{'short TTFT':>11}{'long TTFT':>10}{'out tok/s':>10}{'not ok':>7}  queues"]
    for p in points:
        for r in p.rows:
            out.append(f"{p.gpus:>4} {p.per_gpu:>9g}  {r.name:<{width}}{r.goodput_rps:>8.1f}"
                       f"{_s(r.short_p99_s):>10}{_s(r.short_ttft_p99_s):>11}"
                       f"{_s(r.long_ttft_p99_s):>10}{r.output_tokens_per_s:>10.0f}"
                       f"{r.not_succeeded:>7}  {'yes' if r.queues else ''}")
        out.append(f"{'':>16}unloaded short P99 {_s(p.unloaded_p99_s)}")
    fleets = [r.name for r in points[0].rows if r.name.startswith(FLEET_SETUP)] if points else []
    return "\n".join(out + [""] + [verdict(points, name) for name in fleets])


def _s(x: float | None) -> str:
    return f"{x:.2f} s" if x is not None else "-"
