"""Workers warm their engine up before serving, and a worker whose engine cannot serve
exits non-zero, saying why, instead of advertising its lanes (tailguard/engine/warmup.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from tailguard import settings

pytestmark = pytest.mark.e2e


def test_every_worker_logged_its_warm_up_before_serving(workers):
    # the fixture waited for /healthz, which only counts warmed-up workers
    logs = sorted(workers.group.log_dir.glob("worker.*.log"))
    assert [log.name for log in logs] == ["worker.long.log", "worker.short.log"]
    for log in logs:
        text = log.read_text(errors="replace")
        assert "warm-up passed: 8 prompts of 1...8 tokens, one at a time then 8 at once" in text, \
            f"{log.name}:\n{text[-3000:]}"


def test_a_worker_whose_engine_cannot_serve_exits_non_zero_saying_why(redis_server, tmp_path):
    missing = tmp_path / "no-such-model"
    # its own Redis database: it must not take jobs from the session's workers' queues
    redis_url = redis_server.rsplit("/", 1)[0] + "/1"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "celery"), "-A", "tasks", "worker", "-Q", "short",
         "-n", "doomed@%h", "-l", "INFO"],
        cwd=ROOT, env={**os.environ, settings.MODEL.env: str(missing), settings.REDIS_URL.env: redis_url},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-3000:]
    critical = [line for line in proc.stdout.splitlines() if "CRITICAL" in line]
    assert len(critical) == 1, proc.stdout[-3000:]
    assert f"model {missing}, dtype auto" in critical[0]
    assert "avx512f: " in critical[0] and "amx_tile: " in critical[0]
