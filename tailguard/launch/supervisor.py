"""`tailguard up`: the whole system in one foreground command, stopped cleanly by Ctrl-C.

Before it starts anything it resolves the model to local files (TAILGUARD_MODEL: a
directory, the Hugging Face cache or a download; empty: the default model, converted
once: tailguard/model/served.py) and checks that every port it will listen on is free,
so a model it cannot have or a port another server holds is one error and nothing runs.
Then it starts, in order: the embedded Redis (unless TAILGUARD_REDIS_URL is set), the
API, one worker per [[workers]] entry of the lanes file (pinned to a GPU or to disjoint
cores), and Flower, all on the local model path. Each child runs in its own session
so Ctrl-C reaches only us. On a CPU host Redis, the API, Flower and the workers' own
threads run on the front-end cores (tailguard/host/cores.py), away from the other
engines' cores.

Supervision: a child that exits (API, worker, Flower, Redis) is started again
after an exponential backoff; one restarted TAILGUARD_CRASH_LOOP_RESTARTS times
within TAILGUARD_CRASH_LOOP_WINDOW_S is left down and we say why, while the rest
keeps serving (/healthz shows the lane without a worker). Redis comes back from
its append-only file (tailguard/host/redis_server.py says what it can lose).

Ctrl-C stops the API first (no new requests are accepted), then Flower and the
workers, then Redis (workers need it to shut down), each warm first: a worker
gets its lanes' longest deadline plus STOP_TIMEOUT_S to finish the requests it
is running before it is killed. A second Ctrl-C kills everything at once.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from typing import NamedTuple

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.host.cores import frontend_cores, frontend_env, shares_frontend
from tailguard.host.devices import device_kind
from tailguard.host.procs import (
    ChildSpec,
    Group,
    RestartPolicy,
    tailguard_argv,
    worker_spec,
)
from tailguard.lanes.table import LaneTable, lanes_file_for_host, load_lanes
from tailguard.launch.processes import worker_stop_timeout_s
from tailguard.launch.worker_placement import Placement, plan_workers

#: Worker i's metrics port is this + i unless TAILGUARD_WORKER_METRICS_PORT says another base
#: (or 0: off).
WORKER_METRICS_BASE = 9101
COLORS = ["36", "33", "32", "35", "34", "31"]


@dataclasses.dataclass(frozen=True)
class Binds:
    """Where `tailguard up` listens: the API's and Flower's address and ports, the embedded
    Redis's port (it stays on loopback), worker i's metrics on metrics_base + i (None: off)."""

    host: str
    port: int
    flower_port: int
    redis_port: int
    metrics_base: int | None = WORKER_METRICS_BASE

    @classmethod
    def from_settings(cls, **given: object) -> Binds:
        """The settings' values, replaced by those `given` that are not None (command options)."""
        metrics = settings.WORKER_METRICS_PORT.get()
        binds = cls(settings.HOST.get(), settings.API_PORT.get(), settings.FLOWER_PORT.get(),
                    settings.REDIS_PORT.get(),
                    WORKER_METRICS_BASE if metrics is None else metrics or None)
        return dataclasses.replace(binds, **{k: v for k, v in given.items() if v is not None})

    def listeners(self, workers: int, redis: bool) -> list[Listener]:
        """Every server `up` starts that listens on a port."""
        out = [Listener("the API", self.host, self.port, settings.API_PORT.env, "--port"),
               Listener("Flower", self.host, self.flower_port, settings.FLOWER_PORT.env,
                        "--flower-port")]
        if redis:
            out.append(Listener("the embedded redis-server", "127.0.0.1", self.redis_port,
                                settings.REDIS_PORT.env, "--redis-port",
                                f", or set {settings.REDIS_URL.env} to use that Redis instead"))
        if self.metrics_base is not None:
            out += [Listener(f"worker {i}'s metrics", settings.WORKER_METRICS_ADDR.get(),
                             self.metrics_base + i, settings.WORKER_METRICS_PORT.env, "a base port")
                    for i in range(workers)]
        return out


