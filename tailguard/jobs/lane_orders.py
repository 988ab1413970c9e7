"""Which lanes each worker should serve, and which it does: the lane controller's state in Redis.

The controller (tailguard/control/controller.py) writes one **order** per worker it moves
(``keys.LANE_ORDERS``: the lanes, a version from ``keys.LANE_ORDER_VERSION``, when, why)
and never sends the move itself: each worker reads its own order every heartbeat and
carries it out (tailguard/worker/lane_follower.py). The state is level-triggered, so a
worker that was down or restarted converges to its latest order. Each worker reports
what it may serve, what it serves and the order version it carried out
(``keys.LANE_WORKERS``), which is what the controller decides on. Decisions and completed
moves go to a capped stream (``keys.LANE_MOVES``) and to counters
(``keys.LANE_MOVE_COUNTS``) that /metrics and ``tailguard stats`` read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import redis

from tailguard.redis import keys
from tailguard.redis.lease import Lease

#: Upper bounds (seconds) of the move-duration histogram's buckets (Prometheus style, +Inf last).
MOVE_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: How many entries the moves stream keeps (about).
MOVES_KEPT = 500


@dataclass(frozen=True)
class Order:
    """The controller's latest word to one worker."""

    lanes: tuple[str, ...]
    version: int
    at: float
    reason: str = ""
    #: how long the old lanes' running jobs may finish before the rest is handed back (None:
    #: the worker's TAILGUARD_MOVE_DRAIN_S)
    drain_s: float | None = None

    def to_json(self) -> str:
        return json.dumps({"lanes": list(self.lanes), "version": self.version, "at": self.at,
                           "reason": self.reason, "drain_s": self.drain_s})

    @staticmethod
    def from_json(raw: str | bytes) -> Order:
        d = json.loads(raw)
        return Order(tuple(d["lanes"]), int(d["version"]), float(d["at"]), d.get("reason", ""),
                     d.get("drain_s"))


