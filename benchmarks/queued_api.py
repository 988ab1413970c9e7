"""The part `idle_waits.py` and `open_streams.py` share: `tailguard api` on a private Redis with no
worker, and batch jobs submitted to it that stay queued."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tailguard.host.redis_server import free_port, start_redis

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / ".tailguard" / "test-models" / "tiny"


def request(port: int, method: str, path: str, body: dict | None = None,
            timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"} if body is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def model_folder(given: str) -> str:
    """`given` if it holds a model, else the tiny demo model built there (its tokenizer is all
    the API loads)."""
    from tailguard.model.demo import build_demo_model

    return given if Path(given, "config.json").exists() else \
        str(build_demo_model(Path(given), size="tiny"))


@contextlib.contextmanager
def api_without_workers(model: str, extra_env: dict[str, str], name: str,
                        stop_wait_s: float = 30.0) -> Iterator[tuple[int, str]]:
    """A private Redis and `tailguard api` (gunicorn, as `make up` runs it) admitting jobs with
    no worker; yields the API's port and
    Redis's URL once `/healthz` answers."""
    data = Path(tempfile.mkdtemp(prefix=f"tailguard-{name}-"))
    redis_port, api_port = free_port(), free_port()
    redis_proc = start_redis(redis_port, data, appendonly=False)
    url = f"redis://127.0.0.1:{redis_port}/0"
    env = {**os.environ, "TAILGUARD_REDIS_URL": url,
           "TAILGUARD_MODEL": model, "TAILGUARD_ADMIT_WITHOUT_WORKER": "1",
           "TAILGUARD_LANES": "", **extra_env}
    api = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "api", "--port", str(api_port)],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                request(api_port, "GET", "/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or api.poll() is not None:
                    raise SystemExit("the API did not start") from None
                time.sleep(0.2)
        yield api_port, url
    finally:
        api.terminate()  # gunicorn drains open requests for up to stop_wait_s
        try:
            api.wait(stop_wait_s)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait(10)
        redis_proc.stop()


def submit_queued_jobs(port: int, n: int) -> list[str]:
    """`n` small batch jobs; with no worker they stay queued."""
    jobs = []
    for _ in range(n):
        status, body = request(port, "POST", "/v1/jobs",
                               {"prompt": "hi", "max_tokens": 8, "priority": "batch"})
        assert status == 202, body
        jobs.append(json.loads(body)["id"])
    return jobs
