"""No secret in any CLI output: the commands that talk to Redis, run against Redis URLs that carry a
password, on their error paths (nothing listening, a wrong password, Sentinels that are down)
and their diagnostics, with every line they print grepped for the password."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from tailguard.host.redis_server import free_port, start_redis

pytestmark = pytest.mark.integration

SECRET = "Zq7sEcReTpw"

COMMANDS = [
    ["-m", "tailguard.cli", "stats"],
    ["-m", "tailguard.cli", "keys", "list"],
    ["-m", "tailguard.cli", "keys", "add", "ci"],
    ["-m", "tailguard.cli", "keys", "revoke", "ci"],
    ["-m", "celeryconfig"],
    ["-m", "tailguard.settings"],
]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env})


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A Redis whose password is not SECRET: the wrong-password path."""
    port = free_port()
    server = start_redis(port, tmp_path_factory.mktemp("guarded"), appendonly=False,
                         password="another-one")
    yield port
    server.stop()


CASES = ("nothing listens", "user and password", "wrong password", "sentinels down",
         "a port that is no number")


def url(case: str, guarded: int) -> str:
    dead = free_port()
    return {
        "nothing listens": f"redis://:{SECRET}@127.0.0.1:{dead}/0",
        "user and password": f"redis://app:{SECRET}@127.0.0.1:{dead}/0",
        "wrong password": f"redis://:{SECRET}@127.0.0.1:{guarded}/0",
        "sentinels down": f"sentinel://:{SECRET}@127.0.0.1:{dead}/0;sentinel://:{SECRET}@127.0.0.1:{dead}",
        "a port that is no number": f"redis://:{SECRET}@127.0.0.1:port/0",
    }[case]


@pytest.mark.parametrize("case", CASES)
def test_no_cli_output_holds_the_redis_password(case, guarded):
    env = {"TAILGUARD_REDIS_URL": url(case, guarded), "TAILGUARD_REDIS_SENTINEL_MASTER": "m",
           "TAILGUARD_REDIS_SENTINEL_PASSWORD": SECRET + "2",
           "TAILGUARD_FLOWER_BASIC_AUTH": f"admin:{SECRET}3"}
    failed = 0
    for args in COMMANDS:
        out = run(args, env)
        text = out.stdout + out.stderr
        assert SECRET not in text, (case, args, text)
        failed += out.returncode != 0
        if out.returncode != 0 and "tailguard.cli" in args:
            assert "Redis" in text or "TAILGUARD_REDIS_URL" in text, (args, text)  # says why
    assert failed >= 4  # the error paths did run: each command that needs Redis failed


def test_the_embedded_redis_password_is_never_printed(tmp_path):
    (tmp_path / "redis.password").write_text(SECRET + "\n")
    env = {"TAILGUARD_HOME": str(tmp_path), "TAILGUARD_REDIS_URL": "",
           "TAILGUARD_REDIS_PORT": str(free_port())}
    for args in COMMANDS:
        out = run(args, env)
        assert SECRET not in out.stdout + out.stderr, (args, out.stdout + out.stderr)
    shown = run(["-m", "celeryconfig"], env).stdout
    assert "redis://:***@127.0.0.1:" in shown  # the rest of the URL is still there