def _metrics_ports(binds: Binds, workers: int) -> str:
    if binds.metrics_base is None:
        return f"worker metrics off ({settings.WORKER_METRICS_PORT.env}=0)"
    return f"worker metrics on ports {binds.metrics_base}-{binds.metrics_base + workers - 1}"


class Listener(NamedTuple):
    what: str
    host: str
    port: int
    setting: str  # the env name that moves it
    option: str  # the `tailguard up` option that does
    hint: str = ""  # what else the operator may do


def check_ports(listeners: list[Listener]) -> None:
    """A ConfigError naming the first port given twice or held by another server."""
    from tailguard.host.redis_server import port_held, port_in_use

    seen: dict[int, str] = {}
    for it in listeners:
        if it.port in seen:
            raise ConfigError(f"{it.what} and {seen[it.port]} are both given port {it.port}: "
                              f"change {it.setting} ({it.option})", field=it.setting)
        seen[it.port] = it.what
        if port_in_use(it.port, it.host):
            raise port_held(it.port, it.host, what=it.what, setting=it.setting,
                            option=it.option, hint=it.hint)


def _tag(name: str, i: int) -> str:
    """The prefix of a child's lines on our stdout (coloured on a terminal)."""
    if not sys.stdout.isatty():
        return f"{name:<12}| "
    return f"\x1b[{COLORS[i % len(COLORS)]}m{name:<12}|\x1b[0m "


def _say(text: str) -> None:
    print(f"tailguard up: {text}", flush=True)


def flower_auth(home) -> str:
    """Flower's user:password: $TAILGUARD_FLOWER_BASIC_AUTH, else one generated once and kept
    in $TAILGUARD_HOME/flower.auth (mode 600), so Flower never runs open by default."""
    import secrets

    from tailguard.host.secrets import kept_secret

    return settings.FLOWER_BASIC_AUTH.get() or kept_secret(
        home / "flower.auth", lambda: f"admin:{secrets.token_urlsafe(12)}")


def restart_policy() -> RestartPolicy:
    """How `tailguard up` restarts its children, from the settings."""
    return RestartPolicy(backoff_s=settings.RESTART_BACKOFF_S.get(),
                         max_restarts=settings.CRASH_LOOP_RESTARTS.get(),
                         window_s=settings.CRASH_LOOP_WINDOW_S.get())


