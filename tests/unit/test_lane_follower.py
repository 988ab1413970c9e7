"""A worker's own running jobs during a lane move (tailguard/worker/lane_follower.py): the drain,
then the hand-back of what is left, never of a job that cannot be resumed elsewhere; and which
orders the follower carries out."""

import threading
import time

import pytest

from tailguard.jobs.lane_orders import Order
from tailguard.worker.lane_follower import LaneFollower, RunningJobs

HOME = ("long", "batch")


def _job(jobs, job_id, lane, reclaimable, runs_s, handed):
    """A job that runs `runs_s` unless handed back first (as the runner does on `reclaimed`)."""
    def run():
        with jobs.track(job_id, lane, reclaimable) as hand_back:
            if hand_back.wait(runs_s):
                time.sleep(0.05)  # queued again with its text so far
                handed.append(job_id)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_jobs_that_end_within_the_drain_are_not_handed_back():
    jobs, handed = RunningJobs(), []
    _job(jobs, "a", "long", True, 0.1, handed)
    time.sleep(0.02)
    spent, n = jobs.hand_back({"long"}, drain_s=2.0)
    assert n == 0 and handed == [] and spent < 1.5


def test_what_outlives_the_drain_is_handed_back_and_other_lanes_are_untouched():
    jobs, handed = RunningJobs(), []
    threads = [_job(jobs, "a", "long", True, 30, handed), _job(jobs, "b", "long", True, 30, handed),
               _job(jobs, "c", "short", True, 30, handed)]
    time.sleep(0.05)
    assert jobs.by_lane() == {"long": 2, "short": 1}
    spent, n = jobs.hand_back({"long"}, drain_s=0.1)
    assert n == 2 and sorted(handed) == ["a", "b"] and spent < 5
    assert jobs.by_lane() == {"short": 1}
    threads[0].join(1)


def test_a_job_that_cannot_be_resumed_elsewhere_runs_on():
    jobs, handed = RunningJobs(), []
    _job(jobs, "streamed", "long", False, 0.5, handed)
    time.sleep(0.02)
    _, n = jobs.hand_back({"long"}, drain_s=0.05)
    assert n == 0 and handed == [] and jobs.by_lane() == {"long": 1}


class _Orders:
    """LaneOrders as the follower uses it, in memory: the order Redis holds now."""

    def __init__(self) -> None:
        self.order: Order | None = None
        self.moved_versions: list[int] = []
        self.moved_from: list[tuple[str, ...]] = []

    def order_for(self, worker):
        return self.order

    def report(self, report) -> None:
        pass

    def now(self) -> float:
        return 100.0

    def moved(self, worker, order, *, from_, **_) -> None:
        self.moved_versions.append(order.version)
        self.moved_from.append(from_)


def _follower(orders: _Orders) -> tuple[LaneFollower, list[str]]:
    serving = list(HOME)
    follower = LaneFollower("w", orders, [HOME, ("short",)], serving=lambda: tuple(serving),
                            stop=lambda old: serving.clear(), start=serving.extend,
                            running=RunningJobs(), period_s=0.1, drain_s=0.0)
    return follower, serving


def test_an_order_is_carried_out_once():
    orders = _Orders()
    follower, serving = _follower(orders)
    orders.order = Order(("short",), 5, 99.0)
    assert follower.step() == orders.order and serving == ["short"]
    assert follower.step() is None and orders.moved_versions == [5]


def test_orders_numbered_again_by_a_redis_that_lost_its_data_are_carried_out():
    """A Redis restarted without its data (no AOF, a failover to a replica behind) numbers
    orders from 1 again, below the version the worker carried out: the order Redis holds
    is what the worker follows, whatever its number."""
    orders = _Orders()
    follower, serving = _follower(orders)
    orders.order = Order(("short",), 5, 99.0)
    follower.step()
    orders.order = None  # the orders are gone with the data: the worker stays where it is
    assert follower.step() is None and serving == ["short"]
    orders.order = Order(HOME, 1, 99.5)  # the controller's next decision
    assert follower.step() == orders.order and tuple(serving) == HOME
    assert orders.moved_versions == [5, 1]


def test_a_move_whose_start_failed_starts_again_without_stopping_twice():
    """Redis away when the new queues are to be consumed (the consumer did not confirm): the
    next period starts them, and the move is recorded from the lanes it left."""
    orders, calls = _Orders(), []
    serving = list(HOME)

    def start(new):
        calls.append(("start", new))
        if len(calls) == 2:
            raise RuntimeError("the consumer did not confirm")
        serving.extend(new)

    def stop(old):
        calls.append(("stop", old))
        serving.clear()

    follower = LaneFollower("w", orders, [HOME, ("short",)], serving=lambda: tuple(serving),
                            stop=stop, start=start, running=RunningJobs(), period_s=0.1,
                            drain_s=0.0)
    orders.order = Order(("short",), 3, 99.0)
    with pytest.raises(RuntimeError):
        follower.step()
    assert follower.step() == orders.order and serving == ["short"]
    assert calls == [("stop", HOME), ("start", ("short",)), ("start", ("short",))]
    assert orders.moved_versions == [3] and orders.moved_from == [HOME]
