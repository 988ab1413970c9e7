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
import sys
import threading
import time

import redis
from queued_api import TINY_MODEL, api_without_workers, model_folder, request, submit_queued_jobs


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
    ap.add_argument("--model", default=str(TINY_MODEL),
                    help="a model folder (its tokenizer is all the API loads); built if missing")
    args = ap.parse_args(argv)

    with api_without_workers(model_folder(args.model), {"TAILGUARD_MAX_WAIT_S": "600"},
                             "idle-waits", stop_wait_s=5) as (api_port, url):
        client = redis.Redis.from_url(url)
        try:
            jobs = submit_queued_jobs(api_port, args.waits)
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
            client.close()


if __name__ == "__main__":
    sys.exit(main())
