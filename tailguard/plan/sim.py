"""A discrete-event simulation of lanes and engines.

What it models, and how the real system does it:

* **Placement**: each request goes to the lane ``tailguard.lanes.placement.place`` picks (the
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
  ``StepModel.step_s`` of its decoding sequences, their context and its prefill tokens.
  The step that finishes a prompt also yields its first token.
  A request whose engine time reaches ``deadline_s`` ends "deadline".
* **Borrowing** (a group's ``borrow``, tailguard/lanes/borrowing.py's policy and its pure
  functions): each engine of the group takes the head of a borrowed lane's queue while
  ``may_borrow`` allows it, and gives back ``reclaim_count`` of its ``youngest`` borrowed
  requests when its own work leaves fewer than R slots free. A reclaimed request goes to
  the back of its lane's queue (a fresh message, a fresh queue TTL) keeping its output so
  far; whoever takes it next prefills prompt + that output again and generates the rest.
  Decisions are taken at every event, not every ``borrower.PERIOD_S`` poll.
  Where borrowed requests run (``BorrowPolicy.engine``, resolved to "own" or "idle"):

  - ``own``: in the engine's own batch, their prompt chunks after its own requests' (vLLM
    priority orders the waiting queue only): their decode, context and prefill lengthen
    the steps the own requests are in, through the step model itself.
  - ``idle``: in a second engine of B slots on the same cores at the kernel's idle CPU
    priority, with the same step model. It runs only while the own engine has no request
    (the own engine steps back to back while it has one), and **preemptively**: a step
    of it in progress is suspended the moment the own engine has work and resumes where
    it stopped (SCHED_IDLE threads are preempted by the kernel on the own engine's wake-up,
    not at the end of their step; a step-granular model would hold a short request behind
    up to a whole 2,000-token prefill). What is left of the cost, the two engines sharing
    caches and memory bandwidth (the worker's threads serving the borrowed streams run on the
    front-end cores: tailguard/host/cores.py), is ``StepModel.borrow_slowdown``: the own
    engine's steps take that much longer while the idle engine holds borrowed requests (a
    measured coefficient, see tailguard/plan/profile.py).
* **Neighbours**: the engines of one simulation are taken to share a host (as
  `tailguard bench`'s two engines share two cores): a step that starts while another
  engine is stepping takes ``StepModel.neighbour_slowdown`` longer (measured by the
  profile; 0 where the engines share nothing, as GPUs on their own memory).
* **Front end** (``StepModel.frontend_s_per_request`` and ``frontend_s_per_token``): on a
  CPU host the front end (Redis, the API, the workers' own threads; tailguard/host/cores.py)
  runs on the cores of the last worker's engine, which runs at a lower CPU priority
  (``TAILGUARD_ENGINE_NICE``; ``MAX_FRONTEND_SHARE`` takes its default, 10): that engine gets
  what the front end leaves. A group marked ``frontend`` has its last
  engine there. Every request the simulation serves costs the front end
  ``frontend_s_per_request`` CPU seconds when it arrives and every output token (of any
  engine) ``frontend_s_per_token`` when its step ends; the front end's share of that
  engine's core is what it was charged over the last ``FRONTEND_WINDOW_S``, per second
  (at most ``MAX_FRONTEND_SHARE``), and a step of that engine (or of its idle-priority
  engine) starting then lasts ``1 / (1 - share)`` times as long (front end first: at nice 0
  against the engine's 10, its short pieces of work run as soon as they are ready). The
  step model's engine had one core; a front end spread over more is not modelled. Zero
  coefficients (a step model without a front-end fit) leave every engine alone.
* **Lanes that follow the load** (``Follow``; tailguard/lanes/rebalance.py's policy, as the
  lane controller, tailguard/control/controller.py, runs it): every ``period_s`` of simulated
  time the simulation builds the controller's ``FleetView`` from its own state (per lane: the
  queued requests and their cost tokens, the requests running on its engines, the engines
  serving it, the cost tokens of its requests that finished over the last ``window_s``; per
  engine: what its group's entry lets it serve, its home lanes and ``moves_to``, what it serves
  now, what it was told and when, its running requests per lane) and calls
  ``RebalancePolicy.decide_moves``. A ``Move`` tells one engine to serve other lanes: the worker reads
  its order ``notice_s`` later and stops taking its old lanes' work; their requests running on
  it finish for up to ``drain_s``, then the rest go back to their lane's queue as a reclaim
  does (output kept, prompt + output prefilled again); then it serves the new lanes with their
  batch (``slots_for``). Engines of a group that borrows are never moved (one mechanism moves
  a worker's capacity). Without ``Follow`` nothing moves and nothing of this runs.
* **Times**: per request, queue wait (arrival to engine), TTFT and end-to-end, the last
  two plus ``StepModel.overhead_s``. Throughput per class is its output tokens over the
  span from its first arrival to its last finish (the bench's definition).

Not modelled: the KV cache (every admitted request fits), preemption by vLLM, the API's own
limits, rate_limit, network time beyond ``overhead_s``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard import settings
from tailguard.errors import NoLaneForRequest, PromptTooLong
from tailguard.lanes.admission import AdmissionPolicy, LaneLoad
from tailguard.lanes.borrowing import BorrowPolicy, EngineLoad, may_borrow, reclaim_count, youngest
from tailguard.lanes.fair_share import FairQueue
from tailguard.lanes.placement import place, request_cost
from tailguard.lanes.rebalance import FleetView, Move, QuietClock, RebalancePolicy, WorkerView
from tailguard.lanes.table import Lane, slots_for
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ClassLoad

#: where borrowed requests run, once "auto" is resolved for a device (borrowing.engine_for)
BORROW_ENGINES = ("own", "idle")
#: a group that borrows nothing
NO_BORROWING = BorrowPolicy(lanes=(), engine="own")
#: over how many seconds the front end's recent CPU is averaged into its share of the core
FRONTEND_WINDOW_S = 2.0
#: the most of its core the front end takes from the engine there: the kernel weighs a nice-0
#: thread 1024 against a nice-10 one's 110, so the engine keeps 110 / 1134 of a busy core
MAX_FRONTEND_SHARE = 1 - 110 / 1134


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: P99 of 100 samples is the 99th value): the
    statistic `tailguard bench` reports too (tailguard/bench/report.py), so a predicted P99
    and a measured one are the same figure."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


@dataclass(frozen=True)
class EngineGroup:
    """``count`` engines, each serving ``lanes`` in strict order with ``max_num_seqs`` slots
    and borrowing as ``borrow`` says (its ``engine`` resolved: one of BORROW_ENGINES); with
    ``frontend``, the last of them shares its cores with the front end (module docstring);
    with ``Follow``, the lane controller may move each to one of ``moves_to`` (its worker
    entry's) and home again. ``name``: its worker entry's, for the engines' names."""

    lanes: tuple[str, ...]
    count: int
    max_num_seqs: int
    borrow: BorrowPolicy = NO_BORROWING
    frontend: bool = False
    moves_to: tuple[str, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        if self.borrow.lanes and self.borrow.engine not in BORROW_ENGINES:
            raise ValueError(f"resolve borrow.engine to one of {BORROW_ENGINES} "
                             f"(borrowing.engine_for), got {self.borrow.engine!r}")


def _controller_policy() -> RebalancePolicy:
    """The policy as `tailguard controller` builds it at the settings' defaults."""
    return RebalancePolicy(admission=AdmissionPolicy(
        prior_tokens_per_s=settings.PRIOR_TOKENS_PER_S.default),
        min_dwell_s=settings.LANE_DWELL_S.default, home_after_s=settings.LANE_HOME_AFTER_S.default,
        max_moves=settings.LANE_MAX_MOVES.default)


@dataclass(frozen=True)
class Follow:
    """The lane controller in the simulation (module docstring, "Lanes that follow the load");
    the defaults are the settings' (tailguard/settings.py)."""

    policy: RebalancePolicy = field(default_factory=_controller_policy)
    period_s: float = settings.LANE_CONTROLLER_S.default  # how often it decides
    notice_s: float = settings.LANE_FOLLOW_S.default  # until the worker reads its order
    drain_s: float = settings.MOVE_DRAIN_S.default  # the old lanes' running requests may finish
    window_s: float = float(settings.RATE_WINDOW_S.default)  # of a lane's served tokens


@dataclass(eq=False)
class _Req:
    cls: str
    lane: str
    arrival: float
    prompt: int
    max_tokens: int
    rid: str = ""
    to_prefill: int = 0  # the prompt, or after a reclaim, prompt + the output so far
    prefilled: int = 0
    out: int = 0
    queued_at: float = 0.0  # its queue TTL runs from here (the arrival, or the reclaim)
    start: float | None = None  # first taken by an engine
    since: float = 0.0  # taken by the engine it is on
    used_s: float = 0.0  # engine time before its last reclaim (the deadline counts it)
    where: _Engine | None = None
    borrowed: bool = False  # on a borrowing engine now (or, once done, when it finished)
    reclaimed: int = 0
    first: float | None = None
    end: float | None = None
    status: str = "queued"


@dataclass(eq=False)
class _Engine:
    lanes: tuple[str, ...]
    slots: int
    policy: BorrowPolicy | None = None  # what it borrows (None: nothing)
    idle: _Engine | None = None  # its idle-priority engine for borrowed requests
    host: _Engine | None = None  # (an idle engine) the own engine it yields the cores to
    reqs: list[_Req] = field(default_factory=list)  # admitted, in admission order
    busy: bool = False  # a step in progress (for an idle engine: possibly suspended)
    batch: list[tuple[_Req, int]] = field(default_factory=list)  # (request, prompt chunk)
    suspended: bool = False  # (an idle engine) its step waits for the cores
    left_s: float = 0.0  # (suspended) what its step has still to run
    end: float = 0.0  # (not suspended) when the step in progress ends
    version: int = 0  # bumped on suspending: the step end scheduled before no longer holds
    name: str = ""
    #: what the lane controller may have it serve, its home lanes first (WorkerView's)
    assignments: tuple[tuple[str, ...], ...] = ()
    told: tuple[str, ...] | None = None  # its last order (None: never told: its home)
    told_at: float | None = None
    draining: bool = False  # carrying out its order: it takes no new work
    moves: int = 0  # orders carried out (tells a drain's end from a later one's)

    def borrowed(self) -> list[_Req]:
        return self.idle.reqs if self.idle else [r for r in self.reqs if r.borrowed]

    def load(self, queued: int) -> EngineLoad:
        b = len(self.borrowed())
        own = len(self.reqs) - (0 if self.idle else b)
        return EngineLoad(slots=self.slots, own_running=own, borrowed_running=b,
                          own_queued=queued)


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
    borrowed: int = 0  # requests that finished on a borrowing engine
    reclaimed: int = 0  # times one of its requests was given back to its lane's queue

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def simulate(classes: Sequence[ClassLoad], lanes: Sequence[Lane], groups: Sequence[EngineGroup],
             model: StepModel, *, duration_s: float, seed: int = 0,
             arrivals: Sequence[tuple[float, str, int, int]] | None = None,
             follow: Follow | None = None,
             fair: Mapping[str, float] | None = None) -> dict[str, ClassResult]:
    """Run `duration_s` of arrivals to completion; per-class results.

    `arrivals`, (time, class name, prompt tokens, max_tokens), replays a given request
    list (a bench run's) instead of drawing Poisson arrivals and lengths from `classes`.
    `follow`: the lane controller moves engines between lanes (module docstring).
    `fair`: each class is one API key's traffic, dispatched in fair order by key with these
    weights (a class not named: 1), as the API does in keys mode (tailguard/lanes/fair_share.py).

    Requests placed on a lane no group serves are left out (not counted), so one lane
    group can be simulated alone: lanes that share no engine interact only through
    ``neighbour_slowdown`` (then among the engines simulated) and borrowing (a group
    borrowing from a lane no group serves borrows nothing).
    """
    sim = Simulation(classes, lanes, groups, model, seed=seed, follow=follow, fair=fair)
    if arrivals is None:
        sim.draw_arrivals(duration_s)
    else:
        sim.replay(arrivals)
    return sim.run()


class Simulation:
    """One run: the fleet's engines, the lanes' queues, the event heap and what has ended.

    Each method is one rule of the model (the module docstring); ``run`` pops events in time
    order and applies them. Arrivals are added first (``draw_arrivals`` or ``replay``).
    """

    def __init__(self, classes: Sequence[ClassLoad], lanes: Sequence[Lane],
                 groups: Sequence[EngineGroup], model: StepModel, *, seed: int = 0,
                 follow: Follow | None = None, fair: Mapping[str, float] | None = None) -> None:
        self.classes = classes
        self.lanes = lanes  # in the table's order, as `place` takes them
        self.model = model
        self.seed = seed
        self.rng = random.Random(seed)  # which free engine a new request goes to
        self.by_name = {l.name: l for l in lanes}
        self.owners: list[_Engine] = []  # the workers' own engines
        self.front: _Engine | None = None  # the engine on the front end's cores
        for g in groups:
            self.owners += [_new_engine(g, k) for k in range(1, g.count + 1)]
            if g.frontend and g.count:
                self.front = self.owners[-1]
        self.engines = self.owners + [e.idle for e in self.owners if e.idle]
        self.lenders = [e for e in self.owners if e.policy]
        self.serving = {name: [e for e in self.owners if name in e.lanes] for name in self.by_name}
        self.follow = follow
        #: the lanes some engine serves (with Follow: may serve); the others' requests are left out
        self.simulated = {name for name, es in self.serving.items() if es} | {
            name for e in self.owners if follow is not None for a in e.assignments for name in a}
        self.served: dict[str, deque[tuple[float, int]]] = {n: deque() for n in self.by_name}
        self.moves: list[tuple[float, Move]] = []  # (when decided, the move)
        self.quiet = QuietClock()  # rule 5's clock, as the controller keeps it
        self.move_s: list[float] = []  # each carried-out move's decision -> new lanes served
        self.last_move_at: float | None = None
        self.queues: dict[str, list[_Req]] = {name: [] for name in self.by_name}  # FIFO
        self.heads = {name: 0 for name in self.by_name}  # where each queue's head is
        #: with `fair` (each class one API key's traffic, its weight; absent: 1), each lane's
        #: queue is a FairQueue, dispatched in virtual-token-counter order as the API's Redis
        #: steps release it (tailguard/lanes/fair_share.py: the same code)
        self.fair = None if fair is None else {name: FairQueue(fair) for name in self.by_name}
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()  # ties in time: first scheduled, first applied
        self._rids = itertools.count()
        self.charged: deque[tuple[float, float]] = deque()  # (time, front-end CPU s) in the window
        self.in_window = 0.0  # the sum of `charged`
        self.done: list[_Req] = []
        self.rejected: dict[str, int] = {c.name: 0 for c in classes}
        self.max_running = 0

    # -- arrivals and the event loop

    def draw_arrivals(self, duration_s: float) -> None:
        """Poisson arrivals over `duration_s` and their lengths, each class its own stream."""
        for c in self.classes:
            crng = random.Random(f"{self.seed}/{c.name}")
            t = crng.expovariate(c.rate) if c.rate > 0 else duration_s
            while t < duration_s:
                self.push(t, "arrive", (c, c.prompt.sample(crng), c.output.sample(crng)))
                t += crng.expovariate(c.rate)

    def replay(self, arrivals: Sequence[tuple[float, str, int, int]]) -> None:
        """These requests: (time, class name, prompt tokens, max_tokens)."""
        by_class = {c.name: c for c in self.classes}
        for t, name, prompt, max_tokens in arrivals:
            self.push(t, "arrive", (by_class[name], prompt, max_tokens))

    def push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, payload))

    def run(self) -> dict[str, ClassResult]:
        """Every event to the last; per-class results."""
        apply = {"arrive": self.arrive, "step": self.step_ended, "tick": self.tick,
                 "order": self.order, "drained": self.drained}
        if self.follow is not None and self.events:
            self.push(0.0, "tick", ())
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            apply[kind](t, *payload)
            for e in self.lenders:
                self.lend(e, t)
        return self.results()

    def arrive(self, t: float, c: ClassLoad, prompt: int, max_tokens: int) -> None:
        """Place a request as the API does and hand it to its lane."""
        try:
            p = place(self.lanes, priority=c.priority, prompt_tokens=prompt,
                      requested_max_tokens=max_tokens)
        except (NoLaneForRequest, PromptTooLong):
            self.rejected[c.name] += 1
            return
        if p.lane not in self.simulated:
            return  # a lane this fleet does not simulate (see simulate's docstring)
        r = _Req(c.name, p.lane, t, prompt, p.max_tokens, rid=str(next(self._rids)),
                 to_prefill=prompt, queued_at=t)
        self.charge(t, self.model.frontend_s_per_request)
        self.enqueue(r, t)

    def finish(self, r: _Req, t: float, status: str) -> None:
        r.end, r.status = t, status
        self.done.append(r)
        if self.follow is not None and status != "expired":
            self.served[r.lane].append((t, request_cost(r.prompt, r.max_tokens)))

    # -- the front end's share of its core

    def charge(self, t: float, cpu_s: float) -> None:
        """The front end spent `cpu_s` CPU seconds at `t` (counted only where it has a core)."""
        if cpu_s > 0 and self.front is not None:
            self.charged.append((t, cpu_s))
            self.in_window += cpu_s

    def frontend_share(self, t: float) -> float:
        """The share of its core the front end takes at `t`: its CPU over the last window."""
        while self.charged and self.charged[0][0] <= t - FRONTEND_WINDOW_S:
            self.in_window -= self.charged.popleft()[1]
        return min(max(self.in_window, 0.0) / FRONTEND_WINDOW_S, MAX_FRONTEND_SHARE)

    # -- queues

    def queued(self, name: str) -> int:
        if self.fair is not None:
            return len(self.fair[name])
        return len(self.queues[name]) - self.heads[name]

    def queued_reqs(self, name: str) -> list[_Req]:
        if self.fair is not None:
            return [r for q in self.fair[name].queues() for r, _ in q]
        return self.queues[name][self.heads[name]:]

    def pop(self, name: str, t: float) -> _Req | None:
        """The head of lane `name`'s queue still within its TTL (the expired ones end); in fair
        order, the oldest request of the key with the least counter."""
        ttl = self.by_name[name].queue_ttl_s
        if self.fair is not None:
            while (item := self.fair[name].pop()) is not None:
                r = item[1]
                if t - r.queued_at > ttl:
                    self.finish(r, r.queued_at + ttl, "expired")
                else:
                    return r
            return None
        q = self.queues[name]
        while self.heads[name] < len(q):
            r = q[self.heads[name]]
            self.heads[name] += 1
            if t - r.queued_at > ttl:
                self.finish(r, r.queued_at + ttl, "expired")
            else:
                return r
        return None

    def enqueue(self, r: _Req, t: float) -> None:
        """To a random engine of its lane with a free slot, else to the back of its queue."""
        free = [e for e in self.serving[r.lane] if len(e.reqs) < e.slots]
        if free:
            self.take(self.rng.choice(free), r, t)
        elif self.fair is not None:
            self.fair[r.lane].push(r.cls, r, request_cost(r.prompt, r.max_tokens))
        else:
            self.queues[r.lane].append(r)

    def take(self, e: _Engine, r: _Req, t: float, borrowed: bool = False) -> None:
        """`e` admits `r` (and steps, if it was idle)."""
        if r.start is None:
            r.start = t
        r.since, r.status, r.where, r.borrowed = t, "running", e, borrowed
        e.reqs.append(r)
        self.max_running = max(self.max_running, len(e.reqs))
        if not e.busy:
            self.step(e, t)

    def refill(self, e: _Engine, t: float) -> None:
        """Fill `e`'s free slots from its lanes' queues, in the lanes' order."""
        for name in e.lanes:
            while len(e.reqs) < e.slots:
                r = self.pop(name, t)
                if r is None:
                    break
                self.take(e, r, t)

    # -- borrowing

    def lend(self, e: _Engine, t: float) -> None:
        """Borrow and reclaim as e's policy says, now."""
        p = e.policy
        assert p is not None
        while True:
            load = e.load(sum(self.queued(name) for name in e.lanes))
            n = reclaim_count(p, load, arriving=load.own_queued)
            if n:
                chosen = set(youngest([(r.rid, r.since) for r in e.borrowed()], n))
                for r in [r for r in e.borrowed() if r.rid in chosen]:
                    self.give_back(r, t)
                return
            if not may_borrow(p, load):
                return
            r = next((r for name in p.lanes if name in self.queues
                      for r in [self.pop(name, t)] if r is not None), None)
            if r is None:
                return
            self.take(e.idle or e, r, t, borrowed=True)

    def give_back(self, r: _Req, t: float) -> None:
        """Reclaim `r`: a fresh message at the back of its lane's queue, its output kept."""
        e = r.where
        assert e is not None
        e.reqs.remove(r)
        r.used_s += t - r.since
        r.to_prefill, r.prefilled = r.prompt + r.out, 0
        r.queued_at, r.status, r.where, r.borrowed = t, "queued", None, False
        r.reclaimed += 1
        self.enqueue(r, t)

    # -- engine steps

    def step(self, e: _Engine, t: float) -> None:
        """Start `e`'s next step at `t` (or leave it idle): its batch and how long it lasts."""
        if not e.reqs:
            e.busy = False
            if e.idle and e.idle.suspended:
                self.resume(e.idle, t)
            return
        if e.idle and e.idle.busy and not e.idle.suspended:
            self.suspend(e.idle, t)
        decode = [r for r in e.reqs if r.prefilled == r.to_prefill]
        prefill = self.batch(e, decode)
        e.busy = True
        s = self.step_s(e, t, decode, prefill)
        if e.host and e.host.reqs:
            e.suspended, e.left_s = True, s  # its host has work: it waits for the cores
            return
        e.end = t + s
        self.push(e.end, "step", (e, e.version))

    def batch(self, e: _Engine, decode: list[_Req]) -> int:
        """Set `e`'s batch: a token for each of `decode`, then prompt chunks within the token
        budget, own prompts first (vLLM priority); the prefill tokens in it."""
        budget = max(self.model.max_batched_tokens - len(decode), 0)
        e.batch = [(r, 0) for r in decode]
        prefill = 0
        for r in sorted(e.reqs, key=lambda r: r.borrowed):
            if r.prefilled < r.to_prefill and budget > 0:
                chunk = min(r.to_prefill - r.prefilled, budget)
                e.batch.append((r, chunk))
                budget -= chunk
                prefill += chunk
        return prefill

    def step_s(self, e: _Engine, t: float, decode: list[_Req], prefill: int) -> float:
        """How long a step of `e` starting at `t` lasts: the step model's time, longer beside its
        idle engine's borrowed work, beside a busy neighbour, and by the front end's share."""
        m = self.model
        s = m.step_s(len(decode), prefill, sum(r.prompt + r.out for r in decode))
        if e.idle and e.idle.reqs:
            s *= 1 + m.borrow_slowdown
        if m.neighbour_slowdown and any(o.busy and not o.suspended for o in self.engines
                                        if o is not e and o is not e.host and o is not e.idle):
            s *= 1 + m.neighbour_slowdown
        if self.front is not None and self.front in (e, e.host):
            s /= 1 - self.frontend_share(t)
        return s

    def suspend(self, e: _Engine, t: float) -> None:
        """(an idle engine) Its host has work: the step in progress stops where it is."""
        e.suspended, e.left_s, e.version = True, e.end - t, e.version + 1

    def resume(self, e: _Engine, t: float) -> None:
        """(an idle engine) Its host is idle: the suspended step runs on."""
        e.suspended, e.end = False, t + e.left_s
        self.push(e.end, "step", (e, e.version))

    def step_ended(self, t: float, e: _Engine, version: int) -> None:
        """`e`'s step ends: its tokens out, finished requests end, free slots refill, next step."""
        if version != e.version:
            return  # suspended since: resume() scheduled its end again
        tokens = 0
        for r, chunk in e.batch:
            if r.where is not e:
                continue  # reclaimed while the step ran
            if chunk:
                r.prefilled += chunk
                if r.prefilled < r.to_prefill:
                    continue
                if r.first is None:
                    r.first = t
            r.out += 1
            tokens += 1
        self.charge(t, self.model.frontend_s_per_token * tokens)
        for r in list(e.reqs):
            if r.out >= r.max_tokens:
                status = "succeeded"
            elif r.used_s + t - r.since >= self.by_name[r.lane].deadline_s:
                status = "deadline"
            else:
                continue
            e.reqs.remove(r)
            self.finish(r, t, status)
        if e.draining and not e.reqs:
            self.switch(e, t)  # its old lanes' requests all ended within the drain
        elif e.host is None and not e.draining:
            self.refill(e, t)
        self.step(e, t)

    # -- the lane controller (Follow)

    def tick(self, t: float) -> None:
        """The controller's period: decide on this moment's figures, order the move if any."""
        assert self.follow is not None
        policy = self.follow.policy
        for move in policy.decide_moves(self.quiet.stamp(policy, self.fleet_view(t))):
            e = next(e for e in self.owners if e.name == move.worker)
            e.told, e.told_at = move.to, t
            self.moves.append((t, move))
            self.last_move_at = t
            self.push(t + self.follow.notice_s, "order", (e,))
        if self.events or any(e.reqs for e in self.owners) or self.waiting(t):
            self.push(t + self.follow.period_s, "tick", ())

    def waiting(self, t: float) -> bool:
        """Whether a queued request is still within its TTL at `t` (then the controller keeps
        deciding: it may bring its lane a worker); once none is, the queues' rest expires."""
        left = [r for name in self.queues for r in self.queued_reqs(name)]
        if any(t - r.queued_at <= self.by_name[r.lane].queue_ttl_s for r in left):
            return True
        for name in self.queues:
            self.pop(name, t)  # ends every one of them: all are past their TTL
        return False

    def fleet_view(self, t: float) -> FleetView:
        """What the controller reads at `t`: each lane's load, each engine as a worker."""
        assert self.follow is not None
        return FleetView(lanes=self.by_name,
                         loads={name: self.lane_load(name, t) for name in self.by_name},
                         workers=tuple(WorkerView(e.name, e.assignments, e.lanes, e.told,
                                                  e.told_at, self.running(e))
                                       for e in self.owners),
                         now=t, last_move_at=self.last_move_at,
                         last_move_s=self.move_s[-1] if self.move_s else None)

    def running(self, e: _Engine) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in e.reqs:
            out[r.lane] = out.get(r.lane, 0) + 1
        return out

    def lane_load(self, name: str, t: float) -> LaneLoad:
        """Lane `name`'s figures as tailguard/jobs/lane_load.py reads them from Redis."""
        assert self.follow is not None
        window = self.follow.window_s
        served = self.served[name]
        while served and served[0][0] <= t - window:
            served.popleft()
        queued = self.queued_reqs(name)
        return LaneLoad(
            backlog_tokens=sum(request_cost(r.prompt, r.max_tokens) for r in queued),
            queued_jobs=len(queued),
            running_jobs=sum(1 for e in self.owners for r in e.reqs
                             if r.lane == name and not r.borrowed),
            served_tokens=sum(c for _, c in served), window_s=window,
            live_workers=sum(1 for e in self.owners if name in e.lanes),
            now=t,
            standby_workers=sum(1 for e in self.owners if name not in e.lanes
                                and any(name in a for a in e.assignments)))

    def order(self, t: float, e: _Engine) -> None:
        """`e`'s worker reads its order: it stops taking its lanes' work and drains."""
        assert self.follow is not None
        for name in e.lanes:
            self.serving[name].remove(e)
        e.draining = True
        if not e.reqs:
            self.switch(e, t)
        else:
            self.push(t + self.follow.drain_s, "drained", (e, e.moves))

    def drained(self, t: float, e: _Engine, moves: int) -> None:
        """The drain is over: what still runs goes back to its lane's queue."""
        if not e.draining or e.moves != moves:
            return  # its requests all ended before: it switched then
        for r in list(e.reqs):
            self.give_back(r, t)
        self.switch(e, t)

    def switch(self, e: _Engine, t: float) -> None:
        """`e` serves the lanes it was told, with their batch."""
        assert e.told is not None and e.told_at is not None
        e.lanes, e.draining, e.moves = e.told, False, e.moves + 1
        e.slots = slots_for([self.by_name[name] for name in e.lanes])
        for name in e.lanes:
            self.serving[name].append(e)
        self.move_s.append(t - e.told_at)
        self.refill(e, t)

    # -- results

    def results(self) -> dict[str, ClassResult]:
        """Per class: its statuses, times (``overhead_s`` added) and throughput."""
        overhead_s = self.model.overhead_s
        out = {}
        for c in self.classes:
            rs = [r for r in self.done if r.cls == c.name]
            statuses: dict[str, int] = {}
            lanes: dict[str, int] = {}
            for r in rs:
                statuses[r.status] = statuses.get(r.status, 0) + 1
                lanes[r.lane] = lanes.get(r.lane, 0) + 1
            rejected = self.rejected[c.name]
            if rejected:
                statuses["rejected"] = rejected
            ok = [r for r in rs if r.status == "succeeded"]
            e2e = [r.end - r.arrival + overhead_s for r in ok]
            tokens = sum(r.out for r in rs)
            span = (max(r.end for r in rs) - min(r.arrival for r in rs)) if rs else 0.0
            out[c.name] = ClassResult(
                name=c.name, lanes=lanes, n=len(rs) + rejected, statuses=statuses,
                e2e={"avg": sum(e2e) / len(e2e) if e2e else None, "p50": percentile(e2e, 50),
                     "p99": percentile(e2e, 99), "max": max(e2e) if e2e else None},
                ttft_p99=percentile([r.first - r.arrival + overhead_s for r in ok], 99),
                queued_p99=percentile([r.start - r.arrival for r in rs if r.start is not None],
                                      99),
                output_tokens=tokens, max_running=self.max_running,
                tokens_per_s=tokens / span if span > 0 else 0.0,
                borrowed=sum(r.borrowed for r in rs), reclaimed=sum(r.reclaimed for r in rs))
        return out


def _new_engine(g: EngineGroup, k: int) -> _Engine:
    """The `k`-th engine of `g` (from 1), named as its worker (WorkerSpec.replica_name)."""
    base = g.name or "+".join(g.lanes)
    name = base if k == 1 else f"{base}-{k}"
    assignments = (g.lanes, *((lane,) for lane in g.moves_to if not g.borrow.lanes))
    if not g.borrow.lanes:
        return _Engine(g.lanes, g.max_num_seqs, name=name, assignments=assignments)
    e = _Engine(g.lanes, g.max_num_seqs, policy=g.borrow, name=name, assignments=assignments)
    if g.borrow.engine == "idle":
        e.idle = _Engine(g.borrow.lanes, g.borrow.max_borrowed, host=e)
    return e
