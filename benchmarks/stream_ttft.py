"""Time-to-first-token overhead of tailguard's streaming path over the engine's own TTFT.

At low load (one request at a time, so nothing queues behind anything), stream N
completions through the OpenAI endpoint and compare, per request:
  client TTFT  request sent -> first text chunk received (HTTP, API, Redis queue,
               worker pick-up, engine, Redis Stream, SSE back)
  engine TTFT  the worker calling the engine -> the engine's first token (the job's
               timing.engine_ttft_s, measured in the worker)
  overhead     client TTFT - engine TTFT: what the gateway adds.

    python benchmarks/stream_ttft.py --url http://127.0.0.1:8000 -n 150

Prints median and P99 of each, and writes the raw samples as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import requests

from tailguard.plan.sim import percentile


def one(session: requests.Session, url: str, model: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": "解释什么是Transformer", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    with session.post(url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
        resp.raise_for_status()
        job_id = resp.headers["X-Tailguard-Job-Id"]
        first = None
        for line in resp.iter_lines():
            if first is None and line.startswith(b"data: {") and b'"text":""' not in line:
                first = time.perf_counter() - t0
        end = time.perf_counter() - t0
    job = session.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return {"job": job_id, "client_ttft_s": first, "client_e2e_s": end,
            "engine_ttft_s": job["timing"]["engine_ttft_s"], "queued_s": job["timing"]["queued_s"],
            "lane": job["lane"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", type=int, default=150, help="requests (default 150; >= 100 for a P99)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", help="write the samples as JSON here")
    args = ap.parse_args(argv)

    session = requests.Session()
    model = session.get(args.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    for _ in range(args.warmup):
        one(session, args.url, model, args.max_tokens)
    samples = []
    for i in range(args.n):
        samples.append(one(session, args.url, model, args.max_tokens))
        print(f"\r{i + 1}/{args.n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    rows = {
        "client TTFT": [s["client_ttft_s"] for s in samples],
        "engine TTFT": [s["engine_ttft_s"] for s in samples],
        "overhead": [s["client_ttft_s"] - s["engine_ttft_s"] for s in samples],
        "  of which queue wait": [s["queued_s"] for s in samples],
    }
    print(f"model {model}, lane {samples[0]['lane']}, {args.n} sequential streamed requests, "
          f"max_tokens {args.max_tokens}")
    print(f"{'':24}{'median ms':>12}{'P99 ms':>12}{'max ms':>12}")
    for name, values in rows.items():
        print(f"{name:24}{statistics.median(values) * 1e3:12.1f}{percentile(values, 99) * 1e3:12.1f}"
              f"{max(values) * 1e3:12.1f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(samples, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
