"""The embedded Redis as `tailguard up` and `tailguard redis` run it: a password kept in
$TAILGUARD_HOME (never on a command line), dangerous commands gone, maxmemory noeviction,
its data (the AOF holds every prompt and output) readable by its owner only.
The suite's own Redis (tests/conftest.py) runs with the same disabled commands but FLUSHDB and
FLUSHALL (TAILGUARD_REDIS_ENABLE_COMMANDS), so every integration test also shows Celery, kombu
and tailguard do without them."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from conftest import ROOT

from tailguard.host.redis_server import answers_ping, free_port, start_redis

pytestmark = pytest.mark.integration


def test_start_redis_with_a_password(tmp_path):
    port = free_port()
    proc = start_redis(port, tmp_path, appendonly=False, password="s3cret")
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        client = redis.Redis(port=port, password="s3cret")
        assert client.ping()
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("CONFIG", "GET", "dir")
        with pytest.raises(redis.ResponseError, match="unknown command"):
            client.execute_command("MODULE", "LIST")
        assert client.info("memory")["maxmemory_policy"] == "noeviction"
        assert client.info("memory")["maxmemory"] > 0
        assert not any(b"s3cret" in arg for arg in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                       .split(b"\0"))
    finally:
        proc.stop()


#: what the embedded server must not answer (tailguard/host/redis_server.py DISABLED_COMMANDS)
DANGEROUS = [("FLUSHALL",), ("FLUSHDB",), ("MONITOR",), ("SHUTDOWN", "NOSAVE"), ("SYNC",),
             ("PSYNC", "?", "-1"), ("DEBUG", "SLEEP", "0"), ("CONFIG", "GET", "dir"),
             ("SWAPDB", "0", "1"), ("RESTORE", "k", "0", "x"), ("REPLICAOF", "NO", "ONE"),
             ("MODULE", "LIST"), ("ACL", "LIST")]


def test_the_embedded_redis_knows_no_dangerous_command(tmp_path, monkeypatch):
    monkeypatch.delenv("TAILGUARD_REDIS_ENABLE_COMMANDS")  # as `tailguard up` runs it
    port = free_port()
    proc = start_redis(port, tmp_path, appendonly=False, password="s3cret")
    try:
        client = redis.Redis(port=port, password="s3cret")
        client.set("k", "v")
        for command in DANGEROUS:
            with pytest.raises(redis.ResponseError, match="unknown command"):
                client.execute_command(*command)
        assert client.get("k") == b"v" and client.ping()  # still there, still up
    finally:
        proc.stop()


def test_the_suite_redis_has_the_dangerous_commands_disabled(redis_client):
    with pytest.raises(redis.ResponseError, match="unknown command"):
        redis_client.execute_command("CONFIG", "SET", "dir", "/tmp")


def test_tailguard_redis_uses_the_password_kept_in_home(tmp_path):
    port = free_port()
    home = tmp_path / "home"
    # made looser by an older version: tightened at start, data written before included
    (home / "redis").mkdir(parents=True, mode=0o755)
    home.chmod(0o755)
    (home / "redis" / "old.aof").write_text("")
    (home / "redis" / "old.aof").chmod(0o644)
    env = {**os.environ, "TAILGUARD_HOME": str(home), "TAILGUARD_REDIS_URL": ""}
    proc = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "redis", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not answers_ping(port):
            assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)
        password_file = home / "redis.password"
        assert oct(password_file.stat().st_mode & 0o777) == "0o600"
        password = password_file.read_text().strip()
        assert redis.Redis(port=port, password=password).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        assert password.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        # what every other process (`tailguard stats`, `tailguard keys`) connects with
        out = subprocess.run([sys.executable, "-c", "from tailguard import settings; "
                              "print(settings.redis_url())"], cwd=ROOT, capture_output=True,
                             text=True, env={**env, "TAILGUARD_REDIS_PORT": str(port)}, check=True)
        client = redis.Redis.from_url(out.stdout.strip())
        assert client.ping()
        client.set("a prompt", "an output")  # into the AOF, made at start under umask 077
        assert private_modes(home) == []
        written = [p for p in (home / "redis").rglob("*") if p.is_file() and "aof" in p.name]
        assert len(written) >= 2, written  # the old one and what this server appended
    finally:
        proc.terminate()
        proc.wait(10)


def private_modes(home: Path) -> list[str]:
    """Every file or folder under `home` (itself included) that anyone but its owner may read."""
    loose = [p for p in [home, *home.rglob("*")] if p.stat().st_mode & 0o077]
    return [f"{p} {oct(p.stat().st_mode & 0o777)}" for p in loose]


def test_flower_gets_its_password_from_the_environment(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tailguard import cli

    seen = {}
    monkeypatch.setattr(cli, "become", lambda argv, env=None, pin=None: seen.update(argv=argv, env=env))
    monkeypatch.setenv("TAILGUARD_HOME", str(tmp_path))
    monkeypatch.delenv("TAILGUARD_FLOWER_BASIC_AUTH", raising=False)
    assert CliRunner().invoke(cli.main, ["flower"]).exit_code == 0
    auth = (tmp_path / "flower.auth").read_text().strip()
    assert seen["env"] == {"FLOWER_BASIC_AUTH": auth}
    assert not any(auth.split(":", 1)[1] in a for a in seen["argv"])
    assert oct((tmp_path / "flower.auth").stat().st_mode & 0o777) == "0o600"
