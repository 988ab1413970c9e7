"""Each lane's load in Redis, shared by every API process: what admission decides on.

* backlog: the cost tokens of the lane's queued jobs. A job enters it when it is
  created and leaves it when it stops being queued, in the same Lua step as the
  job record changes (tailguard/jobs/store.py); a job nobody settles leaves it when its
  queue TTL lapses.
* queued and running: how many of the lane's jobs are queued, and how many run on its
  own workers' slots, kept in the same Lua steps as the job records (transition_job.lua):
  what the predicted wait counts free batch slots with, beside the running jobs of the lanes
  that share its slots and the per-engine limits its live workers advertise.
* served: the cost tokens of the lane's requests that ran and finished, and the engine time
  they ran, per Redis-clock second, fed by the finished-request stream (one consumer group,
  so each request counts once whichever API process reads it).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from tailguard import settings
from tailguard.jobs.finished import FinishedRequest
from tailguard.lanes.admission import LaneLoad
from tailguard.lanes.placement import request_cost
from tailguard.redis import keys, lua


class LaneLoadStore:
    """Reads and feeds the lanes' load; stateless apart from the client."""

    def __init__(self, client: redis.Redis, *,
                 window_s: int = settings.RATE_WINDOW_S.default) -> None:
        self.window_s = window_s
        self._load = lua.Script(client, "clock", "lane_counts", "live_count", "lane_load")
        self._served = lua.Script(client, "record_served")

    def load(self, lane: str, sharing: Sequence[str] = ()) -> LaneLoad:
        """`lane`'s figures; `sharing`: the lanes whose running jobs take its slots too
        (LaneTable.sharing)."""
        backlog, queued, running, served, now, live, shared, slots, advertised, served_ms = (
            self._load([keys.lane_queued_key(lane), keys.lane_backlog_key(lane),
                        keys.lane_running_key(lane), keys.lane_served_key(lane),
                        keys.lane_workers_key(lane), keys.lane_worker_slots_key(lane),
                        keys.lane_served_ms_key(lane), *map(keys.lane_running_key, sharing)],
                       window_s=self.window_s))
        return LaneLoad(backlog_tokens=int(backlog), queued_jobs=int(queued),
                        running_jobs=int(running), served_tokens=int(served),
                        window_s=float(self.window_s), live_workers=int(live), now=float(now),
                        sharing_jobs=int(shared), worker_slots=int(slots),
                        advertising_workers=int(advertised),
                        served_engine_s=int(served_ms) / 1000)

    def record(self, rec: FinishedRequest) -> None:
        """Count a request that ran (a FinishedConsumer sink); one that never started is not
        work the lane did."""
        if rec.lane is None or rec.engine_s is None or rec.prompt_tokens is None \
                or rec.max_tokens is None:
            return
        self._served([keys.lane_served_key(rec.lane), keys.lane_served_ms_key(rec.lane)],
                     second=int(rec.finished_at),
                     tokens=request_cost(rec.prompt_tokens, rec.max_tokens),
                     engine_ms=max(1, round(rec.engine_s * 1000)), window_s=self.window_s)
