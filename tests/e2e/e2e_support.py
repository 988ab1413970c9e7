"""Helpers for the end-to-end tests (importable: conftest files are not)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import requests

from tailguard.jobs.store import TERMINAL

#: Each poll of a job long-polls this long, so a dead worker is noticed within it.
POLL_WAIT_S = 1


def engine_stats(name: str) -> dict:
    """What the engine host of worker `name@…` observed (`celery inspect engine_stats`)."""
    import socket

    from tasks import app

    # Ask that one node and stop at its reply: an open broadcast waits out the timeout.
    replies = app.control.broadcast("engine_stats", reply=True, timeout=10, limit=1,
                                    destination=[f"{name}@{socket.gethostname()}"])
    for reply in replies:
        for node, stats in reply.items():
            if node.startswith(f"{name}@"):
                return stats
    raise AssertionError(f"no engine_stats reply from {name}@: {replies}")


def wait_job(api, job_id: str, check: Callable[[], None], timeout: float = 120) -> dict[str, Any]:
    """The job once it has ended, polled through the API test client `api`.

    `check` runs between polls (the workers fixture's `check`): a worker that died fails
    the test at once instead of after `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        job = api.get(f"/v1/jobs/{job_id}?wait={POLL_WAIT_S}").get_json()
        if job["status"] in TERMINAL:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout} s: {job}")
        check()



def wait_openai_ready(api_url: str, timeout_s: float = 300) -> str:
    """`api_url` once the API's render layer is built (/health, vLLM's: 200 then)."""
    deadline = time.monotonic() + timeout_s
    while requests.get(api_url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, f"the API's render layer was not built in {timeout_s:.0f} s"
        time.sleep(0.5)
    return api_url

class EngineHold:
    """Worker `name`'s vLLM processes stopped (SIGSTOP) while held; a context manager that
    holds them on entry and always resumes them (SIGCONT) on exit.

    A test that cancels a request mid-generation holds the engine: the request then
    cannot run to its end before the cancel reaches it, however fast this machine
    decodes. The worker process runs on meanwhile (Celery, the runner's cancel poll,
    the abort it sends); the engine reads that abort when it resumes.
    """

    def __init__(self, workers, name: str) -> None:
        self.pids = [pid for pid, worker in workers.engines.items() if worker == f"worker.{name}"]
        assert self.pids, f"no vLLM process under worker {name}: {workers.engines}"

    def hold(self) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def release(self) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)

    def __enter__(self) -> EngineHold:
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
