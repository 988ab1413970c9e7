"""What `tailguard up` refuses before it starts anything: a model it cannot have (a hub id
neither cached nor downloadable) and a port another server holds (a foreign Redis on the
embedded Redis's port, a server on the API's). Each is one error and exit 1, with nothing
started: no Redis log, no restart loop. And the embedded Redis itself (start_redis) refuses
a port another server holds instead of answering with that server."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys

import pytest
import redis
from conftest import ROOT

from tailguard.errors import ConfigError
from tailguard.host.redis_server import free_port, start_redis

pytestmark = pytest.mark.integration

#: Far above what a refusal takes; an `up` that got as far as starting engines would not
#: have answered within it (it runs until stopped).
REFUSAL_TIMEOUT_S = 120


def free_base_port(count: int = 2) -> int:
    """A free port whose next `count` - 1 are free too: `up`'s workers take the metrics base
    port, base + 1, ... (a port next to a free one can be a connection's, as the suite's
    other processes run beside this one)."""
    while True:
        base = free_port()
        try:
            with contextlib.ExitStack() as taken:
                for port in range(base, base + count):
                    taken.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue


def run_up(home, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`tailguard up ARGS` with its own TAILGUARD_HOME and an embedded Redis (the suite's
    TAILGUARD_REDIS_URL removed), until it exits."""
    full_env = {**os.environ, "TAILGUARD_HOME": str(home), "TAILGUARD_REDIS_URL": "",
                "TAILGUARD_WORKER_METRICS_PORT": str(free_base_port()), **env}
    return subprocess.run([sys.executable, "-m", "tailguard.cli", "up", "--port", str(free_port()),
                           "--flower-port", str(free_port()), "--redis-port", str(free_port()),
                           *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=REFUSAL_TIMEOUT_S)


def nothing_started(home) -> bool:
    return not (home / "redis.log").exists() and not (home / "redis").exists()


def test_a_hub_id_neither_cached_nor_reachable_is_one_error_and_nothing_starts(tmp_path):
    home = tmp_path / "home"
    done = run_up(home, TAILGUARD_MODEL="acme/not-cached-anywhere", HF_HOME=str(tmp_path / "hf"),
                  HF_HUB_OFFLINE="1")
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    assert "TAILGUARD_MODEL='acme/not-cached-anywhere'" in errors[0]
    assert "HF_HUB_OFFLINE is set" in errors[0] and str(tmp_path / "hf" / "hub") in errors[0]
    assert "Traceback" not in done.stderr and "restarting" not in done.stdout
    assert nothing_started(home)


def test_a_foreign_redis_on_the_redis_port_is_refused_not_adopted(tmp_path, tiny_model):
    port = free_port()
    theirs = start_redis(port, tmp_path / "theirs", appendonly=False)  # the user's own Redis
    try:
        home = tmp_path / "home"
        done = run_up(home, "--redis-port", str(port), TAILGUARD_MODEL=tiny_model)
        assert done.returncode == 1, done.stdout + done.stderr
        assert (f"the embedded redis-server cannot listen on 127.0.0.1:{port}: another server "
                "holds that port (a Redis: it answers PING)") in done.stderr
        assert "--redis-port" in done.stderr and "TAILGUARD_REDIS_URL" in done.stderr
        assert redis.Redis(port=port).dbsize() == 0  # nothing of ours was written there
        assert nothing_started(home)
    finally:
        theirs.stop()


def test_a_server_on_the_api_port_is_refused_before_anything_starts(tmp_path, tiny_model):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        home = tmp_path / "home"
        done = run_up(home, "--port", str(port), TAILGUARD_MODEL=tiny_model)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"the API cannot listen on 127.0.0.1:{port}: another server holds that port" in done.stderr
    assert "TAILGUARD_API_PORT (--port)" in done.stderr
    assert nothing_started(home)


def test_start_redis_refuses_a_port_another_server_holds(tmp_path):
    with socket.socket() as held:  # not a Redis: anything that listens
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}: another server holds that port"
                                              r"\. Choose") as err:
            start_redis(port, tmp_path, appendonly=False)
    assert err.value.field == "TAILGUARD_REDIS_PORT"
    assert not (tmp_path / "redis.log").exists()  # redis-server was never started