@dataclass(frozen=True)
class WorkerReport:
    """What a worker says of itself every heartbeat."""

    worker: str
    assignments: tuple[tuple[str, ...], ...]
    serving: tuple[str, ...]
    version: int = 0
    running: dict[str, int] = field(default_factory=dict)
    at: float = 0.0

    def to_json(self) -> str:
        return json.dumps({"assignments": [list(a) for a in self.assignments],
                           "serving": list(self.serving), "version": self.version,
                           "running": self.running, "at": self.at})

    @staticmethod
    def from_json(worker: str, raw: str | bytes) -> WorkerReport:
        d = json.loads(raw)
        return WorkerReport(worker, tuple(tuple(a) for a in d["assignments"]),
                            tuple(d["serving"]), int(d.get("version", 0)),
                            {k: int(v) for k, v in d.get("running", {}).items()},
                            float(d.get("at", 0.0)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LaneOrders:
    """The orders, the workers' reports and the move log in one Redis; stateless but the client."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        #: the lane controller's: one controller process at a time decides
        self.lease = Lease(client, keys.LANE_CONTROLLER_LEASE)

    def now(self) -> float:
        """The Redis clock, which every process here agrees on."""
        sec, usec = self.redis.time()
        return sec + usec / 1e6

    # --- the worker's side --------------------------------------------------------------

    def order_for(self, worker: str) -> Order | None:
        raw = self.redis.hget(keys.LANE_ORDERS, worker)
        return Order.from_json(raw) if raw else None

    def report(self, report: WorkerReport) -> None:
        self.redis.hset(keys.LANE_WORKERS, report.worker, report.to_json())

    def forget(self, worker: str) -> None:
        """A worker that stops cleanly leaves no report behind (its order stays: a worker of
        the same name that starts again carries it out)."""
        self.redis.hdel(keys.LANE_WORKERS, worker)

    def moved(self, worker: str, order: Order, *, from_: tuple[str, ...], seconds: float,
              drain_s: float, handed_back: int) -> None:
        """A worker carried out `order` in `seconds` (from the order to consuming the new
        lanes), `drain_s` of them waiting for its running jobs, handing `handed_back` back."""
        pipe = self.redis.pipeline(transaction=True)
        for histogram, value in (("seconds", seconds), ("drain", drain_s)):
            bucket = next((b for b in MOVE_BUCKETS_S if value <= b), "+Inf")
            pipe.hincrby(keys.LANE_MOVE_COUNTS, f"{histogram}:{bucket}")
            pipe.hincrbyfloat(keys.LANE_MOVE_COUNTS, f"{histogram}:sum", value)
            pipe.hincrby(keys.LANE_MOVE_COUNTS, f"{histogram}:count")
        pipe.hincrby(keys.LANE_MOVE_COUNTS, "handed_back", handed_back)
        pipe.xadd(keys.LANE_MOVES, {"event": "moved", "worker": worker, "version": order.version,
                                    "from": ",".join(from_), "to": ",".join(order.lanes),
                                    "reason": order.reason, "seconds": f"{seconds:.3f}",
                                    "drain_s": f"{drain_s:.3f}", "handed_back": handed_back},
                  maxlen=MOVES_KEPT, approximate=True)
        pipe.execute()

    # --- the controller's side ----------------------------------------------------------

    def reports(self) -> dict[str, WorkerReport]:
        return {_text(w): WorkerReport.from_json(_text(w), raw)
                for w, raw in self.redis.hgetall(keys.LANE_WORKERS).items()}

    def orders(self) -> dict[str, Order]:
        return {_text(w): Order.from_json(raw)
                for w, raw in self.redis.hgetall(keys.LANE_ORDERS).items()}

    def tell(self, worker: str, lanes: tuple[str, ...], *, from_: tuple[str, ...], reason: str,
             detail: str, at: float | None = None, drain_s: float | None = None) -> Order:
        """Write `worker`'s new order and log the decision."""
        version = int(self.redis.incr(keys.LANE_ORDER_VERSION))
        order = Order(tuple(lanes), version, at if at is not None else self.now(), reason,
                      drain_s)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.LANE_ORDERS, worker, order.to_json())
        pipe.hincrby(keys.LANE_MOVE_COUNTS, f"{','.join(from_)}|{','.join(lanes)}|{reason}")
        pipe.xadd(keys.LANE_MOVES, {"event": "decided", "worker": worker, "version": version,
                                    "from": ",".join(from_), "to": ",".join(lanes),
                                    "reason": reason, "detail": detail},
                  maxlen=MOVES_KEPT, approximate=True)
        pipe.execute()
        return order

    # --- readers: /metrics, /v1/lanes, `tailguard stats` ----------------------------------

    def recent_moves(self, count: int = 10) -> list[dict[str, str]]:
        """The latest decisions and completed moves, newest first."""
        out = []
        for entry_id, fields in self.redis.xrevrange(keys.LANE_MOVES, count=count):
            item = {_text(k): _text(v) for k, v in fields.items()}
            item["id"] = _text(entry_id)
            item["time"] = f"{int(item['id'].split('-')[0]) / 1000:.3f}"
            out.append(item)
        return out

    def move_counts(self) -> dict[str, float]:
        return {_text(k): float(v) for k, v in self.redis.hgetall(keys.LANE_MOVE_COUNTS).items()}

    def assignment(self, alive: set[str] | None = None) -> dict[str, dict[str, Any]]:
        """Each reporting worker (only `alive` ones, if given): what it serves, what it was
        told, and whether it is away from its own lanes."""
        orders = self.orders()
        out = {}
        for name, rep in sorted(self.reports().items()):
            if alive is not None and name not in alive:
                continue
            order = orders.get(name)
            out[name] = {"serving": list(rep.serving), "home": list(rep.assignments[0])
                         if rep.assignments else [],
                         "told": list(order.lanes) if order else None,
                         "moving": order is not None and tuple(rep.serving) != order.lanes,
                         "may_serve": [list(a) for a in rep.assignments]}
        return out
