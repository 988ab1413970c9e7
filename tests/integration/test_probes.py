"""The probes an orchestrator asks: the API's /livez and /readyz against a real Redis (stopped
for real), apart from /healthz; a real worker's /livez on its metrics port, its engine's
state driven by the real keeper (no vLLM)."""

import shutil
import tempfile
from pathlib import Path

import pytest
import requests
from celery.contrib.testing.worker import start_worker, test_worker_started
from waiting import wait_for

from app.gateway_ext import built_gateway
from tailguard import settings
from tailguard.engine.keeper import FAILED, EngineKeeper
from tailguard.errors import EngineDeadError
from tailguard.host.redis_server import free_port, start_redis
from tailguard.worker import runtime as tailguard_worker
from tasks import app as celery_app

pytestmark = pytest.mark.integration


def test_the_api_stays_live_and_ready_with_no_worker_while_healthz_names_the_lanes(client):
    assert client.get("/livez").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json() == {"status": "ok", "redis": "ok"}
    health = client.get("/healthz")  # nobody serves any lane: the fleet is degraded
    assert health.status_code == 503
    assert health.get_json()["lanes_without_worker"] == ["short", "long", "batch"]


def test_an_api_whose_redis_is_stopped_is_unready_but_live(tiny_model):
    from app import create_app

    data = Path(tempfile.mkdtemp(prefix="tailguard-redis-probe-"))
    port = free_port()
    redis = start_redis(port, data, appendonly=False)
    api = None
    try:
        api = create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                          "TAILGUARD_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                          "TAILGUARD_CONSUME_FINISHED": False, "TAILGUARD_REAP_RUNNING": False})
        http = api.test_client()
        assert http.get("/readyz").status_code == 200
        redis.stop()
        unready = http.get("/readyz")
        assert unready.status_code == 503
        assert unready.get_json()["status"] == "unready" and unready.get_json()["redis"] != "ok"
        assert http.get("/livez").status_code == 200  # a restart would not bring Redis back
    finally:
        gateway = built_gateway(api) if api is not None else None
        if gateway is not None:  # its threads would follow a Redis that is gone
            gateway.close()
        redis.stop()
        shutil.rmtree(data, ignore_errors=True)


class _NoEngine:
    """An engine host that cannot start (the keeper's own tests use the same)."""

    dead = False

    def start(self) -> None:
        raise EngineDeadError("cannot start")

    def shutdown(self) -> None:
        pass


@pytest.fixture
def worker_with_metrics(redis_client, monkeypatch):
    """A real worker on `long,batch` with its metrics (and /livez) on a free port, its engine
    left idle (it would start with the first task)."""
    port = free_port()
    monkeypatch.setenv(settings.WORKER_METRICS_PORT.env, str(port))

    def _setup(sender=None, worker=None, consumer=None, **_):
        tailguard_worker.setup(celery_app, worker.hostname,
                               [q.name for q in consumer.task_consumer.queues], eager_engine=False)

    test_worker_started.connect(_setup, weak=False)
    try:
        with start_worker(celery_app, pool="threads", concurrency=2, queues=["long", "batch"],
                          perform_ping_check=False, loglevel="WARNING",
                          hostname="test-probe@localhost", shutdown_timeout=30):
            wait_for(lambda: tailguard_worker.attached(celery_app) is not None)
            try:
                yield tailguard_worker.WorkerRuntime.of(celery_app), f"http://127.0.0.1:{port}"
            finally:
                tailguard_worker.teardown(celery_app)
    finally:
        test_worker_started.disconnect(_setup)


def test_a_worker_whose_engine_cannot_serve_fails_its_probe(worker_with_metrics):
    runtime, url = worker_with_metrics
    live = wait_for(lambda: (r := requests.get(url + "/livez", timeout=5)).status_code == 200
                    and r, 30)
    assert live.json()["engine"] == "idle" and live.json()["heartbeat_age_s"] is not None
    # every other path is still the metrics
    assert "tailguard_worker_running_requests" in requests.get(url + "/metrics", timeout=5).text
    # The keeper gives up on an engine that cannot start (its own state machine); on_give_up
    # is left out here, where it would stop the test's Celery worker.
    runtime.keeper = EngineKeeper(_NoEngine, lambda host: None)
    runtime.keeper.start(background=False)
    assert runtime.keeper.state == FAILED
    failing = requests.get(url + "/livez", timeout=5)
    assert failing.status_code == 503
    assert failing.json()["status"] == "failing" and failing.json()["engine"] == FAILED
