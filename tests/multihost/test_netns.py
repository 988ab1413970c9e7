"""Many hosts, one broker, on one machine: two "hosts" are Linux network namespaces, each
joined to this one by a veth pair in a private range the test creates (10.231.7.0/30 and
10.231.7.4/30: this side .1/.5, the namespace side .2/.6) and deletes afterwards. Redis,
with a password, listens on the two host-side addresses only; each namespace runs one real
worker with a real vLLM engine on the tiny demo model, given nothing but the broker URL and
the model path, as a worker on another machine would be. Only those addresses are contacted.

Needs root and iproute2 (skipped otherwise); starts engines, so run it under the e2e lock:
    flock /tmp/tailguard-e2e.lock .venv/bin/python -m pytest tests/multihost -q
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT
from waiting import wait_for

from tailguard import settings
from tailguard.host.cores import Pinning
from tailguard.host.procs import Child, ChildSpec, console_script, start, wait_until
from tailguard.host.redis_server import free_port, start_redis
from tailguard.jobs.store import QUEUED, SUCCEEDED, TERMINAL

pytestmark = pytest.mark.multihost

#: A cold worker: engine start + warm-up on the tiny model, two at once on a busy machine.
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class Host:
    """A namespace standing in for a machine, and its veth pair to this one."""

    name: str       # also the host part of its worker's name (short@ns1)
    netns: str
    host_ip: str    # this side: where Redis listens for it
    ns_ip: str
    host_veth: str

    def argv(self, *argv: str) -> tuple[str, ...]:
        """`argv` run inside this host's namespace."""
        return ("ip", "netns", "exec", self.netns, *argv)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _delete(hosts: list[Host]) -> None:
    """Delete what `hosts` created; each step on its own, whatever failed before."""
    for host in hosts:
        for args in (("netns", "del", host.netns), ("link", "del", host.host_veth)):
            subprocess.run(["ip", *args], capture_output=True)  # deleting the netns takes its veth end


