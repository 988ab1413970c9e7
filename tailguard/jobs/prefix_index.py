"""Prefix affinity in Redis: which worker served a prompt's prefix lately, and offers to it.

The rule is tailguard/lanes/affinity.py's (the simulator runs it too); this module keeps what it
reads and what it decides in Redis, used only when TAILGUARD_PREFIX_AFFINITY is on:

* the index (``keys.prefix_holders_key``): per indexed prefix, the last ``Affinity.holders``
  workers that served it, a sorted set by time (ZADD then trimming by rank is ``remember``),
  expiring ``ttl_s`` after its last use. A worker writes it once a job's prefill is done (its
  first token): the simulator found writing at take time worse;
* ``look_up``: at submit, one script reads the prefixes' holders and each live worker of the
  request's class's lanes with its load (jobs it runs + offered to it) and its limit there (its
  heartbeat advertises it: ``keys.lane_worker_slots_key``); ``Holdings`` decides. A worker
  whose heartbeat lapsed is neither a holder nor a candidate, so a dead worker's entries are
  never used (they expire with their prefix);
* an offer: the job's message goes to the worker's own queue (``keys.worker_queue``) in the step
  that creates the job (create_job.lua), recorded in ``keys.OFFERS`` with its deadline;
  ``taken`` ends it when the worker starts the job; ``give_up_due`` moves a lapsed offer's
  message to its lane's queue, exactly once (give_up_offers.lua), however many processes call
  it: each API process every quarter of the wait (``start``: a lease would add a round trip
  and the redelivery pass's 1.5 s gap would quadruple a 0.5 s wait), and the redelivery pass
  as a backstop.

An offered message is built as any other (routed to its lane's queue: kombu's restore of a lost
delivery puts it there, never back on a dead worker's queue); only the list it is pushed onto
differs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from tailguard import settings
from tailguard.lanes.affinity import Affinity, Holdings, offer_wait_s
from tailguard.lanes.table import Lane
from tailguard.redis import keys, lua

#: offers moved per pass at most (the rest at the next)
GIVE_UP_BATCH = 500
#: the shortest gap between two passes over the offers, in seconds
MIN_GIVE_UP_PERIOD_S = 0.05

log = logging.getLogger("tailguard.affinity")


class PrefixIndex:
    """The affinity index and the offers of one Redis; stateless apart from the client."""

    def __init__(self, client: redis.Redis, policy: Affinity, ttl_s: int = 300) -> None:
        self.redis = client
        self.policy = policy
        self.ttl_s = ttl_s
        self._lookup = lua.Script(client, "clock", "prefix_lookup")
        self._take = lua.Script(client, "take_offer")
        self._give_up = lua.Script(client, "clock", "give_up_offers")

    @classmethod
    def from_settings(cls, client: redis.Redis,
                      config: Mapping[str, Any] | None = None) -> PrefixIndex | None:
        """The index the settings describe; None while TAILGUARD_PREFIX_AFFINITY is off."""
        if not settings.PREFIX_AFFINITY.get(config):
            return None
        return cls(client, Affinity(max_wait_s=settings.PREFIX_AFFINITY_WAIT_S.get(config)),
                   ttl_s=settings.PREFIX_INDEX_TTL_S.get(config))

    def look_up(self, prefixes: Sequence[str], depths: Sequence[int],
                lanes: Sequence[Lane]) -> Holdings:
        """What the index holds for a prompt with `prefixes` (shortest first, `depths` in
        blocks), and the live workers of `lanes` (a worker that advertised no limit for a
        lane: the lane's ``engine_slots``)."""
        lane_keys = [k for l in lanes
                     for k in (keys.lane_workers_key(l.name), keys.lane_worker_slots_key(l.name))]
        reply = self._lookup([keys.RUNNING_JOBS, keys.OFFERED, *lane_keys,
                              *(keys.prefix_holders_key(p) for p in prefixes)],
                             lanes=len(lanes), slots=[l.engine_slots for l in lanes])
        engines = {}
        for lane, flat in zip(lanes, reply[:len(lanes)], strict=True):
            engines[lane.name] = {_text(flat[i]): (int(flat[i + 1]), int(flat[i + 2]))
                                  for i in range(0, len(flat), 3)}
        held = {p: tuple(_text(w) for w in ws)
                for p, ws in zip(prefixes, reply[len(lanes):], strict=True)}
        return Holdings(tuple(prefixes), tuple(depths), engines, held)

    def offer_args(self, job_id: str, worker: str, lane: Lane) -> dict[str, Any]:
        """What JobStore.create records an offer of a job of `lane` to `worker` with (its
        deadline: now + ``offer_wait_s`` on Redis's clock)."""
        return {"keys": keys.OFFER_KEYS, "job": job_id, "worker": worker,
                "lane_queue": lane.queue,
                "wait_s": offer_wait_s(self.policy, lane.max_wait_s)}

    def remember(self, prefixes: Sequence[str], worker: str) -> None:
        """`worker` has served `prefixes` (its prefill is done): it is their latest holder."""
        if not prefixes:
            return
        pipe = self.redis.pipeline(transaction=False)
        now = time.time()  # only the order of one prefix's holders matters
        for prefix in prefixes:
            key = keys.prefix_holders_key(prefix)
            pipe.zadd(key, {worker: now})
            pipe.zremrangebyrank(key, 0, -self.policy.holders - 1)
            pipe.expire(key, self.ttl_s)
        pipe.execute()

    def taken(self, job_id: str) -> bool:
        """The worker started an offered job: its offer ends (False: no offer, or it lapsed)."""
        return bool(self._take([], names=keys.OFFER_KEYS, job=job_id))

    def give_up_due(self) -> list[str]:
        """Move the offers past their deadline to their lanes' queues; the jobs moved."""
        return [_text(j) for j in self._give_up([], names=keys.OFFER_KEYS, limit=GIVE_UP_BATCH)]

    def give_up_forever(self, stop: threading.Event, wait_s: float | None = None) -> None:
        """`give_up_due` every quarter of the shortest offer's wait (`wait_s`, else the
        policy's) until `stop`; Redis errors logged."""
        period_s = max(MIN_GIVE_UP_PERIOD_S, (wait_s or self.policy.max_wait_s) / 4)
        while not stop.is_set():
            try:
                self.give_up_due()
            except redis.RedisError as exc:
                log.warning("prefix offers: %s", exc)
            stop.wait(period_s)

    def start(self, stop: threading.Event, lanes: Sequence[Lane] = ()) -> threading.Thread:
        """Run `give_up_forever` on a daemon thread (the API's), as often as the shortest
        offer of `lanes` needs."""
        wait_s = min((offer_wait_s(self.policy, l.max_wait_s) for l in lanes), default=None)
        thread = threading.Thread(target=self.give_up_forever, args=(stop, wait_s),
                                  name="tailguard-offers", daemon=True)
        thread.start()
        return thread

    def offered_jobs(self) -> set[str]:
        """The jobs on a worker's own queue now (the lost-message pass counts them as found)."""
        return {_text(j) for j in self.redis.zrange(keys.OFFERS, 0, -1)}

    def outcomes(self) -> dict[str, int]:
        """Offers made, taken by their worker and given up (moved to the lane), since Redis
        started."""
        raw = self.redis.hgetall(keys.OFFER_OUTCOMES)
        return {_text(k): int(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
