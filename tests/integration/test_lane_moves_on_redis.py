"""Lanes that follow the load, on a real Redis with real Celery workers (no engine): a worker
carries out its lane order with its engine untouched (queues consumed before and after, its
prefetch, messages left on the old queue, what it advertises, the move recorded), and the lane
controller's lease (a `tailguard controller` process's too) and decision on the figures Redis
holds."""

import dataclasses
import socket
import time
import uuid
from contextlib import contextmanager

import pytest
import redis
from celery.contrib.testing.worker import start_worker, test_worker_started
from conftest import ROOT
from waiting import wait_for

from tailguard import settings
from tailguard.control.controller import LaneController
from tailguard.errors import NoLiveWorker
from tailguard.host.procs import ChildSpec, start, tailguard_argv
from tailguard.jobs.lane_load import LaneLoadStore
from tailguard.jobs.lane_orders import LaneOrders, WorkerReport
from tailguard.jobs.liveness import Liveness
from tailguard.lanes.admission import AdmissionPolicy
from tailguard.lanes.rebalance import NO_WORKER, RebalancePolicy
from tailguard.lanes.table import load_lanes
from tailguard.worker import runtime as tailguard_worker
from tasks import app
from tasks.worker import _set_prefetch

pytestmark = pytest.mark.integration

MOVES_LANES = ROOT / "tests" / "lanes.moves.test.toml"
NODE = "long@moves-test"


@pytest.fixture
def moves_lanes(monkeypatch, tiny_model):
    monkeypatch.setenv(settings.LANES_FILE.env, str(MOVES_LANES))
    monkeypatch.setenv(settings.LANE_FOLLOW_S.env, "0.1")
    monkeypatch.setenv(settings.MOVE_DRAIN_S.env, "0.5")


@contextmanager
def long_worker():
    """A real worker for the long entry (long, batch; may be moved to short), no engine."""
    def _setup(sender=None, worker=None, consumer=None, **_):
        tailguard_worker.setup(app, worker.hostname,
                               [q.name for q in consumer.task_consumer.queues], eager_engine=False)
        _set_prefetch(consumer, 2)  # as tasks/worker.py's worker_ready does: long's batch

    test_worker_started.connect(_setup, weak=False)
    try:
        with start_worker(app, pool="threads", concurrency=4, queues=["long", "batch"],
                          perform_ping_check=False, loglevel="WARNING", hostname=NODE,
                          shutdown_timeout=30) as w:
            # setup imports vLLM's engine arguments: over 20 s on a loaded 2-core host
            wait_for(lambda: tailguard_worker.attached(app) is not None, 60, "its runtime set up")
            try:
                yield w
            finally:
                tailguard_worker.teardown(app)
    finally:
        test_worker_started.disconnect(_setup)


def _queues() -> list[str]:
    """What the worker consumes, by `celery inspect`; [] while it has not answered (it answers
    from its consumer's thread: a loaded machine may take seconds)."""
    replies = app.control.inspect(destination=[NODE], timeout=5).active_queues() or {}
    return [q["name"] for q in replies.get(NODE, [])]


def _prefetch() -> int | None:
    stats = app.control.inspect(destination=[NODE], timeout=5).stats() or {}
    return stats[NODE]["prefetch_count"] if NODE in stats else None


def _expiring_message(queue: str) -> str:
    """A message for a job that is no longer wanted when a worker gets it (its `expires` has
    passed): consuming it drops it without an engine."""
    task_id = uuid.uuid4().hex
    app.send_task(f"tailguard.generate.{queue}", task_id=task_id, queue=queue, expires=0.05,
                  kwargs={"job_id": task_id, "prompt": "hi", "max_tokens": 1, "sampling": {},
                          "deadline_s": 1.0}, ignore_result=True)
    return task_id


