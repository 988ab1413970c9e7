"""TAILGUARD_REDIS_URL as a kombu Sentinel list, against a real redis-server master and a real
`redis-server --sentinel` (both on loopback, with passwords): tailguard's own client, the API,
a worker's runtime, `tailguard stats` and a Celery round trip through celeryconfig's settings
all reach the master the Sentinel names; after a failover the client follows the new master."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from celery_round_trip import ROOT, celery_round_trip

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.host.procs import Child, ChildSpec, start, wait_until
from tailguard.host.redis_server import find_redis_server, free_port, start_redis
from tailguard.redis import keys
from tailguard.redis.client import connect

pytestmark = pytest.mark.integration

MASTER = "tailguard-test"
MASTER_PASSWORD = "master-secret"
SENTINEL_PASSWORD = "sentinel-secret"


def start_sentinel(port: int, folder: Path, master_port: int, *, down_after_ms: int = 60000) -> Child:
    """One `redis-server --sentinel` watching the master on `master_port` (quorum 1: alone it
    may fail over), with a password of its own; returns once it names the master."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "sentinel.conf"  # Sentinel rewrites its own config file: a fresh one per start
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {folder}\nrequirepass {SENTINEL_PASSWORD}\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {master_port} 1\n"
                    f"sentinel auth-pass {MASTER} {MASTER_PASSWORD}\n"
                    f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
                    f"sentinel failover-timeout {MASTER} 10000\n")
    child = start(ChildSpec("sentinel", (find_redis_server(), str(conf), "--sentinel")),
                  log=folder / "sentinel.log")
    probe = redis.Redis(port=port, password=SENTINEL_PASSWORD, socket_timeout=2)

    def names_the_master() -> bool:
        try:
            return probe.sentinel_get_master_addr_by_name(MASTER) is not None
        except redis.RedisError:
            return False

    wait_until(names_the_master, [child], 15, f"redis-server --sentinel on port {port}")
    return child


def sentinel_url(*ports: int, db: int = 0) -> str:
    """kombu's spelling: one sentinel:// per Sentinel, `;` between; the password is the master's."""
    return ";".join(f"sentinel://:{MASTER_PASSWORD}@127.0.0.1:{p}/{db}" for p in ports)


SENTINEL_SETTINGS = {settings.REDIS_SENTINEL_MASTER.env: MASTER,
                     settings.REDIS_SENTINEL_PASSWORD.env: SENTINEL_PASSWORD}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """A master with a password and one Sentinel watching it; yields (url, master client)."""
    folder = tmp_path_factory.mktemp("sentinel")
    master_port, sentinel_port = free_port(), free_port()
    master = start_redis(master_port, folder / "master", appendonly=False, password=MASTER_PASSWORD)
    try:
        sentinel = start_sentinel(sentinel_port, folder / "sentinel", master_port)
    except Exception:
        master.stop()
        raise
    # A second, dead Sentinel first in the list: the client must move on to the live one.
    url = sentinel_url(free_port(), sentinel_port)
    direct = redis.Redis(port=master_port, password=MASTER_PASSWORD)
    yield url, direct
    direct.close()
    sentinel.stop()
    master.stop()


@pytest.fixture
def master(deployment):
    _, direct = deployment
    direct.flushall()
    return direct


def test_the_client_factory_reaches_the_master_the_sentinel_names(deployment, master):
    url, _ = deployment
    client = connect(url, socket_timeout=3, socket_connect_timeout=3, config=SENTINEL_SETTINGS)
    client.set("through-sentinel", "yes")
    assert master.get("through-sentinel") == b"yes"
    with pytest.raises(ConfigError, match=settings.REDIS_SENTINEL_MASTER.env):
        connect(url, config={settings.REDIS_SENTINEL_MASTER.env: ""})
    wrong = connect(url, socket_connect_timeout=3,
                    config={**SENTINEL_SETTINGS, settings.REDIS_SENTINEL_PASSWORD.env: "wrong"})
    with pytest.raises(redis.ConnectionError):  # MasterNotFoundError: no Sentinel let it in
        wrong.ping()


