"""A Celery round trip and a tailguard worker runtime in a fresh process, given only the
environment a worker on another host would have: how the integration tests show that a
TAILGUARD_REDIS_URL spelling (sentinel://, rediss://) works for Celery as celeryconfig sets it up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Fresh, so celeryconfig reads the URL from the environment at import, as a worker's does.
_SCRIPT = """
import time
from celery.contrib.testing.worker import start_worker
from tasks import app
from tailguard.worker import runtime as worker

@app.task(name="tailguard.round_trip_echo")
def echo(text):
    return text

runtime = worker.setup(app, "short@round-trip-host", ["short"], eager_engine=False)
with start_worker(app, pool="threads", concurrency=1, queues=["short"], perform_ping_check=False,
                  loglevel="WARNING", hostname="echo@round-trip-host"):
    print(echo.apply_async(("round trip",), queue="short").get(timeout=30))
    deadline = time.monotonic() + 20
    while "short@round-trip-host" not in runtime.liveness.alive_workers():
        assert time.monotonic() < deadline, "the worker runtime wrote no heartbeat"
        time.sleep(0.1)
worker.teardown(app)
"""


def celery_round_trip(env: dict[str, str]) -> None:
    """A real worker (threads pool) answers a task through broker and result backend, and
    tailguard's worker runtime heart-beats (its own client) into the same Redis; the caller
    checks that Redis for the result and the heartbeat's traces."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "round trip"
