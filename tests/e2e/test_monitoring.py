"""Metrics, request log and stats on the real system (gunicorn API, real workers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import requests
from conftest import ROOT
from e2e_fixtures import http_status, serve

from tailguard import settings
from tailguard.host.procs import ChildSpec, tailguard_argv
from tailguard.host.redis_server import free_port
from tailguard.redis import keys

pytestmark = pytest.mark.e2e


def sample(text: str, name: str, **labels) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_quiet(redis_url: str, timeout_s: float = 90) -> None:
    """Until no job of an earlier test runs or waits and the API has read every finished one,
    so a count taken now moves by this test's jobs alone."""
    import redis

    from tailguard.jobs.finished import GROUP
    from tailguard.redis import keys

    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        groups = {g["name"]: g for g in client.xinfo_groups(keys.FINISHED_STREAM)} \
            if client.exists(keys.FINISHED_STREAM) else {}
        group = groups.get(GROUP.encode()) or groups.get(GROUP) or {}
        busy = (client.hlen(keys.RUNNING_JOBS)
                + sum(client.zcard(keys.lane_queued_key(lane)) for lane in ("short", "long", "batch"))
                + int(group.get("pending") or 0) + int(group.get("lag") or 0))
        if not busy:
            break
        time.sleep(0.5)
    client.close()


def test_api_and_worker_metrics_after_real_requests(api_url, workers, redis_server):
    wait_quiet(redis_server)  # an earlier test's job ending meanwhile would count too
    before = requests.get(api_url + "/metrics", timeout=10).text
    n0 = sample(before, "tailguard_e2e_request_latency_seconds_count", lane="short") or 0
    ids = [requests.post(api_url + "/v1/jobs", json={"prompt": f"p{i}", "max_tokens": 8},
                         timeout=10).json()["id"] for i in range(5)]
    for job_id in ids:
        assert requests.get(f"{api_url}/v1/jobs/{job_id}?wait=30", timeout=40).json()["status"] \
            == "succeeded"
    # the API's consumer thread picks the finished requests up from Redis
    deadline = time.monotonic() + 20
    while True:
        text = requests.get(api_url + "/metrics", timeout=10).text
        n = sample(text, "tailguard_e2e_request_latency_seconds_count", lane="short") or 0
        if n >= n0 + 5 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert n == n0 + 5
    assert sample(text, "tailguard_requests_total", lane="short", status="succeeded") >= 5
    assert sample(text, "tailguard_queue_depth", lane="short") == 0
    assert sample(text, "tailguard_time_to_first_token_seconds_bucket", lane="short", le="+Inf") >= 5

    worker = requests.get(f"http://127.0.0.1:{workers.metrics_ports['short']}/metrics", timeout=10).text
    assert 'tailguard_worker_running_requests{worker="short@' in worker
    assert "tailguard_worker_completed_requests_total" in worker
    # vLLM's own series, from the same process, labelled with the worker; its lanes apart
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        assert any(line.startswith(name + "{") and 'worker="short@' in line
                   and "lane=" not in line for line in worker.splitlines()), name
    assert any(line.startswith('tailguard_worker_lanes_info{lane="short",worker="short@')
               for line in worker.splitlines())
    long_worker = requests.get(f"http://127.0.0.1:{workers.metrics_ports['long']}/metrics",
                               timeout=10).text
    assert 'tailguard_worker_lanes_info{lane="batch"' in long_worker
    assert 'lane="short"' not in long_worker

    env = {**os.environ, settings.REDIS_URL.env: redis_server}
    stats = json.loads(subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "stats", "--window", "10m", "--json"], cwd=ROOT,
        env=env, capture_output=True, text=True, check=True).stdout)
    assert stats["lanes"]["short"]["count"] >= 5
    assert stats["lanes"]["short"]["e2e_s"]["p99"] > 0
    assert stats["slowest"] and stats["slowest_vs_all"]["all_count"] >= 5


@pytest.fixture(scope="module")
def flower_url(workers, redis_server, tmp_path_factory):
    port = free_port()
    home = tmp_path_factory.mktemp("flower-home")
    flower = serve(ChildSpec("flower", tailguard_argv("flower", "--port", str(port)), env={
        settings.HOME.env: str(home), settings.FLOWER_BASIC_AUTH.env: "ops:s3cret"}),
        home, lambda: http_status(f"http://127.0.0.1:{port}") is not None)
    yield f"http://127.0.0.1:{port}"
    flower.stop()


def test_flower_needs_auth_and_shows_each_lane(flower_url):
    assert requests.get(flower_url + "/", timeout=10).status_code == 401
    assert requests.get(flower_url + "/", auth=("ops", "wrong"), timeout=10).status_code == 401
    assert requests.get(flower_url + "/", auth=("ops", "s3cret"), timeout=10).status_code == 200
    # Flower's worker API: which worker consumes which lane (it learns this over a few seconds)
    deadline = time.monotonic() + 30
    while True:
        workers = requests.get(flower_url + "/api/workers?refresh=1", auth=("ops", "s3cret"),
                               timeout=20).json()
        queues = {name.split("@")[0]: sorted(q["name"] for q in info.get("active_queues") or [])
                  for name, info in workers.items()}
        if queues.get("short") and queues.get("long") or time.monotonic() > deadline:
            break
        time.sleep(1)
    # each lane, and each worker's own queue of that lane's jobs offered to it (prefix
    # affinity, on by default: docs/lanes.md)
    names = {name.split("@")[0]: name for name in workers}
    assert queues["short"] == ["short", keys.worker_queue("short", names["short"])]
    assert queues["long"] == sorted(["batch", "long", keys.worker_queue("batch", names["long"]),
                                     keys.worker_queue("long", names["long"])])
    broker = requests.get(flower_url + "/broker", auth=("ops", "s3cret"), timeout=20)
    assert broker.status_code == 200
    for lane in ("short", "long", "batch"):
        assert f">{lane}<" in broker.text  # one row per lane queue, with its message count
