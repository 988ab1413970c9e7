"""Shared end-to-end fixtures: the API, a real Redis, two real worker processes each
hosting a vLLM engine on the tiny demo model, pinned to disjoint cores, as `tailguard up`
runs them, and the API also served by a real gunicorn for tests that need real sockets.

The short worker is started the way `tailguard up` does (`tailguard worker --worker short
--cores 0`); the long one as a user would by hand (`celery -A tasks worker -Q long,batch`),
so both entry points are covered. Loaded by tests/conftest.py as a plugin.

The workers live for the whole session, and every test that uses them is preceded by a
check: when a worker process or its engine is gone, the test fails at once with the tail
of the workers' logs, instead of each remaining test waiting for its own timeout. No test
stops the session's workers (one that needs to stop a worker starts its own), so each
e2e module runs alone or in any order.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from typing import TypeVar

import pytest
from conftest import ON_GPU, ROOT

from tailguard import settings
from tailguard.bench.host import descendants, snapshot
from tailguard.host.cores import Pinning
from tailguard.host.procs import (
    Child,
    ChildFailed,
    ChildSpec,
    Group,
    console_script,
    running,
    start,
    tailguard_argv,
    wait_until,
    worker_spec,
)
from tailguard.host.redis_server import free_port

T = TypeVar("T")

START_TIMEOUT_S = 300
#: How long /healthz may stay degraded while every worker process is alive (a heartbeat
#: late on a busy machine) before the check fails.
HEALTH_GRACE_S = 10
#: vLLM's OpenAI options of the session's workers and served API: a tool parser, as a deployment
#: serving tool calls runs (pythonic: the tiny model's tokenizer has no special tool tokens)
OPENAI_ARGS = "--enable-auto-tool-choice --tool-call-parser pythonic"
#: How vLLM names its processes (`VLLM::EngineCore`, as /proc/<pid>/stat shows it).
VLLM_COMM = "VLLM::"


def engine_pin(core: int) -> Pinning:
    """Where a test's engine runs: CPU core `core`, or on a GPU run (conftest.ON_GPU) GPU 0,
    which every engine of the suite shares (conftest.GPU_SHARE)."""
    return Pinning(gpus=("0",)) if ON_GPU else Pinning(cores=(core,))


def or_fail(call: Callable[[], T], cleanup: Callable[[], object] | None = None) -> T:
    """`call()`; a ChildFailed fails the test with its message (what died, the log tails)
    alone, after `cleanup()`."""
    try:
        return call()
    except ChildFailed as exc:
        failure = str(exc)
    if cleanup is not None:
        cleanup()
    pytest.fail(failure, pytrace=False)  # outside the except: no chained traceback


class Workers:
    """The session's worker processes, and whether they can still serve."""

    def __init__(self, group: Group, api, metrics_ports: dict[str, int]) -> None:
        self.group = group
        self.api = api  # a test client of the API: its /healthz reads the engines' heartbeats
        self.metrics_ports = metrics_ports
        self.engines: dict[int, str] = {}  # vLLM's processes under the workers: pid -> worker

    def healthy(self) -> bool:
        """Every lane has a live worker whose engine is up (GET /healthz answers 200)."""
        return self.api.get("/healthz").status_code == 200

    def note_engines(self) -> None:
        """Remember vLLM's processes under each worker (its engine core), once they are up.

        A worker's heartbeat can outlive its engine by a few seconds (the worker notices on
        its next request, then shuts itself down), so the check watches these too.
        """
        procs = snapshot()
        for child in self.group.children:
            for pid in descendants(procs, child.pid) - {child.pid}:
                if procs[pid].comm.startswith(VLLM_COMM):
                    self.engines[pid] = child.name

    def check(self) -> None:
        """Fail the current test at once, with the workers' log tails, when a worker process
        or one of its engine processes has exited, or the engines stopped serving."""
        self.check_alive()
        or_fail(lambda: self.group.wait_until(self.healthy, HEALTH_GRACE_S,
                                              "the session's e2e workers"))

    def check_alive(self) -> None:
        """`check` without /healthz: for a test that moves a worker off its lane, which leaves
        that lane without a live worker (degraded) on purpose."""
        gone = [f"{worker}'s engine process {pid}" for pid, worker in self.engines.items()
                if not running(pid)]
        gone += [c.describe() for c in self.group.children if not c.alive()]
        if gone:
            pytest.fail(f"the session's e2e workers: {', '.join(gone)} exited\n"
                        + self.group.log_tails(), pytrace=False)