def run_up(binds: Binds | None = None) -> int:
    from tailguard.host.redis_server import describe_redis_server, find_redis_server, start_redis
    from tailguard.host.secrets import embedded_redis_password, private_dir
    from tailguard.model.served import DEMO_NOTICE, prepare_served_model

    env: dict[str, str] = {}  # what every child gets on top of our environment
    device = device_kind()
    env[settings.DEVICE.env] = device  # the API's prefix blocks are its engines' (the host's)
    lanes_path, why = lanes_file_for_host(device, settings.LANES_FILE.get())
    table = load_lanes(lanes_path)  # fail before starting anything if the lanes file is bad
    env[settings.LANES_FILE.env] = str(lanes_path)  # the API and every worker read this one
    _say(f"lanes file {lanes_path} ({why})")
    home = settings.home()
    # Everything the system writes (Redis's AOF with every prompt and output, logs, secrets,
    # the demo model) is its owner's only: files 0600, folders 0700, $TAILGUARD_HOME too.
    os.umask(0o077)
    private_dir(home)
    placement = plan_workers(table, device)  # engine tables checked, devices placed
    front = frontend_cores(placement.pins, settings.FRONTEND_CORES.get())
    env.update(frontend_env(front))
    binds = binds or Binds.from_settings()
    embedded_redis = not settings.REDIS_URL.get()
    check_ports(binds.listeners(len(placement.workers), redis=embedded_redis))
    _say("preparing the model (the first run converts the default model, once)")
    served = prepare_served_model(say=_say)
    env.update(served.env())
    _say(f"serving {served.name or served.path}" + (f" from {served.path}" if served.name else ""))
    if served.is_demo:
        _say(DEMO_NOTICE)
    group = Group()
    stop = threading.Event()
    policy = restart_policy()
    failed = None
    try:
        if embedded_redis:
            port = binds.redis_port
            _say(f"starting {describe_redis_server(find_redis_server())} on 127.0.0.1:{port} "
                 f"(data in {home / 'redis'})")
            # Started first and stopped last: workers need Redis to shut down.
            group.adopt(start_redis(port, home / "redis", log_path=home / "redis.log",
                                    password=embedded_redis_password(),
                                    restart=policy, cpus=front))
            env[settings.REDIS_URL.env] = settings.redis_url(port)
        auth = flower_auth(home)
        # Flower's password goes to Flower alone, not to every child (nor one inherited from us).
        env[settings.FLOWER_BASIC_AUTH.env] = ""

        specs = _child_specs(binds, placement, table, env, auth, policy, front)

        def on_signal(*_: object) -> None:
            if stop.is_set():  # the second Ctrl-C: no more waiting for warm shutdowns
                _say("killing everything")
                group.kill()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        for i, spec in enumerate(specs):
            group.start(spec, echo=_tag(spec.name, i))
        _say(f"API on http://{binds.host}:{binds.port} (metrics at /metrics), Flower on "
             f"http://{binds.host}:{binds.flower_port} (user {auth.split(':', 1)[0]!r}, "
             f"password in {home / 'flower.auth'}), {_metrics_ports(binds, len(placement.workers))}; "
             f"workers are ready when GET /healthz answers 200. Ctrl-C stops everything.")
        _say(f"API keys: the API's first line says whether it asks for one ("
             f"{settings.API_AUTH.env}: open on loopback unless set to keys); `tailguard keys add "
             "NAME` prints one, sent as Authorization: Bearer <key>.")
        while not stop.is_set():
            for line in group.supervise():
                _say(line)
            failed = next((c for c in group.failed() if c.name not in group.given_up), None)
            if failed is not None or len(group.given_up) == len(group.children):
                break
            stop.wait(0.5)
    finally:
        if failed:
            _say(f"{failed.describe()}; stopping the rest")
        group.stop(on_stop=lambda child: _say(f"stopping {child.name}"),
                   first=[c.name for c in group.children if c.name == "api"])
    return 1 if failed or group.given_up else 0


def _child_specs(binds: Binds, placement: Placement, table: LaneTable, env: dict[str, str],
                 auth: str, policy: RestartPolicy, front: tuple[int, ...]) -> list[ChildSpec]:
    """The API, a worker per placed entry and Flower, in the order they start; each said as it
    is planned."""
    specs = [ChildSpec("api", tailguard_argv("api", "--host", binds.host, "--port",
                                             str(binds.port)),
                       env=env, restart=policy, cpus=front)]
    for i, placed in enumerate(placement.workers):
        specs.append(dataclasses.replace(
            worker_spec(placed.name, placed.pin, "--metrics-port",
                        str(0 if binds.metrics_base is None else binds.metrics_base + i),
                        env=env, cpus=front),
            stop_timeout_s=worker_stop_timeout_s(table, placed.spec.lanes), restart=policy))
        shared = (f" (shared with the front end: the engine at nice "
                  f"{settings.ENGINE_NICE.get()})" if shares_frontend(placed.pin, env) else "")
        _say(f"worker {placed.name} serves {', '.join(placed.spec.lanes)} on "
             f"{placed.label()}{shared}")
    for note in placement.notes():
        _say(note)
    if front:
        _say(f"front end (API, Redis, Flower, the workers' own threads) on cores "
             f"{','.join(map(str, front))} ({settings.FRONTEND_CORES.env})")
    specs.append(ChildSpec("flower", tailguard_argv("flower", "--host", binds.host,
                                                    "--port", str(binds.flower_port)),
                           env={**env, settings.FLOWER_BASIC_AUTH.env: auth}, restart=policy,
                           cpus=front))
    return specs
