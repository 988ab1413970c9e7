"""Redis restarted, and the lane controller's lease holder stopped, in the middle of a lane
move: every job ends once, the move is carried out once, no other decision is taken while it
is in flight, and the lanes converge (the worker goes home; no lane keeps queued work without
a worker).

One deployment for the module, as `tailguard up` runs it but for the API: a private
redis-server with its AOF (restarted as tests/faults/test_redis_faults.py does), the API
in-process with its reaper, a real `celery worker -Q long,batch` with its vLLM engine on the
tiny model (tests/lanes.moves.test.toml: it may be moved to short; no lane keeps a minimum),
and `tailguard controller` processes, one holding the lease and the others waiting.

Each case puts a move in flight the same way: two long jobs streaming on the worker, then its
order to short with a drain of DRAIN_S (written with LaneOrders.tell, as the holder writes
its decisions: with one worker on long and work there, the policy itself would not move it),
and the fault once the worker has withdrawn long. The jobs still running after the drain are
handed back to long, so long has queued work and no worker until the controller sends the
worker home (`no_worker`); a move with nothing handed back ends with the worker going home
once short is quiet (`home`). Figures print as FAULT-FIGURE lines (`-s`).

Last, with the controllers stopped, kill -9 of the worker itself mid-move (it shares this
module's engine start rather than starting one more): the jobs it ran end once (as the reaper
or their own end says), and the worker, started again with its usual `-Q long,batch`, carries
out the order it never finished (orders are level-triggered: nothing is sent again), serves
the lane it was told, then goes home when told and serves long again.
"""

from __future__ import annotations

import socket
import time
from collections import Counter

import pytest
from conftest import ROOT
from fault_system import System, figure
from fault_workers import (
    START_TIMEOUT_S,
    Worker,
    api_with_reaper,
    finished_jobs,
    lane_workers,
    submit,
    wait_serving,
    wait_streaming,
)
from waiting import wait_for

from tailguard import settings
from tailguard.control.controller import LEASE_PERIODS
from tailguard.host.procs import Child, ChildSpec, start, tailguard_argv
from tailguard.host.redis_server import free_port
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.lane_orders import LaneOrders, Order
from tailguard.jobs.store import CANCELLED, TERMINAL, JobStore

pytestmark = pytest.mark.faults

MOVES_LANES = ROOT / "tests" / "lanes.moves.test.toml"
NODE = f"mover@{socket.gethostname()}"
HOME = ("long", "batch")
LANES = ("short", "long", "batch")
#: The controllers' period; a holder's lease lapses LEASE_PERIODS of them after its last tick.
PERIOD_S = 0.5
LEASE_S = LEASE_PERIODS * PERIOD_S
#: How long the moved worker lets its long jobs run before it hands the rest back.
DRAIN_S = 1.0
#: Seconds Redis stays down.
DOWN_S = 3.0
#: Slack for a loaded 2-core machine on top of a lease's lapse and one period.
SLACK_S = 2.0


class Controllers:
    """`tailguard controller` processes on the test's Redis: any number, one holds the lease."""

    def __init__(self, env: dict[str, str], logs) -> None:
        self.env, self.logs, self.started = env, logs, []

    def start(self) -> Child:
        name = f"controller-{len(self.started)}"
        child = start(ChildSpec(name, tailguard_argv("controller"), env=self.env, cwd=ROOT),
                      log=self.logs / f"{name}.log")
        self.started.append(child)
        return child

    def alive(self) -> list[Child]:
        return [c for c in self.started if c.alive()]

    def ready(self, orders: LaneOrders, count: int = 2) -> tuple[Child, list[Child]]:
        """At least `count` running: (the holder, the ones waiting)."""
        while len(self.alive()) < count:
            self.start()
        holder = wait_for(lambda: next((c for c in self.alive()
                                        if orders.lease.holder() == owner(c)), None),
                          60, "a controller holding the lease")
        return holder, [c for c in self.alive() if c is not holder]

    def stop(self) -> None:
        for child in self.started:
            child.stop()


