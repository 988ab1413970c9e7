"""kill -9 of a worker in the middle of a lane move: the jobs it ran end once (as the reaper or
their own end says), and the worker, started again with its usual `-Q long,batch`, carries out
the order it never finished (orders are level-triggered: nothing is sent again), serves the
lane it was told, then goes home and serves long again. A real `celery worker` with its vLLM
engine on the tiny model, the test lanes' long entry (which may be moved to short), the API
in-process with its reaper, on a Redis database of this file's own."""

from __future__ import annotations

import socket
from collections import Counter

import pytest
from fault_workers import (
    START_TIMEOUT_S,
    Worker,
    api_with_reaper,
    finished_jobs,
    lane_workers,
    own_database,
    submit,
    wait_serving,
    wait_streaming,
)
from waiting import wait_for

from tailguard.jobs.lane_orders import LaneOrders
from tailguard.jobs.store import TERMINAL, JobStore

pytestmark = pytest.mark.faults

NODE = f"mover@{socket.gethostname()}"
HOME = ("long", "batch")


@pytest.fixture
def db(redis_server):
    yield from own_database(redis_server, 6)


@pytest.fixture
def api(db, tiny_model):
    yield from api_with_reaper(db[0], tiny_model)


def _serving(orders: LaneOrders, lanes: tuple[str, ...], version: int | None = None) -> bool:
    report = orders.reports().get(NODE)
    return (report is not None and report.serving == lanes
            and (version is None or report.version == version))


def test_kill_9_mid_move_every_job_ends_once_and_the_restarted_worker_converges(
        db, api, tiny_model, tmp_path):
    url, redis_client = db
    store, orders = JobStore(redis_client), LaneOrders(redis_client)
    worker = Worker("mover", url, tiny_model, tmp_path)
    again = None
    try:
        wait_serving(api, worker)
        wait_for(lambda: _serving(orders, HOME), what="its lane report")
        ids = [submit(api) for _ in range(2)]
        for job_id in ids:
            wait_streaming(redis_client, job_id)
        order = orders.tell(NODE, ("short",), from_=HOME, reason="test", detail="fault",
                            drain_s=60)
        # mid-move: long withdrawn, the drain running, the move not reported done
        wait_for(lambda: lane_workers(api, "long") == 0, what="its old lanes withdrawn")
        assert _serving(orders, HOME)
        worker.kill()

        wait_for(lambda: all(store.status(j) in TERMINAL for j in ids), 60, "its jobs ended")
        assert sorted(finished_jobs(redis_client)) == sorted(ids)  # each once
        ended = Counter(store.status(j) for j in ids)
        worker.stop()  # the engine-core orphan too

        (tmp_path / "again").mkdir()
        again = Worker("mover", url, tiny_model, tmp_path / "again")
        wait_for(lambda: _serving(orders, ("short",), order.version), START_TIMEOUT_S,
                 "the restarted worker carrying out its order")
        wait_serving(api, again, lane="short")  # advertised once its new engine is warm
        assert lane_workers(api, "long") == 0
        short = submit(api, max_tokens=16)  # within short's cap: the mover serves it
        wait_for(lambda: store.status(short) in TERMINAL, 120, "a short job served")
        assert (store.status(short), store.get(short)["worker"]) == ("succeeded", NODE)

        orders.tell(NODE, HOME, from_=("short",), reason="home", detail="fault test")
        wait_for(lambda: _serving(orders, HOME), 60, "home again")
        wait_serving(api, again)
        long = submit(api, max_tokens=100)  # above short's cap of 64: lane long
        wait_for(lambda: store.status(long) in TERMINAL, 120, "a long job served")
        assert store.status(long) == "succeeded"
        assert sorted(finished_jobs(redis_client)) == sorted([*ids, short, long])
        print(f"\nkill -9 mid-move: its running jobs ended {dict(ended)}; restarted, it carried "
              f"out order {order.version} and came home")
    finally:
        worker.stop()
        if again is not None:
            again.stop()
