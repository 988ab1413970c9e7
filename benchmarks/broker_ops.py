"""How many Redis operations per second one redis-server gives tailguard's command mix.

Starts a private redis-server (loopback, a free port, AOF on as `tailguard up` runs it,
in a temporary folder), then for each operation runs `--clients` processes, each doing
one round trip at a time (as the API's and workers' threads do) for `--seconds`:

  lpush_rpop  a queue message in and out (Celery's publish and a worker's fetch)
  xadd        a stream entry, pipelined with EXPIRE (a worker's delta flush)
  evalsha     a small Lua script (create_job / transition_job / record_stats are Lua)

    python benchmarks/broker_ops.py --clients 4 --seconds 5

Prints ops/s per operation, and the requests/s that allows at a given number of
operations per request (`--ops-per-request`; see docs/capacity.md for how it is counted).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import redis

from tailguard.host.redis_server import free_port, start_redis

SCRIPT = "redis.call('HSET', KEYS[1], 'state', ARGV[1]); return redis.call('HGET', KEYS[1], 'state')"


def _client(port: int, op: str, seconds: float, i: int, out: mp.Queue) -> None:
    r = redis.Redis(port=port)
    sha = r.script_load(SCRIPT)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100):
            if op == "lpush_rpop":
                r.lpush(f"q{i}", "x" * 600)  # a Celery message is ~0.5-1 KB of JSON
                r.rpop(f"q{i}")
                n += 2
            elif op == "xadd":
                p = r.pipeline(transaction=False)
                p.xadd(f"s{i}", {"type": "delta", "data": '{"text": "some tokens"}'}, maxlen=10000)
                p.expire(f"s{i}", 86400)
                p.execute()
                n += 2
            else:
                r.evalsha(sha, 1, f"h{i}", "running")
                n += 1
    out.put(n)


def measure(port: int, op: str, clients: int, seconds: float) -> float:
    out: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_client, args=(port, op, seconds, i, out)) for i in range(clients)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    return total / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--ops-per-request", type=float, default=100.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        child = start_redis(port, Path(tmp))
        try:
            for op in ("lpush_rpop", "xadd", "evalsha"):
                rate = measure(port, op, args.clients, args.seconds)
                print(f"{op:<11} {rate:>9.0f} ops/s  ({args.clients} clients) -> "
                      f"{rate / args.ops_per_request:>7.0f} requests/s at "
                      f"{args.ops_per_request:g} ops/request")
        finally:
            child.stop()


if __name__ == "__main__":
    main()