def owner(controller: Child) -> str:
    """The lease owner a `tailguard controller` process writes (LaneController's default)."""
    return f"{socket.gethostname()}:{controller.pid}"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, tiny_model):
    data = tmp_path_factory.mktemp("move-outages")
    system = System(data=data, logs=data, redis_port=free_port(), api_port=0, env={})
    url = f"redis://127.0.0.1:{system.redis_port}/0"
    lanes = {settings.LANES_FILE.env: str(MOVES_LANES)}
    controllers = Controllers({**lanes, settings.REDIS_URL.env: url,
                               settings.LANE_CONTROLLER_S.env: str(PERIOD_S),
                               settings.LANE_DWELL_S.env: "1",
                               settings.LANE_HOME_AFTER_S.env: "5"}, data)
    workers: list[Worker] = []  # the module's worker first; a test may add the one it restarts
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(settings.LANES_FILE.env, str(MOVES_LANES))  # the in-process API's lanes
        system.start_redis()
        api_gen = api_with_reaper(url, tiny_model)
        try:
            api = next(api_gen)
            workers.append(Worker("mover", url, tiny_model, data, env=lanes))
            wait_serving(api, workers[0])
            yield system, api, workers, controllers
        finally:
            for started in workers:
                started.stop()
            controllers.stop()
            next(api_gen, None)
            system.stop()


def _move_in_flight(api, client, orders: LaneOrders, worker: Worker, detail: str,
                    drain_s: float = DRAIN_S) -> tuple[list[str], Order]:
    """Two long jobs streaming on the worker at home, then its order to short: returns once
    it has withdrawn long and drains (the move begun, not done)."""
    wait_for(lambda: _report(orders, HOME), 90, "the worker at home")
    wait_serving(api, worker)
    ids = [submit(api) for _ in range(2)]
    for job_id in ids:
        wait_streaming(client, job_id)
    order = orders.tell(NODE, ("short",), from_=HOME, reason="test", detail=detail,
                        drain_s=drain_s)
    wait_for(lambda: lane_workers(api, "long") == 0, what="long withdrawn")
    assert _report(orders, HOME)  # not carried out yet: the drain runs
    return ids, order


def _report(orders: LaneOrders, lanes: tuple[str, ...]) -> bool:
    report = orders.reports().get(NODE)
    return report is not None and report.serving == lanes


def _converged(api, client, orders: LaneOrders, worker: Worker, ids: list[str],
               order: Order) -> dict:
    """The invariants after a fault mid-move; what happened, for the figure."""
    store = JobStore(client)

    def ended() -> bool:  # read through the API, which settles overdue jobs
        return all(api.get(f"/v1/jobs/{j}").get_json()["status"] in TERMINAL for j in ids)

    wait_for(ended, 120, "the jobs of the move ended")
    counts = Counter(finished_jobs(client))
    assert {j: counts[j] for j in ids} == {j: 1 for j in ids}  # each ended once
    statuses = Counter(store.status(j) for j in ids)
    assert CANCELLED not in statuses

    def moves(event: str) -> list[dict]:
        return [m for m in orders.recent_moves(100) if m["event"] == event]

    # the order was carried out once, and no decision was taken while it was in flight
    moved = wait_for(lambda: [m for m in moves("moved") if m["version"] == str(order.version)],
                     60, "the move carried out")
    assert [(m["from"], m["to"]) for m in moved] == [("long,batch", "short")]
    decided_meanwhile = [m for m in moves("decided") if int(m["version"]) > order.version
                         and _entry(m) < _entry(moved[0])]
    assert decided_meanwhile == []

    # the controller brings it home: told and serving its own lanes, every lane's work served
    loads = LaneLoadStore(client)

    def settled() -> bool:
        told = orders.order_for(NODE)
        return (_report(orders, HOME) and told is not None and told.lanes == HOME
                and all(loads.load(l).queued_jobs == 0 or loads.load(l).live_workers > 0
                        for l in LANES))

    wait_for(settled, 90, "the worker home, no lane's work without a worker")
    wait_serving(api, worker)
    home = [m for m in moves("decided") if int(m["version"]) > order.version]
    return {"statuses": dict(statuses), "handed_back": int(moved[0]["handed_back"]),
            "move_s": float(moved[0]["seconds"]),
            "home_by": home[-1]["reason"] if home else None}


def _entry(move: dict) -> tuple[int, ...]:
    """A moves-stream entry's place in the stream (its id, as numbers)."""
    return tuple(int(part) for part in move["id"].split("-"))


def test_redis_restarted_from_its_aof_mid_move(deployment):
    system, api, (worker, *_), controllers = deployment
    client = system.client()
    orders = LaneOrders(client)
    controllers.ready(orders)
    ids, order = _move_in_flight(api, client, orders, worker, "redis restart")
    system.redis.kill()
    time.sleep(DOWN_S)
    system.start_redis()  # same port and data: it replays the AOF
    back = time.monotonic()
    client = system.client()  # the old one's connection went with the server
    seen = _converged(api, client, LaneOrders(client), worker, ids, order)
    assert worker.proc.poll() is None, worker.tail()
    figure(fault="kill -9 redis mid-move, restart from AOF", down_s=DOWN_S,
           converged_after_s=round(time.monotonic() - back, 1), **seen)