def test_a_worker_changes_lanes_on_its_order_with_its_engine_untouched(moves_lanes, redis_client):
    orders, liveness = LaneOrders(redis_client), Liveness(redis_client)
    with long_worker():
        runtime = tailguard_worker.WorkerRuntime.of(app)
        wait_for(lambda: _queues() == ["long", "batch"], what="its own queues")
        assert _prefetch() == 2
        wait_for(lambda: NODE in orders.reports())
        assert orders.reports()[NODE].assignments == (("long", "batch"), ("short",))
        wait_for(lambda: liveness.standby_workers(["short"]) == {"short": 1})
        time.sleep(0.1)
        _expiring_message("short")  # waiting for a worker to come to short
        assert redis_client.llen("short") == 1

        order = orders.tell(NODE, ("short",), from_=("long", "batch"), reason="test",
                            detail="by hand")
        wait_for(lambda: orders.reports()[NODE].serving == ("short",), timeout=10)

        wait_for(lambda: _queues() == ["short"], what="the new queue")
        assert _prefetch() == 4  # short's batch, within the pool the entry was sized for
        assert orders.reports()[NODE].version == order.version
        wait_for(lambda: liveness.live_workers(["short", "long", "batch"])
                 == {"short": 1, "long": 0, "batch": 0})
        assert liveness.standby_workers(["short", "long", "batch"]) == \
            {"short": 0, "long": 1, "batch": 1}
        wait_for(lambda: redis_client.llen("short") == 0)  # the new queue is consumed
        _expiring_message("long")
        time.sleep(1.0)
        assert redis_client.llen("long") == 1  # the old one is not
        moved = [m for m in orders.recent_moves() if m["event"] == "moved"]
        assert moved and moved[0]["to"] == "short" and moved[0]["from"] == "long,batch"
        assert float(moved[0]["seconds"]) >= 0 and moved[0]["handed_back"] == "0"
        assert orders.move_counts()["seconds:count"] == 1
        assert runtime.engine is None  # no engine was started, let alone restarted

        orders.tell(NODE, ("long", "batch"), from_=("short",), reason="home", detail="by hand")
        wait_for(lambda: _queues() == ["long", "batch"], timeout=10)
        assert _prefetch() == 2
        wait_for(lambda: redis_client.llen("long") == 0)


def test_a_broker_reconnect_keeps_the_lanes_prefetch_not_the_pools(moves_lanes, redis_client):
    with long_worker():
        wait_for(lambda: _queues() == ["long", "batch"], what="its own queues")
        assert _prefetch() == 2
        redis_client.client_kill_filter(_type="normal", skipme=True)  # the broker "goes away"

        def answers() -> bool:  # our own control connections were killed too
            try:
                return _queues() == ["long", "batch"]
            except redis.ConnectionError:
                return False

        wait_for(answers, timeout=30, what="it reconnected")
        assert _prefetch() == 2  # long's batch, not the pool's 4 (sized for short)


def test_an_order_its_entry_does_not_allow_is_ignored(moves_lanes, redis_client):
    orders = LaneOrders(redis_client)
    with long_worker():
        wait_for(lambda: NODE in orders.reports())
        order = orders.tell(NODE, ("batch",), from_=("long", "batch"), reason="test", detail="")
        wait_for(lambda: orders.reports()[NODE].version == order.version)
        wait_for(lambda: _queues() == ["long", "batch"], what="its own queues, still")


def _controller(redis_client, owner: str, period_s: float = 0.2) -> LaneController:
    return LaneController(load_lanes(MOVES_LANES), LaneOrders(redis_client),
                          LaneLoadStore(redis_client), Liveness(redis_client),
                          RebalancePolicy(min_dwell_s=0.0), period_s=period_s, owner=owner)


def test_one_controller_decides_and_another_takes_over_when_it_stops(redis_client):
    a, b = _controller(redis_client, "a"), _controller(redis_client, "b")
    a.tick(), b.tick()
    assert (a.holding, b.holding) == (True, False)
    a.close()  # a clean stop hands the lease over at once
    b.tick()
    assert b.holding
    c = _controller(redis_client, "c")
    c.tick()
    assert not c.holding
    time.sleep(3 * b.period_s + 0.1)  # b died without a word: its lease lapses
    c.tick()
    assert c.holding


