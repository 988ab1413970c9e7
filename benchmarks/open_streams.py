"""Do open streams starve the API? Submit and health latency with N SSE streams held open.

Starts a private Redis and `tailguard api` (gunicorn, as `make up` runs it) on the tiny
demo model, with no worker: N batch jobs are submitted and stay queued, and N clients
hold their SSE streams open (each gets a heartbeat every TAILGUARD_SSE_HEARTBEAT_S). While
they are open it times `POST /v1/jobs` and `GET /healthz`, one at a time, and prints
P50/P99/max of each: PASS when both P99 are under 100 ms.

    python benchmarks/open_streams.py                 # 500 streams, the default thread count
    python benchmarks/open_streams.py --threads 32    # the old default: submits wait for a thread
"""

from __future__ import annotations

import argparse
import http.client
import sys
import threading
import time

from queued_api import TINY_MODEL, api_without_workers, model_folder, request, submit_queued_jobs

from tailguard import settings
from tailguard.plan.sim import percentile

TARGET_P99_S = 0.100


def hold_stream(port: int, job_id: str, opened: threading.Semaphore, stop: threading.Event,
                failures: list[str]) -> None:
    """Open the job's SSE stream, say so once the first heartbeat arrives, keep reading."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", f"/v1/jobs/{job_id}/stream")
        resp = conn.getresponse()
        if resp.status != 200:
            failures.append(f"stream {resp.status}")
            return
        resp.readline()
        opened.release()
        while not stop.is_set():
            if not resp.readline():
                failures.append("stream ended early")
                return
    except OSError as exc:
        failures.append(f"stream: {exc}")
    finally:
        conn.close()


def timed(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, float]:
    """(status, seconds); a request that got no answer within 10 s counts as infinitely slow."""
    t0 = time.perf_counter()
    try:
        status, _ = request(port, method, path, body, timeout=10)
    except OSError:
        return 0, float("inf")
    return status, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--probes", type=int, default=300, help="timed requests of each kind")
    ap.add_argument("--threads", type=int, default=settings.API_THREADS.default,
                    help="TAILGUARD_API_THREADS of the API under test")
    ap.add_argument("--model", default=str(TINY_MODEL),
                    help="a model folder (its tokenizer is all the API loads); built if missing")
    args = ap.parse_args(argv)

    stop = threading.Event()
    with api_without_workers(model_folder(args.model),
                             {"TAILGUARD_API_THREADS": str(args.threads)}, "open-streams") \
            as (api_port, _):
        try:
            jobs = submit_queued_jobs(api_port, args.streams)
            opened, failures = threading.Semaphore(0), []
            for job_id in jobs:
                threading.Thread(target=hold_stream, args=(api_port, job_id, opened, stop, failures),
                                 daemon=True).start()
            t0 = time.monotonic()
            for _ in jobs:
                if not opened.acquire(timeout=max(1.0, 120 - (time.monotonic() - t0))):
                    break
            print(f"{args.streams} streams requested, {args.streams - len(failures)} open after "
                  f"{time.monotonic() - t0:.1f} s (API threads: {args.threads})")
            submit, health = [], []
            for _ in range(args.probes):
                status, s = timed(api_port, "POST", "/v1/jobs",
                                  {"prompt": "hi", "max_tokens": 8, "priority": "batch"})
                submit.append(s if status == 202 else float("inf"))
                _, s = timed(api_port, "GET", "/healthz")
                health.append(s)
                if len(submit) >= 3 and all(x == float("inf") for x in submit[-3:]):
                    break  # starved: no need to wait out every probe
            ok = True
            for name, xs in (("POST /v1/jobs", submit), ("GET /healthz", health)):
                p99 = percentile(xs, 99)
                ok &= p99 < TARGET_P99_S
                print(f"{name:14} n={len(xs)}  P50 {1000 * percentile(xs, 50):6.1f} ms  P99 "
                      f"{1000 * p99:6.1f} ms  max {1000 * max(xs):6.1f} ms  "
                      f"{'PASS' if p99 < TARGET_P99_S else 'FAIL'} (P99 < {1000 * TARGET_P99_S:.0f} ms)")
            print(f"streams still open at the end: {args.streams - len(failures)}")
            return 0 if ok and not failures else 1
        finally:
            stop.set()


if __name__ == "__main__":
    sys.exit(main())
