"""A worker's parts: the heartbeat given only what it uses; the runtime starts them in order
and stops them in reverse; its lanes replaced at run time reach /healthz's advertisement."""

from __future__ import annotations

import redis
from waiting import wait_for

from tailguard.lanes.table import load_lanes
from tailguard.worker.heartbeat import Heartbeat
from tailguard.worker.runtime import WorkerRuntime


class FakeLiveness:
    """Records what a worker says of itself (tailguard/jobs/liveness.py's calls)."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.down = False

    def worker_alive(self, worker: str, ttl_s: float) -> None:
        if self.down:
            raise redis.ConnectionError("down")
        self.calls.append(("alive", worker))

    def forget_worker(self, worker: str) -> None:
        self.calls.append(("forget_worker", worker))

    def heartbeat(self, lanes: list[str], worker: str, ttl_s: float) -> None:
        self.calls.append(("advertise", tuple(lanes)))

    def forget(self, lanes: list[str], worker: str) -> None:
        self.calls.append(("withdraw", tuple(lanes)))


class FakeReaper:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def run_once(self) -> list[str]:
        self.calls.append(("reap",))
        return []


def heartbeat(calls: list, liveness: FakeLiveness | None = None) -> Heartbeat:
    return Heartbeat(liveness or FakeLiveness(calls), "w@h", 0.01,
                     checks=[lambda: calls.append(("check",))],
                     advertise=lambda: calls.append(("advertise",)), reaper=FakeReaper(calls))


def test_a_beat_says_alive_checks_advertises_then_reaps():
    calls: list = []
    heartbeat(calls).beat()
    assert calls == [("alive", "w@h"), ("check",), ("advertise",), ("reap",)]


def test_a_beat_survives_redis_down():
    calls: list = []
    liveness = FakeLiveness(calls)
    liveness.down = True
    heartbeat(calls, liveness).beat()  # logged, not raised
    assert calls == []


def test_the_heartbeat_beats_on_its_thread_until_stopped_then_forgets_the_worker():
    calls: list = []
    beat = heartbeat(calls)
    beat.start()
    wait_for(lambda: calls.count(("reap",)) >= 2, timeout=5)
    beat.stop()
    assert calls[-1] == ("forget_worker", "w@h")
    assert not beat._thread.is_alive()


class Part:
    def __init__(self, name: str, calls: list, fails: bool = False) -> None:
        self.name, self.calls, self.fails = name, calls, fails

    def start(self) -> None:
        if self.fails:
            raise RuntimeError(self.name)
        self.calls.append(("start", self.name))

    def stop(self) -> None:
        self.calls.append(("stop", self.name))


def runtime(calls: list) -> WorkerRuntime:
    return WorkerRuntime(app=None, hostname="w@h", lanes=[load_lanes()["short"]], store=None,
                         liveness=FakeLiveness(calls), build_engine=lambda: None)


def test_parts_start_in_order_and_stop_in_reverse_after_the_lanes_are_withdrawn():
    calls: list = []
    rt = runtime(calls)
    rt.start([Part("a", calls), Part("b", calls)])
    rt.stop()
    assert calls == [("start", "a"), ("start", "b"), ("withdraw", ("short",)),
                     ("stop", "b"), ("stop", "a")]
    assert rt.stopping.is_set()


def test_only_started_parts_stop():
    calls: list = []
    rt = runtime(calls)
    try:
        rt.start([Part("a", calls), Part("b", calls, fails=True), Part("c", calls)])
    except RuntimeError:
        pass
    rt.stop()
    assert [c for c in calls if c[0] in ("start", "stop")] == [("start", "a"), ("stop", "a")]


def test_each_lane_runs_at_its_place_in_the_workers_order_as_vllm_priority():
    from tailguard.worker.runner import Prioritized

    calls: list = []
    rt = runtime(calls)
    rt.lanes = [load_lanes()["short"], load_lanes()["long"], load_lanes()["batch"]]
    rt.__post_init__()
    rt.keeper.get = lambda: "engine"
    assert rt.runner_for("short").engine() == "engine"  # priority 0: vLLM's default
    long_engine, batch_engine = rt.runner_for("long").engine(), rt.runner_for("batch").engine()
    assert isinstance(long_engine, Prioritized) and long_engine.priority == 1
    assert batch_engine.priority == 2


def test_the_metrics_server_serves_its_collectors_until_stopped():
    import urllib.request

    from prometheus_client import REGISTRY

    from tailguard.engine.stats import HostStats
    from tailguard.host.redis_server import free_port
    from tailguard.observe.metrics import MetricsServer, WorkerCollector

    port = free_port()
    collector = WorkerCollector("w@h", HostStats)
    server = MetricsServer(port, "127.0.0.1", [collector])
    server.start()
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b'tailguard_worker_running_requests{worker="w@h"}' in body
    finally:
        server.stop()
    assert collector not in REGISTRY._collector_to_names