def test_the_lease_holder_stopped_mid_move_sigterm(deployment):
    system, api, (worker, *_), controllers = deployment
    client = system.client()
    orders = LaneOrders(client)
    holder, waiting = controllers.ready(orders)
    ids, order = _move_in_flight(api, client, orders, worker, "holder SIGTERM")
    assert holder.stop() is not None  # SIGTERM; returns once it exited
    stopped = time.monotonic()
    assert orders.lease.holder() != owner(holder)  # a clean stop hands the lease over at once
    new = wait_for(lambda: orders.lease.holder(), PERIOD_S + SLACK_S, "another holder")
    took_s = time.monotonic() - stopped
    assert new in {owner(c) for c in waiting}
    seen = _converged(api, client, orders, worker, ids, order)
    figure(fault="SIGTERM the lane controller's holder mid-move", takeover_s=round(took_s, 2),
           **seen)


def test_the_lease_holder_killed_mid_move(deployment):
    system, api, (worker, *_), controllers = deployment
    client = system.client()
    orders = LaneOrders(client)
    holder, waiting = controllers.ready(orders)
    ids, order = _move_in_flight(api, client, orders, worker, "holder kill -9")
    holder.kill()
    killed = time.monotonic()
    new = wait_for(lambda: orders.lease.holder() != owner(holder) and orders.lease.holder(),
                   LEASE_S + PERIOD_S + SLACK_S, "another holder once the lease lapsed")
    took_s = time.monotonic() - killed
    assert new in {owner(c) for c in waiting}
    seen = _converged(api, client, orders, worker, ids, order)
    figure(fault="kill -9 the lane controller's holder mid-move", takeover_s=round(took_s, 2),
           lease_s=LEASE_S, **seen)


def test_kill_9_of_the_worker_mid_move_every_job_ends_once_and_it_converges(deployment,
                                                                            tiny_model):
    """The module's last case: it ends the module's worker."""
    system, api, workers, controllers = deployment
    controllers.stop()  # the orders here are the test's alone
    client = system.client()
    store, orders = JobStore(client), LaneOrders(client)
    worker = workers[0]
    # a drain longer than the test: the worker dies with its jobs running, mid-move
    ids, order = _move_in_flight(api, client, orders, worker, "worker kill -9", drain_s=60)
    worker.kill()

    wait_for(lambda: all(store.status(j) in TERMINAL for j in ids), 60, "its jobs ended")
    assert {j: Counter(finished_jobs(client))[j] for j in ids} == {j: 1 for j in ids}
    ended = Counter(store.status(j) for j in ids)
    worker.stop()  # the engine-core orphan too

    logs = system.logs / "again"
    logs.mkdir()
    again = Worker("mover", f"redis://127.0.0.1:{system.redis_port}/0", tiny_model, logs,
                   env={settings.LANES_FILE.env: str(MOVES_LANES)})
    workers.append(again)
    wait_for(lambda: _report_version(orders, ("short",), order.version), START_TIMEOUT_S,
             "the restarted worker carrying out its order")
    wait_serving(api, again, lane="short")  # advertised once its new engine is warm
    assert lane_workers(api, "long") == 0
    short = submit(api, max_tokens=16)  # within short's cap: the mover serves it
    wait_for(lambda: store.status(short) in TERMINAL, 120, "a short job served")
    assert (store.status(short), store.get(short)["worker"]) == ("succeeded", NODE)

    orders.tell(NODE, HOME, from_=("short",), reason="home", detail="fault test")
    wait_for(lambda: _report(orders, HOME), 60, "home again")
    wait_serving(api, again)
    long = submit(api, max_tokens=100)  # above short's cap: lane long
    wait_for(lambda: store.status(long) in TERMINAL, 120, "a long job served")
    assert store.status(long) == "succeeded"
    assert {j: Counter(finished_jobs(client))[j] for j in [*ids, short, long]} == {
        j: 1 for j in [*ids, short, long]}
    figure(fault="kill -9 the moving worker mid-move, restart it", ended=dict(ended),
           order=order.version)


def _report_version(orders: LaneOrders, lanes: tuple[str, ...], version: int) -> bool:
    report = orders.reports().get(NODE)
    return report is not None and report.serving == lanes and report.version == version
