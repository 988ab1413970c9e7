"""The prefix cache at fleet scale: today's dispatch against prefix affinity, by simulation.

`tailguard plan --prefix-cache 8,64` (tailguard/plan/command.py). For a fleet of N GPUs, one
engine each (tailguard's fleet: every engine serves every lane of the lanes file, a central
queue per lane; tailguard/plan/sim.py, ``FLEET``), each engine with a prefix cache of
``kv_tokens`` found in whole blocks of 16 tokens (a GPU's), two simulations of the same requests per workload:

* **any free engine** (today): a request goes to whichever engine frees a slot first, whatever
  it served before;
* **affinity**: a request is offered first to an engine that served its prefix last and has
  room for it, unless that engine is overloaded (tailguard/lanes/affinity.py).

The workloads are the bench's ``chat`` (conversations resent turn after turn, after think
times, with a shared system prompt) and ``shared-doc`` (questions over a few long documents),
in tokens (tailguard/plan/workload.py). Each row: the requests, the prefix cache's hit rate
(prompt tokens found / looked up), TTFT P50 and P99, end-to-end P99, the requests that did not
succeed, and what affinity did: taken by their prefix's engine, not offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.lanes.affinity import Affinity
from tailguard.lanes.table import LaneTable, slots_for
from tailguard.plan.sim import FLEET, EngineGroup, Simulation, percentile
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import (
    CHAT,
    SHARED_DOC,
    ClassLoad,
    Lengths,
    chat_sessions,
    shared_doc_arrivals,
)

WORKLOADS = (CHAT, SHARED_DOC)
ANY_FREE, AFFINITY = "any free engine", "affinity"
#: An engine's KV cache in tokens when not given: the assumed GPU step model's 7B fp16 model on
#: an 80 GB GPU (docs/capacity/gpu-assumed.json: 0.5 MB of KV cache per token) keeps ~64 GB
#: for it after the weights and activations: about 130,000 tokens.
KV_TOKENS = 130_000


@dataclass(frozen=True)
class Row:
    workload: str
    gpus: int
    per_gpu: float
    dispatch: str
    requests: int
    hit_rate: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    not_succeeded: int
    offers: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def simulation(workload: str, table: LaneTable, model: StepModel, gpus: int, rate: float, *,
               duration_s: float, kv_tokens: int, affinity: Affinity | None,
               seed: int = 0, block_tokens: int = 16) -> Simulation:
    """One run of `workload` at `rate` requests/s on `gpus` engines; run to its end."""
    if workload not in WORKLOADS:
        raise ValueError(f"a prefix workload is one of {WORKLOADS}, got {workload!r}")
    lanes = list(table)
    classes = [ClassLoad(workload, 0.0, Lengths.fixed(1), Lengths.fixed(1))]
    group = EngineGroup(tuple(l.name for l in lanes), gpus, slots_for(lanes), name="worker",
                        dispatch=FLEET, max_prefill_tokens=table.max_prefill_tokens)
    sim = Simulation(classes, lanes, [group], model, seed=seed, prefix_cache_tokens=kv_tokens,
                     prefix_block_tokens=block_tokens, affinity=affinity)
    if workload == CHAT:
        sim.add_sessions(chat_sessions(rate, duration_s, seed))
    else:
        sim.add_prefixed(shared_doc_arrivals(rate, duration_s, seed))
    sim.run()
    return sim


def row(sim: Simulation, workload: str, gpus: int, per_gpu: float, dispatch: str) -> Row:
    """The figures of one finished run (the module docstring)."""
    overhead = sim.model.overhead_s
    ok = [r for r in sim.done if r.status == "succeeded"]
    ttft = [r.first - r.arrival + overhead for r in ok if r.first is not None]
    return Row(workload=workload, gpus=gpus, per_gpu=per_gpu, dispatch=dispatch,
               requests=len(sim.done) + sum(sim.rejected.values()),
               hit_rate=sim.prefix_hits / sim.prefix_queries if sim.prefix_queries else None,
               ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
               e2e_p99_s=percentile([r.end - r.arrival + overhead for r in ok], 99),
               not_succeeded=len(sim.done) - len(ok) + sum(sim.rejected.values()),
               offers=dict(sim.offers) if sim.affinity is not None else {})


def compare(table: LaneTable, model: StepModel, sizes: Sequence[int], per_gpu: Sequence[float],
            *, workloads: Sequence[str] = WORKLOADS, duration_s: float = 60.0,
            kv_tokens: int = KV_TOKENS, affinity: Affinity | None = None,
            seed: int = 0) -> list[Row]:
    """Both dispatches for every workload, fleet size and load (requests/s per GPU)."""
    rule = affinity or Affinity()
    rows = []
    for workload in workloads:
        for gpus in sizes:
            for load in per_gpu:
                for name, how in ((ANY_FREE, None), (AFFINITY, rule)):
                    sim = simulation(workload, table, model, gpus, load * gpus,
                                     duration_s=duration_s, kv_tokens=kv_tokens, affinity=how,
                                     seed=seed)
                    rows.append(row(sim, workload, gpus, load, name))
    return rows


def render(rows: Sequence[Row]) -> str:
    out = [f"{'workload':<11}{'GPUs':>5}{'req/s/GPU':>10}  {'dispatch':<16}{'requests':>9}"
           f"{'hit rate':>9}{'TTFT P50':>10}{'TTFT P99':>10}{'e2e P99':>9}{'not ok':>7}  "
           "affinity: taken / not offered"]
    for r in rows:
        o = r.offers
        offers = f"{o['taken']} / {o['not_offered']}" if o else ""
        out.append(f"{r.workload:<11}{r.gpus:>5}{r.per_gpu:>10g}  {r.dispatch:<16}{r.requests:>9}"
                   f"{_pct(r.hit_rate):>9}{_s(r.ttft_p50_s):>10}{_s(r.ttft_p99_s):>10}"
                   f"{_s(r.e2e_p99_s):>9}{r.not_succeeded:>7}  {offers}")
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
