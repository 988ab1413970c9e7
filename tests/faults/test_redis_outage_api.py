"""While Redis is stopped (SIGSTOP: it hangs and keeps its connections) or down, every route
of the API, under gunicorn, answers 503 with Retry-After within its bounded Redis timeout,
and serves again once Redis is back. No engine needed."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from faults_support import HTTP_TIMEOUT_S, figure, submit, system_fixture

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def system(tmp_path_factory, tiny_model):
    sys_ = system_fixture(tmp_path_factory, tiny_model, worker=False)
    yield sys_
    sys_.stop()


def answers(system, tiny_model, job_id):
    """(status, Retry-After, seconds) of each route."""
    calls = {
        "submit": lambda: requests.post(system.url + "/v1/jobs", json={"prompt": "x"},
                                        timeout=HTTP_TIMEOUT_S),
        "status": lambda: requests.get(f"{system.url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT_S),
        "stream": lambda: requests.get(f"{system.url}/v1/jobs/{job_id}/stream",
                                       timeout=HTTP_TIMEOUT_S),
        "healthz": lambda: requests.get(system.url + "/healthz", timeout=HTTP_TIMEOUT_S),
        "openai": lambda: requests.post(system.url + "/v1/completions", timeout=HTTP_TIMEOUT_S,
                                        json={"model": tiny_model, "prompt": "x", "stream": True}),
    }
    out = {}
    for name, call in calls.items():
        t0 = time.monotonic()
        resp = call()
        out[name] = (resp.status_code, resp.headers.get("Retry-After"),
                     round(time.monotonic() - t0, 2))
    return out


@pytest.mark.parametrize("fault", ["SIGSTOP", "kill -9"])
def test_every_route_answers_503_with_retry_after(system, tiny_model, fault):
    job_id = submit(system.url)
    if fault == "SIGSTOP":
        os.kill(system.redis.pid, signal.SIGSTOP)
    else:
        system.redis.kill()
    try:
        seen = answers(system, tiny_model, job_id)
    finally:
        if fault == "SIGSTOP":
            os.kill(system.redis.pid, signal.SIGCONT)
        else:
            system.start_redis()  # replays its AOF
    figure(fault=f"redis {fault}: API answers", routes=seen)
    assert {name: (code, retry) for name, (code, retry, _s) in seen.items()} == \
        {name: (503, "2") for name in seen}
    assert requests.get(f"{system.url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT_S).status_code == 200
