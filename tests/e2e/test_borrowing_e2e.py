"""Work-conserving lanes on real engines: a short worker that borrows from lane long,
with no long worker at all, serves a long job while idle, gives it back when its own
short jobs arrive, and the job continues where it stopped, on one stream.

One borrowing short worker (`tailguard worker --worker short --cores 0`, a lanes file
that adds `borrow = ["long"]` with `borrow_engine = "idle"` to tests/lanes.test.toml:
borrowed jobs run on a second engine at idle CPU priority) on a Redis database of this
file's own, so the session's long worker never takes these jobs. Its headroom R = 3 of
4 slots means it borrows only when fully idle and any own job reclaims what it borrowed.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import ON_GPU, ROOT, TEST_LANES
from e2e_fixtures import HEALTH_GRACE_S, START_TIMEOUT_S, http_status, or_fail

from tailguard import settings
from tailguard.host.cores import Pinning
from tailguard.host.procs import start, wait_until, worker_spec
from tailguard.host.redis_server import free_port
from tailguard.jobs.store import JobStore
from tailguard.redis import keys

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    ON_GPU, reason='the idle-priority engine is a CPU host\'s (refused on a GPU)')]

LONG_TOKENS = 1500  # long's cap in tests/lanes.test.toml: ~2 s of the tiny model on one core
#: short jobs sent, one after another, until one of them has reclaimed the long job
MAX_SHORT = 20


@pytest.fixture(scope="module")
def db(redis_server):
    """A Redis database of this file's own (flushed)."""
    import redis

    url = redis_server.rsplit("/", 1)[0] + "/5"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.close()


@pytest.fixture(scope="module")
def api(db, tiny_model):
    from app import create_app

    # no worker serves lane long: admit its jobs anyway (the borrower is what serves them)
    return create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                       "TAILGUARD_REDIS_URL": db[0], "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_ADMIT_WITHOUT_WORKER": True}).test_client()


@pytest.fixture(scope="module")
def borrowing_worker(db, api, tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("borrowing")
    lanes = tmp / "lanes.toml"
    lanes.write_text(TEST_LANES.read_text().replace(
        'lanes = ["short"]\n', 'lanes = ["short"]\nborrow = ["long"]\nborrow_headroom = 3\n'
        'borrow_max = 1\nborrow_engine = "idle"\n'))
    port = free_port()
    env = {settings.MODEL.env: tiny_model, settings.REDIS_URL.env: db[0],
           settings.LANES_FILE.env: str(lanes), settings.WORKER_HEARTBEAT_S.env: "1"}
    child = start(dataclasses.replace(
        worker_spec("short", Pinning(cores=(0,)), "--metrics-port", str(port), "-l", "INFO",
                    env=env), cwd=ROOT), log=tmp / "worker.short.log")
    or_fail(lambda: wait_until(
        lambda: api.get("/healthz").get_json()["workers_per_lane"]["short"] == 1, [child],
        START_TIMEOUT_S + HEALTH_GRACE_S, "the borrowing worker serving"), cleanup=child.stop)
    yield child, f"http://127.0.0.1:{port}/metrics"
    child.kill()  # its stop is no test's business here (a warm one takes ~15 s with two engines)


def submit(api, **body) -> str:
    resp = api.post("/v1/jobs", json={"ignore_eos": True, **body})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def wait_done(api, child, job_id: str) -> dict:
    return or_fail(lambda: wait_until(
        lambda: (j := api.get(f"/v1/jobs/{job_id}?wait=1").get_json())["status"]
        not in ("queued", "running") and j, [child], 120, f"job {job_id} done"))


def idle_engine_cores(root: int) -> list[int]:
    """vLLM engine-core processes under `root` that run at idle CPU priority (SCHED_IDLE)."""
    import os

    from tailguard.bench.host import descendants, snapshot

    procs = snapshot()
    return [pid for pid in descendants(procs, root)
            if procs[pid].comm.startswith("VLLM::") and os.sched_getscheduler(pid) == os.SCHED_IDLE]


def idle_threads(pid: int) -> list[int]:
    """Threads of process `pid` itself at idle CPU priority."""
    import os

    return [tid for tid in map(int, os.listdir(f"/proc/{pid}/task"))
            if os.sched_getscheduler(tid) == os.SCHED_IDLE]


def metric(url: str, line_start: str) -> float:
    import requests

    text = requests.get(url, timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(line_start))


def test_an_idle_short_worker_serves_a_long_job_and_gives_it_back_to_its_own(
        db, api, borrowing_worker):
    child, metrics_url = borrowing_worker
    _, redis_client = db
    store = JobStore(redis_client)
    long_id = submit(api, prompt="borrowed " * 20, max_tokens=LONG_TOKENS)
    # once the idle engine is up too
    or_fail(lambda: wait_until(lambda: store.status(long_id) == "running", [child],
                               START_TIMEOUT_S, "the long job borrowed"))
    assert store.get(long_id)["worker"].startswith("short@")
    assert idle_engine_cores(child.pid), "no engine-core process at idle CPU priority"
    assert not idle_threads(child.pid), "worker threads left at idle priority (GIL inversion)"

    for _ in range(MAX_SHORT):  # own work arrives while the long job runs
        short = wait_done(api, child, submit(api, prompt="mine", max_tokens=32))
        assert (short["status"], short["lane"]) == ("succeeded", "short")
        if store.get(long_id).get("reclaims") or store.status(long_id) != "running":
            break
    assert store.get(long_id).get("reclaims", 0) >= 1, "no short job reclaimed the long one"

    done = wait_done(api, child, long_id)  # borrowed again once the short ones are done
    assert (done["status"], done["lane"]) == ("succeeded", "long")
    assert done["worker"].startswith("short@")
    assert done["result"]["completion_tokens"] == LONG_TOKENS  # the rest, not all again
    streamed = "".join(json.loads(f[b"data"])["text"]
                       for _, f in redis_client.xrange(keys.job_stream_key(long_id))
                       if f[b"type"] == b"delta")
    assert streamed == done["result"]["text"]  # one stream: paused, then continued
    assert metric(metrics_url, 'tailguard_borrowed_total{lane="long"') >= 2
    assert metric(metrics_url, "tailguard_reclaimed_total") >= 1
    assert http_status(metrics_url) == 200
