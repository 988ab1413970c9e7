"""Worker processes for the worker and engine fault tests: real `celery worker` processes
on a Redis database of the test file's own (the API runs in-process), found and killed
the way an operator (or the kernel) would. The Redis and API fault tests run the whole
system as processes instead: fault_system.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import ROOT
from waiting import wait_for

#: A cold worker: engine start + warm-up on the tiny model, on one busy core.
START_TIMEOUT_S = 300


def own_database(redis_server: str, number: int) -> Iterator[tuple[str, Any]]:
    """A Redis database of a test file's own (flushed): no other tier's worker takes its jobs.
    Use as a fixture body: ``yield from own_database(redis_server, 3)``."""
    import redis

    url = redis_server.rsplit("/", 1)[0] + f"/{number}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.close()


def api_with_reaper(redis_url: str, model: str, **config: Any) -> Iterator[Any]:
    """The API in-process with its reaper running (as in production), its finished-stream
    consumer off, and any other `config` (settings by env name); the reaper thread stops with
    the fixture. Use as a fixture body: ``yield from api_with_reaper(db[0], tiny_model)``."""
    from app import create_app
    from app.gateway_ext import built_gateway, start_gateway

    app = create_app({"TESTING": True, "TAILGUARD_MODEL": model,
                      "TAILGUARD_REDIS_URL": redis_url, "TAILGUARD_CONSUME_FINISHED": False,
                      **config})
    start_gateway(app)  # as gunicorn's post_worker_init does: the reaper starts with the process
    yield app.test_client()
    if (gateway := built_gateway(app)) is not None:
        gateway.close()


class Worker:
    """One `celery -A tasks worker` process in its own session (so a test can kill it and
    everything it started), pinned to one core (the long worker's, as `tailguard up` pins
    it, unless told another); `env` on top of the test's environment."""

    def __init__(self, name: str, redis_url: str, model: str, log_dir: Path,
                 queues: str = "long,batch", concurrency: int | None = None,
                 core: int = 1, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        argv = [str(Path(sys.executable).parent / "celery"), "-A", "tasks", "worker", "-Q", queues,
                "-n", f"{name}@%h", "-l", "INFO"]
        if concurrency is not None:
            argv += ["-c", str(concurrency)]
        env = {**os.environ, "TAILGUARD_MODEL": model, "TAILGUARD_REDIS_URL": redis_url,
               "VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=lambda: os.sched_setaffinity(0, {core}))

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def engine_core_pid(self) -> int | None:
        """vLLM's engine-core process among this worker's children (None while it has none)."""
        for pid in children(self.proc.pid):
            try:  # vLLM retitles it "VLLM::EngineCore" (comm cuts names at 15 characters)
                if "EngineCore" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    return pid
            except OSError:
                continue
        return None

    def kill(self) -> None:
        """kill -9 of the worker process alone: its children are left as a crash leaves them."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """End the whole session (the worker, vLLM's processes, any orphan), whatever state."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def children(pid: int) -> list[int]:
    """Direct children of `pid`, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return out


def lane_workers(client, lane: str) -> int:
    """What GET /healthz says about `lane`: how many workers serve it now."""
    return client.get("/healthz").get_json()["workers_per_lane"][lane]


def wait_serving(client, worker: Worker, lane: str = "long") -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while lane_workers(client, lane) == 0:
        assert worker.proc.poll() is None, f"worker exited\n{worker.tail()}"
        assert time.monotonic() < deadline, f"worker not serving\n{worker.tail()}"
        time.sleep(0.2)


def submit(client, max_tokens: int = 1500, **body) -> str:
    """Queue a job on lane long (the one these workers serve): max_tokens above short's
    cap of 64 (tests/lanes.test.toml) keeps it off lane short."""
    resp = client.post("/v1/jobs", json={"prompt": "fault", "max_tokens": max_tokens,
                                         "ignore_eos": True, **body})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def wait_streaming(redis_client, job_id: str, timeout: float = 60) -> None:
    """Until the job has streamed at least one delta (it is mid-generation)."""
    from tailguard.redis import keys

    wait_for(lambda: redis_client.xlen(keys.job_stream_key(job_id)) > 0, timeout,
             f"job {job_id} streaming")


def finished_jobs(redis_client) -> list[str]:
    """Ids announced on the finished stream, in order (duplicates kept)."""
    from tailguard.redis import keys

    return [keys.job_id_of(f[b"key"].decode())
            for _, f in redis_client.xrange(keys.FINISHED_STREAM)]
