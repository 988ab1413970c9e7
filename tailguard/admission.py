"""Admission: accept a request only if its lane can start it within what the lane promises.

Pure policy, no I/O (tailguard/laneload.py reads the figures from Redis). A
lane's backlog is the cost tokens waiting in its queue; its service rate is the
cost tokens its requests that finished recently took, per second, never below a
prior (``prior_tokens_per_s`` per engine sequence x max_num_seqs x live
workers), so an idle or freshly started lane is not judged by the little it
was asked to do. The predicted wait of a new request is backlog / rate.

A request is refused (429 with Retry-After) when it would push the backlog past
the lane's ``max_backlog_tokens`` or when its predicted wait exceeds the lane's
promise (``max_wait_s``, else ``queue_ttl_s``): it is told at once to come back
instead of being queued to expire. A lane no live worker serves is a 503.

A decision is made on a backlog read a moment before the job is stored, and a burst
on many API threads would each read the same empty lane; so the store checks the
decision's limits (``limits``) again in the Lua step that records the job, and a
request that lost the race is decided again on the backlog as it is then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailguard.errors import LaneFull, NoLiveWorker, WaitTooLong
from tailguard.lanes import Lane


@dataclass(frozen=True)
class LaneLoad:
    """What admission knows of a lane now (all from Redis)."""

    backlog_tokens: int   # cost tokens of the requests queued on the lane
    served_tokens: int    # cost tokens of its requests that finished within the window
    window_s: float       # that window
    live_workers: int     # workers serving the lane now


@dataclass(frozen=True)
class BacklogLimits:
    """Admission's limits on a lane's backlog (cost tokens), checked again when a job is
    stored: at most `before` queued ahead of it, at most `after` with it; None: no limit."""

    before: float | None = None
    after: int | None = None


@dataclass(frozen=True)
class AdmissionPolicy:
    prior_tokens_per_s: float = 20.0
    admit_without_worker: bool = False

    def service_rate(self, lane: Lane, load: LaneLoad) -> float:
        """Cost tokens per second the lane gets through: measured, never below the prior."""
        measured = load.served_tokens / load.window_s if load.window_s > 0 else 0.0
        prior = self.prior_tokens_per_s * lane.max_num_seqs * max(1, load.live_workers)
        return max(measured, prior)

    def limits(self, lane: Lane, load: LaneLoad) -> BacklogLimits:
        """The backlog bounds `admit` decided within, for the store to check again atomically:
        a wait within the promise is a backlog of at most promise x rate ahead."""
        return BacklogLimits(before=lane.promised_wait_s * self.service_rate(lane, load),
                             after=lane.max_backlog_tokens)

    def admit(self, lane: Lane, load: LaneLoad, cost: int) -> float:
        """The predicted wait in seconds of a request of `cost` tokens, if it is accepted.

        Raises NoLiveWorker, LaneFull or WaitTooLong (the last two with Retry-After:
        how long until, at the current rate and with no new arrivals, it would be accepted).
        """
        if load.live_workers == 0 and not self.admit_without_worker:
            raise NoLiveWorker(f"no live worker serves lane {lane.name!r}; retry later",
                               field="lane")
        rate = self.service_rate(lane, load)
        backlog = max(0, load.backlog_tokens)
        wait_s = backlog / rate
        bound = lane.max_backlog_tokens
        if bound is not None and backlog + cost > bound:
            raise LaneFull(
                f"lane {lane.name!r} is full: {backlog} cost tokens queued, bound "
                f"{bound}; this request's cost is {cost}",
                retry_after_s=math.ceil((backlog + cost - bound) / rate), lane=lane.name)
        if wait_s > lane.promised_wait_s:
            raise WaitTooLong(
                f"lane {lane.name!r} would start this request in about {wait_s:.0f} s, past "
                f"its {lane.promised_wait_s:g} s promise",
                retry_after_s=math.ceil(wait_s - lane.promised_wait_s), lane=lane.name)
        return wait_s
