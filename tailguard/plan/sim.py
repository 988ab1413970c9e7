"""A discrete-event simulation of lanes and engines.

What it models, and how the real system does it:

* **Placement**: each request goes to the lane ``tailguard.placement.place`` picks (the
  same function the API calls), with max_tokens capped as the API caps it.
* **Queues**: one FIFO per lane. An engine holds at most ``max_num_seqs`` requests (a
  worker has that many threads and prefetches one message each); it takes work as soon
  as a slot frees, from its lanes in strict order. A new request goes to an engine of
  its lane with a free slot (a seeded random one, as whichever worker's BRPOP Redis
  answers), else waits in its lane's queue. A request that waited longer than its
  lane's ``queue_ttl_s`` expires without reaching an engine.
* **Engines**: continuous batching. Each step decodes one token for every sequence past
  its prompt and prefills up to ``max_batched_tokens`` prompt tokens (chunked, oldest
  first); a request that entered while a step ran joins the next one. The step lasts
  ``StepModel.step_s`` of its decoding sequences, their context and its prefill tokens. The step that finishes a prompt also yields its first token.
  A request still running ``deadline_s`` after it entered the engine ends "deadline".
* **Times**: per request, queue wait (arrival to engine), TTFT and end-to-end, the last
  two plus ``StepModel.overhead_s``. Throughput per class is its output tokens over the
  span from its first arrival to its last finish (the bench's definition).

Not modelled: the KV cache (every admitted request fits), preemption, the API's own
limits, rate_limit, network time beyond ``overhead_s``.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from tailguard.bench.report import percentile
from tailguard.errors import NoLaneForRequest, PromptTooLong
from tailguard.lanes import Lane
from tailguard.placement import place
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad


@dataclass(frozen=True)
class EngineGroup:
    """``count`` engines, each serving ``lanes`` in strict order with ``max_num_seqs`` slots."""

    lanes: tuple[str, ...]
    count: int
    max_num_seqs: int


@dataclass
class _Req:
    cls: str
    lane: str
    arrival: float
    prompt: int
    max_tokens: int
    prefilled: int = 0
    out: int = 0
    start: float | None = None
    first: float | None = None
    end: float | None = None
    status: str = "queued"


@dataclass
class _Engine:
    lanes: tuple[str, ...]
    slots: int
    reqs: list[_Req] = field(default_factory=list)  # admitted, in admission order
    busy: bool = False
    batch: list[tuple[_Req, int]] = field(default_factory=list)  # (request, prompt chunk)


@dataclass(frozen=True)
class ClassResult:
    name: str
    lanes: dict[str, int]
    n: int
    statuses: dict[str, int]
    e2e: dict[str, float | None]
    ttft_p99: float | None
    queued_p99: float | None
    output_tokens: int
    max_running: int  # the most requests any engine ran at once
    tokens_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def simulate(classes: Sequence[ClassLoad], lanes: Sequence[Lane], groups: Sequence[EngineGroup],
             model: StepModel, *, duration_s: float, seed: int = 0,
             arrivals: Sequence[tuple[float, str, int, int]] | None = None) -> dict[str, ClassResult]:
    """Run `duration_s` of arrivals to completion; per-class results.

    `arrivals`, (time, class name, prompt tokens, max_tokens), replays a given request
    list (a bench run's) instead of drawing Poisson arrivals and lengths from `classes`.

    Requests placed on a lane no group serves are left out (not counted), so one lane
    group can be simulated alone: lanes that share no engine do not interact.
    """
    rng = random.Random(seed)
    by_name = {l.name: l for l in lanes}
    engines = [_Engine(g.lanes, g.max_num_seqs) for g in groups for _ in range(g.count)]
    serving = {name: [e for e in engines if name in e.lanes] for name in by_name}
    queues: dict[str, list[_Req]] = {name: [] for name in by_name}  # FIFO, popped from the head
    heads = {name: 0 for name in by_name}
    events: list[tuple[float, int, str, Any]] = []
    seq = 0
    done: list[_Req] = []
    rejected: dict[str, int] = {c.name: 0 for c in classes}

    def push(t: float, kind: str, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    if arrivals is not None:
        by_class = {c.name: c for c in classes}
        for t, name, prompt, max_tokens in arrivals:
            push(t, "arrive", (by_class[name], prompt, max_tokens))
    for c in classes if arrivals is None else ():  # each class its own stream
        crng = random.Random(f"{seed}/{c.name}")
        t = crng.expovariate(c.rate) if c.rate > 0 else duration_s
        while t < duration_s:
            push(t, "arrive", (c, c.prompt.sample(crng), c.output.sample(crng)))
            t += crng.expovariate(c.rate)

    def finish(r: _Req, t: float, status: str) -> None:
        r.end, r.status = t, status
        done.append(r)

    max_running = 0

    def take(e: _Engine, r: _Req, t: float) -> None:
        nonlocal max_running
        r.start, r.status = t, "running"
        e.reqs.append(r)
        max_running = max(max_running, len(e.reqs))
        if not e.busy:
            step(e, t)

    def refill(e: _Engine, t: float) -> None:
        for name in e.lanes:
            q, ttl = queues[name], by_name[name].queue_ttl_s
            while len(e.reqs) < e.slots and heads[name] < len(q):
                r = q[heads[name]]
                heads[name] += 1
                if t - r.arrival > ttl:
                    finish(r, r.arrival + ttl, "expired")
                else:
                    take(e, r, t)

    def step(e: _Engine, t: float) -> None:
        if not e.reqs:
            e.busy = False
            return
        decode = [r for r in e.reqs if r.prefilled == r.prompt]
        budget = max(model.max_batched_tokens - len(decode), 0)
        e.batch = [(r, 0) for r in decode]
        prefill = 0
        for r in e.reqs:
            if r.prefilled < r.prompt and budget > 0:
                chunk = min(r.prompt - r.prefilled, budget)
                e.batch.append((r, chunk))
                budget -= chunk
                prefill += chunk
        e.busy = True
        context = sum(r.prompt + r.out for r in decode)
        push(t + model.step_s(len(decode), prefill, context), "step", e)

    while events:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            c, prompt, max_tokens = payload
            try:
                p = place(lanes, priority=c.priority, prompt_tokens=prompt,
                          requested_max_tokens=max_tokens)
            except (NoLaneForRequest, PromptTooLong):
                rejected[c.name] += 1
                continue
            if not serving[p.lane]:
                continue  # a lane this fleet does not simulate (see simulate's docstring)
            r = _Req(c.name, p.lane, t, prompt, p.max_tokens)
            free = [e for e in serving[p.lane] if len(e.reqs) < e.slots]
            if free:
                take(rng.choice(free), r, t)
            else:
                queues[p.lane].append(r)
            continue
        e = payload
        for r, chunk in e.batch:
            if chunk:
                r.prefilled += chunk
                if r.prefilled < r.prompt:
                    continue
                r.first = t
            r.out += 1
        deadline = {name: by_name[name].deadline_s for name in e.lanes}
        for r in list(e.reqs):
            if r.out >= r.max_tokens:
                status = "succeeded"
            elif t - r.start >= deadline[r.lane]:
                status = "deadline"
            else:
                continue
            e.reqs.remove(r)
            finish(r, t, status)
        refill(e, t)
        step(e, t)

    return _results(classes, done, rejected, model.overhead_s, max_running)


def _results(classes: Sequence[ClassLoad], done: list[_Req], rejected: dict[str, int],
             overhead_s: float, max_running: int) -> dict[str, ClassResult]:
    out = {}
    for c in classes:
        rs = [r for r in done if r.cls == c.name]
        statuses: dict[str, int] = {}
        lanes: dict[str, int] = {}
        for r in rs:
            statuses[r.status] = statuses.get(r.status, 0) + 1
            lanes[r.lane] = lanes.get(r.lane, 0) + 1
        if rejected[c.name]:
            statuses["rejected"] = rejected[c.name]
        ok = [r for r in rs if r.status == "succeeded"]
        e2e = [r.end - r.arrival + overhead_s for r in ok]
        tokens = sum(r.out for r in rs)
        span = (max(r.end for r in rs) - min(r.arrival for r in rs)) if rs else 0.0
        out[c.name] = ClassResult(
            name=c.name, lanes=lanes, n=len(rs) + rejected[c.name], statuses=statuses,
            e2e={"avg": sum(e2e) / len(e2e) if e2e else None, "p50": percentile(e2e, 50),
                 "p99": percentile(e2e, 99), "max": max(e2e) if e2e else None},
            ttft_p99=percentile([r.first - r.arrival + overhead_s for r in ok], 99),
            queued_p99=percentile([r.start - r.arrival for r in rs if r.start is not None], 99),
            output_tokens=tokens, max_running=max_running,
            tokens_per_s=tokens / span if span > 0 else 0.0)
    return out
