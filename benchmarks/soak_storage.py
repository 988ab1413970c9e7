"""Does Redis memory reach a plateau under steady traffic, and what happens at the cap?

Starts the system as `tailguard up` does, on this machine: the embedded redis-server (its
config: noeviction, AOF), the API (`tailguard api`, gunicorn) and real Celery workers
(`celery -A tasks worker`). With ``--engine paced`` (the default) the workers' engine is a
stand-in that streams words at a fixed pace (benchmarks/paced_worker.py: no vLLM, so the
storage behaviour, which does not depend on the engine's speed, can be driven at rates a
2-core machine's engine cannot serve); with ``--engine vllm`` they run the real engine on
the tiny demo model (run it under `flock /tmp/tailguard-e2e.lock`).

The load is the seed workload (the article's four prompts, max_tokens 64/128/256, Poisson
arrivals): each request is a POST /v1/jobs, then long polls (?wait=) until it ends.
Time is compressed: the finished jobs' TTLs (TAILGUARD_RECORD_TTL_S, TAILGUARD_OUTPUT_TTL_S)
and the stats' retention are the defaults divided by ``--ttl-scale``, so a steady state
comes within minutes instead of hours.

Phases (``--phase``):
  plateau  `--rate` for `--duration` s: memory must level off below the high-water mark,
           with every request accepted and succeeded.
  cap      a small maxmemory (``--maxmemory``): `--rate` until memory sits at the mark (503
           storage_full with Retry-After, running jobs finish, /healthz says so), then
           `--rate` x ``--recover-share`` until it is back under it and submissions pass.

    python benchmarks/soak_storage.py --phase plateau --rate 30 --duration 600 --ttl-scale 30
    python benchmarks/soak_storage.py --phase cap --rate 30 --maxmemory 12mb --ttl-scale 30
    flock /tmp/tailguard-e2e.lock python benchmarks/soak_storage.py --engine vllm --rate 3 \\
        --duration 240 --ttl-scale 60 --max-tokens 16,32,64

Writes samples.json (memory every 5 s, outcomes) under --out and prints the summary.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailguard import settings  # noqa: E402
from tailguard.host.redis_server import free_port, start_redis  # noqa: E402
from tailguard.plan.synthetic import SEED_PROMPTS  # noqa: E402

_MIB = 1 << 20


def request(port: int, method: str, path: str, body: dict | None = None,
            timeout: float = 90.0) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"} if body is not None else {})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"raw": raw[:200].decode(errors="replace")}
        return resp.status, dict(resp.getheaders()), data
    finally:
        conn.close()


class Outcomes:
    """What the clients saw, counted under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.retry_after_missing = 0
        self.failures: list[dict] = []

    def add(self, key: str, detail: dict | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if detail is not None and len(self.failures) < 20:
                self.failures.append(detail)


def one_request(port: int, body: dict, out: Outcomes) -> None:
    """Submit, then long-poll until the job ends; count what happened."""
    try:
        status, headers, data = request(port, "POST", "/v1/jobs", body)
    except OSError as exc:
        out.add("submit_error", {"error": str(exc)})
        return
    if status != 202:
        code = (data.get("error") or {}).get("code", str(status))
        out.add(f"refused:{status}:{code}")
        if "Retry-After" not in headers:
            with out.lock:
                out.retry_after_missing += 1
        return
    out.add("accepted")
    job_id = data["id"]
    for _ in range(10):
        try:
            status, _, job = request(port, "GET", f"/v1/jobs/{job_id}?wait=60")
        except OSError as exc:
            out.add("poll_error", {"id": job_id, "error": str(exc)})
            return
        if status != 200:
            out.add(f"poll:{status}", {"id": job_id, "body": job})
            return
        if job["status"] not in ("queued", "running"):
            break
    out.add(f"ended:{job['status']}", None if job["status"] == "succeeded" else
            {"id": job_id, "error": job.get("error")})
    if job["status"] == "succeeded" and not (job.get("result") or {}).get("text"):
        out.add("succeeded_without_text", {"id": job_id, "result": job.get("result")})


def drive(port: int, rate: float, seconds: float, max_tokens: list[int], out: Outcomes,
          pool: ThreadPoolExecutor, rng: random.Random) -> int:
    """Poisson arrivals at `rate` for `seconds`; returns how many were sent."""
    start, t, sent = time.monotonic(), 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return sent
        delay = start + t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = {"prompt": rng.choice(SEED_PROMPTS), "max_tokens": rng.choice(max_tokens)}
        pool.submit(one_request, port, body, out)
        sent += 1


class Sampler:
    """Redis memory, keys and /healthz every `every_s`, in the background."""

    def __init__(self, client: redis.Redis, api_port: int, every_s: float = 5.0) -> None:
        self.client, self.api_port, self.every_s = client, api_port, every_s
        self.samples: list[dict] = []
        self.phase = ""
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                mem = self.client.info("memory")
                keys = self.client.info("keyspace").get("db0", {}).get("keys", 0)
                cmds = self.client.info("stats")["total_commands_processed"]
            except redis.RedisError as exc:
                self.samples.append({"t": round(time.monotonic() - self._t0, 1), "error": str(exc)})
                continue
            try:
                hstatus, _, health = request(self.api_port, "GET", "/healthz", timeout=10)
            except OSError:
                hstatus, health = 0, {}
            self.samples.append({
                "t": round(time.monotonic() - self._t0, 1), "phase": self.phase,
                "used": mem["used_memory"], "max": mem["maxmemory"], "keys": keys,
                "commands": cmds, "healthz": hstatus,
                "storage_full": (health.get("storage") or {}).get("full"),
                "lanes_without_worker": health.get("lanes_without_worker")})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def key_sizes(client: redis.Redis, sample: int = 300) -> dict:
    """Mean MEMORY USAGE of finished jobs' records and streams, and the count of each kind."""
    kinds: collections.Counter[str] = collections.Counter()
    records, streams = [], []
    for key in client.scan_iter(match="*", count=1000):
        k = key.decode()
        kind = ("stream" if k.endswith(":stream") else "record" if k.startswith("tailguard:job:")
                else k.split(":")[1] if k.startswith("tailguard:") else "other")
        kinds[kind] += 1
        if kind == "record" and len(records) < sample:
            if client.hget(k, "status") == b"succeeded":
                records.append(client.memory_usage(k, samples=0))
        elif kind == "stream" and len(streams) < sample:
            streams.append(client.memory_usage(k, samples=0))
    mean = lambda xs: round(sum(xs) / len(xs)) if xs else None  # noqa: E731
    return {"keys_by_kind": dict(kinds), "record_bytes_mean": mean(records),
            "stream_bytes_mean": mean(streams)}


def start_system(args, env: dict, data: Path) -> tuple[list[subprocess.Popen], int, str, object]:
    redis_port, api_port = free_port(), free_port()
    os.environ[settings.REDIS_MAXMEMORY.env] = args.maxmemory
    redis_child = start_redis(redis_port, data / "redis", appendonly=True)
    url = f"redis://127.0.0.1:{redis_port}/0"
    env = {**env, settings.REDIS_URL.env: url}
    logs = data / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen([sys.executable, "-m", "tailguard.cli", "api", "--port", str(api_port)],
                              cwd=ROOT, env=env, stdout=open(logs / "api.log", "w"),
                              stderr=subprocess.STDOUT)]
    workers = [("short", f"short-{i}") for i in range(args.short_workers)] + [("long,batch", "long")]
    for queues, name in workers:
        concurrency = "16" if queues == "short" else "8"
        if args.engine == "paced":
            argv = [sys.executable, str(ROOT / "benchmarks" / "paced_worker.py")]
        else:
            argv = [sys.executable, "-m", "celery"]
        argv += ["-A", "tasks", "worker", "-Q", queues, "-n", f"{name}@%h", "-c", concurrency,
                 "-l", "WARNING"]
        procs.append(subprocess.Popen(argv, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                                      stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT))
    deadline = time.monotonic() + args.start_timeout
    while True:
        try:
            status, _, health = request(api_port, "GET", "/healthz", timeout=5)
            if status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit(f"the system did not come up (logs in {logs})")
        time.sleep(1.0)
    return procs, api_port, url, redis_child


