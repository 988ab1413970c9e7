"""Bounded storage on a real Redis (tailguard/jobs/redis_memory.py, tailguard/jobs/stream.py): one
copy of each output, kept for its own TTL; past the high-water mark submissions answer 503
storage_full while an accepted job finishes and heartbeats write; room again, submissions resume.

The API is a real app on a private redis-server with a small maxmemory (the embedded
config: noeviction); jobs run through the real runner and stream writer, the engine is a
stand-in that streams fixed deltas (as tests/integration/test_runner.py's)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import redis
from waiting import wait_for

from tailguard import settings
from tailguard.engine.host import GenerationResult
from tailguard.host.redis_server import free_port, start_redis
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.redis_memory import StorageWatch
from tailguard.jobs.stream import DeltaWriter
from tailguard.redis import keys
from tailguard.worker.runner import GenerationJob, JobRunner

pytestmark = pytest.mark.integration

MAXMEMORY = 32 << 20


class StreamingEngine:
    """Streams `deltas` and finishes (the runner's Engine)."""

    def __init__(self, deltas=("Hello", " world")) -> None:
        self.deltas = list(deltas)

    def generate(self, request_id, prompt, sampling, deadline_s, on_first_token=None,
                 should_cancel=None, on_delta=None, add_special_tokens=True) -> GenerationResult:
        if on_first_token is not None:  # optional, as the real engine has it
            on_first_token()
        for text in self.deltas:
            on_delta(text)
        return GenerationResult("".join(self.deltas), 3, len(self.deltas), "length", 0.01, 0.02)


@pytest.fixture(scope="module")
def small_redis():
    """A private redis-server as the embedded one is configured, with 32 MB of maxmemory."""
    data = Path(tempfile.mkdtemp(prefix="tailguard-storage-"))
    port = free_port()
    mp = pytest.MonkeyPatch()
    mp.setenv(settings.REDIS_MAXMEMORY.env, str(MAXMEMORY))
    child = start_redis(port, data, appendonly=False)
    mp.undo()
    yield f"redis://127.0.0.1:{port}/0"
    child.stop()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def app(small_redis, tiny_model):
    from app import create_app
    from app.gateway_ext import get_gateway

    client = redis.Redis.from_url(small_redis)
    client.flushdb()
    app = create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                      "TAILGUARD_REDIS_URL": small_redis, "TAILGUARD_CONSUME_FINISHED": False,
                      "TAILGUARD_ADMIT_WITHOUT_WORKER": True, "TAILGUARD_REAP_RUNNING": False,
                      settings.REDIS_HIGH_WATER.env: 0.5, settings.OUTPUT_TTL_S.env: 2,
                      settings.RECORD_TTL_S.env: 600})
    yield app
    with app.app_context():
        get_gateway().close()
    client.flushdb()
    client.close()


def gateway(app):
    from app.gateway_ext import get_gateway

    with app.app_context():
        return get_gateway()


def run_job(store, job_id: str, engine: StreamingEngine) -> dict:
    """Run a submitted job to its end through the real runner, as a worker would."""
    runner = JobRunner(lambda: engine, store,
                       lambda j: DeltaWriter(store.redis, j, flush_s=0, ttl_s=store.ttl_s),
                       worker="short@storage-test")
    return runner.run(GenerationJob(job_id, "hi", max_tokens=4, sampling={}, deadline_s=30))


def submit(http, **body):
    return http.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4, **body})


def test_an_output_is_stored_once_and_read_back_until_its_ttl(app):
    http, store = app.test_client(), gateway(app).store
    job_id = submit(http).get_json()["id"]
    run_job(store, job_id, StreamingEngine())
    assert "text" not in store.get(job_id)["result"]  # the record holds how it ended only
    done = http.get(f"/v1/jobs/{job_id}").get_json()
    assert done["status"] == "succeeded"
    assert done["result"] == {"text": "Hello world", "completion_tokens": 2, "finish_reason": "length"}
    waited = http.get(f"/v1/jobs/{job_id}?wait=5").get_json()  # a long poll reads it the same
    assert waited["result"]["text"] == "Hello world"
    # the output's TTL (2 s here) passes; the record (600 s) still says how the job ended
    wait_for(lambda: not store.redis.exists(keys.job_stream_key(job_id)), timeout=10)
    later = http.get(f"/v1/jobs/{job_id}").get_json()
    assert later["status"] == "succeeded" and later["result"]["completion_tokens"] == 2
    assert later["result"]["text"] is None and later["result"]["text_expired"] is True


def test_past_the_high_water_mark_submissions_wait_and_accepted_work_goes_on(app):
    http, gw = app.test_client(), gateway(app)
    store, client = gw.store, gw.store.redis
    running = submit(http).get_json()["id"]  # accepted before Redis fills
    Liveness(client).heartbeat(["short", "long", "batch"], "w@storage-test", ttl_s=30)
    filler, n = "x" * 100_000, 0
    while StorageWatch(client, 0.5).read().used_bytes < 0.6 * MAXMEMORY:
        client.set(f"filler:{n}", filler)
        n += 1

    refused = wait_for(lambda: (r := submit(http)).status_code == 503 and r, timeout=10,
                       what="a storage_full refusal")  # once the cached figure is stale
    assert refused.get_json()["error"]["code"] == "storage_full"
    assert int(refused.headers["Retry-After"]) >= 1
    health = http.get("/healthz")
    body = health.get_json()
    assert health.status_code == 503 and body["status"] == "degraded" and body["storage"]["full"]
    assert body["storage"]["high_water_bytes"] == MAXMEMORY // 2
    assert body["lanes_without_worker"] == []  # the heartbeat was written, and is read
    Liveness(client).heartbeat(["short"], "w@storage-test", ttl_s=30)  # and can be written again
    metrics = {name: float(value) for name, _, value in (
        line.rpartition(" ") for line in http.get("/metrics").get_data(as_text=True).splitlines()
        if line.startswith("tailguard_"))}
    assert metrics["tailguard_storage_full"] == 1
    assert metrics["tailguard_redis_memory_max_bytes"] == MAXMEMORY
    assert metrics["tailguard_redis_memory_used_bytes"] >= MAXMEMORY // 2
    assert metrics['tailguard_redis_db_keys{db="db0"}'] > n

    run_job(store, running, StreamingEngine())  # the accepted job runs to its end
    assert http.get(f"/v1/jobs/{running}").get_json()["result"]["text"] == "Hello world"

    client.delete(*(f"filler:{i}" for i in range(n)))  # finished jobs' records expire
    accepted = wait_for(lambda: (r := submit(http)).status_code == 202 and r, timeout=10,
                        what="submissions accepted again")
    assert accepted.get_json()["status"] == "queued"
    assert http.get("/healthz").get_json()["storage"]["full"] is False


def test_the_memory_figure_is_read_at_most_once_per_refresh(small_redis):
    client = redis.Redis.from_url(small_redis)
    now = [0.0]
    watch = StorageWatch(client, 0.5, refresh_s=1.0, clock=lambda: now[0])
    first = watch.memory()
    client.set("grow", "x" * 1_000_000)
    assert watch.memory() is first  # within the refresh: the figure every thread shares
    now[0] = 1.0
    assert watch.memory().used_bytes > first.used_bytes
    assert first.max_bytes == MAXMEMORY and first.high_water_bytes == MAXMEMORY // 2
    assert StorageWatch(client, 0).memory().high_water_bytes == 0  # 0: never full
    client.delete("grow")
    client.close()
