"""Lanes that follow the load on real engines, with the session's workers: the long worker
(started by hand, `celery -A tasks worker -Q long,batch`; tests/lanes.test.toml lets it be
moved to short) changes lanes with its engine up. A long job running on it when it leaves is
handed back and continues where it stopped, on one stream, once the worker is home; the lane
controller, on the figures a short flood leaves in Redis, sends it to short and home again.
Every test leaves it home (its fixture orders it back)."""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest
from e2e_support import wait_job
from waiting import wait_for

from tailguard.control.controller import LaneController
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.lane_orders import LaneOrders
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.store import JobStore
from tailguard.lanes.rebalance import HOME, TARGET_MISSED, RebalancePolicy
from tailguard.lanes.table import load_lanes
from tailguard.redis import keys

pytestmark = pytest.mark.e2e

LONG = f"long@{socket.gethostname()}"
HOME_LANES = ("long", "batch")
LONG_TOKENS = 1500  # long's cap: ~2 s of the tiny model on one core


@pytest.fixture
def orders(redis_client_noflush, workers):
    orders = LaneOrders(redis_client_noflush)
    wait_for(lambda: LONG in orders.reports(), what="the long worker's lane report")
    yield orders
    if orders.reports()[LONG].serving != HOME_LANES:  # the session's other tests need it home
        orders.tell(LONG, HOME_LANES, from_=orders.reports()[LONG].serving, reason=HOME,
                    detail="test teardown", drain_s=0)
        wait_for(lambda: orders.reports()[LONG].serving == HOME_LANES, timeout=60)


def submit(api, **body) -> str:
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.get_json()
    return r.get_json()["id"]


def _serving(orders: LaneOrders, lanes: tuple[str, ...]) -> bool:
    return orders.reports()[LONG].serving == lanes


def _deltas(client, job_id: str) -> list[str]:
    return [json.loads(f[b"data"])["text"] for _, f in client.xrange(keys.job_stream_key(job_id))
            if f[b"type"] == b"delta"]


def test_a_long_job_is_handed_back_when_its_worker_moves_and_continues_on_one_stream(
        api, workers, orders, redis_client_noflush):
    store = JobStore(redis_client_noflush)
    long_id = submit(api, prompt="moved " * 20, max_tokens=LONG_TOKENS, ignore_eos=True)
    wait_for(lambda: store.status(long_id) == "running" and _deltas(redis_client_noflush, long_id),
             what="the long job streaming")
    order = orders.tell(LONG, ("short",), from_=HOME_LANES, reason="test", detail="e2e",
                        drain_s=0)
    wait_for(lambda: _serving(orders, ("short",)), timeout=30, what="the move to short")
    moved = next(m for m in orders.recent_moves() if m["event"] == "moved"
                 and m["version"] == str(order.version))
    assert moved["handed_back"] == "1" and moved["from"] == "long,batch"
    assert store.status(long_id) == "queued"  # back on long, which nobody serves now

    from tasks import app

    def queues() -> list[str]:  # [] until its consumer answers (seconds on a loaded machine)
        replies = app.control.inspect(destination=[LONG], timeout=5).active_queues() or {}
        return [q["name"] for q in replies.get(LONG, [])]

    wait_for(lambda: queues() == ["short"], what="the long worker consuming short")
    short = wait_job(api, submit(api, prompt="meanwhile", max_tokens=8, ignore_eos=True),
                     workers.check_alive)
    assert short["status"] == "succeeded"

    orders.tell(LONG, HOME_LANES, from_=("short",), reason=HOME, detail="e2e")
    done = wait_job(api, long_id, workers.check_alive)
    assert done["status"] == "succeeded", done
    assert done["worker"] == LONG
    assert done["result"]["completion_tokens"] == LONG_TOKENS  # the rest, not all again
    assert int(store.get(long_id)["reclaims"]) == 1
    assert "".join(_deltas(redis_client_noflush, long_id)) == done["result"]["text"]


def test_the_controller_sends_the_long_worker_to_a_flooded_short_lane_and_home(
        api, workers, orders, redis_client_noflush):
    table = load_lanes()  # the suite's, with a target the flood misses and long free to give
    lanes = tuple(dataclasses.replace(l, target_wait_s=0.2) if l.name == "short"
                  else dataclasses.replace(l, min_workers=0) for l in table.lanes)
    controller = LaneController(dataclasses.replace(table, lanes=lanes), orders,
                                LaneLoadStore(redis_client_noflush), Liveness(redis_client_noflush),
                                RebalancePolicy(min_dwell_s=0.0, home_after_s=0.0), period_s=0.5,
                                owner="e2e")
    ids = [submit(api, prompt=f"flood {i}", max_tokens=64, ignore_eos=True) for i in range(32)]
    # a tick may come before the flood's figures reach Redis or the previous test's move home
    # is reported done: the first decision within a few ticks
    (move,) = wait_for(controller.tick, timeout=30, what="a move to the flooded lane")
    assert (move.worker, move.to, move.reason) == \
        (LONG, ("short",), TARGET_MISSED), move
    wait_for(lambda: _serving(orders, ("short",)), timeout=30, what="the move to short")
    done = [wait_job(api, i, workers.check_alive) for i in ids]
    assert [d["status"] for d in done] == ["succeeded"] * len(ids)
    assert LONG in {d["worker"] for d in done}, "the moved worker served none of the flood"

    wait_for(controller.tick, timeout=60, what="a decision once quiet")
    home = next(m for m in orders.recent_moves() if m["event"] == "decided")
    assert (home["worker"], home["to"], home["reason"]) == (LONG, "long,batch", HOME)
    wait_for(lambda: _serving(orders, HOME_LANES), timeout=30, what="the move home")
    controller.close()