def summarize(samples: list[dict], phase: str) -> dict:
    xs = [s for s in samples if s.get("phase") == phase and "used" in s]
    if not xs:
        return {}
    third = max(1, len(xs) // 3)
    mid, last = xs[third:2 * third] or xs, xs[-third:]
    span = xs[-1]["t"] - xs[0]["t"] or 1
    return {"samples": len(xs), "used_min_mib": round(min(s["used"] for s in xs) / _MIB, 2),
            "used_max_mib": round(max(s["used"] for s in xs) / _MIB, 2),
            "middle_third_mean_mib": round(sum(s["used"] for s in mid) / len(mid) / _MIB, 2),
            "last_third_mean_mib": round(sum(s["used"] for s in last) / len(last) / _MIB, 2),
            "max_mib": round(xs[-1]["max"] / _MIB, 2),
            "keys_last": xs[-1]["keys"],
            "commands_per_s": round((xs[-1]["commands"] - xs[0]["commands"]) / span, 1),
            "healthz": dict(collections.Counter(s["healthz"] for s in xs)),
            "storage_full_samples": sum(1 for s in xs if s["storage_full"]),
            "samples_with_a_lane_unserved": sum(1 for s in xs if s["lanes_without_worker"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=("plateau", "cap"), default="plateau")
    ap.add_argument("--engine", choices=("paced", "vllm"), default="paced")
    ap.add_argument("--rate", type=float, default=30.0, help="requests per second")
    ap.add_argument("--duration", type=float, default=600.0, help="plateau: seconds of load")
    ap.add_argument("--ttl-scale", type=float, default=30.0,
                    help="the finished jobs' TTLs and the stats' retention are the defaults / this")
    ap.add_argument("--maxmemory", default=settings.REDIS_MAXMEMORY.default,
                    help="maxmemory of the embedded redis-server")
    ap.add_argument("--max-tokens", default="64,128,256")
    ap.add_argument("--short-workers", type=int, default=2)
    ap.add_argument("--tokens-per-s", type=float, default=400.0,
                    help="paced engine: tokens per second per sequence")
    ap.add_argument("--cap-seconds", type=float, default=240.0, help="cap: seconds at --rate")
    ap.add_argument("--recover-share", type=float, default=0.25,
                    help="cap: the rate after the cap, as a share of --rate")
    ap.add_argument("--recover-seconds", type=float, default=240.0)
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--model", default=str(ROOT / ".tailguard" / "test-models" / "tiny"))
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    from tailguard.model.demo import build_demo_model

    model = args.model if Path(args.model, "config.json").exists() else \
        str(build_demo_model(Path(args.model), size="tiny"))
    scale = args.ttl_scale
    ttl = {settings.RECORD_TTL_S.env: max(1, round(settings.RECORD_TTL_S.default / scale)),
           settings.OUTPUT_TTL_S.env: max(1, round(settings.OUTPUT_TTL_S.default / scale)),
           settings.STATS_RETENTION_S.env: max(60, round(settings.STATS_RETENTION_S.default / scale))}
    env = {**os.environ, settings.MODEL.env: model, settings.LANES_FILE.env: "",
           settings.API_AUTH.env: settings.AUTH_OPEN, "SOAK_TOKENS_PER_S": str(args.tokens_per_s),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **{k: str(v) for k, v in ttl.items()}}
    data = Path(args.out or tempfile.mkdtemp(prefix=f"tailguard-soak-{args.phase}-"))
    data.mkdir(parents=True, exist_ok=True)
    procs, api_port, url, redis_child = start_system(args, env, data)
    client = redis.Redis.from_url(url)
    max_tokens = [int(x) for x in args.max_tokens.split(",")]
    out = Outcomes()
    rng = random.Random(0)
    report: dict = {"args": vars(args), "ttls": ttl, "cpu": _cpu()}
    sampler = Sampler(client, api_port)
    try:
        with ThreadPoolExecutor(max_workers=400) as pool:
            if args.phase == "plateau":
                sampler.phase = "plateau"
                report["sent"] = drive(api_port, args.rate, args.duration, max_tokens, out, pool, rng)
            else:
                sampler.phase = "cap"
                report["sent_cap"] = drive(api_port, args.rate, args.cap_seconds, max_tokens, out,
                                           pool, rng)
                cap_counts = dict(out.counts)
                sampler.phase = "recover"
                recover = Outcomes()
                report["sent_recover"] = drive(api_port, args.rate * args.recover_share,
                                               args.recover_seconds, max_tokens, recover, pool, rng)
        if args.phase == "cap":
            # the whole cap phase's requests have ended by now (the pool has drained)
            report["cap_outcomes"] = {**cap_counts, "final": dict(out.counts)}
            report["recover_outcomes"] = dict(recover.counts)
            report["recover_retry_after_missing"] = recover.retry_after_missing
            report["recover_failures"] = recover.failures
        report["outcomes"] = dict(out.counts)
        report["retry_after_missing"] = out.retry_after_missing
        report["failures"] = out.failures
    finally:
        sampler.stop()
        report["sizes"] = key_sizes(client)
        report["summary"] = {p: summarize(sampler.samples, p) for p in ("plateau", "cap", "recover")
                             if summarize(sampler.samples, p)}
        report["samples"] = sampler.samples
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        client.close()
        redis_child.stop()
        (data / "samples.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    print(f"samples: {data / 'samples.json'}")
    return 0


def _cpu() -> str:
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        name = "unknown"
    return f"{name}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