@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, Host]]:
    tag = os.getpid()  # names of this run only (a veth name has at most 15 characters)
    made = [Host(f"ns{i}", f"tailguard-{tag}-ns{i}", f"10.231.7.{4 * i - 3}", f"10.231.7.{4 * i - 2}",
                 f"tg{tag}h{i}") for i in (1, 2)]
    try:
        _ip("netns", "add", made[0].netns)
    except FileNotFoundError:
        pytest.skip("no `ip` command (iproute2): cannot create network namespaces")
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace (needs root): {exc.stderr.strip()}")
    try:
        for i, host in enumerate(made):
            if i:
                _ip("netns", "add", host.netns)
            inner = f"tg{tag}n{i + 1}"
            _ip("link", "add", host.host_veth, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", host.netns)
            _ip("addr", "add", f"{host.host_ip}/30", "dev", host.host_veth)
            _ip("link", "set", host.host_veth, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.ns_ip}/30", "dev", inner)
            _ip("-n", host.netns, "link", "set", inner, "up")
            # vLLM's engine core talks to its worker over local sockets
            _ip("-n", host.netns, "link", "set", "lo", "up")
        yield {h.name: h for h in made}
    finally:
        _delete(made)


@dataclass
class Broker:
    password: str
    port: int

    def url(self, host: Host, port: int | None = None) -> str:
        """The broker URL a worker on `host` is given."""
        return f"redis://:{self.password}@{host.host_ip}:{port or self.port}/0"


@pytest.fixture(scope="module")
def broker(hosts) -> Iterator[Broker]:
    data = Path(tempfile.mkdtemp(prefix="tailguard-multihost-redis-"))
    b = Broker(secrets.token_hex(12), free_port())
    redis = start_redis(b.port, data, appendonly=False, password=b.password,
                        bind=tuple(h.host_ip for h in hosts.values()))
    try:
        yield b
    finally:
        redis.stop()
        shutil.rmtree(data, ignore_errors=True)


def worker_in(host: Host, queues: str, core: int, redis_url: str, model: str) -> ChildSpec:
    """`celery -A tasks worker` inside `host`'s namespace, named `<first queue>@<host>`, given
    only the broker URL and the model path (the lanes file is the session's)."""
    name = f"{queues.split(',')[0]}@{host.name}"
    return ChildSpec(name, host.argv(console_script("celery"), "-A", "tasks", "worker",
                                     "-Q", queues, "-n", name, "-l", "INFO"),
                     env={settings.REDIS_URL.env: redis_url, settings.MODEL.env: model,
                          settings.WORKER_HEARTBEAT_S.env: "1"},
                     pin=Pinning(cores=(core,)), cwd=ROOT)


class Fleet:
    """The workers of the namespaces and an API (a Flask test client) on the same Redis."""

    def __init__(self, hosts: dict[str, Host], broker: Broker, model: str, log_dir: Path) -> None:
        from app import create_app

        self.hosts, self.broker, self.model, self.log_dir = hosts, broker, model, log_dir
        self.children: list[Child] = []
        # A lane with no live worker is refused by default; here a job is admitted anyway
        # so it can be seen waiting for its namespace's worker to return.
        self.api = create_app({
            "TESTING": True, "TAILGUARD_MODEL": model,
            "TAILGUARD_REDIS_URL": broker.url(hosts["ns1"]),
            "TAILGUARD_CONSUME_FINISHED": False, "TAILGUARD_ADMIT_WITHOUT_WORKER": True,
            "TAILGUARD_REAP_RUNNING": False}).test_client()

    def start_worker(self, host: Host, queues: str, core: int) -> Child:
        spec = worker_in(host, queues, core, self.broker.url(host), self.model)
        child = start(spec, log=self.log_dir / f"{spec.name}.{len(self.children)}.log")
        self.children.append(child)
        return child

    def health(self) -> tuple[int, dict]:
        resp = self.api.get("/healthz")
        return resp.status_code, resp.get_json()

    def wait_healthy(self) -> dict:
        live = [c for c in self.children if c.alive()]
        return wait_until(lambda: (h := self.health())[0] == 200 and h[1], live, START_TIMEOUT_S,
                          "every lane served from its namespace")

    def kill(self) -> None:
        """Every worker gone at once: no test reads how they stop at the end."""
        for child in reversed(self.children):
            child.kill()


@pytest.fixture(scope="module")
def fleet(hosts, broker, tiny_model, tmp_path_factory) -> Iterator[Fleet]:
    f = Fleet(hosts, broker, tiny_model, tmp_path_factory.mktemp("multihost-logs"))
    try:
        f.start_worker(hosts["ns1"], "short", core=0)
        f.start_worker(hosts["ns2"], "long,batch", core=1)
        f.wait_healthy()
        yield f
    finally:
        f.kill()


def submit(api, **body) -> dict:
    resp = api.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def result(api, job_id: str) -> dict:
    return wait_for(lambda: (b := api.get(f"/v1/jobs/{job_id}?wait=5").get_json())["status"]
                    in TERMINAL and b, timeout=120, what=f"job {job_id} finished")


def test_a_worker_that_cannot_reach_redis_retries_and_says_so(hosts, broker, tiny_model, tmp_path):
    host = hosts["ns1"]
    closed = free_port()  # nothing listens there on the host-side address
    worker = start(worker_in(host, "short", 0, broker.url(host, closed), tiny_model),
                   log=tmp_path / "unreachable.log")
    try:
        said = f"Cannot connect to redis://:**@{host.host_ip}:{closed}/0"
        log = wait_until(lambda: (t := worker.log.read_text(errors="replace")).count(said) >= 2
                         and t, [worker], 60, "two retries logged")
        assert "Trying again in" in log
        assert broker.password not in log  # Celery masks it
    finally:
        worker.stop()


def test_each_lane_is_served_by_its_namespace(fleet):
    _, health = fleet.health()
    assert health["workers_per_host"] == {"short": {"ns1": 1}, "long": {"ns2": 1},
                                          "batch": {"ns2": 1}}
    lanes = fleet.api.get("/v1/lanes").get_json()["lanes"]
    assert {l["name"]: l["live_workers_per_host"] for l in lanes} == health["workers_per_host"]
    short = submit(fleet.api, prompt="hi", max_tokens=4)
    long = submit(fleet.api, prompt="hi", max_tokens=300)
    assert (short["lane"], long["lane"]) == ("short", "long")
    done = {j["lane"]: result(fleet.api, j["id"]) for j in (short, long)}
    assert {lane: (b["status"], b["worker"]) for lane, b in done.items()} == {
        "short": (SUCCEEDED, "short@ns1"), "long": (SUCCEEDED, "long@ns2")}


def test_a_stopped_namespace_worker_takes_its_lane_down_and_its_jobs_wait(fleet):
    [short_worker] = [c for c in fleet.children if c.name == "short@ns1" and c.alive()]
    # SIGTERM: a warm shutdown (exit status 0) withdraws its heartbeat at once
    assert short_worker.stop() == 0, short_worker.log_tail()
    status, health = wait_for(lambda: (h := fleet.health())[0] == 503 and h)
    assert health["lanes_without_worker"] == ["short"]
    assert health["workers_per_host"]["short"] == {} and health["workers_per_host"]["long"] == {"ns2": 1}

    job = submit(fleet.api, prompt="hi", max_tokens=4)
    body = fleet.api.get(f"/v1/jobs/{job['id']}?wait=2").get_json()
    assert body["status"] == QUEUED  # waiting within the lane's queue TTL (120 s), not expired

    fleet.start_worker(fleet.hosts["ns1"], "short", core=0)
    fleet.wait_healthy()
    done = result(fleet.api, job["id"])
    assert (done["status"], done["worker"]) == (SUCCEEDED, "short@ns1")
