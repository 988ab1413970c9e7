"""The lane controller's loop: hold the lease, read the fleet, decide, write the order.

Every process that runs a controller (``tailguard controller``; ``tailguard up`` starts
one) tries the lease (``keys.LANE_CONTROLLER_LEASE``) each period; the one holding it
decides, the others wait and take over within a lease once it stops. A tick reads each
lane's load as admission does (tailguard/jobs/lane_load.py), the live workers' reports
and their orders (tailguard/jobs/lane_orders.py), asks tailguard/lanes/rebalance.py for
this tick's decision (one move, or several to the same lane on a large fleet), and writes
each as its worker's new order, logged with its reason.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import redis

from tailguard import settings
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.lane_orders import LaneOrders
from tailguard.jobs.liveness import Liveness
from tailguard.lanes.admission import AdmissionPolicy
from tailguard.lanes.rebalance import FleetView, Move, QuietClock, RebalancePolicy, WorkerView
from tailguard.lanes.table import LaneTable

log = logging.getLogger("tailguard.controller")

#: Lease periods a holder may miss before another process takes over.
LEASE_PERIODS = 3


class LaneController:
    """One candidate controller (see the module docstring); `start()`/`close()` own its thread."""

    def __init__(self, table: LaneTable, orders: LaneOrders, loads: LaneLoadStore,
                 liveness: Liveness, policy: RebalancePolicy, *, period_s: float,
                 owner: str | None = None) -> None:
        self.table, self.orders, self.loads, self.liveness = table, orders, loads, liveness
        self.policy, self.period_s = policy, period_s
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.holding = False
        self.quiet = QuietClock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="tailguard-lane-controller",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.orders.lease.release(self.owner)
        except redis.RedisError:
            pass

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("lane controller tick failed: %s", exc)
            self._stopping.wait(self.period_s)

    def fleet(self) -> FleetView:
        """This tick's figures, as the policy reads them."""
        now = self.orders.now()
        alive = self.liveness.alive_workers()
        orders = self.orders.orders()
        workers = []
        for name, rep in sorted(self.orders.reports().items()):
            if name not in alive or not rep.assignments:
                continue
            order = orders.get(name)
            workers.append(WorkerView(name, rep.assignments, rep.serving,
                                      order.lanes if order else None,
                                      order.at if order else None, rep.running))
        last_at = last_s = None
        for entry in self.orders.recent_moves(20):
            if entry.get("event") == "decided" and last_at is None:
                last_at = float(entry["time"])
            if entry.get("event") == "moved" and last_s is None:
                last_s = float(entry["seconds"])
        return FleetView(lanes={l.name: l for l in self.table},
                         loads={l.name: self.loads.load(l.name) for l in self.table},
                         workers=tuple(workers), now=now, last_move_at=last_at,
                         last_move_s=last_s)

    def tick(self) -> tuple[Move, ...]:
        """Decide once if this process holds the lease; the moves ordered (one decision)."""
        held = self.orders.lease.hold(self.owner, LEASE_PERIODS * self.period_s)
        if held != self.holding:
            log.info("%s the lane controller's lease", "holding" if held else "lost")
            self.holding = held
        if not held:
            return ()
        fleet = self.quiet.stamp(self.policy, self.fleet())
        moves = self.policy.decide_moves(fleet)
        for move in moves:
            order = self.orders.tell(move.worker, move.to, from_=move.from_, reason=move.reason,
                                     detail=move.detail, at=fleet.now)
            log.info("order %d: %s %s -> %s (%s: %s)", order.version, move.worker,
                     ",".join(move.from_), ",".join(move.to), move.reason, move.detail)
        return moves


def build_controller(client: redis.Redis, table: LaneTable) -> LaneController:
    """A candidate controller on `client` with the deployment's settings."""
    policy = RebalancePolicy(admission=AdmissionPolicy(
        prior_tokens_per_s=settings.PRIOR_TOKENS_PER_S.get()),
        min_dwell_s=settings.LANE_DWELL_S.get(), home_after_s=settings.LANE_HOME_AFTER_S.get(),
        max_moves=settings.LANE_MAX_MOVES.get())
    return LaneController(table, LaneOrders(client), LaneLoadStore(
        client, window_s=settings.RATE_WINDOW_S.get()), Liveness(client), policy,
        period_s=settings.LANE_CONTROLLER_S.get())