@pytest.fixture(scope="session")
def workers(tiny_model, redis_server, api_app, tmp_path_factory):
    group = Group(tmp_path_factory.mktemp("worker-logs"))
    ports = {"short": free_port(), "long": free_port()}
    env = {settings.MODEL.env: tiny_model, settings.WORKER_HEARTBEAT_S.env: "1",
           settings.OPENAI_ARGS.env: OPENAI_ARGS}
    ws = Workers(group, api_app.test_client(), ports)

    def start_all() -> None:
        group.start(dataclasses.replace(
            worker_spec("short", engine_pin(0), "--metrics-port", str(ports["short"]),
                        "-l", "INFO", env=env), cwd=ROOT))
        group.start(ChildSpec(
            "worker.long", (console_script("celery"), "-A", "tasks", "worker", "-Q", "long,batch",
                            "-n", "long@%h", "-l", "INFO"),
            env={**env, settings.WORKER_METRICS_PORT.env: str(ports["long"])},
            pin=engine_pin(1), cwd=ROOT))
        group.wait_until(ws.healthy, START_TIMEOUT_S, "workers healthy")
        ws.note_engines()

    or_fail(start_all, cleanup=group.stop)
    yield ws
    for child in group.children:  # no test reads their stop: a warm one costs ~7 s per engine
        child.kill()


@pytest.fixture(autouse=True)
def _workers_alive(request):
    """Before each test that uses the session's workers: are they (and their engines) alive?"""
    if "workers" in request.fixturenames:
        request.getfixturevalue("workers").check()


@pytest.fixture
def api(api_app, workers):
    return api_app.test_client()


def http_status(url: str) -> int | None:
    """The status `url` answers with, or None while nothing listens there or it does not answer
    within 2 s yet (a process still starting, on a loaded machine)."""
    import requests

    try:
        return requests.get(url, timeout=2).status_code
    except (requests.ConnectionError, requests.Timeout):
        return None


def serve(spec: ChildSpec, log_dir, ready: Callable[[], object], timeout_s: float = 60) -> Child:
    """Start a server child and return once `ready()`; fails the test with its log tail
    when it exits first or is not ready in time."""
    child = start(dataclasses.replace(spec, cwd=ROOT), log=log_dir / f"{spec.name}.log")
    or_fail(lambda: wait_until(ready, [child], timeout_s, f"{spec.name} ready"),
            cleanup=child.stop)
    return child


#: The engine-level e2e modules' one EngineHost (tests/e2e/test_engine_host.py,
#: test_openai_serving_on_an_engine.py, test_engine_options_e2e.py): its model's name, context,
#: and the lanes file its engine table comes from.
ENGINE_HOST_MODEL = "tiny-test"
ENGINE_HOST_MAX_MODEL_LEN = 2048
ENGINE_HOST_LANES = """
[engine]
max_num_batched_tokens = 2048
kv_cache_memory_bytes = 268435456

[lanes.short]
max_tokens = 64
max_model_len = 2048

[[workers]]
name = "short"
lanes = ["short"]
engine = {enable_prefix_caching = false}
"""


@pytest.fixture(scope="session")
def engine_host(tiny_model, tmp_path_factory):
    """One EngineHost in this process for the session (an engine start is most of what those
    modules would each cost): on a copy of the tiny model whose generation_config.json asks
    for greedy sampling (temperature 0), with the engine table of ENGINE_HOST_LANES' worker."""
    import json
    import shutil
    import tomllib

    from conftest import GPU_SHARE

    from tailguard.engine.host import EngineConfig, EngineHost
    from tailguard.lanes.table import parse_lanes
    from tailguard.model.info import serving_dtype

    model = tmp_path_factory.mktemp("models") / "tiny-greedy"
    shutil.copytree(tiny_model, model)
    config_path = model / "generation_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "temperature": 0.0}))
    options = parse_lanes(tomllib.loads(ENGINE_HOST_LANES)).worker("short").engine
    engine = EngineHost(EngineConfig(model=str(model), max_num_seqs=8,
                                     max_model_len=ENGINE_HOST_MAX_MODEL_LEN,
                                     dtype=serving_dtype(str(model)), log_stats=True,
                                     extra={**options, **GPU_SHARE},
                                     served_model_names=(ENGINE_HOST_MODEL,)))
    engine.start()
    yield engine
    engine.shutdown()
    assert not engine.started
    gc.collect()  # vLLM's engine client now, not at interpreter exit (its __del__ fails there)


@pytest.fixture(scope="session")
def api_url(workers, tiny_model, redis_server, tmp_path_factory):
    """The API under gunicorn (gthread), as `tailguard api` serves it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = serve(ChildSpec("api", tailguard_argv("api", "--port", str(port)),
                            env={settings.MODEL.env: tiny_model,
                                 settings.OPENAI_ARGS.env: OPENAI_ARGS}),
                  tmp_path_factory.mktemp("api-log"), lambda: http_status(url + "/healthz") == 200)
    yield url
    child.stop()
