"""`tailguard up`, a burst of jobs, kill -9 of the short worker: does the worker come back, does
/healthz answer 200 again by itself, is every job submitted before the kill terminal and readable?

    .venv/bin/python benchmarks/kill_worker_under_up.py      (from the repository root)

Runs the real `tailguard up` (demo model, embedded Redis) with its own TAILGUARD_HOME and ports,
prints what it saw, and stops everything it started (Ctrl-C to `tailguard up`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tailguard import settings

ROOT = Path(__file__).resolve().parents[1]
PORT = 18000
TERMINAL = ("succeeded", "failed", "expired", "cancelled")


def call(path: str, body: dict | None = None, timeout: float = 10) -> tuple[int | None, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=data,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError as exc:
        return None, {"error": str(exc)}


def main() -> int:
    env = {**os.environ, settings.HOME.env: "/tmp/tailguard-kill-worker", settings.API_PORT.env: str(PORT),
           settings.FLOWER_PORT.env: "15555", settings.REDIS_PORT.env: "16379"}
    env.pop(settings.REDIS_URL.env, None)
    log = open("/tmp/tailguard-kill-worker-up.log", "w")
    up = subprocess.Popen([str(Path(sys.executable).parent / "tailguard"), "up"], cwd=ROOT, env=env,
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    try:
        while call("/healthz")[0] != 200:
            if up.poll() is not None or time.monotonic() - t0 > 300:
                print("tailguard up did not become healthy; see", log.name)
                return 1
            time.sleep(1)
        print(f"healthy after {time.monotonic() - t0:.1f} s")
        ids = []
        for i in range(12):  # every third one long: both lanes busy
            status, body = call("/v1/jobs", {"prompt": f"hello {i}", "ignore_eos": True,
                                             "max_tokens": 600 if i % 3 == 0 else 64})
            print("submit", status, body.get("lane"), body.get("id"))
            if status == 202:
                ids.append(body["id"])
        time.sleep(0.5)
        pids = subprocess.run(["pgrep", "-f", "celeryd: short@"], capture_output=True,
                              text=True).stdout.split()
        killed_at = time.monotonic()
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        print("killed the short worker:", pids)
        seen_down = False
        while True:
            status = call("/healthz")[0]
            seen_down |= status != 200
            if status == 200 and seen_down:
                break
            if time.monotonic() - killed_at > 240:
                print("healthz not 200 again within 240 s")
                return 1
            time.sleep(0.5)
        print(f"healthz 200 again {time.monotonic() - killed_at:.1f} s after the kill")
        jobs: dict[str, dict] = {}
        while time.monotonic() - killed_at < 300:
            jobs = {i: call(f"/v1/jobs/{i}")[1] for i in ids}
            if all(j.get("status") in TERMINAL for j in jobs.values()):
                break
            time.sleep(1)
        print("states:", json.dumps({i: [j.get("status"), (j.get("error") or {}).get("code")]
                                     for i, j in jobs.items()}))
        done = all(j.get("status") in TERMINAL for j in jobs.values())
        print(f"all {len(ids)} terminal and readable: {done}, "
              f"{time.monotonic() - killed_at:.1f} s after the kill")
        status, body = call("/v1/jobs", {"prompt": "after", "max_tokens": 8})
        print("a new job:", call(f"/v1/jobs/{body['id']}?wait=30", timeout=40)[1].get("status"))
        return 0 if done else 1
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
        print("tailguard up exited with", up.returncode)


if __name__ == "__main__":
    sys.exit(main())
