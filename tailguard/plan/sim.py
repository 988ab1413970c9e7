"""A discrete-event simulation of lanes and engines.

What it models, and how the real system does it:

* **Placement**: each request goes to the lane ``tailguard.lanes.placement.place`` picks (the
  same function the API calls), with max_tokens capped as the API caps it.
* **Dispatch**, how a request reaches an engine, one of three per engine group
  (``EngineGroup.dispatch``):

  - ``strict`` (DEDICATED): one FIFO per lane; an engine serves its group's lanes only, in
    strict order, up to ``max_num_seqs`` requests (a worker has that many threads and
    prefetches one message each). A new request goes to a seeded random engine of its lane with
    a free slot (whichever worker's BRPOP Redis answers), else waits in its lane's queue. Static
    lanes, and one shared lane on every engine, are this.
  - ``fleet`` (FLEET): one FIFO per lane over the whole fleet, every engine serving every lane
    of its group; whenever an engine has a free slot it takes the oldest request of the lane
    ``tailguard.lanes.dispatch.next_lane`` names (the rule the workers run: lanes in priority
    order, each below its per-engine limit ``Lane.engine_slots``, batch only while no
    interactive request waits). A request that arrives while several engines have a free slot
    goes to the one that took a request least recently (Redis answers the BRPOP that has waited
    longest, and a worker blocks again as soon as it has taken a message).
  - ``router`` (ROUTER): no central queue; each request is committed on arrival to the engine
    with the fewest requests running and waiting (ties: a seeded random one), as a router in
    front of ``vllm serve`` replicas does, and waits in that engine's own queue, taken in vLLM's
    priority order (its lane's rank, then arrival) as slots free.

  A request that waited longer than its lane's ``queue_ttl_s`` expires without reaching an
  engine.

  With ``affinity`` (fleet dispatch only), a request whose prefix some engines served last
  (their prefill of it done: a document, a conversation's turn ended) is offered first to the
  one of them with the most free slots for it (requests running under its limit for the lane;
  tailguard/lanes/affinity.py, the rule), which takes it at once (a real worker's pick-up
  from its own queue is not modelled); a full holder, or one more loaded than the least
  loaded engine by over ``max_extra``, gets no offer: the request joins its lane's queue.
* **Prefix cache** (with ``prefix_cache_tokens``): each engine holds the prefixes it served in
  an LRU of that many tokens (tailguard/plan/prefix_cache.py): a request's prefixes when its
  prompt is prefilled, a conversation's whole turn (prompt and output) when it ends. A request
  an engine admits skips the prefill of the longest of its prefixes the engine holds, in whole
  blocks of ``prefix_block_tokens`` (vLLM caches full blocks only: 16 tokens on a GPU, 128 on
  its CPU backend), all of its prompt but the last token at most (which vLLM always computes).
* **Sessions** (``add_sessions``): a conversation's next turn arrives its think time after the
  previous turn's end, its prompt the previous prompt and output and the user's new tokens; a
  turn that does not succeed ends its session.
* **Engines**: continuous batching. Each step decodes one token for every sequence past
  its prompt and prefills up to ``max_batched_tokens`` prompt tokens (chunked), in vLLM's
  priority order: the lane's rank in the lanes table (short first), then admission; a request
  that entered while a step ran joins the next one. The step lasts ``StepModel.step_s`` of
  its decoding sequences, their context and its prefill tokens. The step that finishes a
  prompt also yields its first token. A request whose engine time reaches ``deadline_s`` ends
  "deadline".
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
  (at most ``MAX_FRONTEND_SHARE``), and a step of that engine starting then lasts
  ``1 / (1 - share)`` times as long (front end first: at nice 0 against the engine's 10, its
  short pieces of work run as soon as they are ready). The step model's engine had one core;
  a front end spread over more is not modelled. Zero coefficients (a step model without a
  front-end fit) leave every engine alone.
* **Backlog**: the cost tokens (prompt + max_tokens) of the requests queued, every queue
  together, as ``tailguard_lane_backlog_tokens`` sums them; ``Simulation.backlog_mean`` is its
  average over the run (what an autoscaler reads: tailguard/plan/keda.py).
* **Times**: per request, queue wait (arrival to engine), TTFT and end-to-end, the last
  two plus ``StepModel.overhead_s``. Throughput per class is its output tokens over the
  span from its first arrival to its last finish (the bench's definition).

Not modelled: the KV cache's room for running requests (every admitted request fits),
preemption by vLLM, the API's own limits, rate_limit, network time beyond ``overhead_s``.
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

from tailguard.errors import NoLaneForRequest, PromptTooLong
from tailguard.lanes.affinity import Affinity, holders, offer_to, remember
from tailguard.lanes.dispatch import LaneLimit, capped, next_lane, prefill_open
from tailguard.lanes.fair_share import FairQueue
from tailguard.lanes.placement import place, request_cost
from tailguard.lanes.table import Lane
from tailguard.plan.prefix_cache import Prefix, PrefixCache
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import ChatSession, ClassLoad, PrefixedArrival

#: how requests reach engines (module docstring, "Dispatch")
DEDICATED, FLEET, ROUTER = "strict", "fleet", "router"
DISPATCHES = (DEDICATED, FLEET, ROUTER)
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
    """``count`` engines, each serving ``lanes`` with ``max_num_seqs`` slots, fed as
    ``dispatch`` says (one of DISPATCHES); with ``frontend``, the last of them shares its cores
    with the front end (module docstring). ``name``: its worker entry's, for the engines'
    names."""

    lanes: tuple[str, ...]
    count: int
    max_num_seqs: int
    frontend: bool = False
    name: str = ""
    dispatch: str = DEDICATED
    #: (FLEET) each engine's bound on the prompt tokens its jobs not yet at their first token
    #: prefill (its worker's ``max_prefill_tokens``; 0: none)
    max_prefill_tokens: int = 0

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCHES:
            raise ValueError(f"dispatch is one of {DISPATCHES}, got {self.dispatch!r}")


@dataclass(eq=False)
class _Req:
    cls: str
    lane: str
    arrival: float
    prompt: int
    max_tokens: int
    rank: int = 0  # its lane's place in the table: vLLM's priority (lower first)
    cost: int = 0  # cost tokens (placement's), what the backlog counts
    prefilled: int = 0
    out: int = 0
    start: float | None = None  # taken by an engine
    where: _Engine | None = None
    first: float | None = None
    end: float | None = None
    status: str = "queued"
    prefix: tuple[Prefix, ...] = ()  # what of its prompt an engine may hold, shortest first
    keep: str | None = None  # a conversation's name: its turn stays cached under it
    follow: tuple[ChatSession, int] | None = None  # its session and turn
    cached: int = 0  # prompt tokens its engine's prefix cache held


@dataclass(eq=False)
class _Engine:
    lanes: tuple[str, ...]
    slots: int
    dispatch: str = DEDICATED
    reqs: list[_Req] = field(default_factory=list)  # admitted, in admission order
    running: dict[str, int] = field(default_factory=dict)  # of `reqs`, per lane
    #: (ROUTER) its own queue: (rank, arrival order, request), vLLM's priority order
    waiting: list[tuple[int, int, _Req]] = field(default_factory=list)
    busy: bool = False  # a step in progress
    batch: list[tuple[_Req, int]] = field(default_factory=list)  # (request, prompt chunk)
    end: float = 0.0  # when the step in progress ends
    name: str = ""
    #: (FLEET) when it last took a request: Redis answers the worker blocked longest first
    turn: int = 0
    cache: PrefixCache | None = None
    max_prefill_tokens: int = 0

    def prefilling(self) -> dict[str, int]:
        """Per lane, the prompt tokens its requests not yet at their first token have to prefill
        (counted only under a bound: nothing reads them otherwise)."""
        out: dict[str, int] = {}
        if self.max_prefill_tokens > 0:
            for r in self.reqs:
                if r.first is None:
                    out[r.lane] = out.get(r.lane, 0) + r.prompt - r.cached
        return out


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
             arrivals: Sequence[tuple[float, str, int, int]] | None = None,
             fair: Mapping[str, float] | None = None, frontend_cap: int = 0
             ) -> dict[str, ClassResult]:
    """Run `duration_s` of arrivals to completion; per-class results.

    `arrivals`, (time, class name, prompt tokens, max_tokens), replays a given request
    list (a bench run's) instead of drawing Poisson arrivals and lengths from `classes`.
    `fair`: each class is one API key's traffic, dispatched in fair order by key with these
    weights (a class not named: 1), as the API does in keys mode (tailguard/lanes/fair_share.py).
    `frontend_cap`: the front end's engine's lane limits cut to it, as its worker's are
    (``TAILGUARD_FRONTEND_ENGINE_MAX_RUNNING``; 0: not cut).

    Requests placed on a lane no group serves are left out (not counted), so one lane
    group can be simulated alone: lanes that share no engine interact only through
    ``neighbour_slowdown`` (then among the engines simulated).
    """
    sim = Simulation(classes, lanes, groups, model, seed=seed, fair=fair, frontend_cap=frontend_cap)
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
                 fair: Mapping[str, float] | None = None,
                 prefix_cache_tokens: int | None = None, prefix_block_tokens: int = 16,
                 affinity: Affinity | None = None, frontend_cap: int = 0) -> None:
        self.classes = classes
        #: the front end's engine's lane limits cut to this (TAILGUARD_FRONTEND_ENGINE_MAX_RUNNING)
        self.frontend_cap = frontend_cap
        self.lanes = lanes  # in the table's order, as `place` takes them
        self.model = model
        self.seed = seed
        self.rng = random.Random(seed)  # which free engine a new request goes to
        self.by_name = {l.name: l for l in lanes}
        self.rank = {l.name: i for i, l in enumerate(lanes)}
        self.engines: list[_Engine] = []
        self.front: _Engine | None = None  # the engine on the front end's cores
        for g in groups:
            self.engines += [_new_engine(g, k) for k in range(1, g.count + 1)]
            if g.frontend and g.count:
                self.front = self.engines[-1]
        if prefix_cache_tokens is not None:
            for e in self.engines:
                e.cache = PrefixCache(prefix_cache_tokens)
        self.block = max(1, prefix_block_tokens)
        self.affinity = affinity
        #: (affinity) prefix name -> the engines that served it last, by name, the latest last
        self.index: dict[str, tuple[str, ...]] = {}
        self.named = {e.name: e for e in self.engines}
        #: prompt tokens looked up in the engines' prefix caches, and found
        self.prefix_queries = self.prefix_hits = 0
        #: (affinity) requests taken by their prefix's engine, and not offered (no holder, or
        #: none with room)
        self.offers = {"taken": 0, "not_offered": 0}
        self.serving = {name: [e for e in self.engines if name in e.lanes]
                        for name in self.by_name}
        if any(len({e.dispatch for e in es}) > 1 for es in self.serving.values()):
            raise ValueError("the engines serving one lane are fed one way (one dispatch)")
        #: the lanes some engine serves; the others' requests are left out
        self.simulated = {name for name, es in self.serving.items() if es}
        self.queues: dict[str, list[_Req]] = {name: [] for name in self.by_name}  # FIFO
        self.heads = {name: 0 for name in self.by_name}  # where each queue's head is
        #: with `fair` (each class one API key's traffic, its weight; absent: 1), each lane's
        #: queue is a FairQueue, dispatched in virtual-token-counter order as the API's Redis
        #: steps release it (tailguard/lanes/fair_share.py: the same code)
        self.fair = None if fair is None else {name: FairQueue(fair) for name in self.by_name}
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()  # ties in time: first scheduled, first applied
        self.charged: deque[tuple[float, float]] = deque()  # (time, front-end CPU s) in the window
        self.in_window = 0.0  # the sum of `charged`
        self.done: list[_Req] = []
        self.rejected: dict[str, int] = {c.name: 0 for c in classes}
        self.max_running = 0
        self.backlog = 0  # cost tokens queued now, every queue together
        self.backlog_area = 0.0  # its integral over time, to `now`
        self.now = 0.0

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

    def add_prefixed(self, arrivals: Sequence[PrefixedArrival]) -> None:
        """Requests whose prompts begin with named prefixes (a shared document)."""
        by_class = {c.name: c for c in self.classes}
        for a in arrivals:
            self.push(a.t, "arrive", (by_class[a.cls], a.prompt, a.max_tokens, a.prefix, a.keep))

    def add_sessions(self, sessions: Sequence[ChatSession]) -> None:
        """Conversations: each one's first turn at its arrival, the next ones as they end."""
        for s in sessions:
            self.push(s.arrival_s, "turn", (s, 0, s.system[1]))

    def turn(self, t: float, session: ChatSession, k: int, context: int) -> None:
        """Turn `k` of `session` arrives, after `context` tokens of conversation so far."""
        user, max_tokens, _ = session.turns[k]
        chain = (session.system,) + (((session.key, context),) if k else ())
        c = next(c for c in self.classes if c.name == session.cls)
        self.arrive(t, c, context + user, max_tokens, chain, session.key, (session, k))

    def push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, payload))

    def run(self) -> dict[str, ClassResult]:
        """Every event to the last; per-class results."""
        apply = {"arrive": self.arrive, "step": self.step_ended, "turn": self.turn}
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self.backlog_area += self.backlog * (t - self.now)
            self.now = t
            apply[kind](t, *payload)
        return self.results()

    @property
    def backlog_mean(self) -> float:
        """The cost tokens queued, averaged over the run so far."""
        return self.backlog_area / self.now if self.now > 0 else 0.0

    def arrive(self, t: float, c: ClassLoad, prompt: int, max_tokens: int,
               prefix: tuple[Prefix, ...] = (), keep: str | None = None,
               follow: tuple[ChatSession, int] | None = None) -> None:
        """Place a request as the API does and hand it to its lane."""
        try:
            p = place(self.lanes, priority=c.priority, prompt_tokens=prompt,
                      requested_max_tokens=max_tokens)
        except (NoLaneForRequest, PromptTooLong):
            self.rejected[c.name] += 1
            return
        if p.lane not in self.simulated:
            return  # a lane this fleet does not simulate (see simulate's docstring)
        r = _Req(c.name, p.lane, t, prompt, p.max_tokens, rank=self.rank[p.lane],
                 cost=request_cost(prompt, p.max_tokens), prefix=prefix, keep=keep,
                 follow=follow)
        self.charge(t, self.model.frontend_s_per_request)
        self.enqueue(r, t)

    def finish(self, r: _Req, t: float, status: str) -> None:
        r.end, r.status = t, status
        self.done.append(r)
        if r.where is not None and r.where.cache is not None and r.keep:
            r.where.cache.put(r.keep, r.prompt + r.out)  # the whole turn, for the next one
            self.served(r.keep, r.where)
        if status == "succeeded" and r.follow is not None:
            session, k = r.follow
            if k + 1 < len(session.turns):
                self.push(t + session.turns[k + 1][2], "turn", (session, k + 1, r.prompt + r.out))

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

    def pop(self, name: str, t: float) -> _Req | None:
        """The head of lane `name`'s queue still within its TTL (the expired ones end); in fair
        order, the oldest request of the key with the least counter."""
        while True:
            if self.fair is not None:
                item = self.fair[name].pop()
                r = item[1] if item is not None else None
            elif self.heads[name] < len(self.queues[name]):
                r = self.queues[name][self.heads[name]]
                self.heads[name] += 1
            else:
                r = None
            if r is None or self.unexpired(r, t):
                return r

    def unexpired(self, r: _Req, t: float) -> bool:
        """`r` leaves its queue at `t`: whether it is within its TTL (else it ends expired)."""
        self.backlog -= r.cost
        ttl = self.by_name[r.lane].queue_ttl_s
        if t - r.arrival > ttl:
            self.finish(r, r.arrival + ttl, "expired")
            return False
        return True

    def enqueue(self, r: _Req, t: float) -> None:
        """Hand `r` to the fleet as its lane's engines are fed (module docstring, "Dispatch")."""
        serving = self.serving[r.lane]
        dispatch = serving[0].dispatch
        if dispatch == DEDICATED:
            free = [e for e in serving if len(e.reqs) < e.slots]
            if free:
                self.take(self.rng.choice(free), r, t)
                return
        self.backlog += r.cost
        if dispatch == ROUTER:
            least = min(len(e.reqs) + len(e.waiting) for e in serving)
            e = self.rng.choice([e for e in serving if len(e.reqs) + len(e.waiting) == least])
            heapq.heappush(e.waiting, (r.rank, next(self._seq), r))
            self.refill(e, t)
            return
        if dispatch == FLEET and self.affinity is not None and self.offer(r, t):
            return
        self.to_lane_queue(r, t)

    def to_lane_queue(self, r: _Req, t: float) -> None:
        """`r` joins its lane's queue; under fleet dispatch the first free engine may take it."""
        serving = self.serving[r.lane]
        if self.fair is not None:
            self.fair[r.lane].push(r.cls, r, r.cost)
        else:
            self.queues[r.lane].append(r)
        if serving[0].dispatch == FLEET:
            free = sorted((e for e in serving if len(e.reqs) < e.slots), key=lambda e: e.turn)
            for e in free:  # the first free slot that may take it (its lane's queue is FIFO)
                self.refill(e, t)
                if r.start is not None:
                    return

    # -- prefix affinity (tailguard/lanes/affinity.py)

    def limits(self, e: _Engine) -> list[LaneLimit]:
        """`e`'s lanes in its order, their limits as its worker's gate has them (`capped` on the
        front end's engine)."""
        lanes = [self.by_name[name] for name in e.lanes]
        return capped(lanes, self.frontend_cap) if e is self.front else lanes

    def lane_limit(self, e: _Engine, lane: str) -> int:
        """`e`'s per-engine limit for `lane`, as its worker advertises it."""
        return next(l.engine_slots for l in self.limits(e) if l.name == lane)

    def offer(self, r: _Req, t: float) -> bool:
        """Offer `r` to an engine that served its prefix last and has room for it, if the rule
        names one: it takes it at once (a real worker picks it up from its own queue). Whether
        offered."""
        assert self.affinity is not None
        names = [name for name, _ in r.prefix] + ([r.keep] if r.keep else [])
        # an engine at its prefill bound takes nothing, its own queue included: where a real
        # offer would wait there for the bound to open (at most the offer's wait), the
        # simulator queues the request for any engine
        serving = [o for o in self.serving[r.lane]
                   if prefill_open(self.limits(o), r.lane, o.prefilling(), o.max_prefill_tokens)]
        load = {o.name: len(o.reqs) for o in serving}
        slots = {o.name: min(o.slots, self.lane_limit(o, r.lane)) for o in serving}
        chosen = offer_to(holders(names, self.index), load, slots, self.affinity)
        if chosen is None:
            self.offers["not_offered"] += 1
            return False
        self.offers["taken"] += 1
        self.backlog -= r.cost
        self.take(self.named[chosen], r, t)
        return True

    def served(self, key: str, e: _Engine) -> None:
        """(affinity) `e` holds prefix `key` now: the index names it, the latest."""
        if self.affinity is not None:
            self.index[key] = remember(self.index.get(key, ()), e.name, self.affinity)

    def take(self, e: _Engine, r: _Req, t: float) -> None:
        """`e` admits `r` (and steps, if it was idle); its prefix cache may skip some prefill."""
        if e.cache is not None:
            held = min(e.cache.lookup(r.prefix), max(r.prompt - 1, 0))
            r.cached = held - held % self.block
            r.prefilled = r.cached
            self.prefix_queries += r.prompt
            self.prefix_hits += r.cached
        r.start, r.status, r.where = t, "running", e
        e.reqs.append(r)
        e.running[r.lane] = e.running.get(r.lane, 0) + 1
        e.turn = next(self._seq)
        self.max_running = max(self.max_running, len(e.reqs))
        if not e.busy:
            self.step(e, t)

    def refill(self, e: _Engine, t: float) -> None:
        """Fill `e`'s free slots as its dispatch says."""
        while len(e.reqs) < e.slots:
            r = self.next_request(e, t)
            if r is None:
                return
            self.take(e, r, t)

    def next_request(self, e: _Engine, t: float) -> _Req | None:
        """The request `e` takes into a free slot now, if any."""
        if e.dispatch == ROUTER:
            while e.waiting:
                r = heapq.heappop(e.waiting)[2]
                if self.unexpired(r, t):
                    return r
            return None
        if e.dispatch == FLEET:
            lanes = self.limits(e)
            while (name := next_lane(lanes, e.running, self.waiting(e), e.prefilling(),
                                     e.max_prefill_tokens)) is not None:
                if (r := self.pop(name, t)) is not None:
                    return r
            return None
        for name in e.lanes:  # DEDICATED: its lanes in strict order
            if (r := self.pop(name, t)) is not None:
                return r
        return None

    def waiting(self, e: _Engine) -> dict[str, int]:
        """What waits for `e` per lane: its lanes' queues."""
        return {n: self.queued(n) for n in e.lanes}

    # -- engine steps

    def step(self, e: _Engine, t: float) -> None:
        """Start `e`'s next step at `t` (or leave it idle): its batch and how long it lasts."""
        if not e.reqs:
            e.busy = False
            return
        decode = [r for r in e.reqs if r.prefilled == r.prompt]
        prefill = self.batch(e, decode)
        e.busy = True
        e.end = t + self.step_s(e, t, decode, prefill)
        self.push(e.end, "step", (e,))

    def batch(self, e: _Engine, decode: list[_Req]) -> int:
        """Set `e`'s batch: a token for each of `decode`, then prompt chunks within the token
        budget in vLLM's priority order (lane rank, then admission); the prefill tokens in it."""
        budget = max(self.model.max_batched_tokens - len(decode), 0)
        e.batch = [(r, 0) for r in decode]
        prefill = 0
        for r in sorted(e.reqs, key=lambda r: r.rank):
            if r.prefilled < r.prompt and budget > 0:
                chunk = min(r.prompt - r.prefilled, budget)
                e.batch.append((r, chunk))
                budget -= chunk
                prefill += chunk
        return prefill

    def step_s(self, e: _Engine, t: float, decode: list[_Req], prefill: int) -> float:
        """How long a step of `e` starting at `t` lasts: the step model's time, longer beside a
        busy neighbour and by the front end's share."""
        m = self.model
        s = m.step_s(len(decode), prefill, sum(r.prompt + r.out for r in decode))
        if m.neighbour_slowdown and any(o.busy for o in self.engines if o is not e):
            s *= 1 + m.neighbour_slowdown
        if self.front is e:
            s /= 1 - self.frontend_share(t)
        return s

    def step_ended(self, t: float, e: _Engine) -> None:
        """`e`'s step ends: its tokens out, finished requests end, free slots refill, next step."""
        tokens = 0
        for r, chunk in e.batch:
            if chunk:
                r.prefilled += chunk
                if r.prefilled < r.prompt:
                    continue
                if r.first is None:
                    r.first = t
                    if e.cache is not None:  # its prompt's blocks, now computed
                        for name, tokens in r.prefix:
                            e.cache.put(name, tokens)
                        if r.prefix and not r.keep:
                            self.served(r.prefix[-1][0], e)
            r.out += 1
            tokens += 1
        self.charge(t, self.model.frontend_s_per_token * tokens)
        for r in list(e.reqs):
            if r.out >= r.max_tokens:
                status = "succeeded"
            elif t - (r.start or 0.0) >= self.by_name[r.lane].deadline_s:
                status = "deadline"
            else:
                continue
            e.reqs.remove(r)
            e.running[r.lane] -= 1
            self.finish(r, t, status)
        self.refill(e, t)
        self.step(e, t)

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
                tokens_per_s=tokens / span if span > 0 else 0.0)
        return out


def _new_engine(g: EngineGroup, k: int) -> _Engine:
    """The `k`-th engine of `g` (from 1), named as its worker (WorkerSpec.replica_name)."""
    base = g.name or "+".join(g.lanes)
    return _Engine(g.lanes, g.max_num_seqs, g.dispatch, name=base if k == 1 else f"{base}-{k}",
                   max_prefill_tokens=g.max_prefill_tokens)
