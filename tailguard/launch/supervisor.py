"""`tailguard up`: the whole system in one foreground command, stopped cleanly by Ctrl-C.

Starts, in order: the embedded Redis (unless TAILGUARD_REDIS_URL is set), the
demo model build (unless TAILGUARD_MODEL is set), the API, one worker per
[[workers]] entry of the lanes file (pinned to a GPU or to disjoint cores), and
Flower. Each child runs in its own session so Ctrl-C reaches only us. On a CPU host
Redis, the API, Flower and the workers' own threads run on the front-end cores
(tailguard/host/cores.py), away from the other engines' cores.

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
import signal
import sys
import threading

from tailguard import settings
from tailguard.host.cores import frontend_cores, frontend_env, shares_frontend
from tailguard.host.devices import device_kind
from tailguard.host.procs import (
    STOP_TIMEOUT_S,
    ChildSpec,
    Group,
    RestartPolicy,
    tailguard_argv,
    worker_spec,
)
from tailguard.lanes.table import LaneTable, load_lanes
from tailguard.launch.placement import place_workers

WORKER_METRICS_BASE = 9101
COLORS = ["36", "33", "32", "35", "34", "31"]


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


def worker_stop_timeout_s(table: LaneTable, lanes: tuple[str, ...] | list[str]) -> float:
    """A warm shutdown finishes the requests a worker runs (each ends by its lane deadline)
    and then stops the engine: the longest deadline among its lanes plus STOP_TIMEOUT_S."""
    return max(table[lane].deadline_s for lane in lanes) + STOP_TIMEOUT_S


def run_up() -> int:
    from tailguard.host.redis_server import start_redis
    from tailguard.host.secrets import embedded_redis_password
    from tailguard.model.served import DEMO_NOTICE, served_model

    env: dict[str, str] = {}  # what every child gets on top of our environment
    table = load_lanes()  # fail before starting anything if the lanes file is bad
    home = settings.home()
    home.mkdir(parents=True, exist_ok=True)
    pins = place_workers(table.workers, device_kind())
    front = frontend_cores(pins, settings.FRONTEND_CORES.get())
    env.update(frontend_env(front))
    group = Group()
    stop = threading.Event()
    policy = restart_policy()
    failed = None
    try:
        if not settings.REDIS_URL.get():
            port = settings.REDIS_PORT.get()
            _say(f"starting redis-server on 127.0.0.1:{port} (data in {home / 'redis'})")
            # Started first and stopped last: workers need Redis to shut down.
            group.adopt(start_redis(port, home / "redis", log_path=home / "redis.log",
                                    password=embedded_redis_password(),
                                    restart=policy, cpus=front))
            env[settings.REDIS_URL.env] = settings.redis_url()
        _say("preparing the model (the first run builds the demo model)")
        model, is_demo = served_model()
        env[settings.MODEL.env] = model
        if is_demo:
            _say(DEMO_NOTICE)
        auth = flower_auth(home)
        env[settings.FLOWER_BASIC_AUTH.env] = auth

        specs = [ChildSpec("api", tailguard_argv("api"), env=env, restart=policy, cpus=front)]
        for i, (spec, pin) in enumerate(zip(table.workers, pins)):
            specs.append(dataclasses.replace(
                worker_spec(spec.name, pin, "--metrics-port", str(WORKER_METRICS_BASE + i),
                            env=env, cpus=front),
                stop_timeout_s=worker_stop_timeout_s(table, spec.lanes), restart=policy))
            shared = (f" (shared with the front end: the engine at nice "
                      f"{settings.ENGINE_NICE.get()})" if shares_frontend(pin, env) else "")
            _say(f"worker {spec.name} serves {', '.join(spec.lanes)} on {pin.label()}{shared}")
        if front:
            _say(f"front end (API, Redis, Flower, the workers' own threads) on cores "
                 f"{','.join(map(str, front))} ({settings.FRONTEND_CORES.env})")
        specs.append(ChildSpec("flower", tailguard_argv("flower"), env=env, restart=policy,
                               cpus=front))

        def on_signal(*_: object) -> None:
            if stop.is_set():  # the second Ctrl-C: no more waiting for warm shutdowns
                _say("killing everything")
                group.kill()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        for i, spec in enumerate(specs):
            group.start(spec, echo=_tag(spec.name, i))
        _say(f"API on http://127.0.0.1:{settings.API_PORT.get()} (metrics at /metrics), Flower on "
             f"http://127.0.0.1:{settings.FLOWER_PORT.get()} (user {auth.split(':', 1)[0]!r}, "
             f"password in {home / 'flower.auth'}), worker metrics on ports "
             f"{WORKER_METRICS_BASE}-{WORKER_METRICS_BASE + len(table.workers) - 1}; workers are "
             f"ready when GET /healthz answers 200. Ctrl-C stops everything.")
        _say("API keys: `tailguard keys add NAME` prints one (send it as Authorization: Bearer "
             "<key>); once one exists, every /v1/ call needs one. With none, the API serves "
             "loopback only.")
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
