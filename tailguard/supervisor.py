"""`tailguard up`: the whole system in one foreground command, stopped cleanly by Ctrl-C.

Starts, in order: the embedded Redis (unless TAILGUARD_REDIS_URL is set), the
demo model build (unless TAILGUARD_MODEL is set), the API, one worker per
[[workers]] entry of the lanes file (pinned to a GPU or to disjoint cores), and
Flower. Each child runs in its own session so Ctrl-C reaches only us; we then
stop the children in reverse order (Redis last: workers need it to shut down),
warm first, killing only what does not exit in time. If any child dies, the
rest are stopped too, like foreman/honcho.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from tailguard import settings
from tailguard.lanes import load_lanes
from tailguard.pinning import device_kind, plan

STOP_TIMEOUT_S = 90.0
WORKER_METRICS_BASE = 9101
COLORS = ["36", "33", "32", "35", "34", "31"]


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None


def _pump(child: Child, color: str) -> None:
    assert child.proc and child.proc.stdout
    tag = f"\x1b[{color}m{child.name:<12}|\x1b[0m " if sys.stdout.isatty() else f"{child.name:<12}| "
    for line in iter(child.proc.stdout.readline, b""):
        sys.stdout.write(tag + line.decode(errors="replace"))
        sys.stdout.flush()


def _start(child: Child, env: dict[str, str], color: str) -> None:
    child.proc = subprocess.Popen(child.argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    threading.Thread(target=_pump, args=(child, color), daemon=True).start()


def _stop(children: list[Child]) -> None:
    for child in reversed(children):
        if child.proc and child.proc.poll() is None:
            print(f"tailguard up: stopping {child.name}", flush=True)
            child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"tailguard up: {child.name} did not stop in {STOP_TIMEOUT_S}s; killing it",
                      flush=True)
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()


def flower_auth(home) -> str:
    """Flower's user:password: $TAILGUARD_FLOWER_BASIC_AUTH, else one generated once and kept
    in $TAILGUARD_HOME/flower.auth (mode 600), so Flower never runs open by default."""
    import secrets

    from tailguard.secretfile import kept_secret

    return settings.FLOWER_BASIC_AUTH.get() or kept_secret(
        home / "flower.auth", lambda: f"admin:{secrets.token_urlsafe(12)}")


def run_up() -> int:
    from tailguard.redis_server import start_redis
    from tailguard.served_model import DEMO_NOTICE, served_model

    env = dict(os.environ)
    py = [sys.executable, "-m", "tailguard.cli"]
    table = load_lanes()  # fail before starting anything if the lanes file is bad
    home = settings.home()
    home.mkdir(parents=True, exist_ok=True)
    children: list[Child] = []

    redis_proc = None
    if not settings.REDIS_URL.get():
        port = settings.REDIS_PORT.get()
        print(f"tailguard up: starting redis-server on 127.0.0.1:{port} (data in {home / 'redis'})",
              flush=True)
        redis_proc = start_redis(port, home / "redis", log_path=home / "redis.log",
                                 password=settings.embedded_redis_password())
        env["TAILGUARD_REDIS_URL"] = settings.redis_url()
    print("tailguard up: preparing the model (the first run builds the demo model)", flush=True)
    model, is_demo = served_model()
    env["TAILGUARD_MODEL"] = model
    if is_demo:
        print(f"tailguard up: {DEMO_NOTICE}", flush=True)

    env.setdefault("TAILGUARD_FLOWER_BASIC_AUTH", flower_auth(home))
    kind = device_kind()
    children.append(Child("api", py + ["api"]))
    for i, (spec, pin) in enumerate(zip(table.workers, plan(table.workers, kind))):
        where = ["--gpu", str(pin.gpu)] if pin.gpu is not None else \
            (["--cores", ",".join(map(str, pin.cores))] if pin.cores else [])
        children.append(Child(f"worker.{spec.name}", py + [
            "worker", "--worker", spec.name, *where, "--metrics-port", str(WORKER_METRICS_BASE + i)]))
        print(f"tailguard up: worker {spec.name} serves {', '.join(spec.lanes)} on "
              f"{'GPU ' + str(pin.gpu) if pin.gpu is not None else 'cores ' + ','.join(map(str, pin.cores))}",
              flush=True)
    children.append(Child("flower", py + ["flower"]))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    failed = None
    try:
        for i, child in enumerate(children):
            _start(child, env, COLORS[i % len(COLORS)])
        user = env["TAILGUARD_FLOWER_BASIC_AUTH"].split(":", 1)[0]
        print(f"tailguard up: API on http://127.0.0.1:{settings.API_PORT.get()} (metrics at "
              f"/metrics), Flower on http://127.0.0.1:{settings.FLOWER_PORT.get()} (user {user!r}, "
              f"password in {home / 'flower.auth'}), worker metrics on ports "
              f"{WORKER_METRICS_BASE}-{WORKER_METRICS_BASE + len(table.workers) - 1}; workers are "
              f"ready when GET /healthz answers 200. Ctrl-C stops everything.", flush=True)
        print("tailguard up: API keys: `tailguard keys add NAME` prints one (send it as "
              "Authorization: Bearer <key>); once one exists, every /v1/ call needs one. "
              "With none, the API serves loopback only.", flush=True)
        while not stop.is_set():
            for child in children:
                if child.proc and child.proc.poll() is not None:
                    failed = child
                    stop.set()
            stop.wait(0.5)
    finally:
        if failed:
            print(f"tailguard up: {failed.name} exited with {failed.proc.returncode}; stopping the rest",
                  flush=True)
        _stop(children)
        if redis_proc is not None:
            print("tailguard up: stopping redis-server", flush=True)
            redis_proc.terminate()
            redis_proc.wait(30)
    return 1 if failed else 0