def test_a_controller_process_stopped_with_sigterm_hands_its_lease_over_at_once(
        redis_client, tmp_path):
    """`tailguard controller` as `tailguard up` runs and stops it: SIGTERM releases the lease
    (a waiting controller takes over within its next period, not a lease later)."""
    orders = LaneOrders(redis_client)
    child = start(ChildSpec("controller", tailguard_argv("controller"), cwd=ROOT,
                            env={settings.LANES_FILE.env: str(MOVES_LANES),
                                 settings.LANE_CONTROLLER_S.env: "0.5"}),
                  log=tmp_path / "controller.log")
    try:
        owner = f"{socket.gethostname()}:{child.pid}"
        wait_for(lambda: orders.lease.holder() == owner, 60, "the controller holding the lease")
        assert child.stop() == 0, child.log_tail()
        assert orders.lease.holder() is None
    finally:
        child.stop()


def test_the_controller_sends_a_standby_worker_to_a_lane_with_work_and_no_worker(
        client, redis_client):
    orders, liveness = LaneOrders(redis_client), Liveness(redis_client)
    # a long worker as its follower reports itself (no engine, no Celery needed for this)
    liveness.worker_alive("long@x", ttl_s=60)
    liveness.heartbeat(["long", "batch"], "long@x", ttl_s=60)
    liveness.standby(["short"], "long@x", ttl_s=60)
    orders.report(WorkerReport("long@x", (("long", "batch"), ("short",)), ("long", "batch"),
                               at=orders.now()))
    # short has no worker, but one may be moved there: admission queues instead of a 503
    short = load_lanes(MOVES_LANES)["short"]
    load = LaneLoadStore(redis_client).load("short")
    assert (load.live_workers, load.standby_workers) == (0, 1)
    AdmissionPolicy(admit_without_worker=False).admit(short, load, cost=20)
    with pytest.raises(NoLiveWorker):
        AdmissionPolicy().admit(short, dataclasses.replace(load, standby_workers=0), cost=20)
    r = client.post("/v1/jobs", json={"prompt": "hello", "max_tokens": 4})
    assert r.status_code == 202 and r.get_json()["lane"] == "short"

    ctl = _controller(redis_client, "ctl")
    (move,) = ctl.tick()
    assert (move.worker, move.to, move.reason) == ("long@x", ("short",), NO_WORKER)
    assert orders.order_for("long@x").lanes == ("short",)
    assert ctl.tick() == ()  # one move in flight: the worker has not carried it out yet
    decided = [m for m in orders.recent_moves() if m["event"] == "decided"]
    assert decided[0]["reason"] == NO_WORKER and "no live worker" in decided[0]["detail"]
    assert orders.move_counts()["long,batch|short|no_worker"] == 1


def test_metrics_show_each_move_its_duration_and_its_drain_apart(redis_client):
    """What /metrics exposes of the moves Redis recorded: the order counted by from, to and
    reason, the move's duration and its drain in two histograms, the jobs handed back."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tailguard.observe.metrics import LaneMovesCollector

    orders = LaneOrders(redis_client)
    order = orders.tell(NODE, ("short",), from_=("long", "batch"), reason=NO_WORKER,
                        detail="test")
    orders.moved(NODE, order, from_=("long", "batch"), seconds=2.2, drain_s=2.0, handed_back=3)
    registry = CollectorRegistry()
    registry.register(LaneMovesCollector(redis_client))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples[("tailguard_lane_moves_total", (("from", "long,batch"), ("reason", NO_WORKER),
                                                   ("to", "short")))] == 1
    for name in ("tailguard_lane_move_seconds", "tailguard_lane_move_drain_seconds"):
        # 2.2 s and 2.0 s both fall in the 2.5 s bucket, not the 1 s one
        assert samples[(f"{name}_bucket", (("le", "1"),))] == 0
        assert samples[(f"{name}_bucket", (("le", "2.5"),))] == 1
        assert samples[(f"{name}_count", ())] == 1
    assert samples[("tailguard_lane_move_seconds_sum", ())] == pytest.approx(2.2)
    assert samples[("tailguard_lane_move_drain_seconds_sum", ())] == pytest.approx(2.0)
    assert samples[("tailguard_lane_move_handed_back_total", ())] == 3
