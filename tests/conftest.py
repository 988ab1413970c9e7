"""Shared fixtures. Real services only: a private redis-server, real Celery workers,
real vLLM engines on the tiny demo model.

The environment is set here, at import, because celeryconfig and the task
registry read the lanes file and Redis URL when `tasks` is first imported.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tailguard import settings
from tailguard.host.redis_server import free_port, start_redis

pytest_plugins = ["e2e_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
REDIS_PORT = free_port()
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
TEST_LANES = ROOT / "tests" / "lanes.test.toml"
#: A GPU run (TAILGUARD_DEVICE=cuda, as scripts/gpu-check.sh runs the suite): every engine of
#: the suite shares GPU 0 (tests/e2e_fixtures.py's `engine_pin`), each with this share of it
#: (vLLM's default, 0.9, is for one engine alone); the test lanes' [engine] table (their last)
#: gets it.
ON_GPU = os.environ.get(settings.DEVICE.env) == "cuda"
GPU_SHARE: dict[str, float] = {"gpu_memory_utilization": 0.2} if ON_GPU else {}
if ON_GPU:
    _gpu_lanes = Path(tempfile.mkdtemp(prefix="tailguard-lanes-")) / "lanes.test.toml"
    _gpu_lanes.write_text(TEST_LANES.read_text()
                          + "".join(f"{k} = {v}\n" for k, v in GPU_SHARE.items()))
    TEST_LANES = _gpu_lanes
# Built once per machine: the tiny model is deterministic, so reuse across runs is safe.
MODEL_CACHE = Path(os.environ.get("TAILGUARD_TEST_MODEL_DIR", ROOT / ".tailguard" / "test-models"))

os.environ[settings.REDIS_URL.env] = REDIS_URL
os.environ[settings.LANES_FILE.env] = str(TEST_LANES)
os.environ[settings.SSE_HEARTBEAT_S.env] = "0.3"  # idle streams notice expiry/disconnects fast
# The suite's apps and API servers run without keys unless a test asks for keys mode (apps
# built without the setting require keys), and its redis-servers let tests empty them.
os.environ[settings.API_AUTH.env] = settings.AUTH_OPEN
os.environ[settings.REDIS_ENABLE_COMMANDS.env] = "FLUSHDB,FLUSHALL"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def redis_server():
    """A private, throwaway redis-server for the whole session."""
    data = Path(tempfile.mkdtemp(prefix="tailguard-redis-"))
    redis = start_redis(REDIS_PORT, data, appendonly=False)
    yield REDIS_URL
    redis.stop()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def redis_client(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushdb()  # rq's habit: every test starts from an empty Redis
    yield client
    client.close()


@pytest.fixture
def redis_client_noflush(redis_server):
    """For tests that share Redis with running worker processes (flushing would drop
    Celery's queue bindings under them)."""
    import redis

    client = redis.Redis.from_url(redis_server)
    yield client
    client.close()


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The tiny random-weight demo model, built offline on first use (under a lock: two test
    runs may start at once)."""
    import fcntl

    from tailguard.model.demo import build_demo_model

    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    with open(MODEL_CACHE / "tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = build_demo_model(MODEL_CACHE / "tiny", size="tiny")
    os.environ[settings.MODEL.env] = str(path)
    return str(path)


@pytest.fixture(scope="session")
def api_app(tiny_model, redis_server):
    from app import create_app

    # The finished-request consumer and the reaper are driven by hand in tests (run_once),
    # not by threads (the workers' heartbeats reap dead peers). Most API tests run no worker
    # (their requests stay queued for inspection), so the no-live-worker refusal is off here;
    # tests/integration/test_admission_on_redis.py checks it.
    app = create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                      "TAILGUARD_REDIS_URL": redis_server, "TAILGUARD_CONSUME_FINISHED": False,
                      "TAILGUARD_ADMIT_WITHOUT_WORKER": True, "TAILGUARD_REAP_RUNNING": False})
    return app


@pytest.fixture
def client(api_app, redis_client):
    return api_app.test_client()


@pytest.fixture(scope="session")
def keys_app(tiny_model, redis_server):
    """api_app in keys mode (TAILGUARD_API_AUTH=keys): every /v1/ call needs a key."""
    from app import create_app

    return create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                       "TAILGUARD_REDIS_URL": redis_server, "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_ADMIT_WITHOUT_WORKER": True, "TAILGUARD_REAP_RUNNING": False,
                       settings.API_AUTH.env: settings.AUTH_KEYS})


@pytest.fixture
def keys_client(keys_app, redis_client):
    return keys_app.test_client()