def test_the_api_records_and_queues_through_the_sentinel(deployment, master, tiny_model):
    from app import create_app

    url, _ = deployment
    api = create_app({"TESTING": True, settings.MODEL.env: tiny_model, settings.REDIS_URL.env: url,
                      **SENTINEL_SETTINGS, "TAILGUARD_CONSUME_FINISHED": False,
                      "TAILGUARD_REAP_RUNNING": False, settings.ADMIT_WITHOUT_WORKER.env: True})
    reply = api.test_client().post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4})
    assert reply.status_code == 202, reply.get_json()
    job_id = reply.get_json()["id"]
    assert master.hget(keys.job_key(job_id), "status") == b"queued"  # tailguard's client
    # the task message went in with the record, on the master (tailguard/jobs/task_message.py)
    [message] = [json.loads(m) for m in master.lrange("short", 0, -1)]
    assert message["headers"]["id"] == job_id
    # the job record is the result: Celery stores none
    assert message["headers"]["ignore_result"] is True


def test_a_worker_runtime_and_a_celery_round_trip_go_through_the_sentinel(deployment, master,
                                                                         tiny_model):
    url, _ = deployment
    celery_round_trip({settings.REDIS_URL.env: url, **SENTINEL_SETTINGS})
    assert master.keys("celery-task-meta-*")  # the result landed on the master


def test_tailguard_stats_reads_through_the_sentinel(deployment, master):
    from tailguard.jobs.liveness import Liveness

    url, _ = deployment
    Liveness(master).heartbeat(["short"], "short@gpu-a", ttl_s=60)
    out = subprocess.run([sys.executable, "-m", "tailguard.cli", "stats", "--json"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), settings.REDIS_URL.env: url,
                              **SENTINEL_SETTINGS},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["workers_per_host"]["short"] == {"gpu-a": 1}


def test_after_a_failover_the_client_writes_to_the_promoted_replica(tmp_path, monkeypatch):
    """The master dies; the Sentinel promotes its replica; the same client object, untouched,
    writes again once the Sentinel names the new master (Redis calls fail in between: the API
    answers 503 then, as during any Redis outage)."""
    master_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
    # A master serves its replicas with SYNC/PSYNC, which the embedded server disables.
    monkeypatch.setenv("TAILGUARD_REDIS_ENABLE_COMMANDS", "FLUSHDB,FLUSHALL,SYNC,PSYNC")
    master = start_redis(master_port, tmp_path / "master", appendonly=False, password=MASTER_PASSWORD)
    # The replica is promoted by the Sentinel (REPLICAOF, CONFIG REWRITE), so it keeps the
    # commands tailguard's own servers disable; its config file is its own.
    replica_conf = tmp_path / "replica.conf"
    replica_conf.write_text(f"port {replica_port}\nbind 127.0.0.1\ndir {tmp_path}\nsave \"\"\n"
                            f"requirepass {MASTER_PASSWORD}\nmasterauth {MASTER_PASSWORD}\n"
                            f"replicaof 127.0.0.1 {master_port}\n")
    replica = start(ChildSpec("replica", (find_redis_server(), str(replica_conf))),
                    log=tmp_path / "replica.log")
    direct_replica = redis.Redis(port=replica_port, password=MASTER_PASSWORD, socket_timeout=2)
    sentinel = None
    try:
        wait_until(lambda: direct_replica.info("replication").get("master_link_status") == "up",
                   [master, replica], 15, "the replica in sync")
        sentinel = start_sentinel(sentinel_port, tmp_path / "sentinel", master_port,
                                  down_after_ms=1000)
        client = connect(sentinel_url(sentinel_port), socket_timeout=2, socket_connect_timeout=2,
                         config=SENTINEL_SETTINGS)
        client.set("before", "1")
        master.stop()

        def written_after_failover() -> bool:
            try:
                return bool(client.set("after", "1"))
            except redis.RedisError:
                return False

        wait_until(written_after_failover, [replica, sentinel], 30, "a write after the failover")
        assert direct_replica.get("before") == b"1" and direct_replica.get("after") == b"1"
        assert direct_replica.info("replication")["role"] == "master"
    finally:
        direct_replica.close()
        for child in (sentinel, replica, master):
            if child is not None:
                child.stop()
