"""Shared end-to-end fixtures: the API, a real Redis, two real worker processes each
hosting a vLLM engine on the tiny demo model, pinned to disjoint cores, as `tailguard up`
runs them, and the API also served by a real gunicorn for tests that need real sockets.

The short worker is started the way `tailguard up` does (`tailguard worker --worker short
--cores 0`); the long one as a user would by hand (`celery -A tasks worker -Q long,batch`),
so both entry points are covered. Loaded by tests/conftest.py as a plugin. The workers live for the whole session: test modules
run in file order and test_system.py, last, ends with the warm-shutdown test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from tailguard.redis_server import free_port

START_TIMEOUT_S = 300


class Workers:
    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_ports: dict[str, int] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str], cores: set[int]) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(
            argv, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, cores))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.log_dir.glob("*.log")))

    def stop(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # Celery: warm shutdown
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = None  # hung: the test reading this fails
        return codes


@pytest.fixture(scope="session")
def workers(tiny_model, redis_server, api_app, tmp_path_factory):
    ws = Workers(tmp_path_factory.mktemp("worker-logs"))
    ws.metrics_ports = {"short": free_port(), "long": free_port()}
    env = {"TAILGUARD_MODEL": tiny_model, "TAILGUARD_WORKER_HEARTBEAT_S": "1"}
    ws.start("short", [sys.executable, "-m", "tailguard.cli", "worker", "--worker", "short",
                       "--cores", "0", "--metrics-port", str(ws.metrics_ports["short"]),
                       "-l", "INFO"], env, {0})
    ws.start("long", [str(Path(sys.executable).parent / "celery"), "-A", "tasks", "worker",
                      "-Q", "long,batch", "-n", "long@%h", "-l", "INFO"],
             {**env, "VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1",
              "TAILGUARD_WORKER_METRICS_PORT": str(ws.metrics_ports["long"])}, {1})
    client = api_app.test_client()
    deadline = time.monotonic() + START_TIMEOUT_S
    while client.get("/healthz").status_code != 200:
        dead = [n for n, p in ws.procs.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            ws.stop()
            pytest.fail(f"workers did not become healthy (exited: {dead})\n{ws.logs()}")
        time.sleep(0.5)
    yield ws
    ws.stop()


@pytest.fixture
def api(api_app, workers):
    return api_app.test_client()


@pytest.fixture(scope="session")
def api_url(workers, tiny_model, redis_server, tmp_path_factory):
    """The API under gunicorn (gthread), as `tailguard api` serves it."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("api-log") / "api.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "api", "--port", str(port)],
                            cwd=ROOT, env={**os.environ, "TAILGUARD_MODEL": tiny_model},
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    import requests

    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"gunicorn did not serve: {Path(log.name).read_text()[-3000:]}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)
