"""The fewest engines per lane group that meet the targets, and how a fleet of N splits.

Lane groups that share no lane share no engine and no queue, so each is sized on
its own: the smallest engine count whose simulation meets every target of the
classes it serves, found by doubling then bisection (more engines never make a
group slower in this model). Targets (``Targets``): a P99 end-to-end bound for the
classes given one; for the others, that the group keeps up (queue wait P99 at most
``max_queue_s``: a queue that grows over the run fails this); for every class,
nothing expired, cut by a deadline or rejected.

A group of more than ``SIM_ENGINES`` engines is simulated as ``SIM_ENGINES``
engines carrying their share of its traffic: pooling beyond that is left out,
which can only overstate latency (the estimate errs towards more engines). Where
that leaves a class fewer than ``MIN_SAMPLE`` requests in ``duration_s``, the sample
runs longer (up to what the whole group would see), so a P99 is never read off a
handful of requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tailguard import settings
from tailguard.lanes.table import Lane, LaneTable, engine_settings_for
from tailguard.plan.sim import ClassResult, EngineGroup, simulate
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad

SIM_ENGINES = 8
MIN_SAMPLE = 1000
MAX_ENGINES = 1 << 16

#: the one lane of the `shared` topology (tailguard bench runs it too: bench/topology.py)
SHARED_LANE = "shared"


def shared_lane(table: LaneTable) -> Lane:
    """One lane that can take every interactive request the lanes in force could."""
    lanes = [l for l in table if l.priority == "interactive"] or list(table)
    return Lane(name=SHARED_LANE, priority="interactive",
                max_tokens=max(l.max_tokens for l in lanes),
                default_max_tokens=max(l.effective_default_max_tokens for l in lanes),
                deadline_s=max(l.deadline_s for l in lanes),
                queue_ttl_s=max(l.queue_ttl_s for l in lanes),
                max_num_seqs=max(l.max_num_seqs for l in lanes),
                max_model_len=max(l.max_model_len for l in lanes))


def topology(table: LaneTable, name: str, count: int = 1,
             frontend: bool = False) -> tuple[list[Lane], list[EngineGroup]]:
    """The lanes and engine groups of a topology, as `tailguard bench` builds them: ``lanes``,
    the file's worker groups; ``shared``, one lane taking every interactive request.
    Each group gets `count` engines. With `frontend`, the last group's last engine shares its
    cores with the front end (tailguard/host/cores.py's core plan on a CPU host;
    tailguard/plan/sim.py)."""
    if name == "shared":
        lane = shared_lane(table)
        return [lane], [EngineGroup((lane.name,), count, lane.max_num_seqs, frontend=frontend)]
    groups = [EngineGroup(w.lanes, count, engine_settings_for(table.lanes_for_queues(w.lanes))[0],
                          name=w.name, max_prefill_tokens=w.max_prefill_tokens)
              for w in table.workers]
    if frontend and groups:
        groups[-1] = replace(groups[-1], frontend=True)
    return list(table), groups


@dataclass(frozen=True)
class Targets:
    p99_s: dict[str, float]  # class -> bound on its end-to-end P99
    max_queue_s: float = 10.0  # other classes: bound on their queue wait P99

    def met_by(self, r: ClassResult) -> bool:
        if set(r.statuses) - {"succeeded"}:
            return False
        bound = self.p99_s.get(r.name)
        if bound is not None:
            return r.e2e["p99"] is not None and r.e2e["p99"] <= bound
        return r.queued_p99 is None or r.queued_p99 <= self.max_queue_s


@dataclass(frozen=True)
class Plan:
    groups: tuple[EngineGroup, ...]
    results: dict[str, ClassResult]  # by class
    met: bool

    @property
    def engines(self) -> int:
        return sum(g.count for g in self.groups)


def evaluate(classes: Sequence[ClassLoad], lanes: Sequence[Lane], groups: Sequence[EngineGroup],
             model: StepModel, targets: Targets, *, duration_s: float,
             seed: int = 0, fair: Mapping[str, float] | None = None) -> Plan:
    """Simulate `groups`, each scaled down to SIM_ENGINES (see the module docstring).
    `fair`: each class one API key's traffic, in fair order with these weights (`simulate`)."""
    results: dict[str, ClassResult] = {}
    for g in groups:
        factor = min(SIM_ENGINES, g.count) / g.count
        scaled = [c.scaled(factor) for c in classes]
        sub = simulate(scaled, lanes, [replace(g, count=min(SIM_ENGINES, g.count))], model,
                       duration_s=duration_s * _stretch(scaled, duration_s, factor), seed=seed,
                       fair=fair, frontend_cap=settings.FRONTEND_ENGINE_MAX_RUNNING.get())
        for name, r in sub.items():
            if r.n:
                results[name] = replace(r, tokens_per_s=r.tokens_per_s / factor)
    return Plan(tuple(groups), results, all(targets.met_by(r) for r in results.values()))


def _stretch(classes: Sequence[ClassLoad], duration_s: float, factor: float) -> float:
    """How much longer than `duration_s` to simulate so each class has MIN_SAMPLE requests."""
    need = max([1.0] + [MIN_SAMPLE / (c.rate * duration_s) for c in classes if c.rate > 0])
    return min(need, 1 / factor)


def least_engines(classes: Sequence[ClassLoad], lanes: Sequence[Lane], group: EngineGroup,
                  model: StepModel, targets: Targets, *, duration_s: float,
                  seed: int = 0, fair: Mapping[str, float] | None = None) -> int | None:
    """The fewest engines `group` needs to meet `targets` (None: not within MAX_ENGINES)."""

    def ok(n: int) -> bool:
        return evaluate(classes, lanes, [replace(group, count=n)], model, targets,
                        duration_s=duration_s, seed=seed, fair=fair).met

    return fewest(ok, MAX_ENGINES)


def fewest(ok: Callable[[int], bool], most: int) -> int | None:
    """The least n >= 1 with ok(n), ok being monotone (None: not within `most`): doubling to
    a count that meets, then bisecting below it."""
    hi = 1
    while not ok(hi):
        if hi >= most:
            return None
        hi *= 2
    lo = hi // 2  # lo fails (or is 0), hi meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def split_fleet(needed: Sequence[int], fleet: int) -> list[int]:
    """Give a fleet's engines beyond `needed` to the groups in proportion to their needs."""
    total = sum(needed)
    if fleet <= total:
        return list(needed)
    spare = fleet - total
    shares = [spare * n / total for n in needed]
    out = [n + int(s) for n, s in zip(needed, shares)]
    by_remainder = sorted(range(len(needed)), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    for i in by_remainder[:fleet - sum(out)]:
        out[i] += 1
    return out
