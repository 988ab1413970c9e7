"""One fleet, every lane: the order in which an engine takes work, and its limits per lane.

Pure rule, no I/O. Every engine may serve every lane its worker lists; the lanes are an
*order*, not a partition. An engine with a free slot takes the oldest job of the first lane,
in its worker's order (short, then long, then batch), that

* has a job waiting,
* runs fewer jobs on this engine, its own and those of the lanes after it, than its per-engine
  limit (``Lane.engine_slots``: ``max_running``, else ``max_num_seqs``), so a burst of long and
  batch jobs together never takes more than long's limit and a short job always finds one of
  the slots left,
* where it has a ``max_ahead``, finds this engine running fewer jobs of the lanes ahead of it
  than that: an engine busy with short jobs leaves long ones to the others, since every prompt
  chunk it prefills lengthens each step of the short jobs decoding beside it (with
  docs/capacity/gpu-assumed.json, a step with a 2,048-token chunk lasts as long as ~25 decode
  steps), and
* is interactive, or no interactive lane of the worker has a job waiting (batch runs only
  on what interactive work leaves).

The queues are Redis lists that every worker pulls from, so this is one central priority
queue over the whole fleet: a job waits for the first free slot anywhere, never behind one
engine's long work while another has room.

A Celery worker cannot ask "is anything waiting" before each delivery; it chooses which
queues to consume and the broker takes them in order (kombu's ``queue_order_strategy =
"priority"``: the first non-empty list of ``-Q short,long,batch``). ``consumable`` is the same
rule in that form: a lane is consumed while it is below its limit on this engine (a lane's
limit also counts the lanes after it, so a lane closes when a lane after it fills the room),
and a batch lane only while every interactive lane is too (then the list order serves it last). The
simulator (tailguard/plan/sim.py) calls ``next_lane``; the worker (tasks/worker.py) calls
``consumable``.

An engine may also bound the prompt tokens it prefills at once (its worker's
``max_prefill_tokens``): it starts no job of a lane while its jobs of that lane and the lanes
before it, not yet at their first token, have that many prompt tokens to prefill (those not in
its prefix cache, as the API counted them). A prompt's prefill is compute-bound and vLLM runs the
prefills it holds in the same steps, so two cold 1,250-token prompts on one engine give both
their first token at about twice one's time; bounded, the second waits in the central queue for
whichever engine gets there first. A long prompt prefilling keeps its engine from starting
another long one, not a short one: closing every lane on a long prompt's tokens left short jobs
waiting past their promise (docs/benchmarks.md, the `mixed` default).
It is the load Dynamo's KV router weighs each worker by ("active prompt-side token load",
released when the first output token signals the prefill done), applied when a job is taken,
not routed.

An engine may also have every lane's limit cut to a cap (``capped``): on a CPU host, the engine
whose cores the front end shares steps slower than the others, so it starts a short job only
while it runs fewer than ``TAILGUARD_FRONTEND_ENGINE_MAX_RUNNING`` jobs, and a long one while
fewer long and batch ones; the central queue gives the rest to the faster engines
(docs/cpu-hosts.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class LaneLimit(Protocol):
    """What the rule reads of a lane (tailguard.lanes.table.Lane has it)."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> str: ...

    @property
    def engine_slots(self) -> int: ...

    @property
    def max_ahead(self) -> int | None: ...


@dataclass(frozen=True)
class CappedLane:
    """`lane` on an engine whose per-engine limits are cut to `cap` (`capped`)."""

    lane: LaneLimit
    cap: int

    @property
    def name(self) -> str:
        return self.lane.name

    @property
    def priority(self) -> str:
        return self.lane.priority

    @property
    def engine_slots(self) -> int:
        return min(self.lane.engine_slots, self.cap)

    @property
    def max_ahead(self) -> int | None:
        return self.lane.max_ahead


def capped(lanes: Sequence[LaneLimit], cap: int) -> list[LaneLimit]:
    """`lanes` with each one's per-engine limit cut to `cap` (a lane's limit counts its jobs and
    those of the lanes after it, so the first lane's caps the whole engine's starts of it);
    `cap` <= 0: as they are."""
    return [CappedLane(l, cap) for l in lanes] if cap > 0 else list(lanes)


def below_limit(lanes: Sequence[LaneLimit], i: int, running: Mapping[str, int]) -> bool:
    """Whether one more job of `lanes[i]` may start on an engine running `running` (by lane):
    its limit bounds its own jobs and those of every lane after it in the order, its
    ``max_ahead`` (if any) those of the lanes before it."""
    lane = lanes[i]
    if sum(running.get(l.name, 0) for l in lanes[i:]) >= lane.engine_slots:
        return False
    return lane.max_ahead is None or sum(running.get(l.name, 0) for l in lanes[:i]) < lane.max_ahead


def prefill_room(prefilling: int, max_prefill_tokens: int) -> bool:
    """Whether `prefilling` prompt tokens still to prefill leave room under the bound (0: none)."""
    return max_prefill_tokens <= 0 or prefilling < max_prefill_tokens


def prefill_open(lanes: Sequence[LaneLimit], lane: str, prefilling: Mapping[str, int],
                 max_prefill_tokens: int) -> bool:
    """Whether an engine serving `lanes` (in priority order), with `prefilling` prompt tokens of
    each lane's jobs not yet at their first token, may start a job of `lane` under its bound:
    the tokens of that lane and the lanes before it count."""
    if max_prefill_tokens <= 0:
        return True
    ahead = 0
    for l in lanes:
        ahead += prefilling.get(l.name, 0)
        if l.name == lane:
            break
    return prefill_room(ahead, max_prefill_tokens)


def next_lane(lanes: Sequence[LaneLimit], running: Mapping[str, int],
              waiting: Mapping[str, int], prefilling: Mapping[str, int] | None = None,
              max_prefill_tokens: int = 0) -> str | None:
    """The lane whose oldest job an engine serving `lanes` (in priority order) takes next, with
    `running` of each lane's jobs on it, `prefilling` prompt tokens of each lane's jobs not yet
    at their first token and `waiting` queued fleet-wide; None: nothing it may start now."""
    interactive_waiting = any(waiting.get(l.name, 0) > 0 for l in lanes
                              if l.priority == "interactive")
    for i, lane in enumerate(lanes):
        if waiting.get(lane.name, 0) <= 0 or not below_limit(lanes, i, running):
            continue
        if not prefill_open(lanes, lane.name, prefilling or {}, max_prefill_tokens):
            return None  # the lanes after it count its tokens too
        if lane.priority != "interactive" and interactive_waiting:
            return None
        return lane.name
    return None


def consumable(lanes: Sequence[LaneLimit], running: Mapping[str, int],
               prefilling: Mapping[str, int] | None = None,
               max_prefill_tokens: int = 0) -> tuple[str, ...]:
    """The queues a worker serving `lanes` (in priority order) consumes now, in that order, with
    `running` of each lane's jobs on its engine and `prefilling` prompt tokens of each lane's
    jobs not yet at their first token: `next_lane` for a broker that takes the first non-empty
    queue of the list."""
    open_ = [l for i, l in enumerate(lanes) if below_limit(lanes, i, running)
             and prefill_open(lanes, l.name, prefilling or {}, max_prefill_tokens)]
    interactive_open = all(l in open_ for l in lanes if l.priority == "interactive")
    return tuple(l.name for l in open_ if l.priority == "interactive" or interactive_open)
