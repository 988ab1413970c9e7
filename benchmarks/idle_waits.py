"""What idle long-polls cost Redis: commands per second with N `GET /v1/jobs/<id>?wait=` open.

Starts a private Redis and `tailguard api` (gunicorn, as `make up` runs it) on the tiny demo
model, with no worker: N batch jobs are submitted and stay queued, and N clients each hold a
long-poll on one of them. Redis's own count of the commands it processed
(INFO stats ``total_commands_processed``) is read over `--seconds` with no client waiting,
then over the same time with all N waiting: the difference per second is what the waits
cost, besides the API's own background work (finished-stream consumer, reaper).

    python benchmarks/idle_waits.py               # 100 long-polls, 10 s
    python benchmarks/idle_waits.py --waits 500
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from tailguard.host.redis_server import free_port, start_redis

ROOT = Path(__file__).resolve().parents[1]


def request(port: int, method: str, path: str, body: dict | None = None,
            timeout: float = 90.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"} if body is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def commands_per_s(client: redis.Redis, seconds: float) -> tuple[float, int]:
    """Commands Redis processed per second over `seconds` (less this function's own two INFO
    calls), and its instantaneous_ops_per_sec at the end."""
    before = client.info("stats")["total_commands_processed"]
    time.sleep(seconds)
    after = client.info("stats")
    return (after["total_commands_processed"] - before - 1) / seconds, after["instantaneous_ops_per_sec"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--waits", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0, help="each measurement's length")
    ap.add_argument("--model", default=str(ROOT / ".tailguard" / "test-models" / "tiny"),
                    help="a model folder (its tokenizer is all the API loads); built if missing")
    args = ap.parse_args(argv)

    from tailguard.model.demo import build_demo_model

    model = args.model if Path(args.model, "config.json").exists() else \
        str(build_demo_model(Path(args.model), size="tiny"))
    data = Path(tempfile.mkdtemp(prefix="tailguard-idle-waits-"))
    redis_port, api_port = free_port(), free_port()
    redis_proc = start_redis(redis_port, data, appendonly=False)
    url = f"redis://127.0.0.1:{redis_port}/0"
    env = {**os.environ, "TAILGUARD_REDIS_URL": url, "TAILGUARD_MODEL": model,
           "TAILGUARD_ADMIT_WITHOUT_WORKER": "1", "TAILGUARD_LANES": "",
           "TAILGUARD_MAX_WAIT_S": "600"}
    api = subprocess.Popen([sys.executable, "-m", "tailguard.cli", "api", "--port", str(api_port)],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                request(api_port, "GET", "/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or api.poll() is not None:
                    raise SystemExit("the API did not start") from None
                time.sleep(0.2)
        jobs = []
        for _ in range(args.waits):
            status, body = request(api_port, "POST", "/v1/jobs",
                                   {"prompt": "hi", "max_tokens": 8, "priority": "batch"})
            assert status == 202, body
            jobs.append(json.loads(body)["id"])
        time.sleep(2.0)  # the submissions' own traffic settles
        idle, idle_inst = commands_per_s(client, args.seconds)
        wait_s = args.seconds * 2 + 30
        answered: list[int] = []
        for job_id in jobs:
            threading.Thread(target=lambda j=job_id: answered.append(
                request(api_port, "GET", f"/v1/jobs/{j}?wait={wait_s:g}")[0]), daemon=True).start()
        time.sleep(3.0)  # every long-poll open and past its first read
        waiting, waiting_inst = commands_per_s(client, args.seconds)
        print(f"Redis commands/s, {args.seconds:g} s each (INFO total_commands_processed; "
              "instantaneous_ops_per_sec at the end in brackets):")
        print(f"  no long-poll open:      {idle:8.1f}  [{idle_inst}]")
        print(f"  {args.waits} long-polls open: {waiting:8.1f}  [{waiting_inst}]")
        print(f"  the long-polls' share:  {waiting - idle:8.1f}  "
              f"({(waiting - idle) / args.waits:.2f} per long-poll)")
        if answered:
            print(f"  {len(answered)} long-polls answered early (expected none)")
        return 0
    finally:
        api.terminate()  # gunicorn would drain the open long-polls for up to 30 s
        try:
            api.wait(5)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait(10)
        client.close()
        redis_proc.stop()


if __name__ == "__main__":
    sys.exit(main())
