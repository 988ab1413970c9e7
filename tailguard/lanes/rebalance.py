"""The lane controller's policy: which lane each worker serves now. Pure: no I/O.

Lanes isolate short requests by giving each lane workers of its own; this policy moves a
whole warm worker (its engine stays up) from a lane that can spare it to a lane that
misses its target, so the partition follows the load. tailguard/control/controller.py
reads the figures from Redis every tick and writes what this decides; `tailguard plan`
can call the same code.

One decision per tick (`decide_moves`), in this order; a decision moves one worker or, on a
large fleet, several to the same lane (rule 6):

1. **One move at a time.** While a live worker serves something other than what it was
   told (for at most ``move_timeout_s``), nothing else is decided.
2. **Dwell.** No move within ``dwell_s`` of the last one, where dwell_s is the larger of
   ``min_dwell_s`` and ``dwell_per_move`` x the last move's duration: a lane has time to
   show what its new worker changed before the next decision reads it. A ``no_worker``
   lane does not wait for it (its queued work has no one at all; rule 4 only takes a
   worker from lanes that keep one while they have work, so such a move cannot bounce).
3. **A lane that misses its target receives.** A lane misses when a request of its usual
   cost is predicted to wait longer than its target (`Lane.wait_target_s`, with
   admission's own prediction: tailguard/lanes/admission.py), or when it has queued work
   and no live worker at all (``no_worker``: every worker it had was moved away, and
   admission queued its requests for one to come back). The worst ratio of predicted wait
   to target goes first; ``no_worker`` first of all.
4. **Only a donor that can spare it gives** (Dynamo's consolidation check): a live
   worker that may serve the receiving lane (its [[workers]] entry's home lanes or
   ``moves_to``) and whose current lanes, with one worker fewer and its running jobs
   handed back to their queues, each keep ``min_workers`` and are predicted to meet their
   own targets (for ``no_worker``: each lane with work keeps a worker, targets aside: a
   lane's target never starves another lane). The worker with the fewest running jobs
   goes (the shortest drain).
5. **Home when it is quiet.** With no lane missing, a worker away from home goes back
   when the lanes it serves now would, without it, wait at most half their targets and
   fill at most half the slots that stay, and have done so without a break for
   ``home_after_s`` (the halves and the time are hysteresis: the move that brought it
   there needed a miss, a predicted wait is 0 whenever a slot is free however busy the
   lane, and a bursty lane has quiet seconds; Kubernetes' autoscaler waits 300 s before a
   scale-down for the same reason). The entries' layout is the fleet's resting state.

6. **As many as the lane needs, in one decision.** After the first move, the fleet is looked
   at again as it will be (the donor's lanes one worker fewer and its running jobs handed
   back, the receiving lane one more with its measured rate scaled to it): while the
   receiving lane would still miss its target, the next donor rule 4 allows goes too, up to
   ``max_moves`` (default a quarter of the live workers, at least one); a homecoming brings
   the next quiet worker home alike. Rules 1 and 2 then hold for all of them at once: a fleet
   of 64 engines re-partitions in one dwell, not one engine per dwell; on a fleet of up to 7
   workers a decision is one move.

A lane without a target (a batch lane, unless it sets target_wait_s) never receives,
not even with no worker (its work waits for the homecoming of rule 5), and gives
whenever it keeps its ``min_workers`` and, with work queued, one worker.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tailguard.lanes.admission import AdmissionPolicy, LaneLoad
from tailguard.lanes.table import Lane

TARGET_MISSED = "target_missed"
NO_WORKER = "no_worker"
HOME = "home"
REASONS = (TARGET_MISSED, NO_WORKER, HOME)
#: Hysteresis of the homecoming rule: the donor's lanes must be this far inside their targets.
HOME_MARGIN = 0.5


@dataclass(frozen=True)
class WorkerView:
    """One live worker as the controller sees it."""

    name: str
    #: what its entry lets it serve, its home lanes first (WorkerSpec.assignments)
    assignments: tuple[tuple[str, ...], ...]
    #: the lanes it consumes now, as its heartbeat reports them
    serving: tuple[str, ...]
    #: the lanes it was last told to serve, and when (None: never told: its home)
    told: tuple[str, ...] | None = None
    told_at: float | None = None
    #: jobs running on it now, per lane
    running: Mapping[str, int] = field(default_factory=dict)

    @property
    def home(self) -> tuple[str, ...]:
        return self.assignments[0]

    @property
    def desired(self) -> tuple[str, ...]:
        return self.told if self.told is not None else self.home

    def assignment_for(self, lane: str) -> tuple[str, ...] | None:
        """What it would serve to serve `lane`: its home if that holds the lane, else the lane
        alone if its entry allows it; None if it may not serve the lane."""
        return next((a for a in self.assignments if lane in a), None)


@dataclass(frozen=True)
class FleetView:
    """One tick's figures."""

    lanes: Mapping[str, Lane]
    loads: Mapping[str, LaneLoad]
    workers: tuple[WorkerView, ...]
    now: float
    #: when the last move was decided, and how long it took (decision to serving the new lane)
    last_move_at: float | None = None
    last_move_s: float | None = None
    #: since when each worker away from home could have gone home without a break (QuietClock)
    quiet_since: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Move:
    """Tell `worker` to serve `to` instead of `from_`, for `reason` (one of REASONS)."""

    worker: str
    from_: tuple[str, ...]
    to: tuple[str, ...]
    reason: str
    detail: str
    #: the lane it goes to serve (a homecoming: None)
    receiving: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"worker": self.worker, "from": list(self.from_), "to": list(self.to),
                "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class RebalancePolicy:
    admission: AdmissionPolicy = AdmissionPolicy()
    min_dwell_s: float = 10.0
    dwell_per_move: float = 3.0
    move_timeout_s: float = 60.0
    #: how long rule 5 must hold, without a break, before a worker goes home
    home_after_s: float = 30.0
    #: the most workers one decision moves (rule 6; 0: a quarter of the live ones, at least 1)
    max_moves: int = 0

    def in_flight(self, fleet: FleetView) -> WorkerView | None:
        """The worker still carrying out its last order, if any (rule 1)."""
        for w in fleet.workers:
            if (w.told is not None and tuple(w.serving) != w.told and w.told_at is not None
                    and fleet.now - w.told_at < self.move_timeout_s):
                return w
        return None

    def dwell_s(self, fleet: FleetView) -> float:
        return max(self.min_dwell_s, self.dwell_per_move * (fleet.last_move_s or 0.0))

    def predicted_wait_s(self, lane: Lane, load: LaneLoad) -> float:
        """The wait admission would predict now for a request of the lane's usual cost: the
        mean queued cost, else the lane's default output length. inf: work and no worker."""
        if load.live_workers <= 0:
            return math.inf if load.queued_jobs > 0 else 0.0
        cost = (load.backlog_tokens / load.queued_jobs if load.queued_jobs > 0
                else lane.effective_default_max_tokens)
        work = self.admission.wait_tokens(lane, load, max(1, int(cost)))
        return work / self.admission.service_rate(lane, load)

    def misses(self, lane: Lane, load: LaneLoad) -> tuple[float, str, str] | None:
        """(how badly, reason, detail) if `lane` misses its target now, else None."""
        target = lane.wait_target_s
        if target is None:
            return None
        if load.live_workers <= 0 and load.queued_jobs > 0:
            return (math.inf, NO_WORKER, f"{lane.name}: {load.queued_jobs} queued, no live worker")
        wait = self.predicted_wait_s(lane, load)
        if wait <= target:
            return None
        return (wait / target, TARGET_MISSED,
                f"{lane.name}: predicted wait {wait:.2f} s > target {target:g} s "
                f"({load.queued_jobs} queued, {load.running_jobs} running, "
                f"{load.live_workers} worker(s))")

    def without(self, worker: WorkerView, fleet: FleetView, lane: str) -> LaneLoad:
        """`lane`'s load once `worker` stops serving it: one worker fewer, its running jobs
        of the lane handed back to the queue."""
        load = fleet.loads[lane]
        back = worker.running.get(lane, 0)
        cost = (load.backlog_tokens / load.queued_jobs if load.queued_jobs
                else fleet.lanes[lane].effective_default_max_tokens)
        return dataclasses.replace(with_workers(load, max(0, load.live_workers - 1)),
                                   queued_jobs=load.queued_jobs + back,
                                   running_jobs=max(0, load.running_jobs - back),
                                   backlog_tokens=load.backlog_tokens + int(back * cost))

    def can_spare(self, worker: WorkerView, fleet: FleetView, margin: float = 1.0) -> str | None:
        """None if every lane `worker` serves now keeps its minimum and meets `margin` x its
        target without it (margin inf: targets aside, a lane with work keeps a worker); else
        why not."""
        for name in worker.serving:
            lane = fleet.lanes.get(name)
            if lane is None:
                continue
            after = self.without(worker, fleet, name)
            if after.live_workers < lane.min_workers:
                return f"{name} keeps min_workers = {lane.min_workers}"
            target = lane.wait_target_s
            if target is None:  # a batch lane's work waits for idle capacity
                continue
            if after.live_workers == 0:
                if after.queued_jobs > 0:
                    return f"{name} has work and no other worker"
                continue
            if math.isfinite(margin):
                wait = self.predicted_wait_s(lane, after)
                if wait > margin * target:
                    return f"{name} would wait {wait:.2f} s > {margin * target:g} s without it"
            if margin < 1:  # going home: the lane's work must also fit well inside what stays
                busy = after.running_jobs + after.queued_jobs
                slots = after.live_workers * lane.max_num_seqs
                if busy > margin * slots:
                    return f"{name} would have {busy} of {slots} slots busy without it"
        return None

    def moves_cap(self, fleet: FleetView) -> int:
        return self.max_moves or max(1, len(fleet.workers) // 4)

    def decide_moves(self, fleet: FleetView) -> tuple[Move, ...]:
        """This tick's decision: `decide`'s move, then more of the same kind while the lane
        still needs them (rule 6); () for none."""
        first = self.decide(fleet)
        if first is None:
            return ()
        moves, view = [first], self.after(fleet, first)
        while len(moves) < self.moves_cap(fleet):
            if first.receiving is None:
                more = self._homecoming(view)
            else:
                missed = self.misses(view.lanes[first.receiving], view.loads[first.receiving])
                more = None if missed is None else self._donor_for(
                    first.receiving, missed[1], missed[2], view)
            if more is None:
                break
            moves.append(more)
            view = self.after(view, more)
        return tuple(moves)

    def after(self, fleet: FleetView, move: Move) -> FleetView:
        """`fleet` as it will be once `move` is carried out: the lanes it leaves one worker
        fewer and its running jobs handed back, the lanes it joins one worker more."""
        w = next(w for w in fleet.workers if w.name == move.worker)
        loads = dict(fleet.loads)
        for lane in set(move.from_) - set(move.to):
            if lane in loads:
                loads[lane] = self.without(w, fleet, lane)
        for lane in set(move.to) - set(move.from_):
            if lane in loads:
                loads[lane] = with_workers(loads[lane], loads[lane].live_workers + 1)
        moved = dataclasses.replace(w, serving=move.to, told=move.to, told_at=fleet.now,
                                    running={})
        return dataclasses.replace(fleet, loads=loads, workers=tuple(
            moved if x is w else x for x in fleet.workers))

    def decide(self, fleet: FleetView) -> Move | None:
        """At most one move for this tick (rules 1-5 of the module docstring)."""
        if self.in_flight(fleet) is not None:
            return None
        dwelling = (fleet.last_move_at is not None
                    and fleet.now - fleet.last_move_at < self.dwell_s(fleet))
        missing = sorted(((m, name) for name, lane in fleet.lanes.items()
                          if name in fleet.loads
                          and (m := self.misses(lane, fleet.loads[name])) is not None),
                         key=lambda t: (-t[0][0], t[1]))
        for (_, reason, detail), receiving in missing:
            if dwelling and reason != NO_WORKER:
                continue
            move = self._donor_for(receiving, reason, detail, fleet)
            if move is not None:
                return move
        if missing or dwelling:
            return None
        return self._homecoming(fleet)

    def _donor_for(self, receiving: str, reason: str, detail: str,
                   fleet: FleetView) -> Move | None:
        candidates = []
        for w in fleet.workers:
            to = w.assignment_for(receiving)
            if to is None or receiving in w.serving or tuple(w.serving) == to:
                continue
            # a lane with work and no worker at all outranks another lane's target
            why_not = self.can_spare(w, fleet, margin=math.inf if reason == NO_WORKER else 1.0)
            if why_not is None:
                candidates.append((to != w.home, sum(w.running.values()), w.name, w, to))
        if not candidates:
            return None
        *_, w, to = min(candidates, key=lambda c: c[:3])
        return Move(w.name, tuple(w.serving), to, reason, detail, receiving)

    def quiet(self, fleet: FleetView) -> set[str]:
        """The workers away from home whose lanes could spare them now (rule 5's test)."""
        return {w.name for w in fleet.workers if tuple(w.serving) != w.home
                and self.can_spare(w, fleet, margin=HOME_MARGIN) is None}

    def _homecoming(self, fleet: FleetView) -> Move | None:
        for w in sorted(fleet.workers, key=lambda w: (sum(w.running.values()), w.name)):
            if tuple(w.serving) == w.home:
                continue
            quiet_s = fleet.now - fleet.quiet_since.get(w.name, fleet.now)
            if quiet_s >= self.home_after_s and self.can_spare(w, fleet, HOME_MARGIN) is None:
                return Move(w.name, tuple(w.serving), w.home, HOME,
                            f"{', '.join(w.serving)} met half their targets without it for "
                            f"{quiet_s:.0f} s")
        return None


def with_workers(load: LaneLoad, live: int) -> LaneLoad:
    """`load` served by `live` workers, its measured rate scaled to them (each worker serves
    its share of what the lane got through)."""
    served = (load.served_tokens * live // load.live_workers if load.live_workers > 0
              else load.served_tokens)
    return dataclasses.replace(load, live_workers=live, served_tokens=served)


class QuietClock:
    """Since when each away worker could go home, without a break: the one piece of state
    rule 5 needs, kept by whoever calls `decide` (the controller, the simulator)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def stamp(self, policy: RebalancePolicy, fleet: FleetView) -> FleetView:
        """`fleet` with `quiet_since` as of this tick."""
        self._since = {name: self._since.get(name, fleet.now) for name in policy.quiet(fleet)}
        return dataclasses.replace(fleet, quiet_since=dict(self._since))
