"""Admission: accept a request only if its lane can start it within what the lane promises.

Pure policy, no I/O (tailguard/jobs/lane_load.py reads the figures from Redis). A
lane's backlog is the cost tokens waiting in its queue; its service rate is how fast its slots
get through cost tokens when every one is busy: what one sequence got through (the cost tokens
of the lane's requests that finished recently over the engine seconds they ran) times the
lane's slots, and never less than the cost tokens served per second of the window. A lane
that has measured nothing (idle, or freshly started) is judged by a prior per sequence: a
request shaped like the judged one, its prompt prefilled at ``prefill_tokens_per_s`` and its
output decoded at ``prior_tokens_per_s``. Tokens over the window alone would judge a lane that
was asked for little as slow: a lane that served one request in the last 30 s "serves" a few
tokens a second, and the first questions over long documents that arrive together were refused.

The predicted wait counts the lane's free slots over the whole fleet. Its slots are its
per-engine limit on every live worker that serves it, as each worker advertises it with its
heartbeat (``Lane.engine_slots``, cut on the engine that shares the front end's cores:
tailguard/lanes/dispatch.py); the slots in use are the lane's jobs running and those of the
lanes after it on its engines (``LaneTable.sharing``: a lane's limit counts them; Redis keeps
them with the job states, tailguard/redis/lua/transition_job.lua). A request that finds a slot
left for it (fewer requests queued ahead of it than slots free) predicts no wait,
however tight the promise: two requests of the usual load that arrive together are
not refused because the first is still queued for the few milliseconds its worker
takes to pick it up. Otherwise it waits for the queued work beyond what the free
slots absorb (the backlog's share of the requests beyond them), then for one
running request to end and free a slot: with a batch's requests at staggered
points, one ends every (one request's cost) / rate seconds, and the new request's
own cost stands in for that one. That work divided by the rate is the predicted
wait; with no free slot it is (backlog + cost) / rate.

What it does not see: which engine each job runs on. The counts are the fleet's, so a
lane's free slots are right while every engine that serves it serves the lanes after it too
(the shipped files); where only some do, the others' jobs of those lanes count against it and
the prediction can err long. A dead worker's jobs hold slots until they are reaped (seconds)
while its slots have already left the count, so then it errs long too.

A request is refused (429 with Retry-After) when it would push the backlog past
the lane's ``max_backlog_tokens`` or when its predicted wait exceeds the lane's
promise (``max_wait_s``, else ``queue_ttl_s``): it is told at once to come back
instead of being queued to expire. A lane no live worker serves is a 503.

A decision is made on figures read a moment before the job is stored, and a burst
on many API threads would each read the same empty lane; so the store applies the
same rule again (``limits``; tailguard/redis/lua/create_job.lua) in the Lua step that
records the job, on the lane's figures as they are then, and a request that lost
the race is decided again on those.

Where the lane dispatches in fair order by key (tailguard/lanes/fair_share.py), admission is
fair too (``admit_fairly``): when the rule above refuses, a key holding more than its weighted
share of what the lane may hold (queued and running) is refused (429 ``over_fair_share``), unless
counter order serves it next (it was served less than every other key with work queued). One
within its share is admitted with the wait it has in fair order: its job goes out at the next
free slot ahead of the others' queued ones, so a lane whose promise is shorter than a slot's
turnover (a tight `max_wait_s`, the others' running jobs filling every slot) is not a race for
slots that the key sending more wins. It may take the lane past
``max_backlog_tokens``, never past twice it: the room beyond is held by keys over their share,
whose next requests are refused until they are back within it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.errors import LaneFull, NoLiveWorker, OverFairShare, WaitTooLong
from tailguard.lanes.fair_share import fair_share, served_next, weight_of, work_ahead
from tailguard.lanes.table import Lane


@dataclass(frozen=True)
class LaneLoad:
    """What admission knows of a lane now (all from Redis)."""

    backlog_tokens: int   # cost tokens of the requests queued on the lane
    queued_jobs: int      # how many requests those are
    running_jobs: int     # the lane's requests running on its own workers' slots
    served_tokens: int    # cost tokens of its requests that finished within the window
    window_s: float       # that window
    live_workers: int     # workers serving the lane now
    now: float | None = None  # the Redis clock when these were read (Unix seconds)
    #: the requests of the lanes after it (`LaneTable.sharing`) running on its engines' slots
    sharing_jobs: int = 0
    #: the per-engine limits for it that its live workers advertise, summed
    worker_slots: int = 0
    #: how many of its live workers advertise one (a worker of an older version does not)
    advertising_workers: int = 0
    #: the engine seconds the requests behind `served_tokens` ran, summed
    served_engine_s: float = 0.0


@dataclass(frozen=True)
class BacklogLimits:
    """Admission's limits, checked again when a job is stored with `AdmissionPolicy.wait_tokens`'
    rule: `slots` the lane's batch slots, at most `wait_tokens` of work before the request's
    slot, at most `after` cost tokens queued with it; None: no limit."""

    slots: int = 0
    wait_tokens: float | None = None
    after: int | None = None
    #: the lanes whose running jobs take its slots too (`LaneTable.sharing`)
    sharing: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdmissionPolicy:
    prior_tokens_per_s: float = 20.0
    admit_without_worker: bool = False
    #: what a request's first token takes once it starts: its prompt's prefill, then one step
    prefill_tokens_per_s: float = 1000.0
    first_step_s: float = 0.02

    def first_token_s(self, prompt_tokens: int) -> float:
        """Time from a request's start to its first token: prefill of its prompt, one step."""
        return max(0, prompt_tokens) / self.prefill_tokens_per_s + self.first_step_s

    def slots(self, lane: Lane, load: LaneLoad) -> int:
        """The lane's slots over the fleet: the per-engine limit each live worker advertises,
        its own limit on one that does not (one worker while none is live and requests are
        admitted anyway, as the prior rate assumes)."""
        if load.advertising_workers <= 0:
            return lane.engine_slots * max(1, load.live_workers)
        silent = max(0, load.live_workers - load.advertising_workers)
        return load.worker_slots + lane.engine_slots * silent

    def prior_per_sequence(self, cost: int = 0, prompt_tokens: int = 0) -> float:
        """Cost tokens per second one engine sequence gets through on requests shaped like one of
        `cost` tokens with `prompt_tokens` of prompt: its prompt prefilled, its output decoded at
        the prior's rate; the bare prior for no shape (or one with no output)."""
        prompt = min(max(0, prompt_tokens), max(0, cost))
        output = max(0, cost) - prompt
        if prompt == 0 or output == 0:
            return self.prior_tokens_per_s
        seconds = prompt / self.prefill_tokens_per_s + output / self.prior_tokens_per_s
        return max(self.prior_tokens_per_s, cost / seconds)

    def service_rate(self, lane: Lane, load: LaneLoad, cost: int = 0,
                     prompt_tokens: int = 0) -> float:
        """Cost tokens per second the lane gets through with its slots busy: what a sequence
        got through, measured, times its slots (never below what it served per second of the
        window); with nothing measured, the prior for requests shaped like the one of `cost`
        tokens with `prompt_tokens` of prompt (the module docstring)."""
        window = load.served_tokens / load.window_s if load.window_s > 0 else 0.0
        if load.served_tokens > 0 and load.served_engine_s > 0:
            per_sequence = load.served_tokens / load.served_engine_s
        elif window > 0:  # served, with no engine time on record (an older API recorded it)
            per_sequence = self.prior_tokens_per_s
        else:
            per_sequence = self.prior_per_sequence(cost, prompt_tokens)
        return max(window, per_sequence * self.slots(lane, load))

    def wait_tokens(self, lane: Lane, load: LaneLoad, cost: int) -> float:
        """The work (cost tokens) the lane must do before a request of `cost` tokens gets a
        slot: none if a free slot is left for it, else the queued work beyond the free slots
        plus one request's (see the module docstring). create_job.lua applies the same rule."""
        free = max(0, self.slots(lane, load) - max(0, load.running_jobs)
                   - max(0, load.sharing_jobs))
        ahead = max(0, load.queued_jobs)
        if ahead < free:
            return 0.0
        beyond = max(0, load.backlog_tokens) * (ahead - free) / ahead if ahead else 0.0
        return beyond + cost

    def limits(self, lane: Lane, load: LaneLoad, sharing: tuple[str, ...] = (), cost: int = 0,
               prompt_tokens: int = 0) -> BacklogLimits:
        """The bounds `admit` decided within, for the store to check again atomically: a wait
        within the promise is at most promise x rate of work before the request's slot (the
        rate `admit` judged the request of `cost` and `prompt_tokens` by); `sharing`, the lanes
        whose running jobs the store counts against its slots."""
        rate = self.service_rate(lane, load, cost, prompt_tokens)
        return BacklogLimits(slots=self.slots(lane, load),
                             wait_tokens=lane.promised_wait_s * rate,
                             after=lane.max_backlog_tokens, sharing=sharing)

    def admit(self, lane: Lane, load: LaneLoad, cost: int, prompt_tokens: int = 0) -> float:
        """The predicted wait in seconds of a request of `cost` tokens (`prompt_tokens` of them
        its prompt), if it is accepted.

        Raises NoLiveWorker, LaneFull or WaitTooLong (the last two with Retry-After:
        how long until, at the current rate and with no new arrivals, it would be accepted).
        """
        if load.live_workers == 0 and not self.admit_without_worker:
            raise NoLiveWorker(f"no live worker serves lane {lane.name!r}; retry later",
                               field="lane")
        rate = self.service_rate(lane, load, cost, prompt_tokens)
        backlog = max(0, load.backlog_tokens)
        wait_s = self.wait_tokens(lane, load, cost) / rate
        bound = lane.max_backlog_tokens
        if bound is not None and backlog + cost > bound:
            raise LaneFull(
                f"lane {lane.name!r} is full: {backlog} cost tokens queued, bound "
                f"{bound}; this request's cost is {cost}",
                retry_after_s=math.ceil((backlog + cost - bound) / rate), lane=lane.name)
        if wait_s > lane.promised_wait_s:
            raise WaitTooLong(
                f"lane {lane.name!r} would start this request in about {wait_s:.1f} s, past "
                f"its {lane.promised_wait_s:g} s promise",
                retry_after_s=math.ceil(wait_s - lane.promised_wait_s), lane=lane.name)
        return wait_s

    def capacity_tokens(self, lane: Lane, load: LaneLoad) -> float:
        """The cost tokens the lane may hold queued: the tighter of its backlog bound and the
        work it gets through within its promise, the whole that fair shares divide."""
        within_promise = lane.promised_wait_s * self.service_rate(lane, load)
        bound = lane.max_backlog_tokens
        return within_promise if bound is None else min(bound, within_promise)

    def admit_fairly(self, lane: Lane, load: LaneLoad, cost: int, key: str,
                     backlogs: Mapping[str, int], weights: Mapping[str, float],
                     counters: Mapping[str, float] | None = None,
                     running: Mapping[str, int] | None = None, prompt_tokens: int = 0) -> float:
        """`admit`, for a lane that dispatches in fair order: `backlogs` the cost tokens each key
        has queued on it, `running` those it has running on it, `weights` the keys' weights,
        `counters` their virtual token counters (tailguard/lanes/fair_share.py).

        When `admit` refuses, a key's work on the lane is what it has queued and running, and
        its share is its weighted part of what the lane may hold queued (`capacity_tokens`) and
        what runs on it now. OverFairShare if `key` would hold more than its share while another
        key has work on the lane, unless counter order serves it next (`served_next`: it has
        been served less than every other backlogged key by more than it has queued); alone, it
        is refused as `admit` refuses it (Retry-After: until its work drains to its share at its
        share of the rate). Otherwise it is admitted with the wait it has in fair order (past the
        promise by at most a slot's turnover when other keys' running jobs fill the lane: its job
        goes out at the next free slot), unless the lane would pass twice its backlog bound
        (then `admit`'s refusal)."""
        running = running or {}
        try:
            return self.admit(lane, load, cost, prompt_tokens)
        except (LaneFull, WaitTooLong):
            work = {k: max(0, backlogs.get(k, 0)) + max(0, running.get(k, 0))
                    for k in set(backlogs) | set(running)}
            if not any(w > 0 for k, w in work.items() if k != key):
                raise  # alone: fair order is arrival order
            capacity = self.capacity_tokens(lane, load) + sum(max(0, r) for r in running.values())
            share = fair_share(key, capacity, work, weights)
            held = work.get(key, 0) + cost
            rate = self.service_rate(lane, load, cost, prompt_tokens)
            first = served_next(key, backlogs, weights, counters or {})
            if held > share and not first:
                share_rate = rate * share / capacity if capacity > 0 else rate
                raise OverFairShare(
                    f"lane {lane.name!r} is full and key {key!r} holds more than its share of it "
                    f"({held} of {share:.0f} cost tokens queued and running, weight "
                    f"{weight_of(key, weights):g})",
                    retry_after_s=math.ceil((held - share) / share_rate), lane=lane.name) from None
            bound = lane.max_backlog_tokens
            if bound is not None and max(0, load.backlog_tokens) + cost > 2 * bound:
                raise
            ahead = self._ahead_in_fair_order(load, key, backlogs, weights, first)
            return self.wait_tokens(lane, ahead, cost) / rate

    @staticmethod
    def _ahead_in_fair_order(load: LaneLoad, key: str, backlogs: Mapping[str, int],
                             weights: Mapping[str, float], first: bool = False) -> LaneLoad:
        """`load` with only the queued work dispatched before `key`'s new request in fair order
        (its jobs in proportion: they are not counted per key); `first`: counter order serves
        the key next, so only its own queued work is ahead."""
        total = max(0, load.backlog_tokens)
        own = max(0, backlogs.get(key, 0))
        ahead = min(total, own if first else work_ahead(key, backlogs, weights))
        jobs = math.ceil(max(0, load.queued_jobs) * ahead / total) if total else 0
        return dataclasses.replace(load, backlog_tokens=round(ahead), queued_jobs=jobs)
